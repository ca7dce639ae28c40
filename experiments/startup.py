"""`python -m experiments.startup`: seconds from launch to the first token, as a new user meets them.

Runs `echo PROMPT | python -m eagle.chat --max-new-tokens 24` three times, each a fresh process:
with an empty `EAGLE_CACHE` and inductor cache (the target is converted from the packaged GGUF
first), after what `make setup` does (the target converted, the inductor cache still empty), and
a second launch with what that one left; then `EaModel.from_pretrained(target, head)` in a later
process. Prints the first reply byte's and the exit's seconds from launch (docs/speed.md, Start-up).
Every cache lives in a temporary folder, so the user's own caches are neither used nor touched.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

PROMPT = "Name three rivers in Europe."
LOAD = """
import time; start = time.perf_counter()
from eagle.model import EaModel
EaModel.from_pretrained({target!r}, {head!r})  # the README's call: float32, the tree prepared in the background
print(time.perf_counter() - start, flush=True)
import os; os._exit(0)  # not waiting for the background preparation
"""


def timed_chat(env: dict, max_new_tokens: int) -> tuple[float, float]:
    """(seconds to the first non-blank byte of the reply, seconds to exit) of one `eagle.chat` launch."""
    start = time.perf_counter()
    chat = subprocess.Popen([sys.executable, "-m", "eagle.chat", "--max-new-tokens", str(max_new_tokens)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    chat.stdin.write(PROMPT.encode() + b"\n")
    chat.stdin.close()
    first = None
    while chunk := chat.stdout.read1(64):
        if first is None and chunk.strip():
            first = time.perf_counter() - start
    chat.wait()
    return first, time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict[str, tuple[float, float | None]]:
    p = argparse.ArgumentParser(prog="python -m experiments.startup", description=__doc__.splitlines()[0])
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--head", default="checkpoints/eagle-smollm2-135m-instruct")
    p.add_argument("--max-new-tokens", type=int, default=24)
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="startup-") as root:
        out = launches(args, root)
    print("| launch | first token s | exit s |\n|---|---:|---:|")
    for name, (first, end) in out.items():
        print(f"| {name} | {first:.1f} | {'' if end is None else f'{end:.1f}'} |")
    return out


def launches(args, root: str) -> dict[str, tuple[float, float | None]]:
    """The four launches, each cache a new folder under `root`."""
    def fresh() -> dict:
        return {**os.environ, "EAGLE_CACHE": tempfile.mkdtemp(dir=root),
                "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(dir=root)}

    out = {"first launch, empty caches": timed_chat(fresh(), args.max_new_tokens)}
    env = fresh()
    subprocess.run([sys.executable, "-m", "eagle.targets", args.target], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # what make setup does
    out["first launch after setup"] = timed_chat(env, args.max_new_tokens)
    out["second launch"] = timed_chat(env, args.max_new_tokens)
    loaded = subprocess.run([sys.executable, "-c", LOAD.format(target=args.target, head=args.head)], env=env,
                            check=True, capture_output=True, text=True)
    out["from_pretrained, later process (returns)"] = (float(loaded.stdout.split()[-1]), None)
    return out


if __name__ == "__main__":
    main()
