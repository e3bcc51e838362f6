"""test_learnable's shapes for one spec (bf16), one check_backward at a time,
without and with a dlse, printing each before it runs: where a CUDA fault
happens (decision 048).  With CUDA_LAUNCH_BLOCKING=1:
    python3 scripts/gpu_learnable_probe2.py SPEC_NAME"""

import sys, torch

sys.path.insert(0, "tests")
import test_learnable as T
from flashgen import verify

name = sys.argv[1]
variant = T._variant(T.SPECS[name], "bf16")
module = T.build(variant)
g = torch.Generator().manual_seed(7)
for shape in T.SHAPES:
    shape = verify.Shape(*shape)
    print("shape", shape, flush=True)
    q, k, v = verify.random_inputs(shape, variant.head_dim, torch.bfloat16, "cuda", generator=g)
    data = T._data(variant, shape, g)
    for with_lse in (False, True):
        r = verify.check_backward(
            variant, module, q, k, v, generator=g, inputs=data, with_lse=with_lse
        )
        torch.cuda.synchronize()
        print(
            " with_lse",
            with_lse,
            "ok",
            r.ok,
            [(c.what, "%.3g/%.3g" % (c.error, c.bound)) for c in r.checks if not c.ok],
            flush=True,
        )
