"""The training loop: features -> batches -> DeepSpeed engine -> checkpoints -> exported head.

    trainer = Trainer(cfg, target)   # process group, features (a store, or the live target), frozen matrices, engine, resume
    result = trainer.fit()   # train, evaluate, checkpoint, export output_dir/head

What the loop trains and from where is decided outside it: where the features come from
(train/feature_source.py: a store, or the target online), the head's shape (train/head_config.py),
its starting weights (train/head_init.py), the draft vocabulary (train/vocab_choice.py), the losses
(train/loss.py) and the batches (train/data.py).

Evaluation: held-out loss and top-k every `eval_every` steps, and τ by real decoding of
held-back prompts every `tau_every` steps (train/judge.py; rank 0 decodes); both at the end.

Resume (train/checkpoints.py): the batch plan and the input noise depend only on (seed,
micro-step), so a resumed run sees the same batches and the same noise as an uninterrupted one.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

import train.metrics as stats
from eagle.common import distributed
from data_prep.data_config import TargetFiles, prep_config, resolve
from data_prep.prompt_sets import held_back_prompts
from eagle.heads.checkpoint import load_head, resolve_head_dir
from eagle.targets.resolve import local_device
from eagle.heads.draft_vocab import draft_vocab_size
from train.checkpoints import check_resumable, resume_from, save_checkpoint, step_tag
from train.cross_precision import load_checkpoint
from train.data import Batch, BatchPlan, length_batches, loader, loader_settings, split_indices
from train.engine import build_engine, compute_dtype, ds_config, full_state_dict, init_distributed, on_device
from train.export import CardInfo, export_head
from train.feature_source import open_features
from train.frozen import Frozen, frozen_of, load_frozen
from train.head_config import draft_config
from train.head_init import freeze_lm_head, initial_head, lm_head_is_targets, start_from_target
from train.judge import Judge, judge_wanted
from train.output_layout import output_layout, use_layout
from train.loss import LossOutput, Pairs, eagle3_loss, eagle_loss, make_pairs, summarize, uniform_noise, vocab_target
from train.stages import read_stages
from train.tracking import Tracker, code_version
from train.unroll import unrolled_forward
from train.vocab_choice import TrainingVocabulary, token_counts

log = logging.getLogger("train")
CHECKPOINTS = "checkpoints"
WINDOW_ONLY = ("tokens_per_s", "pairs", "seconds")  # logged per window (metrics.jsonl), not model-card figures
HEAD = "head"
EPOCHS = "epochs"  # train.export_epochs: epochs/epochN/head


@dataclass
class FitResult:
    step: int
    stopped: bool  # True when train.stop_after ended the run early (no export)
    train_metrics: dict[str, float] = field(default_factory=dict)
    eval_metrics: dict[str, float] = field(default_factory=dict)  # on rank 0 with tau_* when tau_every > 0
    head_dir: Path | None = None
    tau_history: list[dict[str, float]] = field(default_factory=list)  # rank 0: {"step", "tau_tree", ...} each time


class Trainer:
    """One training run of a draft head, on every rank of the process group."""

    def __init__(self, cfg: DictConfig, target: TargetFiles | None = None):
        """`target`: the job's resolved target (train/run.py); resolved here when None."""
        self.cfg, t = cfg, cfg.train
        prep = prep_config(cfg)
        self.rank, self.world = init_distributed()
        self.output_dir = Path(cfg.output_dir)
        use_layout(cfg, output_layout(self.output_dir))  # shared, or one folder per node: ranks resume alike
        self.ckpt_dir = self.output_dir / CHECKPOINTS
        self.target = target or resolve(prep.model)
        self.target_dir = self.target.folder
        self.device = local_device()  # DeepSpeed places the head on the same accelerator (online: the target too)
        self.features = open_features(cfg, prep, self.target, self.device)
        self.records = self.features.records  # FeatureStore | TokenRecords: the same records either way
        start_dir = resolve_head_dir(t.init_head) if t.init_head else None  # fine-tuning's start; a Hub id fetched once
        start = load_head(start_dir, dtype=torch.float32) if start_dir else None
        self.earlier_stages = read_stages(start_dir) if start_dir else []  # its training.json
        self.start_vocab = None if start is None or start.draft_ids is None else start.draft_ids.numel()
        self.code_version = code_version()  # the code that runs: the tree may move on during a long run
        self.ds_conf = on_device(ds_config(cfg), self.device)
        self.dtype = compute_dtype(self.ds_conf)
        self.frozen: Frozen = self._frozen()
        widen = start is not None and lm_head_is_targets(start, self.frozen.lm_head)
        self.draft_config = draft_config(self.target_dir, cfg, start, widen)
        self.eagle3 = self.draft_config.architecture == "eagle3"
        self.features.check(self.draft_config, str(cfg.model.path))
        self.lengths = self.records.lengths()
        self.train_idx, self.eval_idx = split_indices(self.lengths, t.eval_fraction, cfg.seed)
        counts = token_counts(self.records, self.train_idx, self.draft_config.vocab_size)  # [V]
        size = draft_vocab_size(t.draft_vocab, self.draft_config.vocab_size)  # large vocabularies: 32k by default
        self.vocab = TrainingVocabulary.choose(counts, size, self.eagle3, self.draft_config.draft_vocab_size,
                                               None if start is None else start.draft_ids, t.keep_init_vocab)
        self.loss_lm_head = self.vocab.loss_rows(self.frozen.lm_head)  # [Vd, H] of the EAGLE-1/2 token loss
        self.loss_vocab = self.vocab.eagle3_target(self.draft_config.vocab_size, self.device)  # EAGLE-3 token loss
        self.plan = BatchPlan(self.train_idx, self.lengths, t.batch_tokens, cfg.seed, self.rank, self.world)
        self.steps_per_epoch = max(1, self.plan.per_epoch // t.grad_accum)
        self.total_steps = int(t.max_steps or t.epochs * self.steps_per_epoch)
        torch.manual_seed(cfg.seed)
        head = initial_head(self.draft_config, start, t.init_head, self.loss_lm_head)
        if self.eagle3 and t.init_lm_head and start is None:
            start_from_target(head, self.loss_lm_head, self.frozen.norm)
        if t.freeze_lm_head:
            freeze_lm_head(head, t.init_lm_head or start is not None)
        self.engine = build_engine(head, cfg, self.ds_conf, self.total_steps, self.world)
        self.step = 0  # optimizer steps done
        self.wandb_id: str | None = None
        self.step_times: list[tuple[int, float]] = []  # (pairs on this rank, seconds) per step
        self._saved_step = -1
        self.judging = judge_wanted(t.tau_every, t.tau_min_steps, self.total_steps)  # says so when skipped
        self.judge: Judge | None = self._judge() if self.judging and self.rank == 0 else None
        self.tau_history: list[dict[str, float]] = []
        self._maybe_resume()

    def _frozen(self) -> Frozen:
        """embed/lm_head/norm in the compute dtype: online, the live target's own tensors when its dtype is
        that one (no second copy); else read from the weight files."""
        target = self.features.target
        if target is not None and target.get_input_embeddings().weight.dtype == self.dtype:
            return frozen_of(target, self.dtype)
        return load_frozen(self.target_dir, self.dtype).to(self.device)

    def planned_batches(self, first_step: int, steps: int) -> Iterator[list[int]]:
        """The micro-batches (record indices) `fit` feeds optimizer steps first_step .. first_step+steps-1."""
        ga = self.cfg.train.grad_accum
        return islice(self.plan.from_step(first_step * ga), steps * ga)

    # ---------------------------------------------------------------- steps

    def pairs(self, batch: Batch) -> Pairs:
        """The batch's training pairs (online: after the target's forward); an EAGLE-3 head reads the extra layers."""
        batch = self.features.fill(batch.to(self.device))
        return make_pairs(batch.input_ids, batch.loss_mask, batch.hidden, batch.aux if self.eagle3 else None)

    def losses(self, preds: list[torch.Tensor], p: Pairs, full_vocab: bool = False, head=None) -> list[LossOutput]:
        """One loss per unrolled pass (pass i skips the first i positions, which have no draft chain);
        only the first pass's has metrics (sums), the pass `micro_step` reports.

        EAGLE-1/2: feature + token loss, the token term over the draft vocabulary's lm_head rows
        (full_vocab: over all rows, for honest held-out top-k). EAGLE-3: the token loss against
        the target's distribution restricted to the head's vocabulary, scored by `head` (default: the engine,
        whose forward gathers ZeRO-3's partitioned weights)."""
        t = self.cfg.train
        if not self.eagle3:
            lm_head = self.frozen.lm_head if full_vocab else self.loss_lm_head
            dist = vocab_target(p.target, p.mask, lm_head, None, None)  # the passes share the target's side
            return [eagle_loss(pred, p.target, p.mask, lm_head, t.v_w, t.p_w, t.topk, step=i, dist=dist,
                               objective=t.token_loss, metrics=i == 0) for i, pred in enumerate(preds)]
        ids, member = self.loss_vocab or (None, None)
        target = vocab_target(p.target, p.mask, self.frozen.lm_head, ids, member)
        head = head or self.engine

        def logits_of(states):  # [N, H] -> [N, Vd]
            return head(states, logits_only=True)

        return [eagle3_loss(logits_of, pred, p.mask, target, i, ids, t.topk, t.token_loss, metrics=i == 0)
                for i, pred in enumerate(preds)]

    def micro_step(self, batch: Batch, micro: int) -> LossOutput:
        """Forward, loss and backward of one micro-batch; the engine steps at accumulation boundaries."""
        t = self.cfg.train
        p = self.pairs(batch)
        gen = torch.Generator(device=self.device).manual_seed(_noise_seed(self.cfg.seed, micro, self.rank))
        features = uniform_noise(p.features, t.noise, t.noise_ref_len, gen).to(self.dtype)  # [B, S-1, H or 3H]
        embeds = self.frozen.embed_tokens(p.next_ids)  # [B, S-1, H]
        preds = unrolled_forward(self.engine, features, embeds, p.position_ids, t.ttt_steps, t.ttt_detach)
        outs = self.losses(preds, p)  # ttt_steps x
        self.engine.backward(sum(t.ttt_decay ** i * o.loss for i, o in enumerate(outs)))
        self.engine.step()
        return outs[0]  # metrics: the plain (depth-1) pass, comparable across recipes

    def fit(self) -> FitResult:
        """Train to total_steps (or stop_after), then evaluate, checkpoint and export."""
        t = self.cfg.train
        ga = t.grad_accum
        tracker = self._tracker()
        batches = self.planned_batches(self.step, max(0, self.total_steps - self.step))
        bar = _progress(self.total_steps, self.step, enabled=t.progress and self.rank == 0)
        window = stats.zeros(self.device)
        train_metrics: dict[str, float] = {}
        micro, window_start, step_start = self.step * ga, time.perf_counter(), time.perf_counter()
        step_pairs = 0
        self.engine.train()
        online = self.features.target is not None
        for batch in loader(self.records, batches, *loader_settings(t.num_workers, self.device, online)):
            out = self.micro_step(batch, micro)
            micro += 1
            step_pairs += batch.num_pairs
            stats.accumulate(window, out.sums, batch.num_pairs)
            if micro % ga:
                continue
            self.step += 1
            now = time.perf_counter()
            self.step_times.append((step_pairs, now - step_start))
            step_start, step_pairs = now, 0
            bar.update(1)
            if self.step % t.log_every == 0 or self.step == self.total_steps:
                train_metrics = self._log_window(window, now - window_start, bar, tracker)
                window, window_start = stats.zeros(self.device), time.perf_counter()
            if self.step < self.total_steps:
                self._evaluate_due(tracker, train_metrics)  # before the save: a kill in an epoch's export redoes it
            if t.save_every and self.step % t.save_every == 0:
                self.save()
            if t.stop_after and self.step >= t.stop_after and self.step < self.total_steps:
                if self._saved_step != self.step:
                    self.save()
                bar.close()
                tracker.finish()
                return FitResult(self.step, True, train_metrics, tau_history=self.tau_history)
        bar.close()
        if self._saved_step != self.step:
            self.save()
        eval_metrics = self.evaluate()
        if self.judging:
            eval_metrics.update(self.acceptance())
        self._log_eval(tracker, eval_metrics)
        head_dir = self.export(train_metrics, eval_metrics)
        tracker.finish({f"eval/{k}": v for k, v in eval_metrics.items()})
        return FitResult(self.step, False, train_metrics, eval_metrics, head_dir, self.tau_history)

    def _evaluate_due(self, tracker: Tracker, train_metrics: dict) -> None:
        """Held-out metrics and/or τ when this step is a multiple of eval_every / tau_every: one log line.
        With train.export_epochs, at the end of every epoch but the last both, and a head with them in
        output_dir/epochs/epochN, so τ per epoch can be judged afterwards
        (by vLLM: python -m evaluation.acceptance --heads e1=RUN/epochs/epoch1/head,...)."""
        t = self.cfg.train
        epoch_end = t.export_epochs and self.step % self.steps_per_epoch == 0
        metrics: dict[str, float] = {}
        if epoch_end or (t.eval_every and self.step % t.eval_every == 0):
            metrics.update(self.evaluate())
        if self.judging and (epoch_end or self.step % t.tau_every == 0):
            metrics.update(self.acceptance())
        if metrics:
            self._log_eval(tracker, metrics)
        if epoch_end:
            self.export(train_metrics, metrics, self.output_dir / EPOCHS / f"epoch{self.step // self.steps_per_epoch}")

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Held-out metrics (no noise), summed over all ranks. Every rank runs as many forwards."""
        t = self.cfg.train
        batches = length_batches(self.eval_idx, self.lengths, t.batch_tokens, seed=None)
        if not batches:
            return {}
        per_rank = -(-len(batches) // self.world)
        if t.eval_max_batches:
            per_rank = min(per_rank, t.eval_max_batches)
        mine = batches[self.rank::self.world][:per_rank]
        real = len(mine)
        mine += [batches[0]] * (per_rank - real)  # ZeRO-3 gathers are collective: keep ranks in step
        sums = stats.zeros(self.device)
        self.engine.eval()
        for i, batch in enumerate(loader(self.records, mine)):
            p = self.pairs(batch)
            pred, _ = self.engine(p.features.to(self.dtype), self.frozen.embed_tokens(p.next_ids), p.position_ids)
            out = self.losses([pred], p, full_vocab=True)[0]
            if i < real:
                stats.accumulate(sums, out.sums, batch.num_pairs)
        self.engine.train()
        sums = stats.all_reduce(sums)
        return summarize(sums, t.topk)

    def acceptance(self) -> dict[str, float]:
        """τ of the current weights by greedy decoding on rank 0 ({} elsewhere). Collective (ZeRO-3
        gathers on all ranks); leaves the engine's mode and the global RNG state as they were."""
        state = full_state_dict(self.engine)
        metrics: dict[str, float] = {}
        if self.rank == 0:
            metrics = self.judge.measure_state(state, self.draft_config, self.vocab.stored()).metrics()
            self.tau_history.append({"step": self.step, **metrics})
        distributed.barrier("rank 0's τ measurement")  # the others wait here (long timeout), not in the next all-reduce
        return metrics

    def _judge(self) -> Judge:
        """Prompts tokenized now (bad settings fail before training); the target loads on first use."""
        t, m = self.cfg.train, self.cfg.model
        texts = held_back_prompts(t.tau_prompts, t.tau_num_prompts)
        dtype = getattr(torch, m.get("dtype") or "bfloat16")
        return Judge.from_target_dir(self.target_dir, texts, t.tau_max_new_tokens, dtype, m.get("chat_template"),
                                     self.device, target=self.features.target,  # online: the target already loaded
                                     tokenizer=lambda: self.target.tokenizer)  # the job's, loaded once

    # ---------------------------------------------------------------- checkpoints

    def save(self) -> Path:
        """DeepSpeed checkpoint of this step (all ranks), then prune to train.keep_last."""
        tag = step_tag(self.step)
        state = {"step": self.step, "micro_step": self.step * self.cfg.train.grad_accum,
                 "world_size": self.world, "seed": self.cfg.seed, "wandb_id": self.wandb_id,
                 "store": self._store_identity()}
        save_checkpoint(self.engine, self.ckpt_dir, tag, state, self.cfg.train.keep_last)  # `latest` once whole
        self._saved_step = self.step
        return self.ckpt_dir / tag

    def _store_identity(self) -> str:
        """What a checkpoint remembers of its data: the store's folder name (data, limit, regeneration,
        length and layers) and its record count. A moved store keeps it; another selection does not.
        Online and offline runs of one selection read the same records, so a run may switch between them."""
        return f"{Path(str(self.cfg.store_dir)).name} ({len(self.records)} records)"

    def _maybe_resume(self) -> None:
        where = resume_from(str(self.cfg.train.resume), self.ckpt_dir)
        if where is None:
            return
        load_dir, tag = where
        load_path, client = load_checkpoint(self.engine, str(load_dir), tag)
        if load_path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint to resume in {load_dir} (tag {tag})")
        check_resumable(load_path, client, self.world, self._store_identity())
        self.step = self._saved_step = int(client["step"])
        self.wandb_id = client.get("wandb_id")
        if self.rank == 0:
            log.info("resumed %s at step %d", load_path, self.step)

    def export(self, train_metrics: dict, eval_metrics: dict, where: Path | None = None) -> Path | None:
        """Write where/head (default output_dir/head: EAGLE layout + model card) from the full weights;
        rank 0 writes. Collective."""
        state = full_state_dict(self.engine)  # collective under ZeRO-3
        head_dir = (where or self.output_dir) / HEAD
        if self.rank == 0:
            export_head(head_dir, state, self.draft_config, self.card_info(train_metrics, eval_metrics),
                        getattr(torch, self.cfg.train.export_dtype),
                        self.vocab.stored(), self.cfg.hub.repo_id)
        distributed.barrier("rank 0's export of the head")
        return head_dir

    def card_info(self, train_metrics: dict, eval_metrics: dict) -> CardInfo:
        metrics = {f"eval_{k}": v for k, v in eval_metrics.items()}
        metrics.update({f"train_{k}": v for k, v in train_metrics.items() if k not in WINDOW_ONLY})
        return CardInfo(
            target=str(self.cfg.model.path), target_name=str(self.cfg.model.name),
            data=f"{self.cfg.data.name} ({self.features.describe()})",
            store_records=len(self.records), store_tokens=self.features.tokens,
            steps=self.step, epochs=self.step / self.steps_per_epoch, metrics=metrics,
            config=OmegaConf.to_container(self.cfg.train, resolve=True), code_version=self.code_version,
            head_layers=self.draft_config.num_hidden_layers,
            draft_vocab=None if self.vocab.stored() is None else self.vocab.stored().numel(),
            vocab_coverage=self.vocab.coverage, earlier=self.earlier_stages, start_vocab=self.start_vocab,
        )

    # ---------------------------------------------------------------- logging

    def _log_window(self, window: dict, seconds: float, bar, tracker: Tracker) -> dict[str, float]:
        sums = stats.all_reduce(window)
        metrics = summarize(sums, self.cfg.train.topk)
        metrics["tokens_per_s"] = float(sums["pairs"]) / max(seconds, 1e-9)
        metrics["pairs"], metrics["seconds"] = float(sums["pairs"]), seconds  # the window's, summable over a run
        metrics["lr"] = float(self.engine.get_lr()[0])
        if self.rank == 0:
            loss = metrics.get("token_loss" if self.eagle3 else "feature_loss", 0)
            bar.set_postfix(loss=f"{loss:.4f}", top1=f"{metrics.get('top1', 0):.3f}",
                            tok_s=f"{metrics['tokens_per_s']:.0f}", refresh=False)
        tracker.log({f"train/{k}": v for k, v in metrics.items()}, self.step)
        return metrics

    def _log_eval(self, tracker: Tracker, metrics: dict[str, float]) -> None:
        """Held-out metrics to W&B and, on rank 0, as one console line."""
        tracker.log({f"eval/{k}": v for k, v in metrics.items()}, self.step)
        if self.rank == 0:
            tqdm.write(f"eval @ step {self.step}: " + ", ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items())))

    def _tracker(self) -> Tracker:
        tracker = Tracker.start(self.cfg, self.output_dir, self.rank, self.world, self.wandb_id)
        self.wandb_id = tracker.id or self.wandb_id
        return tracker


def _noise_seed(seed: int, micro: int, rank: int) -> int:
    return (seed * 1_000_003 + micro) * 257 + rank


def _progress(total: int, initial: int, enabled: bool):
    return tqdm(total=total, initial=initial, disable=not enabled, unit="step", dynamic_ncols=True,
                file=sys.stderr, desc="train")
