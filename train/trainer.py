"""The training loop: store -> batches -> DeepSpeed engine -> checkpoints -> exported head.

    trainer = Trainer(cfg)   # process group, store, frozen target matrices, engine, resume
    result = trainer.fit()   # train, evaluate, checkpoint, export output_dir/head

Evaluation: held-out loss and top-k every `eval_every` steps, and τ by real decoding of
held-back prompts every `tau_every` steps (train.acceptance; rank 0 decodes); both at the end.

Resume: every `save_every` steps (and at the end) a DeepSpeed checkpoint goes to
output_dir/checkpoints/stepNNNNNNNN with the step in its client state. The batch plan and
the input noise depend only on (seed, micro-step), so a resumed run sees the same batches
and the same noise as an uninterrupted one.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from data_prep.store import FeatureStore
from eagle.checkpoint import Head, build_head, load_head, resolve_head_dir, top_up, vocab_tensors
from eagle.draft import DraftConfig
from eagle.targets import local_device
from train.acceptance import Judge, held_back_prompts
from train.data import Batch, BatchPlan, length_batches, loader, split_indices
from train.engine import build_engine, compute_dtype, ds_config, full_state_dict, init_distributed
from train.export import CardInfo, export_head, model_card
from train.frozen import Frozen, load_frozen
from train.loss import (LossOutput, Pairs, eagle3_loss, eagle_loss, make_pairs, summarize, uniform_noise,
                        vocab_target)
from train.unroll import unrolled_forward
from train.vocab import draft_ids, token_counts

log = logging.getLogger("train")
CHECKPOINTS = "checkpoints"
HEAD = "head"
STAT_KEYS = ("n", "feature", "token", "top1", "topk", "pairs")


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

    def __init__(self, cfg: DictConfig):
        self.cfg, t = cfg, cfg.train
        self.rank, self.world = init_distributed()
        self.output_dir = Path(cfg.output_dir)
        self.ckpt_dir = self.output_dir / CHECKPOINTS
        self.store = FeatureStore(cfg.store_dir)
        self.target_dir = _resolve_target(cfg.model.path)
        self.draft_config = _draft_config(self.target_dir, cfg)
        self.eagle3 = self.draft_config.architecture == "eagle3"
        _check_store(self.store, cfg, self.draft_config)
        self.ds_conf = ds_config(cfg)
        self.dtype = compute_dtype(self.ds_conf)
        self.device = local_device()  # DeepSpeed places the head on the same accelerator
        self.frozen: Frozen = load_frozen(self.target_dir, self.dtype).to(self.device)
        self.lengths = self.store.lengths()
        self.train_idx, self.eval_idx = split_indices(self.lengths, t.eval_fraction, cfg.seed)
        self.token_counts = token_counts(self.store, self.train_idx, self.draft_config.vocab_size)  # [V]
        start = load_head(t.init_head, dtype=torch.float32) if t.init_head else None  # fine-tuning's starting head
        if self.eagle3:  # exactly the lm_head's rows, or None for the whole vocabulary
            vd = self.draft_config.draft_vocab_size
            self.vocab_ids = draft_ids(self.token_counts, vd, seen_only=False) if vd < self.draft_config.vocab_size else None
            # (draft ids [Vd], membership [V] bool) on the device, for the EAGLE-3 token loss
            self.loss_vocab = None if self.vocab_ids is None else (
                self.vocab_ids.to(self.device),
                vocab_tensors(self.vocab_ids, self.draft_config.vocab_size)["t2d"].to(self.device))
        else:
            # [seen] target ids, most frequent first, topped up from the starting head's vocabulary
            # (keep_vocab: the starting head's, topped up from the store's)
            seen = draft_ids(self.token_counts)
            kept = start.draft_ids if start is not None else None
            if t.keep_vocab and kept is not None:
                self.vocab_ids = top_up(kept, seen, t.draft_vocab)
                log.info("draft vocabulary: train.init_head's %d tokens (train.keep_vocab)", kept.numel())
            else:
                self.vocab_ids = top_up(seen, kept, t.draft_vocab)
                if self.vocab_ids.numel() > seen.numel():
                    log.info("draft vocabulary: the store sees %d tokens; %d more come from train.init_head",
                             seen.numel(), self.vocab_ids.numel() - seen.numel())
        self.loss_lm_head = self._loss_lm_head(t.draft_vocab)  # [Vd, H] rows the EAGLE-1/2 token loss uses
        self.plan = BatchPlan(self.train_idx, self.lengths, t.batch_tokens, cfg.seed, self.rank, self.world)
        self.steps_per_epoch = max(1, self.plan.per_epoch // t.grad_accum)
        self.total_steps = int(t.max_steps or t.epochs * self.steps_per_epoch)
        torch.manual_seed(cfg.seed)
        head = self._initial_head(start)
        self.engine = build_engine(head, cfg, self.total_steps, new_parameters(head, start, t.new_lr))
        self.step = 0  # optimizer steps done
        self.wandb_id: str | None = None
        self.step_times: list[tuple[int, float]] = []  # (pairs on this rank, seconds) per step
        self.record_batches = False  # throughput measurement: keep the micro-batches seen
        self.seen_batches: list[list[int]] = []
        self._saved_step = -1
        self.judge: Judge | None = self._judge() if t.tau_every and self.rank == 0 else None
        self.tau_history: list[dict[str, float]] = []
        self._maybe_resume()

    def _loss_lm_head(self, size: int | None) -> torch.Tensor:
        """The frozen lm_head, or its rows of the `size` most frequent training tokens (EAGLE-3's
        reduced vocabulary: the token loss and its softmax run over these rows only). [Vd, H]"""
        if not size or self.vocab_ids is None:
            return self.frozen.lm_head
        counts = self.token_counts.double()
        share = float(counts[self.vocab_ids[:size]].sum() / counts.sum().clamp(min=1))  # the vocabulary used, not the top-N
        log.info("draft vocabulary: %d tokens cover %.4f of the training tokens", size, share)
        return self.frozen.lm_head[self.vocab_ids[:size].to(self.device)].contiguous()

    def _initial_head(self, start: Head | None) -> Head:
        """A fresh head, or one starting from an exported head's weights (fine-tuning; resume wins over
        both). train.init_lm_head: a fresh EAGLE-3 head's lm_head starts as the target's rows of its draft
        vocabulary and its final norm as the target's, so its output space is the target's from step 0."""
        t = self.cfg.train
        head = _initial_head(self.draft_config, start, t.init_head)
        if self.eagle3 and t.init_lm_head and not t.init_head:
            with torch.no_grad():  # loss_lm_head: the target's rows of exactly these draft ids
                head.lm_head.weight.copy_(self.loss_lm_head.float())
                if self.frozen.norm is not None:
                    head.norm.weight.copy_(self.frozen.norm.float())
            log.info("EAGLE-3 lm_head and norm start from the target's")
        return head

    # ---------------------------------------------------------------- steps

    def pairs(self, batch: Batch) -> Pairs:
        """The batch's training pairs; an EAGLE-3 head reads the stored extra layers."""
        batch = batch.to(self.device)
        return make_pairs(batch.input_ids, batch.loss_mask, batch.hidden, batch.aux if self.eagle3 else None)

    def losses(self, preds: list[torch.Tensor], p: Pairs, full_vocab: bool = False, head=None) -> list[LossOutput]:
        """One loss per unrolled pass (pass i skips the first i positions, which have no draft chain).

        EAGLE-1/2: feature + token loss, the token term over the draft vocabulary's lm_head rows
        (full_vocab: over all rows, for honest held-out top-k). EAGLE-3: the token loss against
        the target's distribution restricted to the head's vocabulary, scored by `head` (default: the engine's)."""
        t = self.cfg.train
        if not self.eagle3:
            lm_head = self.frozen.lm_head if full_vocab else self.loss_lm_head
            dist = vocab_target(p.target, p.mask, lm_head, None, None)  # the passes share the target's side
            return [eagle_loss(pred, p.target, p.mask, lm_head, t.v_w, t.p_w, t.topk, step=i, dist=dist)
                    for i, pred in enumerate(preds)]
        ids, member = self.loss_vocab or (None, None)
        target = vocab_target(p.target, p.mask, self.frozen.lm_head, ids, member)
        head = head or self.engine.module
        return [eagle3_loss(head.logits, pred, p.mask, target, i, ids, t.topk) for i, pred in enumerate(preds)]

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
        wb = self._wandb_start()
        remaining = max(0, self.total_steps - self.step)
        batches = islice(self.plan.from_step(self.step * ga), remaining * ga)
        if self.record_batches:
            batches = _recording(batches, self.seen_batches)
        bar = _progress(self.total_steps, self.step, enabled=t.progress and self.rank == 0)
        window = _zeros()
        train_metrics: dict[str, float] = {}
        micro, window_start, step_start = self.step * ga, time.perf_counter(), time.perf_counter()
        step_pairs = 0
        self.engine.train()
        for batch in loader(self.store, batches, t.num_workers):
            out = self.micro_step(batch, micro)
            micro += 1
            step_pairs += batch.num_pairs
            _accumulate(window, out.sums, batch.num_pairs)
            if micro % ga:
                continue
            self.step += 1
            now = time.perf_counter()
            self.step_times.append((step_pairs, now - step_start))
            step_start, step_pairs = now, 0
            bar.update(1)
            if self.step % t.log_every == 0 or self.step == self.total_steps:
                train_metrics = self._log_window(window, now - window_start, bar, wb)
                window, window_start = _zeros(), time.perf_counter()
            if self.step < self.total_steps:
                self._evaluate_due(wb)
            if t.save_every and self.step % t.save_every == 0:
                self.save()
            if t.stop_after and self.step >= t.stop_after and self.step < self.total_steps:
                if self._saved_step != self.step:
                    self.save()
                bar.close()
                self._wandb_finish(wb)
                return FitResult(self.step, True, train_metrics, tau_history=self.tau_history)
        bar.close()
        if self._saved_step != self.step:
            self.save()
        eval_metrics = self.evaluate()
        if t.tau_every:
            eval_metrics.update(self.acceptance())
        self._log_eval(wb, eval_metrics)
        head_dir = self.export(train_metrics, eval_metrics)
        self._wandb_finish(wb, eval_metrics)
        return FitResult(self.step, False, train_metrics, eval_metrics, head_dir, self.tau_history)

    def _evaluate_due(self, wb) -> None:
        """Held-out metrics and/or τ when this step is a multiple of eval_every / tau_every: one log line."""
        t = self.cfg.train
        metrics: dict[str, float] = {}
        if t.eval_every and self.step % t.eval_every == 0:
            metrics.update(self.evaluate())
        if t.tau_every and self.step % t.tau_every == 0:
            metrics.update(self.acceptance())
        if metrics:
            self._log_eval(wb, metrics)

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
        sums = _zeros()
        self.engine.eval()
        for i, batch in enumerate(loader(self.store, mine)):
            p = self.pairs(batch)
            pred, _ = self.engine(p.features.to(self.dtype), self.frozen.embed_tokens(p.next_ids), p.position_ids)
            out = self.losses([pred], p, full_vocab=True)[0]
            if i < real:
                _accumulate(sums, out.sums, batch.num_pairs)
        self.engine.train()
        sums = _all_reduce(sums)
        return summarize(sums, t.topk)

    def acceptance(self) -> dict[str, float]:
        """τ of the current weights by greedy decoding on rank 0 ({} elsewhere). Collective (ZeRO-3
        gathers on all ranks); leaves the engine's mode and the global RNG state as they were."""
        state = full_state_dict(self.engine)
        metrics: dict[str, float] = {}
        if self.rank == 0:
            metrics = self.judge.measure_state(state, self.draft_config, self.export_vocab()).metrics()
            self.tau_history.append({"step": self.step, **metrics})
        dist.barrier()  # the other ranks wait here, not inside the next step's all-reduce
        return metrics

    def _judge(self) -> Judge:
        """Prompts tokenized now (bad settings fail before training); the target loads on first use."""
        t, m = self.cfg.train, self.cfg.model
        texts = held_back_prompts(t.tau_prompts, t.tau_num_prompts)
        dtype = getattr(torch, m.get("dtype") or "bfloat16")
        return Judge.from_target_dir(self.target_dir, texts, t.tau_max_new_tokens, dtype, m.get("chat_template"),
                                     self.device)

    # ---------------------------------------------------------------- checkpoints

    def save(self) -> Path:
        """DeepSpeed checkpoint of this step (all ranks), then prune to train.keep_last."""
        tag = f"step{self.step:08d}"
        state = {"step": self.step, "micro_step": self.step * self.cfg.train.grad_accum,
                 "world_size": self.world, "seed": self.cfg.seed, "wandb_id": self.wandb_id,
                 "store": self._store_identity()}
        self.engine.save_checkpoint(str(self.ckpt_dir), tag=tag, client_state=state)
        self._saved_step = self.step
        if self.rank == 0:
            prune_checkpoints(self.ckpt_dir, self.cfg.train.keep_last)
        dist.barrier()
        return self.ckpt_dir / tag

    def _store_identity(self) -> str:
        """What a checkpoint remembers of its data: the store's folder name (data, limit, regeneration,
        length and layers) and its record count. A moved store keeps it; another selection does not."""
        return f"{Path(str(self.cfg.store_dir)).name} ({len(self.store)} records)"

    def _maybe_resume(self) -> None:
        resume = str(self.cfg.train.resume)
        if resume == "none":
            return
        if resume == "auto":
            if not (self.ckpt_dir / "latest").exists():
                return
            load_dir, tag = self.ckpt_dir, None
        else:
            path = Path(resume)
            load_dir, tag = (path, None) if (path / "latest").exists() else (path.parent, path.name)
        load_path, client = self.engine.load_checkpoint(str(load_dir), tag=tag)
        if load_path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint to resume in {load_dir} (tag {tag})")
        if client.get("world_size", self.world) != self.world:
            raise ValueError(f"{load_path}: saved with {client['world_size']} ranks, resuming with {self.world}: "
                             "the data order would differ")
        saved_store = client.get("store")  # absent in checkpoints written before session 6
        if saved_store is not None and saved_store != self._store_identity():
            raise ValueError(f"{load_path}: trained on store {saved_store}, but this run reads "
                             f"{self._store_identity()}: pick a new output_dir, or train.resume=none to start over")
        self.step = self._saved_step = int(client["step"])
        self.wandb_id = client.get("wandb_id")
        if self.rank == 0:
            log.info("resumed %s at step %d", load_path, self.step)

    def export(self, train_metrics: dict, eval_metrics: dict) -> Path | None:
        """Write output_dir/head (EAGLE layout + model card) from the full weights; rank 0 writes."""
        state = full_state_dict(self.engine)  # collective under ZeRO-3
        head_dir = self.output_dir / HEAD
        if self.rank == 0:
            card = model_card(self.card_info(train_metrics, eval_metrics), self.cfg.hub.repo_id)
            export_head(head_dir, state, self.draft_config, card, getattr(torch, self.cfg.train.export_dtype),
                        self.export_vocab())
        dist.barrier()
        return head_dir

    def export_vocab(self) -> torch.Tensor | None:
        """The draft vocabulary stored with the head: EAGLE-3, its lm_head's rows; EAGLE-1/2, the
        train.draft_vocab most frequent tokens (every seen token when unset, for `draft_vocab=N` later)."""
        if self.eagle3 or self.vocab_ids is None:
            return self.vocab_ids
        return self.vocab_ids[: self.cfg.train.draft_vocab or None]

    def card_info(self, train_metrics: dict, eval_metrics: dict) -> CardInfo:
        m = self.store.manifest
        metrics = {f"eval_{k}": v for k, v in eval_metrics.items()}
        metrics.update({f"train_{k}": v for k, v in train_metrics.items() if k != "tokens_per_s"})
        return CardInfo(
            target=str(self.cfg.model.path), target_name=str(self.cfg.model.name),
            data=f"{self.cfg.data.name} ({self.cfg.store_dir})",
            store_records=int(m.get("records", len(self.store))), store_tokens=int(m.get("tokens", 0)),
            steps=self.step, epochs=self.step / self.steps_per_epoch, metrics=metrics,
            config={**OmegaConf.to_container(self.cfg.train, resolve=True),
                    "head_layers": self.draft_config.num_hidden_layers},  # null resolved: init_head's depth
            code_version=code_version(),
        )

    # ---------------------------------------------------------------- logging

    def _log_window(self, window: dict, seconds: float, bar, wb) -> dict[str, float]:
        sums = _all_reduce(window)
        metrics = summarize(sums, self.cfg.train.topk)
        metrics["tokens_per_s"] = float(sums["pairs"]) / max(seconds, 1e-9)
        metrics["lr"] = float(self.engine.get_lr()[0])
        if self.rank == 0:
            loss = metrics.get("token_loss" if self.eagle3 else "feature_loss", 0)
            bar.set_postfix(loss=f"{loss:.4f}", top1=f"{metrics.get('top1', 0):.3f}",
                            tok_s=f"{metrics['tokens_per_s']:.0f}", refresh=False)
        self._log(wb, {f"train/{k}": v for k, v in metrics.items()})
        return metrics

    def _log_eval(self, wb, metrics: dict[str, float]) -> None:
        """Held-out metrics to W&B and, on rank 0, as one console line."""
        self._log(wb, {f"eval/{k}": v for k, v in metrics.items()})
        if self.rank == 0:
            tqdm.write(f"eval @ step {self.step}: " + ", ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items())))

    def _log(self, wb, metrics: dict) -> None:
        if wb is not None and metrics:
            wb.log(metrics, step=self.step)

    def _wandb_start(self):
        """wandb run on rank 0 (None elsewhere or when disabled); files under output_dir."""
        if self.rank != 0:
            return None
        w = self.cfg.wandb
        mode = w.mode or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        if mode == "disabled":
            return None
        import wandb

        self.output_dir.mkdir(parents=True, exist_ok=True)
        config = OmegaConf.to_container(self.cfg, resolve=True)
        config["code_version"] = code_version()
        config["world_size"] = self.world
        run = wandb.init(
            project=w.project, entity=w.entity, name=w.name, tags=list(w.tags), mode=mode,
            dir=str(self.output_dir), config=config, id=self.wandb_id, resume="allow" if self.wandb_id else None,
        )
        self.wandb_id = run.id
        return run

    def _wandb_finish(self, wb, eval_metrics: dict | None = None) -> None:
        if wb is None:
            return
        for k, v in (eval_metrics or {}).items():
            wb.summary[f"eval/{k}"] = v
        wb.finish()


# -------------------------------------------------------------------- helpers


def _resolve_target(path: str) -> Path:
    from eagle.targets import resolve_target

    return resolve_target(path)


def _draft_config(target_dir: Path, cfg: DictConfig) -> DraftConfig:
    """The head's sizes from the target; EAGLE-3: its fused layers and draft vocabulary size."""
    from transformers import AutoConfig

    target_cfg = AutoConfig.from_pretrained(target_dir)
    kind = str(cfg.train.head)
    if kind not in ("eagle2", "eagle3"):
        raise ValueError(f"train.head={kind!r}: choose the head with head=eagle2 or head=eagle3")
    draft = DraftConfig.from_target_config(target_cfg, target=str(cfg.model.path), feature_layers=[-1])
    if cfg.train.get("head_mlp"):
        draft.intermediate_size = int(cfg.train.head_mlp)
    if cfg.train.get("head_layers"):
        draft.num_hidden_layers = int(cfg.train.head_layers)
    elif cfg.train.get("init_head") and kind == "eagle2":  # fine-tuning keeps the start's depth
        draft.num_hidden_layers = DraftConfig.from_json(resolve_head_dir(cfg.train.init_head) / "config.json").num_hidden_layers
    if kind == "eagle3":
        fused = [int(i) for i in cfg.model.feature_layers if int(i) != -1]
        if len(fused) < 2 or -1 not in list(cfg.model.feature_layers):
            raise ValueError(f"head=eagle3 needs model.feature_layers = its fused layers plus -1, got "
                             f"{list(cfg.model.feature_layers)}")
        size = cfg.train.draft_vocab or draft.vocab_size
        draft.architecture, draft.feature_layers, draft.fc_bias = "eagle3", fused, False
        draft.draft_vocab_size = min(int(size), draft.vocab_size)
    return draft


def _check_store(store: FeatureStore, cfg: DictConfig, draft: DraftConfig) -> None:
    """The store holds what this head reads: the same hidden size and, for EAGLE-3, its layers."""
    if store.hidden_size != draft.hidden_size:
        raise ValueError(f"{cfg.store_dir}: features have hidden size {store.hidden_size}, "
                         f"target {cfg.model.path} has {draft.hidden_size}")
    stored = list(store.manifest["target"].get("feature_layers", [-1]))
    if draft.architecture == "eagle3" and [i for i in stored if i != -1] != draft.feature_layers:
        raise ValueError(f"{cfg.store_dir}: the store holds layers {stored}, the EAGLE-3 head fuses "
                         f"{draft.feature_layers}: prepare a store with head=eagle3 (or matching model.feature_layers)")


def _noise_seed(seed: int, micro: int, rank: int) -> int:
    return (seed * 1_000_003 + micro) * 257 + rank


def _zeros() -> dict[str, torch.Tensor]:
    return {k: torch.zeros((), dtype=torch.float64) for k in STAT_KEYS}


def _accumulate(into: dict, sums: dict, pairs: int) -> None:
    for k, v in sums.items():
        into[k] += v
    into["pairs"] += pairs


def _all_reduce(sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    keys = sorted(sums)
    flat = torch.stack([sums[k] for k in keys])
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(flat)
    return dict(zip(keys, flat))


def _recording(batches, into: list):
    for b in batches:
        into.append(b)
        yield b


def _progress(total: int, initial: int, enabled: bool):
    return tqdm(total=total, initial=initial, disable=not enabled, unit="step", dynamic_ncols=True,
                file=sys.stderr, desc="train")


def prune_checkpoints(ckpt_dir: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` stepNNNNNNNN dirs (never the one `latest` names)."""
    if keep_last <= 0:
        return
    tags = sorted(p for p in ckpt_dir.glob("step*") if p.is_dir() and re.fullmatch(r"step\d+", p.name))
    latest_file = ckpt_dir / "latest"
    latest = latest_file.read_text().strip() if latest_file.exists() else None
    for p in tags[:-keep_last]:
        if p.name != latest:
            shutil.rmtree(p, ignore_errors=True)


def code_version() -> str:
    """git commit of the code (with '-dirty' when the tree has changes), or 'unknown'."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("-dirty" if dirty else "")


def _initial_head(config: DraftConfig, start: Head | None, init_head: str | None) -> Head:
    """A fresh head, or one starting from `start`, the exported head `init_head` (fine-tuning)."""
    head = build_head(config)
    if start is not None:
        if start.config.architecture != config.architecture:
            raise ValueError(f"train.init_head={init_head}: an {start.config.architecture} head cannot start "
                             f"an {config.architecture} run")
        if start.config.hidden_size != config.hidden_size or start.config.vocab_size != config.vocab_size:
            raise ValueError(f"train.init_head={init_head}: head for hidden {start.config.hidden_size} / vocab "
                             f"{start.config.vocab_size}, target has {config.hidden_size} / {config.vocab_size}")
        if start.config.intermediate_size > config.intermediate_size:
            raise ValueError(f"train.init_head={init_head}: its MLP has {start.config.intermediate_size} units, "
                             f"more than train.head_mlp={config.intermediate_size}; a head can only be widened")
        if start.config.num_hidden_layers > config.num_hidden_layers:
            raise ValueError(f"train.init_head={init_head}: it has {start.config.num_hidden_layers} decoder layers, "
                             f"more than train.head_layers={config.num_hidden_layers}; a head can only be deepened")
        fresh = head.state_dict()
        head.load_state_dict(deepen(widen_mlp(start.state_dict(), fresh), fresh))
        log.info("initialised the head from %s (MLP %d -> %d units, %d -> %d layers)", init_head,
                 start.config.intermediate_size, config.intermediate_size,
                 start.config.num_hidden_layers, config.num_hidden_layers)
    return head


def new_parameters(head: Head, start: Head | None, new_lr: float | None) -> frozenset[str]:
    """Names of `head`'s parameters that the starting head lacks (its deepened layers), which train
    at `new_lr`; empty without a starting head or a separate lr."""
    if start is None or new_lr is None:
        return frozenset()
    had = set(start.state_dict())
    new = frozenset(n for n, _ in head.named_parameters() if n not in had)
    log.info("%d parameter tensors are new to train.init_head (%s...): they train at lr %g",
             len(new), ", ".join(sorted(new)[:2]), new_lr)
    return new


def deepen(start: dict[str, torch.Tensor], fresh: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`start`'s weights plus the decoder layers only `fresh` has, each made the identity.

    A new layer keeps `fresh`'s random weights but zero `o_proj` and `down_proj`, so both of its
    residual branches add nothing: the deeper head computes exactly what `start` computed, and
    the new layer learns from the first step (the gradients of those two matrices are not zero)."""
    out = dict(start)
    for key, new in fresh.items():
        if key in start or not key.startswith("layers."):
            continue  # a key missing outside the layers is load_state_dict's to report
        zero = key.endswith(("self_attn.o_proj.weight", "self_attn.o_proj.bias", "mlp.down_proj.weight"))
        out[key] = torch.zeros_like(new) if zero else new
    return out


def widen_mlp(start: dict[str, torch.Tensor], fresh: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`start`'s weights in `fresh`'s shapes, for a head whose MLP has more units (Net2Net-style).

    The first units are `start`'s; the extra ones keep `fresh`'s random gate/up rows and get
    zero down_proj columns, so the widened head computes exactly what `start` computed and
    the extra units learn from the first step (their down_proj gradient is not zero).
    """
    out = dict(start)
    for key, new in fresh.items():
        old = start.get(key)
        if old is None or old.shape == new.shape:
            continue  # a missing key is load_state_dict's to report
        if key.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight")):  # [units, H]
            out[key] = torch.cat([old, new[old.shape[0]:].to(old.dtype)])
        elif key.endswith("mlp.down_proj.weight"):  # [H, units]
            out[key] = torch.cat([old, old.new_zeros(old.shape[0], new.shape[1] - old.shape[1])], dim=1)
        else:
            raise ValueError(f"{key}: shape {tuple(old.shape)} in init_head, {tuple(new.shape)} in this run's head")
    return out
