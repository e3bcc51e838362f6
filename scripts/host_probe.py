"""Where the host time of a generated module's call goes, piece by piece.

On a tiny problem (B = H = 1, N = 128, d128, bf16: the GPU is never the
bottleneck) this times, in microseconds of host time per call (300 calls,
synchronized only before and after):

- torch.empty of one q-sized tensor;
- an autograd Function that launches nothing, forward + backward through
  torch.autograd.grad: the autograd engine and its hand-off to the CUDA
  device thread;
- Triton launches of an empty kernel with 1 argument, 16 integer arguments,
  and 4 TMA descriptors: what the arguments cost;
- the module's forward (Gluon and Triton), backward, and forward + backward
  through autograd (as `flashgen bench` calls it).

BENCHMARKS.md entry 19 measured the last group (0.7-0.8 ms for forward +
backward through autograd against 0.3-0.4 ms for forward() + backward()
called directly); this splits it.

    python3 scripts/host_probe.py [SPEC ...]   (default: examples/full.attn)

Without a GPU (TRITON_INTERPRET=1) it runs on the CPU as a smoke test; those
numbers mean nothing.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from flashgen.api import load_variant  # noqa: E402
from flashgen.cli import _check_sources, _read  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def per_call_us(fn, calls: int = 300 if DEVICE == "cuda" else 3) -> float:
    for _ in range(20 if DEVICE == "cuda" else 1):
        fn()
    _sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - start) / calls * 1e6
    _sync()
    return host


@triton.jit
def _empty_1(a):
    pass


@triton.jit
def _empty_16(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15):
    pass


@triton.jit
def _empty_desc(d0, d1, d2, d3):
    pass


class _NoKernels(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q):
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, do):
        return torch.empty_like(do)


def main() -> None:
    specs = sys.argv[1:] or ["examples/full.attn"]
    shape = (1, 1, 128, 128)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float16  # no bf16 dots on the CPU
    q, k, v, do = (
        torch.randn(shape, device=DEVICE, dtype=dtype, requires_grad=True) for _ in range(4)
    )
    print(f"torch.empty: {per_call_us(lambda: torch.empty(shape, device=DEVICE)):.1f} us")
    autograd = per_call_us(lambda: torch.autograd.grad(_NoKernels.apply(q), q, do))
    print(f"autograd Function without kernels, forward + backward: {autograd:.1f} us")
    ints = list(range(16, 16 * 17, 16))
    print(f"empty Triton kernel, 1 argument: {per_call_us(lambda: _empty_1[(1,)](q)):.1f} us")
    print(f"  16 integer arguments: {per_call_us(lambda: _empty_16[(1,)](*ints)):.1f} us")

    def descriptors():
        return [
            TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 1, 64, 64])
            for x in (q, k, v, do)
        ]

    desc = per_call_us(lambda: _empty_desc[(1,)](*descriptors()))
    print(f"  4 TMA descriptors (made per call): {desc:.1f} us")
    for path in specs:
        (variant,), _ = _check_sources(_read([path]))
        module = load_variant(dataclasses.replace(variant, head_dim=128))
        if module.DTYPE != dtype:
            print(f"{variant.name}: skipped (not {dtype})")
            continue
        config = dict(zip(("block_m", "block_n", "num_warps", "num_stages"), module.GPU_CONFIG))
        o, lse = module.forward(q, k, v)
        times = {
            "forward (default path)": per_call_us(lambda: module.forward(q, k, v)),
            "forward (Triton, explicit config)": per_call_us(
                lambda: module.forward(q, k, v, **config, tma=module.GPU_TMA)
            ),
            "backward": per_call_us(lambda: module.backward(q, k, v, o, lse, do)),
            "attention forward + backward (autograd)": per_call_us(
                lambda: torch.autograd.grad(module.attention(q, k, v), (q, k, v), do)
            ),
        }
        for name, us in times.items():
            print(f"{variant.name}: {name}: {us:.1f} us")


if __name__ == "__main__":
    main()
