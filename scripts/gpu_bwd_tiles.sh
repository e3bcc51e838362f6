#!/usr/bin/env bash
# Decision 097's sweep: the d128 Triton backward's tiles on the specs that take
# it, at their own tiles ("built") and at two that spill nothing offline
# (scripts/gpu_config_sweep.py, bf16, B4 H16 N4096, records in $OUT/bwd_tiles.jsonl):
#   a: the drawn specs of seeds 1 and 2 (held out: the finding came from seed 0),
#      then the earlier sweep's masks (score s) with 32,64,4,2 too;
#   b: the benchmark specs that take the Triton backward, seed 0's draws, and the
#      varlen calls of scripts/gpu_varlen_bench.py at 32,64,4,3 beside as built;
#   c: d64, six draws whose Gluon dK/dV kernel spills 184-1,448 B offline, timed
#      with the Gluon backward and with the Triton one (--plan gluon_backward=off);
#   d: after the rule (heavy derivatives at d128 -> 32,64,4,3): `flashgen verify
#      --device cuda` on eight heavy draws of seed 0 (fp16 and bf16), and six heavy
#      draws of seed 1 at d96 (padded to 128, where the rule applies too) against
#      the old tiles;
#   e: seed 0's heavy draws beside FlexAttention at d128 ($OUT/random.jsonl);
#   f: what part a left open: plain causal's d128 backward at 32,64,4,2 (its first
#      launch lost the context there), each setting in its own process with
#      CUDA_LAUNCH_BLOCKING=1; `flashgen tune --quick --passes backward` of the T5
#      example (the reference check of each pass's winner on a GPU);
#   g: the varlen calls at d64 and d128 with the backward at 32,64,4,3 beside as
#      built ($OUT/varlen.jsonl).  (f and g each fit one call of 600 s.)
# Each part ends with a table: per spec, each config's ms and the built one's over it.
#   bash scripts/gpu_bwd_tiles.sh a|b|c|d|e|f|g
set -uo pipefail
source scripts/gpu_env.sh
C="built 32,64,4,3 32,128,8,2"
S1="rand1_3 rand1_4 rand1_6 rand1_8 rand1_9 rand1_11 rand1_14 rand1_15 rand1_16 rand1_17 rand1_19 rand1_20 rand1_21 rand1_24 rand1_25 rand1_27 rand1_29"
S2="rand2_0 rand2_2 rand2_5 rand2_6 rand2_7 rand2_8 rand2_9 rand2_14 rand2_15 rand2_16 rand2_18 rand2_19 rand2_20 rand2_21 rand2_22 rand2_25 rand2_29"
S0="rand0_2 rand0_3 rand0_5 rand0_8 rand0_12 rand0_13 rand0_14 rand0_15 rand0_17 rand0_18 rand0_19 rand0_20 rand0_22 rand0_23 rand0_25 rand0_26 rand0_27 rand0_28 rand0_29"
sweep() {  # SECONDS ARGS...: one sweep; its per-case lines go to $OUT/bwd_tiles.log
  timeout "$1" python3 scripts/gpu_config_sweep.py "$OUT/bwd_tiles.jsonl" --workers 15 \
    --head-dims 128 --passes backward "${@:2}" >>"$OUT/bwd_tiles.log" 2>&1
  echo "sweep ${*:2}: exit $?"
}
if [ "${1:-a}" = c ]; then
  # d64: drawn specs whose Gluon dK/dV kernel spills 184-1,448 B offline, Gluon against Triton.
  for c in "" gluon_backward=off; do
    timeout 250 python3 -m flashgen bench --random 30 --seed 0 --name rand0_12 rand0_13 rand0_17 rand0_20 \
      rand0_23 rand0_25 --head-dim 64 --seqlens 4096 --systems flashgen --timer cuda-graph ${c:+--plan $c} \
      2>&1 | grep -E "^rand" | sed "s/^/[${c:-built}] /"
  done
  exit 0
elif [ "${1:-a}" = f ]; then
  for plan in gpu_bwd_config=32,64,4,2 "gpu_bwd_config=32,64,4,2 gpu_bwd_tma=off" gpu_bwd_config=32,64,4,3; do
    knobs=()
    for knob in $plan; do knobs+=(--plan "$knob"); done  # --plan takes one knob each
    CUDA_LAUNCH_BLOCKING=1 timeout 80 python3 -m flashgen bench examples/plain_causal.attn --head-dim 128 \
      --seqlens 4096 --systems flashgen "${knobs[@]}" 2>&1 | tail -3 | sed "s/^/[$plan] /"
  done
  cp examples/t5_relative_bias.attn "$OUT/"
  timeout 300 python3 -m flashgen tune "$OUT/t5_relative_bias.attn" --quick --passes backward 2>&1 | tail -6
  exit 0
elif [ "${1:-a}" = g ]; then
  timeout 540 python3 scripts/gpu_varlen_bench.py --tokens 16384 65536 --head-dim 64 128 --timer cuda-graph \
    --plan gpu_bwd_config=32,64,4,3 --jsonl "$OUT/varlen.jsonl" 2>&1 | tail -32
  exit 0
elif [ "${1:-a}" = d ] || [ "${1:-a}" = e ]; then
  heavy=$(python3 - "$OUT/specs" <<'PY'
import pathlib, sys
from flashgen import ir
from flashgen.bench import draw_variants
from flashgen.kernel_choice import heavy_derivative
from flashgen.printer import print_variant
out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
names = [d.variant.name for d in draw_variants(30, 0, 128) if heavy_derivative(d.variant.score)]
for dtype in (ir.DType.FP16, ir.DType.BF16):
    for d in draw_variants(30, 0, 128, dtype):
        if d.variant.name in (names[0:8:2] if dtype is ir.DType.FP16 else names[1:8:2]):
            name = f"{d.variant.name}_{dtype.value}"
            (out / f"{name}.attn").write_text(print_variant(d.variant).replace(d.variant.name, name, 1))
print(" ".join(names))
PY
)
  echo "heavy draws of seed 0 at d128: $heavy"
  if [ "$1" = e ]; then
    # shellcheck disable=SC2086
    timeout 500 python3 -m flashgen bench --random 30 --seed 0 --name $heavy --head-dim 128 --seqlens 4096 \
      --systems flashgen flex --timer cuda-graph --jsonl "$OUT/random.jsonl" 2>&1 | grep -A40 "^flashgen / Flex"
    exit 0
  fi
  for f in "$OUT"/specs/*.attn; do
    timeout 45 python3 -m flashgen verify --device cuda --examples 3 "$f" 2>&1 | tail -3 | sed "s|^|[$(basename "$f")] |"
  done
  sweep 150 --head-dims 96 --backward-configs built 64,128,8,3 64,64,4,2 --random 30 --seed 1 \
    --names rand1_4 rand1_9 rand1_14 rand1_20 rand1_24 rand1_25
elif [ "${1:-a}" = a ]; then
  sweep 200 --backward-configs $C --random 30 --seed 1 --names $S1
  sweep 200 --backward-configs $C --random 30 --seed 2 --names $S2
  sweep 150 --backward-configs built 32,64,4,3 32,64,4,2 32,128,8,2
else
  sweep 100 --backward-configs $C --specs benchmarks/specs/periodic_causal.attn benchmarks/specs/prefix_per_example.attn benchmarks/specs/t5_bias.attn examples/paligemma_prefix.attn
  sweep 200 --backward-configs $C --random 30 --seed 0 --names $S0
  timeout 150 python3 scripts/gpu_varlen_bench.py --tokens 16384 --head-dim 128 --timer cuda-graph \
    --plan gpu_bwd_config=32,64,4,3 --jsonl "$OUT/varlen.jsonl" 2>&1 | tail -12
fi
python3 - "$OUT/bwd_tiles.jsonl" <<'PY'
import json, sys, collections
t = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r = json.loads(line)
    c = r["config"]; key = "built" if c[-1] == "built" else ",".join(map(str, c))
    t[(r["spec"], r["n"])][key] = (r.get("ms"), tuple(c[:4]))
for (spec, n), v in t.items():
    built = v.get("built", (None, None))
    cells = " ".join(f"{k}={ms:.3f}" + (f"({built[0] / ms:.2f}x)" if built[0] and k != "built" else "")
                     for k, (ms, _) in v.items() if isinstance(ms, float))
    print(f"{spec:20s} {n:6d} built={built[1]} {cells}")
PY
