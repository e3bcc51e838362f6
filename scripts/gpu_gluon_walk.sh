#!/usr/bin/env bash
# Decisions 112-113: the any-mask Gluon forward's walk of the key bounds.
# d128, bf16, CUDA graphs, beside FlexAttention, records in $OUT/gluon_walk.jsonl:
# rand3_12 (its bounds found since decision 112; at d128 it takes the Gluon
# forward), then the sink-and-window mask (benchmarks/specs/sink_window.attn)
# and rand2_17 with the rule of decision 113 (the Triton forward) and without
# it (GLUON_ANY_MAX_EMPTY = 1.0: the Gluon forward), each in one process.
#   bash scripts/gpu_gluon_walk.sh
source scripts/gpu_env.sh
bench() {  # bench MAX_EMPTY ARGS...: flashgen with that GLUON_ANY_MAX_EMPTY
  python3 - "$@" <<'PY'
import sys
from flashgen import kernel_choice
from flashgen.cli import main

kernel_choice.GLUON_ANY_MAX_EMPTY = float(sys.argv[1])
sys.exit(main(sys.argv[2:]))
PY
}
common="--head-dim 128 --systems flashgen flex --timer cuda-graph --jsonl $OUT/gluon_walk.jsonl"
# shellcheck disable=SC2086
timeout 150 bash -c "$(declare -f bench); bench 0.125 bench benchmarks/specs/split_walk/rand3_12.attn \
  --seqlens 4096 16384 $common" 2>&1 | grep -A4 "^TFLOP/s"
for max_empty in 0.125 1.0; do
  echo "GLUON_ANY_MAX_EMPTY = $max_empty"
  # shellcheck disable=SC2086
  timeout 200 bash -c "$(declare -f bench); bench $max_empty bench benchmarks/specs/sink_window.attn \
    --seqlens 4096 16384 $common" 2>&1 | grep -A4 "^TFLOP/s"
  # shellcheck disable=SC2086
  timeout 150 bash -c "$(declare -f bench); bench $max_empty bench --random 30 --seed 2 --name rand2_17 \
    --seqlens 4096 $common" 2>&1 | grep -E "^rand"
done
