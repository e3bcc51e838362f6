"""Where a module's host time goes on a GPU machine: per-call microseconds of
forward(), backward(), attention() with and without autograd, beside the
floor of any autograd.Function on that host (a Function whose forward and
backward only allocate their outputs) and FlexAttention's compiled call;
then cProfile's top entries for attention() forward + backward.  With
--trace, torch.profiler's view of one forward + backward through autograd
and of the floor's: every operator and launch with its thread and its start
and length in microseconds, so that time in autograd's device thread (which
cProfile does not see) shows too.  With --stamps, the forward + backward
through autograd split by perf_counter stamps taken where the module's
Python starts and ends in each direction (no profiler): the median time
from the call to the forward's Python, in it, back to the caller, from
torch.autograd.grad to the backward's Python (autograd's device thread),
in it, and back to the caller; the floor's alike.

    python3 scripts/gpu_host_profile.py SPEC [SPEC ...] [--head-dim D] [--flex] [--trace] [--stamps]
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import functools
import gc
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, ".")
from flashgen.api import _check_specs, load_variant  # noqa: E402
from flashgen.verify import Shape, random_runtime_inputs  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from gpu_host_sync import per_call_us  # noqa: E402


class Floor(torch.autograd.Function):
    """Allocations only: what autograd itself costs per call on this host."""

    @staticmethod
    def forward(ctx, q, k, v):
        o = torch.empty_like(q)
        lse = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, o, lse = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def trace(name: str, call, calls: int = 3) -> None:
    """The operators and launches of the last of `calls` calls, in start order:
    thread, start (us from the call's start), length (us) and name, indented
    by nesting; then each thread's time inside top-level events."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(10):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            torch.cuda.synchronize()
            with torch.profiler.record_function("call"):
                call()
            torch.cuda.synchronize()
    events = [e for e in prof.events() if str(e.device_type).endswith("CPU")]
    events.sort(key=lambda e: e.time_range.start)
    starts = [e for e in events if e.name == "call"]
    t0 = starts[-1].time_range.start
    last = [e for e in events if e.time_range.start >= t0]
    threads = {}
    print(f"--- {name}: one call through autograd")
    for e in last:
        depth, parent = 0, e.cpu_parent
        while parent is not None:
            depth, parent = depth + 1, parent.cpu_parent
        if depth <= 3:
            start = e.time_range.start - t0
            length = e.time_range.end - e.time_range.start
            print(f"  t{e.thread % 1000:03d} {start:8.1f} {length:8.1f} {'  ' * depth}{e.name}")
        if e.cpu_parent is None:
            threads[e.thread] = threads.get(e.thread, 0.0) + e.time_range.end - e.time_range.start
    span = max(e.time_range.end for e in last) - t0
    print(
        f"  span {span:.1f} us; top-level time by thread:",
        ", ".join(f"t{t % 1000:03d} {us:.1f} us" for t, us in threads.items()),
    )


SEGMENTS = (
    "call -> forward",
    "forward",
    "forward -> caller",
    "grad -> backward",
    "backward",
    "backward -> caller",
)


def stamped(name: str, call, enter_exit, calls: int = 200) -> None:
    """Medians of SEGMENTS over `calls` calls of `call` (forward + backward
    through autograd), whose `enter_exit` list the wrapped forward and
    backward append their entry and exit stamps to."""
    rows = []
    for i in range(calls + 20):
        enter_exit.clear()
        t0 = time.perf_counter()
        call(enter_exit)
        t1 = time.perf_counter()
        if i >= 20 and len(enter_exit) == 5:
            fa, fb, ret, ba, bb = enter_exit
            rows.append((fa - t0, fb - fa, ret - fb, ba - ret, bb - ba, t1 - bb))
    medians = [statistics.median(r[j] for r in rows) * 1e6 for j in range(len(SEGMENTS))]
    means = [statistics.fmean(r[j] for r in rows) * 1e6 for j in range(len(SEGMENTS))]
    parts = ", ".join(
        f"{seg} {us:.0f} ({mean:.0f})" for seg, us, mean in zip(SEGMENTS, medians, means)
    )
    totals = sorted(sum(r) * 1e6 for r in rows)
    deciles = " ".join(f"{totals[len(totals) * i // 10]:.0f}" for i in range(10))
    print(f"--- {name} stamps (us, median (mean) of {len(rows)}): {parts}; sum {sum(medians):.0f}")
    print(
        f"    call totals by decile: {deciles} max {totals[-1]:.0f}; mean {statistics.fmean(totals):.0f}"
    )


def stamp_wrap(fn, enter_exit):
    """fn, appending perf_counter stamps to `enter_exit` on entry and exit."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        enter_exit.append(time.perf_counter())
        out = fn(*args, **kwargs)
        enter_exit.append(time.perf_counter())
        return out

    return wrapped


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("specs", nargs="+")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--flex", action="store_true")
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--stamps", action="store_true")
    args = parser.parse_args()
    b, h, n, d = 1, 1, 128, args.head_dim
    q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]

    def floor():
        o, _ = Floor.apply(*leaves)
        return torch.autograd.grad(o, leaves, do)

    print(f"autograd floor (allocations only): {per_call_us(floor):.0f} us", flush=True)
    if args.trace:
        trace("floor", floor)
    if args.stamps:
        stamps: list[float] = []
        plain_forward, plain_backward = Floor.forward, Floor.backward
        Floor.forward = staticmethod(stamp_wrap(plain_forward, stamps))
        Floor.backward = staticmethod(stamp_wrap(plain_backward, stamps))

        def floor_stamped(enter_exit):
            o, _ = Floor.apply(*leaves)
            enter_exit.append(time.perf_counter())
            return torch.autograd.grad(o, leaves, do)

        stamped("floor", floor_stamped, stamps)
        Floor.forward, Floor.backward = staticmethod(plain_forward), staticmethod(plain_backward)
    for path in args.specs:
        (variant,) = _check_specs([Path(path)])
        variant = dataclasses.replace(variant, head_dim=d)
        module = load_variant(variant)
        data = random_runtime_inputs(
            variant, Shape(b, h, h, n, n), "cuda", generator=torch.Generator().manual_seed(0),
            mean_run=1000,
        )  # fmt: skip
        o, lse = module.forward(q, k, v, **data)

        def both():
            return torch.autograd.grad(module.attention(*leaves, **data), leaves, do)

        with torch.no_grad():
            inference = per_call_us(lambda: module.attention(q, k, v, **data))
        times = {
            "forward()": per_call_us(lambda: module.forward(q, k, v, **data)),
            "backward()": per_call_us(lambda: module.backward(q, k, v, o, lse, do, **data)),
            "attention() no grad": inference,
            "attention() with grad, forward only": per_call_us(
                lambda: module.attention(*leaves, **data)
            ),
            "attention() forward + backward": per_call_us(both),
        }
        print(variant.name, ", ".join(f"{k_} {us:.0f} us" for k_, us in times.items()))
        if args.trace:
            trace(variant.name, both)
        if args.stamps:
            stamps = []
            module._layout_forward = stamp_wrap(module._layout_forward, stamps)
            module._layout_backward = stamp_wrap(module._layout_backward, stamps)

            def both_stamped(enter_exit):
                o = module.attention(*leaves, **data)
                enter_exit.append(time.perf_counter())
                return torch.autograd.grad(o, leaves, do)

            stamped(variant.name, both_stamped, stamps)
            gc.disable()
            stamped(variant.name + " (gc disabled)", both_stamped, stamps)
            print(f"gc disabled: forward + backward {per_call_us(lambda: both_stamped([])):.0f} us")
            gc.enable()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(200):
            both()
        profile.disable()
        torch.cuda.synchronize()
        pstats.Stats(profile).sort_stats("tottime").print_stats(22)
    if args.flex:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        compiled = torch.compile(flex_attention)
        mask = create_block_mask(lambda b_, h_, q_, k_: q_ >= k_, 1, 1, n, n, device="cuda")

        def flex_both():
            return torch.autograd.grad(compiled(*leaves, block_mask=mask), leaves, do)

        print(f"FlexAttention causal forward + backward: {per_call_us(flex_both):.0f} us")


if __name__ == "__main__":
    main()
