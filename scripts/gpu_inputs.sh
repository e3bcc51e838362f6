#!/usr/bin/env bash
# Specs that read runtime inputs on the GPU machine: the kernels against the
# float64 reference (scripts/gpu_inputs_smoke.py and `flashgen verify`), then
# `flashgen bench` beside FlexAttention (documents of bench.DOCUMENT_LENGTH
# tokens) and the cost of the per-call plan; results to $OUT.
#   bash scripts/gpu_inputs.sh [SECONDS]      # default 540
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
end=$((SECONDS + ${1:-540}))
specs=/tmp/flashgen-specs
mkdir -p "$specs"
cat >"$specs/packed_docs.attn" <<'SPEC'
# Packed training batches: causal attention within each document.
attention packed_docs {
    head_dim = 128
    dtype = bf16
    doc: int32[B, Nk]
    mask = causal & doc[b, q] == doc[b, k]
}
SPEC
cat >"$specs/t5_bias.attn" <<'SPEC'
# A bias per head and distance bucket, as T5's relative attention (fixed here).
attention t5_bias {
    head_dim = 64
    dtype = bf16
    rel: fp32[H, 32]
    mask = causal
    score = s + rel[h, min(q - k, 31)]
}
SPEC
cat >"$specs/chunked_causal.attn" <<'SPEC'
# Positional: causal within chunks of 1024 (about the density of packed_docs).
attention chunked_causal {
    head_dim = 128
    dtype = bf16
    mask = causal & chunk(1024)
}
SPEC
cat >"$specs/prefix_per_example.attn" <<'SPEC'
# Prefix-LM with a prefix length per example.
attention prefix_per_example {
    head_dim = 128
    dtype = bf16
    prefix_len: int32[B]
    mask = causal | k < prefix_len[b]
}
SPEC
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
