#!/usr/bin/env bash
# The measurements that wait for a GPU (BENCHMARKS.md, entries 35 and 36), in
# one device call, each part under its own time limit so that a hang costs
# only that part.  About 9 minutes on an H200.  Outputs to $OUT.
#   1. the persistent Gluon forward's GPU test, with its K/V buffers as the
#      module has them (entry 36: three for K, two for V);
#   2. that forward (and entry 34's two-and-two) against the current Gluon
#      forward and cuDNN at d128, full and causal, N = 1024 and 2048, three
#      interleaved rounds (scripts/gluon_ab.py --persistent --repeat 3);
#   3. host time with the TMA maps cached against encoded on every launch
#      (scripts/bench_probe.py, its "flashgen (TMA cache)" row, host time now
#      the median of seven rounds) at two host-paced points.
#   bash scripts/gpu_pending.sh
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
FLASHGEN_GPU_SUMMARY=$OUT/persistent.sum timeout 200 python3 -m pytest -q -p no:cacheprovider -rf \
  tests/test_gpu.py -k gluon_forward_persistent 2>&1 | tail -5
echo "== persistent tests exit ${PIPESTATUS[0]}"
timeout 200 python3 scripts/gluon_ab.py --persistent --seqlens 1024 2048 --repeat 3 \
  2>&1 | tee "$OUT/ab-persistent.txt"
echo "== gluon_ab exit ${PIPESTATUS[0]}"
timeout 150 python3 scripts/bench_probe.py examples/encoder_band.attn:64:1024 \
  examples/full.attn:64:1024 2>&1 | tee "$OUT/probe-tma-cache.txt"
echo "== bench_probe exit ${PIPESTATUS[0]}"
