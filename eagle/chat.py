"""Chat with the target through the EAGLE decoder, streaming each reply.

    python -m eagle.chat                                   # embedded default + shipped head
    python -m eagle.chat --head path/or/hub-id --temperature 0.7
    echo "What is a draft head?" | python -m eagle.chat    # one reply per input line, exit on EOF

Each reply is followed (on stderr) by τ, the mean tokens per target forward, tokens/s, and how many prompt
tokens came from the previous reply's KV cache (`prefix_cache=True`: a turn prefills only its new message).
In the chat, `/reset` clears the history and `/exit` quits.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import eagle.decoding.settings as tree_settings
from eagle.common import progress
from eagle.targets.resolve import EMBEDDED_DEFAULT

SHIPPED_HEAD = Path(__file__).resolve().parents[1] / "checkpoints" / "eagle-smollm2-135m-instruct"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m eagle.chat", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", "--base", default=EMBEDDED_DEFAULT, help="target alias, HF folder or Hub id")
    p.add_argument("--head", default=str(SHIPPED_HEAD), help="draft head folder or Hub id")
    p.add_argument("--random-head", action="store_true", help="untrained head (tau about 1; for trying the pipeline)")
    p.add_argument("--dtype", choices=["auto", "bfloat16", "float32"], default="auto",
                   help="auto: bfloat16 where the device has bf16 arithmetic, else float32 (eagle/common/precision.py)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--system", default=None, help="system prompt (default: the template's own)")
    p.add_argument("--chat-template", default=None, help="template name, .jinja file or template text")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 is fastest on a busy machine)")
    p.add_argument("--no-compile", action="store_true",
                   help="eager forwards only (the default decodes eagerly until its graphs compile in the background)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr (replies and their stats only)")
    tree_settings.add_arguments(p)
    return p.parse_args(argv)


def head_missing(head: str) -> bool:
    """True when --head names no usable local folder and does not look like a Hub id."""
    path = Path(head).expanduser()
    if path.is_dir():
        return not (path / "config.json").exists()
    return path.is_absolute() or head.startswith((".", "~")) or head.count("/") != 1


def build_model(args: argparse.Namespace):
    from transformers import AutoModelForCausalLM

    from eagle.common.precision import fast_dtype
    from eagle.heads.checkpoint import load_head
    from eagle.heads.eagle2 import DraftConfig, DraftHead
    from eagle.model import EaModel
    from eagle.targets.resolve import resolve_target
    from eagle.targets.tokenizer import load_tokenizer

    dtype = fast_dtype(args.dtype)
    with progress.phase("resolving the target %s", args.target):
        folder = resolve_target(args.target)
    with progress.phase("loading the target (%s)", str(dtype).removeprefix("torch.")):
        target = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)  # the family's default attention
        tokenizer = load_tokenizer(folder, args.chat_template)
    with progress.phase("loading the head %s", "(random)" if args.random_head else args.head):
        if args.random_head:
            head = DraftHead(DraftConfig.from_target_config(target.config, target=args.target)).to(dtype)
        else:
            head = load_head(args.head, dtype=dtype)
    # decodes at once; tunes (once per machine) and compiles in the background (eagle/tuning/warmup.py)
    return EaModel.from_modules(target, head, tokenizer, tree_settings.from_arguments(args),
                                compile=False if args.no_compile else None)


def read_turns(interactive: bool):
    """User messages: prompted lines on a terminal, plain lines from a pipe; ends on EOF."""
    while True:
        try:
            line = input(">>> ") if interactive else sys.stdin.readline()
        except EOFError:
            return
        if not interactive and not line:
            return
        line = line.strip()
        if line:
            yield line


def reply(model, messages: list[dict], args: argparse.Namespace) -> str:
    """Stream one assistant reply to stdout and return its text."""
    from eagle.targets.tokenizer import chat_prompt

    tokenizer = model.tokenizer
    ids = chat_prompt(tokenizer, messages)  # [1, S]
    new: list[int] = []
    shown = ""
    stream = model.generate(ids, args.temperature, args.top_p, args.top_k, args.max_new_tokens,
                            max_length=ids.shape[1] + args.max_new_tokens, stream=True,
                            prefix_cache=True)  # the history's KV rows from the previous reply
    for chunk in stream:
        new += chunk.tolist()
        text = tokenizer.decode(new, skip_special_tokens=True)
        if not text.endswith("\ufffd"):  # wait for the rest of a multi-byte character
            print(text[len(shown):], end="", flush=True)
            shown = text
    print(flush=True)
    s = model.last_stats
    print(f"[tau {s.tau:.2f} tokens/forward, {s.tokens_per_second:.1f} tokens/s, {s.new_tokens} tokens; prompt "
          f"{s.prompt_tokens} tokens, {s.cached_tokens} of them cached, first token after {s.prefill_seconds:.2f} s]",
          file=sys.stderr, flush=True)
    return tokenizer.decode(new, skip_special_tokens=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.random_head and head_missing(args.head):
        print(f"error: no draft head at {args.head}.\n"
              "  Pass --head DIR_OR_HUB_ID, train one (python -m train +model=smollm2_135m, see README.md),\n"
              "  or try the pipeline with --random-head (correct output, no speed-up).", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    progress.show(args.quiet)  # what it prepares, one line a phase on stderr
    try:
        model = build_model(args)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    interactive = sys.stdin.isatty()
    if interactive:
        print("EAGLE chat: /reset clears the history, /exit or Ctrl-D quits.", file=sys.stderr)
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(system)
    for line in read_turns(interactive):
        if line in ("/exit", "/quit"):
            break
        if line == "/reset":
            messages = list(system)
            continue
        messages.append({"role": "user", "content": line})
        messages.append({"role": "assistant", "content": reply(model, messages, args)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
