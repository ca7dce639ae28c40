"""Hub ids resolve from the local HF cache on nodes without network (HF_HUB_OFFLINE=1), and say
which repo and which cache folder they looked in when the snapshot is not there."""

from __future__ import annotations

import pytest
import torch

from eagle.targets.resolve import load_target, local_target, resolve_target
from tests.fake_hub import COMMIT_A, REPO, add_snapshot, offline_cache, repo_folder


def test_offline_hub_id_resolves_from_the_local_cache(tmp_path, monkeypatch):
    cache = offline_cache(monkeypatch, tmp_path / "hub")
    snapshot = add_snapshot(cache, COMMIT_A)
    folder = resolve_target(REPO)
    assert folder.resolve() == snapshot.resolve()
    model = load_target(folder, torch.float32, torch.device("cpu"))
    assert model.config.num_hidden_layers == 2


def test_offline_without_the_snapshot_names_repo_and_cache_folder(tmp_path, monkeypatch):
    cache = offline_cache(monkeypatch, tmp_path / "hub")
    add_snapshot(cache, COMMIT_A)  # another repo is there; this one is not
    with pytest.raises(FileNotFoundError) as e:
        resolve_target("org/absent")
    message = str(e.value)
    assert "org/absent" in message and str(repo_folder(cache, "org/absent")) in message
    assert "HF_HUB_OFFLINE" in message and "\n" not in message


def test_offline_snapshot_without_weights_is_named(tmp_path, monkeypatch):
    cache = offline_cache(monkeypatch, tmp_path / "hub")
    snapshot = add_snapshot(cache, COMMIT_A)
    (snapshot / "model.safetensors").unlink()  # an interrupted download: config only
    with pytest.raises(FileNotFoundError, match="no weights") as e:
        resolve_target(REPO)
    assert str(snapshot) in str(e.value)


def test_network_failure_falls_back_to_the_cache(tmp_path, monkeypatch):
    """Online mode, but the Hub cannot be reached: the cached snapshot serves."""
    import httpx
    import huggingface_hub
    import huggingface_hub.constants as constants

    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    def unreachable(*args, **kwargs):
        raise httpx.ConnectError("[Errno 101] Network is unreachable")

    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files", unreachable)
    snapshot = add_snapshot(cache, COMMIT_A)
    assert resolve_target(REPO).resolve() == snapshot.resolve()


def test_local_target_finds_a_cached_hub_snapshot(tmp_path, monkeypatch):
    """What plan=true and other no-download callers see: the cached snapshot, or None."""
    cache = offline_cache(monkeypatch, tmp_path / "hub")
    assert local_target(REPO) is None
    snapshot = add_snapshot(cache, COMMIT_A)
    assert local_target(REPO).resolve() == snapshot.resolve()
