#!/usr/bin/env bash
# The Gluon forward at head dim 64 (kernel_choice.GLUON_FORWARD_HEAD_DIMS, off
# by default until measured; issue 23 asks for the d64 forward at 1.0x cuDNN,
# where the Triton forward ran at 0.89-0.94x).  check: its GPU tests against
# the float64 reference.  bench: the examples at d64 with it on (beside
# FlexAttention and cuDNN), then with the module's default (the Triton
# forward), each in one process; records in $OUT/gluon_d64.jsonl.
#   bash scripts/gpu_gluon_d64.sh [check] [bench]
source scripts/gpu_env.sh
bench() {  # bench HEAD_DIMS_OF_THE_GLUON_FORWARD ARGS...: flashgen bench with that setting
  local dims=$1
  shift
  python3 - "$dims" "$@" <<'PY'
import sys
from flashgen import kernel_choice
from flashgen.cli import main

kernel_choice.GLUON_FORWARD_HEAD_DIMS = tuple(int(d) for d in sys.argv[1].split(","))
sys.exit(main(sys.argv[2:]))
PY
}
for step in ${*:-check bench}; do
  case $step in
  check)
    timeout 400 python3 -m pytest -q -m "" -p no:cacheprovider -x tests/test_gpu.py \
      -k "gluon_forward_at_head_dim_64" 2>&1 | tail -5 ;;
  bench)
    for dims in 64,128 128; do
      systems="flashgen"
      [ "$dims" = 64,128 ] && systems="flashgen flex sdpa-cudnn"
      # shellcheck disable=SC2086
      bench "$dims" bench examples/full.attn examples/plain_causal.attn --head-dim 64 \
        --seqlens 1024 4096 16384 --systems $systems --jsonl "$OUT/gluon_d64.jsonl" 2>&1 \
        | grep -A12 "^TFLOP/s"
      [ "$dims" = 64,128 ] && systems="flashgen flex"
      # shellcheck disable=SC2086
      bench "$dims" bench examples/mistral_sliding.attn examples/bloom_alibi.attn \
        examples/gemma2_local.attn --head-dim 64 --seqlens 4096 16384 --systems $systems \
        --jsonl "$OUT/gluon_d64.jsonl" 2>&1 | grep -A12 "^TFLOP/s"
    done ;;
  esac
done
