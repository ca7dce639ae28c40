"""Presets pin a Hub revision; every rank must run the same snapshot of the target.

Two snapshots of one repo sit in a hand-built HF cache (tests/fake_hub.py): `main` points at A,
B is another commit. A pinned revision picks its snapshot; ranks whose caches hold different
snapshots stop with one error naming both commits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from data_prep.data_config import ModelConfig, resolve
from data_prep.presets import model_presets
from eagle.common import distributed
from eagle.targets.hub import snapshot_commit
from eagle.targets.resolve import resolve_target
from tests.fake_hub import COMMIT_A, COMMIT_B, REPO, add_snapshot, offline_cache
from tests.gloo_ranks import join_all, start_ranks
from tests.tiny import CONF


@pytest.fixture
def two_snapshots(tmp_path, monkeypatch):
    cache = offline_cache(monkeypatch, tmp_path / "hub")
    a = add_snapshot(cache, COMMIT_A, seed=1)
    b = add_snapshot(cache, COMMIT_B, main=False, seed=2)
    return a, b


def test_a_pinned_revision_picks_its_snapshot(two_snapshots):
    a, b = two_snapshots
    assert resolve_target(REPO).resolve() == a.resolve()  # no revision: main
    assert resolve_target(REPO, revision=COMMIT_B).resolve() == b.resolve()
    assert resolve_target(REPO, revision="main").resolve() == a.resolve()


def test_a_pinned_revision_absent_from_the_cache_is_named(two_snapshots):
    with pytest.raises(FileNotFoundError, match=f"{REPO}.*revision {'c3' * 20}"):
        resolve_target(REPO, revision="c3" * 20)


def test_the_resolved_target_knows_its_commit(two_snapshots, tmp_path):
    model = ModelConfig(name="tiny", path=REPO, max_len=64, revision=COMMIT_B)
    target = resolve(model)
    assert target.commit == COMMIT_B and snapshot_commit(target.folder) == COMMIT_B
    assert snapshot_commit(tmp_path) is None  # a plain folder has no Hub commit


def test_every_preset_carries_a_revision_key():
    for name in model_presets(CONF):
        model = OmegaConf.load(CONF / "model" / f"{name}.yaml").model
        assert "revision" in model, name
        assert model.revision is None or len(str(model.revision)) == 40, name


def test_a_composed_config_carries_the_revision_to_the_model_config():
    from hydra import compose, initialize_config_dir

    from data_prep.data_config import prep_config

    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(config_name="config", overrides=["+model=llama3_8b_instruct", f"model.revision={COMMIT_B}"])
    assert prep_config(cfg).model.revision == COMMIT_B


def test_the_preset_writer_writes_a_revision(tiny_dir, tmp_path):
    from eagle.targets.preset import write_preset

    (tmp_path / "model").mkdir()
    text = write_preset("mine", "org/mine", tiny_dir, tmp_path, revision=COMMIT_A).read_text()
    assert f'  revision: "{COMMIT_A}"' in text  # quoted: a hash of digits and one "e" would read as a number
    assert OmegaConf.load(tmp_path / "model" / "mine.yaml").model.revision == COMMIT_A


def test_mismatch_names_both_commits():
    assert distributed.mismatch([COMMIT_A, COMMIT_A], "target snapshot") is None
    message = distributed.mismatch([COMMIT_A, COMMIT_A, COMMIT_B], "target snapshot")
    assert COMMIT_A in message and COMMIT_B in message and "rank 2" in message and "\n" not in message


def _resolve_on_rank(rank: int, caches: list[str], out: str) -> None:
    import os

    os.environ.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=caches[rank])
    try:
        target = resolve(ModelConfig(name="tiny", path=REPO, max_len=64))
        result = {"commit": target.commit, "error": None}
    except ValueError as e:
        result = {"commit": None, "error": str(e)}
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    distributed.leave()


@pytest.mark.parametrize("same", [True, False])
def test_ranks_compare_their_snapshots(tmp_path, same):
    """Node 1's cache has main at A, node 2's at B (pulled on another day): both ranks stop, naming both."""
    caches = [tmp_path / "node0", tmp_path / "node1"]
    add_snapshot(caches[0], COMMIT_A)
    add_snapshot(caches[1], COMMIT_A if same else COMMIT_B)
    procs = start_ranks(_resolve_on_rank, 2, args=([str(c) for c in caches], str(tmp_path)))
    assert join_all(procs, timeout=120) == [0, 0]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    if same:
        assert results == [{"commit": COMMIT_A, "error": None}] * 2
    else:
        for r in results:
            assert r["error"] and COMMIT_A in r["error"] and COMMIT_B in r["error"], r
