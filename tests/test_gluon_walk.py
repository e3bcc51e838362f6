"""The tile walk of the Gluon backward, checked on the CPU.

Gluon kernels do not run under the interpreter, but the functions that
decide which tiles they compute are `triton.jit` functions of the generated
module: `_gluon_query_rows` and `_gluon_key_cols` (the tiles a CTA walks)
and `_gluon_tile_class` (skip, mask or compute whole, for the CTA and for
each consumer's half).  A small interpreted kernel here walks the tiles
exactly as `_gluon_attn_bwd_dkdv` and `_gluon_attn_bwd_dq` do, and as the
forward for any mask does (`kernel_choice.GLUON_FORWARD_ANY`), and paints what each
consumer would compute; the painting must cover every visible pair of
the dense mask, and a half-tile computed whole (without the mask) must hold
no masked pair.  The GPU tests check the kernels' numbers
(tests/test_gpu.py, `test_gluon_backward_on_gpu`).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashgen import ir
from flashgen.reference import mask_matrix
from kernel_utils import DEVICE, build, example_variants, make_variant, shrink_masks
from strategies import variants
from test_inputs import _DATA_DECLARATIONS, _data_masks

pytestmark = [
    pytest.mark.kernels,
    pytest.mark.skipif(DEVICE != "cpu", reason="interpreter test"),
]

SKIPPED, MASKED, WHOLE = 0, 1, 2  # what a consumer does with a half-tile


@triton.jit
def _paint(out_ptr, n_ctx, rows, cols, value):
    """out[rows, cols] = value for a 64 x 64 half-tile."""
    offs = tl.arange(0, 64)
    ptrs = out_ptr + (rows + offs)[:, None] * n_ctx + (cols + offs)[None, :]
    tl.store(ptrs, tl.full([64, 64], 0, tl.int8) + value)


@triton.jit
def _walk(
    dkdv_ptr, dq_ptr, fwd_ptr, n_ctx, num_heads,
    query_rows: tl.constexpr, key_cols: tl.constexpr, tile_class: tl.constexpr,
):  # fmt: skip
    """Grid (N / 128, heads): one dK/dV CTA (128 keys), one dQ CTA (128
    query rows) and one forward CTA (128 query rows, key tiles of 128; the
    forward for any mask, `kernel_choice.GLUON_FORWARD_ANY`) of one head, their tiles
    painted MASKED or WHOLE."""
    start = tl.program_id(0) * 128
    head = tl.program_id(1)
    dkdv_ptr += head * n_ctx * n_ctx
    dq_ptr += head * n_ctx * n_ctx
    fwd_ptr += head * n_ctx * n_ctx
    # dK/dV: query tiles of 64 rows against the CTA's keys, then each half.
    row_lo, row_hi = query_rows(start, start + 127, n_ctx, head, num_heads, 64)
    for start_m in range(row_lo, row_hi, 64):
        _, cta_may = tile_class(start_m, start_m + 63, start, start + 127, head, num_heads)
        if cta_may:
            for half in tl.static_range(2):
                k_lo = start + half * 64
                whole, may = tile_class(start_m, start_m + 63, k_lo, k_lo + 63, head, num_heads)
                if may:
                    _paint(dkdv_ptr, n_ctx, start_m, k_lo, tl.where(whole, 2, 1))
    # dQ: key tiles of 64 against the CTA's rows, then each half.
    lo, hi = key_cols(start, start + 127, n_ctx, head, num_heads, 64)
    for start_n in range(lo, hi, 64):
        _, cta_may = tile_class(start, start + 127, start_n, start_n + 63, head, num_heads)
        if cta_may:
            for half in tl.static_range(2):
                q_lo = start + half * 64
                whole, may = tile_class(q_lo, q_lo + 63, start_n, start_n + 63, head, num_heads)
                if may:
                    _paint(dq_ptr, n_ctx, q_lo, start_n, tl.where(whole, 2, 1))
    # Forward (`_gluon_key_tiles`): every tile of the span, whole or masked.
    lo, hi = key_cols(start, start + 127, n_ctx, head, num_heads, 128)
    lo = tl.minimum(lo, n_ctx - 128)
    n_tiles = tl.maximum((hi - lo + 127) // 128, 1)
    for j in range(0, n_tiles):
        for half in tl.static_range(2):
            q_lo = start + half * 64
            for quarter in tl.static_range(2):  # _paint paints 64 x 64
                k_lo = lo + j * 128 + quarter * 64
                whole, _ = tile_class(
                    q_lo, q_lo + 63, lo + j * 128, lo + j * 128 + 127, head, num_heads
                )
                _paint(fwd_ptr, n_ctx, q_lo, k_lo, tl.where(whole, 2, 1))


def paint(module, n: int, heads: int) -> dict[str, torch.Tensor]:
    """What each kernel of `module` computes of an n x n problem, per head:
    SKIPPED, MASKED or WHOLE for every (query, key) pair."""
    painted = {name: torch.zeros(heads, n, n, dtype=torch.int8) for name in ("dkdv", "dq", "fwd")}
    _walk[(n // 128, heads)](
        *painted.values(),
        n,
        heads,
        module._gluon_query_rows,
        module._gluon_key_cols,
        module._gluon_tile_class,
    )
    return painted


def _with_gluon_walk(variant: ir.Variant) -> ir.Variant:
    """The variant at fp16 and d64, whose module carries the Gluon backward's
    walk; where d64 takes the Triton backward instead (decision 076: masks
    whose loops run without branches), at d128 with the score s: the walk
    reads the mask alone."""
    from flashgen import kernel_choice

    v = dataclasses.replace(variant, dtype=ir.DType.FP16, head_dim=64, v_head_dim=None)
    if not kernel_choice.gluon_backward(v):
        v = dataclasses.replace(v, head_dim=128, score=ir.IDENTITY_SCORE)
        assert kernel_choice.gluon_backward(v), variant
    return v


def check_walk(variant: ir.Variant, n: int = 384, heads: int = 3) -> None:
    """The kernels' walks over an n x n problem against the dense mask."""
    # The Gluon kernels walk positions: where a congruence would make the
    # module walk residue classes in its Triton kernels instead (decision
    # 085), and carry no Gluon kernel, the walk is built without them.
    module = build(_with_gluon_walk(variant), {"residue_classes": False})
    visible = mask_matrix(variant, n, n, heads)
    for name, painted in paint(module, n, heads).items():
        missed = visible & (painted == SKIPPED)
        assert (
            not missed.any()
        ), f"{name}: visible pairs in skipped tiles, e.g. {missed.nonzero()[0]}"
        unmasked = ~visible & (painted == WHOLE)
        assert not unmasked.any(), f"{name}: a masked pair computed whole: {unmasked.nonzero()[0]}"


# Specs that read inputs: test_gluon_walk_of_masks_over_runtime_data.
@pytest.mark.parametrize(
    "variant", [v for v in example_variants() if not v.inputs], ids=lambda v: v.name
)
def test_gluon_walk_of_examples(variant):
    check_walk(shrink_masks(variant))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(variant=variants(dtypes=(ir.DType.FP16,), head_dims=(64,)))
def test_gluon_walk_of_random_masks(variant):
    check_walk(variant)


@triton.jit
def _walk_planned(
    dkdv_ptr, dq_ptr, dkdv_plan, dq_plan, n_ctx, num_heads,
    query_rows: tl.constexpr, key_cols: tl.constexpr, tile_class: tl.constexpr,
    plan: tl.constexpr, planned_span: tl.constexpr,
):  # fmt: skip
    """`_walk`'s dK/dV and dQ CTAs for a mask over runtime data (decision
    078), grid (N / 128, batch * heads): the positional walk narrowed by the
    call's plan of 64-row tiles, which also classifies the whole half-tiles,
    as `_gluon_attn_bwd_dkdv` and `_gluon_attn_bwd_dq` take it."""
    start = tl.program_id(0) * 128
    batch = tl.program_id(1) // num_heads
    head = tl.program_id(1) % num_heads
    dkdv_ptr += tl.program_id(1) * n_ctx * n_ctx
    dq_ptr += tl.program_id(1) * n_ctx * n_ctx
    row_lo, row_hi = query_rows(start, start + 127, n_ctx, head, num_heads, 64)
    lo0, hi0, full_lo0, full_hi0 = plan(dkdv_plan, batch, head, num_heads, n_ctx, start // 64, 64)
    lo1, hi1, full_lo1, full_hi1 = plan(
        dkdv_plan, batch, head, num_heads, n_ctx, start // 64 + 1, 64
    )
    row_lo, row_hi = planned_span(row_lo, row_hi, lo0, hi0, lo1, hi1, n_ctx)
    for start_m in range(row_lo, row_hi, 64):
        _, cta_may = tile_class(start_m, start_m + 63, start, start + 127, head, num_heads)
        cta_may = cta_may & (((start_m >= lo0) & (start_m < hi0)) | ((start_m >= lo1) & (start_m < hi1)))  # fmt: skip
        if cta_may:
            for half in tl.static_range(2):
                k_lo = start + half * 64
                p_lo, p_hi, full_lo, full_hi = plan(
                    dkdv_plan, batch, head, num_heads, n_ctx, k_lo // 64, 64
                )
                _, may = tile_class(start_m, start_m + 63, k_lo, k_lo + 63, head, num_heads)
                may = may & (start_m >= p_lo) & (start_m < p_hi)
                whole = (start_m >= full_lo) & (start_m + 63 <= full_hi)
                if may:
                    _paint(dkdv_ptr, n_ctx, start_m, k_lo, tl.where(whole, 2, 1))
    lo, hi = key_cols(start, start + 127, n_ctx, head, num_heads, 64)
    lo0, hi0, full_lo0, full_hi0 = plan(dq_plan, batch, head, num_heads, n_ctx, start // 64, 64)
    lo1, hi1, full_lo1, full_hi1 = plan(dq_plan, batch, head, num_heads, n_ctx, start // 64 + 1, 64)
    lo, hi = planned_span(lo, hi, lo0, hi0, lo1, hi1, n_ctx)
    for start_n in range(lo, hi, 64):
        _, cta_may = tile_class(start, start + 127, start_n, start_n + 63, head, num_heads)
        cta_may = cta_may & (((start_n >= lo0) & (start_n < hi0)) | ((start_n >= lo1) & (start_n < hi1)))  # fmt: skip
        if cta_may:
            for half in tl.static_range(2):
                q_lo = start + half * 64
                p_lo, p_hi, full_lo, full_hi = plan(
                    dq_plan, batch, head, num_heads, n_ctx, q_lo // 64, 64
                )
                _, may = tile_class(q_lo, q_lo + 63, start_n, start_n + 63, head, num_heads)
                may = may & (start_n >= p_lo) & (start_n < p_hi)
                whole = (start_n >= full_lo) & (start_n + 63 <= full_hi)
                if may:
                    _paint(dq_ptr, n_ctx, q_lo, start_n, tl.where(whole, 2, 1))


# Masks over runtime data whose plans the d64 Gluon backward walks: inputs of
# each side, of neither side, per head, tiles whole and not in one run.
DATA_MASKS = [
    ("doc: int32[B, Nk]", "causal & doc[b, q] == doc[b, k]"),
    ("prefix_len: int64[B]", "causal | k < prefix_len[b]"),
    ("t: int32[H]; d: int32[B, Nk]", "causal & k <= q + t[h] & d[b, k] >= d[b, q] - 1"),
    ("d: int32[B, Nk]", "!(d[b, k] > d[b, q] + 2) & (q - k) % 3 == 1 | window(20)"),
    ("", "causal | b == 0"),
]


@pytest.mark.parametrize("declared, mask", DATA_MASKS)
@pytest.mark.parametrize("mean_run", [3.0, 90.0])
def test_gluon_walk_of_masks_over_runtime_data(declared, mask, mean_run):
    """The planned walk over 2 examples x 3 heads of 384 x 384 with random
    documents (runs of 3 or 90 tokens): every visible pair of the dense mask
    lies in a computed half-tile, and no masked pair in one computed whole."""
    from flashgen.verify import Shape, random_runtime_inputs

    variant = make_variant(mask, dtype=ir.DType.FP16, head_dim=64, declared=declared)
    batch, heads, n = 2, 3, 384
    generator = torch.Generator().manual_seed(int(mean_run))
    data = random_runtime_inputs(
        variant, Shape(batch, heads, heads, n, n), "cpu", generator=generator, mean_run=mean_run
    )
    painted = check_planned_walk(variant, data, batch, heads, n)
    if mask.startswith("causal &"):  # not a full sweep: tiles across documents are skipped
        assert all((p[:, :, ::64, ::64] == SKIPPED).any() for p in painted.values())


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(mask=_data_masks(), seed=st.integers(0, 2**16))
def test_gluon_walk_of_drawn_masks_over_runtime_data(mask, seed):
    """The same over masks drawn from comparisons of inputs, positions and
    heads under & | ! (test_inputs.py's strategy), at d64 where the Gluon
    backward takes them, with small random values (sorted ids that repeat,
    lengths, per-head offsets)."""
    from flashgen import lower

    used = [name for name in _DATA_DECLARATIONS if f"{name}[" in mask]
    declared = "; ".join(_DATA_DECLARATIONS[name] for name in used)
    variant = make_variant(mask, dtype=ir.DType.FP16, head_dim=64, declared=declared)
    model = lower.lower(variant)
    if not (model.gluon_backward and model.data_plan):
        return  # no data read, or the Triton backward (decision 076)
    batch, heads, n = 2, 2, 256
    g = torch.Generator().manual_seed(seed)
    values = {
        "d": lambda: torch.randint(0, 4, (batch, n), generator=g, dtype=torch.int32).sort()[0],
        "p": lambda: torch.randint(0, n + 1, (batch,), generator=g, dtype=torch.int32),
        "t": lambda: torch.randint(-3, 140, (heads,), generator=g, dtype=torch.int32),
    }
    check_planned_walk(variant, {name: values[name]() for name in used}, batch, heads, n)


def check_planned_walk(variant, data, batch: int, heads: int, n: int) -> dict:
    """The planned walk of `variant`'s module over batch x heads of n x n
    with the declared inputs `data`, against the dense mask; returns what
    each kernel paints.  The module's own Gluon kernels: not those of a mask
    over packed documents' positional part (decision 109)."""
    module = build(variant, {"document_runs": False})
    q = torch.zeros(batch, heads, n, 64, dtype=torch.float16)
    inputs = tuple(data[i.name] for i in variant.inputs)
    dkdv_plan, dq_plan = module._data_plans(q, q, 64, 64, (False, True), inputs)
    painted = {name: torch.zeros(batch, heads, n, n, dtype=torch.int8) for name in ("dkdv", "dq")}
    _walk_planned[(n // 128, batch * heads)](
        *painted.values(), dkdv_plan, dq_plan, n, heads,
        module._gluon_query_rows, module._gluon_key_cols, module._gluon_tile_class,
        module._gluon_plan, module._gluon_planned_span,
    )  # fmt: skip
    visible = mask_matrix(variant, n, n, heads, batch=batch, inputs=data)
    if visible.dim() == 3:  # a mask of positions and heads alone: the same for every example
        visible = visible.expand(batch, *visible.shape)
    for name, paint_ in painted.items():
        missed = visible & (paint_ == SKIPPED)
        assert not missed.any(), f"{name}: visible pairs skipped, e.g. {missed.nonzero()[0]}"
        unmasked = ~visible & (paint_ == WHOLE)
        assert not unmasked.any(), f"{name}: a masked pair computed whole: {unmasked.nonzero()[0]}"
    return painted


def test_gluon_walk_skips_tiles():
    """The walk is not a full sweep: under a narrow band most half-tiles are
    skipped and the interior is computed without the mask (the check above
    would pass for a walk that masks everything)."""
    n = 512
    band = paint(build(make_variant("window(40, 40)", dtype=ir.DType.FP16, head_dim=64)), n, 1)
    for name in ("dkdv", "dq"):
        tiles = band[name][0, ::64, ::64]
        assert (tiles == SKIPPED).sum() > tiles.numel() // 2
    causal = paint(build(make_variant("causal", dtype=ir.DType.FP16, head_dim=64)), n, 1)
    for name in ("dkdv", "dq"):
        tiles = causal[name][0, ::64, ::64]
        assert (tiles == WHOLE).sum() == 28  # below the diagonal of 8 x 8 tiles
        assert (tiles == MASKED).sum() == 8  # the diagonal
