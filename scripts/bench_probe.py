"""Why does a short backward time differently in `flashgen bench` and alone?

For each (spec, head dim, N) given, in this one process, times flashgen and
FlexAttention four ways:

- bench: `flashgen.bench._measure` itself (do_bench of forward, and of
  forward + backward through autograd, minus the forward);
- kernels: the CUDA kernel time per call summed from torch.profiler (what
  the GPU spent, whatever the host did);
- graph: `triton.testing.do_bench_cudagraph` of the same closures (no host
  launch cost);
- host: host time per call of the forward + backward closure, 50 calls
  without synchronizing (if this exceeds the GPU time, do_bench measures
  the host), the median of HOST_ROUNDS such rounds and their range (in run
  12a, one round each, the module's Triton backward path took 0.40 ms at
  d64 and 0.77 ms at d128: the same host work); with PROFILE=1 set, where
  flashgen's host time goes (cProfile).

Systems: flashgen, flashgen with its Triton backward kernel instead of the
Gluon ones (where the module has them), FlexAttention.

    [BASE=DIR] python3 scripts/bench_probe.py examples/encoder_band.attn:128:4096 ...

With BASE set, an older build of each module, DIR/{name}_d{head_dim}.py (e.g.
built from another commit), is one more system.
"""

from __future__ import annotations

import cProfile
import dataclasses
import importlib.util
import os
import pstats
import sys

import torch
import triton.testing
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from flashgen import bench, ir
from flashgen.api import load_variant
from flashgen.cli import _check_sources, _read
from flashgen.flex import flex_mods
from flashgen.verify import torch_dtype
from host_probe import _repeat, per_call_us  # scripts/, beside this file

HOST_ROUNDS = 7


def kernel_ms(fn, calls: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    total_us = sum(e.device_time for e in prof.events() if e.device_type == cuda)
    return total_us / calls / 1e3


def _launching(module, direct: bool, gluon_backward: bool = True):
    """module.attention with repeat launches direct (`_launch`) or not, and
    with the Gluon backward kernels where the module has them, or refused."""
    supported = getattr(module, "_gluon_backward_supported", None)

    def attention(q, k, v):
        module.DIRECT_LAUNCH = direct
        if supported is not None:
            module._gluon_backward_supported = supported if gluon_backward else _refuse
        return module.attention(q, k, v)

    return attention


def _refuse(*args) -> bool:
    return False


def _base_build(base: str | None, name: str, head_dim: int):
    """An older build of the module from BASE (`{base}/{name}_d{head_dim}.py`), if there is one."""
    path = base and os.path.join(base, f"{name}_d{head_dim}.py")
    if not path or not os.path.exists(path):
        return None
    spec = importlib.util.spec_from_file_location(f"base_{name}_d{head_dim}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def probe(path: str, head_dim: int, n: int, base: str | None = None) -> None:
    (variant,), _ = _check_sources(_read([path]))
    variant = dataclasses.replace(variant, head_dim=head_dim)
    module = load_variant(variant)
    base_module = _base_build(base, variant.name, head_dim)
    dtype = torch_dtype(variant.dtype)
    scale = variant.scale if variant.scale is not None else head_dim**-0.5
    heads, b = 16, max(1, 16384 // n)
    gen = torch.Generator(device="cuda").manual_seed(n)
    q, k, v, do = (
        torch.randn((b, heads, n, head_dim), device="cuda", dtype=dtype, generator=gen)
        for _ in range(4)
    )
    frac = bench.density(variant, n, heads, "cuda")
    mods = flex_mods(variant, n, n, heads, device="cuda")
    torch._dynamo.reset()
    flex = torch.compile(flex_attention, dynamic=False)
    mask_heads = heads if ir.mentions(variant.mask, frozenset({"h"})) else None
    block_mask = (
        create_block_mask(mods.mask_mod, None, mask_heads, n, n, device="cuda")
        if mods.mask_mod
        else None
    )
    systems = {
        "flashgen": _launching(module, direct=True),
        "flashgen (Triton backward)": _launching(module, direct=True, gluon_backward=False),
        **({"flashgen (base build)": _launching(base_module, direct=True)} if base_module else {}),
        "flex": lambda a, b_, c: flex(
            a, b_, c, score_mod=mods.score_mod, block_mask=block_mask, scale=scale
        ),
    }
    flops = 4 * b * heads * n * n * head_dim * frac
    print(
        f"== {variant.name} d{head_dim} N={n} B={b} density={frac:.4f} "
        f"{dtype} fwd cfg {module.GPU_CONFIG} bwd cfg {module.GPU_BWD_CONFIG}"
    )
    for name, fn in systems.items():
        m = bench._measure(variant.name, name, fn, q, k, v, do, frac, bench._do_bench, None)
        inputs = [x.detach().requires_grad_() for x in (q, k, v)]
        fwd = lambda: fn(*inputs)  # noqa: E731
        both = lambda: torch.autograd.grad(fn(*inputs), inputs, do)  # noqa: E731
        kf, kb = kernel_ms(fwd), kernel_ms(both)
        try:
            gf = triton.testing.do_bench_cudagraph(fwd, rep=200)
            gb = triton.testing.do_bench_cudagraph(both, rep=200)
        except Exception as exc:  # noqa: BLE001
            print(f"   {name}: cuda graph failed: {type(exc).__name__}: {str(exc)[:120]}")
            gf = gb = float("nan")
        hosts = sorted(per_call_us(both, calls=50) / 1e3 for _ in range(HOST_ROUNDS))
        hb = hosts[len(hosts) // 2]

        def tf(ms, backward=False):
            return flops * (2.5 if backward else 1) / (ms * 1e-3) / 1e12

        if name == "flashgen" and os.environ.get("PROFILE"):
            profile = cProfile.Profile()
            profile.runcall(_repeat, both, 200)
            torch.cuda.synchronize()
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        print(
            f"   {name:26s} bench fwd {m.fwd_ms:.4f} bwd {m.bwd_ms:.4f} ms "
            f"({m.tflops():.0f}/{m.tflops(True):.0f}) | kernels fwd {kf:.4f} bwd {kb - kf:.4f} "
            f"({tf(kf):.0f}/{tf(kb - kf, True):.0f}) | graph fwd {gf:.4f} bwd {gb - gf:.4f} "
            f"({tf(gf):.0f}/{tf(gb - gf, True):.0f}) | host per fwd+bwd call {hb:.4f} ms "
            f"({hosts[0]:.3f}-{hosts[-1]:.3f})"
        )


if __name__ == "__main__":
    base = os.environ.get("BASE")
    for arg in sys.argv[1:]:
        path, d, n = arg.split(":")
        probe(path, int(d), int(n), base)
