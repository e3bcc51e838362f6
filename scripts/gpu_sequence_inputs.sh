#!/usr/bin/env bash
# Declared inputs in padded and varlen calls and with position offsets on the
# GPU machine (decision 051): tests/test_sequence_inputs.py (bf16 at lengths
# crossing the GPU's tiles, each sequence against the float64 reference alone,
# padded rows bit for bit, learnable gradients summed over the sequences), then
# the other tests whose kernels the change touched (learnable inputs, inputs,
# sequences, offsets, torch.compile); results to $OUT.
#   bash scripts/gpu_sequence_inputs.sh [SECONDS]   # default 560
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
end=$((SECONDS + ${1:-560}))
left() { echo $((end - SECONDS)); }
timeout "$(left)" python3 -m pytest -q -p no:cacheprovider -m kernels -rf \
  tests/test_sequence_inputs.py >"$OUT/test_sequence_inputs.txt" 2>&1
echo "test_sequence_inputs: exit $?"; tail -5 "$OUT/test_sequence_inputs.txt"
timeout "$(left)" python3 -m pytest -q -p no:cacheprovider -m kernels -rf \
  tests/test_learnable.py tests/test_inputs.py tests/test_sequences.py tests/test_offsets.py \
  tests/test_compile.py >"$OUT/test_related.txt" 2>&1
echo "learnable, inputs, sequences, offsets, compile: exit $?"; tail -5 "$OUT/test_related.txt"
