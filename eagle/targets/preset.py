"""A target described as a Hydra model preset: `python -m eagle.targets --preset NAME PATH`.

Writes conf/model/NAME.yaml from what the converted folder says of the model (layers, hidden
size, vocabulary, MLP width, parameters, maximum length, whether its tokenizer has a chat
template, the Hub commit of a downloaded snapshot), so `python -m data_prep +model=NAME` and
`python -m train +model=NAME` work at once and `plan=true` has the sizes. A tokenizer without a chat template (a base model) gets the
shipped template of its family when there is one (eagle/targets/chat_templates), else the preset
says so and loading stops with a one-line error naming the shipped templates.
"""

from __future__ import annotations

import json
from pathlib import Path

from eagle.targets.hub import snapshot_commit
from eagle.targets.tokenizer import TEMPLATE_DIR

CONF = Path(__file__).resolve().parents[2] / "conf"
FAMILY_TEMPLATES = {"gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "gemma3_text": "gemma",
                    "mistral": "mistral", "phi3": "phi3", "qwen2": "chatml", "qwen3": "chatml", "olmo2": "chatml"}
MAX_LEN = 2048  # tokens per training conversation, EAGLE's; lower when the model's context is shorter


def write_preset(name: str, path: str, folder: Path, conf: Path = CONF, revision: str | None = None) -> Path:
    """Write conf/model/NAME.yaml for the target `path` (converted or downloaded into `folder`).
    A Hub snapshot pins the commit it holds (`model.revision`), so every node later reads the
    same weights and chat template; else `revision` as given (None: null, a Hub id's main)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    text = config.get_text_config()
    with torch.device("meta"):  # count parameters without allocating them
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    template, note = _template(folder, config.model_type, text.vocab_size)
    pinned = snapshot_commit(folder) or revision
    note_revision = "the Hub commit every rank loads" if pinned else "a Hub id's commit to pin; null = main"
    lines = [
        "# @package _global_",
        f"# {path}: {config.model_type}, {text.num_hidden_layers} layers, hidden {text.hidden_size}, vocabulary "
        f"{text.vocab_size}. Written by `python -m eagle.targets --preset {name} {path}`.",
        "model:",
        f"  name: {name}",
        f"  path: {path}",
        f"  revision: {json.dumps(pinned) if pinned else 'null'}    # {note_revision}",
        "  dtype: bfloat16",
        f"  max_len: {min(MAX_LEN, getattr(text, 'max_position_embeddings', MAX_LEN) or MAX_LEN)}",
        f"  chat_template: {template}    # {note}",
        f"  num_layers: {text.num_hidden_layers}              # places EAGLE-3's feature layers (head=eagle3)",
        f"  hidden_size: {text.hidden_size}             # the sizes, for plan=true",
        f"  vocab_size: {text.vocab_size}",
        f"  intermediate_size: {getattr(text, 'intermediate_size', 4 * text.hidden_size)}",
        f"  params: {float(params):.4g}",
    ]
    out = conf / "model" / f"{name}.yaml"
    out.write_text("\n".join(lines) + "\n")
    return out


def _template(folder: Path, model_type: str, vocab_size: int) -> tuple[str, str]:
    """(chat_template value, the comment saying where it comes from)."""
    from transformers import AutoTokenizer

    if AutoTokenizer.from_pretrained(folder).chat_template:
        return "null", "the tokenizer's own"
    family = FAMILY_TEMPLATES.get(model_type) or ("llama3" if model_type == "llama" and vocab_size > 100_000 else None)
    if family:
        return family, f"the tokenizer has none (a base model): the shipped {family} template, {TEMPLATE_DIR.name}/{family}.jinja"
    shipped = ", ".join(sorted(p.stem for p in TEMPLATE_DIR.glob("*.jinja")))
    return "???", f"the tokenizer has none: set one of {shipped}, or a .jinja path"
