"""`python -m evaluation.serving`: exported heads decoded by vLLM itself, next to our own decoder.

    python -m evaluation.serving --head e2=checkpoints/eagle-smollm2-135m-instruct/vllm \\
        --head e3=checkpoints/eagle3-smollm2-135m-instruct/vllm --num-prompts 8

vLLM runs in its own venv (`bash scripts/setup_consumers.sh vllm`, .consumers/vllm), through
evaluation/vllm_engine.py (eager, for a quick start), on the same prompt token ids (our chat
template) as our decoder, one prompt at a time:
once without a drafter (vLLM's own greedy output) and once per head, drafting a chain of
`--spec-tokens` tokens. Our decoder decodes with the same chain (`eagle.decoding.settings.TreeSettings`).
Per head it reports: vLLM's output equal to vLLM's plain greedy output (lossless in vLLM), equal
to HF's greedy output (what our decoder is proven against), vLLM's mean acceptance length
(1 + accepted / drafts) and our τ on the same chain. Outputs are compared up to their first EOS.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import torch

from data_prep.prompt_sets import held_back_prompts
from eagle.heads.checkpoint import load_head
from eagle.model import EaModel
from eagle.decoding.settings import TreeSettings
from eagle.targets.resolve import load_target, resolve_target
from eagle.targets.tokenizer import eos_token_ids, load_tokenizer
from eagle.decoding.tree import chain_choices
from evaluation.vllm_engine import PYTHON as VLLM_PYTHON
from evaluation.vllm_engine import VllmEngine
from train.judge import encode_prompts

log = logging.getLogger("serving")


class ConsumerMissing(RuntimeError):
    """The consumer's venv is not installed here."""


def run_vllm(target: Path, prompts: list[torch.Tensor], max_tokens: int, head: Path | None = None,
             method: str | None = None, spec_tokens: int = 3, dtype: str = "float32", temperature: float = 0.0) -> dict:
    """vLLM's outputs (greedy at temperature 0) for prompts [1, S_i], one at a time, and its speculative
    counters summed."""
    if not VLLM_PYTHON.exists():
        raise ConsumerMissing(f"{VLLM_PYTHON} missing: run `bash scripts/setup_consumers.sh vllm`")
    engine = VllmEngine(target, head, method, getattr(torch, dtype), torch.get_num_threads(), eager=True,
                        spec_tokens=spec_tokens, temperature=temperature)
    try:
        outputs, accepts, start = [], [], time.perf_counter()
        for i, ids in enumerate(prompts, 1):
            new, _, _, lengths = engine.generate(ids, max_tokens)
            outputs.append(new.tolist())
            accepts += lengths
            if i % 10 == 0 or i == len(prompts):
                log.info("vLLM %s: %d/%d prompts, %.0f s", method or "plain", i, len(prompts), time.perf_counter() - start)
    finally:
        engine.close()
    per_position = [sum(a - 1 >= i for a in accepts) for i in range(1, spec_tokens + 1)]
    return {"outputs": outputs, "vllm": engine.version, "drafts": len(accepts), "accepted_per_position": per_position,
            "mean_acceptance_length": sum(accepts) / len(accepts) if accepts else None}


def vllm_method(head_dir: Path) -> str:
    """vLLM's speculative method for an exported head: eagle3 or eagle."""
    raw = json.loads((head_dir / "config.json").read_text())
    archs = " ".join(raw.get("architectures") or []).lower()
    return "eagle3" if raw.get("speculators_model_type") == "eagle3" or "eagle3" in archs else "eagle"


def until_eos(ids: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(ids):
        if t in eos:
            return ids[: i + 1]
    return ids


def ours(target, tokenizer, head_dir: Path, prompts: list[torch.Tensor], max_new: int, k: int):
    """Our decoder on the chain of k tokens: (outputs, τ)."""
    settings = TreeSettings(tree=chain_choices(k), lookup=0)  # the head's chain alone, as vLLM drafts
    model = EaModel(target, load_head(head_dir, dtype=target.dtype), tokenizer, settings,
                    compile=False)  # acceptance only
    outputs, new, steps = [], 0, 0
    for ids in prompts:
        out = model.eagenerate(ids, temperature=0.0, max_new_tokens=max_new)
        outputs.append(out[0, ids.shape[1]:].tolist())
        new, steps = new + model.last_stats.new_tokens, steps + model.last_stats.steps
    return outputs, new / max(steps, 1)


def compare(args) -> dict:
    target_dir = resolve_target(args.base)
    tokenizer = load_tokenizer(target_dir, args.chat_template)
    prompts = encode_prompts(tokenizer, held_back_prompts(args.prompts, args.num_prompts))
    dtype = getattr(torch, args.dtype)
    target = load_target(target_dir, dtype)
    eos = eos_token_ids(target, tokenizer)
    hf = [until_eos(target.generate(p, max_new_tokens=args.max_new_tokens, do_sample=False)[0, p.shape[1]:].tolist(),
                    eos) for p in prompts]
    plain = run_vllm(target_dir, prompts, args.max_new_tokens, dtype=args.dtype)
    plain_out = [until_eos(o, eos) for o in plain["outputs"]]
    report = {"vllm": plain["vllm"], "prompts": args.prompts, "num_prompts": len(prompts), "dtype": args.dtype,
              "spec_tokens": args.spec_tokens, "max_new_tokens": args.max_new_tokens,
              "vllm_plain_equal_hf": sum(a == b for a, b in zip(plain_out, hf)), "heads": {}}
    for name, head_dir in args.head:
        method = vllm_method(head_dir)
        got = run_vllm(target_dir, prompts, args.max_new_tokens, head_dir, method, args.spec_tokens, args.dtype)
        spec_out = [until_eos(o, eos) for o in got["outputs"]]
        our_out, tau = ours(target, tokenizer, head_dir, prompts, args.max_new_tokens, args.spec_tokens)
        report["heads"][name] = {
            "dir": str(head_dir), "method": method,
            "vllm_equal_vllm_plain": sum(a == b for a, b in zip(spec_out, plain_out)),
            "vllm_equal_hf": sum(a == b for a, b in zip(spec_out, hf)),
            "ours_equal_hf": sum(until_eos(a, eos) == b for a, b in zip(our_out, hf)),
            "vllm_mean_acceptance_length": got["mean_acceptance_length"],
            "vllm_accepted_per_position": got["accepted_per_position"], "vllm_drafts": got["drafts"],
            "our_tau": tau,
        }
    return report


def _named(text: str) -> tuple[str, Path]:
    name, _, path = text.partition("=")
    return (name, Path(path)) if path else (Path(name).name, Path(name))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evaluation.serving", description=__doc__.splitlines()[0])
    ap.add_argument("--head", action="append", type=_named, required=True, help="NAME=DIR of a vllm/speculators export")
    ap.add_argument("--base", default="smollm2-135m-instruct")
    ap.add_argument("--chat-template", default=None)
    ap.add_argument("--prompts", default="mtbench")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--spec-tokens", type=int, default=3, help="vLLM's num_speculative_tokens; our chain's length")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--out", default=None, help="also write the report here (JSON)")
    args = ap.parse_args(argv)
    try:
        report = compare(args)
    except ConsumerMissing as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
