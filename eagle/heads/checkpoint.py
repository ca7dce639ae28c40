"""Draft-head checkpoints: `config.json` + `model.safetensors` (the EAGLE authors' key names), in
any of the serving layouts of eagle/heads/formats.py (`eagle` by default).

Two architectures (`config.architecture`): eagle2 (EAGLE-1/2, eagle/heads/eagle2.py) and eagle3
(eagle/heads/eagle3.py). `load_head` also reads heads published by the EAGLE authors: a
LlamaConfig-style `config.json` (EAGLE-3: `LlamaForCausalLMEagle3`, `draft_vocab_size`) with
`pytorch_model.bin` or `model.safetensors`, possibly carrying an `embed_tokens.weight` that
belongs to the target and is ignored here.

A head may carry a *draft vocabulary* (eagle/heads/draft_vocab.py) as EAGLE-3's `d2t`/`t2d` tensors; it
loads as `head.draft_ids` ([N] target ids, or None for the whole vocabulary).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from eagle.common.permissions import as_if_created
from eagle.heads.eagle2 import DraftConfig, DraftHead
from eagle.heads.eagle3 import Eagle3Head
from eagle.heads.formats import check_format, export_files, normalise_state, read_config, write_side_files
from eagle.heads.draft_vocab import STORED_KEYS, ids_from_stored, stored_tensors

WEIGHTS = "model.safetensors"
LEGACY_WEIGHTS = "pytorch_model.bin"
TARGET_KEYS = ("embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight")  # the target's, when a head carries a copy (speculators: its verifier's)
Head = DraftHead | Eagle3Head


def build_head(cfg: DraftConfig) -> Head:
    """A freshly initialised head of the architecture `cfg` names."""
    return Eagle3Head(cfg) if cfg.architecture == "eagle3" else DraftHead(cfg)


def save_head(
    directory: str | Path,
    head: Head,
    dtype: torch.dtype = torch.bfloat16,
    card: str | None = None,
    fmt: str = "eagle",
    extra: dict[str, torch.Tensor] | None = None,
    files: dict[str, str] | None = None,
) -> Path:
    """Write the head in the layout `fmt` (eagle/heads/formats.py), atomically: a temp dir renamed over
    any earlier export. `extra`: more tensors to store, e.g. the target's `embed_tokens.weight`;
    `files`: more text files by name, e.g. the training stages (train/stages.py)."""
    check_format(fmt, head.config)
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in head.state_dict().items()}
    if head.draft_ids is not None:
        state.update(stored_tensors(head.draft_ids, head.config.vocab_size))
        if "lm_head.weight" in state:  # EAGLE-3: row j belongs to stored (ascending) draft id j
            state["lm_head.weight"] = state["lm_head.weight"][state["draft_rank"]].contiguous()
    config, state, side = export_files(fmt, head.config, state, dtype)
    state.update({k: v.detach().to("cpu", dtype).contiguous() for k, v in (extra or {}).items()})
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
    try:
        save_file(state, str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        write_side_files(tmp, side)
        for name, text in (files or {}).items():
            (tmp / name).write_text(text)
        if card is not None:
            (tmp / "README.md").write_text(card)
        as_if_created(tmp)
    except BaseException:  # a full disk, an interrupt: no half-written export is left behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _swap_in(tmp, directory)
    return directory


def _swap_in(tmp: Path, directory: Path) -> None:
    """Rename the finished export over `directory` (any earlier export is removed after)."""
    if directory.exists():
        old = directory.with_name(f".{directory.name}.old-{os.getpid()}")
        os.replace(directory, old)
        os.replace(tmp, directory)
        shutil.rmtree(old)
    else:
        os.replace(tmp, directory)


def head_from_state(state: dict[str, torch.Tensor], config: DraftConfig, draft_ids: torch.Tensor | None = None) -> Head:
    """A head of `config` (fp32) holding a full state dict (e.g. the trainer's) and its draft vocabulary."""
    head = build_head(config)
    head.load_state_dict({k: v.float() for k, v in state.items()})
    head.draft_ids = draft_ids
    return head


def resolve_head_dir(name_or_path: str | Path) -> Path:
    """A local folder, or a Hub repo id downloaded with huggingface_hub."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ValueError(f"{path}: a draft head is a directory with config.json and weights, not a file")
    from huggingface_hub import snapshot_download

    try:
        files = ["*.json", "*.safetensors", "*.bin", "*.pt", "*.md"]  # .pt: SGLang's token map
        return Path(snapshot_download(str(name_or_path), allow_patterns=files))
    except Exception as e:  # network, auth, missing repo: one clear message
        raise FileNotFoundError(
            f"draft head {name_or_path!r} is not a local folder and could not be fetched from the Hub ({type(e).__name__}: {e})"
        ) from None


def load_head(name_or_path: str | Path, dtype: torch.dtype | None = None, device="cpu") -> Head:
    """Load a head (EAGLE-1/2 or EAGLE-3) from our layout or EAGLE's published one."""
    directory = resolve_head_dir(name_or_path)
    config_path = directory / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{directory}: no config.json")
    cfg = DraftConfig.from_dict(read_config(config_path), config_path)
    state = _read_weights(directory)
    state = normalise_state(state, cfg, directory)
    draft_ids, stored_of = ids_from_stored(state, directory)
    if stored_of is not None and cfg.architecture == "eagle3" and "lm_head.weight" in state:
        state["lm_head.weight"] = state["lm_head.weight"][stored_of]  # back to in-memory (frequency) order
    ignored = TARGET_KEYS + STORED_KEYS + (("lm_head.weight",) if cfg.architecture == "eagle2" else ())
    state = {k: v for k, v in state.items() if k not in ignored}
    if "fc.bias" not in state:
        cfg.fc_bias = False
    if cfg.architecture == "eagle3" and not cfg.draft_vocab_size and "lm_head.weight" in state:
        cfg.draft_vocab_size = state["lm_head.weight"].shape[0]
    head = build_head(cfg)
    try:
        missing, unexpected = head.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shape mismatches
        raise ValueError(f"{directory}: weights do not fit config.json: {' '.join(str(e).split())}") from None
    if missing or unexpected:
        raise ValueError(f"{directory}: weights do not fit the head: missing {missing}, unexpected {unexpected}")
    if isinstance(head, Eagle3Head) and (len(draft_ids) if draft_ids is not None else cfg.vocab_size) != cfg.draft_vocab_size:
        raise ValueError(f"{directory}: the lm_head has {cfg.draft_vocab_size} rows but d2t maps "
                         f"{'no' if draft_ids is None else len(draft_ids)} draft ids")
    head.draft_ids = draft_ids
    return head.to(device=device, dtype=dtype or next(iter(state.values())).dtype).eval()


def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """model.safetensors (or EAGLE's pytorch_model.bin); a truncated or damaged file is one line."""
    path = directory / WEIGHTS if (directory / WEIGHTS).exists() else directory / LEGACY_WEIGHTS
    if not path.exists():
        raise FileNotFoundError(f"{directory}: neither {WEIGHTS} nor {LEGACY_WEIGHTS}")
    try:
        if path.name == WEIGHTS:
            return load_file(str(path))
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # safetensors' header errors, pickle/zip errors of a cut .bin
        first = str(e).splitlines()[0] if str(e) else ""
        raise ValueError(f"{path}: cannot read the weights ({type(e).__name__}: {first}); the file is damaged or "
                         f"incomplete, download or export it again") from None


def write_draft_vocab(directory: str | Path, ids: torch.Tensor) -> Path:
    """Add (or replace) the draft vocabulary of a saved head, keeping its weights' dtype."""
    head = load_head(directory)
    head.draft_ids = ids
    if isinstance(head, Eagle3Head):
        raise ValueError(f"{directory}: an EAGLE-3 head's vocabulary is fixed by its trained lm_head")
    card = Path(directory) / "README.md"
    return save_head(directory, head, dtype=head.fc.weight.dtype, card=card.read_text() if card.exists() else None)


def check_head_fits(head: Head, target: torch.nn.Module) -> None:
    """One-line error when a head was trained for a different target (hidden size or vocabulary)."""
    vocab, hidden = target.get_input_embeddings().weight.shape
    c = head.config
    if (c.hidden_size, c.vocab_size) != (hidden, vocab):
        trained_for = f"'{c.target}'" if c.target else "another target"
        raise ValueError(
            f"this draft head was trained for {trained_for} (hidden size {c.hidden_size}, vocabulary {c.vocab_size}), "
            f"but the target has hidden size {hidden} and vocabulary {vocab}: pass the base model the head was "
            f"trained for, or train a head for this one (python -m train +model=NAME)"
        )
