#!/usr/bin/env bash
# Issue 24's GPU checks: tests/test_compile.py (torch.compile with no graph
# break, compiled equal to eager) and tests/test_hf.py (a tiny Llama with
# flashgen.hf against eager attention) with the real kernels, then
# examples/train_gpt.py (flashgen's causal spec against SDPA, same seed);
# results to $OUT.  transformers must travel as wheels (scripts/gpu_wheels.sh).
#   bash scripts/gpu_stack.sh [SECONDS] [TRAIN ARGS...]   # default 540
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
python3 -c "import transformers" 2>/dev/null ||
  python3 -m pip install -q --no-index --find-links .whl/hf transformers || exit 1
end=$((SECONDS + ${1:-540}))
shift || true
left() { echo $((end - SECONDS)); }
timeout "$(left)" python3 -m pytest -q -p no:cacheprovider -m kernels -rf \
  tests/test_compile.py tests/test_hf.py >"$OUT/test_stack.txt" 2>&1
echo "test_compile, test_hf: exit $?"; tail -5 "$OUT/test_stack.txt"
timeout "$(left)" python3 examples/train_gpt.py --jsonl "$OUT/train_gpt.jsonl" "$@" \
  2>&1 | tee "$OUT/train_gpt.txt" | tail -6
echo "train_gpt: exit ${PIPESTATUS[0]}"
