"""experiments/scaling_curve.py: judged parity runs of several data sizes become one table and figure."""

from __future__ import annotations

import json
import shutil

import pytest

from experiments import scaling_curve


def parity_out(folder, trainer: str, tokens: int, steps: int, scores: dict | None, data: str = "sharegpt_packaged-limit2100",
               more: str = ""):
    run = folder / "runs" / trainer.replace("@", "-") / "run.json"
    run.parent.mkdir(parents=True)
    command = f"-m train head=eagle3 store_dir=/stores/t/{data}-regenFalse-len1024 output_dir=x {more}"
    run.write_text(json.dumps({"trainer": trainer, "tokens": tokens, "recipe": {"steps": steps}, "command": command}))
    if scores is not None:
        (folder / "scores.json").write_text(json.dumps({f"{trainer}|mtbench-24x128-bfloat16": scores}))


def test_each_judged_run_is_a_point_in_token_order(tmp_path):
    parity_out(tmp_path / "full", "ours-eagle3@ref", 1_500_000, 379, {"vllm_tau": 1.46, "chain3_tau": 1.51,
                                                                        "tree_tau": 2.07})
    parity_out(tmp_path / "half", "ours-eagle3@ref", 750_000, 190, {"chain3_tau": 1.40, "tree_tau": 1.90,
                                                                      "vllm_skipped": "no vLLM here"})
    parity_out(tmp_path / "unjudged", "ours-eagle3@ref", 375_000, 95, None)
    parity_out(tmp_path / "regen", "ours-eagle3@ref", 1_500_000, 379, {"tree_tau": 2.3}, data="regen-c0-22-limit2048")
    parity_out(tmp_path / "masked", "ours-eagle3@ref", 1_500_000, 379, {"tree_tau": 2.4},
               data="regen-c0-22-limit2048-repeats8")
    parity_out(tmp_path / "tuned", "ours-eagle3@ref", 1_500_000, 379, {"tree_tau": 2.5},
               data="regen-c0-22-limit2048-repeats8", more="train.init_head=/heads/sharegpt")  # a fine-tune: no point
    found = scaling_curve.points([tmp_path / d for d in ("full", "half", "unjudged", "regen", "masked", "tuned")])
    assert [(p.data, p.tokens, p.scores["vllm_tau"]) for p in found] == [
        ("regen-c0-22", 1_500_000, None), ("regen-c0-22-repeats8", 1_500_000, None),
        ("sharegpt_packaged", 750_000, None), ("sharegpt_packaged", 1_500_000, 1.46)]
    md = scaling_curve.table(found)
    assert "| ours-eagle3@ref | sharegpt_packaged | 750,000 | 190 | — | 1.40 | 1.90 |" in md
    scaling_curve.plot(found, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").stat().st_size > 10_000
    with pytest.raises(SystemExit, match="no judged runs"):
        scaling_curve.main([str(tmp_path / "unjudged")])


def test_the_record_keeps_earlier_points_and_a_rerun_replaces_its_own(tmp_path):
    record = tmp_path / "points.json"
    parity_out(tmp_path / "e1", "ours-eagle3@ref", 1_500_000, 379, {"vllm_tau": 1.46})
    parity_out(tmp_path / "e2", "ours-eagle2@ours", 750_000, 190, {"vllm_tau": 1.30})
    scaling_curve.main([str(tmp_path / "e1"), str(tmp_path / "e2"), "--record", str(record)])
    (tmp_path / "e2" / "scores.json").write_text(json.dumps({"ours-eagle2@ours|mtbench-24x128-bfloat16-vllm":
                                                             {"vllm_tau": 1.31}}))
    shutil.rmtree(tmp_path / "e1")  # its run outputs are gone: the record still holds its point
    scaling_curve.main([str(tmp_path / "e2"), "--record", str(record), "--plot", str(tmp_path / "c.png")])
    found = scaling_curve.read_record(record)
    assert [(p.trainer, p.tokens, p.scores["vllm_tau"]) for p in found] == [
        ("ours-eagle2@ours", 750_000, 1.31), ("ours-eagle3@ref", 1_500_000, 1.46)]
    assert (tmp_path / "c.png").exists()
    scaling_curve.main(["--record", str(record)])  # the record alone redraws


def staged_head(folder, stages: list[tuple[str, int, int]], layers: int = 1):
    """A head folder whose training.json lists (data, tokens, steps) per stage."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architecture": "eagle3", "num_hidden_layers": layers}))
    (folder / "training.json").write_text(json.dumps({"stages": [
        {"data": f"sharegpt_packaged (~/stores/{data})", "records": 1, "tokens": tokens, "steps": steps, "epochs": 1.0}
        for data, tokens, steps in stages]}))
    return folder


JUDGE = "mtbench-80x256-bfloat16-vllm"


def judged(tmp_path, scores: dict):
    """An evaluation.acceptance output that judged each head folder of `scores` with JUDGE."""
    out = tmp_path / "acceptance"
    out.mkdir()
    (out / "scores.json").write_text(json.dumps({f"{head}|{JUDGE}": score for head, score in scores.items()}))
    return out


def test_an_acceptance_output_adds_each_staged_head_at_its_distinct_tokens(tmp_path):
    s1 = [("first", 500_000, 400)]
    two = staged_head(tmp_path / "s2", s1 + [("second", 800_000, 190)])
    again = staged_head(tmp_path / "s3", s1 + [("second", 800_000, 190), ("first", 500_000, 130)])  # a second pass
    deeper = staged_head(tmp_path / "d", s1 + [("second", 800_000, 190)], layers=2)  # a line of its own
    bare = tmp_path / "old"  # judged, but exported before heads kept their stages: no point
    bare.mkdir()
    out = judged(tmp_path, {two: {"vllm_tau": 1.55, "vllm_accept": [0.4]}, again: {"vllm_tau": 1.6},
                            bare: {"vllm_tau": 1.4}, deeper: {"vllm_tau": 1.7}})
    record = tmp_path / "points.json"
    scaling_curve.main([str(out), "--record", str(record)])
    found = scaling_curve.read_record(record)
    assert [(p.trainer, p.data, p.tokens, p.steps, p.scores["vllm_tau"]) for p in found] == [
        (f"eagle3 (2 layers) in stages ({JUDGE})", "sharegpt_packaged", 1_300_000, 590, 1.7),
        (f"eagle3 in stages ({JUDGE})", "sharegpt_packaged", 1_300_000, 590, 1.55),
        (f"eagle3 in stages ({JUDGE})", "sharegpt_packaged", 1_300_000, 720, 1.6)]


def test_a_store_gathered_from_earlier_stores_adds_no_tokens(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    stores = tmp_path / "stores"
    gathered = stores / "regen2"
    gathered.mkdir(parents=True)
    (gathered / "manifest.json").write_text(json.dumps({"source": {"data": ", ".join(
        f"{stores}/{name}/regenerated/chunk-00000.jsonl" for name in ("first", "second"))}}))
    head = staged_head(tmp_path / "head", [("first", 500_000, 400), ("second", 800_000, 190), ("regen2", 1_300_000, 300)])
    out = judged(tmp_path, {head: {"vllm_tau": 1.7}})
    (found,) = scaling_curve.points([out])
    assert (found.tokens, found.steps) == (1_300_000, 890)


def test_a_merged_store_adds_only_the_stores_no_earlier_stage_saw(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    stores = tmp_path / "stores"

    def merged(name, parts):  # a store data_prep.merge_stores made of `parts` [(store, tokens, source)]
        (stores / name).mkdir(parents=True)
        source = {"merged": [{"store": str(stores / s), "tokens": t, "source": src} for s, t, src in parts]}
        (stores / name / "manifest.json").write_text(json.dumps({"source": source}))
        return source

    inner = merged("m12", [("first", 500_000, {"data": "a.json"}), ("second", 800_000, {"data": "a.json"})])
    merged("m123", [("m12", 1_300_000, inner), ("third", 700_000, {"data": "a.json"})])
    head = staged_head(tmp_path / "head", [("first", 500_000, 400), ("m12", 1_300_000, 300), ("m123", 2_000_000, 450)])
    out = judged(tmp_path, {head: {"vllm_tau": 1.7}})
    (found,) = scaling_curve.points([out])
    assert (found.tokens, found.steps) == (2_000_000, 1_150)


def test_a_gathered_store_no_longer_on_disk_is_named_as_rereading(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no store of these stages exists here
    head = staged_head(tmp_path / "head", [("first", 500_000, 400), ("regen2", 500_000, 300), ("third", 700_000, 200)])
    out = judged(tmp_path, {head: {"vllm_tau": 1.7}})
    (counted,) = scaling_curve.points([out])
    assert counted.tokens == 1_700_000  # nothing tells: every stage's tokens count
    record = tmp_path / "points.json"
    scaling_curve.main([str(out), "--record", str(record), "--rereads", "regen2"])
    assert [p.tokens for p in scaling_curve.read_record(record)] == [1_200_000]
