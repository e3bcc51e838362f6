#!/usr/bin/env bash
# The measurements that wait for a GPU (BENCHMARKS.md, entries 35 to 37), each
# part under its own time limit so that a hang costs only that part.  Outputs
# to $OUT.
#   bash scripts/gpu_pending.sh forward   (about 9 minutes on an H200)
#     1. the persistent Gluon forward's GPU test, with its K/V buffers as the
#        module has them (entry 36: three for K, two for V);
#     2. that forward (and entry 34's two-and-two) against the current Gluon
#        forward and cuDNN at d128, full and causal, N = 1024 and 2048, three
#        interleaved rounds (scripts/gluon_ab.py --persistent --repeat 3);
#     3. the consumers' ping-pong (entry 37) against the current forward,
#        full and causal, d128, N = 1024 (scripts/gpu_ablate.py: outputs
#        checked against dense attention, forward and backward timed).
#   bash scripts/gpu_pending.sh host      (about 3 minutes)
#     host time with the TMA maps cached against encoded on every launch
#     (scripts/bench_probe.py, its "flashgen (TMA cache)" row, host time the
#     median of seven rounds, PROFILE=1: where flashgen's host time goes) at
#     two host-paced points.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
case "${1:-forward}" in
forward)
  FLASHGEN_GPU_SUMMARY=$OUT/persistent.sum timeout 170 python3 -m pytest -q -p no:cacheprovider \
    -rf tests/test_gpu.py -k gluon_forward_persistent 2>&1 | tail -5
  echo "== persistent tests exit ${PIPESTATUS[0]}"
  timeout 150 python3 scripts/gluon_ab.py --persistent --seqlens 1024 2048 --repeat 3 \
    2>&1 | tee "$OUT/ab-persistent.txt"
  echo "== gluon_ab exit ${PIPESTATUS[0]}"
  timeout 220 python3 scripts/gpu_ablate.py --seqlen 1024 --only full "full gluon-fwd pingpong" \
    plain_causal "plain_causal gluon-fwd pingpong" full "full gluon-fwd pingpong" \
    2>&1 | tee "$OUT/ablate-pingpong-1024.txt"
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
