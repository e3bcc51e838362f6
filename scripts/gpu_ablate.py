"""Ablations on a GPU: what one change to a generated module costs or buys.

Each experiment renders a spec's module, applies literal text edits to the
source (a stand-in for a template change not yet made), checks the edited
module against float32 dense attention and times its forward and backward
next to the unedited module, in one process on the same inputs.  An edit
whose text is not found is an error, so a stale experiment cannot time the
unedited module by mistake.

    python3 scripts/gpu_ablate.py [--only NAME...] [--seqlen 4096] [--head-dim 128]

Prints one line per experiment and writes $OUT/ablate.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(__file__))
from gpu_sweep import dense_check  # noqa: E402

from flashgen import api, bench  # noqa: E402
from flashgen.emit import render_module  # noqa: E402
from flashgen.tune import tuning_for  # noqa: E402
from flashgen.verify import torch_dtype  # noqa: E402

# name -> (spec path, [(old, new), ...]).  The empty edit list is the baseline.
EXPERIMENTS: dict[str, tuple[str, list[tuple[str, str]]]] = {}


def experiment(name: str, spec: str, *edits: tuple[str, str]) -> None:
    EXPERIMENTS[name] = (spec, list(edits))


def ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def edited_source(variant, edits) -> str:
    source = render_module(variant, tuning_for(variant))
    for old, new in edits:
        if old not in source:
            raise ValueError(f"edit target not found: {old[:60]!r}")
        source = source.replace(old, new)
    return source


def run(name: str, head_dim: int, n: int, heads: int) -> dict:
    path, edits = EXPERIMENTS[name]
    (variant,) = api.check_sources({path: open(path).read()})[0]
    variant = dataclasses.replace(variant, head_dim=head_dim)
    result = {"experiment": name, "spec": variant.name, "head_dim": head_dim, "n": n}
    try:
        module = api._import(variant.name, edited_source(variant, edits))
    except Exception as e:  # noqa: BLE001
        return dict(result, error=f"{type(e).__name__}: {e}"[:300])
    dtype = torch_dtype(variant.dtype)
    batch = max(1, 16384 // n)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (
        torch.randn(batch, heads, n, head_dim, device="cuda", dtype=dtype, generator=gen)
        for _ in range(4)
    )
    flops = 4 * batch * heads * n * n * head_dim * bench.density(variant, n, heads, "cuda")
    try:
        result["errors"] = dense_check(variant, module, q, k, v, do)
        o, lse = module.forward(q, k, v)
        fwd = ms(lambda: module.forward(q, k, v))
        bwd = ms(lambda: module.backward(q, k, v, o, lse, do))
        result["tflops"] = (flops / fwd / 1e9, 2.5 * flops / bwd / 1e9)
    except Exception as e:  # noqa: BLE001
        result["error"] = f"{type(e).__name__}: {e}"[:300]
    return result


# --------------------------------------------------------------------------- #
# The experiments
# --------------------------------------------------------------------------- #

# Session 3's first run measured edits that are now in the templates (empty
# gradients, no tile test in dense edge loops, tight prefix rows, ALiBi
# without abs); BENCHMARKS.md has those numbers.  The baselines below are
# the current modules.
for spec in ("full", "plain_causal", "llama4_local", "prefix_lm", "bloom_alibi", "gemma2_local"):
    experiment(spec, f"examples/{spec}.attn")

# Softcap: the hardware tanh (one MUFU instruction, about 2^-11 relative
# error) in place of the exp2-based one.
TANH_APPROX = (
    "    t = tl.where(ax < 0.25, small, big)\n    return tl.where(x < 0, -t, t)",
    '    return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x], '
    "dtype=tl.float32, is_pure=True, pack=1)",
)
experiment("gemma2_local tanh.approx", "examples/gemma2_local.attn", TANH_APPROX)
# Softcap: tanh without the small-|x| polynomial.  Near 0, (1 - e) / (1 + e)
# loses relative accuracy but keeps ~1e-7 absolute, which is what a score in
# an exponent needs.
experiment(
    "gemma2_local no-poly",
    "examples/gemma2_local.attn",
    ("    t = tl.where(ax < 0.25, small, big)", "    t = big"),
)

# Forward at d128 against cuDNN: TMA loads, then Triton's Hopper warp
# specialization on the interior loop (it needs descriptor loads).
FORWARD_TMA = ("GPU_TMA = False", "GPU_TMA = True")
FORWARD_WS = (
    "for start_n in range(mid_lo, mid_hi, BLOCK_N):\n        acc, l_i, m_i = _attn_fwd_tile(",
    "for start_n in tl.range(mid_lo, mid_hi, BLOCK_N, warp_specialize=True):\n"
    "        acc, l_i, m_i = _attn_fwd_tile(",
)
for spec in ("full", "plain_causal"):
    experiment(f"{spec} tma", f"examples/{spec}.attn", FORWARD_TMA)
    experiment(f"{spec} tma+ws", f"examples/{spec}.attn", FORWARD_TMA, FORWARD_WS)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="+", default=list(EXPERIMENTS))
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=16)
    args = parser.parse_args()
    results = []
    start = time.time()
    for name in args.only:
        r = run(name, args.head_dim, args.seqlen, args.heads)
        results.append(r)
        tf = r.get("tflops")
        err = " ".join(f"{k}={v:.1e}" for k, v in r.get("errors", {}).items())
        shown = f"{tf[0]:6.1f} / {tf[1]:6.1f}" if tf else r.get("error", "")
        print(f"{time.time() - start:5.0f}s  {name:<24} {shown}  {err}", flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "ablate.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
