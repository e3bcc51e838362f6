"""Kernels that read runtime inputs on a GPU, against the float64 reference:
packed documents, with a T5 bias table, and a per-example prefix, in bf16 and
fp16 at head dims 64 and 128 (docs/decisions/043).

    python3 scripts/gpu_inputs_smoke.py     # after scripts/gpu_env.sh; exit 1 on a failure
"""

import sys, torch

sys.path.insert(0, ".")
from flashgen.check import check
from flashgen.parse import parse
from flashgen.api import load_variant
from flashgen.verify import (
    Shape,
    check_backward,
    check_forward,
    random_inputs,
    random_runtime_inputs,
)

specs = {
    "packed": "doc: int32[B, Nk]; mask = causal & doc[b, q] == doc[b, k]",
    "t5": "doc: int32[B, Nk]; rel: fp32[H, 32]; mask = causal & doc[b, q] == doc[b, k]; score = s + rel[h, min(q - k, 31)]",
    "prefix": "prefix_len: int64[B]; mask = causal | k < prefix_len[b]",
}
bad = 0
for dtype, tdt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
    for d in (64, 128):
        for name, body in specs.items():
            sp, _ = parse(f"attention {name} {{ head_dim = {d}; dtype = {dtype}; {body} }}")
            (v,), diags = check([sp])
            mod = load_variant(v)
            g = torch.Generator().manual_seed(0)
            for shape in (Shape(2, 4, 2, 1000, 1000), Shape(1, 2, 2, 333, 777)):
                q, k, vv = random_inputs(shape, d, tdt, "cuda", generator=g)
                data = random_runtime_inputs(v, shape, "cuda", generator=g)
                f = check_forward(v, mod, q, k, vv, inputs=data)
                b = check_backward(v, mod, q, k, vv, generator=g, inputs=data)
                ok = f.ok and b.ok
                bad += not ok
                print(
                    name,
                    dtype,
                    d,
                    shape,
                    "ok" if ok else "FAIL",
                    [
                        (c.what, f"{c.error:.2e}/{c.bound:.2e}")
                        for c in f.checks + b.checks
                        if not c.ok
                    ],
                    flush=True,
                )
print("failures:", bad)
sys.exit(1 if bad else 0)
