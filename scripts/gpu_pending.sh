#!/usr/bin/env bash
# The checks and measurements that wait for a GPU, each part under its own
# time limit so that a hang costs only that part.  Outputs to $OUT.
#   bash scripts/gpu_pending.sh launch    (about 4 minutes on an H200)
#     1. the GPU tests of the launch path after the TMA-map cache was removed
#        (entry 38): direct launches bit for bit against Triton's, the
#        modules' dispatch, and the 16-bit full example (outputs, gradients);
#     2. where flashgen's host time goes at two host-paced points
#        (scripts/bench_probe.py with PROFILE=1, host time the median of
#        seven rounds).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
case "${1:-launch}" in
launch)
  timeout 240 python3 -m pytest -q -p no:cacheprovider -rf tests/test_gpu.py \
    -k "direct_launches or any_mask_dispatch or (full and example and not FP32)" 2>&1 |
    tail -15 | tee "$OUT/tests-launch.txt"
  echo "== pytest exit ${PIPESTATUS[0]}"
  PROFILE=1 timeout 120 python3 scripts/bench_probe.py examples/encoder_band.attn:64:1024 \
    examples/full.attn:64:1024 2>&1 | tee "$OUT/probe-host.txt"
  echo "== bench_probe exit ${PIPESTATUS[0]}"
  ;;
*)
  echo "usage: bash scripts/gpu_pending.sh [launch]" >&2
  exit 2
  ;;
esac
