"""Specs drawn from the whole language, compiled for sm_90a without a GPU.

Every spec `flashgen check` accepts must compile on the GPU (the brief); the
interpreter does not compile, and Triton's passes have failed on accepted
specs that ran there (decision 065: the Gluon dK/dV kernel of `causal &
!causal`).  This draws specs with the tests' strategy (`strategies.variants`,
16-bit, head dims 16 to 128; draw i is the same on every machine) and
compiles each module's kernels as scripts/sm90_resources.py does: the
Triton forward and backward, decode, plan and Gluon kernels it has.  One
line per spec: ok with its kernels and any spills, or FAIL with the error
and the spec's text.  Exit status 1 if any failed.

    python3 scripts/sm90_drawn.py [--first I] [--count N]
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

from flashgen import api, ir, strategies  # noqa: E402
from flashgen.printer import print_variant  # noqa: E402

HEAD_DIMS = (16, 40, 64, 80, 128)


def drawn(index: int) -> ir.Variant:
    strategy = strategies.variants(
        dtypes=(ir.DType.BF16, ir.DType.FP16), head_dims=HEAD_DIMS, names=st.just("c")
    )
    return dataclasses.replace(
        strategies.seeded_example(strategy, f"sm90:{index}"), name=f"c{index}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--first", type=int, default=0, help="the first draw (default 0)")
    parser.add_argument("--count", type=int, default=20, help="how many draws (default 20)")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        parser.error("unset TRITON_INTERPRET: the kernels must be compiled, not interpreted")
    failed = 0
    for index in range(args.first, args.first + args.count):
        variant = drawn(index)
        start = time.perf_counter()
        sm90_resources.FEWER_STAGES.clear()
        try:
            found = sm90_resources.module_resources(api.load_variant(variant))
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
