"""Time to first result (issue 23, item 6): a cold first call, forward and
backward, with every cache empty, flashgen against FlexAttention.

Each system runs in a fresh process with its own empty Triton, Inductor and
flashgen caches.  After the imports and a first torch.autograd.grad of a
two-element tensor (torch's own one-time cost: that call imports sympy), it
times, from before the module is built (flashgen) or
the BlockMask is made (Flex) to the end of the first backward, synchronized:

- flashgen: `flashgen.load` (parse, check, lower, render, import), the first
  forward (compiling its kernels), the first backward (compiling its own);
- Flex: create_block_mask, then the first call of torch.compile(flex_attention)
  forward and backward.

    python3 scripts/gpu_first_call.py SPEC [SPEC ...] [--head-dim D] [--seqlen N] [--compile-ahead]

Without a GPU there is nothing to time (exits with a message).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
sys.path.insert(0, ".")
import flashgen
from flashgen import flex, ir
from flashgen.api import _check_specs
from pathlib import Path
import dataclasses

path, system, d, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ahead = sys.argv[5] == "1"
(variant,) = _check_specs([Path(path)])
variant = dataclasses.replace(variant, head_dim=d)
g = torch.Generator(device="cuda").manual_seed(0)
dtype = torch.bfloat16 if variant.dtype.value == "bf16" else torch.float16
q, k, v, do = (torch.randn(1, 16, n, d, device="cuda", dtype=dtype, generator=g) for _ in range(4))
leaves = [x.requires_grad_() for x in (q, k, v)]
# What every process pays once, whichever attention it runs, before the
# timer starts: torch.autograd.grad with a given gradient imports sympy
# (torch.fx.experimental.symbolic_shapes, 0.7-2.6 s) on its first call.
x = torch.ones(2, device="cuda", requires_grad=True)
torch.autograd.grad(x * 2, x, torch.ones_like(x))
torch.cuda.synchronize()
times = {"imports": time.perf_counter() - t0}
import triton.runtime.jit as jit

compiles = []
plain_compile = jit.JITFunction._do_compile


def timed_compile(self, *args, **kwargs):
    begin = time.perf_counter()
    kernel = plain_compile(self, *args, **kwargs)
    compiles.append(f"{self.fn.__name__} {time.perf_counter() - begin:.2f}")
    return kernel


jit.JITFunction._do_compile = timed_compile
start = time.perf_counter()
if system == "flashgen":
    from flashgen.api import load_variant

    module = load_variant(variant)
    module.COMPILE_AHEAD = ahead
    times["build"] = time.perf_counter() - start
    launches = times["launches"] = []
    plain_launch = module._launch

    def timed_launch(kernel, *args, **kwargs):
        begin = time.perf_counter()
        plain_launch(kernel, *args, **kwargs)
        launches.append(f"{kernel.fn.__name__} {time.perf_counter() - begin:.2f}")

    module._launch = timed_launch
    for name in ("_layout_forward", "_layout_backward"):
        plain = getattr(module, name)

        def timed(*args, _plain=plain, _name=name, **kwargs):
            begin = time.perf_counter()
            out = _plain(*args, **kwargs)
            launches.append(f"{_name} {begin - start:.2f}..{time.perf_counter() - start:.2f}")
            return out

        setattr(module, name, timed)
    o = module.attention(*leaves)
    torch.cuda.synchronize()
    times["forward"] = time.perf_counter() - start - times["build"]
    grads = torch.autograd.grad(o, leaves, do)
else:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    mods = flex.flex_mods(variant, n, n, 16, device="cuda")
    heads = 16 if ir.mentions(variant.mask, frozenset({"h"})) else None
    mask = create_block_mask(mods.mask_mod, None, heads, n, n, device="cuda") if mods.mask_mod else None
    torch.cuda.synchronize()
    times["build"] = time.perf_counter() - start
    compiled = torch.compile(flex_attention, dynamic=False)
    scale = variant.scale if variant.scale is not None else d ** -0.5
    o = compiled(*leaves, score_mod=mods.score_mod, block_mask=mask, scale=scale)
    torch.cuda.synchronize()
    times["forward"] = time.perf_counter() - start - times["build"]
    grads = torch.autograd.grad(o, leaves, do)
torch.cuda.synchronize()
times["total"] = time.perf_counter() - start
times["backward"] = times["total"] - times["build"] - times["forward"]
times["compiles"] = compiles
print("RESULT " + json.dumps(times))
"""


def first_call(path: str, system: str, d: int, n: int, ahead: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(
            os.environ,
            TRITON_CACHE_DIR=f"{tmp}/triton",
            TORCHINDUCTOR_CACHE_DIR=f"{tmp}/inductor",
            FLASHGEN_CACHE_DIR=f"{tmp}/flashgen",
        )
        out = subprocess.run(
            [sys.executable, "-c", CHILD, path, system, str(d), str(n), str(int(ahead))],
            env=env,
            capture_output=True,
            text=True,
        )
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    return {"error": (out.stderr or out.stdout)[-800:]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("specs", nargs="+")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--seqlen", type=int, default=4096)
    p.add_argument("--systems", nargs="*", default=["flashgen", "flex"])
    p.add_argument(
        "--compile-ahead",
        action="store_true",
        help="also time flashgen with COMPILE_AHEAD (its backward compiled beside the forward)",
    )
    a = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("gpu_first_call.py: no CUDA device")
    runs = [(s, False) for s in a.systems]
    if a.compile_ahead and "flashgen" in a.systems:
        runs.insert(a.systems.index("flashgen") + 1, ("flashgen", True))
    for path in a.specs:
        for system, ahead in runs:
            start = time.perf_counter()
            times = first_call(path, system, a.head_dim, a.seqlen, ahead)
            wall = time.perf_counter() - start
            shown = ", ".join(
                f"{k} {v:.2f} s" if isinstance(v, float) else f"{k} {v}" for k, v in times.items()
            )
            label = system + (" (compile ahead)" if ahead else "")
            print(f"{path} d{a.head_dim} {label}: {shown} (process {wall:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
