#!/usr/bin/env bash
# The checks and measurements that wait for a GPU, each part under its own
# time limit so that a hang costs only that part.  Outputs to $OUT.
#   bash scripts/gpu_pending.sh forward   (about 7 minutes on an H200)
#     1. the GPU tests of the Gluon forward with the consumers' ping-pong
#        (entry 37): full and causal (GLUON_FORWARD_ONLY's groups) and the
#        any-mask kernel with the modules' dispatch, in parallel;
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
  logs=$(mktemp -d)
  t() {  # name, selection: a pytest process in the background
    FLASHGEN_GPU_SUMMARY="$logs/$1.sum" timeout 330 python3 -m pytest -q -p no:cacheprovider -rf \
      tests/test_gpu.py -k "$2" >"$logs/$1.log" 2>&1
    echo "== $1: exit $?"
    grep -E "passed|failed|FAILED|Error" "$logs/$1.log" | tail -8
  }
  t gluon-forward "gluon_forward_on_gpu" &
  t examples-fp16 "(full or plain_causal) and example and FP16" &
  t examples-bf16 "(full or plain_causal) and example and BF16" &
  t any-mask-fp16 "gluon_forward_any and FP16" &
  t any-mask-bf16 "gluon_forward_any and (BF16 or dispatch)" &
  wait
  cat "$logs"/*.sum >"$OUT/gpu_summary.txt" 2>/dev/null
  echo "cases: $(wc -l <"$OUT/gpu_summary.txt") checks, $(grep -c FAIL "$OUT/gpu_summary.txt") failed"
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
