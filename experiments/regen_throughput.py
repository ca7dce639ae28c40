"""Regeneration speed: the reply engines of data.regenerate against HF `generate`, on the same prompts.

    python -m experiments.regen_throughput +model=smollm2_135m +prompts=64 +repeats=2 "+engines='ours,vllm'" +threads=2

Takes the first user turn of the first `prompts` conversations of the data source and has each
method write one greedy reply of up to `data.regen.max_new_tokens` tokens to every prompt,
alternating the methods `repeats` times (this machine is noisy). `+conversations=N` (from
`+offset=K`) has the engines answer up to data.regen.max_turns user turns of N whole conversations
as data_prep does, streamed with data.regen.concurrency of them in flight (HF generate left out). Methods: `hf_generate` (one
static left-padded batch of `data.regen.batch_size` prompts at a time, through `model.generate`)
and every engine of `+engines` (data_prep/reply_engines.py: `ours`, `vllm`, `openai` with
data.regen.url). Prints reply tokens/s of each (medians), its ratio to hf_generate, how many
replies equal hf_generate's, and vLLM's start-up apart from its tokens/s. `+hf=false` leaves
HF `generate` out (the engines alone, e.g. on a chunk's 256 prompts).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import replace

import hydra
import torch
from omegaconf import DictConfig

from data_prep.conversations import read_conversations
from data_prep.data_config import prep_config
from data_prep.regenerate import ReplyGenerator
from data_prep.reply_engines import open_engine, stop_ids
from data_prep.resolvers import register_resolvers
from eagle.targets.resolve import load_target, resolve_target
from eagle.targets.tokenizer import load_tokenizer


def left_pad(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [B, W] right-aligned to the longest prompt, and their attention mask [B, W]."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(p)
        attn[row, width - len(p):] = 1
    return ids, attn


def hf_generate(model, tok, prompts: list[list[int]], max_new: int, batch: int, ends: set[int]) -> list[str]:
    """The prompts through `model.generate` in static batches, each reply cut at its first end token."""
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    texts = []
    for b in range(0, len(prompts), batch):
        ids, attn = left_pad(prompts[b:b + batch], pad)  # [B, W]
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=max_new, do_sample=False,
                                 temperature=None, top_p=None, top_k=None, pad_token_id=pad)
        for row in out[:, ids.shape[1]:].tolist():
            end = next((j for j, t in enumerate(row) if t in ends | {pad}), len(row))
            texts.append(tok.decode(row[:end], skip_special_tokens=True).strip())
    return texts


def first_turn_prompts(cfg: DictConfig, tok, n: int, max_new: int) -> list[list[int]]:
    conversations, _ = read_conversations(cfg.data.source, 4 * n)
    firsts = [[m for m in c.messages if m["role"] == "user"][:1] for c in conversations]
    prompts = [list(tok.apply_chat_template(f, add_generation_prompt=True, tokenize=True, return_dict=False))
               for f in firsts if f]
    return sorted([p for p in prompts if len(p) + max_new <= int(cfg.model.max_len)][:n], key=len)


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    n, repeats = int(cfg.get("prompts", 64)), int(cfg.get("repeats", 2))
    threads = int(cfg.get("threads", torch.get_num_threads()))
    torch.set_num_threads(threads)
    regen = replace(prep_config(cfg).data.regen, temperature=0.0)
    target_dir = resolve_target(cfg.model.path)
    tok = load_tokenizer(target_dir, cfg.model.chat_template)
    max_len, max_new = int(cfg.model.max_len), int(regen.max_new_tokens)
    whole = int(cfg.get("conversations", 0))
    if whole:
        chats, _ = read_conversations(cfg.data.source, whole, offset=int(cfg.get("offset", 0)))
    prompts = first_turn_prompts(cfg, tok, n, max_new)
    model = load_target(target_dir, cfg.model.dtype)
    ends = set(stop_ids(target_dir, tok))
    methods, engines = {}, []
    if cfg.get("hf", True) and not whole:  # +hf=false: the engines alone (HF generate takes minutes per 64 prompts)
        methods["hf_generate"] = lambda: hf_generate(model, tok, prompts, max_new, regen.batch_size, ends)
    for name in str(cfg.get("engines", "ours,vllm")).split(","):
        start = time.perf_counter()
        engine = open_engine(replace(regen, engine=name), target_dir, cfg.model.dtype, tok, max_len, threads)
        engines.append(engine)
        print(json.dumps({"engine": name, "startup_seconds": round(time.perf_counter() - start, 1)}), flush=True)
        generator = ReplyGenerator(engine, tok, regen, max_len)
        if whole:
            methods[name] = lambda g=generator: [m["content"] for _, chunk in g.chunks({0: chats}, {0: 0})
                                                 for c in chunk for m in c.messages if m["role"] == "assistant"]
        else:
            methods[name] = lambda g=generator: list(g.decode_by_length(dict(enumerate(prompts))).values())
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
    summary = {"prompts": len(prompts), "conversations": whole, "concurrency": regen.concurrency,
               "max_new_tokens": max_new, "threads": threads, "dtype": cfg.model.dtype,
               **{f"median_{m}_tok_s": round(statistics.median(r), 1) for m, r in rates.items()}}
    if "hf_generate" in rates:
        base = statistics.median(rates["hf_generate"])
        summary.update({f"{m}_over_hf_generate": round(statistics.median(r) / base, 2) for m, r in rates.items()})
        summary.update({f"{m}_replies_equal_hf": sum(a == b for a, b in zip(replies["hf_generate"], replies[m]))
                        for m in methods})
    print(json.dumps(summary))
    for engine in engines:
        engine.close()  # vLLM's worker ends; ours logs its prompt tokens prefilled and reused


if __name__ == "__main__":
    from eagle.common.allocator import use_fast_allocator

    use_fast_allocator()  # as data_prep runs its engine (eagle/common/allocator.py)
    register_resolvers()
    main()
