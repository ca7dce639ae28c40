"""`python -m experiments.gemv_roofline`: how fast a decode step's linear layers read their weights, torch's
matmul against our GEMV.

    python -m experiments.gemv_roofline smollm2-135m-instruct --threads 2 --rows 1,4,8,16,32

A decode step at batch size 1 (a plain step, or a verify of a tree's nodes) multiplies a few rows through every
linear layer of the target: it reads all the weights once, so it is bound by the memory's bandwidth, not by
arithmetic. This times those layers in the target's shapes (a weight of its own per layer, as in the model, so
none stays in cache) with torch's eager `F.linear` and with our kernel (`torch.ops.eagle.gemv_linear`,
eagle/compiled/gemv.py, at any row count, its weights in its layout: `gemv.pack`), in the rows the kernel takes
(bf16 where the CPU has AVX512-BF16; elsewhere fp32, torch's linear then reading fp32 weights, twice the
bytes, as the fp32 model's does), beside the memory's read bandwidth (experiments/decode_roofline.py).
Prints, per row count, each one's milliseconds and the GB/s at which it read the weights; checks the kernel's
output against torch's. `gemv_siblings` is the kernel over the same bytes with each layer's sibling linears (those
reading the same input: q, k and v; gate and up) as one weight: four calls a layer instead of seven, which is what
a graph pass joining them would buy. Rows past a few dozen are compute-bound, where ATen's blocking wins: the decoder's op
hands them to ATen (`gemv.MAX_ROWS`). `gemv_int8` (where the kernel runs its AVX2 form in fp32) is the same layers
read as int8 codes and a scale a row (`int8_codes.int8_pack`, the form the draft head's graphs take: half the bytes).

`--decode torch|gemv` times our compiled plain decoding instead (`EaModel.naivegenerate`, 64 greedy tokens of a
chat prompt, bf16), with EAGLE_GEMV=0 or 1; one mode a process, so run the two alternately:

    for m in gemv torch gemv torch; do python -m experiments.gemv_roofline --threads 2 --decode $m; done
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F
from transformers import AutoConfig

from eagle.compiled import gemv, int8_codes
from eagle.targets.resolve import resolve_target
from evaluation.thread_teams import median_ms
from experiments.decode_roofline import linear_shapes, projection_widths, read_bandwidth


def random_weights(shapes: list[tuple[int, int]]) -> list[torch.Tensor]:
    """A random bf16 weight [out, in] for each (in, out)."""
    return [torch.randn(o, i, dtype=torch.bfloat16) * i**-0.5 for i, o in shapes]


def layer_weights(config) -> list[torch.Tensor]:
    """One bf16 weight [out, in] per linear layer of a decode step (every layer's, and the lm_head)."""
    return random_weights([(i, o) for i, o, count in linear_shapes(config) for _ in range(count)])


def sibling_weights(config) -> list[torch.Tensor]:
    """The same layers with siblings joined: per layer qkv [q + 2 kv, H], o [H, q], gate_up [2 I, H], down [H, I];
    then the lm_head."""
    h, inter, n = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    q, kv = projection_widths(config)
    return random_weights([(h, q + 2 * kv), (q, h), (h, 2 * inter), (inter, h)] * n + [(h, config.vocab_size)])


def step_ms(weights: list[torch.Tensor], rows: int, linear, rounds: int, dtype: torch.dtype) -> float:
    """Milliseconds for `rows` rows of `dtype` through every weight with `linear(x, w)` (w [O, I], or packed)."""
    def width(w) -> int:  # I of a weight in any of the kernel's layouts, or of int8 codes and scales
        return w[0].shape[1] * int8_codes.CODE_INPUTS if isinstance(w, tuple) else gemv.in_features(w)

    inputs = {i: torch.randn(rows, i, dtype=dtype) for i in {width(w) for w in weights}}

    def run():
        for w in weights:
            linear(inputs[width(w)], w)

    run()
    return median_ms(run, rounds)


def kernel_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, I] @ w^T through the kernel at any M (w in the kernel's layout: `gemv.pack`)."""
    return torch.ops.eagle.gemv_linear(x, w, x.shape[0])


def int8_linear(x: torch.Tensor, w: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x [M, I] @ w^T through the kernel's int8 form at any M (w: `int8_codes.int8_pack`'s codes and scales)."""
    return torch.ops.eagle.gemv_int8_linear(x, *w, x.shape[0], x.new_empty(0))


def kernel_dtype() -> torch.dtype:
    """The rows the built kernel multiplies: bf16 where the CPU has AVX512-BF16, else fp32 (its f32 kind)."""
    return torch.bfloat16 if gemv.kernel().available() else torch.float32


def decode(target: str, head: str, mode: str, tokens: int = 64) -> dict:
    """ms a token of compiled plain decoding, the target's linears through `mode` (torch | gemv), and its tokens."""
    from eagle.model import EaModel
    from eagle.targets.tokenizer import load_tokenizer

    os.environ["EAGLE_GEMV"] = "1" if mode == "gemv" else "0"
    model = EaModel.from_pretrained(target, head, torch_dtype=torch.bfloat16, background=False, quiet=True)
    chat = [{"role": "user", "content": "Write a short story about a robot who learns to paint, with three characters."}]
    ids = torch.tensor([load_tokenizer(resolve_target(target)).apply_chat_template(
        chat, add_generation_prompt=True, tokenize=True, return_dict=False)])
    model.naivegenerate(ids, max_new_tokens=tokens)  # compiles
    ms = median_ms(lambda: model.naivegenerate(ids, max_new_tokens=tokens), 3) / tokens
    out = model.naivegenerate(ids, max_new_tokens=tokens)[0, ids.shape[1]:].tolist()
    return {"decode": mode, "ms_per_token": round(ms, 2), "tokens": out}


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(prog="python -m experiments.gemv_roofline", description=__doc__.splitlines()[0])
    p.add_argument("target", nargs="?", default="smollm2-135m-instruct", help="a target name or folder")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", default="1,2,4", help="rows a step multiplies")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--decode", choices=("torch", "gemv"), help="time compiled plain decoding instead (see above)")
    p.add_argument("--head", default="checkpoints/eagle3-smollm2-135m-instruct", help="any head of the target (--decode)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.decode:
        print(json.dumps(decode(args.target, args.head, args.decode)), flush=True)
        return []
    if gemv.kernel() is None:
        raise SystemExit("the GEMV kernel needs a CPU with AVX512-BF16, AVX512F or AVX2 with FMA, and a C++ compiler")
    dtype = kernel_dtype()  # torch's linear in it: the bf16 model's, or the fp32 model's over fp32 weights
    config = AutoConfig.from_pretrained(resolve_target(args.target))
    weights, siblings = layer_weights(config), sibling_weights(config)
    dense = [w.to(dtype) for w in weights]
    weights, siblings = [gemv.pack(w) for w in weights], [gemv.pack(w) for w in siblings]
    x = torch.randn(3, dense[0].shape[1], dtype=dtype)
    torch.testing.assert_close(kernel_linear(x, weights[0]).float(), F.linear(x, dense[0]).float(),
                               rtol=0.02, atol=0.02)
    size = sum(w.numel() * w.element_size() for w in weights)  # the kernel's bytes: bf16 weights
    assert size == sum(w.numel() * w.element_size() for w in siblings)
    read = {"torch": sum(w.numel() * w.element_size() for w in dense), "gemv": size, "gemv_siblings": size}
    int8 = [int8_codes.int8_pack(w) for w in dense] if dtype == torch.float32 and gemv.kernel().packed() else []
    if int8 and all(w is not None for w in int8):  # every layer's shape packs (even outputs, inputs of 16s)
        read["gemv_int8"] = sum(q.numel() + s.numel() * 4 for q, s in int8)
    bandwidth = read_bandwidth(args.rounds)
    out = []
    for rows in (int(r) for r in args.rows.split(",")):
        ms = {"torch": step_ms(dense, rows, F.linear, args.rounds, dtype),
              "gemv": step_ms(weights, rows, kernel_linear, args.rounds, dtype),
              "gemv_siblings": step_ms(siblings, rows, kernel_linear, args.rounds, dtype),
              **({"gemv_int8": step_ms(int8, rows, int8_linear, args.rounds, dtype)} if "gemv_int8" in read else {})}
        out.append({"rows": rows, "threads": args.threads, "dtype": str(dtype).removeprefix("torch."),
                    "weights_mb": round(size / 1e6), "read_gb_s": round(bandwidth / 1e9, 1),
                    **{f"{k}_ms": round(v, 1) for k, v in ms.items()},
                    **{f"{k}_gb_s": round(read[k] / v / 1e6, 1) for k, v in ms.items()}})
        print(json.dumps(out[-1]), flush=True)
    return out


if __name__ == "__main__":
    main()
