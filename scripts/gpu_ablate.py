"""Ablations on a GPU: what one change to a generated module costs or buys.

Each experiment renders a spec's module, applies literal text edits to the
source (a stand-in for a template change not yet made), checks the edited
module against float32 dense attention and times its forward and backward
next to the unedited module, in one process on the same inputs.  An edit
whose text is not found is an error, so a stale experiment cannot time the
unedited module by mistake.

    python3 scripts/gpu_ablate.py [--only NAME...] [--seqlen 4096] [--head-dim 128]

Prints one line per experiment and writes $OUT/ablate.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import time

import torch
import triton

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.dirname(__file__))
from gpu_sweep import dense_check  # noqa: E402

from flashgen import api, bench, ir  # noqa: E402
from flashgen.emit import render_module  # noqa: E402
from flashgen.verify import torch_dtype  # noqa: E402

# name -> (spec path, [(old, new), ...], head dim).  The empty edit list is
# the baseline.
EXPERIMENTS: dict[str, tuple[str, list[tuple[str, str]], int]] = {}


def experiment(name: str, spec: str, *edits: tuple[str, str], head_dim: int = 128) -> None:
    """Register an experiment, run at `head_dim` unless --head-dim says otherwise."""
    EXPERIMENTS[name] = (spec, list(edits), head_dim)


def experiment_source(name: str, head_dim: int | None = None) -> tuple[ir.Variant, str]:
    """The variant and the edited module source of an experiment."""
    path, edits, default_head_dim = EXPERIMENTS[name]
    with open(os.path.join(ROOT, path)) as f:
        (variant,) = api.check_sources({path: f.read()})[0]
    variant = dataclasses.replace(variant, head_dim=head_dim or default_head_dim)
    return variant, edited_source(variant, edits)


def ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


@functools.lru_cache(maxsize=None)
def _rendered(variant: ir.Variant) -> str:
    """The module at `lower`'s default configs: experiments edit those, not a
    spec's tuning sidecar (`flashgen tune` measured the sidecars)."""
    return render_module(variant, None)


def edited_source(variant, edits) -> str:
    source = _rendered(variant)
    for old, new in edits:
        if old not in source:
            raise ValueError(f"edit target not found: {old[:60]!r}")
        source = source.replace(old, new)
    return source


def kernel_resources(module) -> dict[str, list[int]]:
    """Registers per thread and spilled bytes of each compiled kernel of
    `module`: a change in speed that these explain needs no other story."""
    found = {}
    for name in (
        "_attn_fwd",
        "_attn_bwd_preprocess",
        "_attn_bwd",
        "_gluon_attn_fwd",
        "_gluon_attn_bwd_dkdv",
        "_gluon_attn_bwd_dq",
    ):
        fn = getattr(module, name, None)
        for cache in getattr(fn, "device_caches", {}).values():
            for compiled in cache[0].values():
                try:
                    compiled._init_handles()
                    found[name] = [compiled.n_regs, compiled.n_spills]
                except Exception:  # noqa: BLE001 - a record, not a check
                    pass
    return found


def run(name: str, head_dim: int | None, n: int, heads: int) -> dict:
    result = {"experiment": name, "n": n}
    try:
        variant, source = experiment_source(name, head_dim)
        result.update(spec=variant.name, head_dim=variant.head_dim)
        module = api._import(variant.name, source)
    except Exception as e:  # noqa: BLE001
        return dict(result, error=f"{type(e).__name__}: {e}"[:300])
    head_dim = variant.head_dim
    dtype = torch_dtype(variant.dtype)
    batch = max(1, 16384 // n)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (
        torch.randn(batch, heads, n, head_dim, device="cuda", dtype=dtype, generator=gen)
        for _ in range(4)
    )
    flops = 4 * batch * heads * n * n * head_dim * bench.density(variant, n, heads, "cuda")
    try:
        result["errors"] = dense_check(variant, module, q, k, v, do)
        o, lse = module.forward(q, k, v)
        fwd = ms(lambda: module.forward(q, k, v))
        bwd = ms(lambda: module.backward(q, k, v, o, lse, do))
        result["tflops"] = (flops / fwd / 1e9, 2.5 * flops / bwd / 1e9)
        result["kernels"] = kernel_resources(module)
    except Exception as e:  # noqa: BLE001
        result["error"] = f"{type(e).__name__}: {e}"[:300]
    return result


# --------------------------------------------------------------------------- #
# The experiments
# --------------------------------------------------------------------------- #

# Session 3's first run measured edits that are now in the templates (empty
# gradients, no tile test in dense edge loops, tight prefix rows, ALiBi
# without abs); BENCHMARKS.md has those numbers.  The baselines are the
# current modules; `bwd-ptr` is the backward's pointer loads instead of TMA.
EXAMPLES = (
    "full",
    "plain_causal",
    "mistral_sliding",
    "gemma2_local",
    "bloom_alibi",
    "prefix_lm",
    "llama4_local",
    "encoder_band",
)
for spec in EXAMPLES:
    experiment(spec, f"examples/{spec}.attn")
    experiment(
        f"{spec} bwd-ptr", f"examples/{spec}.attn", ("GPU_BWD_TMA = True", "GPU_BWD_TMA = False")
    )


def set_config(constant: str, current, new) -> tuple[str, str]:
    """An edit that changes a module's launch config (GPU_CONFIG or
    GPU_BWD_CONFIG) from `current` to `new`."""
    return f"{constant} = {current}", f"{constant} = {new}"


# The backward config of every 16-bit example at d128.
BWD_D128 = (64, 128, 8, 3)

# Softcap experiments of sessions 3 and 4 (the hardware tanh.approx, tanh
# without the small-|x| polynomial, now the 16-bit template's) are in
# BENCHMARKS.md, entries 6 and 8.

# Forward at d128 against cuDNN: TMA loads, then Triton's Hopper warp
# specialization on the interior loop (it needs descriptor loads).
FORWARD_TMA = ("GPU_TMA = False", "GPU_TMA = True")
FORWARD_WS = (
    "for start_n in range(mid_lo, mid_hi, BLOCK_N):\n        acc, l_i, m_i = _attn_fwd_tile(",
    "for start_n in tl.range(mid_lo, mid_hi, BLOCK_N, warp_specialize=True):\n"
    "        acc, l_i, m_i = _attn_fwd_tile(",
)
for spec in ("full", "plain_causal"):
    experiment(f"{spec} tma", f"examples/{spec}.attn", FORWARD_TMA)
    experiment(f"{spec} tma+ws", f"examples/{spec}.attn", FORWARD_TMA, FORWARD_WS)


def forward_config(spec: str, config: tuple[int, int, int, int]) -> tuple[str, str]:
    """An edit that sets the forward config of full or plain_causal at d128."""
    current = {"full": (128, 128, 8, 3), "plain_causal": (64, 64, 4, 3)}[spec]
    return set_config("GPU_CONFIG", current, config)


# Session 4.  The anchors' calibration kernel's best d128 full config.
for spec in ("full", "plain_causal"):
    for config in ((128, 64, 8, 4), (128, 64, 8, 3), (128, 128, 8, 2)):
        experiment(f"{spec} {config}", f"examples/{spec}.attn", forward_config(spec, config))
# Hopper warp specialization with other warp counts and a 256-row tile (two
# consumer warp groups of 128 rows, as in FlashAttention-3).
for config in ((128, 128, 4, 2), (128, 128, 4, 3), (256, 128, 8, 2), (128, 64, 8, 4)):
    experiment(
        f"full tma+ws {config}",
        "examples/full.attn",
        FORWARD_TMA,
        FORWARD_WS,
        forward_config("full", config),
    )
# Interior tiles of a plain score: the row max from the raw products, then
# one fused multiply-add per element (qk * c - m) instead of a multiply and
# a subtract (valid for a positive scale).
SCALE_LOG2 = "(sm_scale * 1.4426950408889634)"
FMA_MAX = (
    "    m_blk = tl.max(s2, 1)\n",
    "    if MASKED:\n        m_blk = tl.max(s2, 1)\n    else:\n"
    f"        m_blk = tl.max(qk, 1) * {SCALE_LOG2}\n",
)
FMA_EXP = (
    "    p = tl.math.exp2(s2 - m_ref[:, None])\n",
    "    if MASKED:\n        p = tl.math.exp2(s2 - m_ref[:, None])\n    else:\n"
    f"        p = tl.math.exp2(qk * {SCALE_LOG2} - m_ref[:, None])\n",
)
experiment("full fma", "examples/full.attn", FMA_MAX, FMA_EXP)
experiment(
    "full fma (128, 64, 8, 4)",
    "examples/full.attn",
    FMA_MAX,
    FMA_EXP,
    forward_config("full", (128, 64, 8, 4)),
)
experiment("plain_causal fma", "examples/plain_causal.attn", FMA_MAX, FMA_EXP)
# Conditional rescale (FlashAttention-4) with the accumulator's rescale
# skipped, for the whole tile, when no row's reference moved.
COND_MAX = (
    "    m_new = tl.maximum(m_i, m_blk)\n",
    "    m_new = tl.where(m_blk > m_i + 8.0, m_blk, m_i)\n",
)
COND_ACC = (
    "    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])\n",
    "    if tl.max(m_new - m_i, 0) > 0:\n        acc = acc * alpha[:, None]\n"
    "    acc = tl.dot(p.to(v.dtype), v, acc)\n",
)
experiment("full cond-rescale", "examples/full.attn", COND_MAX, COND_ACC)
# The dQ kernel with 2 pipeline stages (−6% / −9%, BENCHMARKS.md entry 7)
# was measured before the backward became one launch.


# Hand-pipelined interior loop (FlashAttention-3's intra-warpgroup overlap):
# the product for key tile j + 1 is issued before the softmax of tile j, in
# the hope that the matrix unit runs while the softmax does.
def _interior_loop(module_text: str) -> str:
    start = module_text.index("    for start_n in range(mid_lo, mid_hi, BLOCK_N):\n")
    end = module_text.index("        )\n", start) + len("        )\n")
    return module_text[start:end]


SOFTMAX_PV = """@triton.jit
def _attn_fwd_softmax_pv(acc, l_i, m_i, qk, v_desc, v_base, stride_vn, stride_vd, batch,
                         kv_head, start_n, n_keys, sm_scale, HEAD_DIM: tl.constexpr,
                         HEAD_DIM_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                         USE_TMA: tl.constexpr):
    c = sm_scale * 1.4426950408889634
    m_new = tl.maximum(m_i, tl.max(qk, 1) * c)
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(qk * c - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = _load_block(v_desc, v_base, batch, kv_head, start_n, n_keys, stride_vn, stride_vd,
                    BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, False, USE_TMA)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, l_i, m_new


@triton.jit
def _attn_fwd(
"""
PIPELINED = """    if mid_lo < mid_hi:
        k = _load_block(k_desc, k_base, batch, kv_head, mid_lo, n_keys, stride_kn, stride_kd,
                        BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, False, USE_TMA)
        qk = tl.dot(q, tl.trans(k))
        for start_n in range(mid_lo, mid_hi - BLOCK_N, BLOCK_N):
            k = _load_block(k_desc, k_base, batch, kv_head, start_n + BLOCK_N, n_keys,
                            stride_kn, stride_kd, BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, False, USE_TMA)
            qk_next = tl.dot(q, tl.trans(k))
            acc, l_i, m_i = _attn_fwd_softmax_pv(
                acc, l_i, m_i, qk, v_desc, v_base, stride_vn, stride_vd, batch, kv_head,
                start_n, n_keys, sm_scale, HEAD_DIM, HEAD_DIM_PAD, BLOCK_N, USE_TMA)
            qk = qk_next
        acc, l_i, m_i = _attn_fwd_softmax_pv(
            acc, l_i, m_i, qk, v_desc, v_base, stride_vn, stride_vd, batch, kv_head,
            mid_hi - BLOCK_N, n_keys, sm_scale, HEAD_DIM, HEAD_DIM_PAD, BLOCK_N, USE_TMA)
"""
with open(os.path.join(ROOT, "generated", "full.py")) as f:
    _FULL = f.read()
SWP = [
    ("@triton.jit\ndef _attn_fwd(\n", SOFTMAX_PV),
    (_interior_loop(_FULL), PIPELINED),
]
for config in ((128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 8, 2), (128, 128, 8, 2)):
    experiment(f"full swp {config}", "examples/full.attn", *SWP, forward_config("full", config))
experiment("full swp tma", "examples/full.attn", *SWP, FORWARD_TMA)
experiment(
    "full swp (64, 64, 4, 3)", "examples/full.attn", *SWP, forward_config("full", (64, 64, 4, 3))
)


# Session 4: the backward with dQ added by the dK/dV kernel through atomics
# was measured against the separate dQ kernel and dropped (BENCHMARKS.md,
# entry 9).


# A narrow band (257 keys per query) at d128: the backward's programs have
# few tiles each, so the tile shape decides how much is fixed cost.
# Session 5 adds smaller and shallower tiles.
for config in (
    (64, 64, 4, 3),
    (32, 64, 4, 3),
    (64, 64, 8, 3),
    (32, 128, 8, 3),
    (32, 64, 4, 2),
    (32, 32, 4, 3),
    (64, 32, 4, 3),
    (16, 64, 4, 3),
    (32, 64, 4, 1),
    (32, 64, 8, 2),
    (64, 64, 4, 2),
    (32, 128, 4, 2),
    (64, 128, 8, 2),
    (16, 64, 4, 2),
    (32, 32, 4, 2),
):
    experiment(
        f"encoder_band bwd {config}",
        "examples/encoder_band.attn",
        set_config("GPU_BWD_CONFIG", BWD_D128, config),
    )
# ... and at the spec's own head dim, 64 (default tiles (64, 64, 4, 3)).
for config in ((32, 64, 4, 2), (64, 64, 4, 2), (32, 32, 4, 2), (32, 64, 4, 1), (64, 64, 8, 2)):
    experiment(
        f"encoder_band d64 bwd {config}",
        "examples/encoder_band.attn",
        set_config("GPU_BWD_CONFIG", (64, 64, 4, 3), config),
        head_dim=64,
    )
experiment("encoder_band d64", "examples/encoder_band.attn", head_dim=64)
# Session 5: two pipeline stages in the backward were right for the narrow
# band (short loops); whether they are at N=1024 for the others.
for spec in ("full", "plain_causal", "mistral_sliding", "llama4_local", "prefix_lm"):
    experiment(
        f"{spec} bwd (64, 128, 8, 2)",
        f"examples/{spec}.attn",
        set_config("GPU_BWD_CONFIG", BWD_D128, (64, 128, 8, 2)),
    )


# The default backward tiles (64, 128, 8, 3) spill 36-516 bytes in the masked
# examples at d128 (scripts/sm90_resources.py); these two compile without
# spills for all of them.  Session 5: which is faster.
for spec in EXAMPLES:
    for config in ((32, 128, 8, 3), (64, 64, 8, 3)):
        experiment(
            f"{spec} bwd {config}",
            f"examples/{spec}.attn",
            set_config("GPU_BWD_CONFIG", BWD_D128, config),
        )


# ... or keep (64, 128, 8, 3) for the interior and walk the masked edge tiles
# of the dK/dV loop BLOCK_M / 2 rows at a time through pointer loads: the
# lighter masked path stops setting the register peak (spills at d128: 0 for
# causal, mistral, bloom, prefix_lm; 8 B llama4; 88 B gemma2, from 516).
EDGE_HALF = [
    (
        "for start_m in range(row_lo, mid_lo, BLOCK_M):",
        "for start_m in range(row_lo, mid_lo, BLOCK_M // 2):",
    ),
    (
        "for start_m in range(mid_hi, row_hi, BLOCK_M):",
        "for start_m in range(mid_hi, row_hi, BLOCK_M // 2):",
    ),
    (
        "                BLOCK_M,\n                True,\n                USE_TMA,\n            )",
        "                BLOCK_M // 2,\n                True,\n                False,\n            )",
    ),
]
for spec in EXAMPLES:
    experiment(f"{spec} edge32", f"examples/{spec}.attn", *EDGE_HALF)

# custom (float32, d80 padded to 128).  Session 5 (BENCHMARKS.md, entry 15)
# measured IEEE products on the CUDA cores at several tiles (1-2 TFLOP/s)
# against three TF32 products per product on the tensor cores ("tf32x3",
# 9-11 TFLOP/s).  tf32x3 failed the float32 error rule on the GPU, so the
# module keeps IEEE products at the spill-free (32, 16, 4, 2) forward;
# `custom tf32x3` is the faster, less accurate build, for the record.
CUSTOM = "examples/custom.attn"
experiment("custom", CUSTOM, head_dim=80)
experiment(
    "custom tf32x3",
    CUSTOM,
    ('input_precision="ieee"', 'input_precision="tf32x3"'),
    set_config("GPU_CONFIG", (32, 16, 4, 2), (128, 32, 8, 2)),
    head_dim=80,
)
for config in ((16, 32, 4, 2), (64, 32, 4, 2)):
    edit = set_config("GPU_CONFIG", (32, 16, 4, 2), config)
    experiment(f"custom fwd {config}", CUSTOM, edit, head_dim=80)

# Session 8: the Gluon backward (BENCHMARKS.md, entry 25), which every
# 16-bit module at d64 and d128 now runs.  Its streamed buffers per kernel,
# and at d64 streamed tiles of 128 rows (Q and dO into dK/dV, K and V into
# dQ) instead of 64: twice the work per barrier round trip, where d64's
# products are too small to hide it (full d64 N=1024 was 0.97x the Triton
# backward).  Compiled for sm_90a at d64, dQ with 128-key tiles spills
# nothing; dK/dV with 128-row tiles spills 24 B (full) to 968 B (causal).
GLUON_BWD_STAGES = "GLUON_BWD_STAGES = (3, 2)"
STREAM_128 = (
    (
        "        _gluon_descriptor(x, GLUON_BWD_TILE) for x in (q, k, v, do, dq, dk, dv)\n    )\n",
        "        _gluon_descriptor(x, GLUON_BWD_TILE) for x in (q, k, v, do, dq, dk, dv)\n    )\n"
        "    q_128, do_128, k_128, v_128 = (_gluon_descriptor(x, 128) for x in (q, do, k, v))\n",
    ),
    (
        "        (n // GLUON_BWD_BLOCK, batch * kv_heads),\n        q_desc,\n        k_desc,\n"
        "        v_desc,\n        do_desc,\n",
        "        (n // GLUON_BWD_BLOCK, batch * kv_heads),\n        q_128,\n        k_desc,\n"
        "        v_desc,\n        do_128,\n",
    ),
    (
        "        (n // GLUON_BWD_BLOCK, batch * num_heads),\n        q_desc,\n        k_desc,\n"
        "        v_desc,\n",
        "        (n // GLUON_BWD_BLOCK, batch * num_heads),\n        q_desc,\n        k_128,\n"
        "        v_128,\n",
    ),
)
for spec in ("full", "plain_causal", "prefix_lm"):
    for stages in ((2, 2), (4, 2), (3, 3)):
        experiment(
            f"{spec} gluon-bwd stages {stages}",
            f"examples/{spec}.attn",
            (GLUON_BWD_STAGES, f"GLUON_BWD_STAGES = {stages}"),
        )
    descriptors, dkdv_128, dq_128 = STREAM_128
    experiment(
        f"{spec} d64 gluon-bwd dq-128", f"examples/{spec}.attn", descriptors, dq_128, head_dim=64
    )
    experiment(f"{spec} d64 gluon-bwd both-128", f"examples/{spec}.attn", *STREAM_128, head_dim=64)


# Session 8, for the causal d128 forward at N=1024 (0.81x cuDNN).  The Gluon
# forward's grid is (query tiles, batch * heads), tiles heaviest first: the
# GPU dispatches CTAs in linear order, x fastest, so the heaviest-first order
# holds within each head only, and the last heads' heavy tiles start in the
# last wave and set the tail (about 15 waves at N=1024, B=16, H=16).  Here a
# 1-D grid runs the heads in groups of GROUP, and within a group the heaviest
# tiles of all its heads first (longest-processing-time-first), while a
# group's K and V (GROUP x 512 KB at N=1024) stay in L2.  Run at --seqlen
# 1024; at long N a group's K and V outgrow L2 (8 MB a head at N=16384), so
# a template version would size GROUP from N.
def _lpt_body(group: int, tiles: str, tile: str) -> str:
    return (
        f"    n_tiles = {tiles}\n"
        "    pid = gl.program_id(0)\n"
        "    heads_total = gl.num_programs(0) // n_tiles\n"
        f"    first = pid // ({group} * n_tiles) * {group}\n"
        f"    size = gl.minimum(heads_total - first, {group})\n"
        "    local = pid - first * n_tiles\n"
        f"    tile = {tile}\n"
    )


def lpt_tile_rows(group: int) -> str:
    return (
        "def _gluon_tile_rows(n_ctx):\n"
        f'    """(first query row, batch * head) of this CTA: heads in groups of {group},\n'
        '    the heaviest tiles of a group\'s heads first."""\n'
        + _lpt_body(group, "n_ctx // (2 * 64)", "n_tiles - 1 - local // size")
        + "    return tile * (2 * 64), first + local % size\n"
    )


def lpt_forward(group: int) -> tuple[tuple[str, str], ...]:
    return (
        (
            "def _gluon_tile_rows():\n"
            '    """The first query row of this CTA: heaviest tiles first under a causal mask."""\n'
            "    return (gl.num_programs(0) - 1 - gl.program_id(0)) * (2 * 64)\n",
            lpt_tile_rows(group),
        ),
        (
            "    start_cta = _gluon_tile_rows()\n    start_m = start_cta + HALF * ROWS\n"
            "    batch_head = gl.program_id(1)\n",
            "    start_cta, batch_head = _gluon_tile_rows(n_ctx)\n"
            "    start_m = start_cta + HALF * ROWS\n",
        ),
        (
            "    start_cta = _gluon_tile_rows()\n    batch_head = gl.program_id(1)\n",
            "    start_cta, batch_head = _gluon_tile_rows(n_ctx)\n",
        ),
        (
            "        (n // GLUON_BLOCK, batch * num_heads),\n",
            "        (n // GLUON_BLOCK * batch * num_heads, 1),\n",
        ),
    )


experiment(
    "plain_causal gluon-fwd stages 2",
    "examples/plain_causal.attn",
    ("GLUON_STAGES = 3", "GLUON_STAGES = 2"),
)
for group in (8, 16, 32):
    experiment(
        f"plain_causal gluon-fwd lpt-{group}", "examples/plain_causal.attn", *lpt_forward(group)
    )


# The same order for the Gluon backward of plain_causal: dK/dV CTAs take the
# first keys (which the most queries see) first, dQ CTAs the last rows.
def lpt_backward(group: int) -> tuple[tuple[str, str], ...]:
    dkdv = (
        "def _gluon_dkdv_cta(num_heads, kv_group, KEYS: gl.constexpr, n_ctx):\n"
        '    """This dK/dV CTA\'s first key, batch, kv head and batch * kv heads."""\n'
        "    kv_heads = num_heads // kv_group\n"
        + _lpt_body(group, "n_ctx // (2 * KEYS)", "local // size")
        + "    bkv = first + local % size\n"
        "    return tile * (2 * KEYS), bkv // kv_heads, bkv % kv_heads, bkv\n"
    )
    dq = (
        "def _gluon_dq_cta(ROWS: gl.constexpr, n_ctx):\n"
        '    """This dQ CTA\'s first query row and batch * head."""\n'
        + _lpt_body(group, "n_ctx // (2 * ROWS)", "n_tiles - 1 - local // size")
        + "    return tile * (2 * ROWS), first + local % size\n"
    )
    return (
        (
            "def _gluon_dkdv_cta(num_heads, kv_group, KEYS: gl.constexpr):\n"
            '    """This dK/dV CTA\'s first key, batch and kv head."""\n'
            "    kv_heads = num_heads // kv_group\n"
            "    return (\n"
            "        gl.program_id(0) * (2 * KEYS),\n"
            "        gl.program_id(1) // kv_heads,\n"
            "        gl.program_id(1) % kv_heads,\n"
            "    )\n",
            dkdv,
        ),
        (
            "    start_n, batch, kv_head = _gluon_dkdv_cta(num_heads, kv_group, KEYS)\n    k_lo",
            "    start_n, batch, kv_head, bkv = _gluon_dkdv_cta(num_heads, kv_group, KEYS, n_ctx)\n"
            "    k_lo",
        ),
        ("    row = gl.program_id(1) * n_ctx + k_lo\n", "    row = bkv * n_ctx + k_lo\n"),
        (
            "    start_n, batch, kv_head = _gluon_dkdv_cta(num_heads, kv_group, KEYS)\n"
            "    kv_row = gl.program_id(1) * n_ctx + start_n\n",
            "    start_n, batch, kv_head, bkv = _gluon_dkdv_cta(num_heads, kv_group, KEYS, n_ctx)\n"
            "    kv_row = bkv * n_ctx + start_n\n",
        ),
        (
            "def _gluon_dq_cta(ROWS: gl.constexpr):\n"
            '    """This dQ CTA\'s first query row: the last rows (which see the most keys) first."""\n'
            "    return (gl.num_programs(0) - 1 - gl.program_id(0)) * (2 * ROWS)\n",
            dq,
        ),
        (
            "    start_cta = _gluon_dq_cta(ROWS)\n    batch_head = gl.program_id(1)\n",
            "    start_cta, batch_head = _gluon_dq_cta(ROWS, n_ctx)\n",
        ),
        (
            "        (n // GLUON_BWD_BLOCK, batch * kv_heads),\n",
            "        (n // GLUON_BWD_BLOCK * batch * kv_heads, 1),\n",
        ),
        (
            "        (n // GLUON_BWD_BLOCK, batch * num_heads),\n",
            "        (n // GLUON_BWD_BLOCK * batch * num_heads, 1),\n",
        ),
    )


for group in (8, 16):
    experiment(
        f"plain_causal gluon-bwd lpt-{group}", "examples/plain_causal.attn", *lpt_backward(group)
    )


# Ping-pong between the Gluon forward's two consumers (BENCHMARKS.md entry 37)
# is in the modules; "no-pingpong" puts back the loop it replaced, where each
# consumer issues S(j+1) before the softmax of tile j and the two consumers
# run unsynchronized (the warp scheduler interleaves them).  The softmax step
# is called as the module calls it: with the tile's masked flag for full and
# causal, with the mask's positions for any other mask.
SEQUENTIAL_LOOP = """\
    mbarrier.wait(q_bars.index(HALF), 0)
    mbarrier.wait(k_ready.index(0), 0)
    s = warpgroup_mma(q_buf, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    mbarrier.arrive(k_empty.index(0), count=1)
    last = n_tiles - 1
    if n_tiles > 1:
        mbarrier.wait(k_ready.index(1 % STAGES), (1 // STAGES) & 1)
        s_next = warpgroup_mma(q_buf, k_smem.index(1 % STAGES).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        p, m_i, l_i, alpha = {first}
        mbarrier.wait(v_ready.index(0), 0)
        acc = warpgroup_mma(gl.convert_layout(p.to(dtype), p_layout), v_smem.index(0), acc, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s_next,))
        mbarrier.arrive(k_empty.index(1 % STAGES), count=1)
        for j in range(1, last):
            stage = j % STAGES
            next_stage = (j + 1) % STAGES
            mbarrier.wait(k_ready.index(next_stage), ((j + 1) // STAGES) & 1)
            s_next = warpgroup_mma(q_buf, k_smem.index(next_stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            p, m_i, l_i, alpha = {middle}
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            mbarrier.arrive(v_empty.index((j - 1) % STAGES), count=1)
            acc = acc * gl.expand_dims(alpha, 1)
            mbarrier.wait(v_ready.index(stage), (j // STAGES) & 1)
            acc = warpgroup_mma(gl.convert_layout(p.to(dtype), p_layout), v_smem.index(stage), acc, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s_next,))
            mbarrier.arrive(k_empty.index(next_stage), count=1)
        p, m_i, l_i, alpha = {last}
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(v_empty.index((last - 1) % STAGES), count=1)
        acc = acc * gl.expand_dims(alpha, 1)
    else:
        p, m_i, l_i, alpha = {only}
    mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
    acc = warpgroup_mma(gl.convert_layout(p.to(dtype), p_layout), v_smem.index(last % STAGES), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    mbarrier.arrive(v_empty.index(last % STAGES), count=1)

"""


def _consumer_loop(spec: str) -> str:
    """The Gluon forward consumer's main loop in examples/<spec>'s generated
    module, from its wait for Q to the epilogue: the text "no-pingpong"
    replaces."""
    with open(os.path.join(ROOT, "generated", f"{spec}.py")) as f:
        source = f.read()
    start = source.index("    mbarrier.wait(q_bars.index(HALF), 0)\n")
    end = source.index("    acc = acc / gl.expand_dims(", start)
    if "# Rows that saw no visible key" in source[start:end]:
        end = source.index("    # Rows that saw no visible key", start)
    return source[start:end]


def no_pingpong(spec: str, any_mask: bool) -> tuple[tuple[str, str], ...]:
    def step(k_start: str, masked: bool) -> str:
        if any_mask:
            return f"_gluon_softmax_step(s, m_i, l_i, sm_scale, q_idx, {k_start}, o_rows, pos)"
        return f"_gluon_softmax_step(s, m_i, l_i, qk_scale, q_idx, {k_start}, {masked}, o_rows)"

    loop = SEQUENTIAL_LOOP.format(
        first=step("key0", False),
        middle=step("key0 + j * BLOCK_N", False),
        last=step("key0 + last * BLOCK_N", True),
        only=step("key0", True),
    )
    return ((_consumer_loop(spec), loop),)


for spec, any_mask in (("full", False), ("plain_causal", False), ("mistral_sliding", True)):
    experiment(
        f"{spec} gluon-fwd no-pingpong", f"examples/{spec}.attn", *no_pingpong(spec, any_mask)
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="+", default=list(EXPERIMENTS))
    parser.add_argument("--head-dim", type=int, help="default: each experiment's (mostly 128)")
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=16)
    args = parser.parse_args()
    results = []
    start = time.time()
    for name in args.only:
        r = run(name, args.head_dim, args.seqlen, args.heads)
        results.append(r)
        tf = r.get("tflops")
        err = " ".join(f"{k}={v:.1e}" for k, v in r.get("errors", {}).items())
        shown = f"{tf[0]:6.1f} / {tf[1]:6.1f}" if tf else r.get("error", "")
        regs = " ".join(f"{k}={v[0]}r/{v[1]}s" for k, v in r.get("kernels", {}).items())
        print(f"{time.time() - start:5.0f}s  {name:<24} {shown}  {err}  {regs}", flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "ablate.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
