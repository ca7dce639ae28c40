"""`python -m experiments.newton_schulz`: what Muon's orthogonalization costs per step, fp32 against bf16.

    python -m experiments.newton_schulz checkpoints/eagle3-smollm2-135m-instruct --threads 1

Times DeepSpeed's Newton-Schulz iteration (`zeropower_via_newtonschulz5`, 5 steps, as `muon_update`
calls it) over the head's matrices that Muon steps (train/optimizers.py `muon_matrix`), in each dtype,
interleaved rounds, median seconds for all of them: the time one optimizer step spends orthogonalizing.
On a CPU without bf16 arithmetic, bf16 is what DeepSpeed picks unless train/optimizers.py steps in.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from train.optimizers import muon_matrix

STEPS = 5  # muon_update's ns_steps


def orthogonalize_seconds(matrices: list[torch.Tensor], dtype: torch.dtype, rounds: int) -> float:
    """Median over `rounds` of the seconds Newton-Schulz takes over all `matrices` in `dtype`."""
    from deepspeed.runtime.zero.muon import original_muon

    chosen = original_muon.ns_compute_dtype
    original_muon.ns_compute_dtype = lambda ns_method: dtype
    try:
        original_muon.zeropower_via_newtonschulz5(matrices[0], steps=STEPS)  # a compile, if DeepSpeed compiles it
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            for m in matrices:
                original_muon.zeropower_via_newtonschulz5(m, steps=STEPS)
            times.append(time.perf_counter() - start)
    finally:
        original_muon.ns_compute_dtype = chosen
    return statistics.median(times)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m experiments.newton_schulz", description=__doc__.splitlines()[0])
    p.add_argument("head", type=Path, help="a head folder (model.safetensors)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    weights = load_file(args.head / "model.safetensors")
    matrices = [w.float() for name, w in sorted(weights.items()) if w.is_floating_point() and muon_matrix(name, w)]
    result = {"matrices": [list(m.shape) for m in matrices], "threads": args.threads,
              "cpu": torch.backends.cpu.get_cpu_capability()}
    for dtype in (torch.float32, torch.bfloat16):
        result[f"{str(dtype).removeprefix('torch.')}_s"] = orthogonalize_seconds(matrices, dtype, args.rounds)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
