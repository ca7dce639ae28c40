"""Write tensors as a safetensors file and hash its bytes on the way to the disk.

    digest = write_safetensors(path, {"name": tensor, ...}, metadata={"key": "value"})

The bytes are those `safetensors.torch.save_file` writes for the same tensors and metadata: an
8-byte little-endian header length, the JSON header padded with spaces to a multiple of 8, then
each tensor's bytes in safetensors' order (by dtype, then name). That order and the dtype names
come from safetensors itself, from a zero-element stand-in of each tensor. The data goes to the
file straight from the tensors' memory in blocks, and each block updates the SHA-256 before it is
written, so nothing is copied and the file is never read back to hash it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors.torch import save as safetensors_bytes

BLOCK = 64 << 20  # bytes per write() and hash update: large enough for full disk speed


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> str:
    """Write `tensors` (contiguous CPU tensors) to `path`; return the file's SHA-256 (hex)."""
    header, order = _header(tensors, metadata)
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for block in _blocks(header, [tensors[name] for name in order]):
            digest.update(block)
            f.write(block)
    return digest.hexdigest()


def _header(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None) -> tuple[bytes, list[str]]:
    """(length + JSON header + padding, tensor names in file order), as safetensors lays them out."""
    layout = _layout(tensors)
    entries: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, dtype in layout:
        t = tensors[name]
        size = t.numel() * t.element_size()
        entries[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(entries, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, [name for name, _ in layout]


def _layout(tensors: dict[str, torch.Tensor]) -> list[tuple[str, str]]:
    """(name, safetensors dtype) in the order safetensors writes them, read from its own header of
    zero-element tensors of the same names and dtypes."""
    probe = safetensors_bytes({name: torch.empty(0, dtype=t.dtype) for name, t in tensors.items()})
    size = int.from_bytes(probe[:8], "little")
    header = json.loads(probe[8:8 + size])
    return [(name, info["dtype"]) for name, info in header.items() if name != "__metadata__"]


def _blocks(header: bytes, tensors: list[torch.Tensor]):
    """The file's bytes as buffers: the header, then each tensor's memory in BLOCK-sized views."""
    yield header
    for t in tensors:
        if t.numel() == 0:
            continue
        if not t.is_contiguous() or t.device.type != "cpu":
            raise ValueError(f"write_safetensors needs contiguous CPU tensors, got {t.device} {tuple(t.stride())}")
        data = memoryview(t.reshape(-1).view(torch.uint8).numpy())  # [bytes] the tensor's own memory
        for start in range(0, len(data), BLOCK):
            yield data[start:start + BLOCK]
