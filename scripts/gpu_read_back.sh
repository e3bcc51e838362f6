#!/usr/bin/env bash
# Decision 077's run: derivatives that read the score back from s2
# (element_code.READ_BACK_SCORE, off until measured).  check: the float64
# reference on the GPU with it on (`flashgen verify`, three drawn forms);
# bench: seed 0's d128 drawn specs whose derivative contains the score, on the
# Triton backward, flashgen alone, kernels from CUDA graphs, bf16, B4 H16
# N4096, without then with it, one process each.  Records in
# $OUT/read_back.jsonl.
#   bash scripts/gpu_read_back.sh [check] [bench]
source scripts/gpu_env.sh
NAMES="rand0_5 rand0_8 rand0_17 rand0_18 rand0_19 rand0_22 rand0_23 rand0_26 rand0_27 rand0_29"
for step in ${*:-check bench}; do
  case $step in
  check)
    timeout 300 python3 - "$OUT" <<'PY' 2>&1 | grep -E "^(ok|FAIL|verify)|within"
import sys
from flashgen import element_code
from flashgen.bench import describe_drawn, draw_variants
from flashgen.cli import main

element_code.READ_BACK_SCORE = True
drawn = draw_variants(30, 0, 128)
path = f"{sys.argv[1]}/read_back.attn"
with open(path, "w") as f:
    f.write(describe_drawn([drawn[i] for i in (5, 8, 19)]) + "\n")
main(["verify", "--device", "cuda", "--examples", "3", path])
PY
    ;;
  bench)
    for on in False True; do
      echo "== READ_BACK_SCORE = $on"
      # shellcheck disable=SC2086
      timeout 280 python3 - "$on" "$OUT" $NAMES <<'PY' 2>&1 | grep -A14 "^TFLOP/s"
import sys
from flashgen import element_code
from flashgen.cli import main

element_code.READ_BACK_SCORE = sys.argv[1] == "True"
main(["bench", "--random", "30", "--seed", "0", "--name", *sys.argv[3:], "--head-dim", "128",
      "--seqlens", "4096", "--timer", "cuda-graph", "--jsonl", f"{sys.argv[2]}/read_back.jsonl",
      "--systems", "flashgen"])
PY
    done ;;
  esac
done
