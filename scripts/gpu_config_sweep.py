"""Forward and backward time of the Triton kernels at each candidate launch
configuration, on masks whose query rows see few keys (documents, chunks,
bands) and many (causal, full): the data behind the configurations that
`flashgen.launch` derives from a mask's tiles.

    python3 scripts/gpu_config_sweep.py OUT.jsonl [--workers 12] [--masks NAME ...]
        [--plan NAME=VALUE ...] [--head-dims D ...] [--v-head-dim DV] [--wide] [--fp32]

--v-head-dim gives the specs v's own head dim (MLA: --head-dims 192
--v-head-dim 128); --wide sweeps the candidates for heads wider than 128
(WIDE_FORWARD, WIDE_BACKWARD) instead; --fp32 float32 specs and inputs with
the candidates of CUDA-core products (FP32_FORWARD, FP32_BACKWARD; decision
082: --fp32 --head-dims 192 256 --masks causal band_129).

Each worker process first compiles its share of the (spec, head dim, config)
cases into Triton's cache, in parallel; then one process times every case
(`triton.testing.do_bench`, median), B·N = 16384 tokens, 16 heads, bf16
(or fp32), the Gluon kernels off.  One JSON line per case: spec, d, n, pass, config, ms.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys

sys.path.insert(0, ".")
from flashgen.experiments import parse_settings  # noqa: E402

# (name, mask, N): B = 16384 // N.
MASKS = (
    ("packed_docs", "causal & doc[b, q] == doc[b, k]", 16384),
    ("chunked_causal", "causal & chunk(1024)", 16384),
    ("window_1024", "causal & q - k < 1024", 16384),
    ("band_129", "abs(q - k) < 65", 4096),
    ("causal", "causal", 4096),
    ("causal_16k", "causal", 16384),
    ("full", "full", 4096),
)
HEAD_DIMS = (64, 128)
FORWARD = (
    (64, 64, 4, 3),
    (64, 64, 4, 2),
    (64, 128, 4, 3),
    (128, 64, 4, 3),
    (128, 64, 8, 3),
    (128, 64, 8, 2),
    (128, 128, 8, 3),
    (128, 128, 8, 2),
)
BACKWARD = (
    (64, 128, 8, 3),
    (64, 64, 4, 3),
    (64, 64, 4, 2),
    (64, 64, 8, 3),
    (32, 64, 4, 1),
    (32, 128, 8, 3),
    (128, 64, 8, 2),
    (128, 128, 8, 2),
)
# Heads wider than 128 (MLA's 192 / 128 pads q and k to 256).
WIDE_FORWARD = (
    (64, 32, 8, 2),
    (64, 32, 4, 2),
    (64, 64, 4, 2),
    (64, 64, 8, 2),
    (128, 32, 8, 2),
    (128, 64, 8, 2),
    (64, 32, 4, 3),
    (64, 64, 8, 3),
    (128, 64, 8, 1),
    (64, 64, 4, 3),  # FlexAttention's default for d192 on sm90 (inductor's heuristics)
)
WIDE_BACKWARD = (
    (32, 32, 8, 2),
    (32, 32, 4, 2),
    (32, 64, 4, 2),
    (32, 64, 8, 2),
    (64, 32, 4, 2),
    (64, 32, 8, 2),
    (64, 64, 8, 2),
    (64, 64, 8, 1),
    (32, 32, 4, 3),
    (64, 128, 8, 1),
    (64, 64, 4, 2),  # FlexAttention's default for d > 128 on sm90
    (64, 64, 4, 3),
)
# float32 (no tensor-core products): register-bound, so small tiles.  The
# first is `gpu_config`'s above d128 since decision 082, the second its choice
# up to d128, the third its earlier choice above d128.
FP32_FORWARD = ((16, 16, 4, 2), (32, 16, 4, 2), (64, 16, 4, 2), (32, 16, 4, 1), (32, 32, 4, 2))
# Backward: `gpu_bwd_config`'s at d64 and at d128 since decision 082, its
# earlier ones there, its choice above d128.
FP32_BACKWARD = ((32, 32, 8, 2), (16, 16, 4, 2), (64, 64, 4, 2), (32, 32, 4, 2), (16, 16, 8, 1))
DOC_MEAN = 1000
V_HEAD_DIM: dict = {"value": None}
DTYPE: dict = {"value": "bf16"}


def spec_text(name: str, mask: str, d: int) -> str:
    inputs = "doc: int32[B, Nk]; " if "doc[" in mask else ""
    dv = V_HEAD_DIM["value"]
    v_dim = f"v_head_dim = {dv}; " if dv else ""
    dtype = DTYPE["value"]
    return f"attention {name} {{ head_dim = {d}; {v_dim}dtype = {dtype}; {inputs}mask = {mask} }}"


def cases(names=None, head_dims=HEAD_DIMS, wide=False, fp32=False):
    forward, backward = (WIDE_FORWARD, WIDE_BACKWARD) if wide else (FORWARD, BACKWARD)
    if fp32:
        forward, backward = FP32_FORWARD, FP32_BACKWARD
    for name, mask, n in MASKS:
        if names and name not in names:
            continue
        for d in head_dims:
            for c in forward:
                yield (name, mask, n, d, "forward", c)
            for c in backward:
                yield (name, mask, n, d, "backward", c)


_MODULES: dict = {}
KNOBS: dict = {"gluon_forward": None, "gluon_backward": False}
_INPUTS: dict = {}


def setup(name, mask, n, d):
    import torch

    from flashgen.api import _check_specs, load_variant
    from flashgen.verify import Shape, random_runtime_inputs

    key = (name, d)
    if key not in _MODULES:
        (variant,) = _check_specs([spec_text(name, mask, d)])
        _MODULES[key] = (
            variant,
            load_variant(variant, KNOBS),
        )
    variant, module = _MODULES[key]
    ikey = (name, n, d)
    if ikey not in _INPUTS:
        b, h = 16384 // n, 16
        gen = torch.Generator(device="cuda").manual_seed(n)
        dtype = torch.float32 if DTYPE["value"] == "fp32" else torch.bfloat16
        q, k, v, do = (
            torch.randn(b, h, n, width, device="cuda", dtype=dtype, generator=gen)
            for width in (d, d, variant.v_dim, variant.v_dim)
        )
        data = random_runtime_inputs(
            variant, Shape(b, h, h, n, n), "cuda",
            generator=torch.Generator().manual_seed(n), mean_run=DOC_MEAN,
        )  # fmt: skip
        o, lse = module.forward(q, k, v, **data)
        _INPUTS[ikey] = (q, k, v, do, o, lse, data)
    return module, _INPUTS[ikey]


def run_case(case, timed: bool):
    import torch
    import triton.testing

    name, mask, n, d, which, c = case
    module, (q, k, v, do, o, lse, data) = setup(name, mask, n, d)
    kw = dict(block_m=c[0], block_n=c[1], num_warps=c[2], num_stages=c[3])
    if which == "forward":
        fn = lambda: module.forward(q, k, v, **kw, **data)  # noqa: E731
    else:
        fn = lambda: module.backward(q, k, v, o, lse, do, **kw, **data)  # noqa: E731
    try:
        fn()
        torch.cuda.synchronize()
        if not timed:
            return None
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    except Exception as e:  # does not fit: out of shared memory, say
        return f"{type(e).__name__}: {str(e)[:120]}"


def _init(knobs: dict, v_head_dim, dtype: str) -> None:
    KNOBS.update(knobs)
    V_HEAD_DIM["value"] = v_head_dim
    DTYPE["value"] = dtype


def warm(share):
    for case in share:
        run_case(case, timed=False)
    return len(share)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--workers", type=int, default=12)
    parser.add_argument("--masks", nargs="*", help="only these (default: all)")
    parser.add_argument("--plan", nargs="*", default=[], help="plan knobs NAME=VALUE")
    parser.add_argument("--head-dims", type=int, nargs="*", default=list(HEAD_DIMS))
    parser.add_argument("--v-head-dim", type=int, default=None)
    parser.add_argument("--wide", action="store_true", help="WIDE_FORWARD and WIDE_BACKWARD")
    parser.add_argument("--fp32", action="store_true", help="FP32_FORWARD and FP32_BACKWARD")
    args = parser.parse_args()
    KNOBS.update(parse_settings(args.plan))
    V_HEAD_DIM["value"] = args.v_head_dim
    DTYPE["value"] = "fp32" if args.fp32 else "bf16"
    all_cases = list(cases(args.masks, args.head_dims, args.wide, args.fp32))
    shares = [all_cases[i :: args.workers] for i in range(args.workers)]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(
        args.workers, initializer=_init, initargs=(dict(KNOBS), args.v_head_dim, DTYPE["value"])
    ) as pool:
        print("compiled", sum(pool.map(warm, shares)), "cases", flush=True)
    with open(args.out, "a") as f:
        for case in all_cases:
            name, mask, n, d, which, c = case
            ms = run_case(case, timed=True)
            record = dict(spec=name, mask=mask, n=n, d=d, passes=which, config=c, plan=args.plan)
            if args.v_head_dim:
                record["v_head_dim"] = args.v_head_dim
            if args.fp32:
                record["dtype"] = "fp32"
            record.update(ms=ms) if isinstance(ms, float) else record.update(error=ms)
            f.write(json.dumps(record) + "\n")
            f.flush()
            print(name, d, which, c, ms if isinstance(ms, str) else f"{ms:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
