"""Regeneration speed: our batched reply loop against HF `generate` on the same prompts.

    python -m experiments.regen_throughput +model=smollm2_135m +prompts=32 +repeats=2

Takes the first user turn of the first `prompts` conversations of the data source, decodes
them as one left-padded greedy batch of `data.regen.max_new_tokens` with each method,
alternating the methods `repeats` times (this machine is noisy), and prints tokens/s of
each, their ratio (medians) and how many replies are identical. HF's static batch keeps
computing rows whose reply has ended; ours drops them (data_prep/regenerate.py).
"""

from __future__ import annotations

import json
import statistics
import time

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from data_prep.conversations import read_conversations
from data_prep.regenerate import ReplyGenerator, left_pad
from data_prep.resolvers import register_resolvers
from eagle.targets.resolve import load_target, resolve_target
from eagle.targets.tokenizer import load_tokenizer


def hf_generate(generator: ReplyGenerator, prompts: list[list[int]]) -> list[str]:
    """The same batch through `model.generate` (static batch), cut at the first end token."""
    model, tok, pad = generator.model, generator.tokenizer, generator.pad_id
    ids, attn = left_pad(prompts, pad)  # [B, W]
    with torch.inference_mode():
        out = model.generate(input_ids=ids.to(model.device), attention_mask=attn.to(model.device), max_new_tokens=int(generator.regen.max_new_tokens),
                             do_sample=False, temperature=None, top_p=None, top_k=None, pad_token_id=pad)
    ends = generator.eos_ids | {pad}  # generate pads the rows that ended
    texts = []
    for row in out[:, ids.shape[1]:].tolist():
        end = next((j for j, t in enumerate(row) if t in ends), len(row))
        texts.append(tok.decode(row[:end], skip_special_tokens=True).strip())
    return texts


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    n, repeats = int(cfg.get("prompts", 32)), int(cfg.get("repeats", 2))
    target_dir = resolve_target(cfg.model.path)
    tok = load_tokenizer(target_dir, cfg.model.chat_template)
    model = load_target(target_dir, cfg.model.dtype)
    regen = OmegaConf.merge(cfg.data.regen, {"temperature": 0.0})
    generator = ReplyGenerator(model, tok, regen, int(cfg.model.max_len))
    conversations, _ = read_conversations(cfg.data.source, 4 * n)
    firsts = [[m for m in c.messages if m["role"] == "user"][:1] for c in conversations]
    prompts = [list(tok.apply_chat_template(f, add_generation_prompt=True, tokenize=True, return_dict=False))
               for f in firsts if f]
    prompts = [p for p in prompts if len(p) + int(regen.max_new_tokens) <= int(cfg.model.max_len)][:n]
    methods = {"hf_generate": lambda: hf_generate(generator, prompts), "ours": lambda: generator.decode_batch(prompts)}
    rates: dict[str, list[float]] = {m: [] for m in methods}
    replies: dict[str, list[str]] = {}
    for _ in range(repeats):
        for name, run in methods.items():
            start = time.perf_counter()
            replies[name] = run()
            seconds = time.perf_counter() - start
            tokens = sum(len(tok(r, add_special_tokens=False)["input_ids"]) for r in replies[name])
            rates[name].append(tokens / seconds)
            print(json.dumps({"method": name, "seconds": round(seconds, 1), "reply_tokens": tokens,
                              "tok_s": round(tokens / seconds, 1)}), flush=True)
    before, after = (statistics.median(rates[m]) for m in methods)
    same = sum(a == b for a, b in zip(replies["hf_generate"], replies["ours"]))
    print(json.dumps({"prompts": len(prompts), "max_new_tokens": int(regen.max_new_tokens),
                      "median_hf_generate_tok_s": round(before, 1), "median_ours_tok_s": round(after, 1),
                      "ratio": round(after / before, 3), "identical_replies": same}))


if __name__ == "__main__":
    register_resolvers()
    main()
