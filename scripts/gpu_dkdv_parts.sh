#!/usr/bin/env bash
# Decision 095 on the GPU machine.  First its tests: the Gluon backward's cases
# with masked dK/dV tiles in 32-row parts (`test_gluon_backward_on_gpu[parts-...]`,
# d64 and d128 in two processes) and the masks over runtime data at d128 under
# `gluon_data_d128=on`; then the timing, one `flashgen bench` process a setting:
# d128 masked examples as built (beside cuDNN) and with --plan gluon_dkdv_parts=32,
# packed documents at d128 as built (beside FlexAttention) and with --plan
# gluon_data_d128=on.  `bench` alone skips the tests.
#   bash scripts/gpu_dkdv_parts.sh [all|bench] [SECONDS]   # default all 560
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
part=${1:-all}
end=$((SECONDS + ${2:-560}))
left() { echo $((end - SECONDS)); }
if [ "$part" = all ]; then
  for d in "not 128" "128"; do
    tag=$(echo "$d" | tr -cd 'a-z0-9')
    timeout $(($(left) / 2)) python3 -m pytest -q -p no:cacheprovider -rf tests/test_gpu.py \
      -k "test_gluon_backward_on_gpu and parts and $d" >"$OUT/parts_$tag.txt" 2>&1 &
  done
  timeout $(($(left) / 2)) python3 -m pytest -q -p no:cacheprovider -rf tests/test_gpu.py \
    -k "test_masks_over_runtime_data_and_the_gluon_backward_on_gpu and 128-True" \
    >"$OUT/data128.txt" 2>&1 &
  wait
  for f in "$OUT"/parts_*.txt "$OUT"/data128.txt; do
    echo "$(basename "$f" .txt): $(tail -n 1 "$f")"
    grep -E "^(FAILED|ERROR)" "$f" | head -5
  done
fi
bench() {  # LABEL ARGS...
  local label=$1
  shift
  [ "$(left)" -gt 40 ] || { echo "out of time before $label"; return; }
  timeout "$(left)" python3 -m flashgen bench --timer cuda-graph --jsonl "$OUT/parts.jsonl" "$@" \
    2>&1 | grep -E "^(plain_causal|mistral_sliding|gemma2_local|packed_docs) " | sed "s,^,$label ,"
}
masked="examples/plain_causal.attn examples/mistral_sliding.attn examples/gemma2_local.attn"
# shellcheck disable=SC2086
bench "as built" $masked --head-dim 128 --seqlens 4096 16384 --systems flashgen sdpa-cudnn
# shellcheck disable=SC2086
bench "parts 32" $masked --head-dim 128 --seqlens 4096 16384 --systems flashgen \
  --plan gluon_dkdv_parts=32
docs=benchmarks/specs/packed_docs.attn
bench "as built" $docs --head-dim 128 --seqlens 16384 65536 --systems flashgen flex
bench "gluon d128" $docs --head-dim 128 --seqlens 16384 65536 --systems flashgen \
  --plan gluon_data_d128=on
