#!/usr/bin/env bash
# One device call: the GPU correctness tests for the examples (bf16, forward
# and backward), then `flashgen bench` spec by spec, so that a time limit
# keeps the specs already measured.  Results under $OUT.
#   [SPECS="examples/a.attn ..."] bash scripts/gpu_final.sh CHECK_SECONDS BENCH_SECONDS [bench args...]
# CHECK_SECONDS=0 skips the tests.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
check_s=$1 bench_s=$2
shift 2
export FLASHGEN_GPU_SUMMARY="$OUT/gpu_summary.txt"
if [ "$check_s" -gt 0 ]; then
  : > "$FLASHGEN_GPU_SUMMARY"
  timeout "$check_s" python3 -m pytest -q -p no:cacheprovider -rf tests/test_gpu.py \
    -k "example and BF16" > "$OUT/pytest.log" 2>&1
  echo "gpu tests: exit $?; $(tail -1 "$OUT/pytest.log")"
  echo "checks: $(wc -l < "$FLASHGEN_GPU_SUMMARY"), failed: $(grep -c FAIL "$FLASHGEN_GPU_SUMMARY")"
fi
bench() {
  local spec=$1 left=$2 name
  name=$(basename "$spec" .attn)
  shift 2
  timeout "$left" python3 -m flashgen bench "$spec" "$@" --json "$OUT/bench_$name.json" \
    2>"$OUT/bench_$name.stderr" > "$OUT/bench_$name.txt"
  echo "bench $name: exit $?"
}
each_spec "$bench_s" bench "$@"
# The device returns at most a few files: merge the per-spec outputs.
python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
rows = []
for path in sorted(glob.glob(os.path.join(out, "bench_*.json"))):
    rows += json.load(open(path))
json.dump(rows, open(os.path.join(out, "bench.json"), "w"), indent=1)
for ext, merged in ((".txt", "bench.txt"), (".stderr", "bench.stderr")):
    with open(os.path.join(out, merged), "w") as f:
        for path in sorted(glob.glob(os.path.join(out, "bench_*" + ext))):
            f.write(open(path).read())
            os.remove(path)
for path in glob.glob(os.path.join(out, "bench_*.json")):
    os.remove(path)
PY
cat "$OUT/bench.txt"
