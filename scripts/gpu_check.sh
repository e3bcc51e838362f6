#!/usr/bin/env bash
# Correctness run on a CUDA machine that has torch and triton but no package
# index (our H200 test machine).  lark and black travel as wheels in .whl/
# (see docs/DEVELOPING.md, "On a GPU").  Writes the per-case error table to $OUT.
#
#   bash scripts/gpu_check.sh [pytest args...]
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
export FLASHGEN_GPU_SUMMARY="$OUT/gpu_summary.txt"
: > "$FLASHGEN_GPU_SUMMARY"
python3 -m pytest -q -p no:cacheprovider -rf "$@" 2>&1 | tee "$OUT/pytest.log"
status=${PIPESTATUS[0]}
echo "cases: $(wc -l < "$FLASHGEN_GPU_SUMMARY") checks, $(grep -c FAIL "$FLASHGEN_GPU_SUMMARY") failed"
awk '{print $2}' "$FLASHGEN_GPU_SUMMARY" | sort | uniq -c
exit "$status"
