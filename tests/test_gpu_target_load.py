"""Targets load straight onto the rank's accelerator (a device map), never as a full host copy
first: 8 ranks x a 16 GB target would otherwise hold 128 GB of host memory at once. On the CPU
loading is what it always was.

The accelerator is pretended: `local_device()` answers cuda:N and from_pretrained records its
keywords (a CPU-only build cannot place anything on CUDA)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from eagle.targets import resolve
from tests.tiny import tiny_llama
from train import frozen


@pytest.fixture
def recorded(monkeypatch):
    """from_pretrained's keywords, call by call; it returns a tiny CPU model."""
    calls: list[dict] = []

    def from_pretrained(path, *args, **kwargs):
        calls.append(kwargs)
        return tiny_llama()

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", from_pretrained)
    return calls


def test_load_target_maps_the_weights_onto_the_rank_device(recorded, monkeypatch, tmp_path):
    cuda = torch.device("cuda", 3)
    monkeypatch.setattr(resolve, "local_device", lambda: cuda)
    model = resolve.load_target(tmp_path, "bfloat16")
    assert recorded[-1].get("device_map") == {"": cuda}
    assert recorded[-1]["dtype"] is torch.bfloat16
    assert not model.training and not any(p.requires_grad for p in model.parameters())


def test_an_explicit_accelerator_device_is_mapped_too(recorded, tmp_path):
    resolve.load_target(tmp_path, torch.float16, torch.device("cuda", 1))
    assert recorded[-1].get("device_map") == {"": torch.device("cuda", 1)}


def test_on_the_cpu_loading_is_unchanged(tmp_path):
    """A real load of a saved tiny model: no device map, the weights as saved."""
    saved = tiny_llama(seed=4)
    saved.save_pretrained(tmp_path)
    model = resolve.load_target(tmp_path, torch.float32, torch.device("cpu"))
    for (name, a), b in zip(saved.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name
    assert next(model.parameters()).device.type == "cpu"


def test_on_the_cpu_no_device_map_is_passed(recorded, monkeypatch, tmp_path):
    monkeypatch.setattr(resolve, "local_device", lambda: torch.device("cpu"))
    resolve.load_target(tmp_path, torch.float32)
    assert "device_map" not in recorded[-1]


def test_frozen_fallback_loads_onto_the_rank_device(recorded, monkeypatch, tmp_path):
    """A folder whose embedding the weight files do not name: the whole model loads, on the accelerator."""
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setattr(frozen, "_weight_files", lambda target_dir: {})
    monkeypatch.setattr(resolve, "local_device", lambda: torch.device("cuda", 2))
    out = frozen.load_frozen(tmp_path, torch.float32)
    assert recorded[-1].get("device_map") == {"": torch.device("cuda", 2)}
    assert out.embed.shape == (128, 64) and out.norm is not None
