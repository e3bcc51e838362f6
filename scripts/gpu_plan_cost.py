"""What the per-call plan of a data-reading mask costs on a GPU: tile_plan(),
the plans of one forward + backward (`_data_plans`), against the forward and
the forward + backward they serve, for packed documents of about 1000 tokens.

    python3 scripts/gpu_plan_cost.py     # after scripts/gpu_env.sh
"""

import sys

import torch
import triton

sys.path.insert(0, ".")
from flashgen.api import _check_specs, load_variant  # noqa: E402
from flashgen.verify import Shape, random_runtime_inputs  # noqa: E402

SPEC = (
    "attention packed_docs { head_dim = 128; dtype = bf16; doc: int32[B, Nk]; "
    "mask = causal & doc[b, q] == doc[b, k] }"
)
(variant,) = _check_specs([SPEC])
module = load_variant(variant)
for n in (4096, 16384):
    b, h = 16384 // n, 16
    q, k, v, do = (torch.randn(b, h, n, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    for x in (q, k, v):
        x.requires_grad_()
    data = random_runtime_inputs(
        variant, Shape(b, h, h, n, n), "cuda", generator=torch.Generator().manual_seed(n),
        mean_run=1000,
    )  # fmt: skip
    plan_ms = triton.testing.do_bench(lambda: module.tile_plan(q, k, v, **data))
    forward_ms = triton.testing.do_bench(lambda: module.attention(q, k, v, **data))
    both_ms = triton.testing.do_bench(
        lambda: torch.autograd.grad(module.attention(q, k, v, **data), (q, k, v), do)
    )
    print(
        f"N={n} B={b} H={h}: tile_plan {plan_ms * 1000:.1f} us; forward {forward_ms:.3f} ms "
        f"({plan_ms / forward_ms:.1%} of it); forward + backward {both_ms:.3f} ms "
        f"(plans {plan_ms / both_ms:.1%})",
        flush=True,
    )
