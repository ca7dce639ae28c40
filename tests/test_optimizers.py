"""train/optimizers.py: which parameters Muon steps, and that its step is torch's Muon with
speculators' setting (adjust_lr_fn="match_rms_adamw") while the rest is AdamW's."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from train.optimizers import build_optimizer, muon_matrix


def config(optimizer: str, **changes) -> SimpleNamespace:
    base = dict(optimizer=optimizer, lr=1e-3, betas=[0.9, 0.95], weight_decay=0.01, muon_lr=None,
                muon_momentum=0.95, muon_weight_decay=0.1)
    return SimpleNamespace(**{**base, **changes})


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(96, 8, bias=True)  # wide [8, 96]: step scale 0.2 * sqrt(96) = 1.96
        self.down = nn.Linear(8, 64, bias=False)  # tall [64, 8]: 0.2 * sqrt(64) / sqrt(64 / 8) = 0.57
        self.norm = nn.LayerNorm(64)
        self.lm_head = nn.Linear(64, 40, bias=False)


def test_muon_takes_the_weight_matrices_and_leaves_vocabulary_matrices_norms_and_biases_to_adamw():
    head = Head()
    chosen = {n for n, p in head.named_parameters() if muon_matrix(n, p)}
    assert chosen == {"fc.weight", "down.weight"}
    assert not muon_matrix("row", torch.zeros(1, 8))  # a degenerate [1, N] matrix is a vector
    with pytest.raises(ValueError, match="train.optimizer='sgd': choose one of adamw, muon"):
        build_optimizer(head, config("sgd"))
    with pytest.raises(ValueError, match="muon .* runs with ZeRO stage 0.*not stage 2: set train.optimizer=adamw"):
        build_optimizer(head, config("muon"), zero_stage=2)


def test_muon_orthogonalizes_in_fp32_on_a_cpu_without_bf16_arithmetic(monkeypatch):
    """DeepSpeed's CPU accelerator claims bf16 everywhere; on AVX2 its bf16 Newton-Schulz took 54 s a step
    against 2.0 s in fp32. Built for such a CPU, Muon computes in fp32; where bf16 is native, as DeepSpeed chose."""
    from deepspeed.runtime.zero.muon import original_muon

    import train.optimizers as optimizers

    monkeypatch.setattr(original_muon, "ns_compute_dtype", original_muon.ns_compute_dtype)  # restored afterwards
    chosen = original_muon.ns_compute_dtype
    own = getattr(chosen, "deepspeed_own", chosen)("standard")  # DeepSpeed's choice (an earlier build may wrap it)
    monkeypatch.setattr(optimizers, "native_bf16", lambda device: False)
    build_optimizer(Head(), config("muon"))
    assert original_muon.ns_compute_dtype("standard") == torch.float32
    assert optimizers.newton_schulz_dtype(torch.device("cuda")) == own  # a GPU: DeepSpeed's choice
    monkeypatch.setattr(optimizers, "native_bf16", lambda device: True)
    assert optimizers.newton_schulz_dtype(torch.device("cpu")) == own


@pytest.mark.parametrize("name", ["fc.weight", "down.weight"])
def test_a_muon_step_is_torchs_muon_with_match_rms_adamw(name):
    """Three steps on a wide and a tall matrix: the same update as torch's Muon up to its bf16
    Newton-Schulz (DeepSpeed's and torch's round differently), and AdamW's exactly for the rest."""
    torch.manual_seed(0)
    head = Head()
    start = {n: p.detach().clone() for n, p in head.named_parameters()}
    ref = {n: p.detach().clone().requires_grad_(True) for n, p in head.named_parameters()}
    grads = [{n: torch.randn_like(p) for n, p in head.named_parameters()} for _ in range(3)]
    ours = build_optimizer(head, config("muon", muon_lr=0.02))
    theirs = torch.optim.Muon([ref[name]], lr=0.02, weight_decay=0.1, momentum=0.95, adjust_lr_fn="match_rms_adamw")
    adamw = torch.optim.AdamW([ref["norm.weight"], ref["lm_head.weight"]], lr=1e-3, betas=(0.9, 0.95),
                              weight_decay=0.01)
    params = dict(head.named_parameters())
    for step in grads:
        for n, p in params.items():
            p.grad, ref[n].grad = step[n].clone(), step[n].clone()
        ours.step()
        theirs.step()
        adamw.step()
    moved, expected = params[name].detach() - start[name], ref[name].detach() - start[name]
    assert (moved - expected).norm() < 0.03 * expected.norm()
    for n in ("norm.weight", "lm_head.weight"):
        assert torch.allclose(params[n], ref[n], atol=1e-6)


def _three_muon_steps(rank: int, out: Path) -> None:
    """Three steps of a DeepSpeed ZeRO-0 bf16 engine with our Muon, the same batches on every rank."""
    import os
    import sys

    import deepspeed

    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))
    torch.manual_seed(0)
    head = Head()
    conf = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 0}, "bf16": {"enabled": True},
            "steps_per_print": 10**12}
    engine, *_ = deepspeed.initialize(model=head, optimizer=build_optimizer(head, config("muon", muon_lr=0.02)),
                                      config=conf, dist_init_required=False)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn(4, 96, generator=g).bfloat16()
        engine.backward(head.lm_head(head.norm(head.down(head.fc(x)))).float().pow(2).mean())
        engine.step()
    if rank == 0:
        torch.save({n: p.detach().float() for n, p in head.named_parameters()}, out)


@pytest.mark.slow
def test_muon_on_two_ranks_steps_exactly_as_on_one(tmp_path):
    """Data-parallel Muon at ZeRO-0 (DeepSpeed's bf16 optimizer partitions the fp32 master weights over
    the ranks and gathers each matrix whole for Newton-Schulz): two gloo ranks given the same batches
    end with the same weights as one rank, and every matrix moved."""
    from tests.gloo_ranks import run_in_group

    weights = {}
    for world in (1, 2):
        assert run_in_group(_three_muon_steps, (tmp_path / f"world{world}.pt",), world=world) == [0] * world
        weights[world] = torch.load(tmp_path / f"world{world}.pt")
    torch.manual_seed(0)
    start = {n: p.detach().float() for n, p in Head().named_parameters()}
    for name, p in weights[2].items():
        assert torch.equal(p, weights[1][name]), name
        assert not torch.equal(p, start[name]), name


def test_the_newton_schulz_benchmark_times_the_muon_matrices_of_a_head_in_both_dtypes(tmp_path):
    from safetensors.torch import save_file

    from experiments.newton_schulz import main

    save_file({"fc.weight": torch.randn(8, 24), "lm_head.weight": torch.randn(40, 8), "norm.weight": torch.ones(8)},
              str(tmp_path / "model.safetensors"))
    result = main([str(tmp_path), "--rounds", "1"])
    assert result["matrices"] == [[8, 24]] and result["float32_s"] > 0 and result["bfloat16_s"] > 0
