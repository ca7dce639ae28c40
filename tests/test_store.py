"""Feature store: round trip, empty shards, atomic writes, refusing incomplete stores."""

import pytest
import torch

from data_prep.store import FeatureStore, Record, new_manifest, shard_name, write_manifest, write_shard


def records(n, hidden=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        s = 3 + i
        out.append(Record(torch.randint(0, 100, (s,), generator=g), torch.randint(0, 2, (s,), generator=g).bool(),
                          torch.randn(s, hidden, generator=g).bfloat16()))
    return out


def build(tmp_path, shards, complete=True):
    entries = [write_shard(tmp_path / shard_name(k), recs, 8, skipped={"why": k}) for k, recs in enumerate(shards)]
    write_manifest(tmp_path, new_manifest({"hidden_size": 8}, {"read": 0}, entries, complete, "h"))
    return entries


def test_round_trip_across_shards(tmp_path):
    a, b = records(3), records(4, seed=1)
    entries = build(tmp_path, [a, [], b])
    store = FeatureStore(tmp_path)
    assert len(store) == 7 and [e["records"] for e in entries] == [3, 0, 4]
    assert entries[1]["skipped"] == {"why": 1}
    for got, want in zip([store[i] for i in range(7)], a + b):
        assert torch.equal(got.input_ids, want.input_ids)
        assert torch.equal(got.loss_mask, want.loss_mask)
        assert torch.equal(got.hidden_states, want.hidden_states)
    assert store.lengths() == [3, 4, 5, 3, 4, 5, 6]
    assert not list(tmp_path.glob("*.tmp-*"))


def test_incomplete_or_missing_store_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="run data_prep"):
        FeatureStore(tmp_path)
    build(tmp_path, [records(2)], complete=False)
    with pytest.raises(ValueError, match="incomplete"):
        FeatureStore(tmp_path)
    assert len(FeatureStore(tmp_path, require_complete=False)) == 2


def test_same_records_give_same_bytes(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    e1 = write_shard(tmp_path / "x" / shard_name(0), records(5), 8)
    e2 = write_shard(tmp_path / "y" / shard_name(0), records(5), 8)
    assert e1["sha256"] == e2["sha256"]


def test_store_pickles_without_open_handles(tmp_path):
    import pickle

    build(tmp_path, [records(2)])
    store = FeatureStore(tmp_path)
    store[0]
    clone = pickle.loads(pickle.dumps(store))
    assert torch.equal(clone[1].input_ids, store[1].input_ids)


def test_full_disk_is_a_one_line_error_and_keeps_finished_shards(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    from data_prep.store import OutOfSpace

    rec = Record(torch.tensor([1, 2, 3]), torch.tensor([0, 1, 1], dtype=torch.bool), torch.zeros(3, 4))
    write_shard(tmp_path / shard_name(0), [rec], 4)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(1 << 30, 1 << 30, 1 << 20))
    with pytest.raises(OutOfSpace, match=r"no space for shard-00001.*MB free.*EAGLE_CACHE.*resumes"):
        write_shard(tmp_path / shard_name(1), [rec], 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == [shard_name(0)]  # nothing half-written
