"""The t5_relative_bias example's gradient of `rel` on the GPU, taken apart.

On 2026-12-04 (812eae1) `test_example_gradients_on_gpu[fp16|bf16-t5_relative_bias]`
failed at B1 H2/1 Nq1023 Nk2048: drel's error was 13.1 (fp16) and 13.7 (bf16)
against bounds of 0.37 and 4.9, while dq, dk and dv matched the float64
reference with the same errors as on the interpreter, and the interpreter's
drel was right at that shape (1.1e-3) with the GPU's tiles (64 x 64 x 4 x 3)
or its own.  The fp32 test (64 x 64 x 4 warps x 2 stages) passed.

Read offline (sm_90a TTGIR of the failing specialization, 2026-12-04), the
dQ loops keep each tile's dS @ K wgmma in flight while the drel sums of the
same tile run (cross-warp reductions through shared memory, and for tiles
near the diagonal a loop over the bucket values the tile holds); the IR's
order and values look right, so the fault is below it or in a launch.
On 2026-12-05 (f55d308), offline: the TTGIR of `_attn_bwd` specialized for
the failing call (Nq 1023, Nk 2048, H2/1, bf16, 64 x 64 x 4 x 3) and for Nq
2048 differ only in the contiguity of the dK/dV programs' lse and delta
loads, so the passing and failing calls run the same dQ code on other data;
and the SASS of the dQ loops (ptxas 12.8 as Triton 3.6 ships it, and 13.0)
writes neither the register operand nor the accumulator of the in-flight
dS @ K wgmma before its wait (a static scan of every path to the wait), so
the known register-reuse miscompile is not visible there.  The kernel spills
1.7 KB at those tiles (none at 32 x 64 x 4 x 3, 188 B at 8 warps).

Two parts, each printing drel's largest error against float64 autograd
through the reference and the ordinary same-dtype implementation's:

1. every shape x launch variation (stages, warps, tiles, direct launches,
   without the log-sum-exp's gradient (the test passes one, as the earlier
   version of this script did not), the same call again (a race shows as
   bits that differ), and modules built with plan knobs: hoist_reads=off
   (no one-element path: every tile sums per bucket value) and
   gather_unpipelined=on (the table's reads out of the software pipeline),
   and the call as the test makes it (attention() and autograd, whose
   backward runs in autograd's thread), with and without the zeroed
   gradient buffers synchronized before the kernel;
2. for the first (failing) shape, the error of each dQ program's slot of
   the gradient buffer (query tile t's sums, against the reference with dO
   zero outside tile t's rows), so the wrong tiles and buckets are named.

    python3 scripts/gpu_t5_gradient.py [fp16|bf16] [--shapes N] [--only NAME ...] [--no-slots]
        [--head-dim D] [--device cpu] [--small]

--head-dim D builds the example at head dim D (default 64): at 128 and the head
dims padded to it (80, 96, 112) its 16-bit backward takes 64 x 128 x 8 x 2
(decisions 086 and 096).

With TRITON_PTXAS_PATH set (and a cache of its own, TRITON_CACHE_DIR), the
same kernels assembled by another ptxas: Triton 3.6 assembles sm_90a with
the CUDA 12.8 ptxas it ships, and later ptxas releases fixed Hopper
miscompiles (an asynchronous wgmma's register operands reused before it read
them: triton-lang/triton#9433, #11781).

Each shape and launch setting compiles kernels of its own (an estimated
10-20 s each on a cold cache, not measured): --shapes 1 first, in a call of
its own; the first shape and part 2 are the ones that matter.

--device cpu --small runs it under the interpreter on tiny shapes (a check
of the script itself).
"""

import argparse
import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from kernel_utils import build, example_variants  # noqa: E402

from flashgen import api, ir  # noqa: E402
from flashgen.experiments import parse_settings  # noqa: E402
from flashgen.reference import attention_ref  # noqa: E402
from flashgen.verify import Shape, random_inputs, random_runtime_inputs  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("dtype", nargs="?", default="fp16", choices=("fp16", "bf16"))
parser.add_argument("--device", default="cuda")
parser.add_argument("--small", action="store_true", help="tiny shapes (the interpreter)")
parser.add_argument("--shapes", type=int, default=None, help="only the first N shapes")
parser.add_argument(
    "--only", action="append", metavar="NAME", help="only these variations (repeatable)"
)
parser.add_argument("--no-slots", action="store_true", help="leave out part 2")
parser.add_argument(
    "--head-dim", type=int, default=64, help="the example at this head dim (default 64)"
)
args = parser.parse_args()
device = args.device

variant = next(v for v in example_variants() if v.name == "t5_relative_bias")
variant = dataclasses.replace(variant, dtype=ir.DType(args.dtype), head_dim=args.head_dim)
module = build(variant)
config = module.GPU_BWD_CONFIG
print(f"t5_relative_bias d{args.head_dim} {args.dtype}: GPU_BWD_CONFIG {config}", flush=True)
if args.small:
    SHAPES = [Shape(1, 2, 1, 47, 160), Shape(1, 2, 1, 64, 64)]
    config = (16, 16, 4, 2)
    VARIATIONS = {
        "as built": {}, "as built, again": {}, "no dlse": {"no dlse": True},
        "1 stage": {"stages": 1}, "hoist_reads=off": {"plan": "hoist_reads=off"},
        "autograd": {"autograd": True},
    }  # fmt: skip
else:
    SHAPES = [
        Shape(1, 2, 1, 1023, 2048),  # the failing case
        Shape(1, 2, 2, 1023, 2048),
        Shape(1, 2, 1, 1024, 2048),
        Shape(1, 2, 1, 1023, 1023),
        Shape(1, 2, 1, 960, 2048),  # whole query tiles, the same offset parity
        Shape(1, 4, 2, 2048, 2048),  # the case that passed
    ]
    VARIATIONS = {
        "as built": {},
        "as built, again": {},
        "no dlse": {"no dlse": True},
        "2 stages": {"stages": 2},
        "1 stage": {"stages": 1},
        "8 warps": {"warps": 8},
        "tiles 32 x 64": {"tiles": (32, 64)},
        "tiles 64 x 32": {"tiles": (64, 32)},
        # Faster d128 candidates (decision 086: the learned decay's backward ran at
        # 168 and 219 TFLOP/s there against 83 at the former rule, 32 x 64 x 8 x 2; both spill).
        "32 x 128 x 8 x 2": {"tiles": (32, 128), "warps": 8, "stages": 2},
        "64 x 128 x 8 x 2": {"tiles": (64, 128), "warps": 8, "stages": 2},
        "through Triton": {"DIRECT_LAUNCH": False},
        # As the test calls it: attention() and autograd, whose backward runs in
        # autograd's own thread; and with the zeroed gradient buffers synchronized
        # before the kernel (a stream-ordering fault would show here).
        "autograd": {"autograd": True},
        "autograd, synced": {"autograd": True, "synced": True},
        "buffers synced": {"synced": True},
        # Modules built with plan knobs: no one-element path (every tile sums
        # per bucket value), and the table's reads kept out of the pipeline.
        "hoist_reads=off": {"plan": "hoist_reads=off"},
        "gather_unpipelined": {"plan": "gather_unpipelined=on"},
    }
SHAPES = SHAPES[: args.shapes]
if args.only:
    VARIATIONS = {name: VARIATIONS[name] for name in args.only}
torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]


def module_for(settings):
    """The example's module, or one built with the variation's plan knob."""
    plan = settings.get("plan")
    return module if plan is None else api.load_variant(variant, parse_settings([plan]))


def kernel_grads(q, k, v, do, dlse, rel, settings, slots=None):
    """drel from module.backward() (float64 on the CPU), given the gradients
    of o and of the log-sum-exp (`dlse`, or None); `slots`, a list, receives
    the gradient buffer (one row per dQ program's slot)."""
    q, k, v, do = (x.to(torch_dtype) for x in (q, k, v, do))
    if settings.get("no dlse"):
        dlse = None
    block_m, block_n = settings.get("tiles", config[:2])
    options = dict(
        block_m=block_m, block_n=block_n, num_warps=settings.get("warps", config[2]),
        num_stages=settings.get("stages", config[3]),
    )  # fmt: skip
    module = module_for(settings)
    saved = {key: getattr(module, key) for key in settings if key.isupper()}
    for key in saved:
        setattr(module, key, settings[key])
    original, allocate = module._input_grads, module._grad_buffers

    def capture(inputs, buffers):
        if slots is not None and buffers:
            slots.append(buffers[0].double().cpu())
        return original(inputs, buffers)

    def synced(*args):
        buffers = allocate(*args)
        if device == "cuda":
            torch.cuda.synchronize()
        return buffers

    module._input_grads = capture
    if settings.get("synced"):
        module._grad_buffers = synced
    try:
        if settings.get("autograd"):
            qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
            r = rel.detach().clone().requires_grad_()
            o, lse = module.attention(qq, kk, vv, rel=r, return_lse=True)
            loss = (o.double() * do.double()).sum()
            if dlse is not None:
                loss = loss + (lse.double() * dlse.double()).sum()
            loss.backward()
            grad = r.grad
        else:
            o, lse = module.forward(q, k, v, rel=rel)
            grad = module.backward(q, k, v, o, lse, do, dlse, rel=rel, **options)[3]
    finally:
        module._input_grads, module._grad_buffers = original, allocate
        for key, value in saved.items():
            setattr(module, key, value)
    return grad.double().cpu()


def reference_grad(q, k, v, do, dlse, rel, dtype):
    """drel of sum(o * do) + sum(lse * dlse) (dlse None: the first term)."""
    qq, kk, vv = (x.detach().to(dtype).requires_grad_() for x in (q, k, v))
    r = rel.detach().clone().requires_grad_()
    o, lse = attention_ref(variant, qq, kk, vv, inputs={"rel": r}, dtype=dtype)
    loss = (o.to(torch.float64) * do.double()).sum()
    if dlse is not None:
        loss = loss + (lse.to(torch.float64) * dlse.double()).sum()
    loss.backward()
    return r.grad.double().cpu()


def report(name, got, ref, ordinary_error):
    error = (got - ref).abs()
    off = (error > 2 * ordinary_error + 1e-3).nonzero().tolist()
    print(
        f"  {name:<16} error {error.max().item():.3e}; elements off (head, bucket): "
        f"{off[:12]}{' ...' if len(off) > 12 else ''}",
        flush=True,
    )
    for h, b in off[:3]:
        print(f"    [{h}, {b}] kernel {got[h, b]:.4f} reference {ref[h, b]:.4f}")


for i, shape in enumerate(SHAPES):
    g = torch.Generator().manual_seed(i)
    q, k, v = random_inputs(shape, variant.head_dim, torch.float32, device, generator=g)
    rel = random_runtime_inputs(variant, shape, device, generator=g)["rel"]
    do = torch.randn(q.shape, generator=g).to(q)
    # The GPU test's loss reads the log-sum-exp too (a random dlse: HAS_DLSE).
    dlse = torch.randn(q.shape[:3], generator=g).to(q)
    q, k, v = (x.to(torch_dtype).float() for x in (q, k, v))  # the same values at both precisions
    ref = reference_grad(q, k, v, do, dlse, rel, torch.float64)
    ordinary = reference_grad(q, k, v, do, dlse, rel, torch_dtype)
    ref_without = reference_grad(q, k, v, do, None, rel, torch.float64)
    ordinary_error = (ordinary - ref).abs().max().item()
    print(f"{shape}: ordinary error {ordinary_error:.3e}", flush=True)
    first = None
    for name, settings in VARIATIONS.items():
        try:
            got = kernel_grads(q, k, v, do, dlse, rel, settings)
        except Exception as e:  # a variation that does not compile is reported, not fatal
            print(f"  {name:<16} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        report(name, got, ref_without if settings.get("no dlse") else ref, ordinary_error)
        if first is None:
            first = got
        elif name == "as built, again" and not torch.equal(first, got):
            diff = (first - got).abs().max().item()
            print(f"  the same call gave other bits: largest difference {diff:.3e}")

    if i or args.no_slots:
        continue
    # Part 2: the failing shape's slots, one per dQ program (query tile of
    # config[1] rows, the launch's block_n).
    slots = []
    kernel_grads(q, k, v, do, dlse, rel, {}, slots)
    buffer = slots[0]  # (query tiles, H, 32): _LEARNABLE_READS says per batch and tile
    rows = config[1]
    tiles = -(-shape.n_queries // rows)
    print(f"  slots: {tuple(buffer.shape)} ({tiles} query tiles of {rows} rows)")
    q_offset = shape.n_keys - shape.n_queries
    for t in range(tiles):
        keep = torch.zeros(shape.n_queries, dtype=torch.bool, device=device)
        keep[t * rows : (t + 1) * rows] = True
        do_t, dlse_t = do * keep[None, None, :, None], dlse * keep
        ref_t = reference_grad(q, k, v, do_t, dlse_t, rel, torch.float64)
        error = (buffer[t] - ref_t).abs()
        worst = error.max().item()
        scale = ref_t.abs().max().item()
        if worst > 1e-2 * max(scale, 1.0):
            bad = (error > 1e-2 * max(scale, 1.0)).nonzero().tolist()
            last_row = min((t + 1) * rows, shape.n_queries) - 1
            print(
                f"  tile {t} (rows {t * rows}..{last_row}, q positions "
                f"{t * rows + q_offset}..{last_row + q_offset}): error {worst:.3e} of "
                f"{scale:.3e}; (head, bucket) {bad[:16]}",
                flush=True,
            )
    print("  (tiles not listed: within 1% of their largest element)", flush=True)
