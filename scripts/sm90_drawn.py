"""Specs drawn from the whole language, compiled for sm_90a without a GPU.

Every spec `flashgen check` accepts must compile on the GPU (the brief); the
interpreter does not compile, and Triton's passes have failed on accepted
specs that ran there (decision 065: the Gluon dK/dV kernel of `causal &
!causal`).  This draws specs with the tests' strategy (`strategies.variants`,
16-bit, head dims 16 to 128; draw i is the same on every machine) and
compiles each module's kernels as scripts/sm90_resources.py does: the
Triton forward and backward, decode, plan and Gluon kernels it has.  One
line per spec: ok with its kernels and any spills, or FAIL with the error
and the spec's text.  A kernel that needs more shared memory than an sm_90
block has (227 KB) fails too: it compiles, and its launch would raise.  Exit
status 1 if any failed.

--dtypes and --head-dims draw from other dtypes and head dims (fp32, the
wider heads up to 256); draw i then comes from a seed of its own, and the
defaults keep the draws of earlier runs.  --seqs compiles the kernels of
padded and varlen calls too.  --plan builds each module with plan knobs
(flashgen/experiments.py); a spec the knobs are refused for is reported as
skipped.  --inputs draws specs that read runtime data instead (`drawn_with_inputs`:
masks over integer inputs, scores over real ones, learnable or not), as text
that `flashgen check` must accept; draw i of it is the same on every machine.

    python3 scripts/sm90_drawn.py [--first I] [--count N] [--dtypes fp16 bf16 fp32]
        [--head-dims 16 40 64 80 128 ...] [--seqs] [--plan KNOB=VALUE ...] [--inputs]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import re
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import sm90_resources  # noqa: E402  (puts this checkout's flashgen first on the path)
from hypothesis import strategies as st  # noqa: E402

from flashgen import api, experiments, ir, strategies  # noqa: E402
from flashgen.printer import print_variant  # noqa: E402

HEAD_DIMS = (16, 40, 64, 80, 128)
DTYPES = ("bf16", "fp16")
# Shared memory an sm_90 block may have (cudaDevAttrMaxSharedMemoryPerBlockOptin).
SHARED_MAX = 232448


def drawn(index: int, dtypes=DTYPES, head_dims=HEAD_DIMS) -> ir.Variant:
    strategy = strategies.variants(
        dtypes=tuple(ir.DType(d) for d in dtypes), head_dims=tuple(head_dims), names=st.just("c")
    )
    seed = f"sm90:{index}"
    if (tuple(dtypes), tuple(head_dims)) != (DTYPES, HEAD_DIMS):
        seed += f":{','.join(dtypes)}:{','.join(map(str, head_dims))}"
    return dataclasses.replace(strategies.seeded_example(strategy, seed), name=f"c{index}")


# --inputs: atoms of masks over integer inputs (per-key ids in no order, a
# per-example length, a per-head reach) and positional ones, and scores that
# read real inputs (per head, a bucketed distance table, per key, per query).
DATA_MASK_ATOMS = (
    "d[b, q] == d[b, k]", "d[b, k] <= d[b, q] + {c}", "d[b, k] > {c}",
    "abs(d[b, k] - d[b, q]) < {c}", "(d[b, q] + k) % 3 != 0", "k < p[b]", "k >= p[b] - {c}",
    "q - k <= t[h]", "causal", "window({w})", "prefix({w})", "(q - k) % 3 != 1", "k >= 4",
    "chunk({w})",
)  # fmt: skip
DATA_SCORES = (
    "s", "s + w[h]", "s + rel[h, min(abs(q - k), 31)]", "s * temp[h]", "s + kb[b, k]",
    "softcap(s, 30.0) + w[h]", "s - w[h] * abs(q - k)", "s + rel[h, min(abs(q - k), 31)] + kb[b, k]",
    "tanh(s * temp[h]) * 8.0", "s + qb[b, q]",
)  # fmt: skip
DECLARATIONS = {
    "d": "d: int32[B, Nk]", "p": "p: int32[B]", "t": "t: int32[H]", "w": "w: {L}fp32[H]",
    "rel": "rel: {L}fp32[H, 32]", "temp": "temp: {L}fp32[H]", "kb": "kb: {L}fp32[B, Nk]",
    "qb": "qb: {L}fp32[B, Nq]",
}  # fmt: skip
INPUT_HEAD_DIMS = (32, 64, 80, 128)


def _data_mask(r: random.Random, depth: int = 0) -> str:
    if depth > 1 or r.random() < 0.4:
        atom = r.choice(DATA_MASK_ATOMS)
        return atom.format(c=r.randint(0, 3), w=r.choice((9, 100, 256)))
    if r.random() < 0.2:
        return f"!({_data_mask(r, depth + 1)})"
    op = r.choice(("&", "|"))
    return f"({_data_mask(r, depth + 1)}) {op} ({_data_mask(r, depth + 1)})"


def drawn_with_inputs(index: int, dtypes=DTYPES, head_dims=INPUT_HEAD_DIMS) -> ir.Variant:
    """Draw `index` of specs that read runtime data: the first draw from
    "sm90-inputs:<index>:<attempt>" that `flashgen check` accepts (it refuses,
    say, a mask that reads no input and a score that reads none)."""
    for attempt in range(100):
        r = random.Random(f"sm90-inputs:{index}:{attempt}")
        mask, score = _data_mask(r), r.choice(DATA_SCORES)
        learnable = "learnable " if r.random() < 0.5 else ""
        head_dim, dtype = r.choice(head_dims), r.choice(dtypes)
        used = [n for n in DECLARATIONS if re.search(rf"\b{n}\[", f"{mask} {score}")]
        if not used:
            continue
        lines = [f"head_dim = {head_dim}", f"dtype = {dtype}"]
        lines += [DECLARATIONS[n].format(L=learnable) for n in used]
        lines += [f"mask = {mask}", f"score = {score}"]
        text = f"attention c{index} {{\n" + "".join(f"    {x}\n" for x in lines) + "}\n"
        try:
            (variant,), _ = api.check_sources({"<drawn>": text})
        except api.SpecError:
            continue
        return variant
    raise RuntimeError(f"no accepted draw for index {index}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--first", type=int, default=0, help="the first draw (default 0)")
    parser.add_argument("--count", type=int, default=20, help="how many draws (default 20)")
    parser.add_argument(
        "--dtypes", nargs="+", default=list(DTYPES), choices=("fp16", "bf16", "fp32")
    )
    parser.add_argument(
        "--head-dims", nargs="+", type=int, help="default 16 40 64 80 128 (--inputs: 32 64 80 128)"
    )
    parser.add_argument("--seqs", action="store_true", help="also the padded and varlen kernels")
    parser.add_argument("--plan", nargs="+", default=[], metavar="KNOB=VALUE", help="plan knobs")
    parser.add_argument("--inputs", action="store_true", help="specs that read runtime data")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        parser.error("unset TRITON_INTERPRET: the kernels must be compiled, not interpreted")
    settings = experiments.parse_settings(args.plan)
    draw = drawn_with_inputs if args.inputs else drawn
    head_dims = args.head_dims or (INPUT_HEAD_DIMS if args.inputs else HEAD_DIMS)
    failed = 0
    for index in range(args.first, args.first + args.count):
        variant = draw(index, args.dtypes, head_dims)
        start = time.perf_counter()
        sm90_resources.FEWER_STAGES.clear()
        try:
            module = api.load_variant(variant, settings)
            found = sm90_resources.module_resources(module)
            if args.seqs:
                found += sm90_resources.module_resources(module, seqs=True)
            too_big = [
                f"{r.kernel} {r.config}: {r.shared} B" for r in found if r.shared > SHARED_MAX
            ]
            if too_big:
                raise RuntimeError(f"more shared memory than {SHARED_MAX} B: {too_big}")
        except experiments.ExperimentError as e:  # a knob refused for this spec
            print(f"skipped c{index}: {e}", flush=True)
            continue
        except Exception as e:  # noqa: BLE001 - a report, keep going
            failed += 1
            print(f"FAIL c{index} {type(e).__name__}: {str(e)[-800:]}")
            print(print_variant(variant), flush=True)
            continue
        spills = {r.kernel: r.spill_stores for r in found if r.spill_stores}
        fewer = "".join(
            f", {kernel} {config} compiled at {stages} stages (ptxas failed with more)"
            for kernel, config, stages in sm90_resources.FEWER_STAGES
        )
        print(
            f"ok c{index} d{variant.head_dim} {variant.dtype.value} "
            f"{time.perf_counter() - start:.1f} s, {len(found)} kernels, spill stores {spills}"
            f"{fewer}",
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
