"""Where a benched call's time goes on the GPU: `flashgen bench` as the CLI
runs it (flashgen beside FlexAttention, same inputs), with a timer that also
traces five calls under torch.profiler and prints, for each timed call
(forward, then forward + backward, per system), the median time, each
kernel's device time per call, the sum of those (the GPU's busy time) and
the span from the first kernel's start to the last one's end.  A call whose
median is well above its busy time is paced by the host or by a serial
chain of kernels, not by their work.

    python3 scripts/gpu_kernel_times.py SPEC [SPEC ...] [--head-dim D] [--seqlen N]
    python3 scripts/gpu_kernel_times.py --random 30 --seed 0 --name rand0_4 ... [--head-dim D]
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch
import triton

sys.path.insert(0, ".")
from flashgen import bench  # noqa: E402
from flashgen.api import _check_specs  # noqa: E402


def profiled(fn, calls: int = 5) -> float:
    """do_bench's median of `fn`, after printing the kernels of `calls` calls."""
    from torch.profiler import ProfilerActivity, profile

    ms = triton.testing.do_bench(fn, warmup=50, rep=200, return_mode="median")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    per_name: dict[str, float] = defaultdict(float)
    for e in kernels:
        per_name[e.name] += e.device_time / calls
    busy = sum(per_name.values())
    span = (
        max(e.time_range.end for e in kernels) - min(e.time_range.start for e in kernels)
    ) / calls
    print(f"  median {ms * 1e3:8.1f} us   busy {busy:8.1f} us   span {span:8.1f} us")
    for name, us in sorted(per_name.items(), key=lambda t: -t[1]):
        print(f"    {us:8.1f} us  {name[:90]}")
    return ms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("specs", nargs="*")
    p.add_argument("--random", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", nargs="*")
    p.add_argument("--head-dim", type=int)
    p.add_argument("--seqlen", type=int, default=4096)
    p.add_argument("--systems", nargs="*", default=["flashgen", "flex"])
    a = p.parse_args()
    if a.random:
        drawn = bench.draw_variants(a.random, a.seed, a.head_dim or 128)
        variants = [d.variant for d in drawn if not a.name or d.variant.name in a.name]
    else:
        variants = _check_specs([Path(s) for s in a.specs])
    for variant in variants:
        print(f"== {variant.name}")
        for m in bench.bench(
            [variant],
            seqlens=[a.seqlen],
            head_dim=a.head_dim,
            timer=profiled,
            systems=a.systems,
            progress=False,
        ):
            print(f"  {m.system}: fwd {m.fwd_ms} ms, bwd {m.bwd_ms} ms {m.error or ''}")


if __name__ == "__main__":
    main()
