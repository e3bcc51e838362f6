"""`flashgen bench`: generated kernels side by side with FlexAttention and SDPA.

In: checked `Variant`s and a grid of shapes.  Out: `Measurement`s (one per
variant, shape and system), printed as a table of TFLOP/s and ratios, written
as JSON, and optionally plotted.  Every system runs in this one process on the
same inputs (and the same random values of a spec's declared inputs, integer
ones as documents of DOCUMENT_LENGTH tokens on average); times are medians
of `triton.testing.do_bench` (or, with
timer="cuda-graph", of calls replayed from a CUDA graph: the kernels' own time
without the host's launch cost).

Where FlexAttention's default kernel configuration does not fit the GPU (its
compile fails "out of resource": too much shared memory), it is measured
again with the first of FLEX_FALLBACK_OPTIONS that runs, as its users would
pass `kernel_options`; the measurement's `note`, the table's footnotes and the
records say which options it ran with.

FLOPs count the mask's real density: 4·B·H·Nq·Nk·D·density for the forward and
2.5 times that for the backward (`flop_count`: 2·(D + Dv) and 2·(3D + 2Dv) where
v has its own head dim Dv), whose time is (forward + backward) - forward.
FlexAttention runs the same variant through the `score_mod` / `mask_mod` that
`flashgen.flex` derives from the IR, compiled, with a block mask; SDPA's cuDNN
and flash backends run where the variant is expressible there (plain scores,
full or causal masks).  The outputs of FlexAttention and SDPA are compared with
flashgen's, which cross-checks the semantics as well as the speed.

With do_bench, each system's host time per forward + backward call is
measured too (calls issued without waiting for the GPU): where it reaches the
time measured, the GPU waited for the host, and the table marks the point
"h": its number is the host's pace, not the kernels'
(docs/decisions/019-short-kernels-time-the-host.md; `timer="cuda-graph"`
times the kernels alone).

`append_jsonl` adds the measurements to a results file such as
benchmarks/results.jsonl: one record per system, shape and direction, keyed
by commit, date, GPU and versions (`records` says what each field holds).

`draw_variants` draws specs from the whole language instead of reading them
(`flashgen bench --random N --seed S`): the tests' Hypothesis strategies
(flashgen/strategies.py), drawn so that a seed gives the same specs on every
machine; `flex_ratios` sums a run up as flashgen's speed over FlexAttention's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
import datetime
import functools
import hashlib
import json
import statistics
import subprocess
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from flashgen import display, ir
from flashgen.flex import flex_mods
from flashgen.verify import Shape, random_runtime_inputs, torch_dtype

BACKWARD_FLOP_FACTOR = 2.5
# Declared inputs get random values (`verify.random_runtime_inputs`); integer
# ones run up in steps of 0 or 1, read as document ids they make documents of
# this many tokens on average (packed training data, as issue 21 measures it).
DOCUMENT_LENGTH = 1000
# Max |o_system - o_flashgen| above which the table flags a disagreement: a few
# bf16 ulps of outputs of order 1.
AGREEMENT = 3e-2
# A forward + backward whose host time per call is at least this fraction of
# the time measured for it ran at the host's pace.
HOST_PACED = 0.9
# A drawn spec is redrawn when its mask hides every pair at N = RANDOM_PROBE_N
# with RANDOM_PROBE_HEADS heads (there would be nothing to time), or when
# FlexAttention's mods of it fail there; never more than RANDOM_ATTEMPTS times.
RANDOM_PROBE_N = 512
RANDOM_PROBE_HEADS = 16
RANDOM_ATTEMPTS = 20
# FlexAttention's kernel options (`FlexKernelOptions`, torch/nn/attention/
# flex_attention.py; torch/_inductor/kernel/flex/flex_attention.py applies them):
# an unprefixed key sets both directions' kernels, "fwd_"/"bwd_" one direction's.
# The forward tiles BLOCK_M queries by BLOCK_N keys; the backward BLOCK_M1
# queries by BLOCK_N1 keys for dK and dV, BLOCK_M2 queries by BLOCK_N2 keys for
# dQ, with BLOCK_N1 % BLOCK_M1 == 0 and BLOCK_M2 % BLOCK_N2 == 0, and every
# block dividing the block mask's 128.  Where the default configuration runs
# out of resources (`out_of_resources`), these are tried in turn, each for the
# forward and the backward alike (one flex call serves both, as they are timed
# together): one stage fewer than the defaults' 3 on Hopper (on an H200, the
# T5 bias table's specs asked for 13 KiB more than its 227 KiB in the forward
# at head dim 64, 1 KiB more in the backward at 64 and 128), then 64x64 tiles,
# then 32x64 tiles with no pipelining, the last resort.
FLEX_FALLBACK_OPTIONS: tuple[dict[str, int], ...] = (
    {"num_stages": 2},
    {
        "num_stages": 2,
        "fwd_BLOCK_M": 64,
        "fwd_BLOCK_N": 64,
        "bwd_BLOCK_M1": 64,
        "bwd_BLOCK_N1": 64,
        "bwd_BLOCK_M2": 64,
        "bwd_BLOCK_N2": 64,
    },
    {
        "num_stages": 1,
        "fwd_BLOCK_M": 32,
        "fwd_BLOCK_N": 64,
        "bwd_BLOCK_M1": 32,
        "bwd_BLOCK_N1": 64,
        "bwd_BLOCK_M2": 64,
        "bwd_BLOCK_N2": 32,
    },
)
# Words of an error (any exception in its chain, type names included, case,
# spaces and underscores aside) that say a kernel did not fit: Triton's
# OutOfResources ("out of resource: shared memory, Required: ... Hardware
# limit: ..."), and Inductor's "No valid triton configs" when none of its
# configurations compiled.
OUT_OF_RESOURCES = ("outofresource", "novalidtritonconfigs")


@dataclass(frozen=True)
class Measurement:
    variant: str
    system: str
    batch: int
    heads: int
    seqlen: int
    head_dim: int
    density: float
    fwd_ms: float | None
    bwd_ms: float | None
    max_diff: float | None = None  # against flashgen's output
    error: str = ""
    timer: str = "do_bench"  # a key of TIMERS
    # Host time per forward + backward call, issued without waiting for the
    # GPU (do_bench only), in ms.
    host_ms: float | None = None
    # How the system ran where that differs from its defaults (FlexAttention
    # with FLEX_FALLBACK_OPTIONS); empty otherwise.
    note: str = ""
    # v's (and o's) head dim where it differs from q's (MLA); None: head_dim.
    v_head_dim: int | None = None
    # flashgen's tile plan of a spec whose mask reads runtime data: built once
    # per case outside the timed calls and passed to each ("per batch", as
    # FlexAttention's block mask is), or built inside each call ("per call");
    # None where the module has no plan.  plan_ms: tile_plan()'s own time,
    # by the same timer (per batch only).
    tile_plan: str | None = None
    plan_ms: float | None = None

    def host_paced(self) -> bool:
        """Whether the forward + backward time measured is the host's pace."""
        if self.host_ms is None or self.fwd_ms is None or self.bwd_ms is None:
            return False
        return self.host_ms >= HOST_PACED * (self.fwd_ms + self.bwd_ms)

    def tflops(self, backward: bool = False) -> float | None:
        ms = self.bwd_ms if backward else self.fwd_ms
        if ms is None or ms <= 0:
            return None
        return flop_count(self, backward) / (ms * 1e-3) / 1e12


def flop_count(m: Measurement, backward: bool = False) -> float:
    """The matrix products' FLOPs, at the mask's density: q.k (D) and p.v (Dv)
    forward, 2 B H N^2 (D + Dv); backward q.k again, dP = dO.v (Dv), dV (Dv),
    dQ and dK (D): 2 B H N^2 (3 D + 2 Dv), BACKWARD_FLOP_FACTOR times the
    forward where Dv = D."""
    d, dv = m.head_dim, m.v_head_dim or m.head_dim
    per_pair = (3 * d + 2 * dv) if backward else (d + dv)
    return 2 * m.batch * m.heads * m.seqlen**2 * per_pair * m.density


def density(
    variant: ir.Variant,
    n: int,
    heads: int,
    device,
    batch: int = 1,
    inputs: Mapping[str, torch.Tensor] | None = None,
) -> float:
    """Fraction of visible (query, key) pairs, averaged over heads (and over
    the `batch` examples of `inputs` for a mask that reads runtime data)."""
    mods = flex_mods(variant, n, n, heads, device=device, inputs=inputs)
    if mods.mask_mod is None:
        return 1.0
    keys = torch.arange(n, device=device)[None, :]
    batches = range(batch) if ir.reads_runtime_data(variant.mask) else [0]
    visible = 0
    for b in batches:
        index = torch.tensor(b, device=device)
        for h in range(heads):
            head = torch.tensor(h, device=device)
            for start in range(0, n, 1024):
                rows = torch.arange(start, min(start + 1024, n), device=device)[:, None]
                mask = mods.mask_mod(index, head, rows, keys)  # 0-d when it ignores q, k
                visible += int(torch.broadcast_to(mask, (rows.shape[0], n)).sum())
    return visible / (len(batches) * heads * n * n)


def _sdpa_expressible(variant: ir.Variant) -> bool | None:
    """is_causal for SDPA, or None if SDPA cannot run this variant."""
    if variant.score != ir.IDENTITY_SCORE:
        return None
    if variant.mask == ir.FULL:
        return False
    if variant.mask == ir.Name("causal"):
        return True  # Nq == Nk here, so both alignments agree
    return None


def _do_bench(fn: Callable[[], object]) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=50, rep=200, return_mode="median")


def _host_ms(fn: Callable[[], object], calls: int = 20) -> float:
    """Host time per call of `fn`, calls issued back to back without waiting
    for the GPU (few enough that its launch queue never fills)."""
    fn()
    _synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - start) / calls * 1e3
    _synchronize()
    return host


def _synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _do_bench_graph(fn: Callable[[], object]) -> float:
    import triton.testing

    return triton.testing.do_bench_cudagraph(fn, rep=200, return_mode="median")


# How a call is timed.  "do_bench" (the default) times each call as an eager
# caller sees it, host launch cost included: where a call's kernels are shorter
# than the host's work to issue them, that is what it measures
# (docs/decisions/019-short-kernels-time-the-host.md).  "cuda-graph" replays
# the calls from a CUDA graph: the kernels' own time, for every system alike.
TIMERS: dict[str, Callable[[Callable[[], object]], float]] = {
    "do_bench": _do_bench,
    "cuda-graph": _do_bench_graph,
}
# Where a module's tile plan is built in a timed call (`bench`'s tile_plan).
TILE_PLANS = ("per-batch", "per-call")


def bench(
    variants: Sequence[ir.Variant],
    *,
    seqlens: Sequence[int] = (1024, 2048, 4096, 8192, 16384),
    batch: int | None = None,
    heads: int = 16,
    head_dim: int | None = None,
    device: str = "cuda",
    timer: str | Callable[[Callable[[], object]], float] = "do_bench",
    compile_flex: bool = True,
    systems: Sequence[str] = ("flashgen", "flex", "sdpa-cudnn", "sdpa-flash"),
    progress: bool = True,
    experiments: Mapping[str, object] | None = None,
    document_length: float = DOCUMENT_LENGTH,
    on_result: Callable[[Measurement], None] | None = None,
    tile_plan: str = "per-batch",
) -> list[Measurement]:
    """Time every variant at every sequence length on every system.

    `on_result` is called with each measurement as soon as it is taken (the
    CLI appends it to --jsonl then, so a run cut short keeps what it measured).

    `experiments` sets plan knobs of flashgen's modules (flashgen/experiments.py).
    Integer inputs run up in steps of 0 or 1, a new value every
    `document_length` tokens on average (documents, read as ids).

    `batch=None` keeps B·N at 16384 tokens (B = 16384 // N, at least 1), the
    anchors' convention.  `head_dim` overrides the specs' head dims.  `timer`
    names one of TIMERS, or is a function that times a call (in ms).
    `progress` shows each case on stderr as it runs (`display.Progress`: a
    live bar on a terminal, a plain line per case elsewhere).

    `tile_plan`, for a module whose mask reads runtime data (it has
    `tile_plan()`, decision 058): "per-batch" builds the plan once per case,
    outside the timed calls, and passes it to each, as FlexAttention's block
    mask is built once and passed (both serve every layer of a batch); its
    own time is measured apart (`Measurement.plan_ms`).  "per-call": every
    timed call builds its own, as a call without plan= does.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from flashgen.api import load_variant

    if tile_plan not in TILE_PLANS:
        raise ValueError(f"tile_plan must be one of {', '.join(TILE_PLANS)}, got {tile_plan!r}")
    if isinstance(timer, str):
        if timer not in TIMERS:
            raise ValueError(f"timer must be one of {', '.join(TIMERS)}, got {timer!r}")
        timer_name, timer = timer, TIMERS[timer]
    else:
        timer_name = getattr(timer, "__name__", "custom")
    sdpa_backends = {
        "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
        "sdpa-flash": SDPBackend.FLASH_ATTENTION,
    }
    results: list[Measurement] = []
    total = len(variants) * len(seqlens) * len(systems)
    with display.Progress(total, enabled=progress) as bar:
        for variant in variants:
            if head_dim is not None:
                variant = dataclasses.replace(variant, head_dim=head_dim)
            module = load_variant(variant, experiments)
            dtype = torch_dtype(variant.dtype)
            scale = variant.scale if variant.scale is not None else variant.head_dim**-0.5
            for n in seqlens:
                b = batch if batch is not None else max(1, 16384 // n)
                # v and dO have v_head_dim (MLA), q and k head_dim.
                shapes = [(b, heads, n, d) for d in (variant.head_dim,) * 2 + (variant.v_dim,) * 2]
                gen = torch.Generator(device=device).manual_seed(n)
                q, k, v, do = (
                    torch.randn(shape, device=device, dtype=dtype, generator=gen)
                    for shape in shapes
                )
                data = random_runtime_inputs(
                    variant, Shape(b, heads, heads, n, n), device,
                    generator=torch.Generator().manual_seed(n), mean_run=document_length,
                )  # fmt: skip
                # Learnable inputs require grad in both systems (Flex captures them).
                learned = [data[i.name].requires_grad_() for i in variant.inputs if i.learnable]
                frac = density(variant, n, heads, device, b, data)
                mods = flex_mods(variant, n, n, heads, device=device, inputs=data)
                is_causal = _sdpa_expressible(variant)
                reference = None
                for system in systems:
                    label = f"{variant.name} N={n} {system}"
                    if system not in ("flashgen", "flex") and is_causal is None:
                        bar.advance(label + ": not expressible")
                        continue
                    bar.start(label + ": compiling and timing")
                    measure = functools.partial(
                        _measure, variant.name, system, q=q, k=k, v=v, do=do, frac=frac,
                        timer=timer, reference=reference, timer_name=timer_name, learned=learned,
                    )  # fmt: skip
                    if system == "flashgen":
                        fn, planned = _flashgen_call(module, tile_plan, q, k, v, data)
                        measure = functools.partial(measure, **planned)
                    elif system == "flex":
                        # One block mask for all heads unless the mask reads `h`.
                        mask_heads = heads if ir.mentions(variant.mask, frozenset({"h"})) else None
                        mask_batch = b if ir.reads_runtime_data(variant.mask) else None
                        block_mask = (
                            create_block_mask(
                                mods.mask_mod, mask_batch, mask_heads, n, n, device=device
                            )
                            if mods.mask_mod
                            else None
                        )

                        def flex_fn(options, block_mask=block_mask, mods=mods, scale=scale):
                            flex = flex_attention
                            if compile_flex:
                                # A fresh compilation per case (and per kernel
                                # options tried): each case's mods and shape
                                # recompile flex_attention, and past
                                # torch._dynamo's recompile limit (8) it would run
                                # uncompiled (docs/decisions/016-warp-specialized-gluon-forward.md).
                                torch._dynamo.reset()
                                flex = torch.compile(flex_attention, dynamic=False)
                            extra = {} if options is None else {"kernel_options": options}
                            return functools.partial(
                                flex, score_mod=mods.score_mod, block_mask=block_mask,
                                scale=scale, **extra,
                            )  # fmt: skip

                    else:
                        backend = sdpa_backends[system]

                        def fn(a, b_, c, backend=backend):
                            with sdpa_kernel(backend):
                                return torch.nn.functional.scaled_dot_product_attention(
                                    a, b_, c, is_causal=is_causal, scale=scale
                                )

                    if system == "flex":
                        measured = _measure_flex(flex_fn, measure)
                    else:
                        measured = measure(fn)
                    results.append(measured)
                    if on_result is not None:
                        on_result(measured)
                    if system == "flashgen" and not measured.error:
                        reference = fn(q, k, v).detach()
                    bar.advance(label)
    return results


def _flashgen_call(module, tile_plan: str, q, k, v, data: dict) -> tuple[Callable, dict]:
    """flashgen's call on a case, and `_measure`'s arguments for its tile plan
    (`bench`'s `tile_plan`): none for a module without one."""
    if not hasattr(module, "tile_plan"):
        return (lambda a, b_, c: module.attention(a, b_, c, **data)), {}
    if tile_plan == "per-call":
        return (lambda a, b_, c: module.attention(a, b_, c, **data)), {"tile_plan": "per call"}
    fn = lambda a, b_, c, plan=None: module.attention(a, b_, c, plan=plan, **data)  # noqa: E731
    return fn, {"tile_plan": "per batch", "plan": lambda: module.tile_plan(q, k, v, **data)}


def _measure(
    name,
    system,
    fn,
    q,
    k,
    v,
    do,
    frac,
    timer,
    reference,
    timer_name="do_bench",
    learned=(),
    reraise: Callable[[BaseException], bool] | None = None,
    tile_plan: str | None = None,
    plan: Callable[[], object] | None = None,
) -> Measurement:
    """Forward and forward + backward times of `fn` on q, k, v; the backward
    also takes the gradients of the `learned` tensors that `fn` reads.  An
    error is reported in the measurement, unless `reraise` says to raise it.
    `plan` builds a tile plan, once, untimed, for `fn(q, k, v, plan)` (then
    timed alone: `plan_ms`); `tile_plan` says how the plan was built."""
    b, h, n, d = q.shape
    base = dict(variant=name, system=system, batch=b, heads=h, seqlen=n, head_dim=d, density=frac)
    if v.shape[-1] != d:
        base["v_head_dim"] = v.shape[-1]
    base["timer"] = timer_name
    inputs = [x.detach().requires_grad_() for x in (q, k, v)]
    diff = fwd = bwd = host = plan_ms = None
    error = ""
    try:  # a system that cannot run a case is reported, not fatal
        if plan is not None:
            fn = functools.partial(fn, plan=plan())
            plan_ms = timer(plan)
        with torch.no_grad():
            out = fn(q, k, v)
        if reference is not None:
            diff = (out.float() - reference.float()).abs().max().item()
        leaves = [*inputs, *learned]
        # One forward + backward before any timing: every kernel is compiled,
        # and a module's compile ahead (which the first forward with a
        # gradient starts in worker threads that take the GIL for stretches)
        # has finished, rather than slowing the forward's timed calls.
        torch.autograd.grad(fn(*inputs), leaves, do)
        fwd = timer(lambda: fn(*inputs))
        both = timer(lambda: torch.autograd.grad(fn(*inputs), leaves, do))
        bwd = max(both - fwd, 0.0)
        if timer_name == "do_bench":
            host = _host_ms(lambda: torch.autograd.grad(fn(*inputs), leaves, do))
    except Exception as exc:
        if reraise is not None and reraise(exc):
            raise
        error = f"{type(exc).__name__}: {exc}"[:200]
    return Measurement(
        **base, fwd_ms=fwd, bwd_ms=bwd, max_diff=diff, error=error, host_ms=host,
        tile_plan=tile_plan, plan_ms=plan_ms,
    )  # fmt: skip


def out_of_resources(exc: BaseException) -> bool:
    """Whether `exc` says that a kernel did not fit the GPU (OUT_OF_RESOURCES
    anywhere in its chain of causes)."""
    seen: list[BaseException] = []
    while exc is not None and all(exc is not e for e in seen):
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    text = " ".join(f"{type(e).__name__} {e}" for e in seen).lower()
    text = text.replace(" ", "").replace("_", "")
    return any(words in text for words in OUT_OF_RESOURCES)


def _kernel_options_text(options: Mapping[str, int]) -> str:
    return "kernel_options=" + json.dumps(dict(options))


def _measure_flex(
    flex_fn: Callable[[dict[str, int] | None], Callable],
    measure: Callable[..., Measurement],
) -> Measurement:
    """FlexAttention measured (`measure(fn, reraise=...)`, as `_measure`) with
    `flex_fn(None)`, its default kernel options, or where those run out of
    resources, with `flex_fn(options)` for the first of FLEX_FALLBACK_OPTIONS
    that does not: each try measures the forward and the backward anew, with
    the same options.  Errors of another kind are reported at once, as for any
    system, and so is the last try's.  The measurement's `note` names the
    options it ran with, and what ran out of resources before (empty for the
    defaults)."""
    tries: list[dict[str, int] | None] = [None, *FLEX_FALLBACK_OPTIONS]
    for i, options in enumerate(tries):
        last = i == len(tries) - 1
        fn = flex_fn(options)
        try:
            measured = measure(fn, reraise=None if last else out_of_resources)
        except Exception as exc:
            if not out_of_resources(exc):
                raise
            continue  # the next, smaller options
        if options is None:
            return measured
        smaller = f" and {i - 1} smaller set{'s' if i > 2 else ''}" if i > 1 else ""
        earlier = f"the default kernel options{smaller}"
        note = f"{earlier} ran out of resources; ran with {_kernel_options_text(options)}"
        return dataclasses.replace(measured, note=note)
    raise AssertionError("unreachable: the last try reports its error")


def table(results: Sequence[Measurement]) -> str:
    """TFLOP/s per system and flashgen's ratio to FlexAttention and cuDNN.

    A title line, then one row per spec, head dim and N: each system's cell
    is forward/backward TFLOP/s with a mark ("!": its output differs from
    flashgen's by more than AGREEMENT; "h": host-paced), each ratio cell
    flashgen's TFLOP/s over the other's, forward/backward; footnotes follow,
    among them each measurement's note (FlexAttention's kernel options where
    its defaults ran out of resources) and error.
    """
    rows = {}
    for r in results:
        rows.setdefault((r.variant, r.head_dim, r.seqlen), {})[r.system] = r
    systems = ["flashgen", "flex", "sdpa-cudnn", "sdpa-flash"]
    timers = ", ".join(sorted({r.timer for r in results}))

    # Cells of one width, so that the slashes line up down a column.
    def cell(r: Measurement | None) -> str:
        if r is None:
            return f"{'-':>13}"
        if r.error:
            return f"{'error':>13}"
        mark = "!" if r.max_diff is not None and r.max_diff > AGREEMENT else ""
        mark = mark or ("h" if r.host_paced() else "")
        fwd, bwd = r.tflops(), r.tflops(True)  # None for a time of 0 (below the timer's noise)
        fwd = f"{fwd:6.0f}" if fwd is not None else f"{'-':>6}"
        bwd = f"{bwd:5.0f}" if bwd is not None else f"{'-':>5}"
        return f"{fwd}/{bwd}{mark:1}"

    def ratio(a: Measurement | None, b: Measurement | None) -> str:
        if a is None or b is None or a.error or b.error:
            return f"{'-':>13}"
        parts = []
        for backward, width in ((False, 6), (True, 5)):
            x = speedup(a, b, backward)
            parts.append(f"{x:{width}.2f}" if x is not None else f"{'-':>{width}}")
        return f"{parts[0]}/{parts[1]} "

    columns = [
        display.Column("variant"),
        display.Column("d", "right"),
        display.Column("N", "right"),
        *(display.Column(s, "right", fixed_width=True) for s in systems),
        display.Column("vs flex", "right", fixed_width=True),
        display.Column("vs cudnn", "right", fixed_width=True),
    ]
    cells = []
    for (name, d, n), by_system in rows.items():
        ours = by_system.get("flashgen")
        cells.append(
            [name, str(d), str(n), *(cell(by_system.get(s)) for s in systems)]
            + [ratio(ours, by_system.get("flex")), ratio(ours, by_system.get("sdpa-cudnn"))]
        )
    lines = [f"TFLOP/s forward / backward (timer: {timers})", display.table(columns, cells)]
    if any(r.max_diff is not None and r.max_diff > AGREEMENT for r in results):
        lines.append(f"! output differs from flashgen's by more than {AGREEMENT}")
    if any(r.host_paced() for r in results):
        lines.append(
            "h forward + backward ran at the host's pace (host time per call >= "
            f"{HOST_PACED:.0%} of the time measured): the numbers are the host's, "
            "not the kernels' (--timer cuda-graph times the kernels)"
        )
    for r in results:
        if r.plan_ms is not None and r.fwd_ms:
            lines.append(
                f"plan: {r.variant} N={r.seqlen} {r.system}: tile plan built once per batch, "
                f"outside the timed calls (as FlexAttention's block mask): {r.plan_ms:.3f} ms, "
                f"{r.plan_ms / r.fwd_ms:.1%} of a forward"
            )
        if r.note:
            lines.append(f"note: {r.variant} N={r.seqlen} {r.system}: {r.note}")
        if r.error:
            lines.append(f"error: {r.variant} N={r.seqlen} {r.system}: {r.error}")
    return "\n".join(lines)


def speedup(ours: Measurement | None, other: Measurement | None, backward: bool) -> float | None:
    """`ours`' TFLOP/s over `other`'s in one direction; None where either did
    not run, failed, or has no TFLOP/s (no time, or a mask that hides every pair)."""
    if ours is None or other is None or ours.error or other.error:
        return None
    x, y = ours.tflops(backward), other.tflops(backward)
    return x / y if x is not None and y else None


def flex_ratios(results: Sequence[Measurement]) -> str:
    """flashgen's TFLOP/s over FlexAttention's, forward and backward, per spec,
    head dim and N, then the median and the minimum of each column over the
    points that have both (issue 23's target for drawn specs: every point at
    least 1.0, the median at least 1.3; reported, not enforced)."""
    points: dict[tuple, dict[str, Measurement]] = {}
    for r in results:
        points.setdefault((r.variant, r.head_dim, r.seqlen), {})[r.system] = r
    columns: tuple[list, list] = ([], [])
    rows = []
    # Cells of one width (a ratio and a slot for the mark h), as in `table`.
    for (name, d, n), by_system in points.items():
        ours, flex = by_system.get("flashgen"), by_system.get("flex")
        paced = any(r is not None and r.host_paced() for r in (ours, flex))
        cells = []
        for backward, column in zip((False, True), columns):
            x = speedup(ours, flex, backward)
            if x is None:
                cells.append(f"{'-':>8} ")
                continue
            column.append((x, f"{name} d{d} N={n}"))
            cells.append(f"{x:8.2f}{'h' if paced else ' '}")
        rows.append([name, str(d), str(n), *cells])
    for label, pick in (("median", statistics.median), ("minimum", min)):
        cells = [f"{pick(x for x, _ in c):8.2f} " if c else f"{'-':>8} " for c in columns]
        rows.append([label, "", "", *cells])
    header = [
        display.Column("spec"),
        display.Column("d", "right"),
        display.Column("N", "right"),
        display.Column("forward", "right", fixed_width=True),
        display.Column("backward", "right", fixed_width=True),
    ]
    lines = [
        "flashgen / FlexAttention, TFLOP/s (target: every point >= 1.00, median >= 1.30)",
        display.table(header, rows),
    ]
    lowest = [f"{w} {min(c)[1]}" for w, c in zip(("forward", "backward"), columns) if c]
    lines.append(
        f"{len(columns[0])} forward and {len(columns[1])} backward ratios over {len(points)} "
        f"points{'; lowest: ' + ', '.join(lowest) if lowest else ''}"
    )
    if any(len(c) < len(points) for c in columns):
        lines.append("- no ratio: flashgen or FlexAttention was not timed there, or failed")
    if any(r.host_paced() for r in results):
        lines.append("h forward + backward ran at the host's pace (see the table above)")
    noted = sum(1 for r in results if r.system == "flex" and r.note)
    if noted:
        lines.append(
            f"FlexAttention ran with smaller kernel_options than its defaults at {noted} "
            "point(s) (the table's notes say where and which)"
        )
    return "\n".join(lines)


def to_json(results: Sequence[Measurement], drawn: Mapping[str, Drawn] | None = None) -> str:
    """Every measurement with its TFLOP/s; those of drawn specs (`drawn`, by
    block name) with `random`, as in `records`."""
    rows = []
    for r in results:
        row = dataclasses.asdict(r)
        row["fwd_tflops"], row["bwd_tflops"] = r.tflops(), r.tflops(True)
        if drawn and r.variant in drawn:
            row["random"] = drawn[r.variant].record(r.head_dim)
        rows.append(row)
    return json.dumps(rows, indent=2)


def plot(results: Sequence[Measurement], path: str) -> None:
    """TFLOP/s against sequence length, one panel per variant and pass."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({(r.variant, r.head_dim) for r in results})
    fig, axes = plt.subplots(len(names), 2, figsize=(10, 3 * len(names)), squeeze=False)
    for row, (name, d) in enumerate(names):
        for col, backward in enumerate((False, True)):
            ax = axes[row][col]
            for system in sorted({r.system for r in results}):
                points = [
                    (r.seqlen, r.tflops(backward))
                    for r in results
                    if (r.variant, r.head_dim, r.system) == (name, d, system) and not r.error
                ]
                if points:
                    ax.plot(*zip(*sorted(points)), marker="o", label=system)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{name} d={d} {'backward' if backward else 'forward'}")
            ax.set_xlabel("sequence length")
            ax.set_ylabel("TFLOP/s")
            ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)


def spec_hash(variant: ir.Variant) -> str:
    """First 16 hex digits of the SHA-256 of the block in normal form (as
    benched: after any head-dim override), so that two results files name the
    same spec alike whatever its file looked like."""
    from flashgen.printer import print_variant

    return hashlib.sha256(print_variant(variant).encode()).hexdigest()[:16]


def run_context(command: str) -> dict:
    """The fields every record of one run shares: commit (short hash of HEAD
    when run in a git checkout, else None; `note` says when the working tree
    differs from it), date (UTC), GPU name, Triton and torch versions, and the
    command line."""
    import triton

    commit, note = None, None
    try:
        commit = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
            ).stdout.strip()
            or None
        )
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if commit and changed:
            note = "working tree differs from the commit"
    except (OSError, subprocess.CalledProcessError):
        pass
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return dict(
        commit=commit,
        date=datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
        run=None,
        gpu=gpu,
        triton=triton.__version__,
        torch=torch.__version__,
        command=command,
        note=note,
    )


def records(
    results: Sequence[Measurement],
    variants: Sequence[ir.Variant],
    context: dict,
    drawn: Mapping[str, Drawn] | None = None,
) -> list[dict]:
    """Two records per measurement, as in benchmarks/results.jsonl.

    Every record: the `context` fields (commit, date, run, gpu, triton,
    torch, command, note; the note followed by the measurement's own, after a
    "; ", where it has one: FlexAttention's kernel options), spec (block
    name), spec_hash, the shape B, H, Hkv, Nq, Nk, D, dtype, system, timer,
    density and error (None when it ran).
    flashgen's records of a module with a tile plan also hold tile_plan ("per
    batch" or "per call") and plan_ms (tile_plan()'s time, per batch only).
    direction "fwd": ms (forward time), tflops, max_diff (against flashgen's
    output).  direction "fwd+bwd": ms (forward + backward), bwd_ms (the
    backward's share: that minus the forward), bwd_tflops (the backward's
    TFLOP/s, as the table prints), host_ms and host_paced (do_bench only).
    `variants` are the benched blocks (after any head-dim override): they give
    each measurement's dtype and spec_hash, matched by name and head dim.
    Records of drawn specs (`drawn`, by block name: `flashgen bench --random`)
    end with random: {seed, index, text}, where text is the block as benched,
    so that a record names its spec without the run that drew it.
    """
    by_key = {(v.name, v.head_dim): v for v in variants}
    out = []
    for r in results:
        variant = by_key[(r.variant, r.head_dim)]
        base = dict(
            commit=context["commit"],
            date=context["date"],
            run=context["run"],
            gpu=context["gpu"],
            triton=context["triton"],
            torch=context["torch"],
            spec=r.variant,
            spec_hash=spec_hash(variant),
            B=r.batch,
            H=r.heads,
            Hkv=r.heads,  # the bench's K and V have as many heads as Q
            Nq=r.seqlen,
            Nk=r.seqlen,
            D=r.head_dim,
            dtype=variant.dtype.value,
            system=r.system,
            timer=r.timer,
            density=r.density,
            command=context["command"],
        )
        if r.tile_plan is not None:
            base.update(tile_plan=r.tile_plan, plan_ms=r.plan_ms)
        error = r.error or None
        # The run's note, then the measurement's (FlexAttention's kernel options).
        note = "; ".join(n for n in (context["note"], r.note) if n) or None
        both = r.fwd_ms + r.bwd_ms if r.fwd_ms is not None and r.bwd_ms is not None else None
        host_paced = r.host_paced() if r.host_ms is not None else None
        out.append(
            dict(
                base,
                direction="fwd",
                ms=r.fwd_ms,
                tflops=r.tflops(),
                max_diff=r.max_diff,
                error=error,
                note=note,
            )
        )
        out.append(
            dict(
                base,
                direction="fwd+bwd",
                ms=both,
                bwd_ms=r.bwd_ms,
                bwd_tflops=r.tflops(True),
                host_ms=r.host_ms,
                host_paced=host_paced,
                error=error,
                note=note,
            )
        )
        if drawn and r.variant in drawn:
            for record in out[-2:]:
                record["random"] = drawn[r.variant].record(r.head_dim)
    return out


def append_jsonl(
    path: str,
    results: Sequence[Measurement],
    variants: Sequence[ir.Variant],
    context: dict,
    drawn: Mapping[str, Drawn] | None = None,
) -> None:
    """Append `records(...)` to `path`, one JSON object a line."""
    with open(path, "a", encoding="utf-8") as f:
        for record in records(results, variants, context, drawn):
            f.write(json.dumps(record) + "\n")


# --------------------------------------------------------------------------- #
# Drawn specs: flashgen bench --random
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class Drawn:
    """Spec `index` of `seed` (`draw_variants`), after the earlier draws for
    it were rejected, one reason each in `redrawn`."""

    variant: ir.Variant
    seed: int
    index: int
    redrawn: tuple[str, ...] = ()

    def record(self, head_dim: int) -> dict:
        """The `random` field of its records: seed, index and the spec's text at `head_dim`."""
        from flashgen.printer import print_variant

        text = print_variant(dataclasses.replace(self.variant, head_dim=head_dim))
        return {"seed": self.seed, "index": self.index, "text": text}


def draw_variants(
    count: int, seed: int, head_dim: int, dtype: ir.DType = ir.DType.BF16
) -> list[Drawn]:
    """Specs 0 to count - 1 of `seed`: `flashgen.strategies.variants` at
    `head_dim` and `dtype` (every mask and score form of the language, no
    inputs), named rand<seed>_<index>.  Neither `head_dim` nor `dtype` changes
    the rest of a spec.

    Draw `attempt` of spec `index` is `seeded_example` for the key
    "bench-random:<seed>:<index>:<attempt>": the same on every machine, and
    independent of `count` (spec 2 of seed 0 is the same in a run of 3 and a
    run of 30).  Attempts run from 0 until one passes `unbenchable`.  Needs
    hypothesis (the test extra).
    """
    from hypothesis import strategies as st

    from flashgen.strategies import seeded_example, variants

    drawn = []
    for index in range(count):
        name = f"rand{seed}_{index}"
        strategy = variants((dtype,), (head_dim,), names=st.just(name))
        redrawn: list[str] = []
        for attempt in range(RANDOM_ATTEMPTS):
            variant = seeded_example(strategy, f"bench-random:{seed}:{index}:{attempt}")
            problem = unbenchable(variant)
            if problem is None:
                drawn.append(Drawn(variant, seed, index, tuple(redrawn)))
                break
            redrawn.append(problem)
        else:
            raise RuntimeError(f"{name}: {RANDOM_ATTEMPTS} draws, none benchable: {redrawn[-1]}")
    return drawn


def unbenchable(variant: ir.Variant) -> str | None:
    """Why a drawn spec is not benched beside FlexAttention, or None: it reads
    inputs, its printed text does not check back to it, FlexAttention's mods
    of it fail at N = RANDOM_PROBE_N on the CPU, or its mask hides every pair there."""
    from flashgen.check import check
    from flashgen.parse import parse
    from flashgen.printer import print_variant

    if variant.inputs:
        return "it reads runtime inputs"
    text = print_variant(variant)
    spec, diagnostics = parse(text)
    again, diagnostics = check([spec]) if spec is not None and not diagnostics else ((), [])
    errors = [d for d in diagnostics if d.severity == "error"]  # a warning: the mask test below
    if again != (variant,) or errors or print_variant(again[0]) != text:
        return "its printed text does not check back to it"
    n, heads = RANDOM_PROBE_N, RANDOM_PROBE_HEADS
    try:
        mods = flex_mods(variant, n, n, heads, device="cpu")
        if mods.score_mod is not None:  # the mask_mod runs in `density`
            rows, keys = torch.arange(0, n, 8)[:, None], torch.arange(0, n, 8)[None, :]
            scores = torch.zeros(rows.shape[0], keys.shape[1])
            for h in range(heads):
                mods.score_mod(scores, torch.tensor(0), torch.tensor(h), rows, keys)
        visible = density(variant, n, heads, "cpu")
    except Exception as exc:  # a spec flex.py cannot translate: drawn again, and said so
        return f"FlexAttention's mods of it fail ({type(exc).__name__}: {exc})"[:200]
    if visible == 0:
        return f"its mask hides every pair at N={n}, H={heads}"
    return None


def describe_drawn(drawn: Sequence[Drawn]) -> str:
    """The drawn specs as one .attn text, each block under a comment that
    says where it comes from and why earlier draws were redrawn."""
    from flashgen.printer import print_variant

    blocks = []
    for d in drawn:
        lines = [f"# {d.variant.name}: seed {d.seed}, index {d.index}"]
        lines += [f"# draw {i} redrawn: {why}" for i, why in enumerate(d.redrawn)]
        lines.append(print_variant(d.variant))
        blocks.append("\n".join(lines))
    return "\n".join(blocks)
