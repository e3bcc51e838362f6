#!/usr/bin/env bash
# Decision 080's run: the Gluon backward's P through one call of `_attn_probs`
# (knob gluon_one_probs_call: "flag", the mask skipped at run time on whole
# tiles; "masked", every tile masked) against the two inlined calls of today.
# check: the float64 reference on the GPU, both settings, Gluon launches counted,
# for light masks at d128 and d64, a heavy derivative and packed documents at
# d128 (those two forced onto the Gluon backward, as the bench below forces them).
# bench: flashgen alone, kernels from CUDA graphs, bf16, B4 H16 (and B1 H16 for
# documents), one process per setting: the d128 examples on the Gluon backward
# at N = 4096 and 16384; rand0_19, 8 and 29 (heavy, d128) with the Gluon backward
# forced on beside the Triton backward they take today; packed documents at d128
# likewise.  Records in $OUT/probs_call.jsonl.  SETTINGS (default "off flag
# masked") and EXAMPLES (default four d128 examples) narrow a run to the time left.
#   [SETTINGS="off masked"] [EXAMPLES="examples/plain_causal.attn ..."] \
#     bash scripts/gpu_probs_call.sh [check] [bench]
source scripts/gpu_env.sh
settings=${SETTINGS:-off flag masked}
examples=${EXAMPLES:-examples/plain_causal.attn examples/mistral_sliding.attn examples/bloom_alibi.attn examples/llama4_local.attn}
for step in ${*:-check bench}; do
  case $step in
  check)
    # shellcheck disable=SC2086
    timeout 400 python3 - $settings <<'PY' 2>&1 | grep -E "^(ok|FAIL)"
import dataclasses, sys, threading
import torch
sys.path.insert(0, "tests")
from flashgen import ir, kernel_choice
from flashgen.bench import draw_variants
from flashgen.emit import render_module
from flashgen.experiments import parse_settings
from flashgen.verify import Shape, check_backward, random_inputs, random_runtime_inputs
from kernel_utils import make_variant
import importlib.util

kernel_choice.GLUON_HEAVY_MAX_HEAD_DIM = 128
kernel_choice.GLUON_DATA_MAX_HEAD_DIM = 128
cases = [make_variant(m, s, dtype=ir.DType.BF16, head_dim=d) for m, s, d in (
    ("causal", None, 128), ("window(300, 0)", "s + alibi", 128), ("causal & chunk(256)", None, 64),
    ("full", "softcap(s, 20.0)", 128))]
cases.append(draw_variants(30, 0, 128)[19].variant)
cases.append(make_variant("causal & doc[b, q] == doc[b, k]", dtype=ir.DType.BF16, head_dim=128,
                          declared="doc: int32[B, Nk]"))
for n, variant in enumerate(cases):
    for setting in sys.argv[1:]:
        source = render_module(variant, None, parse_settings([f"gluon_one_probs_call={setting}"]))
        path = f"/tmp/probs_{n}_{setting}.py"
        open(path, "w").write(source)
        spec_ = importlib.util.spec_from_file_location(f"probs_{n}_{setting}", path)
        module = importlib.util.module_from_spec(spec_)
        sys.modules[spec_.name] = module
        spec_.loader.exec_module(module)
        calls = []
        gluon = module._gluon_backward
        # the backward compiled ahead ("flashgen-compile") is not a call of the test's
        module._gluon_backward = lambda *a: (threading.current_thread().name != "flashgen-compile"
                                             and calls.append(1)) or gluon(*a)
        ok = True
        for i, shape in enumerate([Shape(2, 4, 2, 384, 384), Shape(1, 2, 1, 1024, 1024)]):
            g = torch.Generator().manual_seed(i)
            q, k, v = random_inputs(shape, variant.head_dim, torch.bfloat16, "cuda", generator=g)
            data = random_runtime_inputs(variant, shape, "cuda", generator=g, mean_run=150.0) if variant.inputs else None
            result = check_backward(variant, module, q, k, v, generator=g, inputs=data)
            ok &= result.ok
            if not result.ok:
                print("FAIL detail", variant.name, setting, [(c.what, c.error, c.bound) for c in result.checks])
        print(f"{'ok' if ok and len(calls) == 2 else 'FAIL'} case {n} {variant.name} d{variant.head_dim} {setting}: gluon launches {len(calls)}")
PY
    ;;
  bench)
    common=(--timer cuda-graph --jsonl "$OUT/probs_call.jsonl" --systems flashgen)
    for setting in $settings; do
      echo "== gluon_one_probs_call=$setting"
      # shellcheck disable=SC2086
      timeout 150 python3 -m flashgen bench $examples --seqlens 4096 16384 "${common[@]}" \
        --plan gluon_one_probs_call=$setting 2>&1 | grep -A10 "^TFLOP/s"
      timeout 150 python3 - "$setting" "$OUT" <<'PY' 2>&1 | grep -A8 "^TFLOP/s"
import sys
from flashgen import kernel_choice
from flashgen.cli import main
kernel_choice.GLUON_HEAVY_MAX_HEAD_DIM = 128
kernel_choice.GLUON_DATA_MAX_HEAD_DIM = 128
plan = ["--plan", f"gluon_one_probs_call={sys.argv[1]}", "--timer", "cuda-graph", "--systems", "flashgen",
        "--jsonl", f"{sys.argv[2]}/probs_call.jsonl"]
main(["bench", "--random", "30", "--seed", "0", "--name", "rand0_19", "rand0_8", "rand0_29",
      "--head-dim", "128", "--seqlens", "4096", *plan])
main(["bench", "benchmarks/specs/packed_docs.attn", "--seqlens", "16384", *plan])
PY
    done
    echo "== the Triton backward (today's choice for the heavy and data specs)"
    timeout 120 python3 -m flashgen bench --random 30 --seed 0 --name rand0_19 rand0_8 rand0_29 \
      --head-dim 128 --seqlens 4096 "${common[@]}" 2>&1 | grep -A6 "^TFLOP/s"
    timeout 60 python3 -m flashgen bench benchmarks/specs/packed_docs.attn --seqlens 16384 \
      "${common[@]}" 2>&1 | grep -A4 "^TFLOP/s" ;;
  esac
done
