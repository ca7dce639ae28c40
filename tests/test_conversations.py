"""Reading chat data: shapes, normalization, skip counts, truncation, and clear errors."""

import json

import pytest

from data_prep.conversations import DataError, normalize, read_conversations

SHAREGPT = [
    {"id": "a", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]},
    {"id": "b", "conversations": [{"from": "gpt", "value": "leading reply"}, {"from": "human", "value": "Q"},
                                  {"from": "chatgpt", "value": "A"}, {"from": "human", "value": "trailing"}]},
    {"id": "c", "conversations": []},
    {"id": "d", "conversations": [{"from": "human", "value": "Q"}, {"from": "human", "value": "Q2"}]},
    {"id": "e", "conversations": [{"from": "system", "value": "Be brief."}, {"from": "user", "value": "Q"},
                                  {"from": "bard", "value": "A"}]},
    {"id": "f", "conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "   "}]},
]


def write_json(tmp_path, records, name="data.json"):
    path = tmp_path / name
    path.write_text(json.dumps(records, indent=1))
    return path


def test_sharegpt_normalization_and_skip_counts(tmp_path):
    convs, report = read_conversations(str(write_json(tmp_path, SHAREGPT)))
    assert [c.id for c in convs] == ["a", "b", "e"]
    assert convs[1].messages == [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]
    assert convs[2].messages[0] == {"role": "system", "content": "Be brief."}
    assert report.read == 6 and report.kept == 3
    assert dict(report.skipped) == {"empty": 1, "roles do not alternate": 1, "no assistant reply": 1}


def test_openai_shape_jsonl(tmp_path):
    path = tmp_path / "chat.jsonl"
    rows = [{"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}] * 3
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    convs, report = read_conversations(str(path), limit=2)
    assert len(convs) == 2 and report.read == 2
    assert convs[0].messages[1] == {"role": "assistant", "content": "4"}


def test_truncated_array_recovers_whole_records(tmp_path):
    text = json.dumps(SHAREGPT * 50, indent=2)
    cut = text[: text.index('"value": "Hello!"', int(len(text) * 0.7)) + 12]  # mid-string
    path = tmp_path / "cut.json"
    path.write_text(cut)
    whole = 0
    for n in range(len(SHAREGPT) * 50, 0, -1):  # how many records are complete in the prefix
        if json.dumps((SHAREGPT * 50)[:n], indent=2)[:-2] in cut:
            whole = n
            break
    convs, report = read_conversations(str(path))
    assert report.read == whole > 0
    assert report.truncated and 0 < report.truncated_bytes < 400


def test_array_without_closing_bracket_is_truncated(tmp_path):
    path = tmp_path / "open.json"
    path.write_text(json.dumps(SHAREGPT)[:-1] + ",\n")
    convs, report = read_conversations(str(path))
    assert report.read == len(SHAREGPT) and report.truncated and report.truncated_bytes == 0


def test_small_chunks_do_not_change_the_result(tmp_path):
    from data_prep import conversations as mod

    path = write_json(tmp_path, SHAREGPT * 20)
    records = list(mod._json_array(path, "x", mod.ReadReport("x"), chunk=17))
    assert len(records) == 120 and records[-1][1]["id"] == "f"


@pytest.mark.parametrize("content, where", [
    ('[{"id": 1, "conversations": [{"from": "human", "value": "x"}]}, {"id": 2 "bad": 1}, {"id": 3}]', "record 1"),
    ('[{"id": 1, "turns": []}]', "field 'conversations'"),
    ('[{"conversations": {"from": "human"}}]', "field 'conversations'"),
    ('[{"conversations": [{"speaker": "human", "text": "x"}]}]', "field 'conversations[0]'"),
    ('[{"conversations": [{"from": "human", "value": 42}]}]', "field 'conversations[0].value'"),
    ('[[1, 2]]', "record 0"),
])
def test_malformed_json_names_file_record_and_field(tmp_path, content, where):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(DataError) as e:
        read_conversations(str(path))
    assert str(path) in str(e.value) and where in str(e.value)


def test_malformed_jsonl_names_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"messages": []}\n{"messages": [\n')
    with pytest.raises(DataError, match=r"bad.jsonl line 2, record 1"):
        read_conversations(str(path))


def test_missing_file_and_unknown_role(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        read_conversations(str(tmp_path / "nope.json"))
    messages, reason = normalize({"conversations": [{"from": "narrator", "value": "x"}]}, "f", 0)
    assert messages == [] and reason.startswith("unknown role")


def test_hf_dataset_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list([{"id": "x", "conversations": SHAREGPT[0]["conversations"]}] * 4)
    ds.save_to_disk(str(tmp_path / "ds"))
    convs, report = read_conversations(str(tmp_path / "ds"))
    assert report.kept == 4 and convs[0].messages[0]["role"] == "user"


def test_hf_dataset_offline_error_is_one_line(tmp_path, monkeypatch):
    import datasets
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # both read their variable at import: no retries
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataError, match="cannot load as a HF dataset"):
        read_conversations("someone/not-a-cached-dataset")


def test_packaged_sharegpt_is_recovered():
    try:
        convs, report = read_conversations("packaged:sharegpt")
    except FileNotFoundError as e:
        pytest.skip(str(e))
    assert report.read == 17671 and report.truncated_bytes > 0
    assert report.kept + sum(report.skipped.values()) == report.read


def test_several_sources_read_in_order_as_one(tmp_path):
    from omegaconf import OmegaConf

    first = write_json(tmp_path, SHAREGPT, name="first.json")
    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": f"Q{i}"}, {"role": "assistant", "content": "A"}]}
            for i in range(4)]
    for k in range(2):  # two chunk files found by a glob, read in sorted order
        (tmp_path / f"chunk-{k}.jsonl").write_text("\n".join(json.dumps(r) for r in rows[2 * k:2 * k + 2]) + "\n")
    sources = OmegaConf.create({"source": [str(first), str(tmp_path / "chunk-*.jsonl")]}).source  # as Hydra passes it
    convs, report = read_conversations(sources)
    assert [c.id for c in convs] == ["a", "b", "e", "r0", "r1", "r2", "r3"]
    assert [c.index for c in convs] == [0, 1, 4, 6, 7, 8, 9]  # positions across the concatenation, unique
    assert report.read == 10 and report.kept == 7 and report.skipped["empty"] == 1
    assert [p["data"] for p in report.as_dict()["parts"]] == [str(first)] + [str(tmp_path / f"chunk-{k}.jsonl") for k in range(2)]
    convs, report = read_conversations(sources, limit=8)  # the limit counts across sources
    assert [c.id for c in convs] == ["a", "b", "e", "r0", "r1"] and report.read == 8
    assert len(report.parts) == 2  # the last chunk was never opened
    convs, report = read_conversations(sources, offset=4, limit=3)  # a later slice, across sources too
    assert [(c.id, c.index) for c in convs] == [("e", 4), ("r0", 6)] and report.read == 3
    assert report.as_dict()["offset"] == 4 and report.skipped["no assistant reply"] == 1
    convs, report = read_conversations(sources, offset=7)  # the first file is passed over whole
    assert [(c.id, c.index) for c in convs] == [("r1", 7), ("r2", 8), ("r3", 9)] and report.read == 3


def test_a_glob_that_matches_nothing_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"chunk-\*\.jsonl: no data file matches"):
        read_conversations([str(write_json(tmp_path, SHAREGPT)), str(tmp_path / "chunk-*.jsonl")])
    with pytest.raises(ValueError, match="empty"):
        read_conversations([])


def test_a_hub_file_source_offline_is_one_line(monkeypatch):
    """The GPU presets read EAGLE's full ShareGPT from the Hub; offline that is one clear line."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    source = "hf:Aeala/ShareGPT_Vicuna_unfiltered/no-such-file-here.json"
    with pytest.raises(DataError) as err:
        read_conversations(source, limit=1)
    assert "\n" not in str(err.value) and source in str(err.value) and "data.source" in str(err.value)


def test_the_gpu_presets_default_to_eagles_full_sharegpt():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from tests.tiny import CONF

    for model in ("vicuna7b", "llama3_8b_instruct"):
        with initialize_config_dir(config_dir=str(CONF), version_base=None):
            cfg = compose(config_name="config", overrides=[f"+model={model}"])
        assert cfg.data.source.startswith("hf:") and "ShareGPT_V4.3" in cfg.data.source
        assert "sharegpt_v4.3" in OmegaConf.to_container(cfg, resolve=True)["store_dir"]
        with initialize_config_dir(config_dir=str(CONF), version_base=None):  # a user's own file still wins
            mine = compose(config_name="config", overrides=[f"+model={model}", "data=sharegpt_local", "data.source=x.json"])
        assert (mine.data.name, mine.data.source) == ("local", "x.json")
