"""How fast is the target's forward when compiled with fixed shapes? A probe for the decoder's plan.

    python -m evaluation.compiled_forward [--threads 2] [--dtype bfloat16] [--cache-len 256 1024] [--k 1 24]

For each preallocated cache length L and query width k (1 = a plain decoding step, 24 = a
verify forward of a 24-node tree), after a 200-token prefill, the median ms of the same
forward three ways:

- `dynamic`: HF's default DynamicCache, eager (what EaModel runs today);
- `static`: a StaticCache of L rows, eager, with an additive mask over all L rows;
- `compiled`: the static one through `torch.compile(fullgraph=True, dynamic=False)` with
  inductor's `freezing` (weights folded as constants: prepacked matmuls on a CPU). Freezing is
  set by `torch._inductor.config.patch` around the compiling call: passed as
  `torch.compile(options={"freezing": True})` it had no effect here (35.5 ms, as eager).

Each call writes its k rows at the same position and is then rolled back, so every call sees
the same context. Also printed: the first call's seconds (the compile) and the largest logit
difference from `dynamic` (fp32: how far from identical; bf16: rounding).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch._inductor.config as inductor
from transformers import DynamicCache, StaticCache

from eagle.targets.resolve import load_target, resolve_target

PROMPT = 200


def forward_mask(k: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """[1, 1, k, width] additive: the prompt and a causal block over the k new rows; -inf elsewhere."""
    neg = torch.finfo(dtype).min
    mask = torch.full((1, 1, k, width), neg, dtype=dtype)
    mask[..., :PROMPT] = 0
    causal = torch.tril(torch.ones(k, k, dtype=torch.bool))
    mask[0, 0, :, PROMPT:PROMPT + k] = torch.where(causal, 0.0, neg)
    return mask


@torch.inference_mode()
def measure(model, kind: str, k: int, cache_len: int, reps: int) -> tuple[float, float, torch.Tensor]:
    """(first call seconds, median ms, last-row logits [V]) of one way of running the k-row forward."""
    dtype = model.get_input_embeddings().weight.dtype
    cache = DynamicCache(config=model.config) if kind == "dynamic" else StaticCache(config=model.config,
                                                                                     max_cache_len=cache_len)
    prompt = torch.randint(100, 40000, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    model(input_ids=prompt, past_key_values=cache, use_cache=True)
    tokens = torch.randint(100, 40000, (1, k), generator=torch.Generator().manual_seed(k))  # [1, k]
    positions = torch.arange(PROMPT, PROMPT + k)[None]  # [1, k]
    mask = forward_mask(k, PROMPT + k if kind == "dynamic" else cache_len, dtype)
    forward = torch.compile(model.forward, fullgraph=True, dynamic=False) if kind == "compiled" else model.forward

    def call():
        out = forward(input_ids=tokens, position_ids=positions, attention_mask=mask, past_key_values=cache,
                      use_cache=True, cache_position=positions[0])
        if kind == "dynamic":
            cache.crop(-k)
        else:
            for layer in cache.layers:
                layer.cumulative_length.fill_(PROMPT)
        return out.logits[0, -1].float()

    start = time.perf_counter()
    logits = call()
    first = time.perf_counter() - start
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return first, 1000 * statistics.median(times), logits


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(prog="python -m evaluation.compiled_forward", description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="smollm2-135m-instruct")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--threads", type=int, default=None, help="default: torch's (every core)")
    ap.add_argument("--cache-len", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--k", type=int, nargs="+", default=[1, 24])
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_target(resolve_target(args.base), args.dtype, "cpu")
    rows = []
    for k in args.k:
        first, ms, ref = measure(model, "dynamic", k, 0, args.reps)
        rows.append({"k": k, "way": "dynamic", "cache_len": None, "first_s": first, "ms": ms, "max_dlogit": 0.0})
        for cache_len in args.cache_len:
            for way in ("static", "compiled"):
                torch._dynamo.reset()
                with inductor.patch(freezing=True):  # weights become graph constants: prepacked matmuls on a CPU
                    first, ms, logits = measure(model, way, k, cache_len, args.reps)
                rows.append({"k": k, "way": way, "cache_len": cache_len, "first_s": first, "ms": ms,
                             "max_dlogit": float((logits - ref).abs().max()),
                             "same_argmax": bool(logits.argmax() == ref.argmax())})
        for r in rows:
            if r["k"] == k:
                print(f"k={k:3d} {r['way']:9s} L={r['cache_len'] or '-':>5} first {r['first_s']:6.1f} s  "
                      f"median {r['ms']:6.1f} ms  max|Δlogit| {r['max_dlogit']:.3g}", flush=True)
    return rows


if __name__ == "__main__":
    main()
