"""Growing a draft tree with an EAGLE head: the dynamic EAGLE-2 tree and the static EAGLE-1 tree.

Conventions. Head row t takes (f_t, embedding of x_{t+1}) and outputs f̂_{t+1} (EAGLE-3: an
internal state a_{t+1}); the draft's log-probs come from the draft vocabulary's scorer over
that output (eagle/heads/draft_vocab.py), in the same head call. The root of every tree is the
last committed token; its head output and draft log-probs are `DecodeState.draft_hidden` and
`draft_logp`. Drafted nodes are fed to the head on top of the committed
head cache without changing it (`DraftCache`), so a tree costs one head forward per depth.

Trees are returned as (tokens [N], parents [N]), root first, parents before children; the
caller builds the `Tree` buffers (eagle/decoding/tree.py).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from eagle.common.profiled import profiled
from eagle.compiled.head_graphs import CompiledHead
from eagle.decoding.eager_head import EagerHead
from eagle.decoding.runners import HeadRunner
from eagle.decoding.state import DecodeState, HeadPast
from eagle.decoding.tree import StaticTree, expand_topk, reindex_parents, select_nodes
from eagle.heads.draft_vocab import DraftVocabulary
from eagle.heads.eagle2 import KVCache


class Drafter:
    """A draft head with the target's token embedding and a draft vocabulary. Holds no decode state.

    The head's token input is the row of the target's embedding matrix, exactly what the trainer
    feeds it (train/frozen.py), also for families whose embedding module scales it (Gemma-3)."""

    def __init__(self, head: nn.Module, embed: nn.Module, vocab: DraftVocabulary, compiled: bool = False):
        self.head, self.embed, self.vocab = head, embed, vocab
        self.eager = EagerHead(head, vocab)  # the prompt's rows always run eagerly
        # compiled: head and scorer at fixed shapes over a preallocated head cache (eagle/compiled/head_graphs.py)
        self.compiled = CompiledHead(head, vocab.scorer) if compiled else None
        self.runner: HeadRunner = self.eager if self.compiled is None else self.compiled  # drafts and commits
        self.feature_width = 0  # F of the target features a prompt gave it (set at the first prefill)

    def use(self, compiled: bool) -> None:
        """Draft through the compiled runner (when there is one) or the eager one."""
        self.runner = self.compiled if compiled and self.compiled is not None else self.eager

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def prefill(self, features: torch.Tensor, tokens: torch.Tensor,
                reused: KVCache | None = None) -> tuple[torch.Tensor, torch.Tensor, HeadPast]:
        """The head over a prompt's rows (features [m, F], next tokens [m]) after `reused`'s Q rows (an earlier
        generation's, eagle/decoding/prefix_cache.py; None: Q = 0), causal, eager; returns outputs [m, H], the
        last row's draft log-probs [1, Vd] and the state's head cache of Q + m rows (`runner.start`: compiled,
        copied into its buffer)."""
        q = 0 if reused is None else reused[0].shape[2]
        self.feature_width = features.shape[1]
        positions = torch.arange(q, q + tokens.numel(), device=tokens.device)
        hidden, logp, past = self.eager.encode(self.embeddings(tokens), features, positions, None, reused, scored=1)
        return hidden, logp, self.runner.start(past)

    def encode(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
               allowed: torch.Tensor | None, past: HeadPast,
               scored: int = 0) -> tuple[torch.Tensor, torch.Tensor | None, HeadPast]:
        """Head rows (features [q, F], next tokens [q]) at positions [q] over a state's `past` of P rows
        (`prefill` made it); allowed [q, P+q] bool (CPU): the rows each new row attends to (None: causal).
        Returns outputs [q, H], the draft log-probs [scored, Vd] (fp32, CPU) of the last `scored` rows (0:
        None) and the cache with the q rows (the rows of `past` itself are not modified)."""
        embeds = self.embeddings(tokens)
        return self.runner.encode(embeds, features, positions, allowed, past, scored)

    def embeddings(self, tokens: torch.Tensor) -> torch.Tensor:
        """The head's token inputs [q, H] for tokens [q]: the matrix rows, as the trainer reads them."""
        return torch.nn.functional.embedding(tokens, self.embed.weight)

    # ---- EAGLE-2 ---------------------------------------------------------------------------

    def dynamic(self, state: DecodeState, total_token: int, depth: int, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """EAGLE-2: grow the top_k best nodes by cumulative draft log-prob, then keep the
        total_token - 1 best of all. Returns tree tokens [N] and parents [N], root first (a one-node
        tree, which prompt lookup alone extends, drafts nothing)."""
        if total_token == 1:
            return state.root.reshape(1), torch.tensor([-1])
        if depth == 1:  # the root's children alone: its best draft tokens, in rank order
            return self.root_children(state, draft_width(total_token, top_k))
        tokens, scores, parents = self.pool(state, depth, draft_width(total_token, top_k))
        with profiled("eagle.draft.tree"):
            kept = select_nodes(scores, parents, total_token - 1)
            return torch.tensor(state.root.tolist() + [tokens[i] for i in kept]), reindex_parents(kept, parents)

    def root_children(self, state: DecodeState, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The depth-1 tree: the root and its k best draft tokens (tokens [k+1], parents [k+1]), the tree that `pool`
        and `select_nodes` keep at depth 1, without their bookkeeping (the defaults' trees have depth 1)."""
        k = min(k, self.vocab.size)
        best = state.draft_logp[0].topk(k).indices  # [k] draft indices, best first
        tokens = torch.cat([state.root, self.vocab.to_target(best)])  # [k+1]
        return tokens, torch.tensor([-1] + [0] * k)

    def candidates(self, state: DecodeState, depth: int, top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The EAGLE-2 candidate pool (`pool`) as tensors: target token ids [M], cumulative draft log-probs [M]
        (fp32) and parents [M]."""
        tokens, scores, parents = self.pool(state, depth, top_k)
        return torch.tensor(tokens), torch.tensor(scores), torch.tensor(parents)

    def pool(self, state: DecodeState, depth: int, top_k: int) -> tuple[list[int], list[float], list[int]]:
        """The EAGLE-2 candidate pool: top_k children of the top_k best nodes, `depth` levels.

        Returns target token ids, cumulative draft log-probs and parents (candidate indices, -1 = the root),
        lists of M = k + (depth-1)*k*k, parents before children. Bookkeeping over lists: only the head's
        calls and the top-k over its draft log-probs are tensor work.
        """
        k = min(top_k, self.vocab.size)
        drafts = DraftCache(state)
        ids, scores, _ = expand_topk([0.0], state.draft_logp, k)  # depth-1 candidates
        tokens = self.vocab.to_target(ids).tolist()
        parents = [-1] * k
        frontier, frontier_rows = list(range(k)), [-1] * k  # candidate indices; their parents' rows in `drafts`
        features = state.draft_hidden.expand(k, -1)  # [k, H] head outputs of their parents
        for d in range(1, depth):
            fed = torch.tensor([tokens[i] for i in frontier])
            hidden, logp, rows = drafts.feed(self, fed, features, frontier_rows, d)  # [k, H], [k, Vd]
            ids, new_scores, from_row = expand_topk([scores[i] for i in frontier], logp, k)  # k*k children
            n = len(tokens)
            tokens += self.vocab.to_target(ids).tolist()
            scores += new_scores
            parents += [frontier[r] for r in from_row]
            best = sorted(range(len(new_scores)), key=lambda i: -new_scores[i])[:k]  # the next frontier
            frontier, frontier_rows = [n + i for i in best], [rows[from_row[i]] for i in best]
            features = hidden[[from_row[i] for i in best]]
        return tokens, scores, parents

    # ---- EAGLE-1 ---------------------------------------------------------------------------

    def static(self, state: DecodeState, shape: StaticTree) -> tuple[torch.Tensor, torch.Tensor]:
        """EAGLE-1: a fixed tree `shape` (eagle.decoding.tree.static_tree); node tokens are the top-k
        ranks of their parent's draft. Returns tokens [N] and parents [N], root first."""
        tokens = torch.full((len(shape.paths),), -1, dtype=torch.long)
        tokens[0] = state.root[0]
        hidden_of = {0: state.draft_hidden[0]}  # node -> head output (predicts its children)
        logp_of = {0: state.draft_logp[0]}  # node -> draft log-probs of its children
        row_of = {0: -1}  # node -> row in `drafts` (-1: the root, in the committed cache)
        drafts = DraftCache(state)
        for d in range(shape.depth):
            children = shape.nodes_at(d + 1)
            parents = sorted({int(shape.parents[c]) for c in children})
            if d > 0:  # feed the parents (depth d) to the head; the root's output is known
                feats = torch.stack([hidden_of[int(shape.parents[p])] for p in parents])
                rows_in = [row_of[int(shape.parents[p])] for p in parents]
                hidden, logp, rows = drafts.feed(self, tokens[parents], feats, rows_in, d)
                hidden_of.update({p: hidden[i] for i, p in enumerate(parents)})
                logp_of.update({p: logp[i] for i, p in enumerate(parents)})
                row_of.update({p: rows[i] for i, p in enumerate(parents)})
            logp = torch.stack([logp_of[p] for p in parents])  # [m, Vd]
            kmax = min(int(shape.ranks[children].max()) + 1, logp.shape[-1])
            top = self.vocab.to_target(logp.topk(kmax, dim=-1).indices)  # [m, kmax]
            where = {p: i for i, p in enumerate(parents)}
            for c in children:
                rank = int(shape.ranks[c])
                tokens[c] = top[where[int(shape.parents[c])], min(rank, kmax - 1)]
        return tokens, shape.parents


class DraftCache:
    """The head's KV cache while drafting: committed rows plus the tree nodes fed so far.

    Starts from the committed cache (not modified: the head concatenates into new tensors)
    and tracks, for every fed node, which fed nodes are its ancestors (itself included), as
    Python lists: a step feeds a few nodes, where a tensor op each costs more than the lists.
    """

    def __init__(self, state: DecodeState):
        self.past = state.head_past
        self.committed = state.committed
        self.ancestors: list[list[int]] = []  # [F] each fed node's fed ancestors, itself last

    def feed(self, drafter: Drafter, tokens: torch.Tensor, features: torch.Tensor, parent_rows: list[int],
             depth: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Run nodes (tokens [m], parents' head outputs [m, H]) at tree depth `depth`.

        parent_rows [m]: each node's parent row among the fed nodes, -1 for the root.
        Returns head outputs [m, H], their draft log-probs [m, Vd] and the rows the nodes now occupy [m] (a list).
        """
        m, f, c = tokens.numel(), len(self.ancestors), self.committed
        new = [(self.ancestors[r] if r >= 0 else []) + [f + i] for i, r in enumerate(parent_rows)]
        self.ancestors += new
        allowed = np.zeros((m, c + f + m), dtype=bool)  # [m, P+F+m]: the committed rows and each node's ancestors
        allowed[:, :c] = True
        allowed[[i for i, rows in enumerate(new) for _ in rows], [c + j for rows in new for j in rows]] = True
        device = drafter.device
        positions = torch.full((m,), c - 1 + depth, device=device)
        with profiled("eagle.draft.head"):
            hidden, logp, self.past = drafter.encode(features, tokens.to(device), positions, torch.from_numpy(allowed),
                                                     self.past, m)
        return hidden, logp, list(range(f, f + m))


def draft_width(total_token: int, top_k: int) -> int:
    """Children per expanded node that a dynamic tree of total_token nodes needs: min(top_k, total_token - 1).

    Every one of the total_token - 1 best candidates ranks within the best total_token - 1 of its
    siblings and of its depth (whatever outranks it is kept too), so the narrower pool holds the
    same tree, for fewer head rows and fewer draft scores per level."""
    return max(1, min(top_k, total_token - 1))

