"""Every YAML in conf/ composes, for both entry points and every model/data/deepspeed choice."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from data_prep.presets import model_presets

CONF = Path(__file__).resolve().parents[1] / "conf"
MODELS = model_presets(CONF)
DATAS = sorted(p.stem for p in (CONF / "data").glob("*.yaml"))


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("data", DATAS)
def test_data_prep_config_composes(model, data):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(config_name="config", overrides=[f"+model={model}", f"data={data}", "data.source=x.jsonl"])
    OmegaConf.resolve(cfg)
    assert cfg.model.name in cfg.store_dir
    assert cfg.model.max_len > 0 and cfg.model.feature_layers


def test_model_is_not_a_default():
    defaults = OmegaConf.load(CONF / "config.yaml").defaults
    assert not any("model" in (d if isinstance(d, str) else list(d)[0]) for d in defaults)


EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_presets_compose_and_validate(experiment):
    from train.config import validate

    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(config_name="config", overrides=["+model=smollm2_135m", f"+experiment={experiment}"])
    cfg = validate(cfg)
    OmegaConf.resolve(cfg)
    assert experiment.split("_", 1)[1] in cfg.output_dir  # each preset writes its own run folder
    assert cfg.train.draft_vocab and cfg.train.tau_every > 0


def test_unknown_model_preset_is_one_line():
    from data_prep.presets import unknown_model

    assert unknown_model(["+model=smollm2_135m", "train.lr=1e-4"]) is None
    message = unknown_model(["+model=vicuna7", "data.limit=3"])
    assert "\n" not in message and "'vicuna7'" in message and "vicuna7b" in message
    assert unknown_model(["train.lr=1"]) is None


def test_the_shipped_recipe_chains_its_stages():
    """Each stage of the shipped SmolLM2 heads starts from the previous stage's exported head;
    EAGLE-1/2's stage 3 trains on stage 2's store, so it regenerates nothing; EAGLE-3's later stages, and
    EAGLE-2's stage 4, on conversations past the stage before's, or a second time over one slice."""

    def composed(experiment):
        with initialize_config_dir(config_dir=str(CONF), version_base=None):
            cfg = compose(config_name="config", overrides=["+model=smollm2_135m", f"+experiment={experiment}"])
        OmegaConf.resolve(cfg)
        return cfg

    stage1, stage2, stage3 = (composed(e) for e in ("smollm2_vocab8k", "smollm2_regen", "smollm2_ttt4"))
    assert stage2.train.init_head == f"{stage1.output_dir}/head"
    assert stage3.train.init_head == f"{stage2.output_dir}/head"
    assert stage3.store_dir == stage2.store_dir and stage3.data.regenerate
    assert (stage2.train.ttt_steps, stage3.train.ttt_steps) == (2, 4)
    eagle3 = ("smollm2_eagle3", *(f"smollm2_eagle3_slice{n}" for n in range(2, 7)), "smollm2_eagle3_slice2_pass2",
              "smollm2_eagle3_slice7", "smollm2_eagle3_slice3_pass2", "smollm2_eagle3_slice8",
              "smollm2_eagle3_slice9", *(f"smollm2_eagle3_slice{n}" for n in range(10, 15)),
              "smollm2_eagle3_slice14_pass2", "smollm2_eagle3_slice15", "smollm2_eagle3_slice16",
              "smollm2_eagle3_slice17")
    stages = [composed(e) for e in eagle3]
    new_slices, passed_twice = stages[:1], []
    for name, before, after in zip(eagle3[1:], stages, stages[1:]):
        assert after.train.init_head == f"{before.output_dir}/head", name
        assert (after.train.epochs, after.train.head) == (1, "eagle3"), name
        # the draft vocabulary of 8,192 tokens, widened once (stage 17) to 16,384
        assert after.train.draft_vocab in (before.train.draft_vocab, 16384), name
        stores = [s.store_dir for s in new_slices]
        if name.endswith("_pass2"):  # a second epoch over a slice one earlier stage passed over once, from its store
            assert after.store_dir in stores and after.store_dir not in passed_twice, name
            passed_twice.append(after.store_dir)
        else:  # conversations no stage before saw
            assert after.data.offset >= max(s.data.offset + s.data.limit for s in new_slices), name
            assert after.store_dir not in stores, name
            new_slices.append(after)
    # one schedule of three epochs over every slice of the target's replies, from the last stage's head
    regen4 = composed("smollm2_eagle3_regen4")
    assert regen4.train.init_head == f"{stages[-1].output_dir}/head" and regen4.train.epochs == 3
    regenerated = sorted({s.store_dir for s in stages if s.data.regenerate})
    assert list(regen4.data.source) == [f"{d}/regenerated/chunk-*.jsonl" for d in regenerated]
    assert regen4.train.draft_vocab == stages[-1].train.draft_vocab and regen4.train.export_epochs
    # stage 22: stage 21's shipped head (regen4's second epoch) two epochs over the merged slices 0-2 of the
    # target's replies (data_prep.merge_stores); stage 23: its head two more over slices 0-3
    merged = composed("smollm2_eagle3_regen_c0_3")
    assert merged.train.init_head == f"{regen4.output_dir}/epochs/epoch2/head" and merged.train.epochs == 2
    assert merged.store_dir.endswith("/regen-c0-3149-regenTrue-len1024-layers2_15_27_-1") and merged.train.export_epochs
    merged4 = composed("smollm2_eagle3_regen_c0_4")
    assert merged4.train.init_head == f"{merged.output_dir}/head" and merged4.train.epochs == 2
    assert merged4.store_dir.endswith("/regen-c0-4199-regenTrue-len1024-layers2_15_27_-1") and merged4.train.export_epochs
    merged5 = composed("smollm2_eagle3_regen_c0_5")  # stage 24: the shipped stage 23 over conversations 0-8,399
    assert merged5.train.init_head == f"{merged4.output_dir}/head" and merged5.train.epochs == 2
    assert merged5.store_dir.endswith("/regen-c0-8399-regenTrue-len1024-layers2_15_27_-1") and merged5.train.save_every
    # stage 25: stage 24 as published (12,288 tokens) one epoch over the next four slices, 8,400-12,599, alone
    c8400 = composed("smollm2_eagle3_regen_c8400")
    assert c8400.train.init_head == f"{merged5.output_dir}/published" and c8400.train.epochs == 1
    assert c8400.store_dir.endswith("/regen-c8400-12599-regenTrue-len1024-layers2_15_27_-1")
    assert c8400.train.tau_prompts != "sharegpt-heldout"  # stages 18-21 trained on those prompts
    c12600 = composed("smollm2_eagle3_regen_c12600")  # stage 26: stage 25 uncut, one epoch over the last slice
    assert c12600.train.init_head == f"{c8400.output_dir}/head" and c12600.train.epochs == 1
    assert c12600.store_dir.endswith("/sharegpt_packaged-limit1050-from12600-regenTrue-len1024-layers2_15_27_-1")
    assert c12600.output_dir != c8400.output_dir and c12600.train.tau_prompts == c8400.train.tau_prompts
    deep2 = composed("smollm2_eagle3_deep2")  # stage 24 with a second decoder layer, on its store
    assert deep2.train.init_head == f"{merged5.output_dir}/head" and deep2.train.head_layers == 2
    assert deep2.store_dir == merged5.store_dir and deep2.output_dir != merged5.output_dir
    # EAGLE-2's stage 4: the shipped head on conversations past stage 3's, from EAGLE-3's store of that slice
    eagle2 = composed("smollm2_eagle2_slice4")
    assert eagle2.train.init_head == "checkpoints/eagle-smollm2-135m-instruct" and eagle2.train.keep_init_vocab
    assert eagle2.data.offset >= stage3.data.limit and eagle2.store_dir == new_slices[4].store_dir
    assert (eagle2.train.head, eagle2.train.fc_bias, eagle2.data.regenerate) == ("eagle2", False, False)
    # and its stage 5: the shipped head on EAGLE-3's slice of the target's own replies (stage 16's store)
    eagle2 = composed("smollm2_eagle2_slice5")
    assert eagle2.train.init_head == "checkpoints/eagle-smollm2-135m-instruct" and eagle2.data.regenerate
    assert eagle2.store_dir == stages[eagle3.index("smollm2_eagle3_slice14")].store_dir


def test_the_train_defaults_have_one_value_each():
    """conf/config.yaml's train/wandb/hub sections (what `--cfg job` prints) hold exactly the
    schema's keys and defaults (train/config.py): the two cannot drift apart."""
    from train.config import SCHEMAS

    yaml = OmegaConf.load(CONF / "config.yaml")
    for section, schema in SCHEMAS.items():
        assert OmegaConf.to_container(yaml[section]) == OmegaConf.to_container(OmegaConf.structured(schema)), section


def test_importing_data_prep_registers_nothing():
    """Resolvers are registered by the entry points (data_prep.resolvers), not as an import side effect."""
    import subprocess
    import sys

    code = "import data_prep, train.config; from omegaconf import OmegaConf; print(OmegaConf.has_resolver('layers_tag'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=CONF.parent, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize("model", MODELS)
def test_every_preset_plans_offline(model, monkeypatch, tmp_path):
    """plan=true from the preset alone: no download, the sizes from the preset when the target is not here."""
    from huggingface_hub import constants

    from data_prep.data_config import prep_config
    from data_prep.plan import store_plan

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(config_name="config", overrides=[f"+model={model}", "data.limit=50", f"store_dir={tmp_path}"])
    plan = store_plan(prep_config(cfg))
    assert plan.tokens > 0 and plan.bytes_per_token > 2 * plan.target.hidden and plan.memory
    assert not any("train" in line for line in plan.lines())  # data_prep's plan: the store's side only


def test_the_plan_costs_store_and_online_and_recommends_one(tmp_path):
    """Vicuna-7B on all of ShareGPT: 675 GB of store against one target forward per epoch online. The
    recommendation follows the disk: online when the store cannot fit, the store when it fits easily."""
    from data_prep.plan import GB
    from train.config import validate
    from train.training_plan import training_plan

    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(config_name="config", overrides=["+model=vicuna7b", f"store_dir={tmp_path}"])
    trained = training_plan(validate(cfg))
    plan, choice = trained.store, trained.choice
    text = "\n".join(trained.lines())
    assert "option store (train.features=store): 674.85 GB" in text and "option online" in text
    assert "memory per rank, train device (head" in text
    deeper = training_plan(validate(OmegaConf.merge(cfg, {"train": {"head_layers": 2}})))
    one, two = (int(next(line for line in p.lines() if "train device (head" in line).split("(head ")[1].split("M")[0])
                for p in (trained, deeper))
    assert two > one  # the plan counts every decoder layer
    flops_7b = 2 * plan.target.params * plan.tokens  # one forward of 6.7B parameters over 88.4M tokens
    assert choice.target_flops == flops_7b and 3 < (flops_7b + choice.head_flops) / choice.head_flops < 12
    assert choice.epochs == 20 and choice.online_gb > plan.target.params * 2 / GB
    plan.free_bytes = 100 * plan.store_bytes
    assert choice.recommend(plan)[0] == "store"
    plan.free_bytes = plan.store_bytes // 2
    assert choice.recommend(plan)[0] == "online" and "recommended: train.features=online" in trained.lines()[-1]


def _yaml_section(path: Path, section: str | None) -> dict:
    """A YAML file's section (None: the whole file) as plain values, Hydra's `defaults` left out."""
    node = OmegaConf.load(path)
    node = node if section is None else node.get(section)
    return {k: v for k, v in OmegaConf.to_container(node or {}).items() if k != "defaults"}


def test_the_data_prep_schema_matches_the_yaml():
    """data_prep/data_config.py has exactly the keys of conf/data/sharegpt_packaged.yaml (every data
    preset's base) with its values as defaults; every other data and model preset sets only keys of
    the schema; the top-level keys data_prep reads default to conf/config.yaml's values."""
    from dataclasses import asdict, fields

    from data_prep.data_config import DataConfig, ModelConfig, PrepConfig

    assert _yaml_section(CONF / "data" / "sharegpt_packaged.yaml", None) == asdict(DataConfig())
    data_keys = {f.name for f in fields(DataConfig)}
    for path in sorted((CONF / "data").glob("*.yaml")):
        assert set(_yaml_section(path, None)) <= data_keys, path.name
    model_keys = {f.name for f in fields(ModelConfig)}
    for path in sorted((CONF / "model").glob("*.yaml")) + sorted((CONF / "head").glob("*.yaml")):
        assert set(_yaml_section(path, "model")) <= model_keys, path.name
    for path in sorted((CONF / "model").glob("*.yaml")):
        model = _yaml_section(path, "model")
        assert all(model[f.name] is not None for f in fields(ModelConfig) if f.default is f.default_factory), path.name
    assert _yaml_section(CONF / "head" / "eagle2.yaml", "model")["feature_layers"] == ModelConfig("m", "p", 8).feature_layers
    yaml = OmegaConf.load(CONF / "config.yaml")
    top = {f.name: f.default for f in fields(PrepConfig) if f.name not in ("model", "data", "store_dir")}
    assert top == {k: yaml[k] for k in top} and "store_dir" in yaml


@pytest.mark.parametrize("model", MODELS)
def test_every_preset_converts_to_the_data_prep_schema(model):
    from data_prep.data_config import prep_config

    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        for head in ("eagle2", "eagle3"):
            cfg = compose(config_name="config", overrides=[f"+model={model}", f"head={head}"])
            prep = prep_config(cfg)
            assert prep.model.path == cfg.model.path and prep.store_dir.name in str(cfg.store_dir)
            assert prep.model.feature_layers == list(cfg.model.feature_layers)


@pytest.mark.parametrize(("override", "message"), [
    ("data.limit=many", "data.limit='many': expected an integer or null"),
    ("data.regenerate=3", "data.regenerate=3: expected true or false"),
    ("data.regen.batch_size=1.5", "data.regen.batch_size=1.5: expected an integer"),
    ("+data.limt=4", "data.limt is not a key data_prep knows"),
    ("model.feature_layers=[a]", "model.feature_layers=['a']: expected a list of an integer"),
    ("data.shard_records=0", "data.shard_records and data.batch_tokens must be >= 1"),
])
def test_a_bad_data_prep_key_is_one_error_that_names_it(override, message):
    from data_prep.data_config import ConfigError, prep_config

    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(config_name="config", overrides=["+model=smollm2_135m", override])
    with pytest.raises(ConfigError) as err:
        prep_config(cfg)
    assert message in str(err.value) and "\n" not in str(err.value)
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        bare = compose(config_name="config", overrides=["head=eagle3"])
    with pytest.raises(ConfigError, match=r"\+model=NAME"):
        prep_config(bare)


def test_only_data_prep_has_a_data_config_module():
    assert [p.relative_to(CONF.parent).as_posix() for p in CONF.parent.glob("*/data_config.py")] == ["data_prep/data_config.py"]
