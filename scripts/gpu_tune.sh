#!/usr/bin/env bash
# `flashgen tune` spec by spec on the GPU machine, within a time budget, and
# the sidecars copied to $OUT (the device returns only what is there): copy
# them next to the specs here, run `flashgen build`, commit both.
#   [SPECS="examples/a.attn ..."] bash scripts/gpu_tune.sh SECONDS [tune args...]
# e.g. SPECS="examples/full.attn examples/plain_causal.attn" \
#      bash scripts/gpu_tune.sh 400 --quick --passes backward
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
budget=$1
shift
tune() {
  local spec=$1 left=$2
  shift 2
  timeout "$left" python3 -m flashgen tune "$spec" "$@" 2>>"$OUT/tune.stderr"
  echo "tune $(basename "$spec" .attn): exit $?"
  [ -f "${spec%.attn}.tune.json" ] && cp "${spec%.attn}.tune.json" "$OUT/"
}
each_spec "$budget" tune "$@"
