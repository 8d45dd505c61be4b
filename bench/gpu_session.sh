#!/bin/bash
# One device call for a GPU session (issue #39), from the repository root on
# a GPU machine without TensorFlow (JAX, PyTorch and numpy installed):
#   A. bench/gpu_train.py: keras_trm on JAX against torch.compile (JSON).
#   B. keras-trm train-translation on Multi30k under JAX (bf16), the one
#      command that trains without TensorFlow (issue #61; it prepares the
#      token ids into its workdir itself).
# This is the two device calls of 2026-11-26 (H100) in one script.
#
# Here, before the call (see the device README's note on wheels):
#   pip download --no-deps ... -d .whl keras==3.15.1 namex optree jsonargparse docstring-parser sentencepiece sacrebleu
# and carry .whl (the data: DATA_DIR, shared/data by default). Back here:
# copy <OUT>/workdir to /tmp/portable (its export_request.json names that
# folder) and run keras-trm export-translation --workdir /tmp/portable.
#
# Settings (environment): OUT (results folder), PHASES ("A B": which of the
# two to run, e.g. PHASES=B for a second call), DATA_DIR (shared/data),
# TRAIN_MINUTES (8: the first epoch compiles for about 2 minutes on an H100),
# BENCH_SECONDS (250), BOUNDARIES (16,24,32,48: few widths, few compiles),
# PROFILE_STEPS (3: steps traced after the timing, device time by kernel
# and, under JAX, by part of the model: bench/step_parts.py),
# PHASES runs in the order given; besides A and B: L, LEVERS (unset; e.g.
# "--dropout-mask rbg;--steps-per-execution 4;XLA_FLAGS=--xla_...": ours
# only, one run per ';'-separated flag set (NAME=value words set the
# environment), about 50 s each, after lever_0, a run without flags
# (L_REFERENCE=0 drops it), LEVER_MODELS transformer_base,
# LEVER_SECONDS 70 each), and C (a second bench of MODELS_C, transformer_big,
# after L), T (bench/gpu_attention_lengths.py under JAX and PyTorch, T_SECONDS
# 70 each); MODELS_A (transformer_base,transformer_big); A_FLAGS (more
# gpu_train flags for A, and for C unless C_FLAGS is set); C_SECONDS
# (BENCH_SECONDS); TRACE=1 keeps A's JAX traces and optimized HLO in OUT.
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
ENVS=()  # NAME=value words of a lever's flag set
bench() {  # $1: output name, $2: models, then gpu_train flags
  local name=$1 models=$2; shift 2
  timeout $(( ${BENCH_SECONDS:-250} + 40 )) env ${ENVS[@]+"${ENVS[@]}"} python3 bench/gpu_train.py --backend jax \
    --models "$models" --max-shapes 1 --steps 12 --time-limit "${BENCH_SECONDS:-250}" \
    --profile-steps "${PROFILE_STEPS:-3}" --out "$OUT/$name.json" "$@"
  echo "$name rc=$?"
}
for phase in $PHASES; do  # in the order given
  case $phase in
  # shellcheck disable=SC2086  # A_FLAGS: more gpu_train flags for A and C
  A) bench gpu_train "${MODELS_A:-transformer_base,transformer_big}" ${TRACE:+--trace-dir "$OUT"} ${A_FLAGS:-} ;;
  # shellcheck disable=SC2086  # C_FLAGS, A_FLAGS: word lists
  C) BENCH_SECONDS=${C_SECONDS:-${BENCH_SECONDS:-250}} bench gpu_train_c "${MODELS_C:-transformer_big}" ${C_FLAGS-${A_FLAGS:-}} ;;  # a second model, after L
  B)
    KERAS_BACKEND=jax timeout $(( ${TRAIN_MINUTES:-8} * 60 + 300 )) \
      python3 -m keras_trm.cli train-translation --data_dir "${DATA_DIR:-shared/data}" \
      --workdir /tmp/portable --export_dir /tmp/portable/export \
      --training.precision mixed_bfloat16 --training.time_budget_minutes "${TRAIN_MINUTES:-8}" \
      --data.boundaries "${BOUNDARIES:-16,24,32,48}"
    echo "B rc=$?"
    # The run's files without its prepared ids and backups (the float32
    # model, the vocabulary, result.json, export_request.json, config.yaml).
    mkdir -p "$OUT/workdir" && cp /tmp/portable/*.json /tmp/portable/*.keras \
      /tmp/portable/*.model /tmp/portable/*.txt /tmp/portable/*.yaml "$OUT/workdir/" 2>/dev/null ;;
  T)  # attention by key length, fused op vs einsums, both backends
    for backend in jax torch; do
      timeout $(( ${T_SECONDS:-70} + 60 )) python3 bench/gpu_attention_lengths.py --backend $backend \
        --time-limit "${T_SECONDS:-70}" --out "$OUT/attention_lengths_$backend.json"
      echo "T $backend rc=$?"
    done ;;
  L)  # LEVERS: ';'-separated gpu_train flag sets, ours only, A's batches
    i=0
    IFS=';' read -ra sets <<< "${LEVERS:-}"
    # lever_0: no flags, the same call's reference (L_REFERENCE=0 drops it),
    # so that each lever is compared on the same machine
    [ "${L_REFERENCE:-1}" = 0 ] || { sets=("" ${sets[@]+"${sets[@]}"}); i=-1; }
    for flags in "${sets[@]}"; do
      i=$((i + 1)) ENVS=() args=()
      for word in $flags; do  # NAME=value words go to the environment
        if [[ $word =~ ^[A-Z_]+= ]]; then ENVS+=("$word"); else args+=("$word"); fi
      done
      BENCH_SECONDS=${LEVER_SECONDS:-70} PROFILE_STEPS=0 bench "lever_$i" \
        "${LEVER_MODELS:-transformer_base}" --synced-steps 0 --no-baseline ${args[@]+"${args[@]}"}
      ENVS=()
    done ;;
  esac
done
