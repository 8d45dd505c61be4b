#!/bin/bash
# One device call for a GPU session (issue #39), from the repository root on
# a GPU machine without TensorFlow (JAX, PyTorch and numpy installed):
#   A. bench/gpu_train.py: keras_trm on JAX against torch.compile (JSON).
#   B. keras-trm train-portable on a prepared Multi30k folder (JAX, bf16).
# This is the two device calls of 2026-11-26 (H100) in one script.
#
# Here, before the call (see the device README's note on wheels):
#   pip download --no-deps ... -d .whl keras==3.15.1 namex optree jsonargparse docstring-parser
#   keras-trm prepare-translation --output_dir .gpu/m30k    # the prepared folder (TF)
# and carry .whl and .gpu. Back here: keras-trm export-portable --prepared
# .gpu/m30k --weights <OUT>/weights [--test].
#
# Settings (environment): OUT (results folder), PHASES ("A B": which of the
# two to run, e.g. PHASES=B for a second call), PREPARED (.gpu/m30k),
# TRAIN_MINUTES (8: the first epoch compiles for about 2 minutes on an H100),
# BENCH_SECONDS (250), BOUNDARIES (16,24,32,48: few widths, few compiles),
# PROFILE_STEPS (3: steps traced after the timing, device time by kernel),
# LEVER (unset; e.g. --loss log_softmax: one more run of ours with that
# gpu_train flag, about 1.5 minutes, after B; LEVER_MODELS transformer_base).
set -u
OUT=${OUT:?set OUT to a results folder}
exec > >(tee "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
PHASES=${PHASES:-A B}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
if [[ " $PHASES " == *" A "* ]]; then
  timeout $(( ${BENCH_SECONDS:-250} + 40 )) python3 bench/gpu_train.py --backend jax \
    --max-shapes 1 --steps 12 --time-limit "${BENCH_SECONDS:-250}" \
    --profile-steps "${PROFILE_STEPS:-3}" --out "$OUT/gpu_train.json"
  echo "A rc=$?"
fi
if [[ " $PHASES " == *" B "* ]]; then
  KERAS_BACKEND=jax timeout $(( ${TRAIN_MINUTES:-8} * 60 + 90 )) \
    python3 -m keras_trm.jobs.portable_training --prepared "${PREPARED:-.gpu/m30k}" \
    --workdir /tmp/portable --precision mixed_bfloat16 \
    --time_budget_minutes "${TRAIN_MINUTES:-8}" --boundaries "${BOUNDARIES:-16,24,32,48}"
  echo "B rc=$?"
  mkdir -p "$OUT/weights" && cp /tmp/portable/weights/* /tmp/portable/*.json "$OUT/weights/" 2>/dev/null
fi
if [ -n "${LEVER:-}" ]; then  # e.g. LEVER="--loss log_softmax": ours only, A's batches
  timeout 150 python3 bench/gpu_train.py --backend jax --max-shapes 1 --steps 12 \
    --models "${LEVER_MODELS:-transformer_base}" --synced-steps 0 \
    --time-limit 110 --no-baseline $LEVER --out "$OUT/gpu_train_lever.json"
  echo "lever rc=$?"
fi
