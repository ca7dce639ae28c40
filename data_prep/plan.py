"""Preflight: what a data_prep (and training) run will take, before any target forward.

    python -m data_prep +model=NAME [data...] plan=true     # also python -m train ... plan=true

Prints the conversations, the estimated tokens, the store's size on disk against the free
space of its filesystem, and per-rank host and device memory. It works offline from the
config alone: target sizes come from the target's config when it is local (or in the HF
cache), else from the preset (`model.hidden_size`, `vocab_size`, `intermediate_size`,
`params`); conversations are counted when the source can be read, else taken from the data
preset (`data.plan_conversations`); tokens are measured by tokenizing a sample through the
chat template when the tokenizer is at hand, else estimated from `data.plan_tokens_per_conversation`.
Every figure says which of these it came from. `prepare` refuses to start when the store
cannot fit (one line), whether or not the plan was asked for.

Store bytes per token: 4 (input id) + 1 (loss mask) + 2·H (bf16 feature) + 2·K·H (EAGLE-3's K
extra layers): ~8 KB at H=4096 for EAGLE-2 and ~32 KB for EAGLE-3 (twice that in fp32).

Both ways of feeding the trainer are costed, and one is recommended (`Choice`): the store
(`train.feature_source=store`: disk, one target pass in all) or online (`train.feature_source=online`: no
disk, one target forward per epoch, counted as 2 × parameters FLOPs per token against the
head's training, 6 × head parameters + 4 × V_draft × H + 2 × V_target × H per token).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from eagle.heads.feature_layers import fused_layers
from eagle.heads.draft_vocab import draft_vocab_size

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
    choice: Choice | None = None  # store or online

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
        out += [f"memory per rank, {k}: {v:,.1f} GB" for k, v in self.memory.items()]
        return out + (self.choice.lines(self) if self.choice else [])


@dataclass
class Choice:
    """Offline store against online features for the planned training run."""

    epochs: float
    target_flops: float  # one target forward over all tokens (data_prep's pass, or one online epoch's)
    head_flops: float  # one epoch of the head's training
    online_gb: float  # device memory per rank online: the training figure + the target and its forward

    def recommend(self, plan: Plan) -> tuple[str, str]:
        if not plan.fits:
            return "online", "the store does not fit on its disk"
        if plan.store_bytes > plan.free_bytes / 2:
            return "online", "the store would take more than half of the free disk"
        if self.epochs <= 1:
            return "online", "one epoch reads the features once: online costs the same target pass and no disk"
        return "store", (f"it fits, and {self.epochs:g} epochs read it {self.epochs:g} times for one target pass; "
                         f"online repeats that pass every epoch")

    def lines(self, plan: Plan) -> list[str]:
        per_epoch = (self.target_flops + self.head_flops) / self.head_flops
        kind, why = self.recommend(plan)
        return [f"option store (train.feature_source=store): {plan.store_bytes / GB:,.2f} GB on disk, one target pass "
                f"({self.target_flops / 1e15:,.1f} PFLOP) before training",
                f"option online (train.feature_source=online): no disk; a target forward in every step, "
                f"+{self.target_flops / 1e15:,.1f} PFLOP per epoch over the head's {self.head_flops / 1e15:,.1f} "
                f"({per_epoch:,.1f}x an offline epoch; {self.epochs:g} epochs), {self.online_gb:,.1f} GB device "
                f"memory per rank with the target",
                f"recommended: train.feature_source={kind} ({why})"]


def make_plan(cfg, tokenizer=None, conversations=None) -> Plan:
    """The plan of `cfg`'s store; `tokenizer` / `conversations` when the caller already has them."""
    sizes = target_sizes(cfg)
    if tokenizer is None:
        tokenizer = _local_tokenizer(cfg)
    if conversations is None:
        conversations, count, count_source = _conversations(cfg)
    else:
        count, count_source = len(conversations), "read from the source"
    tokens, tokens_source = _tokens(cfg, tokenizer, conversations, count)
    layers = [int(i) for i in cfg.model.feature_layers]
    per_token = 4 + 1 + _dtype_bytes(cfg) * sizes.hidden * (1 + len(fused_layers(layers)))
    store_dir = Path(str(cfg.store_dir)).expanduser()
    extra = len(fused_layers(layers))
    plan = Plan(sizes, count, count_source, tokens, tokens_source, per_token, store_dir, _free(store_dir),
                _memory(cfg, sizes, extra))
    if "train" in cfg:
        plan.choice = _choice(cfg, sizes, tokens, extra)
    return plan


def check_fits(plan: Plan, written: int = 0) -> None:
    """One-line refusal when the store (less what is already written) cannot fit on its disk."""
    need = plan.store_bytes - written
    if need > plan.free_bytes:
        raise ValueError(f"{plan.store_dir}: the store needs about {need / GB:,.1f} GB more ({plan.tokens:,} tokens x "
                         f"{plan.bytes_per_token:,} bytes) but its disk has {plan.free_bytes / GB:,.1f} GB free; point "
                         "store_dir (or EAGLE_CACHE) at a bigger disk, or lower data.limit / model.max_len")


# ---- the pieces ----------------------------------------------------------------------------


def target_sizes(cfg) -> TargetSizes:
    """From the target's own config when it is on this machine, else from the preset's fields."""
    config = _local_config(cfg)
    if config is not None:
        text = config.get_text_config()
        inter = getattr(text, "intermediate_size", 4 * text.hidden_size)
        params = _param_count(text.vocab_size, text.hidden_size, text.num_hidden_layers, inter,
                              getattr(text, "tie_word_embeddings", False))
        return TargetSizes(text.hidden_size, text.vocab_size, text.num_hidden_layers, inter, params,
                           "the target's config")
    m = cfg.model
    missing = [k for k in ("hidden_size", "vocab_size", "num_layers", "intermediate_size", "params") if m.get(k) is None]
    if missing:
        raise ValueError(f"the target {m.path} is not on this machine and conf/model/ lacks model.{', model.'.join(missing)}"
                         " for the plan")
    return TargetSizes(int(m.hidden_size), int(m.vocab_size), int(m.num_layers), int(m.intermediate_size),
                       float(m.params), "the preset")


def _local_config(cfg):
    """The target's transformers config without touching the network, or None."""
    from transformers import AutoConfig

    from eagle.targets.resolve import local_target

    path = str(cfg.model.path)
    try:
        folder = local_target(path)  # converted or local already; the plan never converts or downloads
        return AutoConfig.from_pretrained(folder if folder is not None else path, local_files_only=True)
    except (OSError, ValueError):
        return None


def _local_tokenizer(cfg):
    from eagle.targets.resolve import local_target
    from eagle.targets.tokenizer import load_tokenizer

    folder = local_target(str(cfg.model.path))
    if folder is None:
        return None
    try:
        return load_tokenizer(folder, cfg.model.chat_template)
    except (OSError, ValueError):
        return None


def _conversations(cfg):
    """(conversations or None, their count, where the count came from)."""
    from data_prep.conversations import HUB_FILE, DataError, cached_hub_file, read_conversations

    d = cfg.data
    source = d.source
    try:
        if isinstance(source, str) and source.startswith(HUB_FILE):  # the plan never downloads
            source = cached_hub_file(source)
            if source is None:
                raise DataError(d.source, None, "", "not in the HF cache")
        convs, _ = read_conversations(str(source), d.limit, d.get("split", "train"), int(d.get("offset") or 0))
        return convs, len(convs), "read from the source"
    except (DataError, OSError) as e:
        stated = d.get("plan_conversations")
        if stated is None:
            raise ValueError(f"cannot read {d.source} for the plan ({e}) and data.plan_conversations is not set") from None
        count = min(int(stated), int(d.limit)) if d.limit else int(stated)
        return None, count, f"stated by data.plan_conversations; {e}"


def _tokens(cfg, tokenizer, conversations, count: int) -> tuple[int, str]:
    """Estimated store tokens: a tokenized sample scaled to all conversations, else the stated average."""
    from data_prep.template import TemplateError, tokenize_conversation

    if tokenizer is not None and conversations:
        step = max(1, len(conversations) // SAMPLE)
        sample = conversations[::step][:SAMPLE]
        lengths = []
        for c in sample:
            try:
                t = tokenize_conversation(tokenizer, c.messages, int(cfg.model.max_len))
            except TemplateError:
                continue
            if any(t.loss_mask):
                lengths.append(len(t.input_ids))
        kept = len(lengths) / max(1, len(sample))
        mean = sum(lengths) / max(1, len(lengths))
        return round(mean * kept * count), (f"{len(sample)} conversations tokenized: {mean:,.0f} tokens each, "
                                            f"{kept:.0%} kept")
    per = int(cfg.data.get("plan_tokens_per_conversation") or 1300)
    return per * count, f"{per:,} tokens per conversation, stated by data.plan_tokens_per_conversation"


def _memory(cfg, t: TargetSizes, extra_layers: int) -> dict[str, float]:
    """GB per rank: data_prep's target forward, and training (head, optimizer, frozen matrices, one micro-batch)."""
    weights = t.params * _dtype_bytes(cfg)
    prep_act = _forward_bytes(int(cfg.data.batch_tokens), t, extra_layers, _dtype_bytes(cfg))
    head = _head_params(t.hidden, t.intermediate, extra_layers)
    return {"data_prep host (loading the target)": weights / GB,
            "data_prep device (target + a batch)": (weights + prep_act) / GB,
            f"train device (head {head / 1e6:.0f}M params + optimizer, frozen embed/lm_head, a micro-batch)":
                _train_bytes(cfg, t, extra_layers) / GB}


def _train_bytes(cfg, t: TargetSizes, extra_layers: int) -> float:
    """Training's device memory per rank: head and optimizer states, frozen embed/lm_head, one micro-batch."""
    # bf16 weights + fp32 master weights, grads and two Adam moments (ZeRO-2/3 shard the 16)
    states = _head_params(t.hidden, t.intermediate, extra_layers) * 18
    batch = int(cfg.train.batch_tokens) if "train" in cfg else 8192
    frozen = 2 * t.vocab * t.hidden * 2
    drafted, target_side = _loss_rows(cfg, t, extra_layers)
    train_act = batch * t.hidden * 2 * (3 + extra_layers) + batch * (drafted + target_side) * 4  # fp32 softmaxes
    return states + frozen + train_act


def _choice(cfg, t: TargetSizes, tokens: int, extra_layers: int) -> Choice:
    """The two ways to feed the trainer, costed for train.epochs (or max_steps x batch_tokens)."""
    tr = cfg.train
    epochs = float(tr.epochs)
    if tr.get("max_steps"):
        epochs = tr.max_steps * int(tr.batch_tokens) * int(tr.get("grad_accum") or 1) / max(1, tokens)
    drafted, target_side = _loss_rows(cfg, t, extra_layers)
    head = _head_params(t.hidden, t.intermediate, extra_layers)
    head_flops = tokens * (6 * head + 4 * drafted * t.hidden + 2 * target_side * t.hidden)
    target = t.params * _dtype_bytes(cfg) + _forward_bytes(int(tr.batch_tokens), t, extra_layers, _dtype_bytes(cfg))
    online_gb = (_train_bytes(cfg, t, extra_layers) + target) / GB
    return Choice(round(epochs, 2), 2 * t.params * tokens, head_flops, online_gb)


def _dtype_bytes(cfg) -> int:
    """Bytes of one element of the target's weights and features (the store keeps the target's dtype)."""
    return 4 if str(cfg.model.dtype) == "float32" else 2


def _forward_bytes(tokens: int, t: TargetSizes, extra_layers: int, dtype_bytes: int) -> int:
    """Activations of one target forward over `tokens` (no grad), with EAGLE-3's extra layers kept."""
    return tokens * (t.hidden * (4 + 2 * extra_layers) + t.intermediate * 2) * dtype_bytes


def _loss_rows(cfg, t: TargetSizes, extra_layers: int) -> tuple[int, int]:
    """(draft vocabulary rows, rows of the target distribution) of the token loss: EAGLE-3 takes the
    target's distribution over the whole vocabulary, EAGLE-1/2 over the draft rows."""
    drafted = draft_vocab_size(cfg.train.get("draft_vocab") if "train" in cfg else None, t.vocab) or t.vocab
    return drafted, t.vocab if extra_layers else drafted


def _head_params(hidden: int, inter: int, extra_layers: int) -> int:
    """One decoder layer over [feature, embedding] (fc 2H -> H); EAGLE-3 fuses its K layers first."""
    head = 2 * hidden * hidden + 4 * hidden * hidden + 3 * hidden * inter
    if extra_layers:
        head += (extra_layers - 1) * hidden * hidden + 2 * hidden * hidden
    return head


def _param_count(vocab: int, hidden: int, layers: int, inter: int, tied: bool) -> float:
    per_layer = 4 * hidden * hidden + 3 * hidden * inter
    return vocab * hidden * (1 if tied else 2) + layers * per_layer


def _free(path: Path) -> int:
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free
