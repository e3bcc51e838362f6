"""Forward and backward time of the Triton kernels at each candidate launch
configuration, on masks whose query rows see few keys (documents, chunks,
bands) and many (causal, full): the data behind the configurations that
`flashgen.launch` derives from a mask's tiles.

    python3 scripts/gpu_config_sweep.py OUT.jsonl [--workers 12] [--masks NAME ...]
        [--plan NAME=VALUE ...] [--head-dims D ...] [--v-head-dim DV] [--wide] [--fp32]
        [--specs FILE.attn ...] [--random COUNT --seed S [--names rand<S>_<I> ...]]
        [--passes forward backward] [--backward-configs M,N,W,S ...] [--list]

--specs and --random sweep whole specs (their scores too) instead of the
masks above, at N = 4096 (B = 4), each at the head dims given: .attn files,
and specs drawn as `flashgen bench --random COUNT --seed S` draws them
(--names: only these).  --passes sweeps one pass only; --backward-configs
and --forward-configs replace the candidates; --list prints the cases and
stops (no GPU needed).  A config "built" is the module's own (recorded with
"built" after it).  --n: the whole specs' N (default 4096).

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
import re
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


# N of the whole specs of --specs and --random (B = 16384 // N), as `flashgen bench --random`.
SPEC_N = 4096


def spec_text(name: str, mask: str, d: int) -> str:
    """A mask of MASKS as a spec; a whole spec's text (starting "attention")
    at head dim `d`."""
    if mask.startswith("attention"):
        return re.sub(r"head_dim = \d+", f"head_dim = {d}", mask)
    inputs = "doc: int32[B, Nk]; " if "doc[" in mask else ""
    dv = V_HEAD_DIM["value"]
    v_dim = f"v_head_dim = {dv}; " if dv else ""
    dtype = DTYPE["value"]
    return f"attention {name} {{ head_dim = {d}; {v_dim}dtype = {dtype}; {inputs}mask = {mask} }}"


def whole_specs(
    files=(), random_count=0, seed=0, names=None, n=SPEC_N
) -> list[tuple[str, str, int]]:
    """(name, text, N) of --specs and --random, as MASKS's entries."""
    from flashgen.api import _check_specs
    from flashgen.bench import draw_variants
    from flashgen.printer import print_variant

    found = []
    for path in files:
        with open(path) as f:
            found += [(v.name, print_variant(v), n) for v in _check_specs([f.read()])]
    if random_count:
        drawn = draw_variants(random_count, seed, head_dim=HEAD_DIMS[-1])
        found += [
            (d.variant.name, print_variant(d.variant), n)
            for d in drawn
            if not names or d.variant.name in names
        ]
    return found


def cases(
    names=None,
    head_dims=HEAD_DIMS,
    wide=False,
    fp32=False,
    specs=None,
    passes=("forward", "backward"),
    forward=None,
    backward=None,
):
    """(name, mask or spec text, N, head dim, pass, config) to time: the masks
    of MASKS (`names`: only these), or `specs` (`whole_specs`) where given."""
    default_forward, default_backward = (
        (WIDE_FORWARD, WIDE_BACKWARD) if wide else (FORWARD, BACKWARD)
    )
    if fp32:
        default_forward, default_backward = FP32_FORWARD, FP32_BACKWARD
    forward, backward = forward or default_forward, backward or default_backward
    for name, mask, n in specs or MASKS:
        if names and name not in names and not specs:
            continue
        for d in head_dims:
            for c in forward if "forward" in passes else ():
                yield (name, mask, n, d, "forward", c)
            for c in backward if "backward" in passes else ():
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
        dtype = module.DTYPE  # the spec's own (bf16 for MASKS, fp32 with --fp32)
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
    kw = {} if c is None else dict(block_m=c[0], block_n=c[1], num_warps=c[2], num_stages=c[3])
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


def _config(text: str) -> tuple[int, ...] | None:
    if text == "built":
        return None
    config = tuple(int(x) for x in text.split(","))
    if len(config) != 4:
        raise argparse.ArgumentTypeError(f"{text!r}: BLOCK_M,BLOCK_N,WARPS,STAGES")
    return config


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
    parser.add_argument("--specs", nargs="*", default=[], help=".attn files (whole specs)")
    parser.add_argument("--random", type=int, default=0, metavar="COUNT", help="drawn specs")
    parser.add_argument("--seed", type=int, default=0, help="--random's seed")
    parser.add_argument("--names", nargs="*", help="--random: only these draws")
    parser.add_argument("--passes", nargs="*", default=["forward", "backward"])
    parser.add_argument("--forward-configs", nargs="*", type=_config, metavar="M,N,W,S")
    parser.add_argument("--backward-configs", nargs="*", type=_config, metavar="M,N,W,S")
    parser.add_argument("--n", type=int, default=SPEC_N, help="N of --specs and --random")
    parser.add_argument("--list", action="store_true", help="print the cases and stop")
    args = parser.parse_args()
    KNOBS.update(parse_settings(args.plan))
    V_HEAD_DIM["value"] = args.v_head_dim
    DTYPE["value"] = "fp32" if args.fp32 else "bf16"
    specs = whole_specs(args.specs, args.random, args.seed, args.names, args.n)
    all_cases = list(
        cases(
            args.masks, args.head_dims, args.wide, args.fp32, specs, args.passes,
            args.forward_configs, args.backward_configs,
        )  # fmt: skip
    )
    if args.list:
        for name, _, n, d, which, c in all_cases:
            print(name, n, d, which, c)
        return
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
            if c is None:  # "built": the module's own
                module = setup(name, mask, n, d)[0]
                c = module.GPU_CONFIG if which == "forward" else module.GPU_BWD_CONFIG
                c = (*c, "built")
            record = dict(spec=name, mask=mask, n=n, d=d, passes=which, config=c, plan=args.plan)
            if mask.startswith("attention"):
                record.update(mask=None, text=spec_text(name, mask, d))
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
