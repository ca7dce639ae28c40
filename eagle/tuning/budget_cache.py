"""Tree budgets measured once per machine: `total_token="auto"` without re-timing at every load.

Tuning (eagle/tuning/tuner.py) times the target and the head on this device for tens of seconds.
The budget it picks depends only on the head's and the target's weights, the dtype, the
device, the thread count and the draft settings, so it is stored under a key of exactly
those and reused by the next load with the same key. `python -m evaluation.tuner_spread`
measures again (and stores the latest pick).

    <cache_dir>/tree-budgets/<key>.json   {"key": {...what was hashed...}, "budget": {...}}
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch

from eagle.common.permissions import as_if_created
from eagle.compiled import attention_kernel, gemv
from eagle.compiled.graph_cache import cpp_wrapper_wanted, matmuls_policy
from eagle.tuning.tuner import COMPILED_SIZES, DEPTHS, SIZES, TreeBudget
from eagle.targets.resolve import cache_dir

# Bump when the tuner's measurement changes, so old picks are not reused.
VERSION = 14  # 2: plain decoding is a candidate; 3: draft costs per pool width, widths 2-4;
#            4: the head and its scorer compiled (draft and rest of a step cost less);
#            5: the plain step timed in the verify widths' rounds (it was timed back to back, too fast);
#            6: every compiled width autotuned to the C++ GEMM template (wide verifies cost less);
#            7: rows with a prompt-lookup chain, plain decoding always a candidate;
#            8: compiled matmuls take the C++ GEMM template untimed (EAGLE_MATMULS joins the key);
#            9: one verify graph with a dynamic row count, a step verifies its own rows (no padding);
#            10: the background tuner times with the only OpenMP team (eagle/common/openmp_team.py),
#                the plain step costs no more than a 2-row verify (`forward_costs`);
#            11: 48 calibration steps per prompt (16 saw too little of a reply to score the chain)
#            12: calibration prompts that quote text (a function to fix, a message to rewrite)
#            13: the scorer in the head's graph (the root's draft log-probs come with the commit)
#            14: τ walked over every position of the calibration text; the best rows timed as real decoding


def tuned_sizes(model) -> tuple[int, ...]:
    """The tree sizes the tuner times for a model: compiled, a graph per size, so fewer."""
    return SIZES if model.compiled is None else COMPILED_SIZES


def key_of(model) -> dict:
    """`budget_key` of a model as `EaModel.tune` times it."""
    return budget_key(model, tuned_sizes(model), DEPTHS)


def budget_key(model, sizes, depths) -> dict:
    """Everything a tuned budget depends on, with the weights as digests (not the longest chain a model
    allows: the grid holds every length, and `TreeBudget.picked` chooses)."""
    target, head = model.target, model.head
    lm_head = target.get_output_embeddings().weight
    return {
        "version": VERSION, "sizes": list(sizes), "depths": list(depths),
        "head": _digest(head.state_dict().values(), head.draft_ids),
        "target": _digest([lm_head.flatten()[:: max(1, lm_head.numel() // 65536)]],  # a strided sample
                          target.config.to_json_string(use_diff=False).encode()),
        "dtype": str(lm_head.dtype), "device": _device_name(lm_head.device), "threads": torch.get_num_threads(),
        "torch": torch.__version__, "top_k": model.settings.top_k, "draft_vocab": model.draft_vocab_size,
        "compiled": model.compiled is not None, "matmuls": matmuls_policy() if model.compiled is not None else None,
        "gemv": _gemv_key() if model.compiled is not None else None,  # verify and draft costs change with the kernel
        "cpp_wrapper": cpp_wrapper_wanted(target) if model.compiled is not None else None,  # and with it
        "attention": attention_kernel.key() if model.compiled is not None else None,  # and with the attention
    }


def _gemv_key() -> str:
    """The GEMV kernel's kind, source digest, whether the draft reads int8 weights and whether greedy steps screen
    the lm_head, where the graphs use it, else "off"."""
    return gemv.key(gemv.int8_drafts(), gemv.screens()) if gemv.active() else "off"


def path_of(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return cache_dir() / "tree-budgets" / f"{digest}.json"


def load(key: dict) -> TreeBudget | None:
    """The budget stored for `key`, or None (never stored, or unreadable)."""
    try:
        entry = json.loads(path_of(key).read_text())
        if entry.get("key") != key:
            return None
        fields = entry["budget"]
        return TreeBudget(fields["total_token"], fields["depth"], fields["tokens_per_second"], fields["grid"],
                          {int(n): ms for n, ms in fields["verify_ms"].items()},
                          {_pair(kd): ms for kd, ms in fields["draft_ms"].items()}, fields["rest_ms"],
                          fields["plain_ms"], lookup=fields["lookup"], lookup_ms=fields["lookup_ms"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save(key: dict, budget: TreeBudget) -> Path:
    """Store a TreeBudget atomically (its per-position accept and copy lengths are left out)."""
    path = path_of(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = {k: v for k, v in asdict(budget).items() if k not in ("accepted", "copied", "ends")}
    fields["draft_ms"] = {f"{k},{d}": ms for (k, d), ms in budget.draft_ms.items()}  # JSON keys are strings
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        json.dump({"key": key, "budget": fields}, f, indent=1)
    as_if_created(tmp)
    os.replace(tmp, path)
    return path


def _pair(text: str) -> tuple[int, int]:
    """"8,3" -> (8, 3): a (pool width, depth) key of draft_ms as stored."""
    k, d = text.split(",")
    return int(k), int(d)


def _digest(tensors, extra) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    if isinstance(extra, torch.Tensor):
        h.update(extra.cpu().numpy().tobytes())
    elif extra is not None:
        h.update(extra)
    return h.hexdigest()


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
