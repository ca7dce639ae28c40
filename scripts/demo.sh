#!/usr/bin/env bash
# The main job on the embedded default (SmolLM2-135M-Instruct + packaged ShareGPT), offline on a CPU:
# cache target features for a slice of ShareGPT, train a draft head on them, and decode with it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT=${DEMO_DIR:-checkpoints/runs/demo}
LIMIT=${DEMO_LIMIT:-200}
STEPS=${DEMO_STEPS:-200}
echo "== 1/3 data_prep: $LIMIT ShareGPT conversations -> feature store"
$PY -m data_prep +model=smollm2_135m data=sharegpt_packaged data.limit=$LIMIT
echo "== 2/3 train: $STEPS steps of the draft head -> $OUT/head"
$PY -m train +model=smollm2_135m data.limit=$LIMIT train.max_steps=$STEPS output_dir=$OUT wandb.mode=offline
echo "== 3/3 decode: stream a reply through the EAGLE decoder with the head just trained (tau and tokens/s on stderr)"
echo "What are three tips for staying healthy?" | $PY -m eagle.chat --head "$OUT/head" --max-new-tokens 128
echo "The shipped head (checkpoints/eagle-smollm2-135m-instruct) is the better one: python -m eagle.chat"
