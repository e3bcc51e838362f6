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
skipped.

    python3 scripts/sm90_drawn.py [--first I] [--count N] [--dtypes fp16 bf16 fp32]
        [--head-dims 16 40 64 80 128 ...] [--seqs] [--plan KNOB=VALUE ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--first", type=int, default=0, help="the first draw (default 0)")
    parser.add_argument("--count", type=int, default=20, help="how many draws (default 20)")
    parser.add_argument(
        "--dtypes", nargs="+", default=list(DTYPES), choices=("fp16", "bf16", "fp32")
    )
    parser.add_argument("--head-dims", nargs="+", type=int, default=list(HEAD_DIMS))
    parser.add_argument("--seqs", action="store_true", help="also the padded and varlen kernels")
    parser.add_argument("--plan", nargs="+", default=[], metavar="KNOB=VALUE", help="plan knobs")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        parser.error("unset TRITON_INTERPRET: the kernels must be compiled, not interpreted")
    settings = experiments.parse_settings(args.plan)
    failed = 0
    for index in range(args.first, args.first + args.count):
        variant = drawn(index, args.dtypes, args.head_dims)
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
