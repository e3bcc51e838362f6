#!/usr/bin/env bash
# The Gluon forward at head dim 64 (kernel_choice: on by default for full and
# causal from GLUON_PLAIN_MIN_KEYS keys, off for other masks and scores;
# decision 068).  check: its GPU tests against the float64 reference, every
# mask and score forced on.  bench: the examples at d64 with it on for every
# mask, score and length (beside FlexAttention and cuDNN), then with it off
# (the Triton forward), each in one process; records in $OUT/gluon_d64.jsonl.
# drawn: decision 099's run: drawn specs of seeds 0-2 that would take the
# any-mask kind at d64 (all seven whose score costs no special operation,
# kernel_choice.score_special_ops, and seven of one), N = 4096, CUDA graphs: as
# built (the Triton forward), then with the any-mask kind at d64 (seed 0's
# beside FlexAttention), and the example prefix_lm (causal | prefix, score s);
# DIMS=128 or DIMS=64,128 runs one of the two settings (each fits a call of 600 s);
# DRAWN="SEED NAME ...;SEED NAME ..." other drawn specs (then no prefix_lm).
# files: the held-out draws of benchmarks/specs/split_walk (seeds 3-5), both ways.
#   [BENCH_ARGS="--timer cuda-graph"] [DIMS=...] bash scripts/gpu_gluon_d64.sh [check] [bench] [drawn] [files]
source scripts/gpu_env.sh
bench() {  # bench HEAD_DIMS_OF_THE_GLUON_FORWARD ARGS...: flashgen bench with that setting
  local dims=$1
  shift
  python3 - "$dims" "$@" <<'PY'
import sys
from flashgen import kernel_choice
from flashgen.cli import main

dims = tuple(int(d) for d in sys.argv[1].split(","))
kernel_choice.GLUON_FORWARD_HEAD_DIMS = kernel_choice.GLUON_FORWARD_ANY_HEAD_DIMS = dims
kernel_choice.GLUON_PLAIN_MIN_KEYS = {}
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
        --seqlens 1024 4096 16384 --systems $systems $BENCH_ARGS --jsonl "$OUT/gluon_d64.jsonl" 2>&1 \
        | grep -A12 "^TFLOP/s"
      [ "$dims" = 64,128 ] && systems="flashgen flex"
      # shellcheck disable=SC2086
      bench "$dims" bench examples/mistral_sliding.attn examples/bloom_alibi.attn \
        examples/gemma2_local.attn --head-dim 64 --seqlens 4096 16384 --systems $systems $BENCH_ARGS \
        --jsonl "$OUT/gluon_d64.jsonl" 2>&1 | grep -A12 "^TFLOP/s"
    done ;;
  drawn)
    for dims in ${DIMS:-128 64,128}; do
      IFS=';' read -ra sets <<<"${DRAWN:-0 rand0_1 rand0_7 rand0_11 rand0_16;1 rand1_0 rand1_26 rand1_1 \
rand1_2 rand1_16 rand1_23;2 rand2_11 rand2_13 rand2_16 rand2_24}"
      for drawn in "${sets[@]}"; do
        set -- $drawn
        systems="flashgen"
        [ "$dims" = 64,128 ] && [ "$1" = 0 ] && systems="flashgen flex"
        # shellcheck disable=SC2086
        timeout 200 bash -c "$(declare -f bench); bench $dims bench --random 30 --seed $1 --name ${*:2} \
          --head-dim 64 --seqlens 4096 --systems $systems --timer cuda-graph \
          --jsonl $OUT/gluon_d64_drawn.jsonl" 2>&1 | grep -E "^rand" | sed "s/^/[d64 any-mask on $dims] /"
      done
      # A causal mask with a prefix and the score s (an example, d64 as written).
      [ -z "${DRAWN:-}" ] && timeout 100 bash -c "$(declare -f bench); bench $dims bench examples/prefix_lm.attn --seqlens 4096 \
        --systems flashgen --timer cuda-graph --jsonl $OUT/gluon_d64_drawn.jsonl" 2>&1 \
        | grep -A3 "^TFLOP/s" | sed "s/^/[d64 any-mask on $dims] /"
    done ;;
  files)  # decision 099's held-out check: benchmarks/specs/split_walk, both ways, two processes
    for dims in ${DIMS:-128 64,128}; do
      timeout 250 bash -c "$(declare -f bench); bench $dims bench benchmarks/specs/split_walk/*.attn \
        --seqlens 4096 --systems flashgen --timer cuda-graph --jsonl $OUT/gluon_d64_drawn.jsonl" 2>&1 \
        | grep -A14 "^TFLOP/s" | sed "s/^/[d64 any-mask on $dims] /"
    done ;;
  esac
done
