"""Each layer's sibling linear weights as row blocks of one tensor, so a compiled graph reads them in one GEMV.

    join(target, gemv.reads)         # q/k/v and gate/up weights: views of one tensor per group, same values
    runs = sibling_runs(weights)     # in a graph: which weights (real tensors) sit back to back in one storage

A decode step's linear layers are a few rows by a weight each, so each is one call of our GEMV kernel
(eagle/compiled/gemv.py), and the call's fixed costs (dispatch from the graph's C++ wrapper, the thread team's
start and join, the weight stream's ramp) are paid per weight. The attention's q, k and v projections read the
same input, as do the MLP's gate and up: read as one weight each, a layer makes 4 calls instead of 7. A joined
weight's rows give the same bits as the separate ones (each output row is its own dot product).

Joining copies no weight into a graph: `join` makes the siblings views of one new tensor (the old storages are
freed), and gemv's pass reads the group through a view of the first sibling's frozen constant that spans the
others (`aten.as_strided`), so the graph holds the model's own storage, as it does for every frozen weight, and
inductor's FX graph cache stores no copy of it. The storage layout is part of the graphs' cache key
(eagle/compiled/graph_cache.py `weights_digest`): a graph that reads past a weight's own rows is only served to
a model whose weights are joined the same way.

The target's values do not change: its eager forwards, HF `generate` and `save_pretrained` (which saves tensors
sharing a storage as copies) see the same weights.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # children of one module reading one input


def join(model: nn.Module, reads: Callable[[torch.Tensor], bool]) -> int:
    """Make each module's sibling linears' weights (`SIBLINGS`: all present and bias-free, one dtype, device and
    input width, each one `reads(weight)` accepts) consecutive row blocks of one new contiguous tensor
    [sum O, I], values unchanged. Groups already joined are left alone. How many groups were joined.

    `reads`: whether the graphs' GEMV pass takes a weight (eagle/compiled/gemv.py `reads`). Only those may be
    joined: inductor's C++ GEMM template packs a frozen weight that starts inside a larger storage from the
    wrong place (its outputs were wrong by up to 0.19 on a tiny fp32 model)."""
    count = 0
    with torch.no_grad():
        for module in model.modules():
            for names in SIBLINGS:
                linears = [getattr(module, name, None) for name in names]
                if not all(isinstance(linear, nn.Linear) and linear.bias is None for linear in linears):
                    continue
                weights = [linear.weight for linear in linears]
                if (not _joinable(weights) or not all(map(reads, weights))
                        or len(sibling_runs(weights)[0]) == len(weights)):
                    continue
                joined = torch.cat([w.detach() for w in weights])  # [sum O, I]
                start = 0
                for linear in linears:
                    rows = linear.weight.shape[0]
                    linear.weight.data = joined[start:start + rows]  # [O, I], a view of `joined`
                    start += rows
                count += 1
    return count


def _joinable(weights: list[torch.Tensor]) -> bool:
    first = weights[0]
    return all(w.dim() == 2 and w.dtype == first.dtype and w.device == first.device and w.shape[1] == first.shape[1]
               for w in weights)


def sibling_runs(weights: list[torch.Tensor]) -> list[list[int]]:
    """The weights [O_i, I] (contiguous row-major blocks, or not) split into runs of indices whose blocks follow
    one another in one storage, in order: [[0, 1, 2], [3]] where weights 0-2 are joined and 3 is not."""
    runs: list[list[int]] = []
    for i, w in enumerate(weights):
        if runs and _follows(weights[runs[-1][-1]], w):
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def _follows(before: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether `w`'s rows start where `before`'s end, in the same storage, both contiguous [O, I] of one dtype."""
    return (before.is_contiguous() and w.is_contiguous() and before.dim() == w.dim() == 2
            and before.dtype == w.dtype and before.shape[1] == w.shape[1]
            and before.untyped_storage().data_ptr() == w.untyped_storage().data_ptr()
            and w.storage_offset() == before.storage_offset() + before.numel())
