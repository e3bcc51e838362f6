"""`flashgen build --triton-only` modules on a GPU: every example's module
without its Hopper (Gluon) kernels, forward and backward against the float64
reference at two shapes (one crossing tile edges with Nq != Nk).

    python3 scripts/gpu_triton_only_smoke.py    # after scripts/gpu_env.sh; exit 1 on a failure
"""

import importlib.util
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, ".")
from flashgen.api import _check_specs, build_source  # noqa: E402
from flashgen.verify import (
    Shape,
    check_backward,
    check_forward,
    random_inputs,
    torch_dtype,
)  # noqa: E402

bad = 0
for path in sorted(Path("examples").glob("*.attn")):
    (variant,) = _check_specs([path])
    # Triton reads a kernel's source from its file: the module is written, then imported.
    target = Path(tempfile.mkdtemp()) / f"{variant.name}_triton_only.py"
    target.write_text(build_source(path, triton_only=True))
    loader = importlib.util.spec_from_file_location(target.stem, target)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    g = torch.Generator().manual_seed(0)
    for shape in (Shape(2, 4, 2, 1024, 1024), Shape(1, 2, 1, 333, 777)):
        dtype = torch_dtype(variant.dtype)
        q, k, v = random_inputs(shape, variant.head_dim, dtype, "cuda", generator=g)
        f = check_forward(variant, module, q, k, v)
        b = check_backward(variant, module, q, k, v, generator=g)
        ok = f.ok and b.ok
        bad += not ok
        print(variant.name, shape, "ok" if ok else "FAIL", flush=True)
print("failures:", bad)
sys.exit(1 if bad else 0)
