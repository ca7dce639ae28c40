"""A pseudo CUDA device for a CPU-only build: tensors that say `cuda:0` and fail on device mixing as CUDA does.

Inside `PseudoCuda()`, anything asked for on a CUDA device (`torch.zeros(3, device="cuda")`,
`x.to("cuda")`, `module.to(device)`, `torch.tensor(v, device=t.device)` with `t` on it) is
made on the CPU and tagged: its `.device` reads cuda:0, and every result computed from it is
tagged too. Each call checks its tensor arguments the way CUDA kernels do: CUDA tensors may meet
CPU tensors only as zero-dimensional, unmodified arguments (Python-scalar-like) or as indices;
anything else raises "Expected all tensors to be on the same device". So the bug class "a CPU
tensor the trainer created meets the model's CUDA tensors" shows up on a laptop. Moving data
(`.to`, `.cpu()`, `copy_`) is allowed, as on a GPU.

It works at the `__torch_function__` level: the tensors really are CPU tensors for every C++
kernel (a CPU-only build refuses any CUDA device guard, which is also why FakeTensorMode
cannot index a "cuda" tensor here). Autograd's gradients are untagged, so the checks cover
forward computation, losses and statistics, not the optimizer.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

CUDA = torch.device("cuda", 0)
MOVES = {torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu, torch.Tensor.copy_}
INDEXING = {torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.index_put_, torch.Tensor.index_put}
SHALLOW_COPY = torch._has_compatible_shallow_copy_type  # Module.to asks it: "may I swap .data in place?"


class CudaTagged(torch.Tensor):
    """A CPU tensor presented as cuda:0 (only meaningful inside `PseudoCuda`)."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def device(self) -> torch.device:
        return CUDA

    @property
    def is_cuda(self) -> bool:
        return True


def tag(t):
    return t.as_subclass(CudaTagged) if isinstance(t, torch.Tensor) and not isinstance(t, CudaTagged) else t


def untag(t):
    return t.as_subclass(torch.Tensor) if isinstance(t, CudaTagged) else t


def _is_cuda(device) -> bool:
    return device is not None and torch.device(device).type == "cuda"


class PseudoCuda(TorchFunctionMode):
    """Run the code under test with "cuda" meaning tagged CPU tensors and CUDA's device rules."""

    def __enter__(self):
        self._generator = torch.Generator
        torch.Generator = _cpu_generator  # a CUDA generator cannot exist here; seeds work the same
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Generator = self._generator
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in MOVES:
            return _move(func, args, kwargs)
        if func is SHALLOW_COPY:  # no across devices: `module.to` then makes new (tagged) parameters
            return func(*args, **kwargs) and isinstance(args[0], CudaTagged) == isinstance(args[1], CudaTagged)
        if _is_cuda(kwargs.get("device")):  # a factory (zeros, full, arange, tensor, randn, ...)
            return tag(func(*args, **{**kwargs, "device": "cpu"}))
        tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        on_cuda = any(isinstance(t, CudaTagged) for t in tensors)
        if on_cuda and func not in INDEXING:
            _check_devices(func, args, tensors)
        out = func(*args, **kwargs)
        return tree_map(tag, out) if on_cuda else out


def _move(func, args, kwargs):
    """`.to(...)`, `.cuda()`, `.cpu()`, `.copy_(src)`: the data moves (a copy), the tag follows the target."""
    self = args[0]
    if func is torch.Tensor.copy_:
        return func(*args, **kwargs)
    if func is torch.Tensor.cpu:
        return untag(self).clone() if isinstance(self, CudaTagged) else self
    device, dtype = CUDA if func is torch.Tensor.cuda else None, kwargs.get("dtype")
    device = kwargs.get("device", device)
    for a in args[1:]:
        if isinstance(a, torch.Tensor):
            device, dtype = a.device, a.dtype
        elif isinstance(a, torch.dtype):
            dtype = a
        elif isinstance(a, (str, torch.device)):
            device = a
    plain = untag(self).to(dtype=dtype or self.dtype)
    if device is None:
        return tag(plain) if isinstance(self, CudaTagged) else plain
    if _is_cuda(device):
        return self if isinstance(self, CudaTagged) and plain is untag(self) else tag(plain)
    return plain.clone() if isinstance(self, CudaTagged) and plain is untag(self) else plain


def _check_devices(func, args, tensors) -> None:
    """CUDA's rule: besides CUDA tensors, only zero-dimensional CPU tensors that are not written to."""
    name = getattr(func, "__name__", "")
    in_place = name.endswith("_") and not name.startswith("__") or name.startswith("__i")
    target = args[0] if in_place and args else None
    for t in tensors:
        if isinstance(t, CudaTagged):
            continue
        if t.dim() > 0 or t is target:
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"cuda:0 and cpu! ({name}: a CPU tensor of shape {tuple(t.shape)})")


def _cpu_generator(device=None):
    return torch._C.Generator("cpu")
