"""One vLLM engine answering prompts one at a time over stdin/stdout (run by .consumers/vllm/bin/python).

    python scripts/consumers/vllm_server.py '{"target": DIR, "head": DIR or null, "method": "eagle"|"eagle3",
                                               "num_speculative_tokens": 3, "dtype": "bfloat16",
                                               "prefix_caching": false}'

Prints `{"ready": true, "startup_seconds": s, "vllm": VERSION}` once the engine is built, then for
every request line `{"prompt": [ids], "max_tokens": N}` one line
`{"tokens": [...], "seconds": s, "drafts": d, "accepted": a, "accepted_per_position": [...]}`:
greedy or sampled (`temperature`, seed 0), batch size 1, timed around `LLM.generate` alone; the counters
are this request's.
Threads: set VLLM_CPU_OMP_THREADS_BIND (e.g. "0" or "0-1") in the environment.
"""

import json
import sys
import time


def counters(llm) -> dict:
    out = {"drafts": 0, "accepted": 0, "accepted_per_position": []}
    for m in llm.get_metrics():
        if m.name == "vllm:spec_decode_num_drafts":
            out["drafts"] += int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens":
            out["accepted"] += int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            out["accepted_per_position"] = [int(v) for v in m.values]
    return out


def main(config_json: str) -> None:
    import os

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data_prep"))
    from vllm_worker import stop_with_parent  # stdlib only: vLLM's processes end with this one

    stop_with_parent()

    out = os.fdopen(os.dup(1), "w", buffering=1)  # replies keep the real stdout (not inherited by workers)
    os.dup2(2, 1)  # vLLM's own logging, here and in its workers, goes to stderr
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm_cpu_expand import install

    install()  # sampling (temperature > 0) needs it in this process and in those vLLM spawns

    cfg = json.loads(config_json)
    spec = None
    if cfg.get("head"):
        spec = {"method": cfg["method"], "model": cfg["head"], "num_speculative_tokens": int(cfg["num_speculative_tokens"])}
    start = time.perf_counter()
    llm = LLM(model=cfg["target"], speculative_config=spec, dtype=cfg.get("dtype", "bfloat16"),
              max_model_len=int(cfg.get("max_model_len", 4096)), disable_log_stats=False, seed=0,
              enforce_eager=bool(cfg.get("enforce_eager", False)),
              enable_prefix_caching=bool(cfg.get("prefix_caching", False)))
    startup = time.perf_counter() - start
    print(json.dumps({"ready": True, "startup_seconds": startup, "vllm": vllm.__version__}), file=out, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        params = SamplingParams(temperature=float(cfg.get("temperature", 0.0)), max_tokens=int(req["max_tokens"]))
        before = counters(llm)
        t0 = time.perf_counter()
        result = llm.generate([TokensPrompt(prompt_token_ids=req["prompt"])], params, use_tqdm=False)[0]
        seconds = time.perf_counter() - t0
        after = counters(llm)
        per_pos = [a - b for a, b in zip(after["accepted_per_position"],
                                         before["accepted_per_position"] or [0] * len(after["accepted_per_position"]))]
        print(json.dumps({"tokens": list(result.outputs[0].token_ids), "seconds": seconds,
                          "drafts": after["drafts"] - before["drafts"], "accepted": after["accepted"] - before["accepted"],
                          "accepted_per_position": per_pos}), file=out, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
elif __name__ == "__mp_main__":  # a process vLLM spawned (engine core, workers): it imports this file again
    from vllm_cpu_expand import install

    install()
