#!/usr/bin/env bash
# Specs that read runtime inputs on the GPU machine: the kernels against the
# float64 reference (scripts/gpu_inputs_smoke.py and `flashgen verify`), then
# `flashgen bench` beside FlexAttention (documents of bench.DOCUMENT_LENGTH
# tokens) and the cost of the per-call plan; results to $OUT.
#   bash scripts/gpu_inputs.sh [SECONDS]      # default 540
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
end=$((SECONDS + ${1:-540}))
specs=benchmarks/specs
left() { echo $((end - SECONDS)); }
timeout "$(left)" python3 scripts/gpu_inputs_smoke.py 2>&1 | tee "$OUT/smoke.txt" | tail -3
echo "smoke: exit ${PIPESTATUS[0]}"
timeout "$(left)" python3 -m flashgen verify "$specs"/*.attn --device cuda --examples 4 \
  >"$OUT/verify.txt" 2>&1
echo "verify: exit $?"; grep -E "^(ok|FAILED|INCOMPLETE)" "$OUT/verify.txt"
timeout "$(left)" python3 scripts/gpu_triton_only_smoke.py >"$OUT/triton_only.txt" 2>&1; echo "triton-only smoke: exit $?"; tail -1 "$OUT/triton_only.txt"

timeout "$(left)" python3 scripts/gpu_plan_cost.py 2>&1 | tail -3
timeout "$(left)" python3 -m flashgen bench "$specs"/*.attn --head-dim 64 128 \
  --seqlens 4096 16384 --jsonl "$OUT/results.jsonl" 2>"$OUT/bench.stderr" | tee "$OUT/bench.txt"
echo "bench: exit ${PIPESTATUS[0]}"
