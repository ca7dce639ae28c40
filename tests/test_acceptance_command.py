"""evaluation/acceptance.py: the acceptance table of shipped heads, and its cache of scores."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from evaluation import acceptance

CHECKPOINTS = Path(__file__).resolve().parent.parent / "checkpoints"


def test_a_folder_without_a_head_and_a_run_without_a_judge_are_refused(tmp_path):
    with pytest.raises(SystemExit, match=f"no exported head .config.json. at x={tmp_path}"):
        acceptance.main(["--heads", f"x={tmp_path}", "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit, match="--no-vllm leaves no judge"):
        acceptance.main(["--heads", f"x={tmp_path}", "--no-vllm"])


@pytest.mark.slow
def test_two_shipped_heads_get_a_row_each_and_a_rerun_reads_the_cache(tmp_path, monkeypatch, capsys):
    from evaluation.parity_judge import ParityJudge
    from tests.tiny import embedded_target_or_skip

    embedded_target_or_skip()
    argv = ["--heads", f"e2={CHECKPOINTS / 'eagle-smollm2-135m-instruct'},e3={CHECKPOINTS / 'eagle3-smollm2-135m-instruct'}",
            "--num-prompts", "1", "--max-new-tokens", "12", "--dtype", "float32", "--threads", "1", "--ours",
            "--no-vllm", "--out", str(tmp_path)]
    assert acceptance.main(argv) == 0
    md = (tmp_path / "results.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| e")]
    assert len(rows) == 2 and "ours, chain 3" in md and "vLLM" not in md
    assert all(len(row.split("|")[4].split(" / ")) == 3 for row in rows)  # α at each of the chain's positions
    monkeypatch.setattr(ParityJudge, "score", lambda *a: pytest.fail("judged again"))
    assert acceptance.main(argv) == 0 and capsys.readouterr().out.count("| e") == 4


def test_sampled_scores_are_cached_apart_from_greedy_ones():
    from evaluation.parity_judge import scores_key

    greedy = scores_key("mtbench", 80, 256, "bfloat16", True, False)
    assert greedy == "mtbench-80x256-bfloat16-vllm"  # the key every earlier score was cached under
    assert scores_key("mtbench", 80, 256, "bfloat16", True, False, temperature=1.0) == greedy + "-t1"


@pytest.mark.slow
def test_a_sampled_judge_draws_alike_for_every_head(tmp_path):
    """--temperature 1: our decoder samples with the same seed per prompt, so one head judged twice (under two
    labels) gets the same τ, and the table says how it decoded."""
    from tests.tiny import embedded_target_or_skip

    embedded_target_or_skip()
    head = CHECKPOINTS / "eagle3-smollm2-135m-instruct"
    copy = shutil.copytree(head, tmp_path / "copy")  # another folder: judged anew, not read from the cache
    argv = ["--heads", f"a={head},b={copy}", "--num-prompts", "2", "--max-new-tokens", "16", "--dtype", "float32",
            "--threads", "1", "--ours", "--no-vllm", "--temperature", "1", "--out", str(tmp_path / "out")]
    assert acceptance.main(argv) == 0
    md = (tmp_path / "out" / "results.md").read_text()
    assert "sampled at temperature 1," in md
    a, b = (line.split("|")[3:7] for line in md.splitlines() if line.startswith(("| a ", "| b ")))
    assert a == b
