#!/usr/bin/env bash
# The checks and measurements that wait for a GPU, each part under its own
# time limit so that a hang costs only that part.  Outputs to $OUT.
#   bash scripts/gpu_pending.sh forward   (about 7 minutes on an H200)
#     1. the GPU tests of the Gluon forward with the consumers' ping-pong
#        (entry 37): `GLUON_FORWARD_ONLY=1 scripts/gpu_tests.sh`, full, causal
#        and the any-mask kernel with the modules' dispatch, in parallel;
#     2. ping-pong against the loop it replaced (scripts/gpu_ablate.py
#        "no-pingpong": outputs checked against dense attention, forward and
#        backward timed), d128, N = 4096: full, causal and mistral_sliding
#        (the any-mask kernel, which ping-pongs too but was not measured).
#   bash scripts/gpu_pending.sh host      (about 3 minutes)
#     host time with the TMA maps cached against encoded on every launch
#     (scripts/bench_probe.py, its "flashgen (TMA cache)" row, host time the
#     median of seven rounds, PROFILE=1: where flashgen's host time goes) at
#     two host-paced points.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
case "${1:-forward}" in
forward)
  GLUON_FORWARD_ONLY=1 bash "$(dirname "$0")/gpu_tests.sh" 330
  timeout 200 python3 scripts/gpu_ablate.py --seqlen 4096 --only full "full gluon-fwd no-pingpong" \
    plain_causal "plain_causal gluon-fwd no-pingpong" mistral_sliding \
    "mistral_sliding gluon-fwd no-pingpong" 2>&1 | tee "$OUT/ablate-pingpong-4096.txt"
  echo "== gpu_ablate exit ${PIPESTATUS[0]}"
  ;;
host)
  PROFILE=1 timeout 170 python3 scripts/bench_probe.py examples/encoder_band.attn:64:1024 \
    examples/full.attn:64:1024 2>&1 | tee "$OUT/probe-tma-cache.txt"
  echo "== bench_probe exit ${PIPESTATUS[0]}"
  ;;
*)
  echo "usage: bash scripts/gpu_pending.sh [forward|host]" >&2
  exit 2
  ;;
esac
