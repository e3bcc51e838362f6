#!/usr/bin/env bash
# `flashgen bench` on a CUDA machine with torch and triton but no package index
# (lark and black travel as wheels in .whl/, as for gpu_check.sh).  Writes the
# table, JSON and plot to $OUT.
#
#   bash scripts/gpu_bench.sh [flashgen bench args...]
#   (default: every example at head dims 64 and 128, N = 1024 ... 16384)
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
if [ $# -eq 0 ]; then
  set -- examples/*.attn --head-dim 64 128 --seqlens 1024 2048 4096 8192 16384
fi
python3 -m flashgen bench "$@" --json "$OUT/bench.json" --plot "$OUT/bench.png" \
  2>"$OUT/bench.stderr" | tee "$OUT/bench.txt"
