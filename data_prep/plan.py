"""Preflight of a store: what data_prep will take, before any target forward.

    python -m data_prep +model=NAME [data...] plan=true     # the store's side
    python -m train +model=NAME [...] plan=true             # this, and training's side (train/training_plan.py)

Prints the conversations, the estimated tokens, the store's size on disk against the free
space of its filesystem, and data_prep's host and device memory per rank: on the host the target
as it loads and the shard buffers (one shard filling, one being written: 2 x data.shard_records
conversations of features), on the device the target and one forward batch. It works offline from
the config alone: target sizes come from the target's config when it is local (or in the HF
cache), else from the preset (`model.hidden_size`, `vocab_size`, `intermediate_size`,
`params`); conversations are counted when the source can be read, else taken from the data
preset (`data.plan_conversations`); tokens are measured by tokenizing a sample through the
chat template when the tokenizer is at hand, else estimated from `data.plan_tokens_per_conversation`.
Every figure says which of these it came from. `prepare` refuses to start when the store
cannot fit (one line), whether or not the plan was asked for.

Store bytes per token: 4 (input id) + 1 (loss mask) + 2·H (bf16 feature) + 2·K·H (EAGLE-3's K
extra layers): ~8 KB at H=4096 for EAGLE-2 and ~32 KB for EAGLE-3 (twice that in fp32).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from data_prep.data_config import DataConfig, ModelConfig, PrepConfig, TargetFiles, local_files
from eagle.heads.feature_layers import fused_layers

GB = 2**30
SAMPLE = 256  # conversations tokenized to measure tokens per conversation


@dataclass
class TargetSizes:
    hidden: int
    vocab: int
    layers: int
    intermediate: int
    params: float
    source: str  # "the target's config" | "the preset"
    heads: int | None = None  # attention heads, key/value heads and head width: from the target's config
    kv_heads: int | None = None  # (a preset has none: the plan then counts full multi-head attention,
    head_dim: int | None = None  # heads x head_dim = hidden, an upper bound for grouped-KV targets)

    @property
    def attention_width(self) -> int:
        """heads x head_dim: the width of q and of keys/values repeated per query head."""
        return self.heads * self.head_dim if self.heads and self.head_dim else self.hidden

    @property
    def kv_width(self) -> int:
        """kv_heads x head_dim: the width of the keys and values a layer stores."""
        return self.kv_heads * self.head_dim if self.kv_heads and self.head_dim else self.attention_width


@dataclass
class Plan:
    target: TargetSizes
    conversations: int
    conversations_source: str
    tokens: int
    tokens_source: str
    bytes_per_token: int
    store_dir: Path
    free_bytes: int
    memory: dict[str, float] = field(default_factory=dict)  # GB per rank, by what holds it

    @property
    def store_bytes(self) -> int:
        return self.tokens * self.bytes_per_token

    @property
    def fits(self) -> bool:
        return self.store_bytes <= self.free_bytes

    def lines(self) -> list[str]:
        t = self.target
        out = [f"target: hidden {t.hidden}, vocabulary {t.vocab}, {t.layers} layers, {t.params / 1e9:.2f}B parameters "
               f"({t.source})",
               f"conversations: {self.conversations:,} ({self.conversations_source})",
               f"tokens: {self.tokens:,} ({self.tokens_source})",
               f"store: {self.store_bytes / GB:,.2f} GB at {self.bytes_per_token:,} bytes per token in {self.store_dir}; "
               f"{self.free_bytes / GB:,.1f} GB free there{'' if self.fits else ': DOES NOT FIT'}"]
        return out + [f"memory per rank, {k}: {v:,.1f} GB" for k, v in self.memory.items()]


def store_plan(prep: PrepConfig, target_dir: Path | None = None, tokenizer=None, conversations=None) -> Plan:
    """The plan of `prep`'s store. A job that resolved its target passes its folder, tokenizer and
    conversations; without them the plan looks for the target on this machine (never converting or
    downloading it) and reads what it can of the source."""
    if target_dir is None:
        local = local_files(prep.model)
        target_dir = None if local is None else local.folder
        if tokenizer is None and local is not None:
            tokenizer = _tokenizer(local)
    sizes = target_sizes(prep.model, target_dir)
    if conversations is None:
        conversations, count, count_source = _conversations(prep.data)
    else:
        count, count_source = len(conversations), "read from the source"
    tokens, tokens_source = _tokens(prep, tokenizer, conversations, count)
    extra = extra_layers(prep.model)
    per_token = store_bytes_per_token(sizes.hidden, extra, dtype_bytes(prep.model.dtype))
    return Plan(sizes, count, count_source, tokens, tokens_source, per_token, prep.store_dir, _free(prep.store_dir),
                _memory(prep, sizes, extra, tokens, count))


def extra_layers(model: ModelConfig) -> int:
    """EAGLE-3's fused layers a store keeps besides the last one (0 for EAGLE-1/2)."""
    return len(fused_layers([int(i) for i in model.feature_layers]))


def check_fits(plan: Plan, written: int = 0) -> None:
    """One-line refusal when the store (less what is already written) cannot fit on its disk."""
    need = plan.store_bytes - written
    if need > plan.free_bytes:
        raise ValueError(f"{plan.store_dir}: the store needs about {need / GB:,.1f} GB more ({plan.tokens:,} tokens x "
                         f"{plan.bytes_per_token:,} bytes) but its disk has {plan.free_bytes / GB:,.1f} GB free; point "
                         "store_dir (or EAGLE_CACHE) at a bigger disk, or lower data.limit / model.max_len")


# ---- the pieces ----------------------------------------------------------------------------


def target_sizes(model: ModelConfig, target_dir: Path | None = None) -> TargetSizes:
    """From the target's own config when it is on this machine (`target_dir`, or the HF cache),
    else from the preset's fields."""
    config = _local_config(model.path, target_dir)
    if config is not None:
        text = config.get_text_config()
        inter = getattr(text, "intermediate_size", 4 * text.hidden_size)
        params = _param_count(text.vocab_size, text.hidden_size, text.num_hidden_layers, inter,
                              getattr(text, "tie_word_embeddings", False))
        heads = getattr(text, "num_attention_heads", None)
        head_dim = getattr(text, "head_dim", None) or (text.hidden_size // heads if heads else None)
        return TargetSizes(text.hidden_size, text.vocab_size, text.num_hidden_layers, inter, params,
                           "the target's config", heads, getattr(text, "num_key_value_heads", None) or heads,
                           head_dim)
    m = model
    missing = [k for k in ("hidden_size", "vocab_size", "num_layers", "intermediate_size", "params")
               if getattr(m, k) is None]
    if missing:
        raise ValueError(f"the target {m.path} is not on this machine and conf/model/ lacks model.{', model.'.join(missing)}"
                         " for the plan")
    return TargetSizes(int(m.hidden_size), int(m.vocab_size), int(m.num_layers), int(m.intermediate_size),
                       float(m.params), "the preset")


def _local_config(path: str, target_dir: Path | None):
    """The target's transformers config without touching the network, or None."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(target_dir if target_dir is not None else path, local_files_only=True)
    except (OSError, ValueError):
        return None


def _tokenizer(target: TargetFiles):
    try:
        return target.tokenizer
    except (OSError, ValueError):
        return None


def _conversations(d: DataConfig):
    """(conversations or None, their count, where the count came from)."""
    from data_prep.conversations import HUB_FILE, DataError, cached_hub_file, read_conversations

    source = d.source
    try:
        if isinstance(source, str) and source.startswith(HUB_FILE):  # the plan never downloads
            source = cached_hub_file(source)
            if source is None:
                raise DataError(d.source, None, "", "not in the HF cache")
        convs, _ = read_conversations(source if isinstance(source, list) else str(source), d.limit, d.split, d.offset)
        return convs, len(convs), "read from the source"
    except (DataError, OSError) as e:
        stated = d.plan_conversations
        if stated is None:
            raise ValueError(f"cannot read {d.source} for the plan ({e}) and data.plan_conversations is not set") from None
        count = min(stated, d.limit) if d.limit else stated
        return None, count, f"stated by data.plan_conversations; {e}"


def _tokens(prep: PrepConfig, tokenizer, conversations, count: int) -> tuple[int, str]:
    """Estimated store tokens: a tokenized sample scaled to all conversations, else the stated average."""
    from data_prep.template import TemplateError, tokenize_conversation

    if tokenizer is not None and conversations:
        step = max(1, len(conversations) // SAMPLE)
        sample = conversations[::step][:SAMPLE]
        lengths = []
        for c in sample:
            try:
                t = tokenize_conversation(tokenizer, c.messages, prep.model.max_len)
            except TemplateError:
                continue
            if any(t.loss_mask):
                lengths.append(len(t.input_ids))
        kept = len(lengths) / max(1, len(sample))
        mean = sum(lengths) / max(1, len(lengths))
        return round(mean * kept * count), (f"{len(sample)} conversations tokenized: {mean:,.0f} tokens each, "
                                            f"{kept:.0%} kept")
    per = prep.data.plan_tokens_per_conversation or 1300
    return per * count, f"{per:,} tokens per conversation, stated by data.plan_tokens_per_conversation"


SHARDS_IN_HOST = 2  # data_prep's shard buffers: one filling from the forwards, one being written


def _memory(prep: PrepConfig, t: TargetSizes, extra: int, tokens: int, conversations: int) -> dict[str, float]:
    """GB per rank of data_prep: on the host the target as it loads and the shard buffers, on the
    device the target with one forward batch."""
    element = dtype_bytes(prep.model.dtype)
    weights = t.params * element
    per_conversation = tokens / max(1, conversations)
    shard = prep.data.shard_records * per_conversation * store_bytes_per_token(t.hidden, extra, element)
    activations = forward_bytes(prep.data.batch_tokens, t, extra, element)
    return {f"data_prep host (the target, {SHARDS_IN_HOST} shard buffers of {prep.data.shard_records} conversations)":
            (weights + SHARDS_IN_HOST * shard) / GB,
            "data_prep device (target + a batch)": (weights + activations) / GB}


def store_bytes_per_token(hidden: int, extra: int, element: int) -> int:
    """4 (input id) + 1 (loss mask) + the last layer's feature and EAGLE-3's `extra` layers."""
    return 4 + 1 + element * hidden * (1 + extra)


def dtype_bytes(dtype: str) -> int:
    """Bytes of one element of the target's weights and features (the store keeps the target's dtype)."""
    return 4 if str(dtype) == "float32" else 2


def forward_bytes(tokens: int, t: TargetSizes, extra_layers: int, element_bytes: int) -> int:
    """Activations of one target forward over `tokens` (no grad): a layer's working set and the
    outputs; asking for EAGLE-3's extra layers keeps every layer's hidden states (HF's
    output_hidden_states) and copies the fused ones side by side."""
    kept = (t.layers + 1 + extra_layers) * t.hidden if extra_layers else 0
    return tokens * (t.hidden * 4 + t.intermediate * 2 + kept) * element_bytes


def _param_count(vocab: int, hidden: int, layers: int, inter: int, tied: bool) -> float:
    per_layer = 4 * hidden * hidden + 3 * hidden * inter
    return vocab * hidden * (1 if tied else 2) + layers * per_layer


def _free(path: Path) -> int:
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free
