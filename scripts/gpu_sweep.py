"""Launch-config sweep on a GPU: one call checks and times many kernel variants.

For each spec and head dim it builds the module, checks the default config's
output and gradients against a float32 dense computation, then times the
forward and the backward of each candidate config (and checks that each one
computes the same output as the default).  FlexAttention and SDPA cuDNN are
timed on the same inputs for comparison.  The last lines printed are a
summary table; everything also goes to $OUT/sweep.json.

    python3 scripts/gpu_sweep.py [--specs ...] [--head-dims 64 128] [--seqlen 4096]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import torch
import triton

from flashgen import api, bench, ir, reference
from flashgen.lower import LaunchConfig
from flashgen.verify import torch_dtype

# (config, tma): tma=None is the module's automatic choice (TMA on sm90+).
FORWARD = [
    (LaunchConfig(64, 64, 4, 3), None),
    (LaunchConfig(64, 64, 4, 3), False),
    (LaunchConfig(128, 64, 8, 3), None),
    (LaunchConfig(128, 64, 8, 3), False),
    (LaunchConfig(128, 128, 8, 3), None),
    (LaunchConfig(128, 128, 8, 3), False),
    (LaunchConfig(128, 128, 8, 2), None),
]
# (BLOCK_M, BLOCK_N) of the dK/dV kernel; the dQ kernel runs the transpose.
BACKWARD = [
    (LaunchConfig(64, 64, 4, 2), None),
    (LaunchConfig(64, 64, 4, 2), False),
    (LaunchConfig(64, 64, 4, 3), None),
    (LaunchConfig(64, 64, 4, 3), False),
    (LaunchConfig(32, 64, 4, 3), None),
    (LaunchConfig(64, 128, 8, 2), None),
    (LaunchConfig(64, 128, 8, 3), None),
    (LaunchConfig(32, 128, 8, 2), None),
]


def _key(c: LaunchConfig, tma) -> str:
    return str(dataclasses.astuple(c)) + ("" if tma is None else " ptr")


def ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def dense_check(variant, module, q, k, v, do) -> dict[str, float]:
    """Relative errors of o and grads against float32 dense attention (first batch)."""
    q1, k1, v1, do1 = (x[:1].detach() for x in (q, k, v, do))
    xs = [x.float().requires_grad_() for x in (q1, k1, v1)]
    scale = variant.scale if variant.scale is not None else variant.head_dim**-0.5
    ref = reference.attention_ref(variant, *xs, scale=scale, dtype=torch.float32)
    ref_o = ref[0] if isinstance(ref, tuple) else ref
    ref_grads = torch.autograd.grad(ref_o, xs, do1.float())
    ins = [x.detach().requires_grad_() for x in (q1, k1, v1)]
    o = module.attention(*ins)
    grads = torch.autograd.grad(o, ins, do1)
    out = {"o": (o.float() - ref_o).norm().item() / ref_o.norm().item()}
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
        out[name] = (g.float() - r).norm().item() / max(r.norm().item(), 1e-30)
    return out


def run(path: str, head_dim: int, n: int, batch: int, heads: int) -> dict:
    (variant,) = api.check_sources({path: open(path).read()})[0]
    variant = dataclasses.replace(variant, head_dim=head_dim)
    if variant.dtype is ir.DType.FP32:
        variant = dataclasses.replace(variant, dtype=ir.DType.BF16)
    module = api.load_variant(variant)
    dtype = torch_dtype(variant.dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (
        torch.randn(batch, heads, n, head_dim, device="cuda", dtype=dtype, generator=gen)
        for _ in range(4)
    )
    frac = bench.density(variant, n, heads, "cuda")
    flops = 4 * batch * heads * n * n * head_dim * frac
    result = {"spec": variant.name, "head_dim": head_dim, "n": n, "batch": batch}
    result["errors"] = dense_check(variant, module, q, k, v, do)
    o_ref, lse_ref = module.forward(q, k, v)
    result["forward"] = {}
    for c, tma in FORWARD:
        args = dict(c.kwargs(), tma=tma)
        try:
            o, _ = module.forward(q, k, v, **args)
            diff = (o.float() - o_ref.float()).abs().max().item()
            t = ms(lambda: module.forward(q, k, v, **args))
            result["forward"][_key(c, tma)] = (flops / t / 1e9, diff)
        except Exception as e:  # noqa: BLE001
            result["forward"][_key(c, tma)] = (None, str(e)[:80])
    result["backward"] = {}
    for c, tma in BACKWARD:
        args = dict(c.kwargs(), tma=tma)
        try:
            dq, dk, dv = module.backward(q, k, v, o_ref, lse_ref, do, **args)
            t = ms(lambda: module.backward(q, k, v, o_ref, lse_ref, do, **args))
            result["backward"][_key(c, tma)] = (
                2.5 * flops / t / 1e9,
                bool(torch.isfinite(dq).all() and torch.isfinite(dk).all()),
            )
        except Exception as e:  # noqa: BLE001
            result["backward"][_key(c, tma)] = (None, str(e)[:80])
    others = bench.bench(
        [variant],
        seqlens=[n],
        batch=batch,
        heads=heads,
        systems=("flex", "sdpa-cudnn"),
        progress=False,
    )
    result["others"] = {
        m.system: (m.tflops(), m.tflops(backward=True), m.error[:80]) for m in others
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--specs", nargs="+", default=["examples/full.attn", "examples/plain_causal.attn"]
    )
    parser.add_argument("--head-dims", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=16)
    args = parser.parse_args()
    results = []
    start = time.time()
    for path in args.specs:
        for d in args.head_dims:
            batch = max(1, 16384 // args.seqlen) * (2 if d == 64 else 1)
            r = run(path, d, args.seqlen, batch, args.heads)
            results.append(r)
            print(json.dumps(r), flush=True)
    out = os.environ.get("OUT", "/tmp")
    with open(os.path.join(out, "sweep.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(
        f"\n# {time.time() - start:.0f} s; TFLOP/s (fwd best config | bwd best config | flex fwd/bwd | cudnn fwd/bwd)"
    )
    for r in results:
        fwd = max((x for x in r["forward"].items() if x[1][0]), key=lambda x: x[1][0], default=None)
        bwd = max(
            (x for x in r["backward"].items() if x[1][0]), key=lambda x: x[1][0], default=None
        )
        o = r["others"]
        flex, cudnn = o.get("flex", (None, None, "")), o.get("sdpa-cudnn", (None, None, ""))
        f = lambda x: "-" if x is None else f"{x:.0f}"  # noqa: E731
        err = " ".join(f"{k}={v:.1e}" for k, v in r["errors"].items())
        print(
            f"{r['spec']:<16} d{r['head_dim']:<4} fwd {f(fwd[1][0]) if fwd else '-'} {fwd[0] if fwd else ''}"
            f" | bwd {f(bwd[1][0]) if bwd else '-'} {bwd[0] if bwd else ''}"
            f" | flex {f(flex[0])}/{f(flex[1])} | cudnn {f(cudnn[0])}/{f(cudnn[1])} | {err}"
        )


if __name__ == "__main__":
    main()
