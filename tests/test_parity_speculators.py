"""The speculators side of the trainer parity (evaluation/ref_speculators.py).

Fast (no speculators venv): our store converted to speculators' training input reads back as the
store's tensors, and the pre-norm last layer we write gives back the store's post-norm features
through speculators' verifier norm; recipes map to its flags. Slow (the venv; skipped with the setup
command when absent): `speculators train` runs 4 steps on a tiny store on this CPU and leaves a head
that we load and that drafts the first-step logits of speculators' own model; a recipe with an lr
floor runs with it.

    .venv/bin/python -m pytest tests/test_parity_speculators.py              # all (~30 s with the venv)
    .venv/bin/python -m pytest tests/test_parity_speculators.py -m "not slow"  # converter only (~1 s)
"""

from __future__ import annotations

import json
import math
import subprocess

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from data_prep.store import FeatureStore
from evaluation import ref_speculators as rs
from evaluation.parity_run import Recipe
from tests.tiny import clean_env, tiny_llama, write_tiny_store

LAYERS = (1, 2, 3, -1)  # HF hidden_states indices of a 4-layer tiny target: 3 fused layers, then the last


def tiny_target(seed: int = 0):
    """A 4-layer tiny Llama whose final norm weight is far from ones (mixed signs), so that
    undoing the norm is tested."""
    model = tiny_llama(seed=seed, layers=4)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        w = torch.empty(64).uniform_(0.3, 2.5, generator=g)
        model.model.norm.weight.copy_(torch.where(torch.rand(64, generator=g) < 0.25, -w, w))
    return model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(target_dir, store_dir, model): a tiny target saved with save_pretrained and a 40-record
    EAGLE-3 store of it (fused layers 1, 2, 3)."""
    base = tmp_path_factory.mktemp("spec")
    model = tiny_target()
    model.save_pretrained(base / "target")
    store = write_tiny_store(model, base / "store", records=40, target_path=str(base / "target"),
                             feature_layers=LAYERS)
    return base / "target", store, model


def test_written_files_are_the_stores_records(tiny, tmp_path):
    target, store_dir, _ = tiny
    records = [5, 0, 17, 3]
    w = rs.final_norm_weight(target)
    out = rs.write_data(store_dir, records, tmp_path / "data", w, arrow=False)
    store = FeatureStore(store_dir)
    h = store.hidden_size
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    meta = json.loads((out / rs.META).read_text())
    assert len(rows) == len(records) + 1 and meta["train_rows"] == len(records) and meta["aux_layers"] == [1, 2, 3]
    for i, r in enumerate([*records, records[0]]):  # the last row: the validation copy of the first record
        rec = store[r]
        hs = load_file(str(rs.hs_file(out, i)))
        assert set(hs) == {"hidden_states", "token_ids"}
        t = rec.input_ids.numel()
        assert hs["token_ids"].dtype == torch.int64 and torch.equal(hs["token_ids"], rec.input_ids)
        assert hs["hidden_states"].shape == (t, 4, h) and hs["hidden_states"].dtype == rec.hidden_states.dtype
        # speculators' reader: hidden_states[:, :-1] flattened is the fc input, [:, -1] the verifier's last layer
        assert torch.equal(hs["hidden_states"][:, :-1].flatten(1), rec.aux_hidden_states)
        assert torch.equal(hs["hidden_states"][:, -1], (rec.hidden_states.float() / w.float()).to(rec.hidden_states.dtype))
        assert rows[i]["input_ids"] == rec.input_ids.tolist()
        assert rows[i]["loss_mask"] == rec.loss_mask.long().tolist()


def test_the_written_last_layer_normed_by_speculators_is_the_stores_feature(tiny):
    """x' = y / w: rms(x') = 1, so the verifier norm (Llama's RMSNorm with the target's weight and
    eps, fp32) of x' gives back y up to eps; stored in bf16, up to bf16 rounding."""
    target, store_dir, model = tiny
    store = FeatureStore(store_dir)
    w = rs.final_norm_weight(target)
    eps = model.config.rms_norm_eps
    norm = LlamaRMSNorm(store.hidden_size, eps=eps)
    with torch.no_grad():
        norm.weight.copy_(w.float())
    for r in (0, 9, 33):
        y = store[r].hidden_states.float()  # bf16 in the store
        x = rs.invert_final_norm(y, w)
        rms = x.pow(2).mean(-1).sqrt()
        assert torch.allclose(rms, torch.ones_like(rms), atol=1e-2)  # 1 up to eps and y's bf16 rounding
        with torch.no_grad():
            again = norm(x)  # fp32 in, fp32 out
            assert torch.allclose(again, y, rtol=1e-2, atol=1e-5)
            assert torch.allclose(again, rs.rms_norm(x, w, eps), rtol=1e-6, atol=1e-6)
            stored = norm(x.to(torch.bfloat16))  # as speculators reads it: bf16 states, fp32 weight
        assert (stored - y).abs().max() <= 2 ** -7 * y.abs().max()
        # x' is the target's own pre-norm last layer (what vLLM captures) divided by its rms
        seen = []
        hook = model.model.norm.register_forward_hook(lambda mod, args, out: seen.append(args[0][0].float()))
        with torch.no_grad():
            model(store[r].input_ids[None])
        hook.remove()
        pre = seen[0]
        scaled = pre * torch.rsqrt(pre.pow(2).mean(-1, keepdim=True) + eps)
        assert (x - scaled).abs().max() <= 2 ** -7 * scaled.abs().max()


def test_a_norm_weight_with_zeros_is_refused():
    w = torch.ones(8)
    w[3] = 0
    with pytest.raises(ValueError, match="zero entries"):
        rs.invert_final_norm(torch.randn(2, 8), w)


def test_draft_vocabulary_files_follow_speculators_convention(tmp_path):
    ids = [40, 3, 127, 8, 64]  # any order in, ascending target-id order out
    d2t_path, t2d_path = rs.write_vocab(ids, 128, tmp_path)
    d2t, t2d = np.load(d2t_path), np.load(t2d_path)
    assert d2t.dtype == np.int64 and t2d.dtype == np.bool_ and t2d.shape == (128,)
    assert (d2t + np.arange(len(ids))).tolist() == sorted(ids)
    assert np.flatnonzero(t2d).tolist() == sorted(ids)
    assert rs.write_vocab(list(range(128)), 128, tmp_path) is None  # the whole vocabulary: no mapping
    with pytest.raises(ValueError):
        rs.write_vocab([1, 1, 2], 128, tmp_path)


def test_recipes_map_to_speculators_flags():
    ref = rs.reference_recipe(100, 4096)
    flags = rs.recipe_flags(ref)
    value = dict(zip(flags[::2], flags[1::2]))
    assert value == {"--lr": "0.001", "--weight-decay": "0.01", "--optimizer": "muon", "--scheduler-type": "linear",
                     "--scheduler-warmup-steps": "1", "--ttt-steps": "3", "--ttt-step-loss-decay": "1.0",
                     "--loss-fn": "kl_div", "--max-steps": "100", "--total-seq-len": "4096", "--seed": "42"}
    soft_ce = Recipe("x", 10, 512, lr=5e-4, schedule="constant", warmup_steps=0, weight_decay=0.0, ttt_steps=7,
                     ttt_decay=0.8, loss="ce", min_lr_ratio=0.1)
    flags = rs.recipe_flags(soft_ce)
    assert "kl_div" in flags and "none" in flags and "--launcher-min-lr-ratio" not in flags  # constant: no decay
    flags = rs.recipe_flags(Recipe(**{**soft_ce.__dict__, "schedule": "cosine"}))
    assert flags[flags.index("--launcher-min-lr-ratio") + 1] == "0.1"
    for bad in ({"min_lr_ratio": 1.0}, {"loss": "feature+ce"}, {"optimizer": "sgd"}, {"schedule": "step"}):
        with pytest.raises(ValueError):
            rs.recipe_flags(Recipe(**{**soft_ce.__dict__, **bad}))


@pytest.fixture(scope="module")
def data(tiny, tmp_path_factory):
    """30 records of the tiny store as speculators' training data (needs the venv for the Arrow dataset)."""
    reason = rs.available()
    if reason:
        pytest.skip(reason)
    target, store_dir, _ = tiny
    out = rs.write_data(store_dir, list(range(30)), tmp_path_factory.mktemp("spec") / "data", rs.final_norm_weight(target))
    assert (out / "state.json").exists()
    return out


@pytest.mark.slow
def test_speculators_trains_a_few_steps_on_this_cpu(tiny, data, tmp_path):
    target = tiny[0]
    draft_ids = list(range(127, 0, -2))  # 64 target ids, descending: train() sorts them
    recipe = rs.reference_recipe(4, 256)
    run = rs.train(data, target, tmp_path / "run", recipe, draft_ids, threads=1)
    assert [p.step for p in run.curve] == [1, 2, 3, 4]
    assert all(math.isfinite(p.loss) and p.loss > 0 and 0 <= p.top1 <= 1 for p in run.curve)
    assert run.tokens > 0 and run.seconds > 0 and run.recipe == recipe
    config = json.loads((run.head_dir / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and (run.head_dir / "model.safetensors").exists()
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3] and config["draft_vocab_size"] == 64
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["cpu_patches"] and summary["device_type"] == "cpu"
    assert summary["architecture"]["norm_before_fc"] and summary["architecture"]["layer_types"] == ["full_attention"]
    weights = load_file(str(run.head_dir / "model.safetensors"))
    assert (weights["d2t"] + torch.arange(64)).tolist() == sorted(draft_ids)

    from eagle.heads.checkpoint import load_head

    head = load_head(run.head_dir, dtype=torch.float32)
    assert head.config.architecture == "eagle3" and head.config.feature_layers == [1, 2, 3]
    assert (head.config.norm_before_fc, head.config.norm_before_residual, head.config.norm_output) == (True,) * 3
    assert head.draft_ids.tolist() == sorted(draft_ids)

    # the head as we load it drafts what speculators' own model drafts: first-step logits of one record
    row = rs.hs_file(data, 3)
    theirs = tmp_path / "theirs.safetensors"
    subprocess.run([str(rs.PYTHON), "-c", THEIR_FIRST_STEP, str(run.head_dir), str(row), str(theirs)], check=True,
                   cwd=tmp_path, env=clean_env(OMP_NUM_THREADS="1"), capture_output=True)
    hs = load_file(str(row))
    ids, aux = hs["token_ids"], hs["hidden_states"][:, :-1].flatten(1).float()
    embed = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).model.embed_tokens
    with torch.no_grad():
        state, _ = head(aux[:-1][None], embed(ids[1:][None]), position_ids=torch.arange(ids.numel() - 1)[None])
        ours = head.logits(state)[0]
    expected = load_file(str(theirs))["logits"]
    assert torch.allclose(ours, expected, atol=1e-4, rtol=1e-4)


# speculators' Eagle3DraftModel (fp32, sdpa) on one hs file, as its trainer feeds it after shift_batch
# (fused features at t, token at t+1, positions from 1): the lm_head output of its first TTT step.
THEIR_FIRST_STEP = """
import sys, torch
from safetensors.torch import load_file, save_file
from speculators.models.eagle3 import Eagle3DraftModel
head, row, out = sys.argv[1:4]
cfg = Eagle3DraftModel.config_class.from_pretrained(head)
cfg.transformer_layer_config._attn_implementation = "sdpa"
model = Eagle3DraftModel.from_pretrained(head, config=cfg).float().eval()
hs = load_file(row)
ids, aux = hs["token_ids"], hs["hidden_states"][:, :-1].flatten(1).float()
seen = []
model.lm_head.register_forward_hook(lambda mod, args, output: seen.append(output.detach().clone()))
n = ids.numel() - 1
with torch.no_grad():
    model(hidden_states=aux[:-1][None], input_ids=ids[1:][None], document_ids=torch.zeros(1, n, dtype=torch.long),
          position_ids=torch.arange(1, n + 1)[None], ttt_steps=1)
save_file({"logits": seen[0][0].contiguous()}, out)
"""


@pytest.mark.slow
def test_a_recipe_with_a_floor_on_the_lr_runs_with_it(tiny, data, tmp_path):
    """Our kind of recipe on speculators' code: cosine to 0.5 x lr after 1 warmup step, soft CE (run as
    kl_div), AdamW, 2 TTT steps decayed by 0.8."""
    recipe = Recipe("ours", 4, 256, lr=2e-3, schedule="cosine", warmup_steps=1, weight_decay=0.0, ttt_steps=2,
                    ttt_decay=0.8, loss="ce", min_lr_ratio=0.5, seed=0)
    run = rs.train(data, tiny[0], tmp_path / "run", recipe, list(range(128)), threads=1)  # whole vocabulary
    assert len(run.curve) == 4 and all(math.isfinite(p.loss) for p in run.curve)
    rows = [json.loads(line)["record"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    lrs = [r["lr"] for r in rows if "train" in r]
    cosine = [0.5 * (1 + math.cos(math.pi * (s - 1) / 3)) for s in range(1, 4)]
    assert lrs == pytest.approx([0.0, *(2e-3 * (0.5 + 0.5 * c) for c in cosine)])
    assert set(rows[-2]["train"]) >= {"loss_0", "loss_1"} and "loss_2" not in rows[-2]["train"]
    config = json.loads((run.head_dir / "config.json").read_text())
    assert config["draft_vocab_size"] == 128 and config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 2
