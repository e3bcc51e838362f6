#!/usr/bin/env bash
# Decision 092 on the GPU machine: the Gluon backward's streamed tiles of 128
# rows (`--plan gluon_bwd_streams=A,B`; 128 dK/dV rows for a full mask alone,
# decision 095).  First the Gluon backward's test at the
# wide settings (tests/test_gpu.py, `test_gluon_backward_on_gpu[wide-...]`, four
# processes: fp16 and bf16 at d64 and d128), then the full and causal examples'
# forward + backward from CUDA graphs at each setting, one process each, with
# cuDNN beside the first; results to $OUT.
#   bash scripts/gpu_gluon_streams.sh [SECONDS]   # default 560
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
end=$((SECONDS + ${1:-560}))
left() { echo $((end - SECONDS)); }
for group in "FP16 and not 128" "FP16 and 128" "BF16 and not 128" "BF16 and 128"; do
  tag=$(echo "$group" | tr -cd 'a-zA-Z0-9')
  timeout $(($(left) / 2)) python3 -m pytest -q -p no:cacheprovider -rf tests/test_gpu.py \
    -k "test_gluon_backward_on_gpu and wide and $group" >"$OUT/wide_$tag.txt" 2>&1 &
done
wait
for f in "$OUT"/wide_*.txt; do
  echo "$(basename "$f" .txt): $(tail -n 1 "$f")"
  grep -E "^(FAILED|ERROR)" "$f" | head -5
done
bench() {  # LABEL SPECS ARGS...
  local label=$1 specs=$2
  shift 2
  [ "$(left)" -gt 40 ] || { echo "out of time before $label"; return; }
  # shellcheck disable=SC2086
  timeout "$(left)" python3 -m flashgen bench $specs \
    --seqlens 4096 16384 --timer cuda-graph --jsonl "$OUT/streams.jsonl" "$@" 2>&1 |
    grep -E "^(full|plain_causal) " | sed "s,^,$label ,"
}
both="examples/full.attn examples/plain_causal.attn"
# 128 streamed dK/dV rows only for a full mask (decision 095).
bench "d64 64,64" "$both" --head-dim 64 --systems flashgen sdpa-cudnn
bench "d64 128,128" examples/full.attn --head-dim 64 --systems flashgen --plan gluon_bwd_streams=128,128
bench "d64 64,128" "$both" --head-dim 64 --systems flashgen --plan gluon_bwd_streams=64,128
bench "d128 64,64" "$both" --head-dim 128 --systems flashgen sdpa-cudnn
bench "d128 64,128" "$both" --head-dim 128 --systems flashgen --plan gluon_bwd_streams=64,128
