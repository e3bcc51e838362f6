#!/usr/bin/env bash
# Decision 050's measurement: specs that read inputs (T5's table in the score,
# documents in the mask) beside FlexAttention, with the default plan and with each
# experiment knob on input reads (the Flex column cross-checks every output);
# results to $OUT.
#   bash scripts/gpu_input_reads.sh [SECONDS] [SEQLENS...]      # default 540; 4096 16384
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
end=$((SECONDS + ${1:-540}))
shift || true
seqlens=${*:-4096 16384}
left() { echo $((end - SECONDS)); }
specs="benchmarks/specs/t5_bias.attn benchmarks/specs/packed_docs.attn"
for plan in "" gather_unpipelined=on hoist_reads=on; do
  name=${plan:-default}
  # shellcheck disable=SC2086
  timeout "$(left)" python3 -m flashgen bench $specs --head-dim 64 128 --seqlens $seqlens \
    --systems flashgen flex ${plan:+--plan "$plan"} --jsonl "$OUT/results.jsonl" \
    >"$OUT/$name.txt" 2>"$OUT/$name.stderr"
  echo "$name: exit $?"; cat "$OUT/$name.txt"
done
