"""A learnable case on the GPU, taken apart: each head's gradient from the
kernels, from float64 autograd through the reference, from the ordinary
same-dtype reference, and the float64 emulation of FlashAttention's backward
(P exact, delta from o rounded to the dtype), for the spec and shape given.
    python3 scripts/gpu_learnable_probe.py SPEC_NAME DTYPE B H HKV NQ NK [SEED]"""

import sys

import torch

sys.path.insert(0, "tests")
import test_learnable as T  # noqa: E402

from flashgen import verify  # noqa: E402
from flashgen.reference import attention_ref  # noqa: E402

name, dtype = sys.argv[1], sys.argv[2]
b, h, hkv, nq, nk = map(int, sys.argv[3:8])
seed = int(sys.argv[8]) if len(sys.argv) > 8 else 7
variant = T._variant(T.SPECS[name], dtype, 64)
module = T.build(variant)
if "FLASHGEN_PROBE_NO_TMA" in __import__("os").environ:  # the plain-pointer loads
    module.GPU_TMA = module.GPU_BWD_TMA = False
g = torch.Generator().manual_seed(seed)
shape = verify.Shape(b, h, hkv, nq, nk)
q, k, v = verify.random_inputs(shape, 64, verify.torch_dtype(variant.dtype), "cuda", generator=g)
data = T._data(variant, shape, g)
learnable = [i.name for i in variant.inputs if i.learnable]
do = torch.randn(q.shape, generator=g).to(q)


def grads(fn, dt):
    qq, kk, vv = (x.detach().to(dt).requires_grad_() for x in (q, k, v))
    leaves = {n: data[n].detach().clone().requires_grad_() for n in learnable}
    o = fn(qq, kk, vv, {**data, **leaves})
    (o.to(torch.float64) * do.double()).sum().backward()
    return [leaves[n].grad.double().cpu() for n in learnable], o.detach()


kernel, o_kernel = grads(lambda a, b_, c, d: module.attention(a, b_, c, **d), q.dtype)
ref, o64 = grads(lambda a, b_, c, d: attention_ref(variant, a, b_, c, inputs=d)[0], torch.float64)
ordinary, _ = grads(
    lambda a, b_, c, d: attention_ref(variant, a, b_, c, inputs=d, dtype=q.dtype)[0], q.dtype
)
print("o: kernel error", (o_kernel.double() - o64).abs().max().item())
for n, kg, rg, og in zip(learnable, kernel, ref, ordinary):
    print(n, "ref", rg.flatten()[:8].tolist())
    print(n, "kernel error", (kg - rg).abs().max().item(), "ordinary error", (og - rg).abs().max().item())
    print(n, "kernel", kg.flatten()[:8].tolist())
