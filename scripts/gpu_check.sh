#!/usr/bin/env bash
# Correctness run on a CUDA machine that has torch and triton but no package
# index (our H200 test machine).  lark and black travel as wheels in .whl/
# (see README: "GPU runs").  Writes the per-case error table to $OUT.
#
#   bash scripts/gpu_check.sh [pytest args...]
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
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
export FLASHGEN_GPU_SUMMARY="$OUT/gpu_summary.txt"
: > "$FLASHGEN_GPU_SUMMARY"
python3 -m pytest -q -p no:cacheprovider -rf "$@" 2>&1 | tee "$OUT/pytest.log"
status=${PIPESTATUS[0]}
echo "cases: $(wc -l < "$FLASHGEN_GPU_SUMMARY") checks, $(grep -c FAIL "$FLASHGEN_GPU_SUMMARY") failed"
awk '{print $2}' "$FLASHGEN_GPU_SUMMARY" | sort | uniq -c
exit "$status"
