"""The fault of decision 048, one variation of the temperature spec's backward
per process (bf16, B=1, H=4, N given, a random dlse):
    CUDA_LAUNCH_BLOCKING=1 python3 scripts/gpu_learnable_probe4.py MODE [N]
MODE: base, nodirect, stages1, stages2, warps8, nodlse_use, dlse_zero, no_row_term."""

import importlib.util, sys, tempfile, torch

sys.path.insert(0, "tests")
import test_learnable as T
from flashgen import verify
from flashgen.emit import render_module

mode = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
variant = T._variant(T.SPECS["temperature"], "bf16")
source = render_module(variant)
patches = {
    "nodlse_use": ("delta = row_term - dlse", "delta = row_term"),
    "no_row_term": (
        "delta = row_term - dlse",
        "delta = tl.load(delta_ptr + row, mask=offs_m < n_queries, other=0.0)",
    ),
}
if mode in patches:
    old, new = patches[mode]
    assert old in source, mode
    source = source.replace(old, new)
path = tempfile.mktemp(suffix=".py")
open(path, "w").write(source)
spec = importlib.util.spec_from_file_location("probe_mod", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
if mode == "nodirect":
    module.DIRECT_LAUNCH = False
configs = {"stages1": 1, "stages2": 2}
if mode in configs:
    module.GPU_BWD_CONFIG = (*module.GPU_BWD_CONFIG[:3], configs[mode])
if mode == "warps8":
    module.GPU_BWD_CONFIG = (*module.GPU_BWD_CONFIG[:2], 8, module.GPU_BWD_CONFIG[3])
g = torch.Generator().manual_seed(7)
shape = verify.Shape(1, 4, 4, n, n)
q, k, v = verify.random_inputs(shape, variant.head_dim, torch.bfloat16, "cuda", generator=g)
data = T._data(variant, shape, g)
t = data["t"].detach().clone().requires_grad_()
o, lse = module.attention(q, k, v, t=t, return_lse=True)
dlse = (
    torch.zeros(lse.shape, device="cuda")
    if mode == "dlse_zero"
    else torch.randn(lse.shape, device="cuda")
)
try:
    (gt,) = torch.autograd.grad((o.float().sum() + (lse * dlse).sum()), [t])
    torch.cuda.synchronize()
    print(mode, n, "ok", gt.tolist(), flush=True)
except Exception as e:
    print(mode, n, "FAILS:", str(e)[:120], flush=True)
