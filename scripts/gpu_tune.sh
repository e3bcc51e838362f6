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
end=$((SECONDS + budget))
for spec in ${SPECS:-examples/*.attn}; do
  left=$((end - SECONDS))
  [ "$left" -gt 20 ] || { echo "tune: out of time before $spec"; break; }
  timeout "$left" python3 -m flashgen tune "$spec" "$@" 2>>"$OUT/tune.stderr"
  echo "tune $(basename "$spec" .attn): exit $?"
  sidecar="${spec%.attn}.tune.json"
  [ -f "$sidecar" ] && cp "$sidecar" "$OUT/"
done
