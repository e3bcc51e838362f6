#!/usr/bin/env bash
# Decisions 102-108: varlen calls on the Gluon forward and backward (on by
# default since decision 106, captured calls too since decision 107; the bench
# times the module as built beside it with PLAN, default
# gluon_varlen_captured=off: captured calls on the Triton kernels).
# check: their GPU tests (full, causal and the any-mask kind, fp16 and bf16,
# each sequence against the float64 reference and bit for bit against the
# dense call of the sequence alone), beside the dense Gluon kernels' tests;
# bench: scripts/gpu_varlen_bench.py at d128 (16k and 64k tokens, documents
# of ~1,000), the module as built and with PLAN, records in
# $OUT/varlen.jsonl (RUN names the run, TOKENS the lengths, CHECK_SECONDS the check's limit); before-after: the dense forward at N = 1000 and 4096
# against .base/ (scripts/gpu_before_after.sh; carry .whl and .base).
# check and bench fit one call of 600 s.
#   bash scripts/gpu_varlen_gluon.sh [check] [bench] [before-after]
source scripts/gpu_env.sh
for step in ${*:-check bench}; do
  case $step in
  check)
    i=0
    for k in "varlen_calls and forward and BF16" "varlen_calls and backward and BF16" \
      "(varlen_calls and forward and FP16) or captured_in" "varlen_calls and backward and FP16" \
      "test_gluon_backward_on_gpu and BF16" "test_gluon_forward_on_gpu and FP16"; do
      timeout ${CHECK_SECONDS:-280} python3 -m pytest -q -m "" -p no:cacheprovider -rf tests/test_gpu.py -k "$k" \
        >"$OUT/check_$i.log" 2>&1 &
      i=$((i + 1))
    done
    wait
    tail -n 4 "$OUT"/check_*.log ;;
  bench)
    timeout 200 python3 scripts/gpu_varlen_bench.py --tokens ${TOKENS:-16384 65536} --head-dim 128 \
      --timer cuda-graph --plan ${PLAN:-gluon_varlen_captured=off} --jsonl "$OUT/varlen.jsonl" \
      --run "${RUN:-varlen calls, as built and with ${PLAN:-gluon_varlen_captured=off}}" \
      --commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" 2>&1 | tail -40 ;;
  before-after)
    SPECS="examples/plain_causal.attn examples/full.attn" timeout 200 bash scripts/gpu_before_after.sh \
      --head-dim 128 --seqlens 1000 1024 4000 4096 --systems flashgen --timer cuda-graph
    python3 scripts/compare_bench.py "$OUT/base.jsonl" "$OUT/head.jsonl" ;;
  esac
done
