"""Prototype: a Hopper forward written in Gluon, to learn whether Triton 3.6
can reach 0.85x cuDNN at d128 (issue 4) before any template is written.

Triton's compiler schedules the generated `_attn_fwd`: it waits for each
product before the softmax that reads it, so the matrix unit idles while the
softmax runs (BENCHMARKS.md, entry 7: Hopper warp specialization and a
hand-pipelined loop did not change that).  Gluon exposes the asynchronous
warp-group MMA, TMA copies and mbarriers directly, so the FlashAttention-3
order can be written out:

    S(j+1) = Q K(j+1)^T     issued, not awaited
    softmax of S(j)         while the tensor cores compute S(j+1)
    O = O * alpha + P(j) V(j)  issued; waited for only before O is rescaled again

K and V stream through STAGES shared-memory buffers filled by TMA, each
refilled as soon as the products that read it are complete.  Scope of the
prototype: no mask (the `full` example), N a multiple of both tiles, 16-bit
inputs of shape (B, H, N, D); it writes o and the log-sum-exp like the
generated modules.  (It measured +3% over Triton; its warp-specialized
successor, +14%, is now the modules' own forward for full and causal at d128:
templates/gluon_forward.py.j2, BENCHMARKS.md entries 13 and 16.  This script
times the module's forward, now that one, next to the single-role kernel.)

    python3 scripts/gluon_fwd.py                 # on an H100/H200: check, then time
    python3 scripts/gluon_fwd.py --compile-only  # anywhere: sm_90a registers / spills
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


@gluon.jit
def _softmax_step(
    s, m_i, l_i, qk_scale, q_idx, k_start, CAUSAL: gl.constexpr, o_rows: gl.constexpr
):
    """Online softmax of one score tile: P (unnormalized), the new running
    max and sum, and alpha laid out for the output rows.  CAUSAL masks k > q
    (on every tile: the prototype measures an upper bound on its cost)."""
    if CAUSAL:
        k_idx = k_start + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s.type.layout))
        s = gl.where(gl.expand_dims(k_idx, 0) <= gl.expand_dims(q_idx, 1), s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, m_new, l_i, gl.convert_layout(alpha, o_rows)


@gluon.jit
def _load(desc, smem, bars, row, stage):
    """TMA copy of the tile at `row` into buffer `stage`, signalling its barrier."""
    mbarrier.expect(bars.index(stage), desc.block_type.nbytes)
    tma.async_copy_global_to_shared(desc, [row, 0], bars.index(stage), smem.index(stage))


@gluon.jit
def gluon_attn_fwd(
    q_desc,
    k_desc,
    v_desc,
    o_desc,
    lse_ptr,
    sm_scale,
    n_ctx,
    HEAD_DIM: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    CAUSAL: gl.constexpr,
):
    dtype: gl.constexpr = q_desc.dtype
    num_warps: gl.constexpr = gl.num_warps()
    if CAUSAL:  # the heaviest query tiles first
        start_m = (gl.num_programs(0) - 1 - gl.program_id(0)) * BLOCK_M
    else:
        start_m = gl.program_id(0) * BLOCK_M
    batch_head = gl.program_id(1)
    row0 = batch_head * n_ctx  # q, k, v, o are viewed as (B * H * N, D)

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)

    if CAUSAL:  # keys 0 .. start_m + BLOCK_M - 1 (Nq = Nk: both alignments agree)
        n_tiles = (start_m + BLOCK_M) // BLOCK_N
    else:
        n_tiles = n_ctx // BLOCK_N
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [row0 + start_m, 0], q_bar, q_smem)
    # Tile t lives in buffer t % STAGES.  Its K buffer is refilled (with tile
    # t + STAGES) once S(t) is complete, its V buffer once P(t) V(t) is.
    for i in gl.static_range(STAGES):
        if i < n_tiles:  # no copy may still be in flight when the program ends
            _load(k_desc, k_smem, k_bars, row0 + i * BLOCK_N, i)
            _load(v_desc, v_smem, v_bars, row0 + i * BLOCK_N, i)

    qk_scale = sm_scale * 1.4426950408889634
    q_idx = start_m + gl.arange(0, BLOCK_M, layout=s_rows)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, s_rows)
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, s_rows)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)

    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bars.index(0), 0)
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))

    # Tile 0: nothing in flight in O yet.
    if STAGES < n_tiles:
        _load(k_desc, k_smem, k_bars, row0 + STAGES * BLOCK_N, 0)
    mbarrier.wait(k_bars.index(1 % STAGES), (1 // STAGES) & 1)
    s_next = warpgroup_mma(
        q_smem, k_smem.index(1 % STAGES).permute((1, 0)), s_zero, use_acc=False, is_async=True
    )
    p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, q_idx, 0, CAUSAL, o_rows)
    mbarrier.wait(v_bars.index(0), 0)
    acc = warpgroup_mma(
        gl.convert_layout(p.to(dtype), p_layout), v_smem.index(0), acc, is_async=True
    )
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s_next,))

    for j in range(1, n_tiles - 1):
        stage = j % STAGES
        phase = (j // STAGES) & 1
        next_stage = (j + 1) % STAGES
        if j + STAGES < n_tiles:  # S(j) is complete: K(j)'s buffer is free
            _load(k_desc, k_smem, k_bars, row0 + (j + STAGES) * BLOCK_N, stage)
        mbarrier.wait(k_bars.index(next_stage), ((j + 1) // STAGES) & 1)
        s_next = warpgroup_mma(
            q_smem, k_smem.index(next_stage).permute((1, 0)), s_zero, use_acc=False, is_async=True
        )
        p, m_i, l_i, alpha = _softmax_step(
            s, m_i, l_i, qk_scale, q_idx, j * BLOCK_N, CAUSAL, o_rows
        )
        # P(j-1) V(j-1) was issued before S(j+1): one outstanding group left
        # means it is done, so O can be rescaled and V(j-1)'s buffer refilled.
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        if j - 1 + STAGES < n_tiles:
            _load(v_desc, v_smem, v_bars, row0 + (j - 1 + STAGES) * BLOCK_N, (j - 1) % STAGES)
        acc = acc * gl.expand_dims(alpha, 1)
        mbarrier.wait(v_bars.index(stage), phase)
        acc = warpgroup_mma(
            gl.convert_layout(p.to(dtype), p_layout), v_smem.index(stage), acc, is_async=True
        )
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s_next,))

    # Last tile.
    last = n_tiles - 1
    p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, q_idx, last * BLOCK_N, CAUSAL, o_rows)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    acc = acc * gl.expand_dims(alpha, 1)
    mbarrier.wait(v_bars.index(last % STAGES), (last // STAGES) & 1)
    acc = warpgroup_mma(
        gl.convert_layout(p.to(dtype), p_layout), v_smem.index(last % STAGES), acc, is_async=True
    )
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))

    acc = acc / gl.expand_dims(gl.convert_layout(l_i, o_rows), 1)
    q_smem.store(acc.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [row0 + start_m, 0], q_smem)
    lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
    gl.store(lse_ptr + batch_head * n_ctx + q_idx, lse)
    tma.store_wait(pendings=0)


def _descriptors(q, k, v, o, block_m, block_n):
    gl_dtype = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[q.dtype]
    d = q.shape[-1]
    flat = [x.reshape(-1, d) for x in (q, k, v, o)]
    descs = []
    for x, rows in zip(flat, (block_m, block_n, block_n, block_m)):
        layout = gl.NVMMASharedLayout.get_default_for([rows, d], gl_dtype)
        descs.append(TensorDescriptor(x, list(x.shape), list(x.stride()), [rows, d], layout))
    return descs


def forward(q, k, v, sm_scale, block_m=128, block_n=128, stages=2, num_warps=8, causal=False):
    batch, heads, n, d = q.shape
    if n % block_m or n % block_n or (block_m if causal else n) // block_n < 2:
        raise ValueError("prototype: N a multiple of both tiles, and at least 2 key tiles each")
    q, k, v = (x.contiguous() for x in (q, k, v))
    o = torch.empty_like(q)
    lse = torch.empty(batch, heads, n, device=q.device, dtype=torch.float32)
    descs = _descriptors(q, k, v, o, block_m, block_n)
    gluon_attn_fwd[(n // block_m, batch * heads)](
        *descs,
        lse,
        sm_scale,
        n,
        d,
        block_m,
        block_n,
        stages,
        causal,
        num_warps=num_warps,
    )
    return o, lse


def _compile(fn, block_m, block_n, constants, options):
    """Compile `fn` for sm_90a here (no GPU needed); (regs, spill stores,
    spill loads, shared memory)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    q = torch.empty(4, 16, 4096, 128, dtype=torch.bfloat16)
    descs = _descriptors(q, q, q, q, block_m, block_n)
    names = ["q_desc", "k_desc", "v_desc", "o_desc", "lse_ptr", "sm_scale", "n_ctx"]
    signature = {n: mangle_type(x) for n, x in zip(names, descs)}
    signature.update(lse_ptr="*fp32", sm_scale="fp32", n_ctx="i32")
    signature.update({n: "constexpr" for n in constants})
    attrs = {(4,): [["tt.divisibility", 16]], (6,): [["tt.divisibility", 16]]}
    kernel = triton.compile(
        GluonASTSource(fn, signature, constants, attrs),
        target=GPUTarget("cuda", 90, 32),
        options=options,
    )
    sys.path.insert(0, os.path.dirname(__file__))
    from sm90_resources import ptxas_report

    return (*ptxas_report(kernel.asm["ptx"]), kernel.metadata.shared)


def compile_only(block_m, block_n, stages, num_warps, causal=0) -> None:
    """Print ptxas's resource use of the single-role kernel for sm_90a."""
    constants = dict(
        HEAD_DIM=128, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, CAUSAL=bool(causal)
    )
    regs, stores, loads, smem = _compile(
        gluon_attn_fwd, block_m, block_n, constants, dict(num_warps=num_warps)
    )
    print(
        f"gluon_attn_fwd {(block_m, block_n, stages, num_warps, causal)}: regs {regs}, "
        f"spills {stores} / {loads} B, smem {smem}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument(
        "--configs",
        nargs="+",
        default=["128,128,2,8,0", "128,64,3,8,0", "128,128,3,8,0", "128,64,2,8,1", "128,64,3,8,1"],
        help="BLOCK_M,BLOCK_N,STAGES,num_warps,causal",
    )
    args = parser.parse_args()
    configs = [tuple(int(x) for x in c.split(",")) for c in args.configs]
    if args.compile_only:
        for c in configs:
            try:
                compile_only(*c)
            except Exception as e:  # noqa: BLE001 - a report
                print(f"gluon_attn_fwd {c}: {type(e).__name__}: {str(e)[:1500]}")
        return

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from flashgen import api

    torch.manual_seed(0)
    b, h, n, d = 4, 16, 4096, 128
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    scale = d**-0.5
    ms = lambda fn: triton.testing.do_bench(
        fn, warmup=25, rep=100, return_mode="median"
    )  # noqa: E731
    for causal, spec in ((0, "full"), (1, "plain_causal")):
        module = api.load(Path(f"examples/{spec}.attn"))
        flops = 4 * b * h * n * n * d * (0.5 + 0.5 / n if causal else 1.0)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        ref = sdpa(q.float(), k.float(), v.float(), is_causal=bool(causal))
        scores = q.float() @ k.float().transpose(-1, -2) * scale
        if causal:
            scores = scores.masked_fill(
                torch.ones(n, n, device="cuda").triu(1).bool(), float("-inf")
            )
        ref_lse = torch.logsumexp(scores, -1)
        del scores
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            t = ms(lambda: sdpa(q, k, v, is_causal=bool(causal)))
        print(f"{spec:<13} cudnn             {flops / t / 1e9:6.1f} TFLOP/s")
        t = ms(lambda: module.forward(q, k, v))
        err = (module.forward(q, k, v)[0].float() - ref).abs().max().item()
        print(f"{spec:<13} flashgen module   {flops / t / 1e9:6.1f} TFLOP/s  max|o-ref| {err:.2e}")
        for c in configs:
            if c[4] != causal:
                continue
            try:
                o, lse = forward(q, k, v, scale, *c[:4], causal=bool(causal))
                err = (o.float() - ref).abs().max().item()
                lse_err = (lse - ref_lse).abs().max().item()
                t = ms(lambda c=c: forward(q, k, v, scale, *c[:4], causal=bool(causal)))
                print(
                    f"{spec:<13} gluon {c[:4]} {flops / t / 1e9:6.1f} TFLOP/s  "
                    f"max|o-ref| {err:.2e}  lse {lse_err:.2e}",
                    flush=True,
                )
            except Exception as e:  # noqa: BLE001 - a report
                print(f"{spec:<13} gluon {c}: {type(e).__name__}: {str(e)[:1500]}", flush=True)


if __name__ == "__main__":
    main()
