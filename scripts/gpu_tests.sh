#!/usr/bin/env bash
# tests/test_gpu.py in ten parallel processes (examples in fp16, in bf16, fp32
# example outputs, fp32 example gradients in two halves, random forward specs and
# the Gluon forward, the Gluon backward, the any-mask Gluon forward, the persistent
# Gluon forward on its own (a hang there stops only its group), random gradient
# specs), spread over the machine's GPUs, each within SECONDS.  The per-case error table
# goes to $OUT/gpu_summary.txt, each group's log tail to stdout.  On a machine
# whose time is rationed this is the check after every kernel change.  In run
# 10a the fp32 example gradients took 477 s as one group on two H200s (now two
# halves), the Gluon backward 396 s and the any-mask forward 326 s (it has
# gained three N=4096 tests since): give the whole suite 540 s on two GPUs.  GPUS=1 puts every group on GPU 0,
# leaving the others free.
#   [FLASHGEN_GPU_EXAMPLES=16] [BACKWARD_ONLY=1] [GPUS=N] bash scripts/gpu_tests.sh SECONDS
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
seconds=${1:-400}
logs=$(mktemp -d)
gpus=${GPUS:-$(nvidia-smi -L | wc -l)}
started=0
group() {  # in the background, on the machine's GPUs in turn
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
if [ -n "${BACKWARD_ONLY:-}" ]; then  # a change to the backward kernels only
  group gradients-fp16 "example_gradients and FP16"
  group gradients-bf16 "example_gradients and BF16"
  group gradients-fp32 "example_gradients and FP32"
  group random-gradients "random_spec_gradients"
  group gluon-backward "gluon_backward"
else
  group examples-fp32-gradients-a "example_gradients and FP32 and (bloom or custom or encoder or full or gemma)"
  group examples-fp32-gradients-b "example_gradients and FP32 and (llama4 or mistral or plain_causal or prefix)"
  group gluon-backward "gluon_backward"
  group gluon-any-mask "gluon_forward_any"
  group gluon-persistent "gluon_forward_persistent"
  group examples-fp16 "example and FP16"
  group examples-bf16 "example and BF16"
  group examples-fp32 "examples_on_gpu and FP32"
  group random-forward "random_specs_on_gpu or tanh or direct_launches or another_gpu or (gluon_forward and not any_mask and not persistent)"
  group random-gradients "random_spec_gradients"
fi
wait
cat "$logs"/*.sum >"$OUT/gpu_summary.txt" 2>/dev/null
echo "cases: $(wc -l <"$OUT/gpu_summary.txt") checks, $(grep -c FAIL "$OUT/gpu_summary.txt") failed"
