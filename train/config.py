"""The schema of the `train:`, `wandb:`, `hub:` and `plan_gpu:` sections of conf/config.yaml.

The YAML holds the values (so `--cfg job` prints them); these dataclasses are the schema:
`validate(cfg)` merges each section onto its dataclass, which rejects unknown keys and
wrong types with Hydra's usual messages. The schema is applied by the train app only,
so data_prep, which composes the same config.yaml, does not depend on this package.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf

from data_prep.data_config import require_model
from eagle.heads.formats import FORMATS
from train.loss import TOKEN_LOSSES


@dataclass
class TrainConfig:
    """Optimizer, schedule, batching, loss, evaluation (held-out loss, τ) and checkpointing of one run."""

    features: str = "store"  # store: read a data_prep store (made first when missing) | online: the target runs in the step
    lr: float = 3e-5
    init_head: str | None = None  # start from an exported head's weights (fine-tuning)
    draft_vocab: int | None = None  # token loss over the N most frequent training tokens (None: all; 32,768 above 65,536)
    keep_init_vocab: bool = False  # EAGLE-1/2 fine-tune: the init_head's draft tokens first, in its order
    ttt_steps: int = 1  # training-time test: passes of the head over its own predictions (1 = plain EAGLE)
    ttt_decay: float = 0.8  # loss weight of pass i is ttt_decay**i
    ttt_detach: bool = True  # no gradient from a pass into the previous one
    init_lm_head: bool = False  # EAGLE-3: start lm_head/norm from the target's (rows of the draft vocabulary)
    freeze_lm_head: bool = False  # EAGLE-3: keep that lm_head frozen (speculators' default); needs init_lm_head
    head: str = "eagle2"  # eagle2 | eagle3 (set by the `head` config group)
    fc_bias: bool = True  # EAGLE-1/2: fc has a bias (EAGLE's, SGLang's); false for a head vLLM can serve
    eagle3_norms: bool = False  # EAGLE-3: speculators' variant (norm before fc, normed residual, normed output)
    head_layers: int | None = None  # decoder layers of the head (None: 1, or init_head's); more than init_head's deepens it
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    weight_decay: float = 0.0
    optimizer: str = "adamw"  # adamw | muon (train/optimizers.py: Muon for the weight matrices, AdamW for the rest)
    muon_lr: float | None = None  # Muon's lr (None: lr), scaled per matrix as torch's match_rms_adamw
    muon_momentum: float = 0.95
    muon_weight_decay: float = 0.1
    warmup_steps: int | None = 2000  # steps of a one-process run; N ranks advance the schedule N per step (as EAGLE's)
    warmup_ratio: float | None = None  # with warmup_steps None: warmup = this fraction of the schedule's horizon
    decay_steps: int | None = 800000  # end of the decay, in the same steps; None = the end of the run
    schedule: str = "linear"  # linear | cosine | constant
    min_lr_ratio: float = 0.0
    grad_clip: float = 0.5
    grad_accum: int = 1
    batch_tokens: int = 8192
    epochs: int = 20
    max_steps: int | None = None
    v_w: float = 1.0
    p_w: float = 0.1
    token_loss: str = "ce"  # ce | lk: the token term (train/loss.py): cross-entropy, or -log of the acceptance
    noise: float = 0.2
    noise_ref_len: int | None = 512
    topk: int = 3
    eval_fraction: float = 0.05
    eval_every: int = 1000
    eval_max_batches: int | None = None
    tau_every: int = 0  # optimizer steps between τ measurements by real decoding; 0 = off (>0: also at the end)
    tau_prompts: str = "mtbench"  # an eagle.bench prompt set, never in the training data
    tau_num_prompts: int = 8
    tau_max_new_tokens: int = 64
    tau_min_steps: int = 500  # runs of fewer optimizer steps skip τ with a line saying so (0: always judge)
    log_every: int = 10
    save_every: int = 1000
    keep_last: int = 2
    resume: str = "auto"  # auto | none | a checkpoint directory
    stop_after: int | None = None
    export_dtype: str = "bfloat16"
    export_epochs: bool = False  # also a head at each epoch's end but the last: output_dir/epochs/epochN
    num_workers: int | None = None  # DataLoader workers; None = 4 with pinned memory on a GPU, 0 on a CPU
    progress: bool = True


@dataclass
class WandbConfig:
    mode: str | None = None  # online | offline | disabled; None = online iff WANDB_API_KEY is set
    project: str = "eagle-draft"
    entity: str | None = None
    name: str | None = None
    tags: list[str] = field(default_factory=list)


@dataclass
class HubConfig:
    push: bool = False
    repo_id: str | None = None
    private: bool = False
    endpoint: str | None = None
    format: str = "eagle"  # the layout pushed: eagle | vllm | sglang | speculators (eagle/heads/formats.py)


@dataclass
class PlanGpuConfig:
    """What plan=true assumes of the GPUs a run will use (train/training_plan.py)."""

    memory_gb: float = 80.0  # one GPU's memory: the plan warns when a rank's peak exceeds it
    tflops: float = 300.0  # achieved bf16 TFLOP/s of one GPU, for the target's and the head's passes
    read_gb_per_s: float = 1.0  # store read bandwidth per GPU: a store epoch takes at least store / this
    ranks: int = 8  # ranks ZeRO-1/2/3 shard the head's states over


SCHEMAS = {"train": TrainConfig, "wandb": WandbConfig, "hub": HubConfig, "plan_gpu": PlanGpuConfig}
SCHEDULES = ("linear", "cosine", "constant")
FEATURES = ("store", "online")  # train/feature_source.py
RESUME_HINT = "train.resume must be 'auto', 'none' or a checkpoint directory"


def validate(cfg: DictConfig) -> DictConfig:
    """Return `cfg` with `train`, `wandb`, `hub` typed by their schema; raise on bad values."""
    require_model(cfg)
    cfg = cfg.copy()
    OmegaConf.set_struct(cfg, False)
    for key, schema in SCHEMAS.items():
        merged = OmegaConf.merge(OmegaConf.structured(schema), cfg.get(key) or {})
        cfg[key] = merged
    OmegaConf.set_struct(cfg, True)
    t = cfg.train
    if t.features not in FEATURES:
        raise ValueError(f"train.features={t.features!r}: expected one of {FEATURES}")
    if t.token_loss not in TOKEN_LOSSES:
        raise ValueError(f"train.token_loss={t.token_loss!r}: expected one of {TOKEN_LOSSES}")
    if t.schedule not in SCHEDULES:
        raise ValueError(f"train.schedule={t.schedule!r}: expected one of {SCHEDULES}")
    if t.warmup_steps is None and (t.warmup_ratio is None or not 0.0 <= t.warmup_ratio < 1.0):
        raise ValueError(f"train.warmup_steps=null needs train.warmup_ratio in [0, 1), got {t.warmup_ratio}")
    if not 0.0 <= t.eval_fraction < 1.0:
        raise ValueError(f"train.eval_fraction={t.eval_fraction}: expected 0 <= f < 1")
    if t.grad_accum < 1 or t.batch_tokens < 2:
        raise ValueError("train.grad_accum must be >= 1 and train.batch_tokens >= 2")
    if t.ttt_steps < 1:
        raise ValueError("train.ttt_steps must be >= 1 (1 = plain EAGLE training)")
    if t.head_layers is not None and t.head_layers < 1:
        raise ValueError(f"train.head_layers={t.head_layers}: a head has at least one decoder layer")
    if t.topk < 1:
        raise ValueError("train.topk must be >= 1")
    if t.tau_every < 0 or t.tau_min_steps < 0 or t.tau_num_prompts < 1 or t.tau_max_new_tokens < 1:
        raise ValueError("train.tau_every and train.tau_min_steps must be >= 0, train.tau_num_prompts and "
                         "train.tau_max_new_tokens >= 1")
    if cfg.wandb.mode not in (None, "online", "offline", "disabled"):
        raise ValueError(f"wandb.mode={cfg.wandb.mode!r}: expected online, offline, disabled or null")
    if cfg.hub.push and not cfg.hub.repo_id:
        raise ValueError("hub.push=true needs hub.repo_id=NAME")
    g = cfg.plan_gpu
    if min(g.memory_gb, g.tflops, g.read_gb_per_s) <= 0 or g.ranks < 1:
        raise ValueError("plan_gpu.memory_gb, plan_gpu.tflops and plan_gpu.read_gb_per_s must be > 0, "
                         "plan_gpu.ranks >= 1")
    if cfg.hub.format not in FORMATS:
        raise ValueError(f"hub.format={cfg.hub.format!r}: choose one of {', '.join(FORMATS)}")
    return cfg
