"""One llama.cpp model answering prompts one at a time over stdin/stdout (run by .consumers/llamacpp/bin/python).

    python scripts/consumers/llamacpp_server.py '{"gguf": FILE, "threads": 2, "n_ctx": 4096, "extra_buffers": true}'

Prints `{"ready": true, "startup_seconds": s, "llama_cpp": VERSION}` once the model is loaded, then for
every request line `{"prompt": [ids], "max_tokens": N}` one line `{"tokens": [...], "seconds": s}`:
greedy (top-k 1, no repetition penalty), batch size 1, stopping after the model's end-of-generation
token or N tokens, timed from the prompt's evaluation to the last token. The KV cache is reset
between requests, so every prompt is evaluated whole, unless `"keep_prefix": true`: then llama.cpp's own
prefix match evaluates only the tokens after a prompt's common prefix with the previous one.

`"extra_buffers": false` loads the weights without llama.cpp's extra buffer types (its AMX and repacked
CPU layouts; `use_extra_bufts` of llama_model_params, which llama-cpp-python 0.3.36 does not expose):
on this project's CPU machine a Q4_1 file in AMX buffers dies with SIGSEGV at its first evaluation.
"""

import json
import sys
import time


def main(config_json: str) -> None:
    import llama_cpp

    cfg = json.loads(config_json)
    if not cfg.get("extra_buffers", True):
        defaults = llama_cpp.llama_model_default_params

        def plain_buffers():
            params = defaults()
            params.use_extra_bufts = False
            return params

        llama_cpp.llama_cpp.llama_model_default_params = plain_buffers  # what Llama() calls
    start = time.perf_counter()
    llm = llama_cpp.Llama(model_path=cfg["gguf"], n_threads=int(cfg["threads"]), n_threads_batch=int(cfg["threads"]),
                          n_ctx=int(cfg.get("n_ctx", 4096)), n_batch=512, seed=0, verbose=False)
    startup = time.perf_counter() - start
    print(json.dumps({"ready": True, "startup_seconds": startup, "llama_cpp": llama_cpp.__version__}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        if not cfg.get("keep_prefix", False):
            llm.reset()
        tokens: list[int] = []
        t0 = time.perf_counter()
        for token in llm.generate(req["prompt"], top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                                  reset=True):
            tokens.append(int(token))  # an end-of-generation token is kept, as HF's generate and vLLM keep it
            if llama_cpp.llama_vocab_is_eog(llm._model.vocab, token) or len(tokens) >= int(req["max_tokens"]):
                break
        seconds = time.perf_counter() - t0
        print(json.dumps({"tokens": tokens, "seconds": seconds}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
