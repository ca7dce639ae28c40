"""Draft-head checkpoints: `config.json` + `model.safetensors` (EAGLE-1/2 key names).

`load_head` also reads heads published by the EAGLE authors: a LlamaConfig-style
`config.json` with `pytorch_model.bin` or `model.safetensors`, possibly carrying an
`embed_tokens.weight` that belongs to the target and is ignored here.

A head may carry a *draft vocabulary* (the target ids it may propose, most frequent first)
in EAGLE-3's two tensors: `d2t [N]` int64 offsets (target id of draft id i = i + d2t[i])
and `t2d [V]` bool (which target ids are in it). It loads as `head.draft_ids` ([N] target
ids, or None for the whole vocabulary).
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
VOCAB_KEYS = ("d2t", "t2d")


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
    if head.draft_ids is not None:
        state.update(vocab_tensors(head.draft_ids, head.config.vocab_size))
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
    draft_ids = draft_ids_from(state, directory)
    state = {k: v for k, v in state.items() if k not in IGNORED_KEYS + VOCAB_KEYS}
    if "fc.bias" not in state:
        cfg.fc_bias = False
    head = DraftHead(cfg)
    missing, unexpected = head.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{directory}: weights do not fit the head: missing {missing}, unexpected {unexpected}")
    head.draft_ids = draft_ids
    return head.to(device=device, dtype=dtype or next(iter(state.values())).dtype).eval()


def vocab_tensors(ids: torch.Tensor, vocab_size: int) -> dict[str, torch.Tensor]:
    """EAGLE-3's `d2t` offsets [N] and `t2d` membership [V] for draft ids -> target ids [N]."""
    ids = ids.to("cpu", torch.int64)
    if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab_size or ids.unique().numel() != ids.numel():
        raise ValueError(f"a draft vocabulary needs distinct target ids in [0, {vocab_size})")
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return {"d2t": ids - torch.arange(ids.numel()), "t2d": t2d}


def draft_ids_from(state: dict[str, torch.Tensor], directory: Path) -> torch.Tensor | None:
    """Target ids [N] of a stored draft vocabulary, or None when the head has none."""
    if "d2t" not in state:
        return None
    ids = state["d2t"].to(torch.int64) + torch.arange(state["d2t"].numel())
    if "t2d" in state and int(state["t2d"].sum()) != ids.numel():
        raise ValueError(f"{directory}: d2t ({ids.numel()} ids) and t2d ({int(state['t2d'].sum())} ids) disagree")
    return ids


def write_draft_vocab(directory: str | Path, ids: torch.Tensor) -> Path:
    """Add (or replace) the draft vocabulary of a saved head, keeping its weights' dtype."""
    head = load_head(directory)
    head.draft_ids = ids
    card = Path(directory) / "README.md"
    return save_head(directory, head, dtype=head.fc.weight.dtype, card=card.read_text() if card.exists() else None)
