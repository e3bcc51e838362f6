"""The t5_relative_bias example's gradient of `rel` on the GPU, taken apart.

On 2026-12-04 (812eae1) `test_example_gradients_on_gpu[fp16|bf16-t5_relative_bias]`
failed at B1 H2/1 Nq1023 Nk2048: drel's error was 13.1 (fp16) and 13.7 (bf16)
against bounds of 0.37 and 4.9, while dq, dk and dv matched the float64
reference with the same errors as on the interpreter, and the interpreter's
drel was right at that shape (1.1e-3) with the GPU's tiles (64 x 64) or its
own.  The fp32 test (64 x 64 x 4 warps x 2 stages) passed.

For each launch variation (the backward's stages, TMA on or off, direct
launches on or off) and shape, this prints drel's largest error against
float64 autograd through the reference, the ordinary same-dtype
implementation's, and the (head, bucket) elements whose error passes twice
the ordinary one.

    python3 scripts/gpu_t5_gradient.py [fp16|bf16]
"""

import dataclasses
import sys

import torch

sys.path.insert(0, "tests")
from kernel_utils import build, example_variants  # noqa: E402

from flashgen import ir  # noqa: E402
from flashgen.reference import attention_ref  # noqa: E402
from flashgen.verify import Shape, random_inputs, random_runtime_inputs  # noqa: E402

dtype = ir.DType(sys.argv[1] if len(sys.argv) > 1 else "fp16")
variant = next(v for v in example_variants() if v.name == "t5_relative_bias")
variant = dataclasses.replace(variant, dtype=dtype)
module = build(variant)
default_config = module.GPU_BWD_CONFIG
SHAPES = [
    Shape(1, 2, 1, 1023, 2048),  # the failing case
    Shape(1, 2, 2, 1023, 2048),
    Shape(1, 2, 1, 1024, 2048),
    Shape(1, 2, 1, 1023, 1023),
    Shape(1, 4, 2, 2048, 2048),  # the case that passed
]
VARIATIONS = {
    "as built": {},
    "2 stages": {"GPU_BWD_CONFIG": default_config[:3] + (2,)},
    "1 stage": {"GPU_BWD_CONFIG": default_config[:3] + (1,)},
    "no TMA": {"GPU_BWD_TMA": False},
    "through Triton": {"DIRECT_LAUNCH": False},
}


def rel_grad(fn, q, k, v, do, data, dt):
    qq, kk, vv = (x.detach().to(dt).requires_grad_() for x in (q, k, v))
    rel = data["rel"].detach().clone().requires_grad_()
    o = fn(qq, kk, vv, rel)
    (o.to(torch.float64) * do.double()).sum().backward()
    return rel.grad.double().cpu()


for i, shape in enumerate(SHAPES):
    g = torch.Generator().manual_seed(i)
    torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype.value]
    q, k, v = random_inputs(shape, variant.head_dim, torch_dtype, "cuda", generator=g)
    data = random_runtime_inputs(variant, shape, "cuda", generator=g)
    do = torch.randn(q.shape, generator=g).to(q)
    ref = rel_grad(
        lambda a, b, c, r: attention_ref(variant, a, b, c, inputs={"rel": r})[0],
        q, k, v, do, data, torch.float64,
    )  # fmt: skip
    ordinary = rel_grad(
        lambda a, b, c, r: attention_ref(variant, a, b, c, inputs={"rel": r}, dtype=q.dtype)[0],
        q, k, v, do, data, q.dtype,
    )  # fmt: skip
    ordinary_error = (ordinary - ref).abs().max().item()
    print(f"{shape}: ordinary error {ordinary_error:.3e}", flush=True)
    for name, settings in VARIATIONS.items():
        saved = {key: getattr(module, key) for key in settings}
        for key, value in settings.items():
            setattr(module, key, value)
        try:
            kernel = rel_grad(
                lambda a, b, c, r: module.attention(a, b, c, rel=r), q, k, v, do, data, q.dtype
            )
        finally:
            for key, value in saved.items():
                setattr(module, key, value)
        error = (kernel - ref).abs()
        off = (error > 2 * ordinary_error + 1e-3).nonzero().tolist()
        print(
            f"  {name:<15} error {error.max().item():.3e}; elements off (head, bucket): "
            f"{off[:12]}{' ...' if len(off) > 12 else ''}",
            flush=True,
        )
        for h, b in off[:3]:
            print(f"    [{h}, {b}] kernel {kernel[h, b]:.4f} reference {ref[h, b]:.4f}")
