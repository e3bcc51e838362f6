"""Where the host time of a generated module's call goes, piece by piece.

On a tiny problem (B = H = 1, N = 128, d128, bf16: the GPU is never the
bottleneck) this times, in microseconds of host time per call (300 calls,
synchronized only before and after):

- torch.empty of one q-sized tensor;
- an autograd Function that launches nothing, forward + backward through
  torch.autograd.grad: the autograd engine and its hand-off to the CUDA
  device thread;
- Triton launches of an empty kernel with 1 argument, 16 integer arguments,
  and 4 TMA descriptors: what the arguments cost;
- the module's forward (Gluon and Triton), backward, and forward + backward
  through autograd (as `flashgen bench` calls it).

docs/decisions/019-short-kernels-time-the-host.md measured the last group (0.7-0.8 ms for forward +
backward through autograd against 0.3-0.4 ms for forward() + backward()
called directly); this splits it.

    python3 scripts/host_probe.py [SPEC ...]   (default: examples/full.attn)

Without a GPU (TRITON_INTERPRET=1) it runs on the CPU as a smoke test; those
numbers mean nothing.
"""

from __future__ import annotations

import cProfile
import dataclasses
import os
import pstats
import sys
import threading
import time

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from flashgen.api import load_variant  # noqa: E402
from flashgen.cli import _check_sources, _read  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _repeat(fn, calls: int) -> None:
    """Call fn `calls` times, dropping each result: a list of the results
    would keep every output alive, and each call's allocations would then go
    to cudaMalloc instead of the caching allocator's free blocks."""
    for _ in range(calls):
        fn()


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def per_call_us(fn, calls: int = 300 if DEVICE == "cuda" else 3) -> float:
    for _ in range(20 if DEVICE == "cuda" else 1):
        fn()
    _sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - start) / calls * 1e6
    _sync()
    return host


@triton.jit
def _empty_1(a):
    pass


@triton.jit
def _empty_16(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15):
    pass


@triton.jit
def _empty_desc(d0, d1, d2, d3):
    pass


class _NoKernels(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q):
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, do):
        return torch.empty_like(do)


def main() -> None:
    specs = sys.argv[1:] or ["examples/full.attn"]
    shape = (1, 1, 128, 128)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float16  # no bf16 dots on the CPU
    q, k, v, do = (
        torch.randn(shape, device=DEVICE, dtype=dtype, requires_grad=True) for _ in range(4)
    )
    print(f"torch.empty: {per_call_us(lambda: torch.empty(shape, device=DEVICE)):.1f} us")
    autograd = per_call_us(lambda: torch.autograd.grad(_NoKernels.apply(q), q, do))
    print(f"autograd Function without kernels, forward + backward: {autograd:.1f} us")
    ints = list(range(16, 16 * 17, 16))
    print(f"empty Triton kernel, 1 argument: {per_call_us(lambda: _empty_1[(1,)](q)):.1f} us")
    print(f"  16 integer arguments: {per_call_us(lambda: _empty_16[(1,)](*ints)):.1f} us")

    def descriptors():
        return [
            TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 1, 64, 64])
            for x in (q, k, v, do)
        ]

    desc = per_call_us(lambda: _empty_desc[(1,)](*descriptors()))
    print(f"  4 TMA descriptors (made per call): {desc:.1f} us")
    for path in specs:
        (variant,), _ = _check_sources(_read([path]))
        module = load_variant(dataclasses.replace(variant, head_dim=128))
        if module.DTYPE != dtype:
            print(f"{variant.name}: skipped (not {dtype})")
            continue
        config = dict(zip(("block_m", "block_n", "num_warps", "num_stages"), module.GPU_CONFIG))
        o, lse = module.forward(q, k, v)
        backward = lambda: module.backward(q, k, v, o, lse, do)  # noqa: E731
        times = {}
        for direct in (False, True):  # through Triton's launch path, then `_launch`'s direct calls
            module.DIRECT_LAUNCH = direct
            how = "direct launches" if direct else "Triton launches"
            times.update(
                {
                    f"forward (default path), {how}": per_call_us(lambda: module.forward(q, k, v)),
                    f"forward (Triton, explicit config), {how}": per_call_us(
                        lambda: module.forward(q, k, v, **config, tma=module.GPU_TMA)
                    ),
                    f"backward, {how}": per_call_us(backward),
                    f"attention forward + backward (autograd), {how}": per_call_us(
                        lambda: torch.autograd.grad(module.attention(q, k, v), (q, k, v), do)
                    ),
                    f"forward() + backward(), no autograd, {how}": per_call_us(
                        lambda: module.backward(q, k, v, *module.forward(q, k, v), do)
                    ),
                }
            )
        times["backward() on a second thread"] = _on_thread(backward)
        times.update(_inside_autograd(module, q, k, v, do))
        for name in ("_gluon_attn_bwd_dq", "_attn_bwd"):  # whichever backward() launches
            split = _launch_split(module, getattr(module, name, None), backward)
            if split:
                times.update(split)
                break
        for name, us in times.items():
            print(f"{variant.name}: {name}: {us:.1f} us")
        if DEVICE == "cuda":
            for label, fn in (
                ("backward()", backward),
                (
                    "autograd forward + backward (calling thread only)",
                    lambda: torch.autograd.grad(module.attention(q, k, v), (q, k, v), do),
                ),
            ):
                print(f"--- cProfile, 300 calls of {label}, by own time")
                profile = cProfile.Profile()
                profile.runcall(_repeat, fn, 300)
                _sync()
                pstats.Stats(profile).sort_stats("tottime").print_stats(14)
    _flex_host(q, k, v, do)


def _on_thread(fn) -> float:
    """per_call_us of fn run on a fresh thread (as autograd's device thread
    runs a backward)."""
    result = []
    thread = threading.Thread(target=lambda: result.append(per_call_us(fn)))
    thread.start()
    thread.join()
    return result[0]


def _inside_autograd(module, q, k, v, do) -> dict[str, float]:
    """Host time spent inside the module's forward() and backward() when
    autograd calls them, against the whole autograd call."""
    spent = {"_forward": [0.0, 0], "_backward": [0.0, 0]}
    originals = {name: getattr(module, name) for name in spent}

    def timed(name):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return originals[name](*args, **kwargs)
            finally:
                spent[name][0] += time.perf_counter() - start
                spent[name][1] += 1

        return call

    for name in spent:
        setattr(module, name, timed(name))
    try:
        total = per_call_us(lambda: torch.autograd.grad(module.attention(q, k, v), (q, k, v), do))
    finally:
        for name, fn in originals.items():
            setattr(module, name, fn)
    out = {"autograd fwd+bwd (timed run)": total}
    for name, (seconds, calls) in spent.items():
        out[f"  of which inside {name}()"] = seconds / max(calls, 1) * 1e6
    return out


def _launch_split(module, kernel, call) -> dict[str, float]:
    """Triton's launch path for one kernel: argument binding and
    specialization (the binder) against the whole JITFunction.run.  Empty
    if `call` does not launch `kernel`."""
    if DEVICE != "cuda" or kernel is None:
        return {}
    captured = []
    kernel.pre_run_hooks.append(lambda *args, **kwargs: captured.append((args, kwargs)))
    direct, module.DIRECT_LAUNCH = module.DIRECT_LAUNCH, False  # hooks run in Triton's path
    try:
        call()
    finally:
        kernel.pre_run_hooks.pop()
        module.DIRECT_LAUNCH = direct
    if not captured:
        return {}
    args, kwargs = captured[-1]  # as JITFunction.run hands them to its binder
    from triton.runtime.driver import driver

    device = driver.active.get_current_device()
    binder = kernel.device_caches[device][4]
    name = getattr(kernel, "__name__", "kernel")
    return {
        f"{name}: binder (specialization of {len(args)} args)": per_call_us(
            lambda: binder(*args, **kwargs)
        ),
        f"{name}: get_current_device + stream": per_call_us(
            lambda: driver.active.get_current_stream(driver.active.get_current_device())
        ),
    }


def _flex_host(q, k, v, do) -> None:
    """FlexAttention's host time per call, for comparison."""
    if DEVICE != "cuda":
        return
    from torch.nn.attention.flex_attention import flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    inputs = [x.detach().requires_grad_() for x in (q, k, v)]
    fwd = per_call_us(lambda: flex(*inputs))
    both = per_call_us(lambda: torch.autograd.grad(flex(*inputs), inputs, do))
    print(f"flex (compiled, no mask): forward {fwd:.1f} us, forward + backward {both:.1f} us")


if __name__ == "__main__":
    main()
