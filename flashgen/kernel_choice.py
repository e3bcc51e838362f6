"""Kernel selection: which specialised kernels a module carries.

A checked `Variant` in, decisions out: the warp-specialized Gluon forward
(`GluonForward`) and backward for Hopper, whether the score's functions take
the GPU's approximate instructions (`fast_math`), and whether the portable
`_tanh` keeps its polynomial branch near 0.  The module constants here are read at each call
of `lower()`; experiments and tests patch them on this module.
"""

from __future__ import annotations

import dataclasses
import enum
import math

from flashgen import grad, ir
from flashgen.loop_bounds import interiors, key_bounds, skipped_share
from flashgen.simplify import simplify
from flashgen.tiles import TileCode, residue_masks, visible_may
from flashgen.mask_forms import (
    FLIPPED,
    K_MINUS_Q,
    Q,
    K,
    affine,
    chain,
    clean,
    constant,
    desugar_mask,
    difference,
    hides_every_pair,
    int_arg,
    is_comparison,
    k_minus_q,
    narrow_band,
    narrow_gaps,
    negation_normal_form,
    never_fills_a_tile,
    operands,
    positional_part,
    prefix_atom,
    shift_invariant,
    skip_tile_test,
)


class GluonForward(str, enum.Enum):
    """The Gluon forward a module carries: for the full mask with the score
    s, for the causal one, or for any mask and score."""

    FULL = "full"
    CAUSAL = "causal"
    ANY = "any"


# The Gluon forward for any mask and score ("any" below) against the Triton
# forward on the same spec (docs/decisions/029; d128, bf16): 0.84-0.99x
# at N = 1024, 1.02-1.07x at N = 4096 and 16384 when a query row sees
# thousands of keys, 0.85-0.91x for a 257-key band at every N.  It runs when
# a query row can see at least GLUON_ANY_MIN_KEYS keys: the module's mask
# must allow that many (`key_span`), the call's sequence must be that long.
GLUON_FORWARD_ANY = True
GLUON_ANY_MIN_KEYS = 4096
# The head dims that get the Gluon forward for the full and causal masks with
# the score s, those that also get it for any other mask and score, and the
# fewest keys a call needs for the full or causal one, by head dim (absent:
# any number).  At d64 against the Triton forward (H200, bf16, B*N = 16384,
# `bash scripts/gpu_gluon_d64.sh bench` on 221375c, 2026-12-03, decision
# 068): full 0.94x at N = 1024, 1.05x at 4096, 1.11x at 16384; causal 0.70x,
# 1.06x, 1.15x (0.93-1.03x cuDNN from 4096 on, against 0.89-0.94x); for other
# masks and scores it lost or tied (a 4096-key window 0.86x / 0.95x at N =
# 4096 / 16384, ALiBi 0.91x / 1.05x, a softcapped window 1.00x / 1.01x).
GLUON_FORWARD_HEAD_DIMS = (64, 128)
GLUON_FORWARD_ANY_HEAD_DIMS = (128,)
GLUON_PLAIN_MIN_KEYS = {64: 4096}


def key_span(e: ir.Expr) -> int | None:
    """The most keys one query position can see, when a constant bounds it
    (None: not bounded, or not by a form recognized here).

    A band lo <= k - q <= hi (the comparisons of an & chain) sees at most
    hi - lo + 1 keys, `abs(q - k) < c` 2c - 1, a chunk C (q div C == k div C)
    at most C, k < P at most P, `!full` none; & keeps the smallest bound of its operands,
    | adds its operands' bounds.
    """
    if isinstance(e, ir.Binary) and e.op is ir.BinOp.OR:
        left, right = key_span(e.left), key_span(e.right)
        return None if left is None or right is None else left + right
    lo, hi = -math.inf, math.inf
    spans: list[int] = []

    def walk(x: ir.Expr) -> None:
        nonlocal lo, hi
        if isinstance(x, ir.Binary) and x.op is ir.BinOp.AND:
            walk(x.left)
            walk(x.right)
            return
        if isinstance(x, ir.Binary) and x.op is ir.BinOp.OR:
            span = key_span(x)
            if span is not None:
                spans.append(span)
            return
        near = _abs_band(x)
        if near is not None:  # -near <= k - q <= near
            lo, hi = max(lo, -near), min(hi, near)
            return
        few = 0 if x == constant(False) else _chunk_size(x)
        if few is None:
            few = _keys_below(x)
        if few is not None:
            spans.append(few)
            return
        read = k_minus_q(x)
        if read is not None:
            lo, hi = narrow_band(lo, hi, *read)

    walk(e)
    if lo > -math.inf and hi < math.inf:
        spans.append(max(0, int(hi - lo) + 1))
    return min(spans) if spans else None


def _keys_below(e: ir.Expr) -> int | None:
    """P for `k < P` or `k <= P - 1` (the keys 0 to P - 1), 1 for `k == P`."""
    if not is_comparison(e):
        return None
    d = difference(e)
    if d is None:
        return None
    c = d.pop("", 0)
    if d not in ({"k": 1}, {"k": -1}):
        return None
    # sign * k + c  op  0   <=>   k  op'  -sign * c
    op = e.op if d["k"] == 1 else FLIPPED[e.op]
    bound = -d["k"] * c
    if op is ir.BinOp.EQ:
        return int(bound >= 0)
    if op not in (ir.BinOp.LT, ir.BinOp.LE):
        return None
    return max(0, bound + (op is ir.BinOp.LE))


def _abs_band(e: ir.Expr) -> int | None:
    """The largest |k - q| that `abs(q - k) < c` (either difference, either
    side) allows, c - 1, or c for `<=`; None for other forms."""
    if not is_comparison(e):
        return None
    for a, b, op in ((e.left, e.right, e.op), (e.right, e.left, FLIPPED.get(e.op))):
        if not (isinstance(a, ir.Call) and a.fn == "abs" and isinstance(b, ir.Num)):
            continue
        d = affine(a.args[0])
        if d is None or clean(d) not in K_MINUS_Q or not isinstance(b.value, int):
            continue
        if op is ir.BinOp.LT:
            return b.value - 1
        if op is ir.BinOp.LE:
            return b.value
    return None


def _chunk_size(e: ir.Expr) -> int | None:
    """C for `q div C == k div C` (either side first), else None."""
    if not (isinstance(e, ir.Binary) and e.op is ir.BinOp.EQ):
        return None
    sides = (e.left, e.right)
    if not all(isinstance(x, ir.Binary) and x.op is ir.BinOp.FLOORDIV for x in sides):
        return None
    if {sides[0].left, sides[1].left} != {Q, K} or sides[0].right != sides[1].right:
        return None
    if not isinstance(sides[0].right, ir.Num) or int_arg(sides[0].right) <= 0:
        return None
    return int_arg(sides[0].right)


def gluon_forward(v: ir.Variant, data: bool = False) -> GluonForward | None:
    """Whether the module gets the warp-specialized Gluon forward for sm90
    (docs/decisions/013, 016 and 029), and which, or None.

    Written for the plain variants that race cuDNN: a full or causal mask,
    the score s, 16-bit inputs, a head dim of GLUON_FORWARD_HEAD_DIMS.
    With GLUON_FORWARD_ANY, ANY for every other mask and score at 16 bits and
    a head dim of GLUON_FORWARD_ANY_HEAD_DIMS (it reuses the Gluon backward's
    mask functions) whose query rows may see GLUON_ANY_MIN_KEYS keys or more.
    Not for a score of more than GLUON_ANY_MAX_SPECIAL_OPS special functions,
    quotients and position conversions per element (decision 089), nor for a
    mask whose key bounds hold more than GLUON_ANY_MAX_EMPTY of empty tiles
    (decision 113: the Gluon walk skips none).  A rescale
    threshold permits skipping rescales and requires none: the Gluon kernels
    rescale at every tile (decision 083).  The module still
    checks each call's shapes and falls back to the Triton kernel.  Its tiles
    assume v's head dim is q's: a v_head_dim (MLA) takes the Triton kernel.

    `data`: a mask over runtime data takes the any-mask kernel too, walking
    the tiles the call's plan leaves visible (decision 098; the lowering
    passes `gluon_data_forward(mask)` or the knob of that name, and only where
    `lower.data_plan` finds a plan).  A score that reads runtime data never
    does.
    """
    if (
        v.dtype is ir.DType.FP32
        or v.head_dim not in GLUON_FORWARD_HEAD_DIMS
        or v.v_dim != v.head_dim
        or ir.reads_runtime_data(v.score)
        or ir.reads_runtime_data(v.mask)
        and not data
    ):
        return None
    if v.score == ir.IDENTITY_SCORE and v.mask in (ir.FULL, ir.Name("causal")):
        return GluonForward.FULL if v.mask == ir.FULL else GluonForward.CAUSAL
    mask = negation_normal_form(desugar_mask(v.mask))
    head_dim_taken = v.head_dim in GLUON_FORWARD_ANY_HEAD_DIMS or (
        v.head_dim in GLUON_FORWARD_SPLIT_WALK_HEAD_DIMS
        and not ir.reads_runtime_data(v.mask)
        and split_key_walk(mask)
    )
    if not (GLUON_FORWARD_ANY and head_dim_taken and _gluon_eligible(v, data_masks=data)):
        return None
    if score_special_ops(v.score) > GLUON_ANY_MAX_SPECIAL_OPS:
        return None
    span = key_span(mask)
    if span is not None and span < GLUON_ANY_MIN_KEYS:
        return None
    if not ir.reads_runtime_data(v.mask) and empty_tiles_walked(mask) > GLUON_ANY_MAX_EMPTY:
        return None
    return GluonForward.ANY


# The any-mask Gluon forward walks every key tile between its key bounds
# (`_gluon_key_cols`); the Triton forward skips those its tile test finds empty.
# Its measured gains over the Triton forward are 1.16-1.24x (a prefix per
# example, decision 098) and up to 1.18x at d64 (decision 099): past an eighth
# of its tiles empty it computes more than that wins back.  rand3_12 walked 48% empty tiles at 0.49x
# (decision 112); a mask of a few sink keys and a sliding window (`causal &
# (k < 64 | k >= q - 256)`) walked every tile to the diagonal (decision 113).
GLUON_ANY_MAX_EMPTY = 0.125


def empty_tiles_walked(mask: ir.Expr) -> float:
    """The share of the key tiles inside `mask`'s key bounds that hold no
    visible pair (`loop_bounds.skipped_share` over its sample of query tiles
    at N = 4096): what a walk of the bounds that skips no tile computes for
    nothing.  `mask` in negation normal form."""
    tiles = TileCode()
    _, may = tiles.truth(mask)
    return skipped_share(tiles.lines, visible_may(tiles, mask, may), key_bounds(mask))


# The any-mask Gluon forward at d64 against the Triton forward (H100, bf16,
# B4 H16 N4096, CUDA graphs, `bash scripts/gpu_gluon_d64.sh drawn`,
# 2026-12-06, decision 099): over 15 drawn specs the score's cost did not tell
# winners from losers (0.71-1.18x); the masks whose Triton key loop finds no
# interior (every tile masked) or two (three loops around a gap) all gained,
# 1.02-1.18x, and every one with a single interior ran 0.71-1.03x.  Found
# after the run, so not yet a default: with (64,) here the any-mask kind
# takes those masks at d64 (`split_key_walk`), never a mask over runtime
# data; `bash scripts/gpu_gluon_d64.sh files` times held-out draws first.
GLUON_FORWARD_SPLIT_WALK_HEAD_DIMS: tuple[int, ...] = ()


def split_key_walk(mask: ir.Expr) -> bool:
    """Whether the Triton kernels' key loop finds no interval of keys that
    every query of a tile sees (`loop_bounds.interiors`: every tile then runs
    masked) or two (a gap: three loops).  `mask` desugared, in negation
    normal form, as `lower` classifies its tiles."""
    found = interiors(mask, "k")
    return found is None or len(found) > 1


# The any-mask Gluon forward against the Triton forward of the same module
# at d128 (H100, bf16, B4 H16 N4096, CUDA graphs, `--plan gluon_forward=off`,
# 2026-12-05, decision 089), by the score's quarter-rate operations per
# element (`score_special_ops`): none (rand0_1, 7; rand0_11 across GPUs) 1.09-1.30x faster;
# two: rand0_13 1.23x, rand0_17 1.04x, rand0_29 1.02x, rand0_19 0.85x,
# rand0_25 0.72x; three: rand0_8 0.66x, rand0_12 0.90x, rand0_26 0.75x.
# One (an ALiBi or distance term, or a function of s alone) is the case of
# decision 029, where it won 1.03-1.07x (bloom_alibi).  Two consumer warp
# groups of 64 x 128 scores compute every special function of the score
# between products, and at two and more their consumers spilled up to 1.4 KB
# (rand0_25, 26; sm_90a, offline) where the Triton forward spills nothing.
GLUON_ANY_MAX_SPECIAL_OPS = 1

_POSITION_NAMES = frozenset({"q", "k", "alibi"})


def score_special_ops(score: ir.Expr) -> int:
    """Quarter-rate instructions (special functions and int-to-float
    conversions) the score costs per element, beyond the softmax's own exp2:
    one per call of exp, log, tanh, sqrt or softcap and per quotient by a
    value that varies over the tile (rcp), and one for converting positions
    if the score reads q, k or alibi.  Terms of h alone are per row."""
    score = simplify(score)
    return _special_calls(score) + int(ir.mentions(score, _POSITION_NAMES))


def _special_calls(e: ir.Expr) -> int:
    if isinstance(e, ir.Call):
        own = e.fn in ir.REAL_FUNCTIONS or e.fn == ir.SOFTCAP
        here = int(own and ir.mentions(e, _PER_ELEMENT_NAMES))
        return here + sum(_special_calls(a) for a in e.args)
    if isinstance(e, ir.Unary):
        return _special_calls(e.operand)
    if isinstance(e, ir.Binary):
        quotient = e.op is ir.BinOp.DIV and ir.mentions(e.right, _PER_ELEMENT_NAMES)
        return int(quotient) + _special_calls(e.left) + _special_calls(e.right)
    return 0


# Residue classes (decision 085): a mask with congruences of q - k (moduli
# whose lcm n is at most RESIDUE_MAX_STEP) runs its Triton kernels over the
# rows of each class of positions mod n.  For each residue r of q - k mod n
# that some pair holds, a query class walks the one class of keys at that
# residue, with the mask decided there (`tiles.residue_masks`): its
# congruences true or false, its tiles classified by the ranges left.  Taken
# where that walk visits at most RESIDUE_MAX_RATIO of the tiles the position
# walk visits (counted on the dense mask at RESIDUE_COUNT_N positions in
# tiles of 64); `--plan residue_classes=on` takes it wherever it can.
# Counted offline (decision 084, N = 4096): `causal & (q - k) % 4 == 0`
# visits 0.26 of the tiles, nearly none masked; `(q - k) % 2 == 0` 0.50;
# seed 0's rand0_14, `(q - k) % 2 == 1 | !causal`, 0.76, where its two
# sections' loops made the d128 Triton backward spill 1.5 KB per thread
# against 0.35 KB over positions (sm_90a, ptxas); rand0_25, whose congruence
# only punches holes in a dense mask, 1.09.  Measured on an H100 (decision
# 088, bf16, CUDA graphs): the forward's time follows the tiles visited
# (periodic_causal, ratio 0.26 at N = 1024: 3.9x faster than the position
# walk at d64 N = 4096; rand0_14, 0.78: 1.27x at d128), the backward gains
# about 0.8 of that (3.1x; 1.05x).  So the backward breaks even near a ratio
# of 0.8, the threshold.  Rows of a
# class are n apart in memory: pointer loads (no TMA), and no Gluon kernel.
# Not for specs that declare inputs (their call plans and gradient slots
# count position tiles) or whose v has another head dim (MLA).
RESIDUE_CLASSES = True
RESIDUE_MAX_STEP = 16
RESIDUE_MAX_RATIO = 0.8
RESIDUE_COUNT_N = 1024


def residue_classes(
    v: ir.Variant, wanted: bool | None = None
) -> tuple[int, tuple[tuple[int, ir.Expr], ...]] | None:
    """(n, ((r, mask on q - k = r mod n), ...)) where the Triton kernels walk
    residue classes of positions mod n (`tiles.residue_masks`); else None.
    `wanted`: True takes them wherever they can be taken, False nowhere, None
    where they pay (RESIDUE_MAX_RATIO)."""
    if wanted is False or not RESIDUE_CLASSES or v.inputs or v.v_dim != v.head_dim:
        return None
    found = residue_masks(negation_normal_form(desugar_mask(v.mask)), RESIDUE_MAX_STEP)
    if found is None or not found[1]:
        return None
    return found if wanted or class_tile_ratio(v, found[0]) <= RESIDUE_MAX_RATIO else None


def class_tile_ratio(
    v: ir.Variant, n: int, length: int = RESIDUE_COUNT_N, block: int = 64
) -> float:
    """Non-empty tiles of the class walk mod n over those of the position
    walk, from the dense mask of head 0 at `length` queries and keys."""
    from flashgen.reference import mask_matrix

    mask = mask_matrix(v, length, length, 1)[0]
    classes = sum(_nonempty_tiles(mask[rq::n, rk::n], block) for rq in range(n) for rk in range(n))
    return classes / max(_nonempty_tiles(mask, block), 1)


def _nonempty_tiles(mask, block: int) -> int:
    """Tiles of block x block (the last ones short) that hold a visible pair."""
    rows, cols = mask.shape
    rows_up, cols_up = -(-rows // block) * block, -(-cols // block) * block
    padded = mask.new_zeros(rows_up, cols_up)
    padded[:rows, :cols] = mask
    tiles = padded.reshape(rows_up // block, block, cols_up // block, block)
    return int(tiles.any(dim=3).any(dim=1).sum())


# One loop over a program's tiles, the edge tiles masked in a branch over
# registers, against three loops (masked edge tiles, the unmasked interior,
# masked edge tiles), on the Triton forward of an H200 (bf16, B·N = 16384,
# 2026-12-02, decision 057; `--plan merged_edges=off` gives the three loops
# back for a new measurement): 1.20-1.33x for packed documents
# of ~1000 tokens, 1.09-1.37x for causal chunks of 1024, 1.13-1.56x for a
# 129-key band, 1.05-1.34x for a 1024-key window, 0.93-1.05x for causal at
# N = 4096.  Each loop is software-pipelined apart, so a loop of one or two
# edge tiles waits for each load whole; with short rows that is most of them.
MERGED_EDGES = True


# The most of a loop's tiles the tile test may skip for the merged loop, which
# runs them all, still to be taken (`loop_bounds.skipped_share`): it computes
# 1 / (1 - share) times the tiles, and decision 057 measured it 1.05-1.56x
# faster on short rows; at 1/8 it breaks even at a 1.14x gain (decision 076).
MERGED_MAX_SKIPPED = 0.125


def merged_edges(mask: ir.Expr, planned: bool) -> bool:
    """Whether the Triton kernels walk a program's tiles in one loop, the
    edge tiles taking the elementwise mask in a branch: where rows are short,
    a mask whose keys per query are bounded (`key_span`), or one whose call
    plan (`planned`) bounds them by documents (an `&` term that compares two
    reads of the call's data for equality, such as doc[b, q] == doc[b, k]).
    Where the loops test their tiles, the lowering also asks that the test
    skip at most MERGED_MAX_SKIPPED of them.  `mask` desugared, in negation
    normal form."""
    return MERGED_EDGES and (key_span(mask) is not None or planned and _documents(mask))


# Loops without an interior run every tile masked, with no branch, where the
# mask never fills a tile and its tile test has nothing to skip (decision 074;
# `--plan branchless_tiles=off` gives the branches back).  Measured on the H200
# (bf16, B4 H16, CUDA graphs, 2026-12-04, decision 076): `causal & (q - k) % 4
# == 0` at d64, Triton forward 0.662 -> 0.526 ms at N = 4096 (1.26x), 2.453 ->
# 1.977 ms at 16384 (1.24x); the Triton backward so 1.20-1.24x faster than the
# Gluon backward (`gluon_backward`).
BRANCHLESS_TILES = True


# The masked loops around an interior skip the tile test where the mask is a
# union of comparisons of k - q whose hidden runs are narrower than a tile
# (decision 074, an experiment: `--plan classify_edge_tiles=off`, any mask,
# until measured).
NARROW_GAPS = False


def narrow_gap_tiles(positional: ir.Expr | None) -> bool:
    """Whether the masked loops run without the tile test because every tile
    holds a visible pair of a union of comparisons of k - q (`narrow_gaps`);
    an addition to `skip_tile_test`, off until measured."""
    return NARROW_GAPS and positional is not None and narrow_gaps(positional)


def branchless_tiles(positional: ir.Expr | None, dtype: ir.DType) -> bool:
    """Whether the Triton kernels' loops that have no interior call the masked
    tile for every tile in their bounds, with neither the all-visible test
    (no tile of the mask is whole: `never_fills_a_tile`) nor the emptiness
    test (`skip_tile_test`).  Each is a branch around the tile's loads, which
    keeps Triton from pipelining the loop.  `positional`: the mask's
    positional part (`positional_part`), None where it has none.  Not in
    float32: there the pipelined backward spilled 52 KB (sm_90a, the custom
    example at d64) and ran 7x slower on the H200 (decision 076)."""
    return (
        BRANCHLESS_TILES
        and dtype is not ir.DType.FP32
        and positional is not None
        and never_fills_a_tile(positional)
        and skip_tile_test(positional)
    )


# The Triton forward's grid for document masks: (batch * heads, query tiles),
# one query tile of every head after another, instead of a head's tiles in a
# row.  A document's query tiles differ in work by the document's length, and
# a head's tiles in a row leave a tail of uneven programs; taken across heads,
# the waves even out.  Measured on the H200 (scripts/gpu_heads_first.py,
# packed documents of ~1,000 tokens, B = 1, H = 16, bf16, forward from CUDA
# graphs, decision 069): 1.10-1.11x at d64 and 1.06x at d128 for N = 16384,
# 1.05x and 1.01x at 65536, the same bits.  Not for long rows: a per-example
# prefix over causal rows ran 0.94x at d128 N = 16384 (the heads' keys no
# longer share the L2 cache), though 1.16-1.22x at 4096.  The Triton
# backward's one launch likewise (batch * heads, key tiles + query tiles),
# decision 070: 1.05x at d64 and 1.01x at d128 for N = 16384, 1.02x at 65536.
def heads_first(mask: ir.Expr, planned: bool) -> bool:
    """Whether the Triton forward launches one query tile of every head after
    another, and the backward one tile: a mask whose call plan bounds rows by
    documents (`_documents`).
    `mask` desugared, in negation normal form."""
    return planned and _documents(mask)


def _documents(e: ir.Expr) -> bool:
    if isinstance(e, ir.Binary) and e.op is ir.BinOp.AND:
        return _documents(e.left) or _documents(e.right)
    return (
        isinstance(e, ir.Binary)
        and e.op is ir.BinOp.EQ
        and ir.reads_runtime_data(e.left)
        and ir.reads_runtime_data(e.right)
    )


# The any-mask Gluon forward for masks over runtime data (the knob
# `gluon_data_forward`, decision 098) against the Triton forward of the same
# module, d128, bf16, B·N = 16384 tokens, CUDA graphs (H100, 2026-12-06,
# `bash scripts/gpu_data_forward.sh time`): a prefix per example (`causal | k <
# prefix_len[b]`, rows of up to N keys) 1.21x, 1.16x and 1.24x at N = 4096,
# 16384 and 65536; packed documents of ~1,000 tokens (rows of a few hundred
# keys: a CTA's fixed cost weighs) 0.85x, 0.83x and 0.94x.  So a mask whose
# plan bounds rows by documents (`_documents`) keeps the Triton forward, and
# every other mask over runtime data takes the Gluon one where it is built.
def gluon_data_forward(mask: ir.Expr) -> bool:
    """Whether a mask over runtime data takes the any-mask Gluon forward by
    default (the knob `gluon_data_forward` decides otherwise).  `mask`
    desugared, in negation normal form."""
    return not _documents(mask)


# Packed documents through a mask over their ids, `P & doc[b, q] == doc[b, k]`,
# ran on the Triton kernels over the call's plan at 1.20-1.33x / 1.09-1.14x
# FlexAttention (d128, bf16, documents of ~1,000 tokens, H100, decision 108),
# where a causal spec's varlen call over the same documents, on the Gluon
# kernels, ran 1.55-1.71x / 1.47-1.52x.  Where a call's ids form runs of
# distinct ids (`tile_plan`), the two are the same attention, so such a
# module can carry the Gluon kernels of P for its plan's runs (decision 109),
# 1.44-1.75x / 1.45-1.56x FlexAttention at d128 on an H100 (decision 110;
# `bash scripts/gpu_document_runs.sh check bench`).  `document_runs=off` leaves
# them out.
DOCUMENT_RUNS = True


def document_runs(v: ir.Variant) -> ir.Variant | None:
    """The positional variant P of a spec whose mask is `P & doc[b, q] ==
    doc[b, k]` (either order; P may be absent), or None for any other: one
    integer input of two dimensions, read only there, with P and the score
    reading no runtime data and unchanged when q and k move together
    (`shift_invariant`).  Within a run of one id along a row, such a mask
    is P over positions counted from the run's start: the runs are the
    sequences of a varlen call, and P's kernels compute it (decision 109)."""
    if ir.reads_runtime_data(v.score) or not shift_invariant(v.score):
        return None
    conjuncts = operands(v.mask, ir.BinOp.AND)  # as written: P keeps `causal` for the plain kernels
    documents = [c for c in conjuncts if _document_equality(c)]
    rest = [c for c in conjuncts if not _document_equality(c)]
    if len(documents) != 1 or len(v.inputs) != 1:
        return None
    if any(
        ir.reads_runtime_data(c) or not shift_invariant(negation_normal_form(desugar_mask(c)))
        for c in rest
    ):
        return None
    positional = chain(ir.BinOp.AND, rest) if rest else ir.FULL
    return dataclasses.replace(v, mask=positional, inputs=())


def _document_equality(e: ir.Expr) -> bool:
    """`doc[b, q] == doc[b, k]` (or with k first) for one integer input."""
    if not (isinstance(e, ir.Binary) and e.op is ir.BinOp.EQ):
        return False
    sides = (e.left, e.right)
    if not all(isinstance(x, ir.Index) and len(x.args) == 2 for x in sides):
        return False
    if e.left.input != e.right.input or not all(
        x.element is not None and x.element.is_integer for x in sides
    ):
        return False
    reads = {tuple(_bare(a) for a in x.args) for x in sides}
    return reads == {("b", "q"), ("b", "k")}


def _bare(e: ir.Expr) -> str | None:
    return e.id if isinstance(e, ir.Name) else None


def gluon_min_keys(forward: GluonForward | None, head_dim: int) -> int:
    """The fewest keys a call needs for the Gluon forward `forward` at
    `head_dim` (0: any number)."""
    if forward is None:
        return 0
    if forward is GluonForward.ANY:
        return GLUON_ANY_MIN_KEYS
    return GLUON_PLAIN_MIN_KEYS.get(head_dim, 0)


def gluon_backward(v: ir.Variant, planned: bool = False, data_d128: bool = False) -> bool:
    """Whether the module gets the warp-specialized Gluon backward for sm90
    (docs/decisions/025): any mask and score, 16-bit inputs, head dim 64
    or 128, except at head dim 128 for a score whose derivative is heavy
    (`heavy_derivative`; docs/decisions/060) or reads s and positions
    (`positional_derivative`, decision 073), and at head dim 64 for a mask
    whose Triton loops run without branches (`branchless_tiles`, decision 076:
    the Triton backward ran 1.20-1.24x faster for `causal & (q - k) % 4 == 0`;
    at d128 0.92x, where the Gluon backward stays).  The module still checks each
    call's shapes and falls back to the Triton kernel.  A mask that reads
    runtime data takes it at head dim 64 where the call's plan classifies its
    tiles (`planned`: `lower.data_plan` found one) and the score reads none
    (GLUON_DATA_MASKS, decision 078), and at head dim 128 too with
    `data_d128` (the lowering knob `gluon_data_d128`, decision 095).  Not for
    one whose v has another head dim than q (MLA's v_head_dim)."""
    max_head_dim = 128 if data_d128 else GLUON_DATA_MAX_HEAD_DIM
    data_masks = GLUON_DATA_MASKS and planned and v.head_dim <= max_head_dim
    if not _gluon_eligible(v, data_masks=data_masks):
        return False
    if v.head_dim > GLUON_HEAVY_MAX_HEAD_DIM:
        return not (
            heavy_derivative(v.score)
            or positional_derivative(v.score)
            and not _keys_below_a_constant(v.mask)
        )
    return not branchless_tiles(
        positional_part(negation_normal_form(desugar_mask(v.mask))), v.dtype
    )


def _gluon_eligible(v: ir.Variant, data_masks: bool = False) -> bool:
    """The variants the Gluon kernels are written for.  Not a mask that hides
    every pair (`!full`, `causal & !causal`): the Gluon kernels' tile loops
    then never run, and Triton 3.6 failed to compile the Gluon dK/dV kernel
    so (PassManager::run failed, H200, 2026-12-03); the Triton kernels take
    it, as they take every fully masked row.  Runtime data only with
    `data_masks`, and then in the mask alone."""
    return (
        v.dtype is not ir.DType.FP32
        and v.head_dim in (64, 128)
        and v.v_dim == v.head_dim
        and not ir.reads_runtime_data(v.score)
        and (data_masks or not ir.reads_runtime_data(v.mask))
        and not hides_every_pair(negation_normal_form(desugar_mask(v.mask)))
    )


# The Gluon backward for masks that read runtime data, such as packed
# documents (`causal & doc[b, q] == doc[b, k]`): its CTAs walk the tiles the
# call's plan leaves visible (`_data_plans` at the kernels' 64-row tiles), and
# a tile is whole where the plan finds every pair of it visible (decision 078).
# Measured against the Triton backward on the H200 (bf16, packed documents of
# ~1,000 tokens, B = 1, H = 16, CUDA graphs, 2026-12-04): 1.10x at d64 N =
# 16384 and 1.18x at 65536; at d128 0.87x and 0.91x, and 0.91x for a
# per-example prefix at N = 16384.  At d128 the dK/dV consumers spill 548 B
# (sm_90a, offline; 128 B for plain causal): the mask's reads of the call's
# data stay live beside two 64 x 128 float32 accumulators.  So d64 only.
GLUON_DATA_MASKS = True
GLUON_DATA_MAX_HEAD_DIM = 64


# The Gluon dK/dV kernel against the Triton backward on 30 drawn specs
# (`scripts/gpu_backward_choice.sh 30 0 DIM`, H200, bf16, B4 H16 N4096,
# 2026-12-02, docs/decisions/060).  At d128 its consumer threads hold two
# 64 x 128 float32 accumulators in 168 registers, and a score whose
# derivative computes an exp, a log or a quotient per element spills 1.3-3.8
# KB there (sm_90a, offline): the Triton backward ran those 1.24-1.44x
# faster where the backward took over a millisecond (8 specs), 0.82-0.86x on
# two whose masks then left its loops without an interior.  Lighter scores
# (min, max, softcap, linear terms: 0.1-1.3 KB) ran 0.53-1.03x there.  At d64
# (no spills) the Gluon kernel led on 23 of the 30 drawn specs, heavy
# derivatives among them (0.59-0.72x for four), so d64 keeps it.
GLUON_HEAVY_MAX_HEAD_DIM = 64

_PER_ELEMENT_NAMES = frozenset({"q", "k", "s", "alibi"})


def heavy_derivative(score: ir.Expr) -> bool:
    """Whether d score / d s, as the backward computes it per score element,
    calls exp or log or divides by a value that varies over the tile
    (sqrt's derivative 1 / (2 sqrt(a)) is such a quotient; softcap's
    1 - tanh^2 is not)."""
    score = simplify(score)
    if not grad.depends_on_s(score):
        return False
    return _heavy(simplify(grad.derivative(score)))


# The Gluon dK/dV kernel against the Triton backward at d128 for scores whose
# derivative compares or transforms s together with positions, such as
# max(s - c * abs(q - k), m) or softcap(s - c * abs(q - k), C) (H200, bf16,
# B4 H16 N4096, CUDA graphs, 2026-12-04, decision 073): the Triton backward
# 1.29-1.36x faster on four masks (a chunk of 55, causal chunks of 158,
# `(q - k) % 2 == 1 | !causal`, `!causal`), 1.01x with no mask, 0.97x on
# rand0_13's union.  The consumer threads then keep the positions live through
# the derivative beside two 64 x 128 float32 accumulators: the dK/dV kernel
# spills 0.5-1.2 KB (sm_90a, offline) against 0.15 KB for the score s.  A mask
# that keeps every key below a constant (`prefix(193)`) leaves the call to
# the kernels' fixed costs, where the Gluon pair measured 0.184 ms against
# the Triton backward's 0.246 (rand0_9), so it keeps the Gluon backward.


def positional_derivative(score: ir.Expr) -> bool:
    """Whether d score / d s, as the backward computes it per score element,
    reads both s and the positions (q, k or alibi)."""
    score = simplify(score)
    if not grad.depends_on_s(score):
        return False
    derivative = simplify(grad.derivative(score))
    return ir.mentions(derivative, frozenset({"s"})) and ir.mentions(derivative, _POSITION_NAMES)


def _keys_below_a_constant(mask: ir.Expr) -> bool:
    """Whether the mask is a conjunction with a term `k < P` (or `k <= P`)."""
    e = negation_normal_form(desugar_mask(mask))
    if isinstance(e, ir.Binary) and e.op is ir.BinOp.AND:
        return _keys_below_a_constant(e.left) or _keys_below_a_constant(e.right)
    return prefix_atom(e)


def _heavy(e: ir.Expr) -> bool:
    if isinstance(e, ir.Call):
        if e.fn in ("exp", "log") and ir.mentions(e, _PER_ELEMENT_NAMES):
            return True
        return any(_heavy(a) for a in e.args)
    if isinstance(e, ir.Unary):
        return _heavy(e.operand)
    if isinstance(e, ir.Binary):
        if e.op is ir.BinOp.DIV and ir.mentions(e.right, _PER_ELEMENT_NAMES):
            return True
        return _heavy(e.left) or _heavy(e.right)
    return False


def _runtime_data(v: ir.Variant) -> bool:
    """Whether the mask or the score reads an input or the batch index: the
    Gluon kernels do not take them yet."""
    return ir.reads_runtime_data(v.mask) or ir.reads_runtime_data(v.score)


# Module dtypes whose score functions take the GPU's approximate
# special-function instructions (docs/decisions/049-fast-math-in-scores.md):
# tanh.approx.f32 (relative error below 2^-10.9) and lg2.approx.f32 (absolute
# error below 2^-22 in log2).  Each is below one rounding of a 16-bit score
# (2^-11 relative for fp16, 2^-8 for bf16), which the ordinary dense
# implementation of the 2x / 3x rule makes at every operation; float32
# modules keep libdevice's logf and the exp2 tanh, accurate to a few ulps.
FAST_MATH_DTYPES = frozenset({ir.DType.FP16, ir.DType.BF16})


def fast_math(v: ir.Variant) -> bool:
    """Whether the module's `_tanh` and `_log` take the GPU's approximate
    instructions (on the GPU; the Triton interpreter runs no PTX and takes
    the portable branch)."""
    return v.dtype in FAST_MATH_DTYPES


# Largest softcap cap for which 16-bit modules compute tanh without the
# polynomial branch near 0: there tanh's absolute error (~2^-25, from rounding
# exp(-2|x|) near 1) times the cap stays below 2^-17, far below the fp16
# rounding of any score that is not itself tiny.
FAST_TANH_MAX_CAP = 256.0


def tanh_small_poly(v: ir.Variant) -> bool:
    """Whether the exp2 `_tanh` (float32 modules, the interpreter's branch of
    16-bit ones, and `fast_math=off`) needs its polynomial branch near 0.

    softcap(x, c) is c * tanh(x / c): an absolute error e of tanh becomes
    c * e in a score that is about x for |x| << c, so a huge cap (3e38 gave
    0 for every score) needs tanh's relative accuracy near 0.  A plain `tanh`
    may be scaled by anything, so it gets the branch too.
    """
    if v.dtype is ir.DType.FP32:
        return True

    def amplified(e: ir.Expr) -> bool:
        if isinstance(e, ir.Call):
            if e.fn == "tanh":
                return True
            if e.fn == ir.SOFTCAP and float(e.args[1].value) > FAST_TANH_MAX_CAP:
                return True
            return any(amplified(a) for a in e.args)
        if isinstance(e, ir.Unary):
            return amplified(e.operand)
        if isinstance(e, ir.Binary):
            return amplified(e.left) or amplified(e.right)
        return False

    return amplified(simplify(v.score))  # the score the kernels compute
