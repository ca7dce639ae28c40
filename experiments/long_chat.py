"""A conversation that outgrows the first cache buckets, through `EaModel.from_pretrained` defaults: does
any reply stall on a compile?

    python -m experiments.long_chat --threads 2 --pause 5 [--head DIR] [--target NAME] [--no-prefix-cache]

Loads the target and head as a user does, waits for the background preparation, then asks four
questions in one conversation (160 new tokens each, greedy); the context passes 256 and 512 rows.
Prints one line per reply: prompt and new tokens, the seconds to the first token, how many prompt tokens
the previous reply's KV rows gave (`prefix_cache=True`, as `eagle.chat` decodes; off with
--no-prefix-cache), seconds, the longest gap between two streamed pieces after the first, tok/s, the
target's cache bucket in use and the compiled graphs (target + head). `--pause` seconds between
replies stand for the user reading and typing (background compiles run then).
"""

from __future__ import annotations

import argparse
import time

import torch

from eagle.model import EaModel
from eagle.targets.tokenizer import chat_prompt

QUESTIONS = ("Write a short story about a lighthouse keeper who finds a message in a bottle.",
             "Now tell the same story from the point of view of the bottle.",
             "Summarise both stories in three sentences.",
             "Write a poem about the sea.")


def reply(model: EaModel, ids: torch.Tensor, max_new_tokens: int,
          prefix_cache: bool) -> tuple[torch.Tensor, float, float, float]:
    """The greedy reply [n] to ids [1, S], its seconds, those to its first token and the longest gap between
    pieces after the first."""
    pieces, gaps = [], []
    start = last = time.perf_counter()
    for tokens in model.generate(ids, max_new_tokens=max_new_tokens, stream=True, prefix_cache=prefix_cache):
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
        pieces.append(tokens)
    return torch.cat(pieces), time.perf_counter() - start, gaps[0], max(gaps[1:], default=0.0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m experiments.long_chat", description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--head", default="checkpoints/eagle-smollm2-135m-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pause", type=float, default=5.0)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--no-prefix-cache", action="store_true", help="every reply prefills its whole prompt")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = EaModel.from_pretrained(args.target, args.head, torch_dtype=torch.bfloat16)
    model.wait_ready()
    history: list[dict] = []
    for i, question in enumerate(QUESTIONS, 1):
        history.append({"role": "user", "content": question})
        ids = chat_prompt(model.tokenizer, history)
        new, seconds, first, gap = reply(model, ids, args.max_new_tokens, not args.no_prefix_cache)
        history.append({"role": "assistant", "content": model.tokenizer.decode(new, skip_special_tokens=True)})
        graphs = "+".join(str(len(r.shapes)) for r in model.runners)
        bucket = model.compiled.size if model.compiled is not None else "-"
        print(f"reply {i}: prompt {ids.shape[1]} ({model.last_stats.cached_tokens} cached) + {new.numel()} tokens in "
              f"{seconds:.1f} s, first token after {first:.2f} s, longest gap {gap:.2f} s, "
              f"{new.numel() / seconds:.1f} tok/s, cache bucket {bucket}, graphs {graphs}", flush=True)
        time.sleep(args.pause)


if __name__ == "__main__":
    main()
