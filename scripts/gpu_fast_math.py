"""Fast math in scores on a GPU (issue 23 item 2, docs/decisions/049-fast-math-in-scores.md).

Three stages, everything printed and every result a JSON line in --out:

1. functions: each path the kernels take for a score function, run by a Triton
   kernel over a dense sweep of float32 inputs against float64, asserting the
   bound derived for it: 16-bit modules' `_tanh` (tanh.approx.f32) and `_log`
   (lg2.approx.f32), exp as the modules emit it (exp2 with log2(e) folded),
   `tl.sqrt` and `1 / x` (every module), and float32 modules' accurate `_tanh`
   and `tl.log`.
2. specs: scores that use each function (a tanh + abs(q - k) score spelled
   as a softcap and one that is no softcap, exp, log, sqrt; bf16 at d64 and
   d128, two in fp16), forward and backward against the float64 reference
   by the 2x / 3x rule (flashgen.verify), at an odd shape and at N = 4096
   (where d128 takes the Gluon forward).
3. bench: `python3 -m flashgen bench` of each bf16 spec beside FlexAttention
   (B4 H16 N4096, d64 and d128), and of the tanh and log specs again with
   `--plan fast_math=off` (flashgen alone): the fast paths against the
   accurate ones in the same tree.  Stops starting benches after --budget s.

    python3 scripts/gpu_fast_math.py --out $OUT/fast_math.jsonl    # after scripts/gpu_env.sh

Exit status 1 when a bound or a check fails.  About 6 minutes on an H200
(most of it compiling FlexAttention and the kernels).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("FLASHGEN_CACHE_DIR", tempfile.mkdtemp(prefix="flashgen-fast-math-"))
import flashgen  # noqa: E402
from flashgen.api import _check_specs  # noqa: E402
from flashgen.verify import Shape, check_backward, check_forward, random_inputs  # noqa: E402
from flashgen.verify import torch_dtype  # noqa: E402

# --------------------------------------------------------------------------- #
# 1. Functions
# --------------------------------------------------------------------------- #

LN2 = math.log(2.0)


@triton.jit
def _exp_path(x):
    # What a module emits for exp(x): exp2 with log2(e) folded into x's factor.
    return tl.math.exp2(x * 1.4426950408889634)


@triton.jit
def _sqrt_path(x):
    return tl.sqrt(x)


@triton.jit
def _reciprocal_path(x):
    return 1.0 / x


@triton.jit
def _libdevice_log(x):
    return tl.log(x)


@triton.jit
def _apply(x_ptr, y_ptr, n, FN: tl.constexpr, BLOCK: tl.constexpr):
    """y = FN(x); FN a constexpr so that each function is its own kernel."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, FN(x), mask=offs < n)


def _run(fn, x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    _apply[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), FN=fn, BLOCK=1024)
    return y


def _both_signs(a: torch.Tensor) -> torch.Tensor:
    return torch.cat([a, -a])


def _sweeps() -> dict[str, torch.Tensor]:
    f64 = dict(dtype=torch.float64)
    return {
        "tanh": _both_signs(
            torch.cat(
                [
                    torch.linspace(0, 30, 600001, **f64),
                    torch.logspace(-30, math.log10(30), 200001, **f64),
                ]
            )
        ),
        # Normal float32 inputs (the language's domain), dense around 1 where
        # log's absolute error matters most.
        "log": torch.cat(
            [torch.logspace(-37.9, 38.5, 400001, **f64), torch.linspace(0.5, 2.0, 200001, **f64)]
        ),
        "exp": torch.linspace(-87.0, 88.0, 700001, **f64),
        "sqrt": torch.logspace(-37.9, 38.5, 400001, **f64),
        "reciprocal": _both_signs(torch.logspace(-37.9, 37.9, 400001, **f64)),
    }


def function_checks(records: list[dict]) -> int:
    """Max errors of each path over its sweep against float64; returns the
    number of bounds broken."""
    tanh_score = "softcap(s, 20.0) + log(2.0 + s * s)"  # a module with `_tanh` and `_log`
    fast = flashgen.load(f"attention fm16 {{ head_dim = 64; dtype = bf16; score = {tanh_score} }}")
    accurate = flashgen.load(
        f"attention fm32 {{ head_dim = 64; dtype = fp32; score = {tanh_score} }}"
    )
    sweeps = _sweeps()
    exact_fns = {
        "tanh": torch.tanh,
        "log": torch.log,
        "exp": torch.exp,
        "sqrt": torch.sqrt,
        "reciprocal": torch.reciprocal,
    }
    # (name, function, sweep, error measure, bound, why)
    paths = [
        ("16-bit _tanh (tanh.approx.f32)", fast._tanh, "tanh", "relative", 2.0**-10.5,
         "below fp16's unit roundoff 2^-11 times 2^0.5: one rounding of a 16-bit score"),
        ("16-bit _log (lg2.approx.f32 * ln 2)", fast._log, "log", "absolute/max(1,|ln x|)",
         2.0**-21, "2^-22 absolute in log2 (PTX ISA), times ln 2, plus the product's rounding"),
        ("exp (exp2 with log2(e) folded)", _exp_path, "exp", "relative/(1+|x|)", 2.0**-21,
         "ex2.approx's 2^-22 plus the rounding of x log2(e), |x| 2^-24"),
        ("tl.sqrt (sqrt.approx.f32)", _sqrt_path, "sqrt", "relative", 2.0**-21, "a few ulps"),
        ("1 / x (div.full.f32)", _reciprocal_path, "reciprocal", "relative", 2.0**-21,
         "2 ulps"),
        ("float32 _tanh (exp2 and polynomial)", accurate._tanh, "tanh", "relative", 2.0**-20,
         "8 ulps, as tests/test_gpu.py asks"),
        ("float32 tl.log (libdevice logf)", _libdevice_log, "log", "absolute/max(1,|ln x|)",
         2.0**-22, "a few ulps"),
    ]  # fmt: skip
    broken = 0
    print("\n== 1. score functions: max error over a dense sweep against float64 ==")
    print(f"{'path':40} {'measure':24} {'max error':>11} {'bound':>11}  ok")
    for name, fn, sweep, measure, bound, why in paths:
        x64 = sweeps[sweep]
        x = x64.float().cuda()
        y = _run(fn, x).double().cpu()
        xr = x.double().cpu()  # the float32 inputs the kernel saw
        exact = exact_fns[sweep](xr)
        error = (y - exact).abs()
        finite = torch.isfinite(exact)
        if measure == "relative":
            value = error[finite & (exact != 0)] / exact[finite & (exact != 0)].abs()
        elif measure == "relative/(1+|x|)":
            value = error[finite] / exact[finite].abs() / (1.0 + xr[finite].abs())
        else:  # absolute / max(1, |ln x|)
            value = error[finite] / exact[finite].abs().clamp(min=1.0)
        worst = value.max().item()
        nan = bool(torch.isnan(y[finite]).any())
        ok = worst <= bound and not nan
        broken += not ok
        print(f"{name:40} {measure:24} {worst:11.3e} {bound:11.3e}  {'ok' if ok else 'FAIL'}")
        records.append(
            dict(stage="function", path=name, measure=measure, max_error=worst, bound=bound,
                 why=why, inputs=x.numel(), nan=nan, ok=ok)
        )  # fmt: skip
    return broken


# --------------------------------------------------------------------------- #
# 2. Specs against the reference
# --------------------------------------------------------------------------- #

SPECS = {
    # The case of issue 23: tanh and abs(q - k), the softcap written out ...
    "tanh_softcap_spelled": "30.0 * tanh(s / 30.0) - 0.1 * abs(q - k)",
    # ... and a tanh that is no softcap (10 * 0.25 != 1).
    "tanh_general": "10.0 * tanh(s * 0.25) - 0.01 * abs(q - k)",
    "exp_score": "s + 2.0 * exp(-abs(s))",
    "log_score": "s - log(1.0 + abs(q - k)) + 0.5 * log(1.0 + s * s)",
    "sqrt_score": "s - 0.1 * sqrt(abs(q - k)) + 0.5 * sqrt(1.0 + s * s)",
}
FP16_SPECS = ("tanh_general", "log_score")  # tanh.approx and lg2.approx against fp16's rule


def _spec_text(name: str, score: str, head_dim: int, dtype: str) -> str:
    return (
        f"attention {name} {{ head_dim = {head_dim}; dtype = {dtype}; mask = causal; "
        f"score = {score} }}"
    )


def spec_checks(records: list[dict], names: list[str]) -> int:
    broken = 0
    print("\n== 2. specs: forward and backward against the float64 reference (2x / 3x rule) ==")
    cases = [(n, d, "bf16") for n in names for d in (64, 128)]
    cases += [(n, 128, "fp16") for n in FP16_SPECS if n in names]
    shapes = (Shape(1, 2, 1, 333, 777), Shape(1, 2, 2, 4096, 4096))
    for name, head_dim, dtype in cases:
        text = _spec_text(f"{name}_{dtype}_d{head_dim}", SPECS[name], head_dim, dtype)
        (variant,) = _check_specs(text)
        module = flashgen.load(text)
        g = torch.Generator().manual_seed(0)
        for shape in shapes:
            q, k, v = random_inputs(
                shape, head_dim, torch_dtype(variant.dtype), "cuda", generator=g
            )
            results = (
                check_forward(variant, module, q, k, v),
                check_backward(variant, module, q, k, v, generator=g),
            )
            checks = [c for r in results for c in r.checks]
            ok = all(r.ok for r in results)
            broken += not ok
            worst = max(checks, key=lambda c: c.error / c.bound if c.bound else math.inf)
            print(
                f"{variant.name:34} {str(shape):32} {'ok' if ok else 'FAIL':4}  worst "
                f"{worst.what} {worst.error:.2e} of bound {worst.bound:.2e}",
                flush=True,
            )
            records.append(
                dict(stage="check", spec=variant.name, text=text, shape=str(shape), ok=ok,
                     checks=[dict(what=c.what, error=c.error, ordinary=c.ordinary_error,
                                  bound=c.bound, finite=c.finite) for c in checks])
            )  # fmt: skip
    return broken


# --------------------------------------------------------------------------- #
# 3. Bench beside FlexAttention, and fast math off
# --------------------------------------------------------------------------- #


def _bench(spec_file: str, systems: list[str], plan: list[str]) -> list[dict]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [sys.executable, "-m", "flashgen", "bench", spec_file, "--head-dim", "64", "128",
           "--seqlens", "4096", "--batch", "4", "--heads", "16", "--systems", *systems,
           "--json", out]  # fmt: skip
    for p in plan:
        cmd += ["--plan", p]
    print("$", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(done.stdout[-3000:], flush=True)
    if done.returncode != 0 or not os.path.getsize(out):
        return []
    with open(out, encoding="utf-8") as f:
        return json.load(f)


def benches(records: list[dict], names: list[str], budget: float, start: float) -> None:
    print("\n== 3. bench: B4 H16 N4096 bf16, TFLOP/s forward / backward ==")
    rows: dict[tuple[str, int], dict[str, tuple]] = {}
    runs = [(n, ["flashgen", "flex"], [], "fast") for n in names]
    runs += [
        (n, ["flashgen"], ["fast_math=off"], "accurate")
        for n in ("tanh_softcap_spelled", "tanh_general", "log_score")
        if n in names
    ]
    for name, systems, plan, label in runs:
        if time.time() - start > budget:
            print(f"out of time (--budget {budget:.0f} s): not benched: {name} {label}")
            records.append(dict(stage="bench", spec=name, label=label, skipped="budget"))
            continue
        spec_file = os.path.join(tempfile.mkdtemp(), f"{name}.attn")
        with open(spec_file, "w", encoding="utf-8") as f:
            f.write(_spec_text(name, SPECS[name], 128, "bf16") + "\n")
        for m in _bench(spec_file, systems, plan):
            key = "flex" if m["system"] == "flex" else label
            rows.setdefault((name, m["head_dim"]), {})[key] = (m["fwd_tflops"], m["bwd_tflops"])
            records.append(dict(stage="bench", spec=name, label=label, score=SPECS[name], **m))
    print(
        f"\n{'spec':22} {'d':>4} {'flashgen':>13} {'Flex':>13} {'vs Flex':>13} "
        f"{'fast_math=off':>13} {'fast / off':>13}"
    )

    def pair(x):
        return "-" if not x or None in x else f"{x[0]:5.0f} / {x[1]:<5.0f}"

    def ratio(a, b):
        if not a or not b or None in a or None in b:
            return "-"
        return f"{a[0] / b[0]:5.2f} / {a[1] / b[1]:<5.2f}"

    for (name, d), r in sorted(rows.items()):
        fast, flex, off = r.get("fast"), r.get("flex"), r.get("accurate")
        print(
            f"{name:22} {d:>4} {pair(fast):>13} {pair(flex):>13} {ratio(fast, flex):>13} "
            f"{pair(off):>13} {ratio(fast, off):>13}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON lines, one record per result")
    parser.add_argument("--specs", nargs="+", choices=sorted(SPECS), default=list(SPECS))
    parser.add_argument("--skip", nargs="*", default=[], choices=["functions", "specs", "bench"])
    parser.add_argument(
        "--budget", type=float, default=300.0, help="start no bench after this many seconds"
    )
    args = parser.parse_args()
    start = time.time()
    records: list[dict] = []
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"commit {commit or '?'}")  # fmt: skip
    broken = 0
    if "functions" not in args.skip:
        broken += function_checks(records)
        print(f"[{time.time() - start:.0f} s]")
    if "specs" not in args.skip:
        broken += spec_checks(records, args.specs)
        print(f"[{time.time() - start:.0f} s]")
    if "bench" not in args.skip:
        benches(records, args.specs, args.budget, start)
        print(f"[{time.time() - start:.0f} s]")
    meta = dict(commit=commit, gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__, date=time.strftime("%Y-%m-%d"))  # fmt: skip
    with open(args.out, "a", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps({**meta, **r}) + "\n")
    print(f"\n{len(records)} records -> {args.out}; {broken} failed bound(s) or check(s)")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
