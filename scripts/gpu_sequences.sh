#!/usr/bin/env bash
# Padded and varlen calls and sinks on the GPU machine: tests/test_sequences.py
# and tests/test_sinks.py (bf16 and fp16 at lengths crossing the GPU's tiles,
# against the float64 reference, and each sequence bit for bit against the
# sequence alone; the sinks' gradient bit for bit across calls), every
# example against the reference (scripts/gpu_triton_only_smoke.py), then
# scripts/gpu_varlen_bench.py (packed documents: varlen, the packed_docs
# input spec, FlexAttention, dense batches); results to $OUT.
#   bash scripts/gpu_sequences.sh [SECONDS] [BENCH ARGS...]   # default 560
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
end=$((SECONDS + ${1:-560}))
shift || true
left() { echo $((end - SECONDS)); }
timeout "$(left)" python3 -m pytest -q -p no:cacheprovider -m kernels -rf \
  tests/test_sequences.py tests/test_sinks.py tests/test_offsets.py >"$OUT/test_sequences.txt" 2>&1
echo "test_sequences, test_sinks: exit $?"; tail -5 "$OUT/test_sequences.txt"
timeout "$(left)" python3 scripts/gpu_triton_only_smoke.py >"$OUT/triton_only.txt" 2>&1
echo "examples smoke: exit $?"; tail -1 "$OUT/triton_only.txt"
timeout "$(left)" python3 scripts/gpu_varlen_bench.py --jsonl "$OUT/varlen.jsonl" "$@" \
  2>"$OUT/bench.stderr" | tee "$OUT/bench.txt"
echo "bench: exit ${PIPESTATUS[0]}"; tail -3 "$OUT/bench.stderr"
