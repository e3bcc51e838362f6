#!/usr/bin/env bash
# One device call: the GPU correctness tests for the examples (bf16, forward
# and backward), then `flashgen bench` spec by spec, so that a time limit
# keeps the specs already measured.  Results under $OUT.
#   bash scripts/gpu_final.sh CHECK_SECONDS BENCH_SECONDS [bench args...]
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
check_s=$1 bench_s=$2
shift 2
export FLASHGEN_GPU_SUMMARY="$OUT/gpu_summary.txt"
: > "$FLASHGEN_GPU_SUMMARY"
timeout "$check_s" python3 -m pytest -q -p no:cacheprovider -rf tests/test_gpu.py \
  -k "example and BF16" > "$OUT/pytest.log" 2>&1
echo "gpu tests: exit $?; $(tail -1 "$OUT/pytest.log")"
echo "checks: $(wc -l < "$FLASHGEN_GPU_SUMMARY"), failed: $(grep -c FAIL "$FLASHGEN_GPU_SUMMARY")"
end=$((SECONDS + bench_s))
for spec in examples/*.attn; do
  left=$((end - SECONDS))
  [ "$left" -gt 20 ] || { echo "bench: out of time before $spec"; break; }
  name=$(basename "$spec" .attn)
  timeout "$left" python3 -m flashgen bench "$spec" "$@" --json "$OUT/bench_$name.json" \
    2>"$OUT/bench_$name.stderr" > "$OUT/bench_$name.txt"
  echo "bench $name: exit $?"
done
