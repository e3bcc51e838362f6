#!/usr/bin/env bash
# `flashgen bench` on a CUDA machine with torch and triton but no package index
# (lark and black travel as wheels in .whl/, as for gpu_check.sh).  Writes the
# table, JSON and plot to $OUT.
#
#   bash scripts/gpu_bench.sh [flashgen bench args...]
#   (default: every example at head dims 64 and 128, N = 1024 ... 16384)
set -uo pipefail
OUT=${OUT:-/tmp/flashgen-gpu}
mkdir -p "$OUT"
if ! python3 -c "import lark, black" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
if [ $# -eq 0 ]; then
  set -- examples/*.attn --head-dim 64 128 --seqlens 1024 2048 4096 8192 16384
fi
python3 -m flashgen bench "$@" --json "$OUT/bench.json" --plot "$OUT/bench.png" \
  2>"$OUT/bench.stderr" | tee "$OUT/bench.txt"
