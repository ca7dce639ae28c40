"""The exported head: EAGLE layout (eagle.checkpoint.save_head) plus a model card."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from eagle.checkpoint import head_from_state, save_head
from eagle.draft import DraftConfig


@dataclass
class CardInfo:
    """What the model card says about a run."""

    target: str  # name or path given to the trainer
    target_name: str
    data: str  # data selection / store directory
    store_records: int = 0
    store_tokens: int = 0
    steps: int = 0
    epochs: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    config: dict = field(default_factory=dict)  # the train section
    code_version: str = "unknown"
    head_layers: int = 1  # decoder layers of an EAGLE-1/2 head
    draft_vocab: int | None = None  # tokens the draft scores (None: the whole vocabulary)
    vocab_coverage: float = 1.0  # share of the training tokens inside the draft vocabulary


def _architecture(info: CardInfo) -> str:
    if info.config.get("head") == "eagle3":
        return (f"An EAGLE-3 draft head (fc over three target layers, one decoder layer, its own lm_head over a "
                f"{info.config.get('draft_vocab')}-token draft vocabulary mapped by `d2t`/`t2d`) for lossless "
                f"speculative decoding of `{info.target}`. The token embedding is the target's and is not stored here.")
    n = info.head_layers
    layers = "one decoder layer" if n == 1 else f"{n} decoder layers"
    keys = "`layers.0.*`" if n == 1 else f"`layers.0.*` to `layers.{n - 1}.*`"
    return (f"An EAGLE-1/2 draft head ({layers} over the target's last hidden state) for lossless\n"
            f"speculative decoding of `{info.target}`. The token embedding and `lm_head` are the target's\n"
            f"and are not stored here: `model.safetensors` holds only `fc.*` and {keys}.")


def _loss(info: CardInfo) -> str:
    if info.config.get("head") == "eagle3":
        return (f"Σ_i {info.config.get('ttt_decay')}^i · CE over the draft vocabulary, {info.config.get('ttt_steps')} "
                f"training-time-test steps")
    return "v_w * SmoothL1(feature) + p_w * CE(token)"


def _vocabulary(info: CardInfo) -> str:
    if not info.draft_vocab:
        return "the whole vocabulary"
    return f"{info.draft_vocab:,} tokens, covering {info.vocab_coverage:.2%} of the training tokens"


def model_card(info: CardInfo, repo_id: str | None = None) -> str:
    """A Hub model card (YAML front matter + Markdown) for an exported head."""
    head_ref = repo_id or "path/to/this/folder"
    metrics = "\n".join(f"| {k} | {v:.4f} |" for k, v in sorted(info.metrics.items())) or "| (none) | |"
    hyper = json.dumps(info.config, indent=2, sort_keys=True)
    return f"""---
library_name: eagle-pipeline
license: apache-2.0
tags:
- eagle
- speculative-decoding
- draft-model
base_model: {info.target}
---

# EAGLE draft head for {info.target_name}

{_architecture(info)}

## Use

```python
import torch
from eagle import EaModel

model = EaModel.from_pretrained(
    base_model_path="{info.target}",
    ea_model_path="{head_ref}",
    torch_dtype=torch.bfloat16,
)
out = model.eagenerate(input_ids, temperature=0.0, max_new_tokens=256)
```

## Training

- Target: `{info.target}`
- Data: `{info.data}` ({info.store_records} records, {info.store_tokens} tokens)
- Steps: {info.steps} optimizer steps ({info.epochs:.2f} epochs)
- Loss: {_loss(info)}
- Draft vocabulary: {_vocabulary(info)}
- Code version: `{info.code_version}`

## Held-out metrics

Top-k: the draft's token (argmax of lm_head(predicted feature)) is among its k best
against the target's argmax token, on loss-masked positions of the held-out split.

| metric | value |
|---|---|
{metrics}

## Hyperparameters

```json
{hyper}
```
"""


def export_head(directory: str | Path, state: dict[str, torch.Tensor], config: DraftConfig,
                card: str, dtype: torch.dtype = torch.bfloat16, vocab_ids: torch.Tensor | None = None) -> Path:
    """Build the head from a full state dict and save it atomically with its card.

    vocab_ids [N]: the draft vocabulary (target ids, most frequent first) stored with the head.
    """
    return save_head(directory, head_from_state(state, config, vocab_ids), dtype=dtype, card=card)
