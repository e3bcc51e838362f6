"""Lowering: a checked `Variant` in, a frozen view-model out.

Every decision about the generated kernels is made in Python; the Jinja
templates (one per kernel family, templates/) only loop and branch over the
`KernelModel` that `lower` returns, which experiments may adjust through
its knobs (`flashgen.experiments`).  The analyses live beside this module, one concern each:

* `flashgen.mask_forms`: named masks desugared, negation normal form,
  affine forms, and facts read off them (bands, dense edges).
* `flashgen.tiles`: tile classification, and `flashgen.loop_bounds`:
  position bounds and interiors, as `flashgen.kernel_expr` trees of scalar
  kernel code.
* `flashgen.element_code`: the mask and the score per element, and the
  score's derivative.
* `flashgen.launch`: launch configurations and `Tuning`.
* `flashgen.kernel_choice`: the Gluon kernels, the fast math paths and the
  tanh polynomial.

Facts about the code (does it call `_floor_div`?) are read off the trees;
the trees are printed to Triton source here, in one place, at the end.
This module also re-exports what the rest of flashgen imports from it.
"""

from __future__ import annotations

import hashlib
import math
import dataclasses
from dataclasses import dataclass

from flashgen import grad, index_ranges, input_grads, ir, kernel_choice
from flashgen import kernel_expr as kx
from flashgen.element_code import LOG2E, ElementCode, ScoreKind, constant_value, score_code
from flashgen.kernel_choice import (
    MERGED_MAX_SKIPPED,
    GluonForward,
    branchless_tiles,
    document_runs,
    fast_math,
    gluon_backward,
    gluon_data_forward as data_forward_pays,
    gluon_forward,
    gluon_min_keys,
    heads_first,
    heavy_derivative,
    key_span,
    merged_edges,
    narrow_gap_tiles,
    residue_classes as find_residue_classes,
    tanh_small_poly,
)
from flashgen.launch import (
    CPU_CONFIG,
    LaunchConfig,
    Tuning,
    gpu_bwd_config,
    gpu_config,
    gpu_decode_configs,
    gpu_tma,
)
from flashgen.mask_forms import (
    affine,
    desugar_mask,
    edges_dense,
    keys_before_queries,
    negation_normal_form,
    positional_part,
    skip_tile_test,
)
from flashgen.printer import print_expr, print_variant
from flashgen.loop_bounds import (
    MAX_INTERIORS,
    interior_bounds,
    interiors,
    key_bounds,
    key_spans,
    query_bounds,
    skipped_share,
)
from flashgen.tiles import TileCode, visible_may

__all__ = [
    "LOG2E",
    "ElementCode",
    "GluonForward",
    "InputModel",
    "KernelModel",
    "LaunchConfig",
    "ScoreKind",
    "TileCode",
    "Tuning",
    "affine",
    "constant_value",
    "desugar_mask",
    "edges_dense",
    "head_dim_pad",
    "interior_bounds",
    "interiors",
    "MAX_INTERIORS",
    "key_bounds",
    "key_span",
    "keys_before_queries",
    "lower",
    "negation_normal_form",
    "query_bounds",
    "reads_runtime_data",
    "score_code",
    "spec_hash",
]

_TORCH_DTYPES = {
    ir.DType.FP16: "torch.float16",
    ir.DType.BF16: "torch.bfloat16",
    ir.DType.FP32: "torch.float32",
}
_TL_DTYPES = {
    ir.DType.FP16: "tl.float16",
    ir.DType.BF16: "tl.bfloat16",
    ir.DType.FP32: "tl.float32",
}


@dataclass(frozen=True)
class InputModel:
    """A declared input as the module passes it: the kernels take `name_ptr`,
    `strides` and `sizes` (scalar parameters, one per dimension) and gather
    them into the tuples `name_strides` and `name_sizes`."""

    name: str
    rank: int
    integer: bool  # read as int64 (else float32)
    torch_dtype: str
    # The shape as the host checks it: "B", "H", "Hkv", "Nq", "Nk" or a number.
    shape: tuple[str | int, ...]

    @property
    def strides(self) -> tuple[str, ...]:
        return tuple(f"{self.name}_stride{d}" for d in range(self.rank))

    @property
    def sizes(self) -> tuple[str, ...]:
        return tuple(f"{self.name}_size{d}" for d in range(self.rank))

    @property
    def kernel_params(self) -> tuple[str, ...]:
        return (f"{self.name}_ptr", *self.strides, *self.sizes)


@dataclass(frozen=True)
class InputGradModel:
    """A read of a learnable input as the dQ programs (or, for COLS, the
    dK/dV programs) sum its gradient into the buffer `grad<number>_ptr` (see
    `flashgen.input_grads`)."""

    number: int
    input: InputModel
    read: str  # as the spec writes it, for docstrings
    form: str  # input_grads.Form's value
    # Each index over the dQ tile (q_pos, k_pos, head, batch), and for the
    # final write, with a TABLE's moving index replaced by its range.
    indices: tuple[str, ...]
    write_indices: tuple[str, ...]
    # d score / d read (None: the constant 1, the read is added to the score).
    derivative_code: str | None
    derivative_uses_s: bool
    # TABLE: the moving index's dimension, and its size padded to a power of 2.
    table_dim: int | None
    table_pad: int | None
    # The program coordinates that get slots of their own, and the slot's code.
    slot_batch: bool
    slot_head: bool
    slot_tile: bool
    # COLS: an index mentions h; the dK/dV program stores per query head.
    per_query_head: bool = False
    # TABLE: the read's `TileRead` name (its `_bounds_<name>` helper says
    # whether one element serves a whole tile, and its indices), if it has one.
    tile_read: str | None = None
    tile_arity: int = 0
    # ROWS whose d score / d read is a constant c (a shift of the row's
    # scores, FoX's c[b, h, q]): the row's dS sums to c * dlse where its
    # probabilities sum to 1 (decision 091), so the dQ programs take
    # c * (dlse * rowsum(P) + (delta + dlse) * (1 - rowsum(P))) instead of
    # per-tile sums, and need no row term pass for it.  The constant's code.
    shift: str | None = None

    @property
    def slot_code(self) -> str:
        slot = "batch" if self.slot_batch else "0"
        if self.slot_head:
            # A COLS read's dK/dV program sums its kv head's query heads in
            # one slot, unless it stores per query head.
            head = "kv_head" if self.form == "cols" and not self.per_query_head else "head"
            slot = head if slot == "0" else f"({slot} * num_heads + {head})"
        if self.slot_tile:
            slot = "query_tile" if slot == "0" else f"{slot} * query_tiles + query_tile"
        return slot


def _input_grad_models(
    v: ir.Variant,
    models: tuple[InputModel, ...],
    keys_first: bool,
    read_names: dict[ir.Index, str],
) -> tuple[tuple[InputGradModel, ...], list[kx.Expr]]:
    """The learnable reads' models, and their code trees (for the helpers'
    facts: floor division, tanh, ALiBi)."""
    result, trees = [], []
    for number, r in enumerate(input_grads.learnable_reads(v)):
        indices = [ElementCode().expr(a) for a in r.read.args]
        derivative = None
        if r.derivative != grad.ONE:
            derivative = ElementCode(keys_first).real(r.derivative)
        trees += [*indices, derivative]
        write = [kx.to_source(e) for e in indices]
        pad = None
        bounds: dict = {}
        if r.table_dim is not None:
            pad = 1 << max(r.table_size - 1, 0).bit_length()
            write[r.table_dim] = f"tl.arange(0, {pad})"
            if r.read in read_names:
                bounds = dict(tile_read=read_names[r.read], tile_arity=len(r.read.args))
        shift = None
        if r.form is input_grads.Form.ROWS and constant_value(r.derivative) is not None:
            shift = kx.to_source(ElementCode(keys_first).real(r.derivative))
        result.append(
            InputGradModel(
                number=number,
                input=models[r.input_number],
                read=print_expr(r.read),
                form=r.form.value,
                indices=tuple(kx.to_source(e) for e in indices),
                write_indices=tuple(write),
                derivative_code=_source(derivative),
                derivative_uses_s=derivative is not None and kx.uses(derivative, "s"),
                table_dim=r.table_dim,
                table_pad=pad,
                slot_batch=r.slot_batch,
                slot_head=r.slot_head,
                slot_tile=r.slot_tile,
                per_query_head=r.per_query_head,
                shift=shift,
                **bounds,
            )
        )
    return tuple(result), trees


@dataclass(frozen=True)
class TileRead:
    """A read of a real input in the score whose indices move with q or k,
    which may hold one element over a whole tile (decision 050): the tile code of its indices' bounds, the test that they
    meet, and the read at those bounds and per element."""

    name: str  # the variable _scores_log2 loads it into
    read: str  # as the spec writes it
    # The body of its `_bounds_<name>` helper: `lines`, then the test
    # `constant` and the indices at the bounds, `indices` (sources over q_lo,
    # q_hi, k_lo, k_hi, head, num_heads, batch).
    lines: tuple[str, ...]
    constant: str
    indices: tuple[str, ...]
    scalar: str  # the element at the indices the helper returns
    element: str

    @property
    def bounds_targets(self) -> str:
        """The names a call of `_bounds_<name>` assigns."""
        return ", ".join(
            [f"{self.name}_one", *(f"{self.name}_i{j}" for j in range(len(self.indices)))]
        )


def _tile_reads(
    v: ir.Variant,
) -> tuple[dict[ir.Index, str], tuple[TileRead, ...], list[kx.Stmt | kx.Expr]]:
    reals = {i.name for i in v.inputs if not i.element.is_integer}
    found = dict.fromkeys(index_ranges.reads(v.score))  # distinct, in order
    moving = [r for r in found if r.input in reals and ir.mentions(r, frozenset("qk"))]
    names = {r: f"read{n}" for n, r in enumerate(moving)}
    tiles = TileCode()
    result, trees = [], []
    for r in moving:
        start = len(tiles.lines)
        tests, args = [], []
        for a in r.args:
            if ir.mentions(a, frozenset("qk")):
                lo, hi = tiles.interval(a)
                tests.append(kx.Cmp("==", lo, hi))
                args.append(lo)
            else:
                args.append(ElementCode().expr(a))
        constant = tests[0]
        for t in tests[1:]:
            constant = kx.and_(constant, t)
        trees += [constant, *args]
        result.append(
            TileRead(
                name=names[r],
                read=print_expr(r),
                lines=tuple(kx.stmt_source(x) for x in tiles.lines[start:]),
                constant=kx.to_source(constant),
                indices=tuple(kx.to_source(a) for a in args),
                scalar=kx.to_source(
                    kx.Load(r.input, tuple(kx.Var(f"{names[r]}_i{j}") for j in range(len(args))))
                ),
                element=kx.to_source(ElementCode().expr(r)),
            )
        )
    return names, tuple(result), [*tiles.lines, *trees]


def _input_model(i: ir.Input) -> InputModel:
    return InputModel(
        name=i.name,
        rank=len(i.shape),
        integer=i.element.is_integer,
        torch_dtype=i.element.torch_name,
        shape=tuple(i.shape),
    )


@dataclass(frozen=True)
class TileSection:
    """How the Triton loops bound and classify tiles of one mask: the whole
    mask's (`KernelModel.tiles`, residue 0), or (residue classes, decision
    085) the mask on the rows whose positions differ by `residue` mod the
    step (`KernelModel.residue_sections`).  The loop macros of
    templates/tile_loops.j2 take either as `t`."""

    residue: int
    mask_text: str
    # The mask is `full` (every pair visible).
    mask_is_full: bool
    # Tile classification: the scalar code, then whether every pair of the
    # tile is visible and whether some pair may be; `tile_never_empty` when
    # the latter is the constant True.
    tile_lines: tuple[str, ...]
    tile_all_visible: str
    tile_may: str
    tile_never_empty: bool
    # Key positions that some query of a query tile can see (bounds the key loops).
    key_lo: str | None
    key_hi: str | None
    # Query positions that can see a key tile (bounds the backward's dK/dV loop).
    query_lo: str | None
    query_hi: str | None
    # Keys that every query of a query tile sees (and the converse): tiles
    # wholly inside run in a branch-free loop without the elementwise mask.
    # `*_interior` is False when the analysis finds no such interval; a side
    # that is None is unbounded.
    key_interior: bool
    key_interior_lo: str | None
    key_interior_hi: str | None
    query_interior: bool
    query_interior_lo: str | None
    query_interior_hi: str | None
    # A second such interval, for a mask whose interior has a gap
    # (`causal | k >= q + 27`): its tiles run without the mask too.
    key_interior2: bool
    key_interior2_lo: str | None
    key_interior2_hi: str | None
    query_interior2: bool
    query_interior2_lo: str | None
    query_interior2_hi: str | None
    # Tiles outside a loop's interior are classified (the tile code) before
    # their masked step runs: not when every such tile may hold a visible
    # pair anyway (`tile_never_empty`) or the bounds are dense.
    classify_edge_tiles: bool
    # One loop over each program's tiles, the edge tiles (outside the
    # interior) masked in a branch (`kernel_choice.merged_edges`), instead of
    # three loops; only where no edge tile needs classifying.  With residue
    # classes the whole mask's is whether any section's is: the kernels' tile
    # functions then take `edge`.
    merged_edges: bool
    # Loops without an interior call the masked tile for every tile, with no
    # branch (`kernel_choice.branchless_tiles`); always correct, as a masked
    # tile computes a whole or an empty one right.
    branchless_tiles: bool
    # Where the key interior has two intervals and the mask is a union (or an
    # intersection with one): two key spans that hold every visible key
    # (`loop_bounds.key_spans`), (lo, hi, lo, hi), a side None where
    # unbounded; the masked loop between the intervals walks only their
    # tiles (decision 114).  None otherwise.
    key_spans: tuple[str | None, ...] | None = None


def _tile_section(
    mask: ir.Expr,
    exact: ir.Expr,
    dtype: ir.DType,
    plan: "DataPlan | None",
    residue: int = 0,
    full: bool | None = None,
) -> tuple[TileSection, list]:
    """The tile section of `mask` (negation normal form): its tile code and
    loop bounds, emptiness decided exactly from `exact` (the mask itself, or
    with a class's congruence), with the kx trees of its scalar code; `full`:
    whether every pair is visible (default: the mask is `full`)."""
    tiles = TileCode()
    full = mask == ir.FULL if full is None else full
    spans = None
    if full:
        all_visible, may = kx.TRUE, kx.TRUE
        key_lo = key_hi = query_lo = query_hi = None
        key_interior = query_interior = (None, None)
        key_interior2 = query_interior2 = None
    else:
        all_visible, may = tiles.truth(mask)
        may = visible_may(tiles, exact, may)
        key_lo, key_hi = key_bounds(mask)
        query_lo, query_hi = query_bounds(mask)
        key_interior, key_interior2 = _two(interiors(mask, "k"))
        query_interior, query_interior2 = _two(interiors(mask, "q"))
        if key_interior2 is not None and plan is None:
            spans = key_spans(mask)
    if plan is not None:
        # The interior is where the plan finds every pair of a tile visible
        # (its classification covers the positional terms too).
        key_interior = _planned_interior(key_interior)
        query_interior = _planned_interior(query_interior)
        if key_interior2 is not None:
            key_interior2 = _planned_interior(key_interior2)
        if query_interior2 is not None:
            query_interior2 = _planned_interior(query_interior2)
    # The tile tests classify the positional terms only (a data comparison
    # may always hold there); the masked loops run without them where the
    # positional part leaves them little or nothing to skip (`skip_tile_test`).
    positional = positional_part(mask)
    classify = not (
        may == kx.TRUE
        or full
        or positional is None
        or skip_tile_test(positional)
        or narrow_gap_tiles(positional)
    )
    # Short rows take the merged loop even where the tile test would skip some
    # edge tiles, if few: each runs masked there (decision 076).
    merged = (
        not full
        and merged_edges(mask, plan is not None)
        and not (
            classify and skipped_share(tiles.lines, may, (key_lo, key_hi)) > MERGED_MAX_SKIPPED
        )
    )
    section = TileSection(
        residue=residue,
        mask_text=print_expr(mask),
        mask_is_full=full,
        tile_lines=tuple(kx.stmt_source(s) for s in tiles.lines),
        tile_all_visible=kx.to_source(all_visible),
        tile_may=kx.to_source(may),
        tile_never_empty=may == kx.TRUE,
        key_lo=_source(key_lo),
        key_hi=_source(key_hi),
        query_lo=_source(query_lo),
        query_hi=_source(query_hi),
        key_interior=key_interior is not None,
        key_interior_lo=_source(key_interior[0]) if key_interior else None,
        key_interior_hi=_source(key_interior[1]) if key_interior else None,
        query_interior=query_interior is not None,
        query_interior_lo=_source(query_interior[0]) if query_interior else None,
        query_interior_hi=_source(query_interior[1]) if query_interior else None,
        key_interior2=key_interior2 is not None,
        key_interior2_lo=_source(key_interior2[0]) if key_interior2 else None,
        key_interior2_hi=_source(key_interior2[1]) if key_interior2 else None,
        query_interior2=query_interior2 is not None,
        query_interior2_lo=_source(query_interior2[0]) if query_interior2 else None,
        query_interior2_hi=_source(query_interior2[1]) if query_interior2 else None,
        classify_edge_tiles=classify,
        merged_edges=merged,
        branchless_tiles=branchless_tiles(positional, dtype),
        key_spans=None if spans is None else tuple(_source(b) for span in spans for b in span),
    )
    code = [
        *tiles.lines,
        key_lo,
        key_hi,
        query_lo,
        query_hi,
        *(key_interior or ()),
        *(query_interior or ()),
        *(b for span in spans or () for b in span),
        *(key_interior2 or ()),
        *(query_interior2 or ()),
    ]
    return section, code


_Q_MINUS_K = ir.Binary(ir.BinOp.SUB, ir.Name("q"), ir.Name("k"))


@dataclass(frozen=True)
class KernelModel:
    """Everything the module template needs, already decided."""

    name: str
    spec_text: str
    spec_hash: str
    torch_dtype: str
    tl_dtype: str
    head_dim: int
    head_dim_pad: int
    # v's, o's and dO's last dimension (MLA's v_head_dim) and its tiles' width.
    # `v_dim` names the kernels' constexpr for it: V_DIM where it differs from
    # HEAD_DIM (`split_v`: the kernels then take V_DIM and V_DIM_PAD too).
    v_head_dim: int
    v_head_dim_pad: int
    split_v: bool
    v_dim: str
    # v may be a view of k's first V_DIM columns (v_head_dim < head_dim: the
    # absorbed MLA cache): the forward and decode kernels then take V_IN_K and
    # read those columns once, q and k split at V_DIM (K_REST_PAD: the rest's tiles).
    v_in_k: bool
    k_rest_pad: int
    # HEAD_DIM, V_DIM or the rest past V_DIM is padded: row loads mask the head dim.
    dims_padded: bool
    default_scale: float
    # Call-time limits (ir.MAX_SEQ_LEN, ir.MAX_HEADS) that the module enforces.
    max_seq_len: int
    max_heads: int
    bottom_right: bool
    rescale_threshold: float
    # input_precision of every tl.dot, or None for the operands' own: float32
    # specs keep IEEE products (three TF32 products, "tf32x3", were 5-10x
    # faster but failed the float32 error rule: docs/decisions/015).
    dot_precision: str | None
    # Score.  `score_log2_code` is log2(e) times the bias for ADDITIVE and
    # log2(e) times f(s) for GENERAL.
    score_kind: ScoreKind
    score_log2_code: str
    # d score / d s for GENERAL scores (None when it is the constant 1).
    score_grad_code: str | None
    # Lines before each (`tanh0 = _tanh(s * 0.1)`): a function call that the
    # score, or its derivative, makes more than once is made once.
    score_lines: tuple[str, ...]
    score_grad_lines: tuple[str, ...]
    # The score can be NaN at s = 0 (sqrt, log or a division by a non-constant):
    # padded query rows (q = 0) then need p = 0 explicitly in the dK/dV kernel.
    score_nan_at_zero: bool
    score_grad_uses_s: bool
    uses_alibi: bool
    uses_positions: bool
    # The mask's element code (`True` where the mask is `full`).
    mask_code: str
    # The whole mask's tile section: how the Triton loops that walk positions
    # (and the Gluon kernels) bound and classify tiles.
    tiles: TileSection
    # Residue classes (`kernel_choice.residue_classes`, decision 085): with a
    # step n > 1 the Triton forward and backward programs take the rows of one
    # class of positions mod n (n rows apart), and for each section (a residue
    # r of q - k mod n that some pair holds) the class of keys whose positions
    # differ from theirs by r mod n, with that section's tile code and bounds
    # (`tiles` then serves the kernels that walk positions).
    residue_step: int
    residue_sections: tuple[TileSection, ...]
    # Helpers the element code calls.
    needs_floor_div: bool
    needs_tanh: bool
    # tanh keeps its relative accuracy near 0 (a polynomial branch) for
    # float32 specs and wherever its error is amplified (see `kernel_choice.tanh_small_poly`);
    # for 16-bit softcaps with a moderate cap an absolute error of ~2^-22 is
    # far below the inputs' rounding, and the branch costs 15-20% of the kernel.
    tanh_small_poly: bool
    # `_tanh` and `_log` take the GPU's approximate instructions (tanh.approx.f32,
    # lg2.approx.f32) for 16-bit modules (`kernel_choice.fast_math`); the
    # interpreter, which runs no PTX, takes their portable branch.
    fast_math: bool
    needs_log: bool
    gpu_config: LaunchConfig
    cpu_config: LaunchConfig
    gpu_bwd_config: LaunchConfig
    gpu_tma: bool
    gpu_bwd_tma: bool
    tuned_on: str | None  # GPU name when the configs come from `flashgen tune`
    # The warp-specialized Gluon forward for Hopper, or None (see
    # `kernel_choice.gluon_forward`), and its number of K/V buffers.
    gluon_forward: GluonForward | None = None
    gluon_stages: int = 3
    # The fewest keys a call needs for the Gluon forward (0: any number).
    gluon_min_keys: int = 0
    # The warp-specialized Gluon backward for Hopper (see `kernel_choice.gluon_backward`),
    # its streamed buffers (dK/dV kernel, dQ kernel), and whether its dQ CTAs
    # take the last query rows first (they see the most keys).
    gluon_backward: bool = False
    gluon_bwd_stages: tuple[int, int] = (3, 2)
    # Rows of the streamed tiles: Q and dO in the dK/dV kernel, K and V in the
    # dQ kernel (each consumer keeps 64 resident rows whatever these are).
    gluon_bwd_streams: tuple[int, int] = (64, 64)
    gluon_dq_heavy_last: bool = False
    # Varlen calls of sequences with as many queries as keys take the Gluon
    # forward too (knob `gluon_varlen`; on wherever the module has the Gluon
    # forward and no declared inputs: 1.35x the Triton forward on an H100,
    # decisions 102-103), and the Gluon backward (knob `gluon_varlen_backward`,
    # likewise: 1.36x, decision 104).
    gluon_varlen: bool = False
    gluon_varlen_backward: bool = False
    # Varlen calls captured in a CUDA graph (or under torch.compile) take them
    # too, over a table made on the GPU (knob `gluon_varlen_captured`; on
    # wherever either is: forward 1.31-1.32x, backward 1.46x the Triton
    # kernels on an H100, decision 107).
    gluon_varlen_captured: bool = False
    # Experiment knobs set on this plan (flashgen/experiments.py), as NAME=VALUE.
    experiments: tuple[str, ...] = ()
    # Experiment (decision 080): the Gluon backward's consumers compute P through
    # one call of `_attn_probs` instead of two inlined calls (whole tiles
    # without the mask, others with it): "flag", the mask skipped at run time
    # on whole tiles (`edge`); "masked", every tile masked.  None: two calls.
    gluon_one_probs_call: str | None = None
    # Built with `flashgen build --triton-only`: the Gluon kernels left out.
    triton_only: bool = False
    # Runtime data: the declared inputs, and what the element code's helpers
    # (`_scores_log2`, `_score_grad`, `_attn_probs`) take besides their usual
    # arguments: the batch index and each input's pointer, strides and sizes
    # (empty for a variant that reads neither).
    inputs: tuple[InputModel, ...] = ()
    element_args: tuple[str, ...] = ()
    # A mask that reads runtime data: the per-call plan of the tiles it
    # leaves visible (None: the positional bounds alone).
    data_plan: DataPlan | None = None
    # The indices a call checks (`flashgen.index_ranges.IndexRange.as_tuple`).
    index_ranges: tuple[tuple, ...] = ()
    # The reads of learnable inputs whose gradients the dQ programs sum.
    input_grads: tuple[InputGradModel, ...] = ()
    # Experiment (flashgen/experiments.py): input reads in a branch, which
    # Triton's pipeliner leaves alone, instead of 4-byte cp.async copies.
    gather_unpipelined: bool = False
    # The score's reads that move with q or k read once per tile where their
    # indices are constant over it (`tile_reads`), with the score's log2 code
    # over their variables; off only as an experiment (decision 050).
    hoist_reads: bool = True
    # The Triton forward's grid is (batch * heads, query tiles), one query tile
    # of every head after another (`kernel_choice.heads_first`, decision 069).
    heads_first: bool = False
    # The same for the Triton backward's one launch: (batch * heads, key tiles
    # + query tiles), every head's dK/dV of a key tile after another, then
    # the dQ programs (decision 070).
    bwd_heads_first: bool = False
    # Experiment (decision 072): the Triton backward of padded and varlen calls
    # streams its tiles through TMA descriptors as other calls do, each tile
    # at its sequence's first row, rows past the sequence's end zeroed.
    seqs_tma: bool = False
    tile_reads: tuple[TileRead, ...] = ()
    score_log2_hoisted_code: str = ""
    # Split-KV decoding (decision 052): a no-gradient call with few query rows
    # against many keys runs `_attn_decode`; not for specs that read runtime
    # data.  `decode_bounds`: its loops take the forward's key bounds and tile
    # classes (not where the mask reads h: a decode tile holds several heads).
    decode: bool = False
    decode_bounds: bool = False
    gpu_decode_configs: tuple[LaunchConfig, ...] = ()
    # Packed documents through a mask `P & doc[b, q] == doc[b, k]`
    # (`kernel_choice.document_runs`, decision 109): the plan of P, whose
    # Gluon kernels the module carries in place of its own, for calls whose
    # TilePlan found the ids in runs of distinct ids.  In that plan,
    # `dense_runs`: its Gluon kernels also walk a dense batch's runs as
    # sequences (VARLEN == 2), and `helper_prefix` names its element code's
    # helpers apart from the module's (`_runs_scores_log2`).
    runs: "KernelModel | None" = None
    dense_runs: bool = False
    helper_prefix: str = ""

    @property
    def edge_param(self) -> bool:
        """Whether `_scores_log2` and `_attn_probs` take `edge`, a run-time
        flag that skips the mask: for the merged loops' edge tiles, and for
        the Gluon backward's one call (`gluon_one_probs_call`)."""
        return self.tiles.merged_edges or (
            self.gluon_one_probs_call == "flag" and self.gluon_backward
        )

    @property
    def hoisting(self) -> bool:
        return self.hoist_reads and bool(self.tile_reads)

    def _inputs_read_by(self, grads: tuple[InputGradModel, ...]) -> tuple[InputModel, ...]:
        seen = {g.input.name for g in grads}
        return tuple(i for i in self.inputs if i.name in seen)

    @property
    def learnable_inputs(self) -> tuple[InputModel, ...]:
        """The learnable inputs that have reads, in declaration order."""
        return self._inputs_read_by(self.input_grads)

    @property
    def dq_inputs(self) -> tuple[InputModel, ...]:
        """The learnable inputs that the dQ programs sum reads of."""
        return self._inputs_read_by(self.dq_grads)

    @property
    def dkdv_inputs(self) -> tuple[InputModel, ...]:
        """The learnable inputs that the dK/dV programs sum reads of."""
        return self._inputs_read_by(self.dkdv_grads)

    @property
    def dq_grads(self) -> tuple[InputGradModel, ...]:
        """The learnable reads the dQ programs sum (every form but COLS)."""
        return tuple(g for g in self.input_grads if g.form != "cols")

    @property
    def dkdv_grads(self) -> tuple[InputGradModel, ...]:
        """The learnable reads the dK/dV programs sum: COLS, one sum per key."""
        return tuple(g for g in self.input_grads if g.form == "cols")

    @property
    def dkdv_accumulators(self) -> tuple[str, ...]:
        """What the dK/dV tile function carries for the learnable reads."""
        return tuple(f"grad{g.number}" for g in self.dkdv_grads)

    @property
    def summed_dq_grads(self) -> tuple[InputGradModel, ...]:
        """The reads the dQ tile function sums tile by tile (all but shifts):
        they need the row term recomputed from P and dP (decision 048)."""
        return tuple(g for g in self.dq_grads if g.shift is None)

    @property
    def shift_grads(self) -> tuple[InputGradModel, ...]:
        """The dQ programs' ROWS reads that shift a row's scores (decision 091)."""
        return tuple(g for g in self.dq_grads if g.shift is not None)

    @property
    def grad_accumulators(self) -> tuple[str, ...]:
        """What the dQ tile function carries for the learnable reads: each
        summed read's sums, and rowsum(P) for the shifts."""
        out = []
        for g in self.summed_dq_grads:
            if g.form != "pairs":
                out.append(f"grad{g.number}")
            if self.rows_of_one_element(g):
                out += [f"grad{g.number}_rows", f"grad{g.number}_at"]
        return tuple(out) + (("p_sum",) if self.shift_grads else ())

    def tile_read(self, name: str) -> TileRead:
        (found,) = (r for r in self.tile_reads if r.name == name)
        return found

    def rows_of_one_element(self, g: InputGradModel) -> bool:
        """Whether the dQ programs sum a TABLE read's tiles that read one
        element along their rows only (the tile's bounds are known there)."""
        return g.form == "table" and g.tile_read is not None and self.hoisting

    @property
    def grad_bases(self) -> tuple[str, ...]:
        """Where the dQ tile function stores PAIRS reads' gradients."""
        return tuple(f"grad{g.number}_base" for g in self.dq_grads if g.form == "pairs")

    @property
    def input_names(self) -> str:
        """The inputs as a tuple display of their names: `(doc,)`, `(doc, rel)`."""
        names = [i.name for i in self.inputs]
        return f"({', '.join(names)}{',' if len(names) == 1 else ''})"

    @property
    def input_parts(self) -> tuple[str, ...]:
        """What the tile functions pass on to the element code's helpers."""
        return tuple(f"{i.name}{part}" for i in self.inputs for part in kx.INPUT_PARTS)

    @property
    def input_kernel_params(self) -> tuple[str, ...]:
        return tuple(p for i in self.inputs for p in i.kernel_params)

    @property
    def gluon_data_args(self) -> tuple[str, ...]:
        """What the Gluon backward's kernels and partitions take for a mask
        over runtime data: the call's plan, then the inputs' parameters."""
        return ("plan_ptr", *self.input_kernel_params) if self.data_plan else ()


def _pick(measured: bool | None, default: bool) -> bool:
    return default if measured is None else measured


def spec_hash(spec_text: str) -> str:
    return hashlib.sha256(spec_text.encode()).hexdigest()[:16]


def head_dim_pad(head_dim: int) -> int:
    """The head dim the kernels' tiles use: a power of two, at least 16."""
    return max(16, 1 << (head_dim - 1).bit_length())


def _nan_at_zero(e: ir.Expr) -> bool:
    """Whether `e` holds sqrt, log or a division by a non-constant."""
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, ir.Call):
            if x.fn in ("sqrt", "log"):
                return True
            stack.extend(x.args)
        elif isinstance(x, ir.Binary):
            if x.op is ir.BinOp.DIV and not isinstance(x.right, ir.Num):
                return True
            stack += [x.left, x.right]
        elif isinstance(x, ir.Unary):
            stack.append(x.operand)
    return False


def _source(e: kx.Expr | None) -> str | None:
    return None if e is None else kx.to_source(e)


def lower(
    v: ir.Variant,
    tuning: Tuning | None = None,
    residue_classes: bool | None = None,
    float_distances: bool = False,
    gluon_data_d128: bool = False,
    gluon_data_forward: bool | None = None,
    document_runs: bool | None = None,
) -> KernelModel:
    """The module's plan for a checked variant; `residue_classes` True or
    False walks residue classes wherever they can be walked or nowhere, None
    where they pay (the experiment knob of that name, decision 085);
    `float_distances` emits the score's distances as float differences of
    positions converted per row and column (the knob, decision 094);
    `gluon_data_d128` gives a mask over runtime data the Gluon backward at
    head dim 128 too (the knob, decision 095); `gluon_data_forward` True or
    False gives such a mask the any-mask Gluon forward or not, None where it
    pays (`kernel_choice.gluon_data_forward`; the knob, decision 098);
    `document_runs` False leaves a mask over packed documents without the
    Gluon kernels of its positional part (the knob; None:
    `kernel_choice.DOCUMENT_RUNS`, decision 109)."""
    spec_text = print_variant(v)
    pad = head_dim_pad(v.head_dim)
    v_pad = head_dim_pad(v.v_dim)
    # Launch configurations are measured per head dim; with MLA's two, the
    # wider tile decides (registers and shared memory go to the larger one).
    widest = max(pad, v_pad)
    rest = v.head_dim - v.v_dim  # k's columns past v's, where v may be a view of k
    rest_pad = head_dim_pad(rest) if rest > 0 else 0

    mask = negation_normal_form(desugar_mask(v.mask))
    mask_code = ElementCode().expr(mask)
    mask_is_full = mask_code == kx.TRUE
    # With residue classes (decision 085) the Triton kernels walk, for each
    # residue r of q - k mod step that some pair holds, the mask on the rows
    # whose positions differ by r mod step: one tile section each.
    classes = find_residue_classes(v, residue_classes)
    step, residues = classes or (1, ())
    # The score code may assume the mask's facts (keys before queries).
    fast = fast_math(v)
    keys_first = keys_before_queries(mask)
    score = score_code(v.score, ElementCode(keys_first, fast, float_distances=float_distances))
    read_names, tile_reads, tile_read_code = _tile_reads(v)
    hoisted = score_code(v.score, ElementCode(keys_first, fast, read_names, float_distances))

    plan = None if mask_is_full else data_plan(mask)
    whole, scalar_code = _tile_section(mask, mask, v.dtype, plan, full=mask_is_full)
    sections = []
    for r, part in residues:
        # On the rows of one class pair, q - k = r mod step: the congruence
        # rules out differences the pair never holds (exact emptiness).
        residue = ir.Binary(ir.BinOp.MOD, _Q_MINUS_K, ir.Num(step))
        congruence = ir.Binary(ir.BinOp.EQ, residue, ir.Num(r))
        exact = ir.Binary(ir.BinOp.AND, part, congruence)
        section, code = _tile_section(part, exact, v.dtype, None, r)
        sections.append(section)
        scalar_code += code
    if sections:
        # The kernels' tile functions take `edge` where any section's loop is merged.
        whole = dataclasses.replace(whole, merged_edges=any(s.merged_edges for s in sections))
    inputs = tuple(_input_model(i) for i in v.inputs)
    grads, grad_trees = _input_grad_models(v, inputs, keys_before_queries(mask), read_names)
    needs_floor_div = kx.needs_floor_helpers(
        [mask_code, *score.trees(), *scalar_code, *grad_trees, *tile_read_code]
    )

    positions = frozenset({"q", "k"})
    # A class's rows are `step` rows apart: pointer loads, not TMA.
    default_tma = gpu_tma(widest, v.dtype) if step == 1 else (False, False)
    # A mask of heads (or the batch) alone leaves every tile whole or empty:
    # the forward takes the unmasked tiles.
    cuts_tiles = not mask_is_full and ir.mentions(mask, positions)
    if document_runs is None:  # a knob that asks for the data's Gluon kernels leaves P's out
        document_runs = kernel_choice.DOCUMENT_RUNS and not (gluon_data_forward or gluon_data_d128)
    if gluon_data_forward is None:
        gluon_data_forward = data_forward_pays(mask)
    gluon = gluon_forward(v, gluon_data_forward and plan is not None) if step == 1 else None
    gluon_bwd = step == 1 and gluon_backward(v, plan is not None, gluon_data_d128)
    runs = _runs_plan(v, document_runs)
    if runs is not None:  # the module's Gluon kernels are P's
        gluon, gluon_bwd = None, False
    return KernelModel(
        name=v.name,
        spec_text=spec_text,
        spec_hash=spec_hash(spec_text),
        torch_dtype=_TORCH_DTYPES[v.dtype],
        tl_dtype=_TL_DTYPES[v.dtype],
        head_dim=v.head_dim,
        head_dim_pad=pad,
        v_head_dim=v.v_dim,
        v_head_dim_pad=v_pad,
        split_v=v.v_dim != v.head_dim,
        v_dim="V_DIM" if v.v_dim != v.head_dim else "HEAD_DIM",
        v_in_k=v.v_dim < v.head_dim,
        k_rest_pad=rest_pad,
        dims_padded=pad != v.head_dim
        or v_pad != v.v_dim
        or (v.v_dim < v.head_dim and rest_pad != rest),
        default_scale=v.scale if v.scale is not None else 1.0 / math.sqrt(v.head_dim),
        max_seq_len=ir.MAX_SEQ_LEN,
        max_heads=ir.MAX_HEADS,
        bottom_right=v.align is ir.Align.BOTTOM_RIGHT,
        rescale_threshold=float(v.rescale_threshold),
        dot_precision="ieee" if v.dtype is ir.DType.FP32 else None,
        score_kind=score.kind,
        score_log2_code=_source(score.log2) or "",
        score_grad_code=_source(score.grad),
        score_lines=tuple(kx.stmt_source(s) for s in score.lines),
        score_grad_lines=tuple(kx.stmt_source(s) for s in score.grad_lines),
        score_nan_at_zero=_nan_at_zero(v.score),
        score_grad_uses_s=score.grad_uses_s,
        uses_alibi=score.uses_alibi or _uses_alibi(grad_trees),
        uses_positions=ir.mentions(v.score, positions) or score.uses_alibi,
        mask_code=kx.to_source(mask_code),
        tiles=whole,
        residue_step=step,
        residue_sections=tuple(sections),
        heads_first=heads_first(mask, plan is not None),
        bwd_heads_first=heads_first(mask, plan is not None),
        needs_floor_div=needs_floor_div,
        needs_tanh=score.needs_tanh or kx.calls(grad_trees, kx.TANH),
        tanh_small_poly=tanh_small_poly(v),
        fast_math=fast,
        needs_log=score.needs_log,
        gpu_config=(tuning.forward if tuning else gpu_config(widest, v.dtype, cuts_tiles, v_pad)),
        cpu_config=CPU_CONFIG,
        gpu_bwd_config=(
            tuning.backward
            if tuning
            else gpu_bwd_config(
                widest,
                v.dtype,
                whole.merged_edges,
                v_pad,
                learnable=bool(grads),
                heavy_score=heavy_derivative(v.score),
            )
        ),
        gpu_tma=_pick(tuning.forward_tma if tuning else None, default_tma[0]),
        gpu_bwd_tma=_pick(tuning.backward_tma if tuning else None, default_tma[1]),
        tuned_on=tuning.device if tuning else None,
        gluon_forward=gluon,
        gluon_min_keys=gluon_min_keys(gluon, v.head_dim),
        gluon_backward=gluon_bwd,
        gluon_dq_heavy_last=keys_before_queries(mask),
        gluon_varlen=gluon is not None and not inputs,
        gluon_varlen_backward=bool(gluon_bwd) and not inputs,
        gluon_varlen_captured=(gluon is not None or bool(gluon_bwd)) and not inputs,
        inputs=inputs,
        input_grads=grads,
        tile_reads=tile_reads,
        score_log2_hoisted_code=_source(hoisted.log2) or "",
        index_ranges=tuple(r.as_tuple() for r in index_ranges.ranges(v)),
        element_args=_element_args(v),
        data_plan=plan,
        decode=not reads_runtime_data(v),
        decode_bounds=step == 1 and not ir.mentions(mask, frozenset({"h"})),
        gpu_decode_configs=gpu_decode_configs(widest, v.dtype),
        runs=runs,
    )


def _runs_plan(v: ir.Variant, wanted: bool) -> KernelModel | None:
    """The plan of P for a mask `P & doc[b, q] == doc[b, k]`
    (`document_runs`) where P gets both Gluon kernels, with its varlen
    calls' forward and backward, else None."""
    positional = document_runs(v) if wanted else None
    if positional is None:
        return None
    runs = lower(positional, document_runs=False)
    if runs.gluon_forward is None or not runs.gluon_backward or runs.residue_step > 1:
        return None
    assert runs.gluon_varlen and runs.gluon_varlen_backward
    return dataclasses.replace(
        runs, dense_runs=True, helper_prefix="runs_", gluon_varlen_captured=False
    )


def _uses_alibi(trees: list[kx.Expr | None]) -> bool:
    return any(e is not None and kx.uses(e, "alibi_slope") for e in trees)


_PLAN_FULL = (kx.Var("plan_full_lo"), kx.Var("plan_full_hi"))


def _two(found: tuple | None) -> tuple:
    """An interior's first interval and its second (None where it has none)."""
    if found is None:
        return None, None
    return found[0], (found[1] if len(found) > 1 else None)


def _planned_interior(bounds: tuple | None) -> tuple[kx.Expr, kx.Expr]:
    """Interior bounds (positions) narrowed to the plan's whole tiles."""
    if bounds is None:
        return _PLAN_FULL
    lo, hi = bounds
    return (
        _PLAN_FULL[0] if lo is None else kx.Max(lo, _PLAN_FULL[0]),
        _PLAN_FULL[1] if hi is None else kx.Min(hi, _PLAN_FULL[1]),
    )


@dataclass(frozen=True)
class PlanRead:
    """A read of an input in a mask, as the plan kernel evaluates it over a
    tile: `name` (its interval is `name_lo .. name_hi`), the side whose
    positions it reads ("q", "k", or "" for neither: one value per program),
    and the load over that side's positions (`q_pos`, `k_pos`)."""

    name: str
    side: str
    load: str


@dataclass(frozen=True)
class DataPlan:
    """The per-call plan of a mask that reads runtime data (`_attn_plan`):
    which tiles the data leaves visible, classified by the mask's intervals
    over each tile with each read's range over it."""

    reads: tuple[PlanRead, ...]
    lines: tuple[str, ...]
    must: str
    may: str
    per_head: bool  # the mask reads `h`: one plan per head


def data_plan(mask: ir.Expr) -> DataPlan | None:
    """The plan of a desugared mask in negation normal form, or None where it
    reads no runtime data or reads an input at an index over both q and k
    (whose range over a tile is not a product of the two sides' ranges)."""
    if not ir.reads_runtime_data(mask):
        return None
    reads: dict[ir.Index, str] = {}
    plan_reads = []
    for node in index_ranges.reads(mask):
        if node in reads:
            continue
        sides = {v for a in node.args for v in ("q", "k") if ir.mentions(a, frozenset({v}))}
        if len(sides) > 1:
            return None
        reads[node] = f"r{len(reads)}_{node.input}"
        load = kx.Load(node.input, tuple(ElementCode().expr(a) for a in node.args))
        plan_reads.append(PlanRead(reads[node], "".join(sides), kx.to_source(load)))
    tiles = TileCode(reads)
    must, may = tiles.truth(mask)
    return DataPlan(
        reads=tuple(plan_reads),
        lines=tuple(kx.stmt_source(s) for s in tiles.lines),
        must=kx.to_source(must),
        may=kx.to_source(may),
        per_head=ir.mentions(mask, frozenset({"h", "H"})),
    )


def _element_args(v: ir.Variant) -> tuple[str, ...]:
    if not reads_runtime_data(v):
        return ()
    return ("batch", *(f"{i.name}{part}" for i in v.inputs for part in kx.INPUT_PARTS))


def reads_runtime_data(v: ir.Variant) -> bool:
    """Whether the mask or the score reads an input or the batch index."""
    return ir.reads_runtime_data(v.mask) or ir.reads_runtime_data(v.score)
