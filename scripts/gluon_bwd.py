"""Prototype: the backward as two warp-specialized Gluon kernels for Hopper,
to learn whether they beat the generated Triton backward (issue 4: the masked
d128 backwards sit at 0.95-0.99x FlexAttention, BENCHMARKS.md's session-7
standing) before any template is written.

The generated `_attn_bwd` is FlexAttention's algorithm in Triton, and Triton
waits for each product before the elementwise work that reads it.  Here, as
in the modules' Gluon forward (templates/gluon_forward.py.j2), the roles are
explicit: a one-warp producer issues every TMA copy into STAGES buffers, and
two consumer warp groups issue the products asynchronously.

- `gluon_attn_bwd_dkdv`: one CTA per 128 keys (64 per consumer), K and V
  loaded once, Q and dO streamed in 64-row tiles.  Per tile each consumer
  issues S^T = K Q^T and dP^T = V dO^T together, forms P^T from the saved
  log-sum-exp while dP^T is in flight, issues dV += P^T dO, then
  dS^T = P^T (dP^T - delta) and dK += dS^T Q.
- `gluon_attn_bwd_dq`: one CTA per 128 query rows (64 per consumer), Q and
  dO loaded once, K and V streamed in 64-key tiles: S = Q K^T and
  dP = dO V^T together, then dQ += dS K.

Both are deterministic (no atomics); delta and the forward stay the module's.
Scope: full or causal, Nq = Nk a multiple of 128, no GQA, 16-bit inputs of
shape (B, H, N, 128).

    python3 scripts/gluon_bwd.py --compile-only  # anywhere: sm_90a registers / spills
    python3 scripts/gluon_bwd.py                 # on an H100/H200: check against the
                                                 # module's gradients, time against its
                                                 # backward kernel (whole, and dK/dV alone)

Status (session 7): compiled for sm_90a only, not yet run on a GPU.  At
maxnreg=224 with 2 stages: dK/dV 8 B of spill stores for full and 40 B for
causal, 131 KB of shared memory (3 stages: 164 KB); dQ no spills, 131 KB.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

CTA_KEYS = 128  # keys per CTA, 64 per consumer warp group
Q_ROWS = 64  # query rows per tile


@gluon.jit
def _dkdv_consumer(args, HALF: gl.constexpr):
    (
        q_desc,
        k_desc,
        v_desc,
        do_desc,
        dk_desc,
        dv_desc,
        lse_ptr,
        delta_ptr,
        sm_scale,
        n_ctx,
        k_smem,
        v_smem,
        q_smem,
        do_smem,
        kv_bar,
        q_ready,
        q_empty,
        CAUSAL,
    ) = args
    dtype: gl.constexpr = q_desc.dtype
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    KEYS: gl.constexpr = k_desc.block_type.shape[0]  # this warp group's keys
    STAGES: gl.constexpr = q_smem.type.shape[0]
    # S^T and dP^T: (keys x query rows); dK and dV: (keys x head dim).
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, ROWS, 16]
    )
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    key_vec: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_vec: gl.constexpr = gl.SliceLayout(0, s_layout)

    batch_head = gl.program_id(1)
    start_n = gl.program_id(0) * (2 * KEYS)
    k_idx = start_n + HALF * KEYS + gl.arange(0, KEYS, layout=key_vec)
    k_buf = k_smem.index(HALF)
    v_buf = v_smem.index(HALF)
    s_zero = gl.zeros([KEYS, ROWS], gl.float32, s_layout)
    dk = gl.zeros([KEYS, HEAD_DIM], gl.float32, acc_layout)
    dv = gl.zeros([KEYS, HEAD_DIM], gl.float32, acc_layout)
    qk_scale = sm_scale * 1.4426950408889634

    if CAUSAL:
        first = start_n // ROWS  # query rows below the CTA's first key see none of it
    else:
        first = 0
    mbarrier.wait(kv_bar, 0)
    for i in range(first, n_ctx // ROWS):
        t = i - first
        stage = t % STAGES
        mbarrier.wait(q_ready.index(stage), (t // STAGES) & 1)
        q_buf = q_smem.index(stage)
        do_buf = do_smem.index(stage)
        s_t = warpgroup_mma(k_buf, q_buf.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        dp_t = warpgroup_mma(v_buf, do_buf.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        q_idx = i * ROWS + gl.arange(0, ROWS, layout=row_vec)
        row = batch_head * n_ctx + q_idx
        lse = gl.load(lse_ptr + row) * 1.4426950408889634
        delta = gl.load(delta_ptr + row)
        s_t = warpgroup_mma_wait(num_outstanding=1, deps=(s_t,))
        p_t = gl.exp2(s_t * qk_scale - gl.expand_dims(lse, 0))
        if CAUSAL:
            if i * ROWS < start_n + 2 * KEYS:  # a tile on the diagonal
                visible = gl.expand_dims(k_idx, 1) <= gl.expand_dims(q_idx, 0)
                p_t = gl.where(visible, p_t, 0.0)
        dv = warpgroup_mma(gl.convert_layout(p_t.to(dtype), a_layout), do_buf, dv, is_async=True)
        dp_t = warpgroup_mma_wait(num_outstanding=1, deps=(dp_t,))
        ds_t = p_t * (dp_t - gl.expand_dims(delta, 0))
        dk = warpgroup_mma(gl.convert_layout(ds_t.to(dtype), a_layout), q_buf, dk, is_async=True)
        dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
        mbarrier.arrive(q_empty.index(stage), count=1)

    # K and V are read for the last time above: their buffers stage dK and dV.
    k_buf.store((dk * sm_scale).to(dtype))
    v_buf.store(dv.to(dtype))
    fence_async_shared()
    row0 = batch_head * n_ctx + start_n + HALF * KEYS
    tma.async_copy_shared_to_global(dk_desc, [row0, 0], k_buf)
    tma.async_copy_shared_to_global(dv_desc, [row0, 0], v_buf)
    tma.store_wait(pendings=0)


@gluon.jit
def _dkdv_producer(args, HALF: gl.constexpr):
    (
        q_desc,
        k_desc,
        v_desc,
        do_desc,
        dk_desc,
        dv_desc,
        lse_ptr,
        delta_ptr,
        sm_scale,
        n_ctx,
        k_smem,
        v_smem,
        q_smem,
        do_smem,
        kv_bar,
        q_ready,
        q_empty,
        CAUSAL,
    ) = args
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    KEYS: gl.constexpr = k_desc.block_type.shape[0]
    STAGES: gl.constexpr = q_smem.type.shape[0]
    batch_head = gl.program_id(1)
    start_n = gl.program_id(0) * (2 * KEYS)
    base = batch_head * n_ctx
    mbarrier.expect(kv_bar, 4 * k_desc.block_type.nbytes)
    for h in gl.static_range(2):
        tma.async_copy_global_to_shared(
            k_desc, [base + start_n + h * KEYS, 0], kv_bar, k_smem.index(h)
        )
        tma.async_copy_global_to_shared(
            v_desc, [base + start_n + h * KEYS, 0], kv_bar, v_smem.index(h)
        )
    if CAUSAL:
        first = start_n // ROWS
    else:
        first = 0
    for i in range(first, n_ctx // ROWS):
        t = i - first
        stage = t % STAGES
        # A barrier starts with phase 1 complete: the first STAGES waits pass.
        mbarrier.wait(q_empty.index(stage), ((t // STAGES) & 1) ^ 1)
        mbarrier.expect(q_ready.index(stage), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            q_desc, [base + i * ROWS, 0], q_ready.index(stage), q_smem.index(stage)
        )
        tma.async_copy_global_to_shared(
            do_desc, [base + i * ROWS, 0], q_ready.index(stage), do_smem.index(stage)
        )


@gluon.jit
def gluon_attn_bwd_dkdv(
    q_desc,
    k_desc,
    v_desc,
    do_desc,
    dk_desc,
    dv_desc,
    lse_ptr,
    delta_ptr,
    sm_scale,
    n_ctx,
    STAGES: gl.constexpr,
    CAUSAL: gl.constexpr,
):
    """Grid: (N / 128 key tiles, B * H).  dK (scaled) and dV of one key tile."""
    dtype: gl.constexpr = q_desc.dtype
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    KEYS: gl.constexpr = k_desc.block_type.shape[0]
    k_smem = gl.allocate_shared_memory(dtype, [2, KEYS, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [2, KEYS, HEAD_DIM], v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, ROWS, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, ROWS, HEAD_DIM], do_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=2)  # released by both consumers
    args = (
        q_desc,
        k_desc,
        v_desc,
        do_desc,
        dk_desc,
        dv_desc,
        lse_ptr,
        delta_ptr,
        sm_scale,
        n_ctx,
        k_smem,
        v_smem,
        q_smem,
        do_smem,
        kv_bar,
        q_ready,
        q_empty,
        CAUSAL,
    )
    gl.warp_specialize(
        [(_dkdv_consumer, (args, 0)), (_dkdv_consumer, (args, 1)), (_dkdv_producer, (args, 0))],
        [4, 1],  # warps of the second consumer and of the producer
        [240, 24],  # their registers per thread
    )


@gluon.jit
def _dq_consumer(args, HALF: gl.constexpr):
    (
        q_desc,
        k_desc,
        v_desc,
        do_desc,
        dq_desc,
        lse_ptr,
        delta_ptr,
        sm_scale,
        n_ctx,
        q_smem,
        do_smem,
        k_smem,
        v_smem,
        q_bar,
        k_ready,
        v_ready,
        kv_empty,
        CAUSAL,
    ) = args
    dtype: gl.constexpr = q_desc.dtype
    ROWS: gl.constexpr = q_desc.block_type.shape[0]  # this warp group's query rows
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    STAGES: gl.constexpr = k_smem.type.shape[0]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    row_vec: gl.constexpr = gl.SliceLayout(1, s_layout)
    key_vec: gl.constexpr = gl.SliceLayout(0, s_layout)

    batch_head = gl.program_id(1)
    start_cta = _dq_tile_rows(CAUSAL)
    q_idx = start_cta + HALF * ROWS + gl.arange(0, ROWS, layout=row_vec)
    row = batch_head * n_ctx + q_idx
    lse = gl.load(lse_ptr + row) * 1.4426950408889634
    delta = gl.load(delta_ptr + row)
    q_buf = q_smem.index(HALF)
    do_buf = do_smem.index(HALF)
    s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    dq = gl.zeros([ROWS, HEAD_DIM], gl.float32, acc_layout)
    qk_scale = sm_scale * 1.4426950408889634

    mbarrier.wait(q_bar, 0)
    n_tiles = _dq_key_tiles(start_cta, n_ctx, BLOCK_N, CAUSAL)
    for j in range(n_tiles):
        stage = j % STAGES
        phase = (j // STAGES) & 1
        mbarrier.wait(k_ready.index(stage), phase)
        s = warpgroup_mma(
            q_buf, k_smem.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True
        )
        mbarrier.wait(v_ready.index(stage), phase)
        dp = warpgroup_mma(
            do_buf, v_smem.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True
        )
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
        p = gl.exp2(s * qk_scale - gl.expand_dims(lse, 1))
        if CAUSAL:
            if j * BLOCK_N + BLOCK_N > start_cta:  # a tile on the diagonal
                k_idx = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=key_vec)
                p = gl.where(gl.expand_dims(k_idx, 0) <= gl.expand_dims(q_idx, 1), p, 0.0)
        dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp,))
        ds = p * (dp - gl.expand_dims(delta, 1))
        dq = warpgroup_mma(
            gl.convert_layout(ds.to(dtype), a_layout), k_smem.index(stage), dq, is_async=True
        )
        dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))
        mbarrier.arrive(kv_empty.index(stage), count=1)

    # Q is read for the last time above: its buffer stages dQ.
    q_buf.store((dq * sm_scale).to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(
        dq_desc, [batch_head * n_ctx + start_cta + HALF * ROWS, 0], q_buf
    )
    tma.store_wait(pendings=0)


@gluon.jit
def _dq_producer(args, HALF: gl.constexpr):
    (
        q_desc,
        k_desc,
        v_desc,
        do_desc,
        dq_desc,
        lse_ptr,
        delta_ptr,
        sm_scale,
        n_ctx,
        q_smem,
        do_smem,
        k_smem,
        v_smem,
        q_bar,
        k_ready,
        v_ready,
        kv_empty,
        CAUSAL,
    ) = args
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    STAGES: gl.constexpr = k_smem.type.shape[0]
    batch_head = gl.program_id(1)
    base = batch_head * n_ctx
    start_cta = _dq_tile_rows(CAUSAL)
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes + 2 * do_desc.block_type.nbytes)
    for h in gl.static_range(2):
        tma.async_copy_global_to_shared(
            q_desc, [base + start_cta + h * ROWS, 0], q_bar, q_smem.index(h)
        )
        tma.async_copy_global_to_shared(
            do_desc, [base + start_cta + h * ROWS, 0], q_bar, do_smem.index(h)
        )
    for j in range(_dq_key_tiles(start_cta, n_ctx, BLOCK_N, CAUSAL)):
        stage = j % STAGES
        # A barrier starts with phase 1 complete: the first STAGES waits pass.
        mbarrier.wait(kv_empty.index(stage), ((j // STAGES) & 1) ^ 1)
        mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            k_desc, [base + j * BLOCK_N, 0], k_ready.index(stage), k_smem.index(stage)
        )
        mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            v_desc, [base + j * BLOCK_N, 0], v_ready.index(stage), v_smem.index(stage)
        )


@gluon.jit
def _dq_tile_rows(CAUSAL: gl.constexpr):
    """The CTA's first query row (128 rows per CTA), heaviest first if causal."""
    if CAUSAL:
        return (gl.num_programs(0) - 1 - gl.program_id(0)) * 128
    else:
        return gl.program_id(0) * 128


@gluon.jit
def _dq_key_tiles(start_cta, n_ctx, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    if CAUSAL:
        return (start_cta + 128 + BLOCK_N - 1) // BLOCK_N  # up to the diagonal
    else:
        return n_ctx // BLOCK_N


@gluon.jit
def gluon_attn_bwd_dq(
    q_desc,
    k_desc,
    v_desc,
    do_desc,
    dq_desc,
    lse_ptr,
    delta_ptr,
    sm_scale,
    n_ctx,
    STAGES: gl.constexpr,
    CAUSAL: gl.constexpr,
):
    """Grid: (N / 128 query tiles, B * H).  dQ (scaled) of one query tile."""
    dtype: gl.constexpr = q_desc.dtype
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    q_smem = gl.allocate_shared_memory(dtype, [2, ROWS, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [2, ROWS, HEAD_DIM], do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=2)  # released by both consumers
    args = (
        q_desc,
        k_desc,
        v_desc,
        do_desc,
        dq_desc,
        lse_ptr,
        delta_ptr,
        sm_scale,
        n_ctx,
        q_smem,
        do_smem,
        k_smem,
        v_smem,
        q_bar,
        k_ready,
        v_ready,
        kv_empty,
        CAUSAL,
    )
    gl.warp_specialize(
        [(_dq_consumer, (args, 0)), (_dq_consumer, (args, 1)), (_dq_producer, (args, 0))],
        [4, 1],  # warps of the second consumer and of the producer
        [240, 24],  # their registers per thread
    )


def _descriptors(*tensors, rows):
    """(B * H * N, D) TMA descriptors of [rows, D] blocks."""
    out = []
    for x in tensors:
        flat = x.reshape(-1, x.shape[-1])
        dtype = gl.bfloat16 if x.dtype == torch.bfloat16 else gl.float16
        layout = gl.NVMMASharedLayout.get_default_for([rows, x.shape[-1]], dtype)
        out.append(
            TensorDescriptor(
                flat, list(flat.shape), list(flat.stride()), [rows, x.shape[-1]], layout
            )
        )
    return out


def dkdv(q, k, v, do, lse, delta, sm_scale, causal, stages=2, maxnreg=None):
    """dK and dV from the forward's log-sum-exp (natural log) and delta."""
    batch, heads, n, d = q.shape
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    q_desc, do_desc = _descriptors(q, do, rows=Q_ROWS)
    k_desc, v_desc, dk_desc, dv_desc = _descriptors(k, v, dk, dv, rows=CTA_KEYS // 2)
    options = dict(num_warps=4)
    if maxnreg:
        options["maxnreg"] = maxnreg
    gluon_attn_bwd_dkdv[(n // CTA_KEYS, batch * heads)](
        q_desc,
        k_desc,
        v_desc,
        do_desc,
        dk_desc,
        dv_desc,
        lse,
        delta,
        sm_scale,
        n,
        stages,
        causal,
        **options,
    )
    return dk, dv


def dq(q, k, v, do, lse, delta, sm_scale, causal, stages=2, maxnreg=None, block_n=64):
    """dQ from the forward's log-sum-exp (natural log) and delta."""
    batch, heads, n, d = q.shape
    dq_out = torch.empty_like(q)
    q_desc, do_desc, dq_desc = _descriptors(q, do, dq_out, rows=Q_ROWS)
    k_desc, v_desc = _descriptors(k, v, rows=block_n)
    options = dict(num_warps=4)
    if maxnreg:
        options["maxnreg"] = maxnreg
    gluon_attn_bwd_dq[(n // 128, batch * heads)](
        q_desc,
        k_desc,
        v_desc,
        do_desc,
        dq_desc,
        lse,
        delta,
        sm_scale,
        n,
        stages,
        causal,
        **options,
    )
    return dq_out


def compile_only(kernel: str, stages: int, causal: bool, maxnreg: int | None) -> None:
    """Print ptxas's resource use of `kernel` ("dkdv" or "dq") for sm_90a."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    x = torch.empty(4, 16, 4096, 128, dtype=torch.bfloat16)
    (rows64,) = _descriptors(x, rows=Q_ROWS)  # the 64-row blocks of both kernels
    if kernel == "dkdv":
        fn, names = gluon_attn_bwd_dkdv, [
            "q_desc",
            "k_desc",
            "v_desc",
            "do_desc",
            "dk_desc",
            "dv_desc",
        ]
    else:
        fn, names = gluon_attn_bwd_dq, ["q_desc", "k_desc", "v_desc", "do_desc", "dq_desc"]
    signature = {name: mangle_type(rows64) for name in names}
    signature.update(lse_ptr="*fp32", delta_ptr="*fp32", sm_scale="fp32", n_ctx="i32")
    signature.update(STAGES="constexpr", CAUSAL="constexpr")
    constants = dict(STAGES=stages, CAUSAL=causal)
    first = len(names)  # lse_ptr, delta_ptr and n_ctx are 16-aligned / divisible by 16
    attrs = {(i,): [["tt.divisibility", 16]] for i in (first, first + 1, first + 3)}
    options = dict(num_warps=4)
    if maxnreg:
        options["maxnreg"] = maxnreg
    compiled = triton.compile(
        GluonASTSource(fn, signature, constants, attrs),
        target=GPUTarget("cuda", 90, 32),
        options=options,
    )
    sys.path.insert(0, os.path.dirname(__file__))
    from sm90_resources import ptxas_report

    regs, stores, loads = ptxas_report(compiled.asm["ptx"])
    print(
        f"gluon_attn_bwd_{kernel} stages={stages} causal={causal} maxnreg={maxnreg}: "
        f"regs {regs}, spills {stores} / {loads} B, smem {compiled.metadata.shared}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--stages", type=int, nargs="+", default=[2, 3])
    # 224 registers x 288 threads is the most one CTA may hold (64K per SM); 0: ptxas decides.
    parser.add_argument("--maxnreg", type=int, nargs="+", default=[224, 0])
    args = parser.parse_args()
    if args.compile_only:
        for kernel in ("dkdv", "dq"):
            for stages in args.stages:
                for causal in (False, True):
                    for maxnreg in args.maxnreg:
                        try:
                            compile_only(kernel, stages, causal, maxnreg or None)
                        except Exception as e:  # noqa: BLE001 - a report
                            print(
                                f"{kernel} stages={stages} causal={causal} maxnreg={maxnreg}: "
                                f"{type(e).__name__}: {str(e)[:2000]}"
                            )
        return

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from flashgen import api

    def ms(fn):
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")

    torch.manual_seed(0)
    for n in (1024, 4096):
        b, h, d = 16384 // n, 16, 128
        q, k, v, do = (
            torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4)
        )
        scale = d**-0.5
        for causal, spec in ((False, "full"), (True, "plain_causal")):
            module = api.load(Path(f"examples/{spec}.attn"))
            o, lse = module.forward(q, k, v)
            dq_ref, dk_ref, dv_ref = module.backward(q, k, v, o, lse, do)
            delta = (o.float() * do.float()).sum(-1)
            # The backward's FLOPs as the bench counts them (2.5x the forward's).
            flops = 2.5 * 4 * b * h * n * n * d * ((n + 1) / (2 * n) if causal else 1.0)
            tflops = lambda t: flops / t / 1e9  # noqa: E731
            # The module's backward kernel, whole and with its dK/dV programs alone
            # (the first N / BLOCK_N columns of its grid).
            calls = []
            module._attn_bwd.pre_run_hooks.append(lambda *a, **kw: calls.append((a, kw)))
            module.DIRECT_LAUNCH = False
            module.backward(q, k, v, o, lse, do)
            module._attn_bwd.pre_run_hooks.pop()
            a, kw = calls[-1]
            block_n = module.GPU_BWD_CONFIG[1]
            t_all = ms(lambda: module._attn_bwd[(2 * triton.cdiv(n, block_n), b * h)](*a, **kw))
            t_kdv = ms(lambda: module._attn_bwd[(triton.cdiv(n, block_n), b * h)](*a, **kw))
            print(
                f"{spec:<13} N={n:5d} triton: whole {tflops(t_all):6.1f} (dK/dV {t_kdv / t_all:.0%}"
                " of its time)",
                flush=True,
            )
            best = {}
            for name, fn, refs in (
                ("dkdv", dkdv, (dk_ref, dv_ref)),
                ("dq", dq, (dq_ref,)),
            ):
                for stages in args.stages:
                    for maxnreg in args.maxnreg:
                        label = f"gluon {name} s{stages} r{maxnreg}"
                        try:
                            run = lambda: fn(  # noqa: E731
                                q, k, v, do, lse, delta, scale, causal, stages, maxnreg or None
                            )
                            out = run()
                            out = out if isinstance(out, tuple) else (out,)
                            err = max(
                                (x.float() - r.float()).abs().max().item()
                                for x, r in zip(out, refs)
                            )
                            t = ms(run)
                            best[name] = min(best.get(name, t), t)
                            print(f"   {label}: {t:.4f} ms, max diff from the module {err:.1e}")
                        except Exception as e:  # noqa: BLE001 - a report
                            print(f"   {label}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            if len(best) == 2:
                both = best["dkdv"] + best["dq"]
                print(
                    f"   best gluon dK/dV {best['dkdv']:.4f} ms (triton's {t_kdv:.4f}), "
                    f"+ dQ {best['dq']:.4f} ms = {tflops(both):6.1f} TFLOP/s "
                    f"(triton whole {tflops(t_all):6.1f})",
                    flush=True,
                )


if __name__ == "__main__":
    main()
