"""`EaModel`: a frozen target LLM plus an EAGLE draft head, decoding losslessly.

One decode step (batch size 1) is four public calls, which `step` chains and which the tuner
(eagle/tuning/tuner.py), the profiler and tests drive one by one:

    state, first = model.prefill(input_ids)      # target + head over the prompt
    tree = model.draft(state)                    # 1. the head's tree (eagle/decoding/tree_drafter.py)
    verified = model.verify(state, tree)         # 2. one target forward over the tree (tree mask)
    path, bonus = model.accept(tree, verified)   # 3. greedy match or rejection sampling (eagle/decoding/verify.py)
    state, new = model.commit(state, tree, verified, path, bonus)   # 4. keep the accepted rows

Conventions. Feature f_t = target `hidden_states[-1]` at position t (after the final norm, so
`lm_head(f_t)` are the target logits). Head row t takes (f_t, embedding of x_{t+1}) and
outputs f̂_{t+1}; draft logits are the draft vocabulary's scores of f̂. The *root* of every
tree is the last committed token: decided by the target but not yet in either KV cache.
EAGLE-3 heads read three target layers side by side instead of f_t; everything else is shared.

Generation: `generate(input_ids, ..., stream=False, method="eagle")` returns ids [1, S+new], or with `stream=True`
an iterator of the new tokens; method="naive": one target forward per token (`plain`, eagle/decoding/plain_step.py).
`eagenerate`, `naivegenerate`, `ea_generate` and `naive_generate` are its EAGLE-named forms.

Runners (eagle/decoding/runners.py). The decoder reaches the target only through `runner` and the head only through
`drafter.runner`, each picked once when the model is built: compiled by default (`compile`;
eagle/compiled/target_graphs.py `CompiledTarget`: one graph for every tree width over a static KV cache in buckets;
eagle/compiled/head_graphs.py `CompiledHead`), or eager (eagle/decoding/eager_target.py over HF's DynamicCache with
a tree mask per layer type, which targets with sliding windows always use; eagle/decoding/eager_head.py).
`DecodeState.target_cache` and `head_past` hold whatever cache the runners return, which the steps pass on.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from eagle.common import progress
from eagle.common.profiled import profiled
from eagle.common.precision import fast_dtype
from eagle.common.openmp_team import release_team
from eagle.tuning import budget_cache
from eagle.tuning.machine_load import OthersShare
from eagle.tuning.tuner import DEPTHS, SIZES, TreeBudget, describe, tune_tree
from eagle.tuning.warmup import Warmup, adopt, generation, prepare_in_background
from eagle.heads.checkpoint import Head, check_head_fits, load_head
from eagle.compiled.gemv import screened_argmax
from eagle.compiled.head_graphs import CompiledHead
from eagle.compiled.target_graphs import CompiledTarget, compilable, wanted
from eagle.decoding.tree_drafter import Drafter
from eagle.heads.feature_layers import target_feature_layers
from eagle.decoding.eager_target import EagerTarget
from eagle.decoding.prefix_cache import KeptRows, reusable
from eagle.decoding.prompt_lookup import lookup_chain, merge_chain
from eagle.decoding.plain_step import PlainStep
from eagle.decoding.runners import TargetRunner
from eagle.decoding.settings import TreeSettings
from eagle.decoding.state import DecodeState
from eagle.decoding.stats import GenerationStats, TokenBudget
from eagle.targets.prompt_check import check_prompt
from eagle.targets.resolve import load_causal_lm, resolve_target
from eagle.targets.tokenizer import eos_token_ids, tokenizer_if_any
from eagle.decoding.tree import Tree, build_tree, static_tree
from eagle.decoding.verify import SamplingParams, sample, verify_greedy, verify_sampling
from eagle.heads.draft_vocab import DraftVocabulary

log = logging.getLogger("eagle")
GREEDY = SamplingParams()
METHODS = ("eagle", "naive")  # generate's: speculative decoding, plain decoding


@dataclass
class Verified:
    """The target's forward over a tree: logits [N, V] and the head's input features [N, F]."""

    logits: torch.Tensor
    features: torch.Tensor


class EaModel(nn.Module):
    """A target causal LM with an EAGLE head. Batch size 1.

    Build it with `from_pretrained` (paths) or `from_modules` (loaded parts); both resolve
    `total_token="auto"`. The constructor only assembles parts and needs a numeric budget."""

    def __init__(self, target: nn.Module, head: Head, tokenizer=None, settings: TreeSettings = TreeSettings(),
                 compile: bool | None = None):
        super().__init__()
        if settings.auto:
            raise ValueError("total_token='auto' (the default) is timed when a model is built: use "
                             "EaModel.from_pretrained or EaModel.from_modules, or pass settings with a number")
        self.target = target.eval().requires_grad_(False)
        self.head = head.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        choices = settings.choices
        self.static = None if choices is None else static_tree(choices)
        if self.static is not None:  # a static tree has a fixed size: nothing to tune
            settings = settings.tuned(len(self.static.paths), settings.depth)
        self.settings = settings
        self.max_lookup = settings.lookup  # the longest chain a tuned budget may add (`adopt_budget`)
        self.eos_ids = eos_token_ids(target, tokenizer)
        self.last_stats: GenerationStats | None = None
        self.kept: KeptRows | None = None  # the last prefix_cache=True generation's rows (decoding/prefix_cache.py)
        self.tuning: TreeBudget | None = None
        check_head_fits(head, target)
        self.feature_layers = target_feature_layers(head, target)  # hidden_states the head reads, side by side
        vocab = DraftVocabulary.of(head, target.get_output_embeddings(), settings.draft_vocab)
        # compiled (the default; compile=False or EAGLE_COMPILE=0 turn it off): head and scorer at fixed shapes
        # (eagle/compiled/head_graphs.py), and the target's forwards at fixed shapes over a bucketed static cache
        # (eagle/compiled/target_graphs.py); targets with sliding windows keep eager forwards
        self.drafter = Drafter(self.head, target.get_input_embeddings(), vocab, compiled=wanted(compile))
        self.compiled = CompiledTarget.of(self.target) if wanted(compile) and compilable(self.target) else None
        self.eager = EagerTarget(self.target)
        self.warmup: Warmup | None = None  # background tuning and compiling (from_pretrained, from_modules)
        self.compile_ahead, self.ahead = False, None  # after it: new shapes compile between replies (CompileAhead)
        self.use_runners(compiled=True)

    def use_runners(self, compiled: bool) -> None:
        """Decode through the compiled runners (when the model has them) or through the eager ones."""
        compiled = compiled and self.compiled is not None
        self.runner: TargetRunner = self.compiled if compiled else self.eager
        self.plain = PlainStep(self.runner)  # plain decoding's forwards, through the same runner
        self.drafter.use(compiled)

    def view(self) -> EaModel:
        """Another EaModel over the same modules, runners and settings, decoding through the compiled
        runners (the background preparation drives one)."""
        other = copy.copy(self)  # shallow: shares target, head, runners and vocabulary
        other.drafter, other.warmup, other.ahead, other.compile_ahead = copy.copy(self.drafter), None, None, False
        other.kept = None
        other.use_runners(compiled=True)
        return other

    @classmethod
    def from_modules(cls, target: nn.Module, head: Head, tokenizer=None, settings: TreeSettings = TreeSettings(),
                     compile: bool | None = None, background: bool = True) -> "EaModel":
        """An EaModel of loaded parts, decoding at once. `total_token="auto"` takes the budget cached for
        this machine, head and target (eagle/tuning/budget_cache.py), else times this device
        (eagle/tuning/tuner.py). background (default): return at once and decode eagerly while a
        background thread tunes (when needed) and compiles (eagle/tuning/warmup.py); the model takes
        over the result at its next generation, or at `wait_ready()`. background=False: tune here;
        compiled shapes then compile at their first call."""
        model = cls(target, head, tokenizer, settings.tuned(max(SIZES), max(DEPTHS)) if settings.auto else settings,
                    compile)  # the largest budget until one is picked: the tuner's compiled cache has room for it
        budget = model.cached_budget() if settings.auto else None
        if budget is not None:
            model.adopt_budget(budget)
        tune = settings.auto and budget is None
        if not background:
            if tune:
                model.tune()
            return model
        return prepare_in_background(model, tune)

    @classmethod
    def from_pretrained(cls, base_model_path: str | Path, ea_model_path: str | Path,
                        torch_dtype: torch.dtype | str = torch.float32, device: str | torch.device = "cpu",
                        settings: TreeSettings | None = None, compile: bool | None = None,
                        background: bool = True, quiet: bool = False, **tree: object) -> "EaModel":
        """Load the target (alias, folder or Hub id) and a head (our layout or EAGLE's); decodes at once.

        Tree settings: a `TreeSettings`, or its fields as keywords (`total_token=60, depth=6,
        top_k=10`, `tree="static"`, `draft_vocab=8192`, `lookup=10`); `total_token="auto"`
        times this device and picks the dynamic tree's budget and depth. compile (default on, unless
        EAGLE_COMPILE=0): the target's forwards compiled with fixed shapes (eagle/compiled/target_graphs.py).
        background: tune and compile in a background thread (`from_modules`). Each phase is one line
        on stderr unless quiet (eagle/common/progress.py). torch_dtype: what target and head compute in;
        bf16 (or "auto") on a device without bf16 arithmetic computes in fp32 and says so
        (eagle/common/precision.py: there a bf16 verify of 8 rows costs 1.6x an fp32 one)."""
        progress.show(quiet)
        torch_dtype = fast_dtype(torch_dtype, device)
        settings = TreeSettings(**tree) if settings is None else TreeSettings(**{**settings.__dict__, **tree})
        with progress.phase("resolving the target %s", base_model_path):
            path = resolve_target(base_model_path)
        with progress.phase("loading the target (%s)", str(torch_dtype).removeprefix("torch.")):
            target = load_causal_lm(path, torch_dtype, device)
        with progress.phase("loading the head %s", ea_model_path):
            head = load_head(ea_model_path, dtype=torch_dtype, device=device)
        return cls.from_modules(target, head, tokenizer_if_any(path), settings, compile, background)

    @torch.inference_mode()
    def tune(self, prompts: list[torch.Tensor] | None = None, reuse: bool = True,
             pause: Callable[[], None] | None = None) -> TreeBudget:
        """Pick total_token, depth and the lookup chain's length (at most the `lookup` the model was
        built with, 0 included) by measuring this device (eagle.tuning.tuner). Plain decoding is a
        candidate (total_token=1, eagenerate then runs plain steps).
        reuse: take the budget measured before for this head, target, dtype and machine
        (eagle.tuning.budget_cache) instead of timing again; a new measurement on the calibration
        prompts is stored for the next load, unless other processes took more than a quarter of the
        machine while it ran (eagle.tuning.machine_load): then the next load times again.
        pause: called before each timed part (the background preparation waits there while the
        model generates)."""
        key = budget_cache.key_of(self) if prompts is None else None
        budget = budget_cache.load(key) if key is not None and reuse else None
        if budget is None:
            log.info("timing the draft tree on this machine (once: the pick is cached)")
            with OthersShare() as load:
                budget = tune_tree(self, prompts, budget_cache.tuned_sizes(self), pause=pause)
            if key is not None and load.busy:
                log.warning("other processes used %.0f%% of the CPUs while the tree was timed: this pick "
                            "is used now, not cached, and timed again at the next load", 100 * load.share)
            elif key is not None:
                budget_cache.save(key, budget)
        self.adopt_budget(budget)
        log.info(describe(budget))
        return budget

    def cached_budget(self) -> TreeBudget | None:
        """The budget `tune` stored for this head, target, dtype and machine, or None."""
        return budget_cache.load(budget_cache.key_of(self))

    def adopt_budget(self, budget: TreeBudget) -> None:
        """Decode with a tuned budget's total_token, depth and chain, the chain at most `max_lookup` tokens."""
        self.tuning = budget = budget.picked(self.max_lookup)
        self.settings = self.settings.tuned(budget.total_token, budget.depth, budget.lookup)

    @property
    def ready(self) -> bool:
        """True once the background preparation has ended (or there was none)."""
        return self.warmup is None or self.warmup.done.is_set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait for the background preparation and take over its settings and compiled runners now;
        False when `timeout` seconds pass first."""
        if self.warmup is not None:
            release_team()  # the background work has the cores while this thread waits (eagle/common/openmp_team.py)
            if not self.warmup.done.wait(timeout):
                return False
            adopt(self)
        return True

    @property
    def runners(self) -> list[CompiledTarget | CompiledHead]:
        """The compiled forwards' runners (target, head), each with `compile_seconds`; none when eager."""
        return [r for r in (self.compiled, self.drafter.compiled) if r is not None]

    @property
    def draft_vocab_size(self) -> int:
        """How many tokens the draft scores (Vd)."""
        return self.drafter.vocab.size

    # ---- generation ------------------------------------------------------------------------

    def generate(self, input_ids: torch.Tensor, temperature: float = 0.0, top_p: float = 0.0, top_k: int = 0,
                 max_new_tokens: int = 512, max_length: int = 2048, log: bool = False, *, stream: bool = False,
                 method: str = "eagle", prefix_cache: bool = False):
        """Decode after input_ids [1, S]: method "eagle" speculatively (plain steps at a one-node tree,
        `plain_decoding`), "naive" by plain steps, one target forward per token; same tokens either
        way when greedy (temperature 0). Stops at `max_new_tokens`, at `max_length` tokens in all, or
        after an end token. Returns ids [1, S+new] (prompt + new), or (ids, new_tokens, steps) with log;
        stream=True: an iterator of the new tokens as they are decided ([n] long tensors), `last_stats`
        complete when it ends. prefix_cache=True: the prompt's common prefix with the previous generation's
        tokens takes that generation's KV rows instead of a prefill (when it too ran with prefix_cache=True and
        to its end), and this generation keeps its own for the next (a chat's turns; eagle/decoding/prefix_cache.py)."""
        if method not in METHODS:
            raise ValueError(f"method={method!r}: use 'eagle' (speculative decoding) or 'naive' (plain decoding)")
        if stream and log:
            raise ValueError("log=True counts a whole reply: with stream=True read last_stats when the stream ends")
        tokens = self._stream(method, input_ids, (temperature, top_p, top_k), max_new_tokens, max_length, prefix_cache)
        return tokens if stream else self._collect(input_ids, tokens, log)

    def eagenerate(self, input_ids: torch.Tensor, temperature: float = 0.0, top_p: float = 0.0, top_k: int = 0,
                   max_new_tokens: int = 512, max_length: int = 2048, log: bool = False):
        """Speculative decoding (`generate`). Returns ids [1, S] (prompt + new), or (ids, new_tokens, steps) with log."""
        return self.generate(input_ids, temperature, top_p, top_k, max_new_tokens, max_length, log)

    def naivegenerate(self, input_ids: torch.Tensor, temperature: float = 0.0, top_p: float = 0.0, top_k: int = 0,
                      max_new_tokens: int = 512, max_length: int = 2048, log: bool = False):
        """Plain decoding through the same target, one forward per token; same return as eagenerate."""
        return self.generate(input_ids, temperature, top_p, top_k, max_new_tokens, max_length, log, method="naive")

    def ea_generate(self, input_ids: torch.Tensor, temperature: float = 0.0, top_p: float = 0.0, top_k: int = 0,
                    max_new_tokens: int = 512, max_length: int = 2048) -> Iterator[torch.Tensor]:
        """Stream of newly accepted token ids ([n] long tensors) for input_ids [1, S] (`generate(stream=True)`)."""
        return self.generate(input_ids, temperature, top_p, top_k, max_new_tokens, max_length, stream=True)

    def naive_generate(self, input_ids: torch.Tensor, temperature: float = 0.0, top_p: float = 0.0, top_k: int = 0,
                       max_new_tokens: int = 512, max_length: int = 2048) -> Iterator[torch.Tensor]:
        """Stream of tokens ([1] long tensors), one target forward each."""
        return self.generate(input_ids, temperature, top_p, top_k, max_new_tokens, max_length, stream=True,
                             method="naive")

    @property
    def plain_decoding(self) -> bool:
        """A one-node dynamic tree without lookup drafts nothing: eagenerate decodes by plain steps
        (what `total_token="auto"` picks where no tree is faster on this device)."""
        s = self.settings
        return s.total_token == 1 and s.choices is None and s.tree == "dynamic" and not s.lookup

    @torch.inference_mode()
    def _stream(self, method: str, input_ids: torch.Tensor, sampling: tuple[float, float, int], max_new_tokens: int,
                max_length: int, prefix_cache: bool) -> Iterator[torch.Tensor]:
        """The new tokens of a generation as they are decided; `last_stats` counts them. Checks its
        arguments (sampling: temperature, top_p, top_k) at the first token asked for."""
        params = SamplingParams(*sampling)
        stats, budget = self._start(method, input_ids, max_new_tokens, max_length)
        kept, self.kept = self.kept if prefix_cache else None, None  # used once: the next one keeps its own
        if budget.done:
            return
        with generation(self):  # takes over a finished background preparation; holds the compiled runners
            steps = self._plain_steps if method == "naive" or self.plain_decoding else self._tree_steps
            keep = yield from steps(stats, budget, input_ids, params, kept)
            self.kept = keep() if prefix_cache else None

    def _tree_steps(self, stats: GenerationStats, budget: TokenBudget, input_ids: torch.Tensor,
                    params: SamplingParams, kept: KeptRows | None) -> Generator[torch.Tensor, None, Callable]:
        """prefill (after `kept`'s rows of the prompt), then draft + step until the budget is spent: the first
        token [1], then [n] a step. Returns how to copy the caches' rows out (`KeptRows.of`), if they are kept."""
        start = time.perf_counter()
        state, first = self.prefill(input_ids, params, kept)
        stats.prefill_seconds = time.perf_counter() - start
        stats.cached_tokens = reusable(kept, input_ids[0], head=True)
        yield stats.emit(budget, first, start)
        while not budget.done:
            with profiled("eagle.step"):
                state, new = self.step(state, self.draft(state), params)
            stats.steps += 1
            stats.accept_lengths.append(new.numel())
            yield stats.emit(budget, new, start)
        return lambda: KeptRows.of(state.ids[0], self.runner, state.target_cache, self.drafter.runner, state.head_past)

    def _plain_steps(self, stats: GenerationStats, budget: TokenBudget, input_ids: torch.Tensor,
                     params: SamplingParams, kept: KeptRows | None) -> Generator[torch.Tensor, None, Callable]:
        """One target forward per token ([1] each) through `plain`, after `kept`'s rows of the prompt (the rest
        as `_tree_steps`; its rows: the target's only)."""
        start = time.perf_counter()
        reused = reusable(kept, input_ids[0], head=False)
        logits = self.plain.prefill(input_ids, kept.target_rows(reused) if reused else None)  # [V]
        stats.prefill_seconds, stats.cached_tokens = time.perf_counter() - start, reused
        tokens = [input_ids[0]]
        while True:
            token = sample(logits, params).reshape(1)  # [1]
            tokens.append(token.to(input_ids.device))
            yield stats.emit(budget, token, start)
            if budget.done:
                return lambda: KeptRows.of(torch.cat(tokens), self.runner, self.plain.cache)
            with profiled("eagle.step"), profiled("eagle.plain.forward"), screened_argmax(params.greedy):
                logits = self.plain(token)
            stats.steps += 1
            stats.accept_lengths.append(1)

    # ---- the step API ----------------------------------------------------------------------

    def prefill(self, input_ids: torch.Tensor, params: SamplingParams = GREEDY,
                kept: KeptRows | None = None) -> tuple[DecodeState, torch.Tensor]:
        """Target and head over the prompt [1, S], after the rows of its first Q tokens `kept` holds (`reusable`;
        None: Q = 0); returns the state and the first new token [1]."""
        q = reusable(kept, input_ids[0], head=True)
        target_rows, head_rows = (kept.target_rows(q), kept.head_rows(q)) if q else (None, None)
        out, cache = self.runner.prefill(input_ids, self.verify_rows, target_rows)  # compiled: room for a tree
        logits, features = self._outputs(out, input_ids.shape[1] - q)  # [1, V] (the last row's), [S-Q, F]
        root = sample(logits[-1], params).reshape(1)  # [1]
        ids = torch.cat([input_ids, root[None]], dim=1)  # [1, S+1]
        hidden, logp, head_past = self.drafter.prefill(features, ids[0, q + 1:], head_rows)
        return DecodeState(ids, cache, head_past, hidden[-1:], logp), root

    def draft(self, state: DecodeState) -> Tree:
        """1. The head's tree (dynamic or static, per `settings`), plus the prompt-lookup chain when one is found."""
        s = self.settings
        with profiled("eagle.draft"):
            if self.static is None:
                tokens, parents = self.drafter.dynamic(state, s.total_token, s.depth, s.top_k)
            else:
                tokens, parents = self.drafter.static(state, self.static)
            with profiled("eagle.draft.tree"):
                if s.lookup:
                    chain = lookup_chain(state.ids[0], s.lookup)
                    if chain.numel():
                        tokens, parents = merge_chain(tokens, parents, chain)
                return build_tree(tokens, parents)

    def draft_candidates(self, state: DecodeState, depth: int,
                         top_k: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The EAGLE-2 candidate pool of `depth` levels, top_k (default: the settings') children per
        expanded node (tokens, scores, parents [M]; Drafter.candidates)."""
        return self.drafter.candidates(state, depth, top_k or self.settings.top_k)

    @property
    def verify_rows(self) -> int:
        """Rows of the widest verify forward: the largest tree the settings draw, lookup chain included."""
        return self.settings.total_token + self.settings.lookup

    def verify(self, state: DecodeState, tree: Tree) -> Verified:
        """2. One target forward over the tree; appends its N rows to the target cache."""
        past, device, n = state.committed, state.ids.device, tree.size
        tokens, positions = tree.tokens.to(device), past + tree.depths.to(device)  # [N]
        out = self.runner.tree_forward(state.target_cache, tokens, positions, tree, past)
        return Verified(*self._outputs(out, n))

    def accept(self, tree: Tree, verified: Verified, params: SamplingParams = GREEDY) -> tuple[torch.Tensor, int]:
        """3. The accepted root-to-node path (node indices [n-1], root first) and the bonus token."""
        with profiled("eagle.verify.accept"):
            if params.greedy:
                return verify_greedy(tree, verified.logits)
            return verify_sampling(tree, verified.logits, params)

    def commit(self, state: DecodeState, tree: Tree, verified: Verified, path: torch.Tensor,
               bonus: int) -> tuple[DecodeState, torch.Tensor]:
        """4. Keep the accepted rows of the target cache (in place) and encode them into the head's;
        returns the new state (which takes over the target cache) and the new tokens [n]."""
        past, device = state.committed, state.ids.device
        with profiled("eagle.cache.commit"):
            self._keep_rows(state, path)
        new = torch.cat([tree.tokens.to(device)[path[1:].to(device)], torch.tensor([bonus], device=device)])  # [n]
        n = new.numel()
        with profiled("eagle.head.update"):  # head rows past .. past+n-1: (f of each accepted node, next token)
            positions = torch.arange(past, past + n, device=device)  # and the next draft's log-probs, in one call
            hidden, logp, head_past = self.drafter.encode(verified.features[path.to(device)], new, positions, None,
                                                          state.head_past, scored=1)
        ids = torch.cat([state.ids, new[None]], dim=1)
        return DecodeState(ids, state.target_cache, head_past, hidden[-1:], logp), new

    def discard(self, state: DecodeState) -> None:
        """Drop the rows a `verify` appended to the target cache, as if it had not run."""
        self._keep_rows(state, torch.zeros(0, dtype=torch.long))

    def _keep_rows(self, state: DecodeState, path: torch.Tensor) -> None:
        """Keep tree nodes `path` [n] of the target cache after its committed rows (in place)."""
        self.runner.keep_rows(state.target_cache, state.committed, path)

    def step(self, state: DecodeState, tree: Tree, params: SamplingParams = GREEDY) -> tuple[DecodeState, torch.Tensor]:
        """verify + accept + commit; consumes `state` (its target cache moves to the new state)."""
        with screened_argmax(params.greedy):  # greedy: the logits feed the argmax alone
            verified = self.verify(state, tree)
        path, bonus = self.accept(tree, verified, params)
        return self.commit(state, tree, verified, path, bonus)

    # ---- internals -------------------------------------------------------------------------

    def _outputs(self, out, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A target forward's first n rows: logits [n, V] and the head's input features [n, H]
        (EAGLE-3: [n, 3H], its layers side by side). Rows past n are a compiled forward's padding."""
        states = [out.hidden_states[i][0, :n] for i in self.feature_layers]  # each [n, H]
        return out.logits[0, :n], states[0] if len(states) == 1 else torch.cat(states, dim=-1)

    def _start(self, method: str, input_ids: torch.Tensor, max_new_tokens: int, max_length: int):
        check_prompt(self.target, input_ids, max_new_tokens)
        self.last_stats = GenerationStats(method, prompt_tokens=input_ids.shape[1])
        left = min(max_new_tokens, max_length - input_ids.shape[1])
        return self.last_stats, TokenBudget(left, self.eos_ids)

    def _collect(self, input_ids: torch.Tensor, stream: Iterator[torch.Tensor], log: bool):
        ids = torch.cat([input_ids, *(t.to(input_ids.device)[None] for t in stream)], dim=1)
        if log:
            return ids, self.last_stats.new_tokens, self.last_stats.steps
        return ids
