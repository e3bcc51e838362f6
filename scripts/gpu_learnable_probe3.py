"""The fault of decision 048 narrowed: the temperature spec at N = 1000 and
1024 with a fresh dlse, printing dlse's alignment and lse's strides.
    CUDA_LAUNCH_BLOCKING=1 python3 scripts/gpu_learnable_probe3.py"""

import sys, torch

sys.path.insert(0, "tests")
import test_learnable as T
from flashgen import verify

variant = T._variant(T.SPECS["temperature"], "bf16")
module = T.build(variant)
g = torch.Generator().manual_seed(7)
for n in (1000, 1024):
    shape = verify.Shape(1, 4, 4, n, n)
    q, k, v = verify.random_inputs(shape, variant.head_dim, torch.bfloat16, "cuda", generator=g)
    data = T._data(variant, shape, g)
    t = data["t"].detach().clone().requires_grad_()
    o, lse = module.attention(q, k, v, t=t, return_lse=True)
    dlse = torch.randn(lse.shape, device="cuda")
    print(n, "dlse ptr % 16", dlse.data_ptr() % 16, "lse stride", lse.stride(), flush=True)
    try:
        torch.autograd.grad((o.float().sum() + (lse * dlse).sum()), [t])
        torch.cuda.synchronize()
        print(n, "ok", flush=True)
    except Exception as e:
        print(n, "fails:", str(e)[:100], flush=True)
        break
