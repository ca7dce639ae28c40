"""Draft-head checkpoints: `config.json` + `model.safetensors` (EAGLE-1/2 key names).

`load_head` also reads heads published by the EAGLE authors: a LlamaConfig-style
`config.json` with `pytorch_model.bin` or `model.safetensors`, possibly carrying an
`embed_tokens.weight` that belongs to the target and is ignored here.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from eagle.draft import DraftConfig, DraftHead

WEIGHTS = "model.safetensors"
LEGACY_WEIGHTS = "pytorch_model.bin"
IGNORED_KEYS = ("embed_tokens.weight", "lm_head.weight")


def save_head(
    directory: str | Path,
    head: DraftHead,
    dtype: torch.dtype = torch.bfloat16,
    card: str | None = None,
) -> Path:
    """Write the head atomically (temp dir, then rename over any earlier export)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in head.state_dict().items()}
    save_file(state, str(tmp / WEIGHTS), metadata={"format": "pt"})
    (tmp / "config.json").write_text(head.config.to_json())
    if card is not None:
        (tmp / "README.md").write_text(card)
    if directory.exists():
        old = directory.with_name(f".{directory.name}.old-{os.getpid()}")
        os.replace(directory, old)
        os.replace(tmp, directory)
        shutil.rmtree(old)
    else:
        os.replace(tmp, directory)
    return directory


def resolve_head_dir(name_or_path: str | Path) -> Path:
    """A local folder, or a Hub repo id downloaded with huggingface_hub."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ValueError(f"{path}: a draft head is a directory with config.json and weights, not a file")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(str(name_or_path), allow_patterns=["*.json", "*.safetensors", "*.bin", "*.md"]))
    except Exception as e:  # network, auth, missing repo: one clear message
        raise FileNotFoundError(
            f"draft head {name_or_path!r} is not a local folder and could not be fetched from the Hub ({type(e).__name__}: {e})"
        ) from None


def load_head(name_or_path: str | Path, dtype: torch.dtype | None = None, device="cpu") -> DraftHead:
    """Load a head from our layout or EAGLE's published one."""
    directory = resolve_head_dir(name_or_path)
    config_path = directory / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{directory}: no config.json")
    cfg = DraftConfig.from_json(config_path)
    if (directory / WEIGHTS).exists():
        state = load_file(str(directory / WEIGHTS))
    elif (directory / LEGACY_WEIGHTS).exists():
        state = torch.load(directory / LEGACY_WEIGHTS, map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(f"{directory}: neither {WEIGHTS} nor {LEGACY_WEIGHTS}")
    state = {k: v for k, v in state.items() if k not in IGNORED_KEYS}
    if "fc.bias" not in state:
        cfg.fc_bias = False
    head = DraftHead(cfg)
    missing, unexpected = head.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{directory}: weights do not fit the head: missing {missing}, unexpected {unexpected}")
    return head.to(device=device, dtype=dtype or next(iter(state.values())).dtype).eval()
