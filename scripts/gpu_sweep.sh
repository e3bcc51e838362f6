#!/usr/bin/env bash
# Launch-config sweep (scripts/gpu_sweep.py) on the GPU machine.
#   bash scripts/gpu_sweep.sh [gpu_sweep.py args...]
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
python3 scripts/gpu_sweep.py "$@" 2>"$OUT/sweep.stderr" | tee "$OUT/sweep.txt"
tail -5 "$OUT/sweep.stderr"
