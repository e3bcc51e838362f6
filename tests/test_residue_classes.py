"""Residue classes (decision 085): a mask with congruences of q - k runs
its Triton kernels over the rows of each class of positions mod n, each
query class against the class of keys at each residue of q - k that some
pair holds, in tiles of every n-th row classified by the mask on that
residue.

Judged three ways: the masks the analysis finds on each residue
(`residue_masks`), the tiles the class loops visit against a dense count on
each class's rows (no visible tile skipped; as many as hold a visible pair
where the masks are ranges of q - k), and the kernels against the float64
reference, forward and backward, at lengths that are not multiples of n or
of a tile, with Nq != Nk, GQA and both alignments.  Padded and varlen calls,
offsets, sinks and decoding of such specs are in those features' own tests
(a congruence spec in each)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from flashgen import ir, lower
from flashgen.printer import print_expr
from flashgen.tiles import residue_masks, visible_may

from kernel_utils import assert_ok, make_variant, run_case, run_grad_case
from test_lower import _mask, _namespace, _run, _visible, nnf_of, position_masks
from flashgen.verify import Shape


@pytest.mark.parametrize(
    "text, found",
    [
        ("causal & (q - k) % 4 == 0", (4, [(0, "k <= q")])),
        ("(q - k) % 2 == 0", (2, [(0, "full")])),
        # (k - q) % 3 == 1 is q - k = 2 mod 3.
        ("(k - q) % 3 == 1 & window(40)", (3, [(2, "k >= q - 40 & k <= q")])),
        ("(q - k) % 2 != 0 & !causal", (2, [(1, "k > q")])),
        # Two congruences as one: q - k = 2 mod 6 and 0 mod 4 is 8 mod 12.
        ("(q - k + 1) % 6 == 3 & (q - k) % 4 == 0", (12, [(8, "full")])),
        # A union: every residue, each with its own mask (seed 0's rand0_14).
        ("(q - k) % 2 == 1 | !causal", (2, [(0, "k > q"), (1, "full")])),
        ("(q - k) % 3 != 1 & causal", (3, [(0, "k <= q"), (2, "k <= q")])),
        ("(q - k) % 2 == 0 & (q - k) % 4 == 1", (4, [])),  # no pair at all
        ("q % 2 == 0 & causal", None),  # of q alone
        ("causal & (q - k) % 32 == 0", None),  # past the step allowed
    ],
)
def test_the_mask_on_each_residue_of_q_minus_k(text, found):
    got = residue_masks(nnf_of(_mask(text)), 16)
    if found is None:
        assert got is None
    else:
        assert (got[0], [(r, print_expr(part)) for r, part in got[1]]) == found


def test_the_lowering_walks_classes_and_leaves_tma_and_gluon():
    variant = make_variant("causal & (q - k) % 4 == 1", dtype=ir.DType.BF16, head_dim=128)
    model = lower.lower(variant)
    (section,) = model.residue_sections
    assert (model.residue_step, section.residue, section.mask_text) == (4, 1, "k <= q")
    # The whole mask's section (residue 0) serves the kernels that walk positions.
    assert (model.tiles.residue, model.tiles.mask_text) == (0, "k <= q & (q - k) % 4 == 1")
    # Its rows are 4 apart: pointer loads, and no Gluon kernel (they walk positions).
    assert (model.gpu_tma, model.gpu_bwd_tma, model.gluon_forward, model.gluon_backward) == (
        False, False, None, False,
    )  # fmt: skip
    # The bounds are causal's, with an interior: a class's tiles below the
    # diagonal are whole.
    assert section.key_interior and section.key_hi == "q_hi" and section.query_lo == "k_lo"
    assert not model.decode_bounds  # decoding walks positions, the whole mask per tile
    plain = lower.lower(make_variant("causal", dtype=ir.DType.BF16, head_dim=128))
    assert plain.residue_step == 1 and plain.gluon_forward is not None
    assert plain.residue_sections == ()


@pytest.mark.parametrize(
    "text, ratio, step",
    [
        ("causal & (q - k) % 4 == 0", 0.29, 4),
        ("(q - k) % 2 == 0", 0.50, 2),
        # seed 0's rand0_14's union: two sections, just under RESIDUE_MAX_RATIO
        # (decision 088: its d128 backward 1.05x faster over classes on an H100).
        ("(q - k) % 2 == 1 | !causal", 0.78, 2),
        # Just over it: the position walk (--plan residue_classes=on takes classes).
        ("(q - k) % 3 != 1 & causal", 0.93, 1),
        # A narrow band: more class tiles than position tiles.
        ("(q - k) % 3 != 1 & window(20, 5)", 2.09, 1),
    ],
)
def test_classes_where_they_visit_fewer_tiles(text, ratio, step):
    from flashgen.kernel_choice import class_tile_ratio

    variant = make_variant(text, dtype=ir.DType.BF16, head_dim=128)
    n = residue_masks(nnf_of(_mask(text)), 16)[0]
    if ratio is not None:
        assert class_tile_ratio(variant, n) == pytest.approx(ratio, abs=0.005)
    assert (class_tile_ratio(variant, n) <= 0.8) == (step > 1)
    assert lower.lower(variant).residue_step == step
    assert lower.lower(variant, residue_classes=True).residue_step == n
    assert lower.lower(variant, residue_classes=False).residue_step == 1


@pytest.mark.parametrize(
    "text, declared, settings",
    [
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
    class's rows, as the kernels walk them: query rows rq + n i against the
    key rows rk + n j of each residue's class, with that residue's mask's key
    bounds and tile test.  Asserts that the residues left out hold no pair."""
    whole = nnf_of(_mask(text))
    n, parts = residue_masks(whole, 16)
    dense = _visible(_mask(text), n_queries, n_keys, 1)[0]
    offset = n_keys - n_queries  # bottom-right: query row i at position i + offset
    visited = nonempty = 0
    for rq in range(n):
        walked = set()
        for r, part in parts:
            # As `lower.lower` has it: must and bounds from the residue's mask;
            # may exact with the congruence, which rules out differences
            # the class pair never holds.
            tiles = lower.TileCode()
            must, may = tiles.truth(part)
            congruence = _mask(f"(q - k) % {n} == {r}")
            may = visible_may(tiles, ir.Binary(ir.BinOp.AND, part, congruence), may)
            lines, bounds = tiles.lines, lower.key_bounds(part)
            rk = (rq + offset - r) % n
            walked.add(rk)
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
        for other in set(range(n)) - walked:
            assert not dense[rq::n, other::n].any(), (rq, other)
    return visited, nonempty


@settings(max_examples=80, deadline=None)
@given(
    rest=position_masks(depth=2),
    n=st.sampled_from((2, 3, 4, 8)),
    shift=st.integers(-9, 9),
    block=st.sampled_from((8, 16, 37)),
    join=st.sampled_from(("&", "|")),
)
def test_class_loops_visit_the_tiles_with_a_visible_pair(rest, n, shift, block, join):
    text = f"({rest}) {join} (q - k + {shift}) % {n} == 1"
    assume(residue_masks(nnf_of(_mask(text)), 16) is not None)  # rest's modulus and n: lcm <= 16
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
    # Unions: each query class walks two or three classes of keys, each with
    # its own mask (seed 0's rand0_14; keys around the diagonal).
    ("(q - k) % 2 == 1 | !causal", "tanh(s * 0.5) * 2.0"),
    ("(q - k) % 3 != 1 & causal | abs(q - k) < 5", None),
    # A mask of heads beside the congruence (seed 1's rand1_29, taken by default).
    ("causal & (h % 2 == 0 | k <= q + 17) | (q - k) % 2 == 1", "s * 0.7 + 0.1 * h"),
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
def test_class_kernels_match_the_reference(mask, score, align, monkeypatch):
    from flashgen import kernel_choice

    monkeypatch.setattr(kernel_choice, "RESIDUE_MAX_RATIO", 10.0)  # classes whatever they cost
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
