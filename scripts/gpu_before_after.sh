#!/usr/bin/env bash
# `flashgen bench` of an older commit and of this tree side by side on one GPU,
# spec by spec in turn (the older commit's run, then this tree's), so that a
# drift of the GPU's clocks falls on both.  The older commit travels as .base/,
# unpacked here and carried (`carry: [".whl", ".base"]`):
#   rm -rf .base && mkdir .base && git archive COMMIT | tar -x -C .base
#   bash scripts/gpu_before_after.sh [bench args...]
#   (default: every example at head dims 64 and 128, N = 1024 ... 16384,
#   flashgen alone)
# Writes $OUT/base.jsonl and $OUT/head.jsonl (one JSON list per spec);
# `python scripts/compare_bench.py base.jsonl head.jsonl` prints the ratios.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
[ -d .base/flashgen ] || { echo "no .base/: unpack the older commit there first"; exit 2; }
if [ $# -eq 0 ]; then
  set -- --head-dim 64 128 --seqlens 1024 2048 4096 8192 16384 --systems flashgen
fi
site=$(tr ':' '\n' <<<"$PYTHONPATH" | grep -vx "$PWD" | paste -sd:)  # the wheels, not this tree
for root in "$PWD/.base" "$PWD"; do  # which flashgen each run imports
  (cd "$root" && PYTHONPATH=${site:+$site:}$root python3 -c "import flashgen; print(flashgen.__file__)")
done
for spec in ${SPECS:-examples/*.attn}; do
  for tree in base head; do
    root=$PWD
    [ $tree = base ] && root=$PWD/.base
    # From the tree's own root: `python -m` puts the working directory first on sys.path.
    (cd "$root" && PYTHONPATH=${site:+$site:}$root python3 -m flashgen bench "$OLDPWD/$spec" "$@" \
      --json "$OUT/$tree.one.json" >"$OUT/$tree.txt" 2>&1) || tail -3 "$OUT/$tree.txt"
    [ -s "$OUT/$tree.one.json" ] && tr -d '\n' <"$OUT/$tree.one.json" >>"$OUT/$tree.jsonl" \
      && echo >>"$OUT/$tree.jsonl"
    rm -f "$OUT/$tree.one.json"
  done
  echo "$spec: $((SECONDS))s"
done
rm -f "$OUT"/base.txt "$OUT"/head.txt
