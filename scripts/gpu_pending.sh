#!/usr/bin/env bash
# The measurements that wait for a GPU (BENCHMARKS.md, entries 34 and 35), in
# one device call after the GPU tests (scripts/gpu_tests.sh) have passed:
#   1. the persistent Gluon forward (forced on) against the current one and
#      cuDNN, full and causal at d128 (scripts/gluon_ab.py --persistent);
#   2. host time with the TMA maps cached against encoded on every launch
#      (scripts/bench_probe.py, its "flashgen (TMA cache)" row) at the points
#      where the bench runs at the host's pace.
# Each under its own time limit, so that a hang costs only its part.  About
# 7 minutes on an H200.  Outputs to $OUT.
#   bash scripts/gpu_pending.sh
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
timeout 240 python3 scripts/gluon_ab.py --persistent --seqlens 1024 2048 4096 16384 \
  2>&1 | tee "$OUT/ab-persistent.txt"
echo "== gluon_ab exit ${PIPESTATUS[0]}"
timeout 300 python3 scripts/bench_probe.py examples/encoder_band.attn:64:1024 \
  examples/encoder_band.attn:128:1024 examples/full.attn:64:1024 2>&1 | tee "$OUT/probe-tma-cache.txt"
echo "== bench_probe exit ${PIPESTATUS[0]}"
