"""What the tests share: tiny seeded random models built in memory, heads, prompts, tiny stores.

Fixtures live in conftest.py; tests import these helpers as `from tests.tiny import ...`.
`write_tiny_store(model, directory)` runs a (tiny, random) causal LM over random token
sequences and writes its hidden states in the store format of data_prep.store.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from data_prep.store import Record, new_manifest, shard_name, write_manifest, write_shard
from eagle.heads.eagle2 import DraftConfig, DraftHead
from eagle.heads.eagle3 import Eagle3Head
from eagle.heads.feature_layers import fused_layers
from eagle.decoding.settings import TreeSettings

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"


def tiny_llama(seed: int = 0, vocab_size: int = 128, hidden_size: int = 64, layers: int = 2,
               dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    """A seeded random Llama small enough for unit tests (sdpa attention, eval mode)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        tie_word_embeddings=False, attn_implementation="sdpa",
    )
    return LlamaForCausalLM(cfg).to(dtype).eval()


def embedded_target_or_skip():
    """Path of the converted embedded default; skip when its package is not installed."""
    from eagle.targets.resolve import resolve_target

    try:
        return resolve_target("smollm2-135m-instruct")
    except FileNotFoundError as e:
        pytest.skip(str(e))


FIXED = TreeSettings(total_token=24, depth=5, top_k=8, lookup=0)  # a fixed tree alone: tests never time the machine
TREES = {  # the tree kinds every greedy-equality test runs
    "dynamic": TreeSettings(tree="dynamic", total_token=12, depth=4, top_k=3),
    "static": TreeSettings(tree="static"),
    "chain": TreeSettings(tree=[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]),
}


def random_head(target, seed: int = 0, layers: int = 1) -> DraftHead:
    torch.manual_seed(seed)
    cfg = DraftConfig.from_target_config(target.config)
    cfg.num_hidden_layers = layers
    return DraftHead(cfg).eval()


def near_bigram_pair(seed: int, vocab_size: int = 128, coupling: float = 0.15):
    """A target that is mostly a bigram model, and a head that drafts that bigram exactly.

    The target's attention and MLP outputs are scaled by `coupling`, so its feature at t is
    close to norm(embed(x_t)) and its next token mostly depends on x_t. The head maps
    (embed(x_{t+1}), f_t) to embed(x_{t+1}) (fc = [I, 0], attention and MLP zeroed), so its
    draft logits are lm_head(embed(x)): the target's bigram up to a positive scale. Greedy
    drafts are then usually right and acceptance lengths > 1 are common, but not always.
    """
    target = tiny_llama(seed, vocab_size=vocab_size)
    with torch.no_grad():
        for layer in target.model.layers:
            layer.self_attn.o_proj.weight.mul_(coupling)
            layer.mlp.down_proj.weight.mul_(coupling)
    return target, bigram_head(target, seed)


def bigram_head(target, seed: int = 0) -> DraftHead:
    """A head whose output is the embedding of its input token: fc = [I, 0], attention and MLP zeroed."""
    head = random_head(target, seed)
    h = target.config.hidden_size
    with torch.no_grad():
        head.fc.weight.copy_(torch.cat([torch.eye(h), torch.zeros(h, h)], dim=1))
        head.fc.bias.zero_()
        head.layers[0].self_attn.o_proj.weight.zero_()
        head.layers[0].mlp.down_proj.weight.zero_()
    return head


def prompt(seed: int, length: int, vocab: int = 128) -> torch.Tensor:
    return torch.randint(3, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


def hf_greedy(target, ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    return target.generate(ids, do_sample=False, max_new_tokens=max_new_tokens, attention_mask=torch.ones_like(ids))


def random_eagle3_head(target, layers=(0, 1), vocab_ids: torch.Tensor | None = None, seed: int = 0,
                       **variants: bool) -> Eagle3Head:
    """A seeded random EAGLE-3 head reading `layers` of `target`, over `vocab_ids` (None = all);
    `variants`: DraftConfig's layer variants (norm_before_fc=True, ...)."""
    cfg = DraftConfig.from_target_config(target.config)
    cfg.architecture, cfg.feature_layers, cfg.fc_bias = "eagle3", list(layers), False
    for name, value in variants.items():
        setattr(cfg, name, value)
    cfg.draft_vocab_size = cfg.vocab_size if vocab_ids is None else vocab_ids.numel()
    torch.manual_seed(seed)
    head = Eagle3Head(cfg).eval()
    head.draft_ids = vocab_ids
    return head


def subset(vocab: int, n: int, seed: int) -> torch.Tensor:
    return torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))[:n]


DIST_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without the process-group variables that in-process
    trainers set (a child would otherwise join this process's group)."""
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS}
    return {**env, **extra}


@torch.no_grad()
def kill_once_checkpointed(args: list[str], cwd: Path, latest: Path, tag: str, timeout: float = 180,
                           env: dict[str, str] | None = None) -> int:
    """Start `args` (a training command) in `cwd` (with `env`, else clean_env()), SIGKILL it once `latest`
    (its checkpoints' latest file) names `tag` or a later step, and return the step of the newest
    checkpoint it left."""
    import signal
    import time

    proc = subprocess.Popen(args, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env or clean_env())
    deadline = time.time() + timeout
    try:
        while time.time() < deadline and proc.poll() is None:
            if latest.exists() and latest.read_text().strip() >= tag:
                break
            time.sleep(0.005)
        assert proc.poll() is None, "the run ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    return int(latest.read_text().strip()[4:])


def write_tiny_store(
    model,
    directory: str | Path,
    records: int = 48,
    min_len: int = 12,
    max_len: int = 48,
    prompt_len: int = 4,
    shard_records: int = 20,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    target_path: str = "",
    feature_layers: tuple[int, ...] = (-1,),
) -> Path:
    """Write a complete store of `records` random sequences; features = hidden_states[-1], and
    the other `feature_layers` (hidden_states indices) side by side as aux_hidden_states."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    out: list[Record] = []
    for _ in range(records):
        n = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        ids = torch.randint(3, cfg.vocab_size, (n,), generator=g)
        states = model(ids[None], output_hidden_states=True).hidden_states
        extra = [states[i][0] for i in fused_layers(feature_layers)]
        mask = torch.zeros(n, dtype=torch.uint8)
        mask[prompt_len:] = 1
        out.append(Record(input_ids=ids, loss_mask=mask, hidden_states=states[-1][0],  # [n, H]
                          aux_hidden_states=torch.cat(extra, dim=-1) if extra else None))  # [n, K*H]
    shards = [
        write_shard(directory / shard_name(k), out[i:i + shard_records], hidden_size=cfg.hidden_size, dtype=dtype)
        for k, i in enumerate(range(0, records, shard_records))
    ]
    target = {
        "name": "tiny-llama", "path": target_path, "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size, "num_layers": cfg.num_hidden_layers, "dtype": str(dtype),
        "feature_layers": list(feature_layers),
    }
    source = {"data": "random tokens", "read": records, "kept": records, "skipped": {}}
    write_manifest(directory, new_manifest(target, source, shards, complete=True, chat_template_sha256=""))
    return directory


def data_prep_config(target_dir, source, store, **extra):
    """The composed data_prep config over a tiny target folder: fp32, shards of 4, `extra` overrides last."""
    from hydra import compose, initialize_config_dir

    overrides = ["+model=smollm2_135m", f"model.path={target_dir}", "model.dtype=float32", f"data.source={source}",
                 "data.shard_records=4", "data.batch_tokens=256", f"store_dir={store}"]
    overrides += [f"{k}={v}" for k, v in extra.items()]
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose(config_name="config", overrides=overrides)


def crash_after(real, n: int):
    """`real` wrapped to raise KeyboardInterrupt at its call n + 1: a run interrupted after n calls."""
    calls = {"n": 0}

    def wrapper(*args, **kwargs):
        if calls["n"] == n:
            raise KeyboardInterrupt
        calls["n"] += 1
        return real(*args, **kwargs)

    return wrapper


@contextmanager
def lock_held_elsewhere(folder: Path, what: str) -> Iterator[subprocess.Popen]:
    """Another process holds eagle.common.locks's lock on `folder` for the block (yielded: its pid names
    it); killed after, which is what releases the lock."""
    code = ("import time; from eagle.common.locks import exclusive\n"
            f"with exclusive({str(folder)!r}, {what!r}):\n    print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              env=clean_env())
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()
        holder.wait()


def tiny_target_and_store(base: Path, feature_layers: tuple[int, ...] = (-1,)) -> tuple[Path, Path]:
    """(target_dir, store_dir) under `base`: a tiny random target (seed 0) and a complete 48-record store of it,
    holding `feature_layers` (EAGLE-3: e.g. (0, 1, -1))."""
    model = tiny_llama(seed=0)
    model.save_pretrained(base / "target")
    write_tiny_store(model, base / "store", records=48, target_path=str(base / "target"), feature_layers=feature_layers)
    return base / "target", base / "store"
