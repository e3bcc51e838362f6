#!/usr/bin/env bash
# Decision 074's runs: loops without the per-tile branch (knobs branchless_tiles
# and classify_edge_tiles, rules BRANCHLESS_TILES and NARROW_GAPS, all off by
# default), each beside the default module in one process per command, kernels
# alone from CUDA graphs, bf16, B4 H16 N4096 (and 16384 for periodic_causal).
# check: rand0_7, periodic_causal and the custom example with the rules on,
# against the float64 reference on the GPU.
# bench: periodic_causal (no interior) at d64 and d128, rand0_7 (edge
# loops around an interior), each with FlexAttention, then with the knobs, then
# with the knobs and the Triton backward.  Records in $OUT/tile_tests.jsonl.
# short: rand0_22 with the merged loop and short-rows tiles forced on.
# merged: the drawn specs whose short rows take the merged loop since decision
# 076 despite a tile test (seed 0: rand0_4, 6, 9, 15, 18, 22, 24), at d64 and
# d128, beside --plan merged_edges=off (the three loops, tiles classified);
# with them rand0_3 (`(q - k) % 2 == 0`, loops without branches since then,
# the Triton backward at d64) beside FlexAttention.
# Decision 076 took the rules on; run with knobs off to see the old forms.
#   bash scripts/gpu_tile_tests.sh [check] [bench] [short] [merged]
source scripts/gpu_env.sh
KNOBS="--plan branchless_tiles=on --plan classify_edge_tiles=off"
for step in ${*:-check bench short merged}; do
  case $step in
  check)
    # The rules switched on (they take the knobs' paths), verified per spec.
    timeout 300 python3 - "$OUT" <<'PY' 2>&1 | grep -E "^(ok|FAIL|verify)|within"
import sys
from flashgen import kernel_choice
from flashgen.bench import describe_drawn, draw_variants
from flashgen.cli import main

kernel_choice.BRANCHLESS_TILES = kernel_choice.NARROW_GAPS = True
path = f"{sys.argv[1]}/tile_tests.attn"
with open(path, "w") as f:
    f.write(describe_drawn([draw_variants(8, 0, 64)[7]]) + "\n")
    f.write("attention periodic_causal { head_dim = 64; dtype = bf16; mask = causal & (q - k) % 4 == 0 }\n")
main(["verify", "--device", "cuda", "--examples", "3", path, "examples/custom.attn"])
PY
    ;;
  bench)
    common=(--timer cuda-graph --jsonl "$OUT/tile_tests.jsonl")
    for run in default knobs triton; do
      case $run in
      default) extra=(--systems flashgen flex) ;;
      knobs) extra=(--systems flashgen $KNOBS) ;;
      triton) extra=(--systems flashgen $KNOBS --plan gluon_backward=off) ;;
      esac
      echo "== $run"
      timeout 150 python3 -m flashgen bench benchmarks/specs/periodic_causal.attn \
        --head-dim 64 128 --seqlens 4096 16384 "${common[@]}" "${extra[@]}" 2>&1 | grep -A8 "^TFLOP/s"
      timeout 60 python3 -m flashgen bench --random 30 --seed 0 --name rand0_7 --head-dim 64 \
        --seqlens 4096 "${common[@]}" "${extra[@]}" 2>&1 | grep -A4 "^TFLOP/s"
    done ;;
  short)
    # rand0_22 (d128, at most two keys per row): its corner term `max(q, k) > 10`
    # keeps the tile test, so it gets neither the merged loop nor the short-rows
    # backward tiles; both forced on here, beside the default and Flex.
    for extra in "--systems flashgen flex" \
      "--systems flashgen --plan merged_edges=on --plan gpu_bwd_config=64,64,4,2" \
      "--systems flashgen --plan merged_edges=on --plan gpu_bwd_config=64,64,4,2 --plan gpu_config=64,32,4,3"; do
      # shellcheck disable=SC2086
      timeout 90 python3 -m flashgen bench --random 30 --seed 0 --name rand0_22 --head-dim 128 \
        --seqlens 4096 --timer cuda-graph --jsonl "$OUT/tile_tests.jsonl" $extra 2>&1 | grep -A4 "^TFLOP/s"
    done ;;
  merged)
    for extra in "--systems flashgen flex" "--systems flashgen --plan merged_edges=off"; do
      # shellcheck disable=SC2086
      timeout 280 python3 -m flashgen bench --random 30 --seed 0 \
        --name rand0_3 rand0_4 rand0_6 rand0_9 rand0_15 rand0_18 rand0_22 rand0_24 --head-dim 64 128 \
        --seqlens 4096 --timer cuda-graph --jsonl "$OUT/tile_tests.jsonl" $extra 2>&1 | grep -A18 "^TFLOP/s"
    done ;;
  esac
done
