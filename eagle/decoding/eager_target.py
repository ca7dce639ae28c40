"""The target's eager forwards (`EaModel(compile=False)`, and targets with sliding windows): HF's
forward over a `DynamicCache` per generation, the tree as an attention mask (eagle/decoding/runners.py
`TargetRunner`).

- **Tree mask.** Full-attention layers take the additive [1, 1, N, P+N] mask of the committed rows
  and each node's ancestors; sliding-window layers their window of it (`tree_masks`).
- **Commit.** Accepted rows are gathered in place (eagle/decoding/kv_commit.py); sliding-window
  layers record a tree's rows until then (`prepare_cache`) and are trimmed back to their window.
- **Plain decoding** runs HF's own one-token forwards: no mask, no position ids, and sliding-window
  layers keep their window as they go.
- **Prompts** keep only their last row's logits (`prompt_forward`): the decoder reads no other, and the
  lm_head is a fifth of SmolLM2-135M's weights.
"""

from __future__ import annotations

import inspect
from functools import cache

import torch
from torch import nn
from transformers import DynamicCache

from eagle.common.forward_lock import eager_forward
from eagle.common.profiled import profiled
from eagle.decoding.kv_commit import commit_cache, prepare_cache
from eagle.decoding.prefix_cache import KVRows
from eagle.decoding.tree import Tree, sliding_tree_mask, tree_attention_mask


def prompt_forward(target: nn.Module, input_ids: torch.Tensor, cache, hidden: bool):
    """HF's eager forward of a prompt [1, S] into `cache`, with hidden states or not, keeping only the last row's
    logits where the target's forward takes `logits_to_keep` (transformers 5.x's causal LMs).

    The row is named by index ([S-1]), not by count: for a count HF slices `hidden[:, -1:]`, a [1, 1, H] view whose
    strides torch's matmul does not fold into a matrix, and a bf16 lm_head then runs as a batched product over a
    contiguous copy of its whole weight (SmolLM2-135M, 2 threads: 42 ms, against 2 ms for the row). An index
    gathers the row into a tensor of its own."""
    last = torch.tensor([input_ids.shape[1] - 1], device=input_ids.device)
    keep = {"logits_to_keep": last} if _takes_logits_to_keep(type(target)) else {}
    return eager_forward(target, input_ids=input_ids, past_key_values=cache, use_cache=True,
                         output_hidden_states=hidden, **keep)


@cache
def _takes_logits_to_keep(cls: type) -> bool:
    return "logits_to_keep" in inspect.signature(cls.forward).parameters


class EagerTarget:
    """HF's forwards of a target over the DynamicCache each prefill starts. Holds no decode state."""

    def __init__(self, target: nn.Module):
        self.target = target

    def prefill(self, input_ids: torch.Tensor, room: int,
                reused: list[KVRows] | None = None) -> tuple[object, DynamicCache]:
        """The prompt [1, S] with hidden states into a new cache (`room` is a compiled runner's concern); after
        `reused`'s Q rows (its first Q tokens' rows, eagle/decoding/prefix_cache.py) the forward runs the rest."""
        cache, q = self._cache(reused)
        prepare_cache(cache)  # sliding-window layers keep a tree's rows until commit
        out = prompt_forward(self.target, input_ids[:, q:], cache, hidden=True)
        commit_cache(cache, input_ids.shape[1], torch.zeros(0, dtype=torch.long))  # sliding layers: their window
        return out, cache

    def tree_forward(self, cache: DynamicCache, tokens: torch.Tensor, positions: torch.Tensor, tree: Tree,
                     past: int) -> object:
        """The tree's tokens [N] at positions [N] over the cache's `past` rows; appends N rows. HF output
        with hidden states."""
        with profiled("eagle.verify.mask"):
            mask = self.tree_masks(tree, cache, past, tokens.device)
        with profiled("eagle.verify.forward"):
            return eager_forward(self.target, input_ids=tokens[None], position_ids=positions[None],
                                 attention_mask=mask, past_key_values=cache, use_cache=True, output_hidden_states=True)

    def keep_rows(self, cache: DynamicCache, past: int, path: torch.Tensor) -> None:
        """Keep tree nodes `path` [n] after the `past` committed rows (in place)."""
        commit_cache(cache, past, path)

    def plain_prefill(self, input_ids: torch.Tensor,
                      reused: list[KVRows] | None = None) -> tuple[torch.Tensor, DynamicCache]:
        """Plain decoding's prompt [1, S] (after `reused`'s rows, as `prefill`): its last logits [V] and a new cache."""
        cache, q = self._cache(reused)
        out = prompt_forward(self.target, input_ids[:, q:], cache, hidden=False)
        return out.logits[0, -1], cache

    def rows(self, cache: DynamicCache, n: int) -> list[KVRows] | None:
        """The first n rows of every layer, to start a later prompt with (views: no step writes this cache
        again); None where a layer keeps only a sliding window of them."""
        if any(getattr(layer, "is_sliding", False) for layer in cache.layers):
            return None
        return [(layer.keys[:, :, :n], layer.values[:, :, :n]) for layer in cache.layers]

    def _cache(self, reused: list[KVRows] | None) -> tuple[DynamicCache, int]:
        """A new cache holding `reused`'s rows (copied), and their count."""
        cache = DynamicCache(config=self.target.config)
        for i, (keys, values) in enumerate(reused or []):
            cache.update(keys, values, i)
        return cache, reused[0][0].shape[2] if reused else 0

    def plain_step(self, cache: DynamicCache, token: torch.Tensor, past: int) -> torch.Tensor:
        """One token [1] after the cache's rows (`past` of them); its logits [V]."""
        return eager_forward(self.target, input_ids=token[None], past_key_values=cache, use_cache=True).logits[0, -1]

    def tree_masks(self, tree: Tree, cache: DynamicCache, past: int,
                   device: torch.device) -> torch.Tensor | dict[str, torch.Tensor]:
        """The tree's additive attention mask [1, 1, N, K] for every layer type of the target.

        Full attention sees the committed prefix and each node's ancestors. A sliding-window
        layer sees only its window of positions (eagle.decoding.tree.sliding_tree_mask). Models that
        mix both (Gemma-2/3, Qwen-2) take a dict keyed by layer type; models whose every layer
        slides (Mistral, Phi-3) take the sliding mask alone."""
        dtype = self.target.get_input_embeddings().weight.dtype
        full = tree_attention_mask(tree.ancestors, past, dtype).to(device)
        sliding = next((layer for layer in cache.layers if getattr(layer, "is_sliding", False)), None)
        if sliding is None:
            return full
        window = sliding_tree_mask(tree.ancestors, tree.depths, past, sliding.keys.shape[-2], sliding.sliding_window,
                                   dtype).to(device)
        if getattr(self.target.config.get_text_config(), "layer_types", None) is None:
            return window
        return {"full_attention": full, "sliding_attention": window}
