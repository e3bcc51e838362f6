# The merged edge loops (decision 057) on a GPU: correctness of the specs whose
# kernels take them, the launch configurations swept again, and the bench
# against FlexAttention.  Usage: bash scripts/gpu_merged_edges.sh [check|sweep|bench]...
source scripts/gpu_env.sh
for step in ${*:-check sweep bench}; do
  case $step in
  check)
    timeout 200 python3 scripts/gpu_inputs_smoke.py | tail -4
    timeout 240 python3 -m flashgen verify benchmarks/specs/packed_docs.attn \
      benchmarks/specs/chunked_causal.attn benchmarks/specs/short_rows/abs_band.attn \
      examples/encoder_band.attn examples/mistral_sliding.attn examples/llama3_packed_docs.attn \
      --device cuda --examples 3 --accept-partial 2>&1 | grep -E "^(ok|FAIL|fail|not)|error" | tail -12 ;;
  sweep)
    python3 scripts/gpu_config_sweep.py "$OUT/sweep_merged.jsonl" --workers 14 \
      --masks packed_docs chunked_causal band_129 window_1024 causal_16k | tail -n 170 ;;
  bench)
    python3 -m flashgen bench benchmarks/specs/packed_docs.attn benchmarks/specs/chunked_causal.attn \
      benchmarks/specs/short_rows/abs_band.attn --head-dim 64 128 --seqlens 16384 \
      --systems flashgen flex --jsonl "$OUT/results.jsonl" 2>&1 | tail -30 ;;
  esac
done
# gluon: the Gluon backward against the Triton one on short rows at d64.
if [[ " $* " == *" gluon "* ]]; then
  for plan in gluon_backward=off ""; do
    python3 -m flashgen bench benchmarks/specs/chunked_causal.attn \
      benchmarks/specs/short_rows/window_1024.attn benchmarks/specs/short_rows/abs_band.attn \
      --head-dim 64 128 --seqlens 4096 16384 --systems flashgen ${plan:+--plan $plan} \
      --jsonl "$OUT/results.jsonl" 2>&1 | grep -A20 "^variant"
  done
fi
