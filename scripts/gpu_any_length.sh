#!/usr/bin/env bash
# Decision 100: the Gluon forward at lengths of no multiple of 128.
# check: its GPU tests in seven processes (the full and causal examples, the
# any-mask kind, the d64 cases and the Gluon backward, each with N = 130, 200
# and 1000 beside multiples of 128).
# bench: full and plain_causal at d128, N = 1000 / 1024 / 4000 / 4096, bf16,
# CUDA graphs, as built beside cuDNN, then with the knobs gluon_forward=off
# and gluon_backward=off (the Triton kernels); bench-any: mistral_sliding at
# 8000 / 8192 both ways.  Records in $OUT/any_length.jsonl.  check and bench
# fit one call of 600 s.
#   bash scripts/gpu_any_length.sh [check] [bench] [bench-any]
source scripts/gpu_env.sh
for step in ${*:-check bench}; do
  case $step in
  check)
    i=0
    for k in "test_gluon_forward_on_gpu" "gluon_forward_any_mask_on_gpu and BF16" \
      "gluon_forward_any_mask_on_gpu and FP16 and (full or alibi)" "gluon_forward_at_head_dim_64 and BF16" \
      "gluon_backward and BF16 and built and 128" "gluon_backward and BF16 and built and 64" \
      "gluon_backward and FP16 and wide and 64"; do
      timeout 320 python3 -m pytest -q -m "" -p no:cacheprovider -rf tests/test_gpu.py -k "$k" \
        >"$OUT/check_$i.log" 2>&1 &
      i=$((i + 1))
    done
    wait
    tail -n 4 "$OUT"/check_*.log ;;
  bench)
    for plan in "" "--plan gluon_forward=off --plan gluon_backward=off"; do
      timeout 125 python3 -m flashgen bench examples/full.attn examples/plain_causal.attn \
        --head-dim 128 --seqlens 1000 1024 4000 4096 --systems flashgen $([ -z "$plan" ] && echo sdpa-cudnn) \
        --timer cuda-graph $plan --jsonl $OUT/any_length.jsonl 2>&1 | grep -A20 "^TFLOP/s" | sed "s/^/[${plan:-as built}] /"
    done ;;
  bench-any)  # the any-mask kind above GLUON_MIN_KEYS
    for plan in "" "--plan gluon_forward=off --plan gluon_backward=off"; do
      timeout 70 python3 -m flashgen bench examples/mistral_sliding.attn --head-dim 128 --seqlens 8000 8192 \
        --systems flashgen --timer cuda-graph $plan --jsonl $OUT/any_length.jsonl 2>&1 \
        | grep -A6 "^TFLOP/s" | sed "s/^/[${plan:-as built}] /"
    done ;;
  esac
done
