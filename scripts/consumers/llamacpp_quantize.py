"""Quantize a GGUF with llama.cpp's own quantizer (run by .consumers/llamacpp/bin/python).

    python scripts/consumers/llamacpp_quantize.py IN.gguf OUT.gguf q4_1

Types: the `LLAMA_FTYPE_MOSTLY_*` names of llama_cpp (q4_1, q4_0, q8_0, q4_k_m, ...). Exits non-zero
with llama.cpp's status when the quantizer fails.
"""

import sys


def main(source: str, out: str, kind: str) -> int:
    import llama_cpp

    name = f"LLAMA_FTYPE_MOSTLY_{kind.upper()}"
    if not hasattr(llama_cpp, name):
        print(f"llama_cpp has no quantization type {kind!r} ({name})", file=sys.stderr)
        return 2
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, name)
    status = llama_cpp.llama_model_quantize(source.encode(), out.encode(), params)
    if status != 0:
        print(f"llama_model_quantize({source}, {kind}) returned {status}", file=sys.stderr)
    return int(status)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
