#!/usr/bin/env bash
# The accelerator run on a bare CUDA machine, from the repository root:
#
#   bash experiments/accelerator/run.sh --out DIR [driver.py options]
#   bash experiments/accelerator/run.sh --exec CMD [ARGS...]     (the same set-up, then CMD instead of the driver)
#
# Needs: Python 3.12 with JAX (CUDA), flax, optax, chex, orbax-checkpoint, torch, transformers, tokenizers,
# safetensors, h5py, scipy, scikit-learn, tqdm (PYTHON, default python3), and the folder .accel/ written by
# `make accelerator-prepare` on a machine with internet (the other wheels, the instruction-embedding table,
# SmolLM2's tokenizer and architecture; .accel/extra/ the optional metaworld wheel). Installs nothing outside
# $SITE (default /tmp/imaginejax-site); a second run on the same machine may carry only what changed.
set -euo pipefail
ACCEL=${ACCEL_DIR:-.accel}
SITE=${SITE:-/tmp/imaginejax-site}
PY=${PYTHON:-python3}
shopt -s nullglob
# Files carried in parts over several calls (prepare.py --smollm2): joined into extra/ once all are here.
for manifest in "$ACCEL"/parts/*.parts.json; do
  "$PY" experiments/accelerator/parts.py join "$manifest" --out "$ACCEL/extra" \
    || echo "not joined yet (the run goes on without it): $manifest" >&2
done
wheels=("$ACCEL"/wheels/*.whl "$ACCEL"/extra/*.whl)
if ((${#wheels[@]})); then
  "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "${wheels[@]}"
fi
PYTHONPATH="$SITE" "$PY" -c "import mujoco" 2>/dev/null \
  || { echo "no wheels in $ACCEL/wheels and no mujoco in $SITE: run 'make accelerator-prepare' first" >&2; exit 2; }
# The project itself, built from this checkout without network (the image's setuptools).
"$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-build-isolation --no-compile \
  --no-cache-dir --upgrade --target "$SITE" .
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export IMAGINEJAX_EMBEDDING_TABLE="$PWD/$ACCEL/embeddings.npz"
export IMAGINEJAX_SMOLLM2_TOKENIZER="$PWD/$ACCEL/smollm2-tokenizer.json"
export IMAGINEJAX_SMOLLM2_ARCHITECTURE="$PWD/$ACCEL/smollm2-architecture.json"
export MUJOCO_GL=${MUJOCO_GL:-disable} PYTHONUNBUFFERED=1
# `run.sh --exec CMD ARGS...` runs CMD in this environment instead of the driver (e.g. imaginer_finetune.sh).
if [ "${1:-}" = "--exec" ]; then shift; exec "$@"; fi
exec "$PY" experiments/accelerator/driver.py "$@"
