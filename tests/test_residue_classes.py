"""Residue classes (decision 085): a mask `rest & (q - k) % n == r` runs its
Triton kernels over the rows of each class of positions mod n, each query
class against the one class of keys the congruence leaves, in tiles of every
n-th row that `rest` alone classifies.

Judged three ways: the factor the analysis finds (`congruence_factor`), the
tiles the class loops visit against a dense count on each class's rows (no
visible tile skipped; as many as hold a visible pair where `rest` is exact),
and the kernels against the float64 reference, forward and backward, at
lengths that are not multiples of n or of a tile, with Nq != Nk, GQA and both
alignments.  Padded and varlen calls, offsets, sinks and decoding of such
specs are in those features' own tests (a congruence spec in each)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashgen import ir, lower
from flashgen.printer import print_expr
from flashgen.tiles import congruence_factor, visible_may

from kernel_utils import assert_ok, make_variant, run_case, run_grad_case
from test_lower import _mask, _namespace, _run, _visible, nnf_of, position_masks
from flashgen.verify import Shape


@pytest.mark.parametrize(
    "text, found",
    [
        ("causal & (q - k) % 4 == 0", (4, 0, "k <= q")),
        ("(q - k) % 2 == 0", (2, 0, "full")),
        # (k - q) % 3 == 1 is q - k = 2 mod 3.
        ("(k - q) % 3 == 1 & window(40)", (3, 2, "k >= q - 40 & k <= q")),
        ("(q - k) % 2 != 0 & !causal", (2, 1, "k > q")),
        # Two congruences as one: q - k = 2 mod 6 and 0 mod 4 is 8 mod 12.
        ("(q - k + 1) % 6 == 3 & (q - k) % 4 == 0", (12, 8, "full")),
        ("(q - k) % 4 == 1 | k div 2 == q div 2", None),  # a union: no factor
        ("(q - k) % 3 != 1 & causal", None),  # two classes of keys per query class
        ("(q - k) % 2 == 0 & (q - k) % 4 == 1", None),  # no pair at all
        ("q % 2 == 0 & causal", None),  # of q alone
    ],
)
def test_the_congruence_factor_of_a_mask(text, found):
    got = congruence_factor(nnf_of(_mask(text)))
    if found is None:
        assert got is None
    else:
        assert (got[0], got[1], print_expr(got[2])) == found


def test_the_lowering_walks_classes_and_leaves_tma_and_gluon():
    variant = make_variant("causal & (q - k) % 4 == 1", dtype=ir.DType.BF16, head_dim=128)
    model = lower.lower(variant)
    assert (model.residue_step, model.residue_offset) == (4, 1)
    # Its rows are 4 apart: pointer loads, and no Gluon kernel (they walk positions).
    assert (model.gpu_tma, model.gpu_bwd_tma, model.gluon_forward, model.gluon_backward) == (
        False, False, None, False,
    )  # fmt: skip
    # The bounds are causal's, with an interior: a class's tiles below the
    # diagonal are whole.
    assert model.key_interior and model.key_hi == "q_hi" and model.query_lo == "k_lo"
    assert not model.decode_bounds  # decoding walks positions, the whole mask per tile
    plain = lower.lower(make_variant("causal", dtype=ir.DType.BF16, head_dim=128))
    assert plain.residue_step == 1 and plain.gluon_forward is not None


@pytest.mark.parametrize(
    "text, declared, settings",
    [
        ("(q - k) % 4 == 1 | causal", "", {}),  # not a factor
        ("causal & (q - k) % 32 == 0", "", {}),  # past RESIDUE_MAX_STEP
        ("causal & (q - k) % 2 == 0 & doc[b, q] == doc[b, k]", "doc: int32[B, Nk]", {}),
        ("causal & (q - k) % 2 == 0", "", {"v_head_dim": 16}),  # MLA's v
    ],
)
def test_specs_that_keep_positions(text, declared, settings):
    variant = make_variant(text, declared=declared, **settings)
    assert lower.lower(variant).residue_step == 1


def _class_visited(text: str, n_queries: int, n_keys: int, block: int) -> tuple[int, int]:
    """(tiles the class loops visit, tiles with a visible pair) over every
    class's rows, as the kernels walk them: query rows rq + n i against key
    rows rk + n j, the key bounds and tile test of the mask less its factor.
    Asserts that the other key classes hold no visible pair."""
    whole = nnf_of(_mask(text))
    n, r, rest = congruence_factor(whole)
    # As `lower.lower` has it: must, bounds from rest; may exact from the
    # whole mask, whose congruence rules out differences a class never holds.
    tiles = lower.TileCode()
    must, may = tiles.truth(rest)
    may = visible_may(tiles, whole, may)
    lines, bounds = tiles.lines, lower.key_bounds(rest)
    dense = _visible(_mask(text), n_queries, n_keys, 1)[0]
    offset = n_keys - n_queries  # bottom-right: query row i at position i + offset
    visited = nonempty = 0
    for rq in range(n):
        rk = (rq + offset - r) % n
        for other in range(n):
            assert other == rk or not dense[rq::n, other::n].any(), (rq, other)
        rows = dense[rq::n, rk::n]
        for ia in range(0, rows.shape[0], block):
            ib = min(ia + block, rows.shape[0]) - 1
            for ja in range(0, rows.shape[1], block):
                jb = min(ja + block, rows.shape[1]) - 1
                env = _namespace(rq + offset + n * ia, rq + offset + n * ib, rk + n * ja,
                                 rk + n * jb, 0, 1)  # fmt: skip
                _, maybe, lo, hi = _run(lines, must, may, bounds, env)
                first = 0 if lo is None else max(-(-(lo - rk) // n), 0)  # key rows in bounds
                last = rows.shape[1] - 1 if hi is None else (hi - rk) // n
                in_bounds = first <= jb and ja <= last
                any_visible = bool(rows[ia : ib + 1, ja : jb + 1].any())
                assert any_visible <= (maybe and in_bounds), "a visible tile is skipped"
                visited += maybe and in_bounds
                nonempty += any_visible
    return visited, nonempty


@settings(max_examples=120, deadline=None)
@given(
    rest=position_masks(depth=2),
    n=st.sampled_from((2, 3, 4, 8)),
    shift=st.integers(-9, 9),
    block=st.sampled_from((8, 16, 37)),
)
def test_class_loops_visit_the_tiles_with_a_visible_pair(rest, n, shift, block):
    text = f"({rest}) & (q - k + {shift}) % {n} == 1"
    if congruence_factor(nnf_of(_mask(text))) is None:
        return  # rest's own congruence contradicts the factor: no pair at all
    visited, nonempty = _class_visited(text, 100, 70, block)
    # Exact for ranges of q - k: on a class's rows the difference moves in
    # steps of n through the residue the box test asks for.  Ranges of q or
    # k alone with two ends (`q == 0`) may leave a tile none of whose every
    # n-th positions lies inside: visited then, though empty (sound).
    if not any(x in rest for x in ("%", "!=", "q ", "k ", "(q", "(k", "-q", "prefix")):
        assert visited == nonempty, text


@pytest.mark.parametrize(
    "text, counts",
    [
        # N = 1024 in 64-row tiles: 4 classes of 256 rows, 4 tiles a side,
        # 4 * 10 tiles under the diagonal, against 16 * 17 / 2 of positions
        # (every one partial there).
        ("causal & (q - k) % 4 == 0", (40, 136)),
        # 2 classes of 512 rows: 2 * 8 * 8 tiles, against 16 * 16.
        ("(q - k) % 2 == 0", (128, 256)),
    ],
)
def test_classes_visit_a_fraction_of_the_position_tiles(text, counts):
    from test_lower import _visited

    classes, _ = _class_visited(text, 1024, 1024, 64)
    positions, _ = _visited(_mask(text), 1024, 1024, 64)
    assert (classes, positions) == counts


# Masks whose classes differ in every way the kernels' bounds care about:
# an interior (causal), none (the whole class visible), a band on each side,
# keys after the queries, a score of positions.
MASKS = [
    ("causal & (q - k) % 4 == 1", "s - 0.05 * abs(q - k)"),
    ("(q - k) % 2 == 0", None),
    ("window(21, 7) & (k - q) % 3 == 1", "s + alibi"),
    ("!causal & (q - k) % 2 != 0", None),
]
SHAPES = [
    Shape(1, 2, 1, 1, 1),
    Shape(1, 2, 2, 3, 70),
    Shape(2, 4, 2, 45, 37),
    Shape(1, 2, 1, 70, 29),
    Shape(1, 1, 1, 97, 97),
]


@pytest.mark.kernels
@pytest.mark.parametrize("align", ["bottom_right", "top_left"])
@pytest.mark.parametrize("mask, score", MASKS)
def test_class_kernels_match_the_reference(mask, score, align):
    variant = make_variant(mask, score, head_dim=16, align=align)
    assert lower.lower(variant).residue_step > 1
    for i, shape in enumerate(SHAPES):
        blocks = {"block_m": 16, "block_n": 16} if i % 2 else {}
        assert_ok(run_case(variant, shape, seed=i, **blocks))
        assert_ok(run_grad_case(variant, shape, seed=i))


@pytest.mark.kernels
def test_class_kernels_in_fp16():
    variant = make_variant("causal & (q - k) % 3 == 0", "tanh(s / 4.0) * 4.0", dtype=ir.DType.FP16)
    for shape in (Shape(1, 2, 1, 50, 50), Shape(2, 2, 2, 33, 65)):
        assert_ok(run_case(variant, shape, seed=3))
        assert_ok(run_grad_case(variant, shape, seed=3))
