"""Host time of a module's calls on a GPU, and whether any call synchronizes.

For each spec: one forward + backward through autograd under
`torch.cuda.set_sync_debug_mode("error")` (a host-device synchronization
raises, with its traceback), then host microseconds per call of forward(),
backward() and attention() forward + backward, on a tiny problem (the GPU is
never the bottleneck) and at B = 1, H = 16, N = 16384.

    python3 scripts/gpu_host_sync.py SPEC [SPEC ...] [--head-dim D]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, ".")
from flashgen.api import _check_specs, load_variant  # noqa: E402
from flashgen.verify import Shape, random_runtime_inputs  # noqa: E402


def per_call_us(fn, calls: int = 300) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return host


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("specs", nargs="+")
    parser.add_argument("--head-dim", type=int, default=64)
    args = parser.parse_args()
    for path in args.specs:
        (variant,) = _check_specs([Path(path)])
        variant = dataclasses.replace(variant, head_dim=args.head_dim)
        module = load_variant(variant)
        for b, h, n, calls in ((1, 1, 128, 300), (1, 16, 16384, 20)):
            q, k, v, do = (
                torch.randn(b, h, n, args.head_dim, device="cuda", dtype=module.DTYPE)
                for _ in range(4)
            )
            data = random_runtime_inputs(
                variant, Shape(b, h, h, n, n), "cuda", generator=torch.Generator().manual_seed(0),
                mean_run=1000,
            )  # fmt: skip
            leaves = [x.requires_grad_() for x in (q, k, v)]

            def both():
                return torch.autograd.grad(module.attention(*leaves, **data), leaves, do)

            both()
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                both()
                sync = "none"
            except RuntimeError:
                sync = traceback.format_exc(limit=-6)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            o, lse = module.forward(q, k, v, **data)
            times = {
                "forward()": per_call_us(lambda: module.forward(q, k, v, **data), calls),
                "backward()": per_call_us(
                    lambda: module.backward(q, k, v, o, lse, do, **data), calls
                ),
                "attention() forward + backward": per_call_us(both, calls),
            }
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                both()
            torch.cuda.synchronize()
            gpu = (time.perf_counter() - start) / calls * 1e6
            shown = ", ".join(f"{name} {us:.0f} us" for name, us in times.items())
            print(f"{variant.name} B={b} H={h} N={n}: {shown}; synchronized wall {gpu:.0f} us")
            print(f"  synchronizations: {sync}", flush=True)


if __name__ == "__main__":
    main()
