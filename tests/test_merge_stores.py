"""data_prep.merge_stores: slices prepared apart become one store, by links, record for record."""

import json

import pytest
import torch

from data_prep import pipeline
from data_prep.merge_stores import main, merge_stores
from data_prep.store import FeatureStore, read_manifest
from tests.tiny import data_prep_config as config


@pytest.fixture(scope="module")
def slices(tiny_dir, tmp_path_factory):
    """Two stores of one chat file, conversations 0-6 and 7-12 (shards of 4: the first ends in a short one)."""
    root = tmp_path_factory.mktemp("slices")
    chats = root / "chats.jsonl"
    rows = [{"id": str(i), "conversations": [{"from": "human", "value": f"What is {i} times {i}?"},
                                             {"from": "gpt", "value": f"{i} times {i} is {i * i}. " * (1 + i % 3)}]}
            for i in range(13)]
    chats.write_text("\n".join(json.dumps(r) for r in rows))
    return [pipeline.prepare(config(tiny_dir, chats, root / f"s{offset}", **{"data.offset": offset, "data.limit": n}))
            for offset, n in ((0, 7), (7, 6))]


def test_merged_store_reads_the_slices_records_in_order_through_links(slices, tmp_path):
    out = tmp_path / "merged"
    main([str(out), *map(str, slices)])
    merged, parts = FeatureStore(out), [FeatureStore(s) for s in slices]
    assert len(merged) == 13 == sum(len(p) for p in parts)
    originals = [p[i] for p in parts for i in range(len(p))]
    for i, original in enumerate(originals):
        assert torch.equal(merged[i].input_ids, original.input_ids)
        assert torch.equal(merged[i].loss_mask, original.loss_mask)
        assert torch.equal(merged[i].hidden_states, original.hidden_states)
    m = read_manifest(out)
    assert m["records"] == 13 and m["tokens"] == sum(read_manifest(s)["tokens"] for s in slices)
    assert [s["store"] for s in m["source"]["merged"]] == [str(s) for s in slices]
    first = read_manifest(slices[0])["shards"][0]
    assert (out / "shard-00000.safetensors").stat().st_ino == (slices[0] / first["file"]).stat().st_ino  # a link
    assert merge_stores(out, slices) == m  # run again: the same store


def test_stores_of_another_target_run_or_a_taken_folder_are_refused(slices, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    m = read_manifest(slices[1])
    m["target"]["max_len"] = 2048
    (other / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ValueError, match=r"other/manifest.json: target.max_len is 2048, but .* has 1024"):
        merge_stores(tmp_path / "m", [slices[0], other])
    with pytest.raises(ValueError, match="not a complete feature store"):
        merge_stores(tmp_path / "m", [slices[0], tmp_path / "missing"])
    with pytest.raises(ValueError, match="already holds a store that was not merged from these"):
        merge_stores(slices[1], [slices[0]])
