"""Unit tests of the trainer's pieces: loss, pairing, batching, split, schedule, configs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from data_prep.store import Record
from train.config import validate
from train.data import BatchPlan, collate, length_batches, split_indices
from train.engine import compute_dtype, ds_config, lr_lambda, on_device, schedule_span
from train.loss import (eagle3_loss, eagle_loss, make_pairs, pass_mask, summarize, token_objective, uniform_noise,
                        vocab_target)

CONF = Path(__file__).resolve().parent.parent / "conf"
MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
DEEPSPEED = sorted(p.stem for p in (CONF / "deepspeed").glob("*.yaml"))


def compose_train(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


# ------------------------------------------------------------------ loss


def test_loss_counts_only_masked_pairs():
    torch.manual_seed(0)
    pred, target = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    lm_head = torch.randn(11, 8)
    mask = torch.tensor([[1, 1, 0, 0, 0], [0, 0, 0, 1, 0]], dtype=torch.bool)
    out = eagle_loss(pred, target, mask, lm_head, v_w=1.0, p_w=0.1)
    # Changing unmasked positions changes nothing.
    pred2, target2 = pred.clone(), target.clone()
    pred2[~mask] = 100.0
    target2[~mask] = -100.0
    out2 = eagle_loss(pred2, target2, mask, lm_head, v_w=1.0, p_w=0.1)
    assert torch.allclose(out.loss, out2.loss)
    # Reference: explicit per-position computation, averaged over the 3 masked pairs.
    rows = mask.nonzero().tolist()
    f = torch.stack([F.smooth_l1_loss(pred[b, s], target[b, s]) for b, s in rows]).mean()
    p = torch.softmax(target @ lm_head.T, -1)
    logq = torch.log_softmax(pred @ lm_head.T, -1)
    ce = torch.stack([-(p[b, s] * logq[b, s]).sum() for b, s in rows]).mean()
    assert torch.allclose(out.feature_loss, f, atol=1e-6)
    assert torch.allclose(out.token_loss, ce, atol=1e-5)
    assert torch.allclose(out.loss, f + 0.1 * ce, atol=1e-5)
    assert float(out.sums["n"]) == 3


def test_the_lk_token_term_is_minus_log_acceptance_and_ce_is_still_reported():
    """train.token_loss=lk: the token term is -log Σ min(p, q) per row; `token_loss` stays the CE and
    `accept` the mean α, so recipes compare on both."""
    torch.manual_seed(4)
    pred, target, lm_head = torch.randn(2, 5, 8), torch.randn(2, 5, 8), torch.randn(11, 8)
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 1, 1, 1, 1]], dtype=torch.bool)
    ce_run = eagle_loss(pred, target, mask, lm_head)
    lk_run = eagle_loss(pred, target, mask, lm_head, objective="lk")
    p = torch.softmax(target[mask] @ lm_head.T, -1)
    q = torch.softmax(pred[mask] @ lm_head.T, -1)
    alpha = torch.minimum(p, q).sum(-1)  # [N]
    assert torch.allclose(lk_run.loss, ce_run.feature_loss + 0.1 * -alpha.log().mean(), atol=1e-5)
    assert torch.allclose(lk_run.token_loss, ce_run.token_loss)
    assert summarize(lk_run.sums)["accept"] == pytest.approx(float(alpha.mean()), abs=1e-6)
    with pytest.raises(ValueError, match="train.token_loss='kl'"):
        token_objective("kl", alpha, alpha)


def test_the_lk_gradient_is_the_acceptance_gradient_over_alpha():
    """d(-log α)/dz_j = -q_j (1[q_j < p_j] - Σ_{x: q_x < p_x} q_x) / α for draft logits z."""
    torch.manual_seed(5)
    p = torch.softmax(torch.randn(3, 9), -1)
    z = torch.randn(3, 9, requires_grad=True)
    logq = torch.log_softmax(z, -1)
    eagle3 = eagle3_loss(lambda s: s, z[None], torch.ones(1, 3, dtype=torch.bool),
                         vocab_target_of(p), objective="lk")
    eagle3.loss.backward()
    q = logq.exp().detach()
    under = (q < p).float()
    alpha = torch.minimum(p, q).sum(-1, keepdim=True)
    expected = -q * (under - (under * q).sum(-1, keepdim=True)) / alpha / 3  # the mean over 3 rows
    assert torch.allclose(z.grad, expected, atol=1e-6)


@pytest.mark.parametrize("objective", ["ce", "lk"])
def test_a_pass_without_metrics_has_the_same_loss_and_gradient(objective):
    """The trainer scores metrics on the first pass only; the others must train exactly as before."""
    torch.manual_seed(6)
    mask = torch.tensor([[True, True, False, True, True]])
    lm_head, target = torch.randn(11, 4), torch.randn(1, 5, 4)
    dist = vocab_target(target, mask, lm_head, None, None)
    for loss_of in (lambda pred, m: eagle_loss(pred, target, mask, lm_head, step=1, dist=dist, objective=objective,
                                               metrics=m),
                    lambda pred, m: eagle3_loss(lambda s: s @ lm_head.T, pred, mask, dist, step=1, objective=objective,
                                                metrics=m)):
        runs = []
        for metrics in (True, False):
            pred = torch.randn(1, 5, 4, generator=torch.Generator().manual_seed(7)).requires_grad_()
            out = loss_of(pred, metrics)
            out.loss.backward()
            runs.append((out, pred.grad))
        (full, full_grad), (bare, bare_grad) = runs
        assert torch.equal(full.loss, bare.loss) and torch.equal(full_grad, bare_grad)
        assert float(full.sums["n"]) == 3 and all(float(v) == 0 for v in bare.sums.values())


def test_the_target_token_is_the_first_argmax_even_among_bf16_ties():
    """vocab_target takes greedy_ids (NumPy's argmax or torch's max, eagle/decoding/verify.py): same ids, ties too."""
    logits = (torch.randn(64, 300, generator=torch.Generator().manual_seed(8)) * 2).round()  # many ties
    lm_head = torch.eye(300, dtype=torch.bfloat16)
    target = vocab_target(logits.bfloat16()[None], torch.ones(1, 64, dtype=torch.bool), lm_head, None, None)
    assert torch.equal(target.top, logits.bfloat16().argmax(-1))


def vocab_target_of(probs: torch.Tensor):
    """A VocabTarget with these target probabilities [N, V] (whole vocabulary, argmax in it)."""
    from train.loss import VocabTarget

    return VocabTarget(probs, probs.argmax(-1), torch.ones(probs.shape[0], dtype=torch.bool))


def test_loss_gradients_only_reach_masked_rows_and_accuracy():
    torch.manual_seed(1)
    lm_head = torch.randn(7, 4)
    target = torch.randn(1, 3, 4)
    pred = target.clone().requires_grad_(True)  # a perfect draft
    mask = torch.tensor([[True, False, True]])
    out = eagle_loss(pred, target, mask, lm_head, topk=3)
    out.loss.backward()
    assert pred.grad[0, 1].abs().sum() == 0
    stats = summarize(out.sums, topk=3)
    assert stats["top1"] == 1.0 and stats["top3"] == 1.0 and stats["feature_loss"] == 0.0


def test_a_shared_target_distribution_gives_each_pass_its_own_loss():
    torch.manual_seed(2)
    pred, target, lm_head = torch.randn(2, 6, 8), torch.randn(2, 6, 8), torch.randn(11, 8)
    mask = torch.tensor([[1, 1, 0, 1, 1, 1], [0, 1, 1, 0, 1, 0]], dtype=torch.bool)
    dist = vocab_target(target, mask, lm_head, None, None)  # once for every pass
    for step in range(4):
        shared = eagle_loss(pred, target, mask, lm_head, step=step, dist=dist)
        alone = eagle_loss(pred, target, pass_mask(mask, step), lm_head)  # that pass's rows only
        assert torch.allclose(shared.loss, alone.loss) and shared.sums["n"] == alone.sums["n"]


def test_loss_with_no_masked_pair_is_zero_and_differentiable():
    pred = torch.randn(1, 3, 4, requires_grad=True)
    out = eagle_loss(pred, torch.randn(1, 3, 4), torch.zeros(1, 3, dtype=torch.bool), torch.randn(5, 4))
    out.loss.backward()
    assert float(out.loss.detach()) == 0.0 and summarize(out.sums) == {}


def test_pairs_shift_feature_token_and_mask():
    ids = torch.tensor([[10, 11, 12, 13]])
    mask = torch.tensor([[0, 0, 1, 1]], dtype=torch.bool)
    hidden = torch.arange(4.0).view(1, 4, 1).expand(1, 4, 2)
    p = make_pairs(ids, mask, hidden)
    assert p.features[0, :, 0].tolist() == [0.0, 1.0, 2.0]  # f_t
    assert p.next_ids.tolist() == [[11, 12, 13]]  # x_{t+1}
    assert p.target[0, :, 0].tolist() == [1.0, 2.0, 3.0]  # f_{t+1}
    assert p.mask.tolist() == [[False, True, True]]  # loss_mask[t+1]
    assert p.position_ids.tolist() == [[0, 1, 2]]


def test_uniform_noise_range_and_determinism():
    x = torch.zeros(2, 100, 8)
    a = uniform_noise(x, 0.2, generator=torch.Generator().manual_seed(3))
    b = uniform_noise(x, 0.2, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.abs().max() <= 0.1 and a.abs().max() > 0.05
    scaled = uniform_noise(x, 0.2, ref_len=50, generator=torch.Generator().manual_seed(3))
    assert torch.allclose(scaled, a * 0.5)
    assert torch.equal(uniform_noise(x, 0.0), x)


# ------------------------------------------------------------------ data


def _record(n: int, h: int = 3) -> Record:
    return Record(torch.arange(n), torch.ones(n, dtype=torch.uint8), torch.randn(n, h).to(torch.bfloat16))


def test_collate_pads_on_the_right():
    batch = collate([_record(3), _record(5)])
    assert batch.input_ids.shape == (2, 5) and batch.hidden.shape == (2, 5, 3)
    assert batch.loss_mask[0].tolist() == [True, True, True, False, False]
    assert batch.num_pairs == 2 + 4


def test_length_batches_respect_budget_and_cover_everything():
    lengths = [5, 40, 7, 33, 12, 12, 60, 3, 25, 100]
    batches = length_batches(range(len(lengths)), lengths, batch_tokens=64, seed=1)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or max(lengths[i] for i in b) * len(b) <= 64
    assert batches == length_batches(range(len(lengths)), lengths, batch_tokens=64, seed=1)
    assert batches != length_batches(range(len(lengths)), lengths, batch_tokens=64, seed=2)


def test_split_is_deterministic_disjoint_and_about_five_percent():
    lengths = [10] * 200 + [1]  # a 1-token record makes no pair: never used
    train, held = split_indices(lengths, 0.05, seed=0)
    assert len(held) == 10 and not set(train) & set(held) and 200 not in train + held
    assert (train, held) == split_indices(lengths, 0.05, seed=0)
    assert held != split_indices(lengths, 0.05, seed=1)[1]


def test_batch_plan_resumes_mid_epoch_and_deals_ranks():
    lengths = [8 + (i % 7) for i in range(30)]
    plan = BatchPlan(range(30), lengths, batch_tokens=32, seed=0)
    full = [b for _, b in zip(range(3 * plan.per_epoch), plan.from_step(0))]
    k = plan.per_epoch + 2
    assert [b for _, b in zip(range(len(full) - k), plan.from_step(k))] == full[k:]
    assert full[:plan.per_epoch] != full[plan.per_epoch:2 * plan.per_epoch]  # reshuffled per epoch
    r0 = BatchPlan(range(30), lengths, 32, 0, rank=0, world_size=2).epoch(0)
    r1 = BatchPlan(range(30), lengths, 32, 0, rank=1, world_size=2).epoch(0)
    assert len(r0) == len(r1) and not {i for b in r0 for i in b} & {i for b in r1 for i in b}


# ------------------------------------------------------------------ schedule and engine config


def test_lr_schedule_warmup_then_decay():
    f = lr_lambda(warmup=4, total=14, schedule="linear", min_ratio=0.1)
    assert f(0) < f(1) < f(3) <= 1.0
    assert f(4) == pytest.approx(1.0) and f(14) == pytest.approx(0.1) and f(100) == pytest.approx(0.1)
    cos = lr_lambda(4, 14, "cosine", 0.0)
    assert cos(9) == pytest.approx(0.5)
    assert lr_lambda(4, 14, "constant", 0.0)(13) == 1.0


def test_the_schedule_counts_one_process_steps_at_any_world_size():
    """EAGLE's scheduler advances once per process per step: 8 ranks reach the peak 8x sooner in
    optimizer steps, after the same number of samples; its 800,000-step horizon leaves 58 % of the
    peak after 20 epochs of 68k conversations on 8 GPUs (4 per GPU: 42,500 optimizer steps)."""
    one, eight = lr_lambda(2000, 800000, "linear", 0.0), lr_lambda(2000, 800000, "linear", 0.0, world=8)
    assert eight(250) == one(2000) == pytest.approx(1.0) and eight(100) == one(800)
    assert eight(42500) == pytest.approx(0.576, abs=1e-3)


def test_gpu_presets_follow_eagle_and_the_embedded_default_keeps_its_recipe():
    eagle = validate(compose_train(["+model=vicuna7b"])).train
    assert (eagle.lr, eagle.warmup_steps, eagle.decay_steps, eagle.noise, eagle.noise_ref_len) == (3e-5, 2000, 800000,
                                                                                                    0.2, 512)
    eagle3 = validate(compose_train(["+model=llama3_8b_instruct", "head=eagle3"])).train
    recipe = (eagle3.optimizer, eagle3.lr, eagle3.weight_decay, eagle3.ttt_steps, eagle3.ttt_decay, eagle3.eagle3_norms,
              eagle3.freeze_lm_head, eagle3.schedule, eagle3.noise)
    assert recipe == ("muon", 1e-3, 0.01, 3, 1.0, True, True, "linear", 0.0)  # speculators' EAGLE-3 defaults
    assert schedule_span(eagle3, total_steps=5000, world=8) == (400, 40000)  # 1 % warmup, decay to the run's end
    assert schedule_span(eagle, total_steps=5000, world=8) == (2000, 800000)
    assert schedule_span(validate(compose_train(["+model=llama3_8b_instruct", "head=eagle3", "train.warmup_steps=50"]))
                         .train, total_steps=5000, world=8) == (50, 40000)  # a warmup in steps still wins
    with pytest.raises(ValueError, match=r"train.warmup_steps=null needs train.warmup_ratio in \[0, 1\), got 1.5"):
        validate(compose_train(["+model=llama3_8b_instruct", "head=eagle3", "train.warmup_ratio=1.5"]))
    small = validate(compose_train(["+model=smollm2_135m"])).train
    assert small.noise_ref_len is None and small.decay_steps is None
    small3 = validate(compose_train(["+model=smollm2_135m", "head=eagle3"])).train  # the preset's recipe per head
    assert (small.lr, small.schedule, small.noise) == (5e-4, "cosine", 0.2)
    assert (small3.lr, small3.schedule, small3.noise, small3.warmup_steps, small3.optimizer) == (1e-3, "linear", 0.0,
                                                                                                 None, "muon")


# ------------------------------------------------------------------ configs


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("deepspeed", DEEPSPEED)
def test_every_model_and_deepspeed_file_composes(model, deepspeed):
    cfg = validate(compose_train([f"+model={model}", f"deepspeed={deepspeed}"]))
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert not OmegaConf.missing_keys(cfg), OmegaConf.missing_keys(cfg)
    assert resolved["train"]["p_w"] == 0.1 and resolved["store_dir"]
    conf = ds_config(cfg)
    assert conf["zero_optimization"]["stage"] in (0, 2, 3)
    assert conf["gradient_clipping"] == 0.5
    assert compute_dtype(conf) == (torch.float32 if "fp32" in deepspeed else torch.bfloat16)


@pytest.mark.parametrize("native", [True, False])
def test_bf16_training_runs_in_fp32_where_the_device_has_no_bf16_arithmetic(monkeypatch, native):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    conf = ds_config(validate(compose_train(["+model=smollm2_135m"])))
    runs = on_device(conf, torch.device("cpu"))
    assert compute_dtype(runs) == (torch.bfloat16 if native else torch.float32)
    assert compute_dtype(conf) == torch.bfloat16  # the config itself is untouched


def test_embedded_default_has_its_own_training_values():
    cfg = validate(compose_train(["+model=smollm2_135m"]))
    big = validate(compose_train(["+model=vicuna7b"]))
    assert big.train.lr == pytest.approx(3e-5) and tuple(big.train.betas) == (0.9, 0.95)
    assert cfg.train.lr == pytest.approx(5e-4) and cfg.train.noise == pytest.approx(0.2)


def test_validate_rejects_bad_values():
    with pytest.raises(ValueError, match=r"\+model"):
        validate(compose_train([]))
    with pytest.raises(ValueError, match="schedule"):
        validate(compose_train(["+model=vicuna7b", "train.schedule=exp"]))
    with pytest.raises(ValueError, match="repo_id"):
        validate(compose_train(["+model=vicuna7b", "hub.push=true"]))
    with pytest.raises(Exception):
        validate(compose_train(["+model=vicuna7b", "+train.no_such_key=1"]))


def test_the_loader_pins_memory_and_uses_workers_on_a_gpu_only():
    from train.data import loader_settings

    assert loader_settings(None, torch.device("cuda", 0)) == (4, True)
    assert loader_settings(None, torch.device("cpu")) == (0, False)
    assert loader_settings(1, torch.device("cuda", 0)) == (1, True)  # an explicit train.num_workers wins


def test_the_loader_throughput_tool_runs(capsys):
    from experiments.loader_throughput import main

    result = main(["--hidden", "64", "--records", "4", "--workers", "0", "--step-batches", "1"])
    assert result["loader"][0]["tokens_per_s"] > 0 and result["bare_step"]["tokens_per_s"] > 0


def test_an_eagle2_fine_tune_keeps_its_starting_vocabulary_first_when_asked():
    """By default the store's ranking wins and the start only tops it up; with keep_init_vocab the start's
    list comes first in its own order, so the head's stored list (the first `size`) is the start's."""
    from train.vocab_choice import TrainingVocabulary

    counts = torch.zeros(20, dtype=torch.int64)
    counts[10:16] = torch.arange(6, 0, -1)  # the new store sees tokens 10-15
    start = torch.tensor([3, 12, 1, 7])  # the starting head's list, most frequent first
    rerank = TrainingVocabulary.choose(counts, 4, eagle3=False, start=start)
    assert rerank.stored().tolist() == [10, 11, 12, 13]
    kept = TrainingVocabulary.choose(counts, 4, eagle3=False, start=start, keep_start=True)
    assert kept.stored().tolist() == [3, 12, 1, 7] and kept.ids.tolist() == [3, 12, 1, 7, 10, 11, 13, 14, 15]
    assert kept.coverage == pytest.approx(4 / 21)  # of the store's 21 counted tokens, only token 12's 4


def test_a_large_vocabulary_gets_a_draft_vocabulary_by_default():
    from eagle.heads.draft_vocab import draft_vocab_size
    from train.vocab_choice import TrainingVocabulary

    assert draft_vocab_size(None, 262144) == 32768 and draft_vocab_size(None, 49152) is None
    assert draft_vocab_size(8192, 262144) == 8192  # train.draft_vocab wins
    counts = torch.zeros(100, dtype=torch.int64)
    counts[:10] = torch.arange(10, 0, -1)  # ten seen tokens, 55 in all
    vocab = TrainingVocabulary.choose(counts, 4, eagle3=False)
    assert vocab.ids[:4].tolist() == [0, 1, 2, 3] and vocab.coverage == pytest.approx(34 / 55)
