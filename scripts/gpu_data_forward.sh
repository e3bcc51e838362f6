#!/usr/bin/env bash
# Decision 098: the any-mask Gluon forward for masks over runtime data (the
# lowering knob gluon_data_forward), on one GPU:
#   check: tests/test_gpu.py's test of it (the data masks, fp16 and bf16, d128,
#          forward and backward against the float64 reference, launches counted);
#   time:  packed documents (examples/llama3_packed_docs.attn, documents of
#          ~1,000 tokens as `flashgen bench` draws them) and a prefix per
#          example, N = 4096, 16384 and 65536, at d128, bf16, beside
#          FlexAttention, CUDA graphs, with the knob off and on, in one call (as
#          built, the prefix takes the Gluon forward and the documents do not).
#   bash scripts/gpu_data_forward.sh check|time
set -uo pipefail
source scripts/gpu_env.sh
if [ "${1:-check}" = check ]; then
  timeout 560 python3 -m pytest -q -p no:cacheprovider -rf tests/test_gpu.py \
    -k gluon_forward_any_over_runtime_data 2>&1 | tail -15
  exit 0
fi
for plan in gluon_data_forward=off gluon_data_forward=on; do
  timeout 270 python3 -m flashgen bench examples/llama3_packed_docs.attn benchmarks/specs/prefix_per_example.attn \
    --seqlens 4096 16384 65536 --systems flashgen flex --timer cuda-graph --plan "$plan" \
    --jsonl "$OUT/data_forward.jsonl" 2>&1 | tail -16 | sed "s/^/[$plan] /"
done
