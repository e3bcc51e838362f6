#!/usr/bin/env bash
# Runs gpu_learnable_probe4.py's variations in parallel, one process each.
source "$(dirname "$0")/gpu_env.sh"
export CUDA_LAUNCH_BLOCKING=1
which compute-sanitizer; ls /usr/local/cuda*/bin 2>/dev/null | head -3
nvidia-smi --query-gpu=name,driver_version --format=csv
printf '%s\n' "base 1024" "base 1000" "base 1008" "base 2048" "nodirect 1024" "stages1 1024" "stages2 1024" \
  "warps8 1024" "nodlse_use 1024" "dlse_zero 1024" "no_row_term 1024" |
  xargs -P 11 -L 1 bash -c 'timeout 400 python3 scripts/gpu_learnable_probe4.py $0 $1 2>&1 | grep -v Warning | tail -2'
