"""`EaModel`: a frozen target LLM plus an EAGLE draft head, decoding losslessly.

One decode step (batch size 1):
1. draft a tree from the head (static EAGLE-1 choices, or the dynamic EAGLE-2 tree);
2. verify: one target forward over the tree (tree mask, explicit position ids, KV cache);
3. accept a root-to-node path (greedy match or rejection sampling) plus one bonus token;
4. commit the accepted rows of the target cache; re-encode the accepted tokens into the
   head's cache with the *target's* features from the verify forward.

Conventions. Feature f_t = target `hidden_states[-1]` at position t (after the final norm, so
`lm_head(f_t)` are the target logits). Head row t takes (f_t, embedding of x_{t+1}) and
outputs f̂_{t+1}; draft logits are the target's `lm_head(f̂)`. The *root* of every tree is
the last committed token: decided by the target but not yet in either KV cache.

EAGLE-3 heads (eagle/draft3.py) take the concatenation of three target layers' hidden
states instead of f_t, output an internal state, and score it with their own lm_head over a
draft vocabulary; drafting, tree, verification and caches are the same code.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.profiler import record_function
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from eagle.autotune import TreeBudget, describe, tune_tree
from eagle.cache import commit_cache
from eagle.checkpoint import Head, load_head, top_up
from eagle.draft import KVCache
from eagle.draft3 import Eagle3Head, default_layers
from eagle.lookup import lookup_chain, merge_chain
from eagle.targets import eos_token_ids, resolve_target
from eagle.tree import (
    DEFAULT_CHOICES,
    Choices,
    Tree,
    additive_mask,
    build_tree,
    causal_mask,
    expand_topk,
    reindex_parents,
    select_nodes,
    static_tree,
    tree_attention_mask,
)
from eagle.verify import SamplingParams, sample, verify_greedy, verify_sampling

log = logging.getLogger("eagle")


@dataclass
class DecodeState:
    """What one decode step needs; `ids[-1]` is the root, in neither KV cache yet."""

    ids: torch.Tensor  # [1, L] committed tokens (prompt + generated)
    target_cache: DynamicCache  # L-1 rows
    head_past: KVCache  # L-1 rows; row t encodes (f_t, x_{t+1})
    draft_hidden: torch.Tensor  # [1, H] head output of row L-2: f̂_{L-1}, drafts x_L

    @property
    def committed(self) -> int:
        """Rows in each KV cache (= position id of the root)."""
        return self.ids.shape[1] - 1


@dataclass
class GenerationStats:
    """Per-call statistics of one generate call (`EaModel.last_stats`).

    `accept_lengths[i]` = drafts accepted at verification step i plus the bonus token, before
    clipping at a stop condition; `new_tokens` counts the tokens actually returned, including
    the one sampled from the prefill, so tau = new_tokens / steps.
    """

    method: str
    prompt_tokens: int = 0
    new_tokens: int = 0
    steps: int = 0  # target forwards after the prefill
    accept_lengths: list[int] = field(default_factory=list)  # drafts accepted + 1 (bonus)
    prefill_seconds: float = 0.0
    seconds: float = 0.0

    @property
    def tau(self) -> float:
        """Mean tokens per target forward after the prefill (new_tokens / steps)."""
        return self.new_tokens / self.steps if self.steps else float("nan")

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else float("nan")

    def acceptance_by_depth(self) -> list[float]:
        """Fraction of steps that accepted the draft at depth d = 1, 2, ..."""
        if not self.accept_lengths:
            return []
        depth = max(self.accept_lengths) - 1
        n = len(self.accept_lengths)
        return [sum(a - 1 >= d for a in self.accept_lengths) / n for d in range(1, depth + 1)]


class _Budget:
    """Clips emitted tokens to max_new_tokens / max_length and stops after an EOS."""

    def __init__(self, left: int, eos_ids: set[int]):
        self.left, self.eos_ids, self.done = left, eos_ids, left <= 0

    def take(self, tokens: torch.Tensor) -> torch.Tensor:  # [n] -> [m <= n]
        tokens = tokens[: self.left]
        for i, t in enumerate(tokens.tolist()):
            if t in self.eos_ids:
                tokens, self.done = tokens[: i + 1], True
                break
        self.left -= tokens.numel()
        self.done = self.done or self.left <= 0
        return tokens


class EaModel(nn.Module):
    """A target causal LM with an EAGLE head. Batch size 1."""

    def __init__(
        self,
        target: nn.Module,
        head: Head,
        tokenizer=None,
        total_token: int | str = 24,
        depth: int = 5,
        top_k: int = 8,
        tree: str | Choices = "dynamic",
        draft_vocab: int | None = None,
        lookup: int = 0,
    ):
        super().__init__()
        self.lookup = lookup  # tokens of the prompt-lookup chain merged into each tree (0 = off)
        self.target = target.eval().requires_grad_(False)
        self.head = head.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.total_token, self.depth, self.top_k = total_token, depth, top_k
        if tree == "dynamic":
            self.static = None
        else:
            self.static = static_tree(DEFAULT_CHOICES if tree == "static" else tree)
        self.eos_ids = eos_token_ids(target, tokenizer)
        self.last_stats: GenerationStats | None = None
        _check_head_fits(head, target)
        self._feature_layers = _feature_layers(head, target)
        self._draft_ids, self._draft_lm_head = _draft_vocabulary(head, target.get_output_embeddings(), draft_vocab)
        self.tuning: TreeBudget | None = None
        if total_token != "auto" and (not isinstance(total_token, int) or total_token < 1):
            raise ValueError(f"total_token={total_token!r}: expected a positive int or 'auto'")
        if self.static is not None:  # a static tree has a fixed size: nothing to tune
            self.total_token = len(self.static.paths)
        elif total_token == "auto":
            self.tune()

    @torch.inference_mode()
    def tune(self, prompts: list[torch.Tensor] | None = None) -> TreeBudget:
        """Pick total_token and depth of the dynamic tree by measuring this device (eagle.autotune)."""
        self.tuning = tune_tree(self, prompts)
        self.total_token, self.depth = self.tuning.total_token, self.tuning.depth
        log.info(describe(self.tuning))
        return self.tuning

    @classmethod
    def from_pretrained(
        cls,
        base_model_path: str | Path,
        ea_model_path: str | Path,
        torch_dtype: torch.dtype = torch.float32,
        total_token: int | str = 24,
        depth: int = 5,
        top_k: int = 8,
        tree: str | Choices = "dynamic",
        device: str | torch.device = "cpu",
        draft_vocab: int | None = None,
        lookup: int = 0,
    ) -> "EaModel":
        """Load the target (alias, folder or Hub id) and a head (our layout or EAGLE's).

        total_token="auto" times this device and picks the dynamic tree's budget and depth.

        draft_vocab: propose only the N most frequent tokens of the head's stored draft
        vocabulary (None: all of it, or the whole target vocabulary when it has none).
        lookup: also draft up to N tokens by prompt lookup (eagle.lookup), merged into the tree.
        """
        path = resolve_target(base_model_path)
        target = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, attn_implementation="sdpa").to(device)
        tokenizer = _load_tokenizer(path)
        head = load_head(ea_model_path, dtype=torch_dtype, device=device)
        return cls(target, head, tokenizer, total_token=total_token, depth=depth, top_k=top_k, tree=tree,
                   draft_vocab=draft_vocab, lookup=lookup)

    # ---- public generation API ------------------------------------------------------------

    def eagenerate(self, input_ids: torch.Tensor, temperature: float = 0.0, top_p: float = 0.0, top_k: int = 0,
                   max_new_tokens: int = 512, max_length: int = 2048, log: bool = False):
        """Speculative decoding. Returns ids [1, S] (prompt + new), or (ids, new_tokens, steps) with log."""
        stream = self.ea_generate(input_ids, temperature, top_p, top_k, max_new_tokens, max_length)
        return self._collect(input_ids, stream, log)

    def naivegenerate(self, input_ids: torch.Tensor, temperature: float = 0.0, top_p: float = 0.0, top_k: int = 0,
                      max_new_tokens: int = 512, max_length: int = 2048, log: bool = False):
        """Plain decoding through the same target, one forward per token; same return as eagenerate."""
        stream = self.naive_generate(input_ids, temperature, top_p, top_k, max_new_tokens, max_length)
        return self._collect(input_ids, stream, log)

    @torch.inference_mode()
    def ea_generate(self, input_ids: torch.Tensor, temperature: float = 0.0, top_p: float = 0.0, top_k: int = 0,
                    max_new_tokens: int = 512, max_length: int = 2048) -> Iterator[torch.Tensor]:
        """Stream of newly accepted token ids ([n] long tensors) for input_ids [1, S]."""
        params = SamplingParams(temperature, top_p, top_k)
        stats, budget = self._start("eagle", input_ids, max_new_tokens, max_length)
        if budget.done:
            return
        start = time.perf_counter()
        state, first = self._prefill(input_ids, params)
        stats.prefill_seconds = time.perf_counter() - start
        yield self._emit(stats, budget, first, start)
        while not budget.done:
            with record_function("eagle.step"):
                with record_function("eagle.draft"):
                    tree = self._draft_tree(state)
                state, new = self._step(state, tree, params)
            stats.steps += 1
            stats.accept_lengths.append(new.numel())
            yield self._emit(stats, budget, new, start)

    @torch.inference_mode()
    def naive_generate(self, input_ids: torch.Tensor, temperature: float = 0.0, top_p: float = 0.0, top_k: int = 0,
                       max_new_tokens: int = 512, max_length: int = 2048) -> Iterator[torch.Tensor]:
        """Stream of tokens ([1] long tensors), one target forward each."""
        params = SamplingParams(temperature, top_p, top_k)
        stats, budget = self._start("naive", input_ids, max_new_tokens, max_length)
        if budget.done:
            return
        start = time.perf_counter()
        cache = DynamicCache(config=self.target.config)
        out = self.target(input_ids=input_ids, past_key_values=cache, use_cache=True)
        stats.prefill_seconds = time.perf_counter() - start
        while True:
            token = sample(out.logits[0, -1], params).reshape(1)  # [1]
            yield self._emit(stats, budget, token, start)
            if budget.done:
                return
            out = self.target(input_ids=token[None], past_key_values=cache, use_cache=True)
            stats.steps += 1
            stats.accept_lengths.append(1)

    # ---- one decode step ------------------------------------------------------------------

    def _prefill(self, input_ids: torch.Tensor, params: SamplingParams) -> tuple[DecodeState, torch.Tensor]:
        """Target and head over the prompt; returns the state and the first new token [1]."""
        s = input_ids.shape[1]
        cache = DynamicCache(config=self.target.config)
        positions = torch.arange(s, device=input_ids.device)
        logits, features = self._target_forward(input_ids[0], positions, None, cache)  # [S, V], [S, H]
        root = sample(logits[-1], params).reshape(1)  # [1]
        ids = torch.cat([input_ids, root[None]], dim=1)  # [1, S+1]
        hidden, head_past = self._head_forward(features, ids[0, 1:], positions, None, None)
        return DecodeState(ids, cache, head_past, hidden[-1:]), root

    def _step(self, state: DecodeState, tree: Tree, params: SamplingParams) -> tuple[DecodeState, torch.Tensor]:
        """Verify a tree, commit the accepted path; returns the new state and the new tokens [n].

        Consumes `state`: its target cache is updated in place and moves to the new state.
        """
        past = state.committed
        device = state.ids.device
        tokens = tree.tokens.to(device)
        with record_function("eagle.verify.mask"):
            mask = tree_attention_mask(tree.ancestors, past, self._dtype).to(device)
        with record_function("eagle.verify.forward"):
            logits, features = self._target_forward(tokens, past + tree.depths.to(device), mask, state.target_cache)
        with record_function("eagle.verify.accept"):
            if params.greedy:
                path, bonus = verify_greedy(tree, logits)
            else:
                path, bonus = verify_sampling(tree, logits, params)
        with record_function("eagle.cache.commit"):
            commit_cache(state.target_cache, past, path)
        new = torch.cat([tokens[path[1:].to(device)], torch.tensor([bonus], device=device)])  # [n]
        n = new.numel()
        # head rows past .. past+n-1: (f of each accepted node, the token after it)
        with record_function("eagle.head.update"):
            mask = causal_mask(n, past, self._dtype).to(device)
            positions = torch.arange(past, past + n, device=device)
            hidden, head_past = self._head_forward(features[path.to(device)], new, positions, mask, state.head_past)
        ids = torch.cat([state.ids, new[None]], dim=1)
        return DecodeState(ids, state.target_cache, head_past, hidden[-1:]), new

    # ---- drafting -------------------------------------------------------------------------

    def _draft_tree(self, state: DecodeState) -> Tree:
        """The head's tree (dynamic or static), plus the prompt-lookup chain when `lookup` > 0."""
        root = state.ids[0, -1:].cpu()
        tokens, parents = self._draft_dynamic(state, root) if self.static is None else self._draft_static(state, root)
        with record_function("eagle.draft.tree"):
            if self.lookup:
                chain = lookup_chain(state.ids[0], self.lookup)
                if chain.numel():
                    tokens, parents = merge_chain(tokens, parents, chain)
            return build_tree(tokens, parents)

    def _draft_dynamic(self, state: DecodeState, root: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """EAGLE-2: grow the top_k best nodes by cumulative draft log-prob, then rerank all.

        Returns tree tokens [N] and parents [N], root first."""
        tokens, scores, parents = self._draft_candidates(state, self.depth)
        with record_function("eagle.draft.tree"):
            kept = select_nodes(scores, parents, self.total_token - 1)
            return torch.cat([root, tokens[kept]]), reindex_parents(kept, parents)

    def _draft_candidates(self, state: DecodeState, depth: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The EAGLE-2 candidate pool: top_k children of the top_k best nodes, `depth` levels.

        Returns target token ids [M], cumulative draft log-probs [M] and parents [M]
        (candidate indices, -1 = the root), parents before children; M = k + (depth-1)*k*k.
        """
        k = min(self.top_k, self.draft_vocab_size)
        drafts = _DraftCache(state)
        logp = self._draft_logp(state.draft_hidden)  # [1, Vd]
        tokens, scores, _ = expand_topk(torch.zeros(1), logp, k)  # [k] depth-1 candidates
        tokens = self._to_target(tokens)
        parents = torch.full((k,), -1, dtype=torch.long)
        frontier = torch.arange(k)  # candidate indices
        frontier_rows = torch.full((k,), -1, dtype=torch.long)  # their parents' rows in `drafts`
        features = state.draft_hidden.expand(k, -1)  # [k, H] head outputs of their parents
        all_tokens, all_scores, all_parents = [tokens], [scores], [parents]
        n = k
        for d in range(1, depth):
            hidden, rows = drafts.feed(self, _cat(all_tokens)[frontier], features, frontier_rows, d)
            logp = self._draft_logp(hidden)  # [k, Vd]
            new_tokens, new_scores, from_row = expand_topk(_cat(all_scores)[frontier], logp, k)  # [k*k]
            all_tokens.append(self._to_target(new_tokens))
            all_scores.append(new_scores)
            all_parents.append(frontier[from_row])
            best = new_scores.topk(k).indices  # next frontier, positions in the new candidates
            frontier, frontier_rows, features = n + best, rows[from_row[best]], hidden[from_row[best]]
            n += new_tokens.numel()
        return _cat(all_tokens), _cat(all_scores), _cat(all_parents)

    def _draft_static(self, state: DecodeState, root: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """EAGLE-1: the fixed choice list; node tokens are the top-k ranks of their parent's draft."""
        shape = self.static
        tokens = torch.full((len(shape.paths),), -1, dtype=torch.long)
        tokens[0] = root[0]
        hidden_of = {0: state.draft_hidden[0]}  # node -> head output (predicts its children)
        row_of = {0: -1}  # node -> row in `drafts` (-1: the root, in the committed cache)
        drafts = _DraftCache(state)
        for d in range(shape.depth):
            children = shape.nodes_at(d + 1)
            parents = sorted({int(shape.parents[c]) for c in children})
            if d > 0:  # feed the parents (depth d) to the head; the root's output is known
                feats = torch.stack([hidden_of[int(shape.parents[p])] for p in parents])
                rows_in = torch.tensor([row_of[int(shape.parents[p])] for p in parents])
                hidden, rows = drafts.feed(self, tokens[parents], feats, rows_in, d)
                hidden_of.update({p: hidden[i] for i, p in enumerate(parents)})
                row_of.update({p: int(rows[i]) for i, p in enumerate(parents)})
            logp = self._draft_logp(torch.stack([hidden_of[p] for p in parents]))  # [m, Vd]
            kmax = min(int(shape.ranks[children].max()) + 1, logp.shape[-1])
            top = self._to_target(logp.topk(kmax, dim=-1).indices)  # [m, kmax]
            where = {p: i for i, p in enumerate(parents)}
            for c in children:
                rank = int(shape.ranks[c])
                tokens[c] = top[where[int(shape.parents[c])], min(rank, kmax - 1)]
        return tokens, shape.parents

    @property
    def draft_vocab_size(self) -> int:
        """How many tokens the draft scores (Vd)."""
        return self._draft_lm_head[-1].out_features

    def _draft_logp(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft log-probs over the draft vocabulary [m, Vd] (fp32, on the CPU) from head outputs [m, H]."""
        with record_function("eagle.draft.lm_head"):
            return self._draft_lm_head(hidden).float().log_softmax(dim=-1).cpu()

    def _to_target(self, draft_tokens: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary indices -> target token ids (same shape)."""
        return draft_tokens if self._draft_ids is None else self._draft_ids[draft_tokens]

    # ---- model calls ----------------------------------------------------------------------

    def _target_forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
                        cache: DynamicCache) -> tuple[torch.Tensor, torch.Tensor]:
        """Target over tokens [q] at positions [q]; returns logits [q, V] and the head's input
        features [q, H] (EAGLE-3: [q, 3H], its layers side by side)."""
        out = self.target(input_ids=tokens[None], position_ids=positions[None], attention_mask=mask,
                          past_key_values=cache, use_cache=True, output_hidden_states=True)
        if self._feature_layers is None:
            return out.logits[0], out.hidden_states[-1][0]
        return out.logits[0], torch.cat([out.hidden_states[i][0] for i in self._feature_layers], dim=-1)

    def _head_forward(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                      mask: torch.Tensor | None, past: KVCache | None) -> tuple[torch.Tensor, KVCache]:
        """Head rows (features [q, H], next tokens [q]) at positions [q]; returns outputs [q, H]."""
        embeds = self.target.get_input_embeddings()(tokens)
        hidden, past = self.head(features[None], embeds[None], positions[None], mask, past)
        return hidden[0], past

    @property
    def _dtype(self) -> torch.dtype:
        return self.target.get_input_embeddings().weight.dtype

    # ---- bookkeeping ----------------------------------------------------------------------

    def _start(self, method: str, input_ids: torch.Tensor, max_new_tokens: int, max_length: int):
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"batch size 1 only: input_ids must be [1, S], got {tuple(input_ids.shape)}")
        self.last_stats = GenerationStats(method, prompt_tokens=input_ids.shape[1])
        left = min(max_new_tokens, max_length - input_ids.shape[1])
        return self.last_stats, _Budget(left, self.eos_ids)

    @staticmethod
    def _emit(stats: GenerationStats, budget: _Budget, tokens: torch.Tensor, start: float) -> torch.Tensor:
        out = budget.take(tokens)
        stats.new_tokens += out.numel()
        stats.seconds = time.perf_counter() - start
        return out

    def _collect(self, input_ids: torch.Tensor, stream: Iterator[torch.Tensor], log: bool):
        ids = torch.cat([input_ids, *(t.to(input_ids.device)[None] for t in stream)], dim=1)
        if log:
            return ids, self.last_stats.new_tokens, self.last_stats.steps
        return ids


class _DraftCache:
    """The head's KV cache while drafting: committed rows plus the tree nodes fed so far.

    Starts from the committed cache (not modified: the head concatenates into new tensors)
    and tracks, for every fed node, which fed nodes are its ancestors (itself included).
    """

    def __init__(self, state: DecodeState):
        self.past = state.head_past
        self.committed = state.committed
        self.ancestors = torch.zeros(0, 0, dtype=torch.bool)  # [F, F]

    def feed(self, model: EaModel, tokens: torch.Tensor, features: torch.Tensor, parent_rows: torch.Tensor,
             depth: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Run nodes (tokens [m], parents' head outputs [m, H]) at tree depth `depth`.

        parent_rows [m]: each node's parent row among the fed nodes, -1 for the root.
        Returns head outputs [m, H] and the rows the nodes now occupy [m].
        """
        m, f = tokens.numel(), self.ancestors.shape[0]
        inherited = torch.zeros(m, f, dtype=torch.bool)
        has_parent = parent_rows >= 0
        inherited[has_parent] = self.ancestors[parent_rows[has_parent]]
        new_rows = torch.cat([inherited, torch.eye(m, dtype=torch.bool)], dim=1)  # [m, F+m]
        self.ancestors = torch.cat([torch.cat([self.ancestors, torch.zeros(f, m, dtype=torch.bool)], dim=1), new_rows])
        allowed = torch.cat([torch.ones(m, self.committed, dtype=torch.bool), new_rows], dim=1)
        device = model.target.device
        mask = additive_mask(allowed, model._dtype).to(device)
        positions = torch.full((m,), self.committed - 1 + depth, device=device)
        with record_function("eagle.draft.head"):
            hidden, self.past = model._head_forward(features, tokens.to(device), positions, mask, self.past)
        return hidden, torch.arange(f, f + m)


def _check_head_fits(head: Head, target: nn.Module) -> None:
    """One-line error when a head was trained for a different target (hidden size or vocabulary)."""
    vocab, hidden = target.get_input_embeddings().weight.shape
    c = head.config
    if (c.hidden_size, c.vocab_size) != (hidden, vocab):
        trained_for = f"'{c.target}'" if c.target else "another target"
        raise ValueError(
            f"this draft head was trained for {trained_for} (hidden size {c.hidden_size}, vocabulary {c.vocab_size}), "
            f"but the target has hidden size {hidden} and vocabulary {vocab}: pass the base model the head was "
            f"trained for, or train a head for this one (python -m train +model=NAME)"
        )


def _feature_layers(head: Head, target: nn.Module) -> list[int] | None:
    """hidden_states indices an EAGLE-3 head reads (its config's, else the paper's default), None for EAGLE-1/2."""
    if not isinstance(head, Eagle3Head):
        return None
    n = target.config.get_text_config().num_hidden_layers
    layers = list(head.config.feature_layers) or default_layers(n)
    if any(not -n - 1 <= i <= n for i in layers):
        raise ValueError(f"this EAGLE-3 head reads target layers {layers}, but the target has {n} layers")
    return layers


def _draft_vocabulary(head: Head, lm_head: nn.Linear, size: int | None) -> tuple[torch.Tensor | None, nn.Sequential]:
    """(target ids of the draft vocabulary [Vd] or None = all, the module scoring head outputs over it).

    EAGLE-1/2: (rows of) the target's lm_head. EAGLE-3: the head's own norm and lm_head. With
    `size`, only the first `size` ids (the most frequent, for heads this project trains); an
    EAGLE-1/2 head asked for more than it stores gets the rest of the target's ids after them
    (size = the target's vocabulary size: all of it)."""
    ids = head.draft_ids
    if size is not None:
        if ids is None:
            raise ValueError("draft_vocab needs a head with a stored draft vocabulary (python -m train.vocab STORE --head DIR)")
        if size > ids.numel() and isinstance(head, Eagle3Head):
            raise ValueError(f"draft_vocab={size}: this EAGLE-3 head's lm_head has only {ids.numel()} rows")
        if size >= lm_head.out_features:
            return None, nn.Sequential(lm_head)
        ids = top_up(ids.cpu(), torch.arange(lm_head.out_features), size)[:size]
    if isinstance(head, Eagle3Head):
        rows = head.lm_head if size is None else _rows(head.lm_head, torch.arange(ids.numel()))
        return None if ids is None else ids.to("cpu", torch.long), nn.Sequential(head.norm, rows)
    if ids is None:
        return None, nn.Sequential(lm_head)
    ids = ids.to("cpu", torch.long)
    return ids, nn.Sequential(_rows(lm_head, ids))


def _rows(linear: nn.Linear, ids: torch.Tensor) -> nn.Linear:
    """A frozen Linear holding the output rows `ids` [N] of `linear`."""
    rows = nn.Linear(linear.in_features, ids.numel(), bias=linear.bias is not None)
    rows = rows.to(device=linear.weight.device, dtype=linear.weight.dtype).requires_grad_(False)
    index = ids.to(linear.weight.device)
    rows.weight.copy_(linear.weight[index])
    if linear.bias is not None:
        rows.bias.copy_(linear.bias[index])
    return rows


def _load_tokenizer(path: Path):
    """The target folder's tokenizer, or None for a bare model folder (e.g. a test target)."""
    if not any((path / name).exists() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    return AutoTokenizer.from_pretrained(path)


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(parts) if len(parts) > 1 else parts[0]
