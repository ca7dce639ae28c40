"""The EAGLE authors' EAGLE-1/2 trainer as a parity reference (evaluation/ref_eagle_llm.py).

The fast tests check the converter without its venv: our store as its files, its checkpoint as our
head, and the launcher's helpers (scripts/consumers/eagle_llm_train.py uses only torch and
safetensors above its `main`). The slow test runs its trainer for 3 steps on a tiny store in
`.consumers/eagle-llm` and skips with one line when that venv is absent.
"""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from data_prep.store import FeatureStore
from eagle import EaModel
from eagle.heads.checkpoint import load_head
from evaluation import ref_eagle_llm as ref
from evaluation.parity_run import Recipe, TrainerRun
from tests.tiny import FIXED, ROOT, hf_greedy, prompt, tiny_llama, write_tiny_store
from train.loss import make_pairs


def launcher():
    spec = importlib.util.spec_from_file_location("eagle_llm_train", ROOT / "scripts" / "consumers" / "eagle_llm_train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(target_dir, store_dir, model): a tiny random Llama and a 40-record store of it."""
    base = tmp_path_factory.mktemp("eagle-llm")
    model = tiny_llama(seed=0)
    model.save_pretrained(base / "target")
    write_tiny_store(model, base / "store", records=40, target_path=str(base / "target"))
    return base / "target", base / "store", model


# ---------------------------------------------------------------- our store -> its files

@pytest.mark.parametrize("n", [1, 2, 19, 20, 21, 64, 100, 999, 2100])
def test_heldout_links_make_its_train_split_exactly_our_records(n):
    k = ref.heldout_links(n)
    assert k >= 1 and int((n + k) * 0.95) == n
    assert launcher().split_sizes(n + k) == n


def test_conversation_shifts_the_mask_so_it_scores_our_pairs():
    ids = torch.tensor([5, 6, 7, 8, 9], dtype=torch.int32)
    mask = torch.tensor([0, 0, 1, 1, 0], dtype=torch.uint8)
    hidden = torch.randn(5, 4).bfloat16()
    item = ref.conversation(ids, mask, hidden)
    assert item["input_ids"].dtype == torch.int64 and item["loss_mask"].dtype == torch.int64
    assert item["hidden_state"].dtype == torch.float16
    assert torch.equal(item["hidden_state"].float(), hidden.float())  # bf16 -> fp16 is exact in range
    assert item["loss_mask"].tolist() == [0, 1, 1, 0, 0]


def test_write_data_pairs_equal_make_pairs(tiny, tmp_path):
    """Its dataset pairs position t as (hidden[t], ids[t+1]) -> hidden[t+1] and scores it where the
    file's loss_mask[t] is 1 (the last position never): the same pairs make_pairs scores."""
    _, store_dir, _ = tiny
    records = [3, 0, 7, 12]
    out = ref.write_data(store_dir, records, tmp_path / "data")
    data = out / ref.RECORDS
    assert sorted(p.name for p in data.iterdir() if p.is_file()) == sorted(f"data_{i}.ckpt" for i in records)
    assert len(list((data / ref.HELDOUT).iterdir())) == ref.heldout_links(len(records))
    store = FeatureStore(store_dir)
    meta = json.loads((out / ref.META).read_text())
    assert meta["records"] == records and meta["lengths"] == [store.length(i) for i in records]
    scored = 0
    for i in records:
        rec = store[i]
        item = torch.load(data / f"data_{i}.ckpt")
        assert torch.equal(item["input_ids"], rec.input_ids.long())
        assert torch.equal(item["hidden_state"].float(), rec.hidden_states.float())
        ours = make_pairs(rec.input_ids[None].long(), rec.loss_mask[None], rec.hidden_states[None].float())
        # its pairs, from its dataset's description: input ids[1:], target hidden[1:], mask as stored, last 0
        its_mask = item["loss_mask"].clone()
        its_mask[-1] = 0
        t = len(item["input_ids"]) - 1
        assert torch.equal(its_mask[:t].bool(), ours.mask[0])
        assert torch.equal(item["input_ids"][1:], ours.next_ids[0])
        assert torch.equal(item["hidden_state"][1:].float(), ours.target[0])
        assert its_mask[t] == 0
        scored += int(ours.mask.sum())
    assert meta["scored_pairs"] == scored


# ---------------------------------------------------------------- its checkpoint -> our head

def its_state(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """A state dict with the names and shapes of its `Model` (eagle/model/cnets.py) for a config."""
    g = torch.Generator().manual_seed(seed)
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * d
    shapes = {
        "embed_tokens.weight": (v, h), "fc.weight": (h, 2 * h), "fc.bias": (h,),
        "layers.0.self_attn.q_proj.weight": (h, h), "layers.0.self_attn.k_proj.weight": (kv, h),
        "layers.0.self_attn.v_proj.weight": (kv, h), "layers.0.self_attn.o_proj.weight": (h, h),
        "layers.0.mlp.gate_proj.weight": (inter, h), "layers.0.mlp.up_proj.weight": (inter, h),
        "layers.0.mlp.down_proj.weight": (h, inter), "layers.0.post_attention_layernorm.weight": (h,),
    }
    return {k: torch.randn(s, generator=g) for k, s in shapes.items()}


SMOLLM2 = {  # the target's config.json as transformers 5 writes it (rope_parameters, tied embeddings)
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
    "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
    "head_dim": 64, "hidden_act": "silu", "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}, "tie_word_embeddings": True,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
}


def test_head_config_is_one_layer_without_rope_scaling():
    cfg = launcher().head_config(SMOLLM2)
    assert cfg["num_hidden_layers"] == 1 and cfg["rope_scaling"] is None
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (576, 9, 3)
    with pytest.raises(ValueError, match="head_dim"):
        launcher().head_config({**SMOLLM2, "head_dim": 128})


def test_convert_maps_every_key_and_shape(tmp_path):
    econfig = launcher().head_config({**SMOLLM2, "vocab_size": 300})
    state = its_state(econfig)
    (tmp_path / "state").mkdir()
    torch.save(state, tmp_path / "state" / "pytorch_model.bin")
    (tmp_path / "state" / "config.json").write_text(json.dumps(econfig))
    head_dir = ref.convert(tmp_path / "state", tmp_path / "head", target="smollm2")
    stored = load_file(str(head_dir / "model.safetensors"))
    assert set(stored) == set(state) - {"embed_tokens.weight"}
    head = load_head(head_dir, dtype=torch.float32)
    own = head.state_dict()
    assert set(own) == set(stored)
    for k, v in own.items():
        assert torch.equal(v, state[k]), k  # fp32: unrounded
    cfg = head.config
    assert (cfg.architecture, cfg.fc_bias, cfg.rope_theta, cfg.rope_scaling) == ("eagle2", True, 10000.0, None)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps) == (9, 3, 64, 1e-5)
    assert json.loads((head_dir / "config.json").read_text())["rope_theta"] == 10000.0


def test_map_state_refuses_keys_it_cannot_place():
    with pytest.raises(ValueError, match="no place"):
        ref.map_state({"fc.weight": torch.zeros(2, 4), "norm.weight": torch.zeros(2)})


# ---------------------------------------------------------------- launcher helpers, recipe, curve

@pytest.mark.parametrize("tied", [True, False])
def test_base_view_indexes_the_weights_and_an_lm_head(tmp_path, tied):
    model = tiny_llama(seed=1)
    if tied:
        model.config.tie_word_embeddings = True
        model.lm_head.weight = model.model.embed_tokens.weight
    model.save_pretrained(tmp_path / "target")
    view = launcher().base_view(tmp_path / "target", tmp_path / "base")
    weight_map = json.loads((view / "model.safetensors.index.json").read_text())["weight_map"]
    with safe_open(str(view / weight_map["lm_head.weight"]), framework="pt") as f:
        lm_head = f.get_tensor("lm_head.weight")
    with safe_open(str(view / weight_map["model.embed_tokens.weight"]), framework="pt") as f:
        assert torch.equal(f.get_tensor("model.embed_tokens.weight"), model.model.embed_tokens.weight)
    assert torch.equal(lm_head, model.lm_head.weight)
    assert (view / "lm_head.safetensors").exists() == tied
    assert (view / "config.json").is_symlink()


def test_lr_multiplier_is_hf_linear_warmup_then_decay():
    f = launcher().lr_multiplier(10, 110, "linear", 0.0)
    assert [f(s) for s in (0, 5, 10, 60, 110, 200)] == [0.0, 0.5, 1.0, 0.5, 0.0, 0.0]
    g = launcher().lr_multiplier(0, 100, "cosine", 0.1)
    assert g(0) == 1.0 and math.isclose(g(50), 0.55) and math.isclose(g(100), 0.1)
    assert launcher().lr_multiplier(4, 100, "constant", 0.0)(50) == 1.0


def test_reference_recipe_batch_rows_and_decay_horizon():
    r = ref.reference_recipe(10, 4096)
    assert (r.lr, r.warmup_steps, r.weight_decay, r.schedule, r.loss, r.ttt_steps) == (3e-5, 2000, 0.01, "linear", "feature+ce", 1)
    assert ref.decay_horizon(r) == 800_000 and ref.decay_horizon(r, 50) == 50
    assert ref.decay_horizon(Recipe(**{**r.__dict__, "name": "ours"})) == 10  # ours decays over the run
    assert ref.batch_rows(4096, [1000, 1024, 12]) == 4 and ref.batch_rows(100, [1024]) == 1


def test_read_curve_takes_the_per_step_dicts(tmp_path):
    log = tmp_path / "wandb_log.jsonl"
    log.write_text("\n".join(json.dumps(r) for r in [
        {"init": {"project": "ess"}}, {"schedule": {}},
        {"step": 1, "train/loss": 2.5, "train/acc": 0.25, "train/lr": 0.0},
        {"step": 3, "train/loss": 2.0, "train/acc": 0.5}]))
    curve = ref.read_curve(log)
    assert [(p.step, p.loss, p.top1) for p in curve] == [(1, 2.5, 0.25), (3, 2.0, 0.5)]


def test_available_names_the_setup_command(tmp_path, monkeypatch):
    monkeypatch.setattr(ref, "VENV", tmp_path / "eagle-llm")
    monkeypatch.setattr(ref, "PYTHON", tmp_path / "eagle-llm" / "bin" / "python")
    assert "bash scripts/setup_consumers.sh eagle-llm" in ref.available()


def test_train_refuses_a_recipe_it_cannot_run(tmp_path, monkeypatch):
    monkeypatch.setattr(ref, "available", lambda: None)
    recipe = Recipe(name="ours", steps=3, batch_tokens=256, lr=1e-3, schedule="linear", warmup_steps=0,
                    weight_decay=0.0, ttt_steps=3, ttt_decay=0.8, loss="ce")
    with pytest.raises(ValueError, match="plain EAGLE"):
        ref.train(tmp_path, tmp_path, tmp_path, recipe, None)


# ---------------------------------------------------------------- its trainer, 3 steps

@pytest.mark.slow
def test_its_trainer_runs_three_steps_and_its_head_drafts(tiny, tmp_path):
    reason = ref.available()
    if reason:
        pytest.skip(reason)
    target_dir, store_dir, model = tiny
    data = ref.write_data(store_dir, list(range(30)), tmp_path / "data")
    recipe = Recipe(name="ours", steps=3, batch_tokens=256, lr=1e-3, schedule="linear", warmup_steps=0,
                    weight_decay=0.0, ttt_steps=1, ttt_decay=1.0, loss="feature+ce")
    run = ref.train(data, target_dir, tmp_path / "out", recipe, None, threads=1, num_workers=0, timeout=600)
    assert [p.step for p in run.curve] == [1, 2, 3]
    assert all(math.isfinite(p.loss) and 0.0 <= p.top1 <= 1.0 for p in run.curve)
    assert run.seconds > 0 and run.tokens > 0 and run.trainer == "eagle-llm"
    assert TrainerRun.from_json(json.loads((tmp_path / "out" / "trainer_run.json").read_text())).curve == run.curve
    assert json.loads((tmp_path / "out" / "check.json").read_text())["max_relative_difference"] < 1e-4
    lrs = [json.loads(line).get("train/lr") for line in (tmp_path / "out" / "run" / "wandb_log.jsonl").read_text().splitlines()]
    # the lr it logs after each step: the recipe's, decaying linearly to 0 at the run's end
    assert [lr for lr in lrs if lr is not None] == pytest.approx([2e-3 / 3, 1e-3 / 3, 0.0], abs=1e-9)
    head = load_head(run.head_dir, dtype=torch.float32)
    assert head.config.rope_theta == 10000.0 and head.config.fc_bias
    ids = prompt(0, 6)
    out = EaModel(model, head, settings=FIXED).eagenerate(ids, max_new_tokens=12)
    assert torch.equal(out, hf_greedy(model, ids, 12))  # it drafts, and decoding stays lossless
