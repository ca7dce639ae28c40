"""Greedy decoding in vLLM (run by .consumers/vllm/bin/python, never imported by the project).

    python scripts/consumers/vllm_decode.py REQUEST.json OUT.json

REQUEST: {"target": DIR, "head": DIR or null, "method": "eagle"|"eagle3", "num_speculative_tokens": K,
          "prompts": [[token ids], ...], "max_tokens": N, "dtype": "float32"|"bfloat16"}
OUT:     {"outputs": [[token ids], ...], "vllm": VERSION, "drafts": D, "draft_tokens": T,
          "accepted": A, "accepted_per_position": [...], "mean_acceptance_length": 1 + A / D}
"""

import json
import sys


def counters(metrics) -> dict:
    """vLLM's speculative-decoding counters, summed over engines."""
    out = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_position": []}
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
    for m in metrics:
        if m.name in names:
            out[names[m.name]] += int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            out["accepted_per_position"] = [int(v) for v in m.values]
    return out


def main(request_path: str, out_path: str) -> None:
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    req = json.load(open(request_path))
    spec = None
    if req.get("head"):
        spec = {"method": req["method"], "model": req["head"],
                "num_speculative_tokens": int(req["num_speculative_tokens"])}
    llm = LLM(model=req["target"], speculative_config=spec, dtype=req.get("dtype", "float32"),
              max_model_len=int(req.get("max_model_len", 2048)), disable_log_stats=False, seed=0,
              enforce_eager=bool(req.get("enforce_eager", True)))
    params = SamplingParams(temperature=0.0, max_tokens=int(req["max_tokens"]))
    results = llm.generate([TokensPrompt(prompt_token_ids=p) for p in req["prompts"]], params, use_tqdm=False)
    out = {"outputs": [list(r.outputs[0].token_ids) for r in results], "vllm": vllm.__version__,
           **counters(llm.get_metrics())}
    out["mean_acceptance_length"] = 1 + out["accepted"] / out["drafts"] if out["drafts"] else None
    json.dump(out, open(out_path, "w"))


if __name__ == "__main__":  # vLLM starts worker processes that import this file again
    main(*sys.argv[1:])
