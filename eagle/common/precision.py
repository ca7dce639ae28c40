"""Which floating-point type a device computes fast in.

bf16 halves the bytes of every weight, but its arithmetic is fast only where the hardware has
it: GPUs since Ampere, and CPUs with AVX512-BF16 or AMX. Elsewhere (an AVX2-only AMD EPYC or
older Intel Xeon, a common cloud CPU) PyTorch converts each bf16 operand to fp32 in software.
On such a 2-core EPYC, SmolLM2-135M's forward of a 300-token prompt took 5.1 s in bf16 against
1.1 s in fp32, and a [4096, 576] x [576, 1536] matmul ran at 9 against 75 GFLOPS
(docs/speed.md, "CPUs without bf16 arithmetic").

`fast_dtype` is the dtype the target and head compute in: the one asked for, except bf16 on a
device without bf16 arithmetic, which runs in fp32; "auto" asks for bf16. It serves data_prep's
features, online training's target, regeneration, and `eagle.chat` and the bench by default
(`--dtype auto`): on that EPYC a compiled 16-row tree verify took 255 ms in bf16 against 135 ms
in fp32, where a one-token step took 33 against 39 ms. What is stored (features, heads) keeps
the dtype asked for.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("eagle")


def native_bf16(device: str | torch.device = "cpu") -> bool:
    """Whether `device` has bf16 arithmetic (CUDA: the GPU says; CPU: AVX512-BF16 or AMX)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    return True  # other accelerators: trust the dtype asked for


def asked_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The dtype a config's `dtype` names ("auto" = bf16)."""
    return getattr(torch, "bfloat16" if dtype == "auto" else dtype) if isinstance(dtype, str) else dtype


def fast_dtype(dtype: str | torch.dtype, device: str | torch.device = "cpu") -> torch.dtype:
    """The dtype to compute in when `dtype` ("auto" = bf16) is asked for on `device` (says so when it differs)."""
    dtype = asked_dtype(dtype)
    if dtype == torch.bfloat16 and not native_bf16(device):
        log.info("this %s has no bf16 arithmetic (%s): computing in float32 (what is written to disk keeps bfloat16)",
                 torch.device(device).type, torch.backends.cpu.get_cpu_capability())
        return torch.float32
    return dtype
