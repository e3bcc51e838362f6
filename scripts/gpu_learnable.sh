#!/usr/bin/env bash
# Learnable inputs on the GPU machine (decision 048).  `tests`: the kernels tier's
# learnable, compile, hf, sequences, sinks and offsets tests in bf16/fp16 at lengths
# that cross the tiles, then examples/train_gpt.py; `bench`: T5's table, learned and
# fixed, beside FlexAttention (captured tensor, gradient enabled for the learned one);
# results to $OUT; `tiles` (decision 086's open question): tests/test_learnable.py one
# process per spec (the per-key ones of decision 087 among them), the T5 example's d128
# gradient at the rule's tiles and at two faster ones that spill, and the learned decay
# and table timed at each; `d128`: test_learnable_gradients_at_head_dim_128, one process per
# spec (d128 and d80 (padded), each at the rule's tiles and one other, bf16 and fp16).
#   bash scripts/gpu_learnable.sh tests|bench|tiles|d128 [SECONDS]      # default 540
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
elif [ "$part" = tiles ]; then
  for name in alibi blocks documents fox key_bias key_temperature pairs relative rows t5 \
    "temperature and not key" two_reads autograd_gets; do
    timeout $(($(left) / 2)) python3 -m pytest -q -p no:cacheprovider -m kernels -rf \
      tests/test_learnable.py -k "$name" >"$OUT/learnable_${name%% *}.txt" 2>&1 &
  done
  for dtype in fp16 bf16; do
    timeout $(($(left) / 2)) python3 scripts/gpu_t5_gradient.py $dtype --head-dim 128 --shapes 2 \
      --only "as built" --only "32 x 128 x 8 x 2" --only "64 x 128 x 8 x 2" --no-slots \
      >"$OUT/t5_d128_$dtype.txt" 2>&1 &
  done
  wait
  for f in "$OUT"/learnable_*.txt; do echo "$(basename "$f"): $(tail -1 "$f")"; done
  tail -n 8 "$OUT"/t5_d128_*.txt
  for config in "" 32,128,8,2 64,128,8,2; do
    timeout "$(left)" python3 -m flashgen bench benchmarks/specs/learnable/forgetting.attn \
      benchmarks/specs/learnable/t5_learned.attn --head-dim 128 --seqlens 16384 --systems flashgen \
      --timer cuda-graph ${config:+--plan gpu_bwd_config=$config} --jsonl "$OUT/tiles.jsonl" \
      2>&1 | grep -E "^(forgetting|t5_learned) "
  done
elif [ "$part" = d128 ]; then
  for name in t5 fox key_bias rows pairs; do
    timeout "$(left)" python3 -m pytest -q -p no:cacheprovider -m kernels -rf \
      tests/test_learnable.py -k "head_dim_128 and $name" >"$OUT/d128_$name.txt" 2>&1 &
  done
  wait
  for f in "$OUT"/d128_*.txt; do echo "$(basename "$f"): $(tail -n 1 "$f")"; done
else
  timeout "$(left)" python3 -m flashgen bench benchmarks/specs/learnable/t5_learned.attn \
    benchmarks/specs/t5_bias.attn --head-dim 64 128 --seqlens 4096 16384 \
    --systems flashgen flex --jsonl "$OUT/results.jsonl" 2>"$OUT/bench.stderr" | tee "$OUT/bench.txt"
  echo "bench: exit ${PIPESTATUS[0]}"
fi
