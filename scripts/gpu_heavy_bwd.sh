#!/usr/bin/env bash
# Decision 075's run: the d128 Triton backward of the drawn specs it takes
# (heavy or positional derivatives: kernel_choice.gluon_backward is False for
# them) at its default tiles and at the spill-free candidates found offline,
# flashgen alone, kernels from CUDA graphs, bf16, B4 H16 N4096, one process per
# configuration; records in $OUT/heavy_bwd.jsonl.  Seed 0's specs, or NAMES.
#   [NAMES="rand0_19 rand0_17"] bash scripts/gpu_heavy_bwd.sh [default] [CONFIG ...]
# (each configuration takes 3-4 min for the 18 specs: two per device call)
source scripts/gpu_env.sh
names=${NAMES:-"rand0_2 rand0_5 rand0_8 rand0_12 rand0_13 rand0_14 rand0_15 rand0_17 rand0_18 rand0_19 rand0_20 rand0_22 rand0_23 rand0_25 rand0_26 rand0_27 rand0_28 rand0_29"}
for config in ${*:-default 32,128,8,2 32,64,4,2}; do
  plan=()
  [ "$config" = default ] || plan=(--plan "gpu_bwd_config=$config")
  echo "== $config"
  # shellcheck disable=SC2086
  timeout 280 python3 -m flashgen bench --random 30 --seed 0 --name $names --head-dim 128 \
    --seqlens 4096 --timer cuda-graph --jsonl "$OUT/heavy_bwd.jsonl" "${plan[@]}" \
    --systems flashgen 2>&1 | grep -A24 "^TFLOP/s"
done
