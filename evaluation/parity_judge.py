"""The parity comparison's judge: every head decoded alike by our decoder and, when installed, by vLLM.

    judge = ParityJudge(target_dir, prompts="mtbench", num_prompts=80, max_new_tokens=256, dtype=torch.bfloat16)
    scores = judge.score(head_dir)   # {"chain3_tau", "chain3_accept": [α1, α2, α3], "tree_tau", ...}
    scores = cached_scores(path, {name: head_dir}, settings, make_judge)   # judged once per name, settings and weights

Our decoder, greedy (or sampled at `temperature`, seeded per prompt): a chain of 3 drafted tokens
(vLLM's `num_speculative_tokens=3`; per-position acceptance = share of steps whose draft was
accepted at least that deep) and the EAGLE-2 dynamic tree the trainer's judge uses
(train/judge.py). vLLM (evaluation/serving.py `run_vllm`): its own
acceptance counters on the same prompt token ids, for heads vLLM serves (not an EAGLE-1/2 head with
an fc bias); skipped with the reason otherwise.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import torch

from data_prep.prompt_sets import held_back_prompts
from eagle.decoding.settings import TreeSettings
from eagle.decoding.stats import GenerationStats
from eagle.decoding.tree import chain_choices
from eagle.heads.checkpoint import load_head
from eagle.model import EaModel
from eagle.targets.resolve import load_target
from eagle.targets.tokenizer import load_tokenizer
from evaluation.serving import ConsumerMissing, run_vllm, vllm_method
from train.judge import TREES, encode_prompts

log = logging.getLogger("parity")


class ParityJudge:
    """One target, one prompt list; `score` decodes a head with both judges."""

    def __init__(self, target_dir: Path, prompts: str, num_prompts: int, max_new_tokens: int,
                 dtype: torch.dtype, spec_tokens: int = 3, vllm: bool = True, ours: bool = True,
                 temperature: float = 0.0):
        """vllm / ours: judge with vLLM's counters / with our decoder (eager, so slower on long runs);
        temperature: 0 greedy, else both judges sample (the acceptance of speculative sampling)."""
        self.target_dir, self.max_new_tokens, self.dtype = target_dir, max_new_tokens, dtype
        self.temperature = temperature
        self.spec_tokens, self.vllm, self.ours = spec_tokens, vllm, ours
        self.tokenizer = load_tokenizer(target_dir)
        self.prompts = encode_prompts(self.tokenizer, held_back_prompts(prompts, num_prompts))
        self.target = load_target(target_dir, dtype) if ours else None  # vLLM loads its own

    def score(self, head_dir: Path) -> dict:
        head = load_head(head_dir, dtype=self.dtype)
        out = {}
        if self.ours:
            for name, settings in judge_settings(self.spec_tokens).items():
                out.update(self._ours(head, name, settings))
        out.update(self._vllm(head_dir, head.config))
        return out

    def _ours(self, head, name: str, settings: TreeSettings) -> dict:
        """τ and acceptance by depth of our decoder (eager: acceptance does not depend on compiling)."""
        model = EaModel(self.target, head, self.tokenizer, settings, compile=False)
        pooled, start = GenerationStats(name), time.perf_counter()  # every prompt's steps together
        for i, ids in enumerate(self.prompts):
            torch.manual_seed(i)  # sampled: the same draws for every head
            model.eagenerate(ids, temperature=self.temperature, max_new_tokens=self.max_new_tokens)
            stats = model.last_stats
            pooled.accept_lengths += stats.accept_lengths
            pooled.new_tokens, pooled.steps = pooled.new_tokens + stats.new_tokens, pooled.steps + stats.steps
        accept = pooled.acceptance_by_depth()
        if name == "chain3":  # every position of the chain, also those never reached
            accept += [0.0] * (self.spec_tokens - len(accept))
        seconds = time.perf_counter() - start
        log.info("  our %s: tau %.2f over %d prompts (%.0f s)", name, pooled.tau, len(self.prompts), seconds)
        return {f"{name}_tau": pooled.tau, f"{name}_accept": accept, f"{name}_seconds": seconds}

    def _vllm(self, head_dir: Path, config) -> dict:
        if not self.vllm:
            return {"vllm_skipped": "not asked (--no-vllm)"}
        if config.architecture == "eagle2" and config.fc_bias:
            return {"vllm_skipped": "an EAGLE-1/2 head with an fc bias: vLLM's EAGLE-1 model has none"}
        dtype = str(self.dtype).removeprefix("torch.")
        try:
            got = run_vllm(self.target_dir, self.prompts, self.max_new_tokens, head_dir, vllm_method(head_dir),
                           self.spec_tokens, dtype, self.temperature)
        except ConsumerMissing as e:
            return {"vllm_skipped": str(e)}
        drafts = max(got["drafts"], 1)
        log.info("  vLLM, %d speculative tokens: tau %.2f", self.spec_tokens, got["mean_acceptance_length"])
        return {"vllm_tau": got["mean_acceptance_length"],
                "vllm_accept": [n / drafts for n in got["accepted_per_position"]], "vllm": got["vllm"]}


def judge_settings(spec_tokens: int) -> dict[str, TreeSettings]:
    """Our decoder's two judges of a head: a chain of `spec_tokens` (as vLLM drafts) and the τ judge's tree
    (train/judge.py), both without a prompt-lookup chain: the head's acceptance alone."""
    return {"chain3": TreeSettings(tree=chain_choices(spec_tokens), lookup=0), "tree": TREES["tree"]}


def scores_key(prompts: str, num_prompts: int, max_new_tokens: int, dtype: str, vllm: bool, ours: bool,
               temperature: float = 0.0) -> str:
    """The settings part of a cached score's key (cached_scores): prompts, sizes, dtype, the judges that ran
    and, when sampled, the temperature."""
    judges = "+".join(name for name, on in (("vllm", vllm), ("ours", ours)) if on)
    sampled = f"-t{temperature:g}" if temperature else ""
    return f"{prompts}-{num_prompts}x{max_new_tokens}-{dtype}-{judges}{sampled}"


HEAD_FILES = ("*.safetensors", "*.bin", "*.pt", "config.json", "draft_vocab.json")  # what a head decodes from


def head_fingerprint(head_dir: Path) -> str | None:
    """sha256 (16 hex digits) of the files a head folder decodes from; None when it holds none (gone)."""
    files = sorted({f for pattern in HEAD_FILES for f in Path(head_dir).glob(pattern) if f.is_file()})
    if not files:
        return None
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:16]


def cached_scores(path: Path, heads: dict[str, Path], settings: str, make_judge: Callable[[], ParityJudge]
                  ) -> dict[str, dict]:
    """Scores of `heads` (name -> head folder) judged under `settings`, read from the JSON file `path`
    (keyed "name|settings") or judged by `make_judge()` and added to it one head at a time. A score keeps
    its head's fingerprint ("head_sha256"): a folder written anew since (a new stage exported or published into
    it) is judged again; a folder gone keeps its score."""
    scores = json.loads(path.read_text()) if path.exists() else {}
    prints = {name: head_fingerprint(d) for name, d in heads.items()}

    def fresh(name: str) -> bool:
        cached = scores.get(f"{name}|{settings}")
        return cached is not None and (prints[name] is None or cached.get("head_sha256") == prints[name])

    todo = {name: d for name, d in heads.items() if not fresh(name)}
    if todo:
        judge = make_judge()
        for name, head_dir in todo.items():
            log.info("judging %s (%s)", name, head_dir)
            scores[f"{name}|{settings}"] = {**judge.score(head_dir), "head_sha256": prints[name]}
            path.write_text(json.dumps(scores, indent=1))
    return {name: scores[f"{name}|{settings}"] for name in heads}
