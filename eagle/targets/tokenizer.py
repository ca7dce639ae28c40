"""The target's tokenizer: loading, chat templates (ours in eagle/targets/chat_templates) and the ids that end a reply."""

from __future__ import annotations

import os
from pathlib import Path

TEMPLATE_DIR = Path(__file__).parent / "chat_templates"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def load_tokenizer(target_dir: str | os.PathLike, chat_template: str | None = None):
    """The target's tokenizer, with `chat_template` (a name in eagle/targets/chat_templates,
    a .jinja path, or a template string) replacing its own when given."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    if chat_template:
        tokenizer.chat_template = chat_template_text(chat_template)
    if not tokenizer.chat_template:
        names = ", ".join(sorted(p.stem for p in TEMPLATE_DIR.glob("*.jinja")))
        raise ValueError(f"{target_dir}: the tokenizer has no chat template; set model.chat_template ({names}, or a .jinja path)")
    return tokenizer


def tokenizer_if_any(target_dir: Path):
    """The folder's tokenizer as it is, or None for a bare model folder (e.g. a test target)."""
    if not any((target_dir / name).exists() for name in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(target_dir)


def chat_template_text(name_or_path: str) -> str:
    """Resolve a template name (`vicuna`), a file path, or return a literal template."""
    shipped = TEMPLATE_DIR / f"{name_or_path}.jinja"
    if shipped.exists():
        return shipped.read_text()
    path = Path(name_or_path).expanduser()
    if path.suffix == ".jinja" or path.exists():
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such chat template file")
        return path.read_text()
    if "{%" in name_or_path or "{{" in name_or_path:
        return name_or_path
    raise ValueError(f"unknown chat template {name_or_path!r}: not one of {sorted(p.stem for p in TEMPLATE_DIR.glob('*.jinja'))}, a file, or a template")


def eos_token_ids(model, tokenizer) -> set[int]:
    """Ids that end a reply: the generation config's and tokenizer's EOS, and ChatML's end token if known."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), tokenizer):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        ids.update([eos] if isinstance(eos, int) else list(eos or []))
    if tokenizer is not None:
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(end, int) and end != getattr(tokenizer, "unk_token_id", None):
            ids.add(end)
    return ids


def chat_prompt(tokenizer, messages: list[dict]):
    """Token ids [1, S] of a chat through the template, ending with the generation prompt."""
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                         return_dict=True)["input_ids"]
