"""A compiled graph called without dynamo's cache lookup.

    before = graphs(fn)                  # fn: the function (or bound method) given to torch.compile
    compiled(...)                        # a call that compiles one new graph for fn
    call = newest(fn, before)            # that graph's dynamo-transformed code, as a function (None: unsure)
    out = call(...)                      # the same arguments as fn: runs that graph, checks nothing

Every call of a `torch.compile`d function goes through dynamo's frame hook, which looks up the function's
cache entries and evaluates the guards that tell them apart before it runs an entry's transformed code (the
bytecode that calls the compiled graph and rebuilds the outputs). Our compiled target and head already skip
the guards on the shapes they have compiled (`set_stance(skip_guard_eval_unsafe=True)`, eagle/compiled/
graph_cache.py); what is left still costs ~0.1-0.2 ms a call with the target's 30 layers, several calls a
decode step. The runners know which graph a call needs (their shape key), so they call its transformed code
directly: the same bytecode dynamo would run, without the lookup. It checks nothing: a caller passes only what
the graph was compiled for (the same non-tensor values and objects, tensors of its shapes and dtypes), which
the runners' shape keys (cache bucket, rows, hidden states; the head's rows and widths) spell out.

A runner takes a graph's code right after the call that compiled it: the one entry of the code's list that was
not there before (our compiles never overlap: eagle/common/forward_lock.py). Where there is not exactly one
(a recompile), `newest` gives None and that shape keeps dynamo's path. The function gets a snapshot of its
module's globals (the transformed code's compiled graph and imports live there), so a later
`torch._dynamo.reset()` cannot take them from under it.
"""

from __future__ import annotations

import types
from collections.abc import Callable


def graphs(fn: Callable) -> set[int]:
    """The graphs dynamo holds for fn's code, by the identity of their transformed code (empty where this torch
    cannot say)."""
    return {id(entry.code) for entry in _cache_entries(fn) or ()}


def newest(fn: Callable, before: set[int]) -> Callable | None:
    """The transformed code of the one graph of fn not in `before` (`graphs(fn)` before the call that compiled
    it), as a function taking fn's arguments (bound to fn's object where fn is a bound method); None where there
    is not exactly one."""
    new = [entry.code for entry in _cache_entries(fn) or () if id(entry.code) not in before]
    func = getattr(fn, "__func__", fn)
    if len(new) != 1 or not isinstance(new[0], types.CodeType) or new[0].co_freevars != func.__code__.co_freevars:
        return None
    direct = types.FunctionType(new[0], dict(func.__globals__), func.__name__, func.__defaults__, func.__closure__)
    direct.__kwdefaults__ = func.__kwdefaults__
    owner = getattr(fn, "__self__", None)
    return types.MethodType(direct, owner) if owner is not None else direct


def _cache_entries(fn: Callable) -> list | None:
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    except ImportError:
        return None
    func = getattr(fn, "__func__", fn)
    code = getattr(func, "__code__", None)
    return _debug_get_cache_entry_list(code) if code is not None else None
