"""Plain decoding speed: HF `generate`, our eager step and our compiled step, on the same prompts.

    python -m evaluation.plain_speed [--prompts mtbench] [--num-prompts 8] [--max-new-tokens 128] [--threads N]

Greedy decoding of the first turns of a prompt set, each prompt by each way in turn
(interleaved, so machine noise hits all three alike): `hf` is `target.generate`, `eager` is
`EaModel.naivegenerate` over HF's DynamicCache, `compiled` the same with `compile=True`
(eagle/plain_step.py). Prints tok/s per way (total new tokens over total seconds, compiles
excluded and reported apart), whether each way's tokens equal HF's, and the compile seconds.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from data_prep.prompts import held_back_prompts
from eagle.checkpoint import load_head
from eagle.model import EaModel
from eagle.settings import TreeSettings
from eagle.targets import load_target, resolve_target
from eagle.tokenizer import load_tokenizer
from train.judge import encode_prompts

WAYS = ("hf", "eager", "compiled")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m evaluation.plain_speed", description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="smollm2-135m-instruct")
    ap.add_argument("--head", default="checkpoints/eagle-smollm2-135m-instruct", help="any head (EaModel needs one)")
    ap.add_argument("--prompts", default="mtbench")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--threads", type=int, default=None, help="default: torch's (every core)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    path = resolve_target(args.base)
    target, tokenizer = load_target(path, args.dtype, "cpu"), load_tokenizer(path)
    head = load_head(args.head, dtype=getattr(torch, args.dtype))
    fixed = TreeSettings(total_token=24, depth=5, top_k=8)  # unused by plain decoding; no tuning
    models = {way: EaModel(target, head, tokenizer, fixed, compile=way == "compiled") for way in WAYS[1:]}
    prompts = encode_prompts(tokenizer, held_back_prompts(args.prompts, args.num_prompts))
    warm = models["compiled"]
    start = time.perf_counter()
    warm.naivegenerate(prompts[0], max_new_tokens=2)  # compiles the first bucket before any timing
    tokens = {w: 0 for w in WAYS}
    seconds = {w: 0.0 for w in WAYS}
    equal = {w: 0 for w in WAYS}
    for ids in prompts:
        outs = {}
        for way in WAYS:
            compiled_before = warm.plain.compile_seconds
            t0 = time.perf_counter()
            with torch.inference_mode():
                if way == "hf":
                    out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                          max_new_tokens=args.max_new_tokens, temperature=None, top_p=None, top_k=None)
                else:
                    out = models[way].naivegenerate(ids, max_new_tokens=args.max_new_tokens)
            seconds[way] += time.perf_counter() - t0 - (warm.plain.compile_seconds - compiled_before)
            outs[way] = out[0, ids.shape[1]:]
            tokens[way] += outs[way].numel()
        for way in WAYS:
            equal[way] += int(torch.equal(outs[way], outs["hf"]))
    result = {"threads": torch.get_num_threads(), "dtype": args.dtype, "prompts": len(prompts),
              "compile_seconds": round(warm.plain.compile_seconds, 1),
              "wall_seconds": round(time.perf_counter() - start, 1),
              **{f"{w}_tok_s": tokens[w] / seconds[w] for w in WAYS}, **{f"{w}_equal_hf": equal[w] for w in WAYS}}
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
