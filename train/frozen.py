"""The target's frozen token embedding, lm_head and final norm, read from its weight files.

Only these matrices are read (a 7B target's 13 GB of layers never touch memory): from
safetensors files directly, from PyTorch `.bin` shards memory-mapped. With tied embeddings,
or a checkpoint without `lm_head.weight`, lm_head is the embedding. A folder whose weight files
name no embedding loads the whole target once, on this rank's device, and keeps these three.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

EMBED_SUFFIX = "embed_tokens.weight"
LM_HEAD_KEY = "lm_head.weight"


@dataclass
class Frozen:
    """Target matrices used by the trainer; never trained, never saved with the head."""

    embed: torch.Tensor  # [V, H]
    lm_head: torch.Tensor  # [V, H] (may be the same tensor as embed)
    norm: torch.Tensor | None = None  # [H] the final norm's weight (None when the folder has no such key)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """[B, S] ids -> [B, S, H]."""
        return torch.nn.functional.embedding(ids, self.embed)

    def to(self, device) -> "Frozen":
        tied = self.lm_head is self.embed
        embed = self.embed.to(device)
        norm = None if self.norm is None else self.norm.to(device)
        return Frozen(embed, embed if tied else self.lm_head.to(device), norm)


INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def _weight_files(target_dir: Path) -> dict[str, Path]:
    """Map tensor name -> weight file (safetensors, else .bin) of a HF model folder."""
    for name in INDEXES:
        if (target_dir / name).exists():
            weight_map = json.loads((target_dir / name).read_text())["weight_map"]
            return {k: target_dir / v for k, v in weight_map.items()}
    out: dict[str, Path] = {}
    for f in sorted(target_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            out.update({k: f for k in h.keys()})
    for f in [] if out else sorted(target_dir.glob("pytorch_model*.bin")):
        out.update({k: f for k in _bin(f)})
    return out


def _read(path: Path, key: str) -> torch.Tensor:
    if path.suffix == ".bin":
        return _bin(path)[key].clone()
    with safe_open(str(path), framework="pt") as h:
        return h.get_tensor(key)


def _bin(path: Path) -> dict[str, torch.Tensor]:
    """A PyTorch weight file, memory-mapped: only the tensors read are loaded."""
    return torch.load(path, map_location="cpu", mmap=True, weights_only=True)


def load_frozen(target_dir: str | Path, dtype: torch.dtype = torch.float32) -> Frozen:
    """Read embed_tokens and lm_head of a HF folder (safetensors; else the full model as a fallback)."""
    target_dir = Path(target_dir)
    config = json.loads((target_dir / "config.json").read_text())
    text = config.get("text_config", config)
    tied = bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    files = _weight_files(target_dir)
    embed_keys = [k for k in files if k.endswith(EMBED_SUFFIX) and "vision" not in k]
    if not embed_keys:
        return _load_via_model(target_dir, dtype)
    embed_key = min(embed_keys, key=len)  # the language model's, e.g. model.embed_tokens.weight
    embed = _read(files[embed_key], embed_key).to(dtype)
    lm_key = next((k for k in files if k.endswith(LM_HEAD_KEY)), None)
    lm_head = embed if tied or lm_key is None else _read(files[lm_key], lm_key).to(dtype)
    norm_keys = [k for k in files if k.endswith("norm.weight") and "layers." not in k and "vision" not in k]
    norm_key = min(norm_keys, key=len) if norm_keys else None  # e.g. model.norm.weight
    norm = None if norm_key is None else _read(files[norm_key], norm_key).to(dtype)
    return Frozen(embed=embed.requires_grad_(False), lm_head=lm_head.requires_grad_(False), norm=norm)


def _load_via_model(target_dir: Path, dtype: torch.dtype) -> Frozen:
    """The matrices of the whole target, loaded straight onto this rank's device (no host copy
    of the full model on a GPU node); the model itself is dropped."""
    from eagle.targets import resolve

    model = resolve.load_causal_lm(target_dir, dtype, resolve.local_device())
    frozen = frozen_of(model, dtype)
    return Frozen(frozen.embed.clone(), frozen.lm_head.clone(), None if frozen.norm is None else frozen.norm.clone())


def frozen_of(model: torch.nn.Module, dtype: torch.dtype) -> Frozen:
    """The matrices of a loaded target (online training's): views of its own weights when `dtype`
    is the model's, so they take no second copy; tied embeddings stay one tensor."""
    embed = model.get_input_embeddings().weight.detach()  # [V, H]
    out = model.get_output_embeddings().weight.detach()  # [V, H]
    tied = out.data_ptr() == embed.data_ptr()
    norm = getattr(model.get_decoder(), "norm", None)
    embed = embed.to(dtype)
    return Frozen(embed=embed, lm_head=embed if tied else out.to(dtype),
                  norm=None if norm is None else norm.weight.detach().to(dtype))
