#!/usr/bin/env bash
# Decision 109: packed documents through a mask over their ids (`causal &
# doc[b, q] == doc[b, k]`) take the Gluon kernels of the mask's positional
# part over the runs a TilePlan found.
# check: its GPU tests (causal d128 bf16 and d64 fp16, full, the any-mask
# kernels; both layouts of q, k, v; ids that come back, on the module's own
# kernels), and the data-mask tests of the same mask on the module's own kernels.
# bench: scripts/gpu_varlen_bench.py (d128 or $DIMS, 16k and 64k tokens or
# $TOKENS, documents of mean 1,000 or of each mean in $MEANS): the
# packed-documents module on rows of tokens and on (B, H, N, D) contiguous
# tensors, and with document_runs=off, beside the causal module's varlen call,
# FlexAttention's document mask and the dense batch; records in
# $OUT/varlen.jsonl ($RUN names the run, with the mean where it is not 1,000).
#   [DIMS="64 128"] [TOKENS=...] [MEANS="256 1000 4000"] bash scripts/gpu_document_runs.sh [check] [bench]
source scripts/gpu_env.sh
for step in ${*:-check bench}; do
  case $step in
  check)
    timeout ${CHECK_SECONDS:-400} python3 -m pytest -q -m "" -p no:cacheprovider -rf tests/test_gpu.py \
      -k "packed_documents_as_runs or (masks_over_runtime_data and doc and 128-False)" 2>&1 | tail -n 8 ;;
  bench)
    for mean in ${MEANS:-1000}; do
      run="${RUN:-packed documents as runs}"
      [ "$mean" = 1000 ] || run="$run, documents of mean $mean"
      echo "documents of mean $mean"
      timeout ${BENCH_SECONDS:-300} python3 scripts/gpu_varlen_bench.py --tokens ${TOKENS:-16384 65536} \
        --head-dim ${DIMS:-128} --mean "$mean" --timer cuda-graph --jsonl "$OUT/varlen.jsonl" \
        --run "$run" --commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" 2>&1 | tail -40
    done ;;
  esac
done
