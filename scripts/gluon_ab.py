"""The generated forward of full and plain_causal (d128 unless --head-dim) against other builds
of the same modules and cuDNN, in one process.

Each MODULE is a generated module file (e.g. an older build kept aside);
the current build of each spec is always included.  For every N, bf16,
B = 16384 / N, H = 16: the module's Gluon forward, its Triton forward (an explicit launch config), and
cuDNN, as forward TFLOP/s (median of do_bench).  Outputs are checked against
cuDNN's first.

    python3 scripts/gluon_ab.py [--seqlens 1024 2048 4096 16384] [--repeat R] [MODULE.py ...]

--repeat R times every system R times, interleaved, one line per round.

With --any-mask SPEC ..., instead: the Gluon forward for any mask and score
(`lower.GLUON_FORWARD_ANY`, forced on at every length and band width) of
each spec at d128 against the same module's Triton forward, outputs
compared, forward TFLOP/s with the mask's real density.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import sys

import torch
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from flashgen import lower  # noqa: E402
from flashgen.api import load_variant  # noqa: E402
from flashgen.cli import _check_sources, _read  # noqa: E402


def from_file(path: str):
    name = "ab_" + os.path.basename(path).removesuffix(".py") + f"_{abs(hash(path)) % 10**6}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("modules", nargs="*")
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 16384])
    parser.add_argument(
        "--head-dim", type=int, default=128, help="not 128: the Gluon path forced on (a trial)"
    )
    parser.add_argument("--any-mask", nargs="+", metavar="SPEC", default=[])
    parser.add_argument("--repeat", type=int, default=1, help="rounds of every timing")
    args = parser.parse_args()
    if args.any_mask:
        any_mask(args.any_mask, args.seqlens)
        return
    d = args.head_dim
    if d != 128:
        chosen = lower._gluon_forward
        lower._gluon_forward = lambda v: chosen(dataclasses.replace(v, head_dim=128))
    builds = {}
    for spec in ("full", "plain_causal"):
        (variant,), _ = _check_sources(_read([f"examples/{spec}.attn"]))
        builds[(spec, "current")] = load_variant(dataclasses.replace(variant, head_dim=d))
    for path in args.modules:
        module = from_file(path)
        causal = "causal" in os.path.basename(path)
        builds[("plain_causal" if causal else "full", path)] = module
    for n in args.seqlens:
        b, h = max(1, 16384 // n), 16
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for spec, causal in (("full", False), ("plain_causal", True)):
            flops = 4 * b * h * n * n * d * ((n + 1) / (2 * n) if causal else 1.0)
            cudnn_backend = torch.nn.attention.SDPBackend.CUDNN_ATTENTION
            sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
                q, k, v, is_causal=causal
            )
            with torch.nn.attention.sdpa_kernel(cudnn_backend):
                ref = sdpa()
            systems = {
                os.path.basename(label): module
                for (name, label), module in builds.items()
                if name == spec
            }
            current = builds[(spec, "current")]
            config = dict(
                zip(("block_m", "block_n", "num_warps", "num_stages"), current.GPU_CONFIG)
            )
            triton_fwd = lambda: current.forward(q, k, v, **config, tma=current.GPU_TMA)  # noqa
            errors = {}
            for tag, module in systems.items():
                errors[tag] = (module.forward(q, k, v)[0].float() - ref.float()).abs().max().item()
            for _ in range(args.repeat):
                with torch.nn.attention.sdpa_kernel(cudnn_backend):
                    cudnn = triton.testing.do_bench(sdpa, warmup=50, rep=200)
                line = f"{spec:13s} N={n:6d} cuDNN {flops / cudnn / 1e9:6.1f}"
                for tag, module in systems.items():
                    gluon = lambda: module.forward(q, k, v)  # noqa: E731
                    ms = triton.testing.do_bench(gluon, warmup=50, rep=200)
                    line += f" | {tag} gluon {flops / ms / 1e9:6.1f} (err {errors[tag]:.1e})"
                ms = triton.testing.do_bench(triton_fwd, warmup=50, rep=200)
                line += f" | triton {flops / ms / 1e9:6.1f}"
                print(line, flush=True)


def any_mask(paths: list[str], seqlens: list[int]) -> None:
    from flashgen import bench
    from flashgen.verify import torch_dtype

    lower.GLUON_ANY_MIN_KEYS = 0
    for path in paths:
        (variant,), _ = _check_sources(_read([path]))
        variant = dataclasses.replace(variant, head_dim=128)
        module = load_variant(variant)
        if getattr(module, "_gluon_attn_fwd", None) is None:
            print(f"{variant.name}: no Gluon forward")
            continue
        config = dict(zip(("block_m", "block_n", "num_warps", "num_stages"), module.GPU_CONFIG))
        for n in seqlens:
            b, h = max(1, 16384 // n), 16
            q, k, v = (
                torch.randn(b, h, n, 128, device="cuda", dtype=torch_dtype(variant.dtype))
                for _ in range(3)
            )
            flops = 4 * b * h * n * n * 128 * bench.density(variant, n, h, "cuda")
            gluon = lambda: module.forward(q, k, v)  # noqa: E731
            triton_fwd = lambda: module.forward(q, k, v, **config, tma=module.GPU_TMA)  # noqa
            (o_g, lse_g), (o_t, lse_t) = gluon(), triton_fwd()
            finite = torch.isfinite(lse_t)
            diff = (o_g.float() - o_t.float()).abs().max().item()
            lse_ok = torch.equal(finite, torch.isfinite(lse_g))
            t_g = triton.testing.do_bench(gluon, warmup=50, rep=200)
            t_t = triton.testing.do_bench(triton_fwd, warmup=50, rep=200)
            print(
                f"{variant.name:<16} N={n:<6} gluon {flops / t_g / 1e9:6.1f}  triton "
                f"{flops / t_t / 1e9:6.1f}  ratio {t_t / t_g:.3f}  max |o diff| {diff:.1e}"
                f"  same rows without keys: {lse_ok}",
                flush=True,
            )


if __name__ == "__main__":
    main()
