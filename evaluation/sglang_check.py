"""`python -m evaluation.sglang_check HEAD_DIR`: SGLang's own loader code run against an exported head.

SGLang serves only on a GPU, so its server is never started here. Instead its installed source
(`bash scripts/setup_consumers.sh sglang`: .consumers/sglang/site, sglang==0.5.23, no dependencies)
is read and the parts that decide whether a head loads are run on our files:

- the model class: `config.json`'s `architectures[0]` must be an `EntryClass` of SGLang's
  llama_eagle.py / llama_eagle3.py;
- `load_weights` of that class (and, for EAGLE-1/2, `LlamaForCausalLM`'s legacy loader it calls),
  compiled from SGLang's source and run on our safetensors against the parameters SGLang's model
  builds (named below from its constructor): every tensor must land in a parameter of the right
  size, and every parameter but the ones SGLang takes from the target must be filled;
- EAGLE-3: the draft-to-target map SGLang derives from `d2t`, the target layers it captures
  (`eagle_config` ids + 1, or its default [2, N//2, N-3]), and the layer variant flags the head's
  config sets that SGLang's model never reads (it would load the head and compute without them);
- EAGLE-1/2: the `--speculative-token-map` file, read as SGLang's `load_token_map` reads it.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

from eagle.heads.formats import LAYER_VARIANTS

ROOT = Path(__file__).resolve().parent.parent
SGLANG_SITE = ROOT / ".consumers" / "sglang" / "site"
MODELS = Path("sglang") / "srt" / "models"


@dataclass
class Param:
    """A stand-in for one SGLang parameter: records what its weight loader receives."""

    name: str
    shape: tuple[int, ...]
    shards: dict = field(default_factory=dict)  # shard id (or None) -> loaded tensor shape

    def weight_loader(self, param, tensor, shard_id=None):
        self.shards[shard_id] = tuple(tensor.shape)


def _method(source: Path, cls: str, name: str) -> str:
    """The source text of `cls.name` in `source`, dedented to a top-level def."""
    tree = ast.parse(source.read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return ast.unparse(item)
    raise LookupError(f"{source}: no {cls}.{name}")


def _entry_classes(source: Path) -> list[str]:
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "EntryClass" for t in node.targets):
            return [e.id for e in node.value.elts]
    return []


def expected_params(cfg: dict, eagle3: bool) -> dict[str, tuple[int, ...]]:
    """The parameters SGLang's LlamaForCausalLMEagle(3) builds for `cfg` (read off its constructors)."""
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    attn_in = 2 * h if eagle3 else h  # EAGLE-3's layer attends over [embedding | hidden]
    layer = {
        "model.layers.0.self_attn.qkv_proj.weight": (q + 2 * kv, attn_in),
        "model.layers.0.self_attn.o_proj.weight": (h, q),
        "model.layers.0.mlp.gate_up_proj.weight": (2 * inter, h),
        "model.layers.0.mlp.down_proj.weight": (h, inter),
        "model.layers.0.post_attention_layernorm.weight": (h,),
        "model.embed_tokens.weight": (v, h),
    }
    if eagle3:
        n_aux = len((cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or [0, 0, 0])
        return {**layer, "model.layers.0.input_layernorm.weight": (h,), "model.layers.0.hidden_norm.weight": (h,),
                "model.fc.weight": (h, n_aux * h), "model.norm.weight": (h,),
                "lm_head.weight": (cfg.get("draft_vocab_size") or v, h)}
    return {**layer, "model.fc.weight": (h, 2 * h), "model.fc.bias": (h,), "lm_head.weight": (v, h)}


class _Self:
    """What SGLang's load_weights touches on `self`."""

    def __init__(self, params: dict[str, Param], config: dict):
        self._params = params
        self.config = type("Config", (), {"tie_word_embeddings": bool(config.get("tie_word_embeddings"))})()
        self.model = object()  # no start_layer: no pipeline-parallel slicing
        self.hot_token_id = None

    def named_parameters(self):
        return iter(self._params.items())


def run_load_weights(site: Path, head_dir: Path) -> dict:
    """Run SGLang's load_weights on the head's weights; report where every tensor went."""
    cfg = json.loads((head_dir / "config.json").read_text())
    arch = (cfg.get("architectures") or [""])[0]
    eagle3 = arch.endswith("Eagle3")
    models = site / MODELS
    source = models / ("llama_eagle3.py" if eagle3 else "llama_eagle.py")
    report = {"architecture": arch, "sglang_entry_classes": _entry_classes(source)}
    report["class_known"] = arch in report["sglang_entry_classes"]
    params = {n: Param(n, s) for n, s in expected_params(cfg, eagle3).items()}
    me = _Self(params, cfg)
    scope = {"torch": torch, "default_weight_loader": lambda p, t: p.weight_loader(p, t), "Iterable": object,
             "Tuple": tuple, "Optional": object}
    if eagle3:
        exec(_method(source, "LlamaForCausalLMEagle3", "load_weights"), scope)
        scope["load_weights"](me, load_file(str(head_dir / "model.safetensors")).items())
    else:  # LlamaForCausalLMEagle.load_weights prefixes "model." and calls LlamaForCausalLM's loader
        legacy = _method(models / "llama.py", "LlamaForCausalLM", "_legacy_load_weights")
        scope.update(get_layer_id=lambda name: None, maybe_remap_kv_scale_name=lambda n, p: n,
                     logger=type("L", (), {"warning": staticmethod(lambda msg: report.setdefault("warnings", [])
                                                                    .append(msg))}))
        exec(legacy, scope)
        eagle = _method(source, "LlamaForCausalLMEagle", "load_weights").replace("super().load_weights(",
                                                                                 "_legacy_load_weights(self, ")
        exec(eagle, scope)
        scope["load_weights"](me, load_file(str(head_dir / "model.safetensors")).items())
    from_target = {"model.embed_tokens.weight"} | (set() if eagle3 else {"lm_head.weight"})
    report["unfilled"] = sorted(n for n, p in params.items() if not p.shards and n not in from_target)
    report["wrong_size"] = sorted(n for n, p in params.items() if p.shards and _size(p) != p.shape)
    report.setdefault("warnings", [])
    if eagle3:
        text = source.read_text()  # a variant flag its model never reads: loaded, then computed without it
        report["variants_unread"] = [flag for flag in LAYER_VARIANTS if cfg.get(flag) and flag not in text]
        ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        report["captured_layers"] = [i + 1 for i in ids] if ids else "default [2, N//2, N-3]"
        report["hot_token_id"] = None if me.hot_token_id is None else me.hot_token_id.tolist()
    else:
        report["token_map"] = _token_map(head_dir)
    return report


def _size(p: Param) -> tuple[int, ...]:
    """The parameter shape the recorded shards add up to (stacked shards concatenate on dim 0)."""
    shapes = list(p.shards.values())
    if len(shapes) == 1:
        return shapes[0]
    return (sum(s[0] for s in shapes), *shapes[0][1:])


def _token_map(head_dir: Path) -> list[int] | None:
    """SGLang's load_token_map: torch.load(weights_only=True), then torch.tensor(..., int64)."""
    path = head_dir / "hot_token_map.pt"
    if not path.exists():
        return None
    return torch.as_tensor(torch.load(path, weights_only=True), dtype=torch.int64).tolist()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evaluation.sglang_check", description=__doc__.splitlines()[0])
    ap.add_argument("head", type=Path)
    ap.add_argument("--site", type=Path, default=SGLANG_SITE, help="where sglang's source is installed")
    args = ap.parse_args(argv)
    if not (args.site / MODELS).is_dir():
        print(f"error: {args.site / MODELS} missing: run `bash scripts/setup_consumers.sh sglang`", file=sys.stderr)
        return 2
    report = run_load_weights(args.site, args.head)
    for key in ("hot_token_id", "token_map"):
        if isinstance(report.get(key), list):
            report[key] = f"{len(report[key])} ids"
    print(json.dumps(report, indent=2))
    ok = report["class_known"] and not report["unfilled"] and not report["wrong_size"]
    return 0 if ok and not report.get("variants_unread") else 1


if __name__ == "__main__":
    sys.exit(main())
