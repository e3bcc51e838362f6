#!/usr/bin/env bash
# tests/test_gpu.py in parallel processes (groups), spread over the machine's
# GPUs, each within SECONDS.  The per-case error table goes to
# $OUT/gpu_summary.txt, each group's log tail to stdout.  On a machine whose
# time is rationed this is the check after every kernel change.
#
# Fifteen groups in three parts.  Part 1 (eight groups): the Gluon backward (fp16,
# bf16), the any-mask Gluon forward (masks; the generated modules' dispatch
# with the other half), random gradient specs, the whole-language specs, the
# others (compiling ahead, CUDA-graph captures, ptxas's fewer stages, masks that hide every pair or
# run without the tile test, fp32's tiles), and the fp32 gradients of the examples that the
# groups of parts 2 and 3 leave out (tests/test_scripts.py checks that every
# test of tests/test_gpu.py is in a group).
# Part 2 (four): fp32 example outputs, half of the fp32 example gradients,
# random forward specs with the Gluon forward and the launch paths, and the
# limits (the spec at the nesting limit, row offsets past int32).
# Part 3 (three): the examples in fp16 and in bf16 (outputs and gradients)
# and the other half of the fp32 example gradients.
# On one H200 with 16 cores the groups do not all fit one call of 600 s: run
# PART=1, PART=2 and PART=3 as three calls.  On 2026-12-04 part 1 took 508 s;
# the seven groups of parts 2 and 3 together, beside a `flashgen verify`, took
# 330-457 s, and the examples in fp16 and in bf16 ran out at 470 s; part 3's
# three groups alone took 77-165 s.
# GPUS=1 puts every group on GPU 0, leaving the others free.
# GLUON_FORWARD_ONLY=1: the tests that run the Gluon forward (its own test,
# the 16-bit full and plain_causal examples, outputs and gradients, and the
# any-mask kernel with the modules' dispatch), for a change to that kernel alone.
# ONLY="NAME ...": only the named groups of the part(s) chosen.
#   [FLASHGEN_GPU_EXAMPLES=16] [PART=1|2|3] [ONLY="NAME ..."] [BACKWARD_ONLY=1 | GLUON_FORWARD_ONLY=1] [GPUS=N] \
#     bash scripts/gpu_tests.sh SECONDS
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
seconds=${1:-400}
logs=$(mktemp -d)
gpus=${GPUS:-$(nvidia-smi -L | wc -l)}
started=0
group() {  # in the background, on the machine's GPUs in turn
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $1 "* ]]; then return; fi
  _group "$((started % gpus))" "$@" &
  started=$((started + 1))
}
_group() {
  local gpu=$1 name=$2 selection=$3
  CUDA_VISIBLE_DEVICES=$gpu FLASHGEN_GPU_SUMMARY="$logs/$name.sum" timeout "$seconds" python3 -m pytest -q \
    -p no:cacheprovider -rf tests/test_gpu.py -k "$selection" >"$logs/$name.log" 2>&1
  echo "== $name (GPU $gpu): exit $?"
  grep -E "passed|failed|FAILED|Error" "$logs/$name.log" | tail -8
}
if [ -n "${GLUON_FORWARD_ONLY:-}" ]; then  # a change to the Gluon forward only
  group gluon-forward "gluon_forward_on_gpu"
  group gluon-examples-fp16 "(full or plain_causal) and example and FP16"
  group gluon-examples-bf16 "(full or plain_causal) and example and BF16"
  group gluon-any-mask-fp16 "gluon_forward_any and FP16"
  group gluon-any-mask-bf16 "gluon_forward_any and (BF16 or dispatch)"
elif [ -n "${BACKWARD_ONLY:-}" ]; then  # a change to the backward kernels only
  group gradients-fp16 "example_gradients and FP16"
  group gradients-bf16 "example_gradients and BF16"
  group gradients-fp32 "example_gradients and FP32"
  group random-gradients "random_spec_gradients"
  group gluon-backward "gluon_backward"
else
  part=${PART:-123}
  if [[ $part == *1* ]]; then
    group gluon-backward-fp16 "gluon_backward and FP16"
    group gluon-backward-bf16 "gluon_backward and BF16"
    group gluon-any-mask-fp16 "gluon_forward_any and FP16"
    group gluon-any-mask-bf16 "gluon_forward_any and (BF16 or dispatch)"
    group random-gradients "random_spec_gradients"
    group whole-language "whole_language"
    group others "compile_ahead or first_launch or fewer_stages or hide_every_pair or without_tile_test or fp32_tiles or captured_in_a_cuda_graph"
    group examples-fp32-gradients-c "example_gradients and FP32 and (deepseek or gpt_oss or llama3 or t5)"
  fi
  if [[ $part == *2* ]]; then
    group examples-fp32-gradients-a "example_gradients and FP32 and (bloom or custom or encoder or full or gemma)"
    group examples-fp32 "examples_on_gpu and FP32"
    group random-forward "random_specs_on_gpu or tanh or direct_launches or another_gpu or (gluon_forward and not any_mask)"
    group limits "nesting_limit or row_offsets"
    group document-runs "packed_documents_as_runs"
  fi
  if [[ $part == *3* ]]; then
    group examples-fp16 "example and FP16"
    group examples-bf16 "example and BF16"
    group examples-fp32-gradients-b "example_gradients and FP32 and (llama4 or mistral or plain_causal or prefix)"
  fi
fi
wait
cat "$logs"/*.sum >"$OUT/gpu_summary.txt" 2>/dev/null
echo "cases: $(wc -l <"$OUT/gpu_summary.txt") checks, $(grep -c FAIL "$OUT/gpu_summary.txt") failed"
