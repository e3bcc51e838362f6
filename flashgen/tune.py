"""`flashgen tune`: measure launch configurations on a GPU and freeze them.

In: checked `Variant`s and a CUDA device.  Out: one `Tuning` per variant (the
fastest forward and backward (BLOCK_M, BLOCK_N, num_warps, num_stages) among
the candidates, by median time over the given sequence lengths), saved in a
sidecar `SPEC.tune.json` next to the spec (`flashgen.sidecar`: its format,
reading, validation and writing).  The sidecar keeps one tuning per block and
(head_dim, dtype), since the best configs change with the head dim and a spec
may be built at other head dims (`flashgen bench --head-dim`).

`flashgen build` and `flashgen.load` read the sidecar and write the configs of
the variant's head dim and dtype into the generated module as plain constants,
so a user's first call never autotunes.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import astuple
from typing import Callable, Sequence

from flashgen import ir
from flashgen.lower import LaunchConfig, Tuning

# The space of the anchors' calibration kernel (24 forward configs), and a
# backward space kept as small: each candidate costs a compilation (seconds).
FORWARD_CANDIDATES = tuple(
    LaunchConfig(m, n, w, s)
    for m, n, w, s in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3))
)
# The backward's also try one stage at 64-wide key blocks: stages 1-2 win
# when each program's loop is short (a narrow band mask).
BACKWARD_CANDIDATES = tuple(
    LaunchConfig(m, n, w, s)
    for m, n, w, s in itertools.product((32, 64), (64, 128), (4, 8), (2, 3))
) + (LaunchConfig(32, 64, 4, 1), LaunchConfig(64, 64, 4, 1))


# A quick pass for a GPU session with many specs: the measured defaults of
# `launch.gpu_config` / `gpu_bwd_config` and their nearest neighbours.  The
# backward's include the two shapes that compile without register spills for
# the masked examples at d128 (scripts/sm90_resources.py), where the default
# (64, 128, 8, 3) spills 36-516 bytes, and two with fewer stages, which win
# when each program's loop is short: for window(128, 128) on an H200 the
# backward went from 125 to 152 TFLOP/s at d64 with (32, 64, 4, 1) and from
# 136 to 195 at d128 with (64, 64, 4, 2).
QUICK_FORWARD_CANDIDATES = tuple(
    LaunchConfig(*c)
    for c in ((64, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 8, 2), (64, 128, 4, 3))
)
QUICK_BACKWARD_CANDIDATES = tuple(
    LaunchConfig(*c)
    for c in (
        (64, 64, 4, 3),
        (64, 64, 8, 3),
        (32, 128, 8, 3),
        (32, 128, 8, 2),  # d128 heavy derivatives: 0.71-1.43x the default (decision 076)
        (64, 128, 8, 3),
        (32, 64, 4, 3),
        (64, 64, 4, 2),
        (32, 64, 4, 1),
    )
)
PASSES = ("forward", "backward")


def _do_bench(fn: Callable[[], object]) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def tune(
    variant: ir.Variant,
    *,
    seqlens: Sequence[int] = (4096,),
    batch: int | None = None,
    heads: int = 16,
    device: str = "cuda",
    timer: Callable[[Callable[[], object]], float] = _do_bench,
    forward_candidates: Sequence[LaunchConfig] = FORWARD_CANDIDATES,
    backward_candidates: Sequence[LaunchConfig] = BACKWARD_CANDIDATES,
    device_name: str | None = None,
    passes: Sequence[str] = PASSES,
    warn: Callable[[str], object] = lambda message: None,
) -> tuple[Tuning, dict[str, dict[LaunchConfig, float]]]:
    """The fastest forward and backward configs that compute the right
    answer, and every candidate's time.

    A candidate that fails to compile or launch (too much shared memory, say)
    is skipped.  One that faults the GPU ends the search with a RuntimeError
    naming it: the process's CUDA context is lost with it.  The fastest
    candidate of each pass, at its faster TMA setting, is checked against the
    float64 reference (`check_config`) before it is taken; a wrong one is
    passed over for the next fastest, and `warn` is told why.  (Decision 086:
    ptxas assembled a spilling backward wrong at one launch configuration and
    right at others.)  `batch=None` keeps B·N at 16384 tokens.  A pass left out
    of `passes` keeps the module's current config and TMA choice (its
    sidecar's, or the defaults).
    """
    if not passes or not set(passes) <= set(PASSES):
        raise ValueError(f"passes must be some of {PASSES}, got {list(passes)}")
    import torch

    from flashgen.api import load_variant
    from flashgen.bench import DOCUMENT_LENGTH
    from flashgen.verify import Shape, random_runtime_inputs, torch_dtype

    module = load_variant(variant)
    dtype = torch_dtype(variant.dtype)
    cases = []
    for n in seqlens:
        b = batch if batch is not None else max(1, 16384 // n)
        gen = torch.Generator(device=device).manual_seed(n)
        q, k, v, do = (
            torch.randn(b, heads, n, variant.head_dim, device=device, dtype=dtype, generator=gen)
            for _ in range(4)
        )
        data = random_runtime_inputs(  # the variant's declared inputs, as the bench draws them
            variant, Shape(b, heads, heads, n, n), device,
            generator=torch.Generator().manual_seed(n), mean_run=DOCUMENT_LENGTH,
        )  # fmt: skip
        o, lse = module.forward(q, k, v, **data)
        cases.append((q, k, v, do, o, lse, data))

    def total(run, name: str, c: LaunchConfig) -> float | None:
        try:
            return sum(timer(lambda case=case: run(*case)) for case in cases)
        except Exception as e:  # does not fit this GPU: not a candidate
            if not _context_alive(device):
                raise _fault(variant, name, c, e) from None
            return None

    def time_forward(c: LaunchConfig, tma: bool | None = None) -> float | None:
        return total(
            lambda q, k, v, do, o, lse, data: module.forward(
                q, k, v, **c.kwargs(), tma=tma, **data
            ),
            "forward",
            c,
        )

    def time_backward(c: LaunchConfig, tma: bool | None = None) -> float | None:
        return total(
            lambda q, k, v, do, o, lse, data: module.backward(
                q, k, v, o, lse, do, **c.kwargs(), tma=tma, **data
            ),
            "backward",
            c,
        )

    timers = {"forward": time_forward, "backward": time_backward}
    candidates = {"forward": forward_candidates, "backward": backward_candidates}
    # (config, TMA on) per pass: the module's own, until a pass is tuned.
    chosen = {
        "forward": (LaunchConfig(*module.GPU_CONFIG), module.GPU_TMA),
        "backward": (LaunchConfig(*module.GPU_BWD_CONFIG), module.GPU_BWD_TMA),
    }
    times: dict[str, dict[LaunchConfig, float]] = {"forward": {}, "backward": {}}
    for name in PASSES:
        if name not in passes:
            continue
        for c in candidates[name]:
            if (t := timers[name](c)) is not None:
                times[name][c] = t
        if not times[name]:
            raise RuntimeError(f"{variant.name}: no {name} candidate configuration ran")
        for config in sorted(times[name], key=times[name].get):
            # Then TMA on and off at the fastest config (one compilation each).
            tma = _faster_tma(lambda tma: timers[name](config, tma))
            try:
                wrong = check_config(variant, module, name, config, tma, device)
            except Exception as e:  # at the check's shapes only
                if not _context_alive(device):
                    raise _fault(variant, name, config, e) from None
                wrong = f"{type(e).__name__}: {e}"
            if wrong is None:
                chosen[name] = (config, tma)
                break
            warn(f"{variant.name}: {name} {astuple(config)} passed over: {wrong}")
        else:
            raise RuntimeError(
                f"{variant.name}: no {name} candidate that ran computed the right answer"
            )
    if device_name is None:
        device_name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    device_name = re.sub(r"[^A-Za-z0-9 _.()+-]", "", device_name)[:64] or "unknown"
    (forward, forward_tma), (backward, backward_tma) = chosen["forward"], chosen["backward"]
    best = Tuning(
        device_name,
        forward,
        backward,
        variant.head_dim,
        variant.dtype.value,
        forward_tma,
        backward_tma,
    )
    return best, times


def check_config(
    variant: ir.Variant,
    module,
    name: str,
    config: LaunchConfig,
    tma: bool | None,
    device: str,
) -> str | None:
    """None if `module`'s pass `name` ("forward" or "backward") at `config` and
    `tma` is right against the float64 reference (`flashgen.verify`'s rule), or
    what was wrong.  At lengths that cross the config's tiles and leave a
    partial last tile, Nq != Nk, two query heads on one kv head (GQA); on a
    GPU also at Nq 1023, Nk 2048 (decision 086's miscompile showed there)."""
    import torch

    from flashgen.bench import DOCUMENT_LENGTH
    from flashgen.verify import Shape, check_backward, check_forward, random_inputs
    from flashgen.verify import random_runtime_inputs, torch_dtype

    lengths = [(2 * config.block_m + 7, 3 * config.block_n - 5)]
    if device == "cuda":
        lengths.append((1023, 2048))
    launch = dict(config.kwargs(), tma=tma)
    for n_queries, n_keys in lengths:
        shape = Shape(1, 2, 1, n_queries, n_keys)
        generator = torch.Generator().manual_seed(n_queries)
        q, k, v = random_inputs(
            shape, variant.head_dim, torch_dtype(variant.dtype), device,
            generator=generator, v_head_dim=variant.v_dim,
        )  # fmt: skip
        data = random_runtime_inputs(  # as the timed cases draw them
            variant, shape, device, generator=generator, mean_run=DOCUMENT_LENGTH
        )
        if name == "forward":
            result = check_forward(variant, module, q, k, v, inputs=data, **launch)
        else:
            result = check_backward(
                variant, module, q, k, v, generator=generator, inputs=data, launch=launch
            )
        if not result.ok:
            bad = ", ".join(
                f"{c.what} off by {c.error:.3g} (bound {c.bound:.3g})"
                for c in result.checks
                if not c.ok
            )
            return f"wrong at {shape}: {bad}"
    return None


def _fault(variant: ir.Variant, name: str, c: LaunchConfig, e: Exception) -> RuntimeError:
    first = str(e).splitlines()[0] if str(e) else ""
    return RuntimeError(
        f"{variant.name}: the {name} candidate {astuple(c)} faulted the GPU "
        f"({type(e).__name__}: {first}); this process's CUDA context is lost, so the "
        "search stops here"
    )


def _context_alive(device: str) -> bool:
    """Whether this process can still use `device` (on a GPU, an illegal
    address or a trap in a kernel loses the whole CUDA context)."""
    import torch

    if device != "cuda":
        return True
    try:
        torch.cuda.synchronize()
        return True
    except Exception:
        return False


def _faster_tma(time: Callable[[bool], float | None]) -> bool | None:
    """True or False, whichever times faster; None if either cannot run
    (no TMA on this GPU): the module keeps its default."""
    on, off = time(True), time(False)
    if on is None or off is None:
        return None
    return on < off
