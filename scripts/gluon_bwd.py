"""A module's Gluon backward (templates/gluon_backward.py.j2) against its Triton
backward kernel, in one process: gradients compared, then backward TFLOP/s.

For each spec, head dim and N: bf16 or fp16 as the spec says, B = 16384 / N,
H = 16.  Times `module.backward` (the delta pre-pass plus the kernels) with
the Gluon kernels and with `_gluon_backward_supported` patched to refuse
them, median of do_bench.  FLOPs count 2.5 x the forward's with the mask's
real density, as `flashgen bench` does.  The prototype this replaced (one
file, full and causal only) is at commit 2c1f645.

    python3 scripts/gluon_bwd.py examples/full.attn ... [--head-dim 128 64]
        [--seqlens 1024 4096 16384]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import torch
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from flashgen import api, bench  # noqa: E402
from flashgen.verify import torch_dtype  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("specs", nargs="+")
    parser.add_argument("--head-dim", type=int, nargs="+", default=[128])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096, 16384])
    args = parser.parse_args()
    for path in args.specs:
        for variant in api.check_sources({path: open(path).read()})[0]:
            for d in args.head_dim:
                compare(dataclasses.replace(variant, head_dim=d), args.seqlens)


def compare(variant, seqlens) -> None:
    module = api.load_variant(variant)
    if not hasattr(module, "_gluon_backward"):
        print(f"{variant.name} d{variant.head_dim}: no Gluon backward")
        return
    supported = module._gluon_backward_supported
    dtype = torch_dtype(variant.dtype)
    for n in seqlens:
        b, h, d = 16384 // n, 16, variant.head_dim
        gen = torch.Generator(device="cuda").manual_seed(n)
        q, k, v, do = (
            torch.randn(b, h, n, d, device="cuda", dtype=dtype, generator=gen) for _ in range(4)
        )
        o, lse = module.forward(q, k, v)
        grads = {}
        times = {}
        for name, allowed in (("gluon", supported), ("triton", lambda *a: False)):
            module._gluon_backward_supported = allowed
            run = lambda: module.backward(q, k, v, o, lse, do)  # noqa: E731
            grads[name] = run()
            times[name] = triton.testing.do_bench(run, warmup=25, rep=200, return_mode="median")
        module._gluon_backward_supported = supported
        diff = max(
            (a.float() - b_.float()).abs().max().item()
            for a, b_ in zip(grads["gluon"], grads["triton"])
        )
        density = bench.density(variant, n, h, "cuda")
        flops = 2.5 * 4 * b * h * n * n * d * density
        tflops = {name: flops / t / 1e9 for name, t in times.items()}
        print(
            f"{variant.name:<16} d{d:<4} N={n:<6} gluon {tflops['gluon']:6.1f}  "
            f"triton {tflops['triton']:6.1f}  ratio {times['triton'] / times['gluon']:.3f}  "
            f"max diff {diff:.1e}",
            flush=True,
        )


if __name__ == "__main__":
    main()
