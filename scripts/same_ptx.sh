#!/usr/bin/env bash
# Whether this tree's kernels compile to the same PTX as an older commit's
# (default HEAD): every example (or $SPECS) at head dims 64 and 128, for
# sm_90a at each module's own configs, Triton and Gluon kernels alike
# (scripts/sm90_resources.py --ptx; no GPU needed).  Equal PTX means equal
# kernels, so a refactor of the templates that passes needs no GPU run, for
# correctness or for speed.  scripts/same_code.py is the quicker, stricter
# check (the generated source, up to formatting).
#   bash scripts/same_ptx.sh [BASE]     # exit 1 if any kernel differs
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-HEAD}
python=${PYTHON:-$PWD/.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/tree" "$work/base" "$work/head"
git archive "$base" | tar -x -C "$work/tree"
site=$("$python" -c "import site; print(site.getsitepackages()[0])")
here=$PWD
run() {  # TREE OUT: that tree's flashgen alone (python -S skips an editable install's finder)
  (cd "$1" && FLASHGEN_TREE="$1" PYTHONPATH="$1:$site" "$python" -S \
    "$here/scripts/sm90_resources.py" ${SPECS:-examples/*.attn} --head-dim 64 128 --ptx "$2" \
    >"$2.log")
}
run "$work/tree" "$work/base"
run "$here" "$work/head"
if diff -rq "$work/base" "$work/head"; then
  echo "same PTX as $base: $(ls "$work/head" | wc -l) kernels"
else
  exit 1
fi
