#!/usr/bin/env bash
# The embedded default trained twice with the same data, order, seed and noise: from a feature store
# (offline, the default) and with the target inside the training step (train.features=online). Then
# τ of both heads on MT-bench and one table + loss plot (python -m experiments.online_offline).
# Each stage is skipped when its output exists; delete a run folder to redo it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
LIMIT=${LIMIT:-400}
STEPS=${STEPS:-300}
OUT=${OUT:-checkpoints/runs/online-vs-offline}
REPORT=${REPORT:-results/online-vs-offline}
mkdir -p "$OUT" "$REPORT"
DATA=(+model=smollm2_135m data.limit="$LIMIT")
TRAIN=(train.max_steps="$STEPS" train.draft_vocab=8192 train.warmup_steps=30 train.eval_every=100 train.save_every=100
       train.tau_every=0 wandb.mode=offline)
timed() { local name=$1; shift; local t0=$(date +%s); "$@"; echo "$name $(( $(date +%s) - t0 ))" >> "$OUT/seconds.txt"; }

echo "== data_prep (offline only)"
[ -f "$OUT/seconds.txt" ] && grep -q '^data_prep ' "$OUT/seconds.txt" || timed data_prep $PY -m data_prep "${DATA[@]}"
for mode in offline online; do
  echo "== train $mode"
  features=store; [ "$mode" = online ] && features=online
  [ -f "$OUT/$mode/head/config.json" ] || timed "train_$mode" $PY -m train "${DATA[@]}" "${TRAIN[@]}" train.features=$features output_dir="$OUT/$mode"
  echo "== τ $mode"
  [ -f "$REPORT/tau-$mode.json" ] || $PY -m evaluation.tau "$OUT/$mode/head" --prompts mtbench --num-prompts 8 \
      --max-new-tokens 64 --dtype bfloat16 > "$REPORT/tau-$mode.json"
done
$PY -m experiments.online_offline --runs offline="$OUT/offline" online="$OUT/online" --report "$REPORT" \
    --seconds "$OUT/seconds.txt"
