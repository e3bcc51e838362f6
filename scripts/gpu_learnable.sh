#!/usr/bin/env bash
# Learnable inputs on the GPU machine (decision 048).  `tests`: the kernels tier's
# learnable, compile, hf, sequences, sinks and offsets tests in bf16/fp16 at lengths
# that cross the tiles, then examples/train_gpt.py; `bench`: T5's table, learned and
# fixed, beside FlexAttention (captured tensor, gradient enabled for the learned one);
# results to $OUT.
#   bash scripts/gpu_learnable.sh tests|bench [SECONDS]      # default 540
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
part=$1
end=$((SECONDS + ${2:-540}))
left() { echo $((end - SECONDS)); }
if [ "$part" = tests ]; then
  python3 -c "import transformers" 2>/dev/null ||
    python3 -m pip install -q --no-index --find-links .whl/hf transformers >"$OUT/pip.txt" 2>&1
  timeout "$(left)" python3 -m pytest -q -p no:cacheprovider -m kernels -rf \
    tests/test_learnable.py tests/test_compile.py tests/test_hf.py tests/test_sequences.py \
    tests/test_sinks.py tests/test_offsets.py >"$OUT/tests.txt" 2>&1
  echo "tests: exit $?"; tail -4 "$OUT/tests.txt"
  timeout "$(left)" python3 examples/train_gpt.py --jsonl "$OUT/train_gpt.jsonl" \
    2>&1 | tee "$OUT/train_gpt.txt" | tail -6
  echo "train_gpt: exit ${PIPESTATUS[0]}"
else
  timeout "$(left)" python3 -m flashgen bench benchmarks/specs/learnable/t5_learned.attn \
    benchmarks/specs/t5_bias.attn --head-dim 64 128 --seqlens 4096 16384 \
    --systems flashgen flex --jsonl "$OUT/results.jsonl" 2>"$OUT/bench.stderr" | tee "$OUT/bench.txt"
  echo "bench: exit ${PIPESTATUS[0]}"
fi
