"""`python -m experiments.decode_roofline`: the fastest a batched reply engine could write on this CPU.

    python -m experiments.decode_roofline smollm2-135m-instruct --threads 2 --batches 64,256 --contexts 256,512

One decode step of a batch of B replies, each over C tokens of context, must at least multiply B rows
through every linear layer of the target (its lm_head included) and attend over B × C cached keys and
values in every layer. This times those linear layers in the target's shapes and dtype, and the memory's
read bandwidth (a sum over 1 GB); the layers plus the cached keys and values read at that bandwidth are a
lower bound on a step (no norms, rotary, attention arithmetic, sampling, scheduling or Python), so
B / that sum bounds the reply tokens/s of any engine running the target here. Attention kernels are timed
beside it, one query row a reply: torch's SDPA, our compiled decoder's grouped SDPA (a key/value head's
query heads as its rows, eagle/compiled/grouped_attention.py), the same as two batched matmuls, and our
batched reply engine's C++ kernel (data_prep/slot_attention.py), in fp32 also over a bf16 cache
(`slots_bf16_cache`, how the engine runs a bf16 target on a CPU without bf16 arithmetic).
Medians of `rounds`; prints the bound, the linear layers' GFLOP/s and the GB/s at which each kernel reads
the keys and values.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from transformers import AutoConfig

from data_prep.slot_attention import slot_decode, slot_shape
from eagle.common.precision import fast_dtype
from eagle.compiled.grouped_attention import grouped_attention
from eagle.targets.resolve import resolve_target
from evaluation.thread_teams import median_ms


def projection_widths(config) -> tuple[int, int]:
    """(q, kv): the outputs of a layer's query projection and of each of its key and value projections."""
    _, kv_heads, dim = slot_shape(config)
    return config.num_attention_heads * dim, kv_heads * dim


def linear_shapes(config) -> list[tuple[int, int, int]]:
    """(in, out, count) of every linear layer a decode step runs: q, k, v, o, gate, up, down per layer, lm_head."""
    h, inter, n = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    q, kv = projection_widths(config)
    return [(h, q, n), (q, h, n), (h, kv, 2 * n), (h, inter, 2 * n), (inter, h, n), (h, config.vocab_size, 1)]


def _median_seconds(run, rounds: int) -> float:
    run()  # warm-up: first-call allocation and kernel selection
    return median_ms(run, rounds) / 1000


def linear_seconds(shapes, batch: int, dtype: torch.dtype, rounds: int) -> tuple[float, float]:
    """Seconds for one step's linear layers at `batch` rows, and the FLOPs they do."""
    pairs = [(torch.randn(batch, k, dtype=dtype), torch.randn(k, o, dtype=dtype), c) for k, o, c in shapes]

    def run():
        for x, w, count in pairs:
            for _ in range(count):
                torch.mm(x, w)

    flops = sum(2 * batch * k * o * c for k, o, c in shapes)
    return _median_seconds(run, rounds), flops


def read_bandwidth(rounds: int) -> float:
    """Bytes a second this process reads streaming through 1 GB: an fp32 sum, every byte loaded once (torch
    sums bf16 through a slow fp32 conversion, so fp32 stands for any dtype's bytes)."""
    big = torch.ones(2**28)  # [2^28] fp32 = 1 GB
    return big.numel() * big.element_size() / _median_seconds(big.sum, rounds)


def bmm_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Decode attention as two batched matmuls: the query rows sharing a key head become one matrix.
    q [B, H, 1, d], k and v [B, Hkv, C, d] -> [B, H, 1, d]."""
    b, h, _, d = q.shape
    rows = q.view(b, k.shape[1], h // k.shape[1], d)  # [B, Hkv, g, d]
    weights = torch.softmax((rows @ k.transpose(-1, -2)).float() * d**-0.5, dim=-1).to(v.dtype)  # [B, Hkv, g, C]
    return (weights @ v).view(b, h, 1, d)


def slot_attention_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Our batched reply engine's decode attention (data_prep/slot_attention.py): each reply in its own slot
    of the cache, here the whole of k and v (its last position rewritten with itself). -> [B, H, 1, d]."""
    b, context = q.shape[0], k.shape[2]
    last = lambda x: x[:, :, -1].to(q.dtype).contiguous()  # [B, Hkv, d]: the rows, in fp32 over a bf16 cache
    out = slot_decode(q[:, :, 0].contiguous(), last(k), last(v), k, v,
                      torch.arange(b), torch.full((b,), context), q.shape[-1] ** -0.5, 0, 0.0)
    return out[:, :, None]


BF16_CACHE = "slots_bf16_cache"  # how our engine runs a bf16 target on a CPU without bf16 arithmetic
KERNELS = {  # q [B, H, 1, d], k and v [B, Hkv, C, d] -> the attention's output
    "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
    "grouped_sdpa": lambda q, k, v: grouped_attention(q, k, v, q.new_zeros(1, 1, 1, k.shape[2]), q.shape[-1] ** -0.5),
    "bmm": bmm_attention,
    "slots": slot_attention_kernel,
    BF16_CACHE: slot_attention_kernel,  # fp32 rows over bf16 keys and values (fp32 runs only)
}


def attention_seconds(config, batch: int, context: int, dtype: torch.dtype, rounds: int,
                      kernel: str = "sdpa") -> tuple[float, float]:
    """Seconds for one step's attention (one query row per reply over `context` cached tokens, every layer)
    with a kernel of KERNELS (torch's SDPA; our compiled decoder's grouped SDPA; `bmm_attention`; our engine's), and the
    bytes of keys and values it reads."""
    (_, kv_heads, dim), heads = slot_shape(config), config.num_attention_heads
    cache = torch.bfloat16 if kernel == BF16_CACHE else dtype
    q = torch.randn(batch, heads, 1, dim, dtype=dtype)  # [B, H, 1, d]
    layers = [(torch.randn(batch, kv_heads, context, dim, dtype=cache),  # K [B, Hkv, C, d]
               torch.randn(batch, kv_heads, context, dim, dtype=cache)) for _ in range(config.num_hidden_layers)]
    attend = KERNELS[kernel]

    def run():
        for k, v in layers:
            attend(q, k, v)

    read = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
    return _median_seconds(run, rounds), read


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(prog="python -m experiments.decode_roofline", description=__doc__.splitlines()[0])
    p.add_argument("target", nargs="?", default="smollm2-135m-instruct", help="a target name or folder")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batches", default="64,256", help="replies decoded together")
    p.add_argument("--contexts", default="256,512", help="tokens each reply attends over")
    p.add_argument("--dtype", default="auto", help="auto: bf16 where this CPU has bf16 arithmetic, else fp32")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = fast_dtype(args.dtype)
    config = AutoConfig.from_pretrained(resolve_target(args.target))
    bandwidth = read_bandwidth(args.rounds)
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        mm, flops = linear_seconds(linear_shapes(config), batch, dtype, args.rounds)
        for context in (int(c) for c in args.contexts.split(",")):
            seconds = {kernel: attention_seconds(config, batch, context, dtype, args.rounds, kernel)
                       for kernel in KERNELS if kernel != BF16_CACHE or dtype == torch.float32}
            read = seconds["sdpa"][1]
            rows.append({"batch": batch, "context": context, "dtype": str(dtype).removeprefix("torch."),
                         "linear_ms": round(1e3 * mm, 1), "linear_gflops": round(flops / mm / 1e9, 1),
                         "kv_read_ms": round(1e3 * read / bandwidth, 1), "read_gb_s": round(bandwidth / 1e9, 1),
                         **{f"{kernel}_ms": round(1e3 * t, 1) for kernel, (t, _) in seconds.items()},
                         **{f"{kernel}_kv_gb_s": round(own / t / 1e9, 1) for kernel, (t, own) in seconds.items()},
                         "bound_tok_s": round(batch / (mm + read / bandwidth))})
            print(json.dumps(rows[-1]), flush=True)
    return rows


if __name__ == "__main__":
    main()
