# Sourced by the scripts/gpu_*.sh: makes flashgen importable on a CUDA machine
# that has torch and triton but no package index.  lark, platformdirs, rich and
# black travel as wheels in .whl/ (docs/DEVELOPING.md, "On a GPU").
OUT=${OUT:-/tmp/flashgen-gpu}
mkdir -p "$OUT"
if ! python3 -c "import lark, black, platformdirs, rich" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv

# each_spec SECONDS FUNCTION [ARGS...]: FUNCTION SPEC SECONDS_LEFT ARGS... for
# each spec in $SPECS (default: the examples) while more than 20 s are left.
each_spec() {
  local end=$((SECONDS + $1)) fn=$2 spec left
  shift 2
  for spec in ${SPECS:-examples/*.attn}; do
    left=$((end - SECONDS))
    [ "$left" -gt 20 ] || { echo "$fn: out of time before $spec"; break; }
    "$fn" "$spec" "$left" "$@"
  done
}
