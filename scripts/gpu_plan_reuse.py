"""A plan built once (`tile_plan`) against one built per call, on a GPU: the
same bits, and what the reuse saves in GPU and host time per forward +
backward, for packed documents of ~1000 tokens (B = 1, H = 16, N = 16384).

    python3 scripts/gpu_plan_reuse.py     # after scripts/gpu_env.sh
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import torch
import triton.testing

sys.path.insert(0, ".")
from flashgen.api import _check_specs, load_variant  # noqa: E402
from flashgen.verify import Shape, random_runtime_inputs  # noqa: E402


def host_us(fn, calls: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return host


def main() -> None:
    (base,) = _check_specs([Path("benchmarks/specs/packed_docs.attn")])
    b, h, n = 1, 16, 16384
    for d in (64, 128):
        variant = dataclasses.replace(base, head_dim=d)
        module = load_variant(variant)
        q, k, v, do = (
            torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4)
        )
        data = random_runtime_inputs(
            variant, Shape(b, h, h, n, n), "cuda", generator=torch.Generator().manual_seed(n),
            mean_run=1000,
        )  # fmt: skip
        leaves = [x.requires_grad_() for x in (q, k, v)]
        plan = module.tile_plan(q, k, v, **data)

        def both(given):
            o = module.attention(*leaves, **data, plan=given)
            return (o, *torch.autograd.grad(o, leaves, do))

        same = all(torch.equal(x, y) for x, y in zip(both(None), both(plan)))
        gpu = {
            name: triton.testing.do_bench(lambda: both(given))
            for name, given in (("per call", None), ("reused", plan))
        }
        host = {
            name: host_us(lambda: both(given))
            for name, given in (("per call", None), ("reused", plan))
        }
        build = triton.testing.do_bench(lambda: module.tile_plan(q, k, v, **data))
        print(
            f"packed_docs d{d}: same bits {same}; forward + backward {gpu['per call']:.3f} ms "
            f"with a plan per call, {gpu['reused']:.3f} ms reused; host {host['per call']:.0f} "
            f"/ {host['reused']:.0f} us per call; tile_plan() {build * 1000:.0f} us",
            flush=True,
        )


if __name__ == "__main__":
    main()
