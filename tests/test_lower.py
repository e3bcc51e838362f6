"""The mask analysis in `lower`: tile classification and key bounds.

The scalar code that `lower` builds for a tile (`flashgen.kernel_expr`
trees) is evaluated here with numpy standing in for `tl`, over random
rectangles of (query, key) positions, and compared with the dense
reference's mask; one test checks that the printed Triton source computes
what the trees do.  Soundness is the property that
matters (a tile called full must be fully visible, a tile called empty must
have no visible pair, every visible key must lie inside the key bounds);
exactness is checked for the named masks, where the kernels rely on it for
speed.
"""

from __future__ import annotations

import dataclasses
import math
import types

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flashgen import element_code, ir, kernel_choice, loop_bounds, lower, mask_forms
from flashgen import kernel_expr as kx
from flashgen.printer import print_expr
from flashgen.reference import mask_matrix
from flashgen.tiles import visible_may
from kernel_utils import make_variant
from strategies import masks, scores, variants


def _namespace(q_lo, q_hi, k_lo, k_hi, head, num_heads):
    i = np.int64
    return {
        "q_lo": i(q_lo),
        "q_hi": i(q_hi),
        "k_lo": i(k_lo),
        "k_hi": i(k_hi),
        "head": i(head),
        "num_heads": i(num_heads),
    }


def _value(e, env):
    """A bound's value (None: unbounded)."""
    return None if e is None else int(kx.evaluate(e, env))


def _analyse(mask: ir.Expr):
    nnf = lower.negation_normal_form(lower.desugar_mask(mask))
    tiles = lower.TileCode()
    must, may = tiles.truth(nnf)
    may = visible_may(tiles, nnf, may)  # as the kernels have it
    return tiles.lines, must, may, lower.key_bounds(nnf)


def nnf_of(mask: ir.Expr) -> ir.Expr:
    return lower.negation_normal_form(lower.desugar_mask(mask))


def _run(lines, must, may, bounds, env):
    kx.run(lines, env)
    must, may = bool(kx.evaluate(must, env)), bool(kx.evaluate(may, env))
    return must, may, _value(bounds[0], env), _value(bounds[1], env)


def _visible(mask, n_queries, n_keys, num_heads):
    """Dense mask with query positions n_keys - n_queries ... n_keys - 1."""
    variant = ir.Variant("t", 16, ir.DType.FP32, mask=mask)
    return mask_matrix(variant, n_queries, n_keys, num_heads).numpy()


N_QUERIES, N_KEYS = 260, 200  # query positions -60 .. 199


@st.composite
def rectangles(draw):
    qa = draw(st.integers(0, N_QUERIES - 1))
    qb = draw(st.integers(qa, min(N_QUERIES - 1, qa + draw(st.sampled_from((0, 7, 31, 63))))))
    offset = N_KEYS - N_QUERIES
    if draw(st.booleans()):
        # Key tiles whose corners sit within a few positions of the diagonal
        # and of window edges, where off-by-one classifications show.
        edge = draw(st.sampled_from((0, 0, 5, -5, 12, -12)))
        kb = qa + offset + edge + draw(st.integers(-3, 3))
        kb = min(max(kb, 0), N_KEYS - 1)
        ka = max(0, kb - draw(st.sampled_from((0, 3, 15, 31))))
    else:
        ka = draw(st.integers(0, N_KEYS - 1))
        kb = draw(st.integers(ka, min(N_KEYS - 1, ka + draw(st.sampled_from((0, 7, 31, 63))))))
    num_heads = draw(st.integers(1, 4))
    return qa, qb, ka, kb, draw(st.integers(0, num_heads - 1)), num_heads


@settings(max_examples=300, deadline=None)
@given(mask=masks(), rects=st.lists(rectangles(), min_size=1, max_size=6))
def test_tile_classification_is_sound(mask, rects):
    lines, must, may, bounds = _analyse(mask)
    dense = {}
    offset = N_KEYS - N_QUERIES
    for qa, qb, ka, kb, head, num_heads in rects:
        if num_heads not in dense:
            dense[num_heads] = _visible(mask, N_QUERIES, N_KEYS, num_heads)
        block = dense[num_heads][head, qa : qb + 1, ka : kb + 1]
        env = _namespace(qa + offset, qb + offset, ka, kb, head, num_heads)
        is_full, maybe, lo, hi = _run(lines, must, may, bounds, env)
        if is_full:
            assert block.all(), "tile classified full has a masked pair"
        if not maybe:
            assert not block.any(), "tile classified empty has a visible pair"
        cols = np.nonzero(block.any(axis=0))[0] + ka
        if cols.size and lo is not None:
            assert cols.min() >= lo, "visible key below the key bound"
        if cols.size and hi is not None:
            assert cols.max() <= hi, "visible key above the key bound"
        rows = np.nonzero(block.any(axis=1))[0] + qa + offset
        q_lo, q_hi = (_value(code, env) for code in lower.query_bounds(nnf_of(mask)))
        if rows.size and q_lo is not None:
            assert rows.min() >= q_lo, "visible query below the query bound"
        if rows.size and q_hi is not None:
            assert rows.max() <= q_hi, "visible query above the query bound"


def _named(text_mask):
    n, c, b = ir.Name, ir.Call, ir.Binary
    return {
        "causal": n("causal"),
        "window": c("window", (ir.Num(37),)),
        "window2": c("window", (ir.Num(20), ir.Num(9))),
        "prefix": c("prefix", (ir.Num(45),)),
        "chunk": c("chunk", (ir.Num(24),)),
        "causal_window": b(ir.BinOp.AND, n("causal"), c("window", (ir.Num(50),))),
        "causal_prefix": b(ir.BinOp.OR, n("causal"), c("prefix", (ir.Num(30),))),
    }[text_mask]


@pytest.mark.parametrize(
    "name",
    ["causal", "window", "window2", "prefix", "chunk", "causal_window", "causal_prefix"],
)
@pytest.mark.parametrize(
    "block_m,block_n,n_queries",
    [(16, 16, n) for n in range(200, 216)] + [(32, 16, 260), (16, 64, 231)],
)
def test_named_masks_classify_exactly(name, block_m, block_n, n_queries):
    """Tiles of the named masks: tiles that are full or empty are recognised.

    Nq = 200 ... 215 against Nk = 200 shifts the diagonal through every
    offset relative to 16-wide tiles (bottom-right alignment).
    """
    mask = _named(name)
    lines, must, may, bounds = _analyse(mask)
    dense = _visible(mask, n_queries, N_KEYS, 1)[0]
    offset = N_KEYS - n_queries
    for qa in range(0, n_queries, block_m):
        qb = min(qa + block_m, n_queries) - 1
        for ka in range(0, N_KEYS, block_n):
            kb = min(ka + block_n, N_KEYS) - 1
            tile = dense[qa : qb + 1, ka : kb + 1]
            env = _namespace(qa + offset, qb + offset, ka, kb, 0, 1)
            is_full, maybe, lo, hi = _run(lines, must, may, bounds, env)
            assert is_full == bool(tile.all()), (qa, ka)
            assert maybe == bool(tile.any()), (qa, ka)


@pytest.mark.parametrize(
    "name,expected",
    [
        ("causal", (False, True)),
        ("window", (True, True)),
        ("window2", (True, True)),
        ("prefix", (False, True)),
        ("chunk", (True, True)),
        ("causal_window", (True, True)),
    ],
)
def test_key_bounds_found_for_affine_masks(name, expected):
    _, _, _, (lo, hi) = _analyse(_named(name))
    assert (lo is not None, hi is not None) == expected


def test_affine_normal_form():
    q, k = ir.Name("q"), ir.Name("k")
    e = ir.Binary(
        ir.BinOp.SUB,
        ir.Binary(ir.BinOp.MUL, ir.Num(3), q),
        ir.Binary(ir.BinOp.ADD, k, ir.Binary(ir.BinOp.SUB, q, ir.Num(4))),
    )
    assert mask_forms.clean(lower.affine(e)) == {"q": 2, "k": -1, "": 4}
    assert lower.affine(ir.Binary(ir.BinOp.MUL, q, k)) is None
    assert lower.affine(ir.Binary(ir.BinOp.MOD, q, ir.Num(2))) is None


# --------------------------------------------------------------------------- #
# Element code: the Triton expressions for scores and masks
# --------------------------------------------------------------------------- #


def _eval_element(code: kx.Expr, s, q_pos, k_pos, head, num_heads, alibi_slope, lines=()):
    """Element code evaluated over a tile after its `lines`, numpy standing in
    for tl."""
    env = {
        "s": s,
        "q_pos": q_pos,
        "k_pos": k_pos,
        "head": np.int64(head),
        "num_heads": np.int64(num_heads),
        "alibi_slope": alibi_slope,
    }
    kx.run(list(lines), env)
    return np.broadcast_to(kx.evaluate(code, env), np.broadcast_shapes(q_pos.shape, k_pos.shape))


@settings(max_examples=150, deadline=None)
@given(variant=variants(), n_queries=st.integers(1, 40), n_keys=st.integers(1, 40))
def test_element_code_matches_reference(variant, n_queries, n_keys):
    """Operator precedence, int/real conversion and functions, per element."""
    from flashgen.reference import alibi_slopes, positions, scores

    heads = 3
    gen = torch.Generator().manual_seed(n_queries * 100 + n_keys)
    q = torch.randn(1, heads, n_queries, variant.head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(1, heads, n_keys, variant.head_dim, generator=gen, dtype=torch.float64)
    raw = scores(ir.Variant("raw", variant.head_dim, variant.dtype, scale=variant.scale), q, k)
    expected_scores = scores(variant, q, k).numpy()
    expected_mask = mask_matrix(variant, n_queries, n_keys, heads).numpy()
    q_pos, k_pos = (p.numpy() for p in positions(n_queries, n_keys, variant.align))
    q_pos, k_pos = q_pos[:, None], k_pos[None, :]
    slopes = alibi_slopes(heads).numpy()

    mask = lower.negation_normal_form(lower.desugar_mask(variant.mask))
    mask_code = lower.ElementCode().expr(mask)
    # As `lower` emits them: the score code may assume the mask's facts.
    scores_code = lower.ElementCode(lower.keys_before_queries(mask))
    score = lower.score_code(variant.score, scores_code)
    kind, log2_code = score.kind, score.log2
    for h in range(heads):
        s = raw[0, h].numpy()
        args = (q_pos, k_pos, h, heads, slopes[h])
        visible = _eval_element(mask_code, s, *args)
        np.testing.assert_array_equal(visible, expected_mask[h])
        if kind is lower.ScoreKind.IDENTITY:
            got = s
        else:
            got = _eval_element(log2_code, s, *args, lines=score.lines) / lower.LOG2E
            got = s + got if kind is lower.ScoreKind.ADDITIVE else got
        # Scores matter only where the mask shows them.
        np.testing.assert_allclose(
            got[visible], expected_scores[0, h][visible], rtol=1e-12, atol=1e-12
        )


@settings(max_examples=100, deadline=None)
@given(variant=variants(), n_queries=st.integers(1, 24), n_keys=st.integers(1, 24))
def test_score_derivative_matches_autograd(variant, n_queries, n_keys):
    """d score / d s per element, the tree evaluated against torch's autograd
    of the reference (the same subgradient conventions).  With head_dim = Nk,
    k the identity and scale 1, s is q itself, element by element."""
    from flashgen.reference import alibi_slopes, positions, scores

    heads = 2
    spec = dataclasses.replace(variant, head_dim=n_keys, scale=1.0)
    gen = torch.Generator().manual_seed(n_queries * 100 + n_keys)
    q = (torch.rand(1, heads, n_queries, n_keys, generator=gen, dtype=torch.float64) - 0.5) * 40
    q.requires_grad_(True)
    k = torch.eye(n_keys, dtype=torch.float64).expand(1, heads, n_keys, n_keys)
    scores(spec, q, k).sum().backward()
    expected = q.grad.numpy()
    visible = mask_matrix(variant, n_queries, n_keys, heads).numpy()
    q_pos, k_pos = (p.numpy() for p in positions(n_queries, n_keys, variant.align))
    slopes = alibi_slopes(heads).numpy()

    nnf = nnf_of(variant.mask)
    code = lower.score_code(variant.score, lower.ElementCode(lower.keys_before_queries(nnf)))
    for h in range(heads):
        s = q.detach()[0, h].numpy()
        env = {
            "s": s,
            "q_pos": q_pos[:, None],
            "k_pos": k_pos[None, :],
            "head": np.int64(h),
            "num_heads": np.int64(heads),
            "alibi_slope": slopes[h],
        }
        if code.grad is None:
            got = np.ones_like(s)
        else:
            with np.errstate(all="ignore"):
                if code.log2 is not None:  # the kernels' score, log2 units
                    env["s2"] = kx.evaluate(code.log2, kx.run(list(code.lines), dict(env)))
                kx.run(list(code.grad_lines), env)
                got = np.broadcast_to(kx.evaluate(code.grad, env), s.shape)
        # softcap's derivative reads tanh back through a float32 factor.
        np.testing.assert_allclose(
            got[visible[h]], expected[0, h][visible[h]], rtol=1e-6, atol=1e-6
        )


_FORMS = ("k", "q", "k - q", "q + k", "2 * k - q", "h")
_ORDERS = st.sampled_from(("<", "<=", ">", ">=", "=="))
_ALIGNS = st.sampled_from(("bottom_right", "top_left"))


@st.composite
def _comparison_chains(draw, depth: int = 2):
    """& | ! over comparisons of a few affine forms with constants near the
    edges of a small grid, several on one form, so that their sets overlap,
    nest, cover every value or share none."""
    if depth == 0 or draw(st.integers(0, 2)) == 0:
        form = draw(st.sampled_from(_FORMS))
        return f"{form} {draw(_ORDERS)} {draw(st.integers(-6, 30))}"
    if draw(st.integers(0, 4)) == 0:
        return f"!({draw(_comparison_chains(depth - 1))})"
    parts = draw(st.lists(_comparison_chains(depth - 1), min_size=2, max_size=4))
    return "(" + f" {draw(st.sampled_from('&|'))} ".join(parts) + ")"


@settings(max_examples=300, deadline=None)
@given(
    mask=_comparison_chains(),
    align=_ALIGNS,
    n_queries=st.integers(1, 30),
    n_keys=st.integers(1, 30),
)
def test_merged_comparisons_keep_every_pairs_visibility(mask, align, n_queries, n_keys):
    """The merged mask (comparisons of one form as sets of integers: nested
    ones dropped, covering or disjoint ones folded to a constant) gives every
    pair, over negative query positions too, the reference's verdict on the
    mask as written."""
    _assert_reference_verdicts(mask, align, n_queries, n_keys)


def _assert_reference_verdicts(mask: str, align: str, n_queries: int, n_keys: int) -> None:
    from flashgen.reference import positions

    variant = make_variant(mask, align=align)
    heads = 3
    expected = mask_matrix(variant, n_queries, n_keys, heads).numpy()
    code = lower.ElementCode().expr(nnf_of(variant.mask))
    q_pos, k_pos = (p.numpy() for p in positions(n_queries, n_keys, variant.align))
    for h in range(heads):
        got = _eval_element(code, None, q_pos[:, None], k_pos[None, :], h, heads, None)
        np.testing.assert_array_equal(got, expected[h], err_msg=mask)


@st.composite
def _contexts(draw):
    """`A & (B | C)`, `A | (B & C)` and their mirrors, A and B comparisons of one form
    whose constants lie a few apart, so that B's set meets A's at an edge,
    inside it, past it or around it, and C another comparison or a periodic
    term."""
    form = draw(st.sampled_from(_FORMS[:4]))
    c = draw(st.integers(-2, 12))
    a = f"{form} {draw(_ORDERS)} {c}"
    b = f"{form} {draw(_ORDERS)} {c + draw(st.integers(-2, 2))}"
    other = draw(st.sampled_from(("q % 3 == 0", "k > 5", f"{form} < {c - 3}", "h == 1")))
    inner, outer = draw(st.sampled_from((("|", "&"), ("&", "|"))))
    junction = f"({b} {inner} {other})" if draw(st.booleans()) else f"({other} {inner} {b})"
    return f"{a} {outer} {junction}" if draw(st.booleans()) else f"{junction} {outer} {a}"


@settings(max_examples=300, deadline=None)
@given(
    mask=_contexts(),
    align=_ALIGNS,
    n_queries=st.integers(1, 16),
    n_keys=st.integers(1, 16),
)
def test_an_or_read_where_its_and_holds_keeps_every_pairs_visibility(
    mask, align, n_queries, n_keys
):
    """An operand read where its chain's comparisons leave the chain open (an
    `|` inside an `&`, an `&` inside an `|`): every pair keeps the
    reference's verdict on the mask as written."""
    _assert_reference_verdicts(mask, align, n_queries, n_keys)


@pytest.mark.parametrize(
    ("mask", "merged"),
    [
        ("prefix(288) | !prefix(247)", "full"),
        ("max(q, k) > 19 | prefix(288) | !prefix(247)", "full"),
        (
            "((q - k) % 2 == 1 | !causal) & (max(q, k) > 19 | prefix(288) | !prefix(247))",
            "(q - k) % 2 == 1 | k > q",
        ),
        ("k < 9 | k < 5", "k < 9"),
        ("k >= 3 & causal & k >= 5", "k <= q & k >= 5"),
        ("k == 3 & k < 9", "k == 3"),
        ("k < 0 | k == 0 | k > 0", "full"),
        ("k - q >= -2 | q - k >= 3", "full"),
        ("causal & !causal", "!full"),
        ("k < 5 & k > 9 & causal", "!full"),
        ("!(k < 5 & q > 3) | k >= 5", "k >= 5 | q <= 3"),
        ("k < 5 | k > 5", "k < 5 | k > 5"),  # k != 5: no half-line holds it
        ("prefix(4) | k > 4", "k < 4 | k > 4"),
        ("k < 4 | q > 4", "k < 4 | q > 4"),  # two forms: nothing to merge
        # An | inside an & chain, read where the chain's comparisons hold:
        ("!causal & (q div 12 == k div 12 | causal)", "k > q & q div 12 == k div 12"),
        ("(k < q - 268 | k > q) & k > q & q % 5 != 0", "k > q & q % 5 != 0"),
        ("causal & (k < 5 | q > 9) & k >= 7", "k <= q & q > 9 & k >= 7"),
        ("!causal & (causal | k < q - 5)", "!full"),
        ("k <= q | k > q & (q - k >= 27 | k - q >= 27)", "k <= q | k - q >= 27"),
        # An & inside an | chain, read where the chain's comparisons fail:
        ("causal | !causal & q % 3 == 0", "k <= q | q % 3 == 0"),
        ("causal | (!causal & h == 1) | (k < q - 5 & h == 0)", "k <= q | h == 1"),
        ("k < 3 | k > 9 | (k >= 2 & k <= 10 & q > 2)", "k < 3 | k > 9 | q > 2"),
        ("k < 3 | k > 9 | (k >= 4 & q > 2)", "k < 3 | k > 9 | k >= 4 & q > 2"),  # 3 is open
    ],
)
def test_comparisons_of_one_form_merge(mask, merged):
    assert print_expr(nnf_of(make_variant(mask).mask)) == merged


def test_a_folded_mask_keeps_its_runtime_reads():
    """`k < 5 | k >= 5` is full, but the document ids beside it are still
    read: the kernels read every input the spec reads."""
    from flashgen.check import check
    from flashgen.parse import parse

    mask = "(k < 5 | k >= 5 | doc[b, q] == doc[b, k]) & causal"
    spec, diags = parse(f"attention t {{ head_dim = 32; dtype = fp32; doc: int32[B, Nk]; mask = {mask} }}")  # fmt: skip
    assert not diags, diags
    (variant,), diags = check([spec])
    assert not diags, diags
    assert print_expr(nnf_of(variant.mask)) == "(full | doc[b, q] == doc[b, k]) & k <= q"


def test_scores_use_the_mask_facts():
    """Under a mask that hides k > q, |q - k| and ALiBi skip the abs."""
    n = ir.Name
    causal = lower.negation_normal_form(lower.desugar_mask(n("causal")))
    assert lower.keys_before_queries(causal)
    for text in ["window(3, 1)", "causal | prefix(4)", "chunk(8)", "full", "k <= q + 1"]:
        mask = lower.negation_normal_form(lower.desugar_mask(make_variant(text).mask))
        assert not lower.keys_before_queries(mask), text
    for text in [
        "window(3, 0)",
        "causal & window(5)",
        "k < q",
        "k <= q - 3 | k == q",
        "causal & chunk(4)",
    ]:
        mask = lower.negation_normal_form(lower.desugar_mask(make_variant(text).mask))
        assert lower.keys_before_queries(mask), text
    alibi = ir.Binary(ir.BinOp.ADD, n("s"), n("alibi"))
    q_pos, k_pos = kx.Var("q_pos"), kx.Var("k_pos")
    code = list(kx.walk(lower.score_code(alibi, lower.ElementCode(True)).log2))
    assert not any(isinstance(x, kx.Abs) for x in code)
    assert kx.sub(k_pos, q_pos) in code
    code = list(kx.walk(lower.score_code(alibi, lower.ElementCode()).log2))
    assert kx.Abs(kx.sub(q_pos, k_pos)) in code
    # With float_distances (decision 094), the same from positions converted one by one.
    q_f, k_f = kx.Cast(q_pos, "tl.float32"), kx.Cast(k_pos, "tl.float32")
    code = list(
        kx.walk(lower.score_code(alibi, lower.ElementCode(True, float_distances=True)).log2)
    )
    assert not any(isinstance(x, kx.Abs) for x in code)
    assert kx.sub(k_f, q_f) in code
    code = list(kx.walk(lower.score_code(alibi, lower.ElementCode(float_distances=True)).log2))
    assert kx.Abs(kx.Paren(kx.sub(q_f, k_f))) in code


@pytest.mark.parametrize(
    "score, causal, text",
    [
        ("s + alibi", False, "tl.abs((q_pos.to(tl.float32) - k_pos.to(tl.float32)))"),
        ("s - 0.05 * abs(q - k)", True, "(q_pos.to(tl.float32) - k_pos.to(tl.float32))"),
        ("s - 0.05 * abs(k - q)", False, "tl.abs((q_pos.to(tl.float32) - k_pos.to(tl.float32)))"),
        ("s * (k - q)", False, "(k_pos.to(tl.float32) - q_pos.to(tl.float32))"),
        ("s + (q - k) / 7.0", False, "(q_pos.to(tl.float32) - k_pos.to(tl.float32))"),
        # Other integer expressions keep one conversion of the whole.
        ("s + 0.1 * (q - k + 1)", False, None),
        ("s + 0.1 * (q - 2 * k)", False, None),
    ],
)
def test_distances_convert_each_position_on_its_own(score, causal, text):
    """With float_distances (decision 094), k - q, q - k and |q - k| in a
    real context become float32 differences of positions converted one row
    and one column at a time; without it, one conversion of the whole."""
    variant = make_variant("causal" if causal else "full", score=score)
    nnf = lower.negation_normal_form(lower.desugar_mask(variant.mask))
    keys_first = lower.keys_before_queries(nnf)
    plain = kx.to_source(lower.score_code(variant.score, lower.ElementCode(keys_first)).log2)
    assert "_pos.to(" not in plain and ").to(tl.float32)" in plain, plain
    code = lower.score_code(variant.score, lower.ElementCode(keys_first, float_distances=True))
    source = kx.to_source(code.log2)
    if text is None:
        assert "_pos.to(" not in source and ").to(tl.float32)" in source, source
    else:
        assert text in source, source


def test_float_differences_of_positions_are_the_conversions_of_integer_ones():
    """The claim `_float_difference` rests on: for every pair of positions in
    +-(MAX_SEQ_LEN - 1), float32(a) - float32(b) rounded to nearest is
    float32(a - b), bit for bit (differences past 2^24 round the same way)."""
    rng = np.random.default_rng(0)
    top = ir.MAX_SEQ_LEN - 1
    edges = np.array([0, 1, 2, 3, 2**23 - 1, 2**23, 2**23 + 1, 2**24 - 3, top], dtype=np.int64)
    edges = np.concatenate([edges, -edges])
    a = np.concatenate([rng.integers(-top, top + 1, 2_000_000), np.repeat(edges, edges.size)])
    b = np.concatenate([rng.integers(-top, top + 1, 2_000_000), np.tile(edges, edges.size)])
    near = rng.integers(-top, top + 1, 200_000)
    a = np.concatenate([a, near])
    b = np.concatenate([b, np.clip(near + rng.integers(-5, 6, near.size), -top, top)])
    got = a.astype(np.float32) - b.astype(np.float32)
    want = (a - b).astype(np.float32)
    assert np.array_equal(got.view(np.int32), want.view(np.int32))
    assert np.abs(a - b).max() > 2**24  # differences that round were drawn


def _full_interval(mask: ir.Expr, var: str, env: dict, n: int):
    """The interior the analysis claims (every interval of it), as a boolean
    vector over 0 .. n-1."""
    nnf = lower.negation_normal_form(lower.desugar_mask(mask))
    found = lower.interiors(nnf, var)
    if found is None:
        return None
    assert found[0] == lower.interior_bounds(nnf, var)
    assert 1 <= len(found) <= lower.MAX_INTERIORS
    claimed = np.zeros(n, dtype=bool)
    for bounds in found:
        lo = 0 if bounds[0] is None else _value(bounds[0], env)
        hi = n - 1 if bounds[1] is None else _value(bounds[1], env)
        claimed[max(lo, 0) : max(min(hi, n - 1) + 1, 0)] = True
    return claimed


@settings(max_examples=300, deadline=None)
@given(mask=masks(), rects=st.lists(rectangles(), min_size=1, max_size=6))
def test_interior_is_sound(mask, rects):
    """Keys claimed visible to every query of a tile are (and vice versa)."""
    dense = {}
    offset = N_KEYS - N_QUERIES
    for qa, qb, ka, kb, head, num_heads in rects:
        if num_heads not in dense:
            dense[num_heads] = _visible(mask, N_QUERIES, N_KEYS, num_heads)
        visible = dense[num_heads][head]
        env = _namespace(qa + offset, qb + offset, ka, kb, head, num_heads)
        keys = _full_interval(mask, "k", env, N_KEYS)
        if keys is not None:
            seen_by_all = visible[qa : qb + 1].all(axis=0)
            assert not (keys & ~seen_by_all).any(), "interior key hidden from a query"
        # Query positions: row r sits at position r + offset.
        rows = _full_interval(mask, "q", env, N_KEYS)
        if rows is not None:
            see_all = visible[:, ka : kb + 1].all(axis=1)
            positions = np.zeros(N_KEYS, dtype=bool)
            positions[max(offset, 0) :] = see_all[max(-offset, 0) :]
            assert not (rows & ~positions).any(), "interior query misses a key"


@pytest.mark.parametrize(
    "name", ["causal", "window", "window2", "prefix", "chunk", "causal_window", "causal_prefix"]
)
@pytest.mark.parametrize("block", [1, 16, 33])
def test_named_masks_have_exact_interior(name, block):
    """For the named masks the interior is every key all queries of the tile see."""
    mask = _named(name)
    visible = _visible(mask, N_QUERIES, N_KEYS, 1)[0]
    offset = N_KEYS - N_QUERIES
    for qa in range(0, N_QUERIES, block):
        qb = min(qa + block, N_QUERIES) - 1
        env = _namespace(qa + offset, qb + offset, 0, 0, 0, 1)
        keys = _full_interval(mask, "k", env, N_KEYS)
        assert keys is not None
        np.testing.assert_array_equal(keys, visible[qa : qb + 1].all(axis=0), err_msg=str(qa))


@pytest.mark.parametrize(
    "name", ["causal", "window", "window2", "prefix", "chunk", "causal_window", "causal_prefix"]
)
@pytest.mark.parametrize("block", [1, 16, 33])
def test_named_masks_have_exact_query_bounds(name, block):
    """The query bounds of a key tile are the first and last query that sees
    one of its keys (clipped to the queries that exist)."""
    mask = _named(name)
    for n_queries in (N_QUERIES, N_KEYS - 37):
        visible = _visible(mask, n_queries, N_KEYS, 1)[0]
        offset = N_KEYS - n_queries
        lo_code, hi_code = lower.query_bounds(nnf_of(mask))
        for ka in range(0, N_KEYS, block):
            kb = min(ka + block, N_KEYS) - 1
            rows = np.nonzero(visible[:, ka : kb + 1].any(axis=1))[0] + offset
            env = _namespace(0, 0, ka, kb, 0, 1)
            lo = offset if lo_code is None else max(_value(lo_code, env), offset)
            hi = offset + n_queries - 1
            if hi_code is not None:
                hi = min(_value(hi_code, env), hi)
            if rows.size:
                assert (lo, hi) == (rows.min(), rows.max()), (ka, n_queries)
            else:
                assert lo > hi, (ka, n_queries)


@st.composite
def _diagonal_masks(draw, depth: int = 3) -> ir.Expr:
    """Masks in `mask_forms.diagonal_rows`' class, and some just outside it."""
    n, c, b = ir.Name, ir.Call, ir.Binary
    if depth == 0 or draw(st.integers(0, 2)) == 0:
        k_minus_q = b(ir.BinOp.SUB, n("k"), n("q"))
        bound = ir.Num(draw(st.integers(-40, 40)))
        op = draw(st.sampled_from((ir.BinOp.LE, ir.BinOp.LT, ir.BinOp.GE, ir.BinOp.GT)))
        return draw(
            st.sampled_from(
                [
                    n("causal"),
                    c("window", (ir.Num(draw(st.integers(0, 50))),)),
                    c(
                        "window",
                        (ir.Num(draw(st.integers(0, 30))), ir.Num(draw(st.integers(0, 30)))),
                    ),
                    c("chunk", (ir.Num(draw(st.integers(1, 70))),)),
                    c("prefix", (ir.Num(draw(st.integers(0, 90))),)),
                    b(op, k_minus_q, bound),
                ]
            )
        )
    sub = _diagonal_masks(depth - 1)
    return b(draw(st.sampled_from((ir.BinOp.AND, ir.BinOp.OR))), draw(sub), draw(sub))


def _assert_no_empty_tiles(mask, block, n_queries):
    """Every tile inside the bounds has a visible pair, in both directions."""
    nnf = lower.negation_normal_form(lower.desugar_mask(mask))
    visible = _visible(mask, n_queries, N_KEYS, 1)[0]
    offset = N_KEYS - n_queries
    lo_code, hi_code = lower.key_bounds(nnf)
    for qa in range(0, n_queries, block):
        qb = min(qa + block, n_queries) - 1
        env = _namespace(qa + offset, qb + offset, 0, 0, 0, 1)
        lo = 0 if lo_code is None else max(_value(lo_code, env), 0)
        hi = N_KEYS if hi_code is None else min(_value(hi_code, env) + 1, N_KEYS)
        if lo >= hi:
            # No key at all for this query tile.  The kernel's loop, which
            # starts at lo rounded down to a tile, may still run one tile
            # here, masked: correct, and rare enough not to test for.
            continue
        for ka in range(lo // block * block, hi, block):
            assert visible[qa : qb + 1, ka : ka + block].any(), ("keys", qa, ka)
    lo_code, hi_code = lower.query_bounds(nnf)
    for ka in range(0, N_KEYS, block):
        kb = min(ka + block, N_KEYS) - 1
        env = _namespace(0, 0, ka, kb, 0, 1)
        lo = 0 if lo_code is None else max(_value(lo_code, env) - offset, 0)
        hi = n_queries if hi_code is None else min(_value(hi_code, env) - offset + 1, n_queries)
        if lo >= hi:
            continue
        for qa in range(lo // block * block, hi, block):
            assert visible[qa : qa + block, ka : kb + 1].any(), ("queries", ka, qa)


@settings(max_examples=300, deadline=None)
@given(mask=masks() | _diagonal_masks(), block=st.sampled_from((1, 8, 16, 32)))
def test_dense_edges_have_no_empty_tiles_in_bounds(mask, block):
    """`edges_dense` lets the kernels drop the per-tile emptiness test on the
    masked tiles around the interior: every tile inside the key bounds of a
    query tile, and inside the query bounds of a key tile, has a visible pair
    (with Nq > Nk, Nq = Nk and Nq < Nk)."""
    nnf = lower.negation_normal_form(lower.desugar_mask(mask))
    if not lower.edges_dense(nnf):
        return
    for n_queries in (N_QUERIES, N_KEYS, N_KEYS - 37):
        _assert_no_empty_tiles(mask, block, n_queries)


def test_diagonal_masks_are_recognised():
    """`mask_forms.diagonal_rows` accepts these hand-written members of its class (the
    kinds `_diagonal_masks` draws) and rejects near misses, and the accepted
    ones have no empty tile in their bounds."""
    n, b = ir.Name, ir.Binary
    dense = [
        _named("causal_prefix"),
        _named("chunk"),
        b(ir.BinOp.AND, n("causal"), _named("chunk")),
        b(ir.BinOp.OR, _named("chunk"), _named("causal_window")),
        b(ir.BinOp.AND, _named("causal_prefix"), _named("window2")),
    ]
    sparse = [
        _named("prefix"),
        # Rows of causal & window reach only 50 keys back: with the prefix a
        # query far from the start sees two intervals.
        b(ir.BinOp.OR, _named("causal_window"), _named("prefix")),
        b(ir.BinOp.AND, n("causal"), _named("prefix")),
        b(ir.BinOp.GE, b(ir.BinOp.SUB, n("k"), n("q")), ir.Num(1)),  # misses the diagonal
    ]
    for mask, expected in [(m, True) for m in dense] + [(m, False) for m in sparse]:
        nnf = lower.negation_normal_form(lower.desugar_mask(mask))
        assert (mask_forms.diagonal_rows(nnf) is not None) == expected, mask
    for mask in dense:
        for block in (1, 16, 33):
            for n_queries in (N_QUERIES, N_KEYS, N_KEYS - 37):
                _assert_no_empty_tiles(mask, block, n_queries)


def test_band_recognition():
    n, c = ir.Name, ir.Call
    band = [n("causal"), c("window", (ir.Num(5), ir.Num(2))), _named("causal_window")]
    not_band = [_named("causal_prefix"), _named("chunk"), _named("prefix")]
    empty = ir.Binary(
        ir.BinOp.AND,
        ir.Binary(ir.BinOp.GE, ir.Name("k"), ir.Binary(ir.BinOp.ADD, ir.Name("q"), ir.Num(3))),
        n("causal"),
    )
    for mask, expected in [(m, True) for m in band] + [(m, False) for m in not_band + [empty]]:
        nnf = lower.negation_normal_form(lower.desugar_mask(mask))
        assert mask_forms.is_band(nnf) is expected, mask


@pytest.mark.parametrize(
    "mask, score, dtype, head_dim, expected",
    [
        ("full", None, ir.DType.BF16, 128, "full"),
        ("causal", None, ir.DType.FP16, 128, "causal"),
        ("causal", "s", ir.DType.BF16, 128, "causal"),
        ("causal", None, ir.DType.FP32, 128, None),  # no 16-bit tensor-core path
        ("causal", None, ir.DType.BF16, 64, "causal"),  # from 4096 keys (decision 068)
        ("full", None, ir.DType.FP16, 64, "full"),
        ("causal", "s + 1", ir.DType.BF16, 64, None),  # the general mode: d128 only
        ("causal & window(8192)", None, ir.DType.BF16, 64, None),
        ("causal", None, ir.DType.BF16, 120, None),
        ("causal", "s + 1", ir.DType.BF16, 128, "any"),
        ("k <= q", None, ir.DType.BF16, 128, "any"),  # causal spelled out: the general mode
        ("causal & window(64, 0)", None, ir.DType.BF16, 128, None),
        ("prefix(16)", None, ir.DType.BF16, 128, None),
    ],
)
def test_gluon_forward_own_code_only_for_plain_full_and_causal(
    mask, score, dtype, head_dim, expected
):
    variant = make_variant(mask, score, dtype=dtype, head_dim=head_dim)
    assert lower.lower(variant).gluon_forward == expected


@pytest.mark.parametrize(
    "mask, score, dtype, head_dim, expected",
    [
        ("full", None, ir.DType.BF16, 128, True),
        ("causal & window(64, 0)", "s + alibi", ir.DType.FP16, 64, True),  # any mask and score
        ("prefix(16)", "softcap(s, 20.0)", ir.DType.BF16, 128, True),
        # A derivative with an exp (a quotient, a log) spills the d128 dK/dV
        # consumers: the Triton backward (decision 060); d64 keeps Gluon.
        ("causal", "exp(-abs(s))", ir.DType.BF16, 128, False),
        ("causal", "exp(-abs(s))", ir.DType.FP16, 64, True),
        # A derivative that compares s with positions keeps them live beside
        # the d128 accumulators: the Triton backward (decision 073) ...
        ("chunk(55)", "max(s - 0.004 * abs(q - k), -0.8)", ir.DType.BF16, 128, False),
        ("causal", "softcap(s + alibi, 20.0)", ir.DType.BF16, 128, False),
        ("causal", "max(s - 0.004 * abs(q - k), -0.8)", ir.DType.BF16, 64, True),
        ("causal", "softcap(s, 20.0)", ir.DType.BF16, 128, True),  # no positions in it
        ("causal", "s - 0.004 * abs(q - k)", ir.DType.BF16, 128, True),  # derivative 1
        # ... but not where every key lies below a constant (fixed costs).
        ("causal & prefix(193)", "min(s - 0.007 * abs(q - k), 0.6)", ir.DType.BF16, 128, True),
        ("causal", None, ir.DType.FP32, 128, False),  # no 16-bit tensor-core path
        ("causal", None, ir.DType.BF16, 80, False),  # written for d64 and d128
        ("causal", None, ir.DType.BF16, 256, False),
        # A mask that hides every pair leaves the Gluon loops empty, which
        # Triton 3.6 did not compile: the Triton kernels take it.
        ("!full", None, ir.DType.BF16, 64, False),
        ("causal & !causal", None, ir.DType.BF16, 64, False),
        ("k < 5 & k > 9 | h < 0", None, ir.DType.FP16, 128, False),
        ("k < 5 | k >= 5", None, ir.DType.BF16, 64, True),  # every pair: full
    ],
)
def test_gluon_backward_for_16_bit_d64_and_d128(mask, score, dtype, head_dim, expected):
    variant = make_variant(mask, score, dtype=dtype, head_dim=head_dim)
    assert lower.lower(variant).gluon_backward is expected


@pytest.mark.parametrize(
    "mask, score, expected",
    [
        ("full", None, "full"),  # the plain modes keep their own code
        ("causal", None, "causal"),
        ("causal & window(4095)", None, "any"),  # a query row may see 4096 keys
        ("causal & window(4094)", None, None),  # 4095 at most: the Triton forward
        ("window(128, 128)", None, None),
        ("causal & chunk(8192)", None, "any"),
        ("causal | prefix(256)", None, "any"),
        ("causal", "s + alibi", "any"),
        ("causal", "log(1.0 + abs(s))", "any"),  # whichever backward the module takes
        ("k <= q", None, "any"),
    ],
)
def test_gluon_forward_for_any_mask(mask, score, expected, monkeypatch):
    variant = make_variant(mask, score, dtype=ir.DType.BF16, head_dim=128)
    model = lower.lower(variant)
    assert model.gluon_forward == expected
    assert model.gluon_min_keys == (4096 if expected == "any" else 0)
    rescaled = make_variant(mask, score, dtype=ir.DType.BF16, head_dim=128, rescale_threshold=8.0)
    assert lower.lower(rescaled).gluon_forward == expected  # it rescales at every tile
    plain = expected if expected != "any" else None
    at_64 = lower.lower(dataclasses.replace(variant, head_dim=64))
    assert at_64.gluon_forward == plain  # the general mode at d128 only
    assert at_64.gluon_min_keys == (4096 if plain else 0)  # the plain ones from 4096 keys
    monkeypatch.setattr(kernel_choice, "GLUON_ANY_MIN_KEYS", 0)  # forced on: every mask
    forced = lower.lower(variant)
    assert forced.gluon_forward == (plain or "any")
    assert forced.gluon_min_keys == 0
    monkeypatch.setattr(kernel_choice, "GLUON_FORWARD_ANY", False)
    assert lower.lower(variant).gluon_forward == plain


@pytest.mark.parametrize(
    "mask, empty, expected",
    [
        # Sink keys and a sliding window: the walk runs every tile to the diagonal.
        ("causal & (k < 64 | k >= q - 256)", (0.8, 0.85), None),
        # rand2_17: a chunk and a residue under a prefix, or keys below 5 H
        ("causal & prefix(96) & (q div 9 == k div 9 | (q - k) % 2 == 1) | !abs(H) * 5 < k",
         (0.95, 1.0), None),  # fmt: skip
        # rand3_12: causal, one column, one corner (decision 112)
        ("!(max(k, h) != 20 & max(q, k) > 32 & !causal)", (0.0, 0.0), "any"),
        ("causal | k >= q + 27", (0.0, 0.0), "any"),  # a gap narrower than a tile
        ("causal | prefix(256)", (0.0, 0.0), "any"),
        # a gap of at most 1k keys at N = 4k
        ("causal & (k < 2048 | k >= q - 1024)", (0.0, 0.125), "any"),
    ],
)
def test_the_any_mask_gluon_forward_is_left_to_triton_where_its_walk_is_mostly_empty(
    mask, empty, expected
):
    """The any-mask Gluon forward walks every key tile between its bounds; past
    GLUON_ANY_MAX_EMPTY of them empty (the Triton forward's tile test would
    skip them), the Triton forward runs (decision 113)."""
    variant = make_variant(mask, dtype=ir.DType.BF16, head_dim=128)
    walked = kernel_choice.empty_tiles_walked(nnf_of(variant.mask))
    assert empty[0] <= walked <= empty[1], walked
    assert lower.lower(variant).gluon_forward == expected


@pytest.mark.parametrize(
    "mask, declared, expected",
    [
        ("causal | !(causal | abs(q - k) < 27)", "", "any"),  # a gap: two interiors (rand0_7)
        ("!window(46, 214)", "", "any"),  # a gap (rand1_23)
        ("q != k", "", "any"),  # no interior: every tile masked (rand1_16)
        ("!(window(10) | chunk(127))", "", "any"),  # no interior (rand1_2)
        ("causal", "", None),  # one interior each: the Triton forward
        ("causal | prefix(256)", "", None),
        ("h % 2 == 0", "", None),  # whole heads (rand0_1, rand0_11: 0.92x)
        ("full", "", None),
        ("causal | (q - k) % 3 != 1", "", None),  # rand2_13: 0.71x
        ("!(d[b, k] > d[b, q] + 2)", "d: int32[B, Nk]", None),  # runtime data: never at d64
    ],
)
def test_the_any_mask_gluon_forward_at_d64_where_the_triton_key_walk_splits(
    mask, declared, expected, monkeypatch
):
    """Decision 099 (off until its held-out run): with
    GLUON_FORWARD_SPLIT_WALK_HEAD_DIMS = (64,) the any-mask Gluon forward
    takes at d64 a mask whose Triton key loop finds no interior or two
    (`split_key_walk`), whatever the score's cost up to
    GLUON_ANY_MAX_SPECIAL_OPS; at d128 it takes every mask, as before."""
    off = make_variant(mask, "s * 0.5", dtype=ir.DType.BF16, head_dim=64, declared=declared)
    assert lower.lower(off).gluon_forward is None  # the default
    monkeypatch.setattr(kernel_choice, "GLUON_FORWARD_SPLIT_WALK_HEAD_DIMS", (64,))
    for score in ("s * 0.5", "s + alibi"):
        at_64 = make_variant(mask, score, dtype=ir.DType.BF16, head_dim=64, declared=declared)
        model = lower.lower(at_64)
        assert model.gluon_forward == expected, score
        assert model.gluon_min_keys == (4096 if expected else 0)
        at_128 = lower.lower(dataclasses.replace(at_64, head_dim=128))
        assert at_128.gluon_forward == "any"  # runtime data too (decision 098)
    costly = make_variant(mask, "exp(-abs(s - 0.003 * abs(q - k)))", head_dim=64, declared=declared)
    assert lower.lower(dataclasses.replace(costly, dtype=ir.DType.BF16)).gluon_forward is None


@pytest.mark.parametrize(
    "score, ops",
    [
        ("s", 0),
        ("s * 0.5 + 0.05 * h", 0),  # terms of h are per row
        ("s / (1.0 + 0.01 * h)", 0),
        ("s + alibi", 1),  # one conversion of positions
        ("s - 0.01 * abs(q - k) - 0.02 * (q - k)", 1),  # however many terms read them
        ("softcap(s, 30.0)", 1),
        ("log(1.0 + abs(s))", 1),
        ("exp(h * 0.1) * s", 0),  # a function of h alone is per row
        ("exp(-abs(s - 0.003 * abs(q - k)))", 2),  # seed 0's rand0_19
        ("sqrt(abs(tanh(s + 0.026 * h)))", 2),  # rand0_29
        ("tanh(s / (1.0 + 0.005 * abs(q - k)))", 3),  # rand0_8: tanh, rcp, conversion
        ("s / (1.0 + abs(s))", 1),  # a quotient by a value of the tile
    ],
)
def test_score_special_ops(score, ops):
    assert kernel_choice.score_special_ops(make_variant("causal", score).score) == ops


@pytest.mark.parametrize(
    "score",
    ["exp(-abs(s - 0.003 * abs(q - k)))", "tanh(s / (1.0 + 0.005 * abs(q - k)))"],
)
def test_the_any_mask_gluon_forward_leaves_costly_scores_to_triton(score, monkeypatch):
    """Decision 089: a score of two or more special operations per element
    takes the Triton forward at d128, whatever the mask; the plain modes and
    the Gluon backward are decided as before."""
    for mask in ("causal", "!causal", "full", "max(q, k) > 37"):
        variant = make_variant(mask, score, dtype=ir.DType.BF16, head_dim=128)
        assert lower.lower(variant).gluon_forward is None
        monkeypatch.setattr(kernel_choice, "GLUON_ANY_MAX_SPECIAL_OPS", 3)
        assert lower.lower(variant).gluon_forward == "any"
        monkeypatch.undo()


def _kernel_sources(source: str) -> dict[str, str]:
    """A module's top-level functions that are Triton or Gluon kernels or their
    helpers, by name (decorator and body)."""
    chunks: dict[str, str] = {}
    lines = source.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(("@triton.jit", "@gluon.jit")):
            name = lines[i + 1].split("(")[0].removeprefix("def ")
            end = next(
                (j for j in range(i + 2, len(lines)) if lines[j][:1] not in ("", " ", ")")),
                len(lines),
            )
            chunks[name] = "\n".join(lines[i:end])
    return chunks


def test_a_rescale_threshold_leaves_the_gluon_kernels_as_they_are():
    """Decision 083: the any-mask Gluon forward rescales at every tile, so a
    spec with a threshold gets the same Gluon kernels (which the GPU tests
    of specs without one cover); only the Triton kernels' running max moves
    by the threshold."""
    from flashgen.emit import render_module

    score = "max(s - 0.003 * abs(q - k), -0.8)"  # one special op: the any-mask kind (089)
    plain = make_variant("!causal", score, dtype=ir.DType.BF16, head_dim=128)
    rescaled = dataclasses.replace(plain, rescale_threshold=8.0)
    assert lower.lower(rescaled).gluon_forward == "any"
    before = _kernel_sources(render_module(plain))
    after = _kernel_sources(render_module(rescaled))
    assert before.keys() == after.keys()
    gluon = [name for name in before if name.startswith("_gluon")]
    assert "_gluon_attn_fwd" in gluon and "_scores_log2" in before
    changed = sorted(name for name in before if before[name] != after[name])
    assert changed == ["_attn_fwd_tile"]  # the Triton forward's running max
    assert "m_blk > m_i + 8.0" in after["_attn_fwd_tile"]


@pytest.mark.parametrize(
    "score, heavy",
    [
        ("exp(-s)", True),
        ("log(1.0 + abs(s + alibi))", True),
        ("sqrt(abs(s))", True),  # d/ds: a quotient by 2 sqrt(|s|)
        ("tanh(s / (1.0 + 0.01 * abs(q - k)))", True),  # a quotient by a position term
        ("s * exp(-0.1 * abs(q - k))", True),  # an exp of positions, per element
        ("s / (1.0 + 0.5 * h)", False),  # a quotient by a head's constant
        ("s / 2.0", False),
        ("softcap(s, 20.0)", False),  # 1 - tanh^2
        ("tanh(s) * 3.0", False),
        ("max(s - 0.1 * abs(q - k), -2.0)", False),
        ("s + exp(-0.1 * abs(q - k))", False),  # additive: the derivative is 1
        ("2.0 * h", False),  # no s at all
    ],
)
def test_heavy_derivative(score, heavy):
    """Which scores' derivatives compute an exp, a log or a quotient per
    element (kernel_choice.heavy_derivative, decision 060)."""
    assert kernel_choice.heavy_derivative(make_variant("full", score).score) is heavy


@settings(max_examples=200, deadline=None)
@given(mask=masks(), n_queries=st.integers(1, 300), n_keys=st.integers(1, 300))
def test_key_span_bounds_every_row(mask, n_queries, n_keys):
    """No query row of the dense mask sees more keys than `key_span` says."""
    span = lower.key_span(lower.negation_normal_form(lower.desugar_mask(mask)))
    if span is not None:
        variant = ir.Variant("m", 16, ir.DType.FP32, mask=mask)
        assert int(mask_matrix(variant, n_queries, n_keys, 3).sum(-1).max()) <= span


@pytest.mark.parametrize(
    "mask, span",
    [
        ("full", None),
        ("causal", None),
        ("window(10)", 11),
        ("window(128, 128)", 257),
        ("causal & window(4095)", 4096),
        ("window(3, 5) & k >= q", 6),  # k - q in [0, 5]
        ("k - q > 2 & k - q < 2", 0),  # empty
        ("q == k", 1),
        ("chunk(256)", 256),
        ("causal & chunk(256) & window(99)", 100),
        ("window(10) | window(2, 30)", 44),  # a union sees at most the sum
        ("window(10) | causal", None),
        ("causal | prefix(256)", None),
        ("causal & (window(7) | chunk(64))", 72),
        ("prefix(256)", 256),
        ("k <= 9 | k == 300", 11),
        ("abs(q - k) < 100", 199),
        ("abs(k - q) <= 4 & causal", 5),  # the band k - q in [-4, 0]
        ("7 > abs(q - k)", 13),
        ("abs(q - k) > 7", None),
        ("k > 9", None),
        ("q div 64 == k div 32", None),
        ("!(k > q + 3) & k >= q - 3", 7),
    ],
)
def test_key_span(mask, span):
    """The most keys a query sees, checked against the dense mask."""
    variant = make_variant(mask)
    assert lower.key_span(lower.negation_normal_form(lower.desugar_mask(variant.mask))) == span
    if span is not None:
        n = span + 300
        most = int(mask_matrix(variant, n, n, 1).sum(-1).max())
        assert most <= span
        assert most == span or "|" in mask  # a union's parts may overlap


# --------------------------------------------------------------------------- #
# Constants in element code
# --------------------------------------------------------------------------- #


def _expr(text: str) -> ir.Expr:
    """A score expression through the real parser (not the checker)."""
    from flashgen.parse import parse

    spec, diags = parse(f"attention t {{ head_dim = 16; dtype = fp32; score = {text} }}")
    assert not diags, diags
    (setting,) = [x for x in spec.blocks[0].settings if x.key == "score"]
    return setting.value


@pytest.mark.parametrize(
    "text,value",
    [
        ("-(1)", -1),
        ("2 - 3", -1),
        ("-7 div 2", -4),  # floor, as the kernels and the reference divide
        ("-7 % 3", 2),
        ("abs(-3) * min(2, -5)", -15),
        ("max(1, 2.5)", 2.5),
        ("2 * 0.5", 1.0),
        ("1 / 4", 0.25),
        ("exp(1000.0)", math.inf),
        ("-exp(1000.0)", -math.inf),
        ("log(0.0)", -math.inf),
        ("sqrt(4)", 2.0),
        ("tanh(-1e30)", -1.0),
        ("softcap(3.0, 1e-30)", 1e-30),
        ("s", None),
        ("2 * q", None),
        ("alibi", None),
    ],
)
def test_constant_value(text, value):
    got = lower.constant_value(_expr(text))
    assert got == value and type(got) is type(value)


def test_constant_value_nan():
    assert math.isnan(lower.constant_value(_expr("sqrt(-1.0)")))
    assert math.isnan(lower.constant_value(_expr("log(-2)")))


@pytest.mark.parametrize(
    "score",
    ["-s", "exp(-s)", "s * (2 - 3)", "abs(-3) * s", "s + min(2, 3)", "1 - s", "tanh(-s) * 3"],
)
def test_constants_reach_kernels_as_float_literals(score):
    """The derivative of -s is the integer -1; `(-(1)).to(tl.float32)` is not
    Triton (a Python int has no .to) and broke the interpreter and the Gluon
    backward.  Every constant in a real context is one float literal."""
    variant = make_variant("causal", score=score)
    nnf = nnf_of(variant.mask)
    code = lower.score_code(variant.score, lower.ElementCode(lower.keys_before_queries(nnf)))
    positions = ("q_pos", "k_pos", "head", "num_heads")
    casts = [x for x in kx.walk_code(code.trees()) if isinstance(x, kx.Cast)]
    assert all(any(kx.uses(x.operand, name) for name in positions) for x in casts), casts
    if score == "-s":
        assert code.grad == kx.Float(-1.0)
        assert lower.lower(variant).score_grad_code == "-1.0"


def test_float_literals_are_triton_syntax():
    assert kx.float_literal(math.inf) == 'float("inf")'
    assert kx.float_literal(-math.inf) == 'float("-inf")'
    assert kx.float_literal(math.nan) == 'float("nan")'
    assert kx.float_literal(-1) == "-1.0"


def test_tanh_reader_recovers_saturated_tanh_exactly():
    """softcap's backward reads tanh back as s2 * r with s2 = fl32(a) * tanh:
    a saturated tanh (+-1) must give |t| = 1 exactly (or, with the clamp, at
    least 1), so the derivative there is exactly 0 and not a few ulps."""
    exact = 0
    for cap in np.geomspace(1.2e-38, 1e37, 3000):
        a = np.float32(lower.LOG2E * float(cap))
        r, is_exact = element_code.tanh_reader(lower.LOG2E * float(cap))
        product = a * np.float32(r)
        assert product == 1 if is_exact else product > 1
        assert abs(float(product) - 1) < 2.0**-21
        exact += is_exact
    assert exact > 2500  # the clamp is the exception


def test_saturated_softcap_derivative_is_zero():
    """The emitted derivative at tanh = +-1, in float32 as the kernel computes."""
    for cap in ("1e-30", "30.0", "50.0", "7.3"):
        variant = make_variant("causal", score=f"softcap(s, {cap})")
        score = lower.score_code(variant.score, lower.ElementCode())
        assert not kx.uses(score.grad, "s")  # it reads the score s2 back
        s2 = np.float32(lower.LOG2E * float(cap)) * np.float32(-1.0)
        # float32 throughout: numpy keeps s2's type against Python literals.
        assert kx.evaluate(score.grad, {"s2": s2}) == 0


@pytest.mark.parametrize(
    "score,dtype,expected",
    [
        ("softcap(s, 50.0)", ir.DType.FP16, False),
        ("softcap(s, 2.3e38)", ir.DType.FP16, True),
        ("softcap(s, 1e6)", ir.DType.BF16, True),
        ("tanh(s) * 3.0", ir.DType.FP16, True),
        ("softcap(s, 50.0)", ir.DType.FP32, True),
    ],
)
def test_tanh_polynomial_where_its_error_is_amplified(score, dtype, expected):
    assert lower.lower(make_variant("causal", score=score, dtype=dtype)).tanh_small_poly is expected


# --------------------------------------------------------------------------- #
# int32 safety of the scalar tile code
# --------------------------------------------------------------------------- #


class _Int32(int):
    """An int whose arithmetic raises when a result leaves int32, standing
    in for the kernels' int32 scalars (`.to(tl.int64)` leaves the check)."""

    def _checked(self, value):
        if isinstance(value, (bool, np.bool_)) or type(value) is _Int64:
            return value
        if not -(2**31) <= value < 2**31:
            raise OverflowError(value)
        return _Int32(value)

    def __add__(self, o):
        return self._checked(int(self) + int(o))

    __radd__ = __add__

    def __sub__(self, o):
        return self._checked(int(self) - int(o))

    def __rsub__(self, o):
        return self._checked(int(o) - int(self))

    def __mul__(self, o):
        return self._checked(int(self) * int(o))

    __rmul__ = __mul__

    def __floordiv__(self, o):
        return self._checked(int(self) // int(o))

    def __rshift__(self, o):
        return self._checked(int(self) >> int(o))

    def __and__(self, o):
        return self._checked(int(self) & int(o))

    def __neg__(self):
        return self._checked(-int(self))

    def __lt__(self, o):
        return np.bool_(int(self) < int(o))

    def __le__(self, o):
        return np.bool_(int(self) <= int(o))

    def __gt__(self, o):
        return np.bool_(int(self) > int(o))

    def __ge__(self, o):
        return np.bool_(int(self) >= int(o))

    def __eq__(self, o):
        return np.bool_(int(self) == int(o))

    def __ne__(self, o):
        return np.bool_(int(self) != int(o))

    __hash__ = int.__hash__

    def to(self, dtype):
        return _Int64(self)


class _Int64(int):
    pass


def _where(c, a, b):
    return a if c else b


def _checked(value):
    return value if type(value) is _Int64 else _Int32(value)


def _floor_div32(a, b):  # the generated module's `_floor_div`, in int32
    return (a - _where(a < 0, b - 1, 0)) // b


# The kernel's tl functions over int32 scalars that raise on overflow.
_INT32_OPS = types.SimpleNamespace(
    where=_where,
    minimum=lambda a, b: _checked(min(int(a), int(b))),
    maximum=lambda a, b: _checked(max(int(a), int(b))),
    abs=lambda a: _checked(abs(int(a))),
    floor_div=_floor_div32,
    floor_mod=lambda a, b: a - _floor_div32(a, b) * b,
    cast=lambda x, dtype: x.to(dtype),
    boolean=np.bool_,
)


def _int32_env(**names):
    return {k: _Int32(v) for k, v in names.items()}


def _mask(text: str) -> ir.Expr:
    from flashgen.parse import parse

    spec, diags = parse(f"attention t {{ head_dim = 16; dtype = fp32; mask = {text} }}")
    assert not diags, diags
    (setting,) = [x for x in spec.blocks[0].settings if x.key == "mask"]
    return setting.value


P = ir.POSITION_BOUND
# Tiles at the ends of the positions the analysis assumes, and near 0.
_TILES = [(-P, -P + 63), (P - 63, P), (-5, 58)]
INT32_MASKS = [
    "window(1000000000)",
    "window(0, 1000000000)",
    "k <= q + 1000000000",
    "q - k >= -1000000000",
    "prefix(1000000000)",
    "chunk(536870912)",
    "causal | prefix(1000000000)",
    "!(k <= q + 1000000000) | chunk(1073741824)",
    # Within the claim (every subexpression and comparison difference within
    # +-2^30), but their normal forms or bounds reached 2^31: 32768 * H - 2^30
    # at H = 2^16, a chunk end A + c - 1 with A and c near 2^30,
    # hi - lo of a mod's argument near 2^31.
    "H * 16384 - 1073741824 + H * 16384 >= 0 & causal",
    "h * 8192 - 536870912 + h * 8192 <= k",
    "(q + 1040187392) div 1073741824 == k div 1073741824",
    "(k - 1040187392) div 1073741824 == q div 1073741824",
    "(q * 16 - 536870912 + abs(k)) % 7 == 1",
    "min(q * 16, 1040187392 - k) < 1000",
    "(q - k + 1000000000) % 1000000007 != 5",
    # Both parities in one tile: the mod's argument spans [-2^30, 2^30].
    "((q % 2) * 1073741824 - (k % 2) * 1073741824) % 7 == 3",
    # Decided jointly (tiles.visible_may): ranges and congruences near 2^30.
    "(q - k + 1000000000) % 1073741824 == 1073741823 & k >= 1000000000 & causal",
    "(k - q) % 1000000007 == 5 & (q - k) % 536870912 == 7 & q <= -1000000000 | prefix(3)",
]


@pytest.mark.parametrize("text", INT32_MASKS)
def test_tile_code_stays_in_int32(text):
    """Every line of scalar tile code, every bound, and the template's own
    arithmetic on the bounds (key_hi + 1, query bounds minus q_offset, the
    interior's rounding up to a tile), evaluated at tile corners that reach
    ir.POSITION_BOUND, with up to ir.MAX_HEADS heads and |q_offset| up to
    ir.MAX_SEQ_LEN: no int32 result overflows."""
    nnf = nnf_of(_mask(text))
    tiles = lower.TileCode()
    must, may = tiles.truth(nnf)
    key, query = lower.key_bounds(nnf), lower.query_bounds(nnf)
    full = [*(lower.interiors(nnf, "k") or ()), *(lower.interiors(nnf, "q") or ())]
    q_offset, zero = kx.Var("q_offset"), kx.Int(0)
    for (q_lo, q_hi), (k_lo, k_hi) in [(a, b) for a in _TILES for b in _TILES]:
        for head, num_heads in [(0, 1), (ir.MAX_HEADS - 1, ir.MAX_HEADS)]:
            for offset in (-ir.MAX_SEQ_LEN, ir.MAX_SEQ_LEN):
                env = _int32_env(
                    q_lo=q_lo, q_hi=q_hi, k_lo=k_lo, k_hi=k_hi, head=head, num_heads=num_heads
                )
                env["q_offset"] = _Int32(offset)
                kx.run(tiles.lines, env, _INT32_OPS)
                kx.evaluate(must, env, _INT32_OPS)
                kx.evaluate(may, env, _INT32_OPS)
                plus = kx.add
                template = [
                    kx.mul(kx.FloorDiv(kx.Max(key[0], zero), 256), kx.Int(256)) if key[0] else None,
                    plus(key[1], kx.Int(1)) if key[1] else None,
                    kx.Max(kx.sub(query[0], q_offset), zero) if query[0] else None,
                    plus(kx.sub(query[1], q_offset), kx.Int(1)) if query[1] else None,
                ]
                for lo, hi in full:
                    if lo is not None:
                        template.append(plus(kx.Max(kx.sub(lo, q_offset), zero), kx.Int(255)))
                    if hi is not None:
                        low = kx.Min(kx.sub(hi, q_offset), kx.Int(1000))
                        template.append(plus(low, kx.Int(1)))
                for code in template:
                    if code is not None:
                        kx.evaluate(code, env, _INT32_OPS)


def test_wide_affine_forms_are_evaluated_in_int64():
    """32768 * num_heads would wrap at 2^16 heads; the bound code widens."""
    nnf = nnf_of(_mask("H * 16384 - 1073741824 + H * 16384 >= 0"))
    tiles = lower.TileCode()
    tiles.truth(nnf)
    casts = [x for x in kx.walk_code(tiles.lines) if isinstance(x, kx.Cast)]
    assert casts and all(x.dtype == "tl.int64" for x in casts)
    assert any(".to(tl.int64)" in kx.stmt_source(line) for line in tiles.lines)
    plain = lower.TileCode()
    plain.truth(nnf_of(_mask("causal & window(1000000000)")))
    assert not any(isinstance(x, kx.Cast) for x in kx.walk_code(plain.lines))


@pytest.mark.parametrize("head_dim", [64, 128])
def test_spec_at_the_nesting_limit_takes_the_gluon_paths(head_dim, monkeypatch):
    """What tests/test_gpu.py's nesting-limit test relies on: in 16 bits the
    deep spec gets the Gluon backward at head dim 64 (at 128 its derivative,
    with exp, log and quotients, takes the Triton one: decision 060), and at
    head dim 128 the "any" Gluon forward when GLUON_ANY_MIN_KEYS is 0 and
    GLUON_ANY_MAX_SPECIAL_OPS lets its score through (decision 089); its
    module renders and imports."""
    from kernel_utils import build, deep_variant

    monkeypatch.setattr(kernel_choice, "GLUON_ANY_MIN_KEYS", 0)
    monkeypatch.setattr(kernel_choice, "GLUON_ANY_MAX_SPECIAL_OPS", 10**6)
    variant = deep_variant(ir.DType.FP16, head_dim)
    model = lower.lower(variant)
    assert model.gluon_backward is (head_dim == 64)
    assert model.gluon_forward == ("any" if head_dim == 128 else None)
    module = build(variant)
    assert hasattr(module, "_gluon_backward") is (head_dim == 64)
    assert hasattr(module, "_gluon_forward") is (head_dim == 128)


# --------------------------------------------------------------------------- #
# The kernel expression IR: printer, builders, facts
# --------------------------------------------------------------------------- #


class _Tensor(np.ndarray):
    """numpy arrays with the one tensor method the element code calls."""

    def to(self, dtype):
        return self.astype(dtype)


_TL = types.SimpleNamespace(
    where=np.where,
    minimum=np.minimum,
    maximum=np.maximum,
    abs=np.abs,
    exp=np.exp,
    log=np.log,
    sqrt=np.sqrt,
    math=types.SimpleNamespace(exp2=np.exp2),
    int64=np.int64,
    float32=np.float64,
)


@settings(max_examples=200, deadline=None)
@given(mask=masks(), score=scores(), rects=st.lists(rectangles(), min_size=1, max_size=4))
def test_printed_code_computes_what_the_trees_do(mask, score, rects):
    """The one check of the printer: the Triton source of the tile code, the
    bounds and the element code (mask, score, derivative), executed with
    numpy as `tl`, gives the values the trees evaluate to, name by name (the
    parse tree of the text is the tree)."""
    nnf = nnf_of(mask)
    tiles = lower.TileCode()
    must, may = tiles.truth(nnf)
    bounds = [*lower.key_bounds(nnf), *lower.query_bounds(nnf)]
    for var in ("k", "q"):
        for interval in lower.interiors(nnf, var) or ():
            bounds += interval
    results = [must, may, *(b for b in bounds if b is not None)]
    code = lower.score_code(score, lower.ElementCode(lower.keys_before_queries(nnf)))
    elements = [
        lower.ElementCode().expr(nnf),
        *(e for e in (code.log2, code.grad) if e is not None),
    ]
    offset = N_KEYS - N_QUERIES
    rng = np.random.default_rng(len(rects))
    for qa, qb, ka, kb, head, num_heads in rects:
        names = _namespace(qa + offset, qb + offset, ka, kb, head, num_heads)
        trees = kx.run(tiles.lines, dict(names))
        printed = {
            **names,
            "tl": _TL,
            "_tanh": np.tanh,
            "_log": np.log,
            "_floor_div": np.floor_divide,
            "_floor_mod": np.mod,
        }
        for line in tiles.lines:
            exec(kx.stmt_source(line), printed)  # test-only: the printer's own output
        for stmt in tiles.lines:
            if isinstance(stmt, kx.Assign):
                assert printed[stmt.name] == trees[stmt.name], kx.stmt_source(stmt)
        for e in results:
            source = kx.to_source(e)
            assert eval(source, printed) == kx.evaluate(e, trees), source  # test-only
        tile = {
            "q_pos": np.arange(qa, qb + 1)[:, None] + offset,
            "k_pos": np.arange(ka, kb + 1)[None, :],
            "head": np.full((1, 1), head),
            "num_heads": np.full((1, 1), num_heads),
            "s": rng.uniform(-50, 50, (qb - qa + 1, kb - ka + 1)),
            "s2": rng.uniform(-50, 50, (qb - qa + 1, kb - ka + 1)),
            "alibi_slope": rng.uniform(0, 1),
        }
        tile = {k: v.view(_Tensor) if isinstance(v, np.ndarray) else v for k, v in tile.items()}
        with np.errstate(all="ignore"):
            # The score's shared calls, printed and run, then as trees.
            namespace, values = {**printed, **tile}, dict(tile)
            for line in (*code.lines, *code.grad_lines):
                exec(kx.stmt_source(line), namespace)  # test-only: the printer's own output
                kx.run([line], values)
                np.testing.assert_array_equal(namespace[line.name], values[line.name])
            for e in elements:
                source = kx.to_source(e)
                got = eval(source, namespace)  # test-only
                np.testing.assert_array_equal(got, kx.evaluate(e, values), err_msg=source)


def test_printer_parenthesises_by_precedence():
    q, k, one = kx.Var("q_hi"), kx.Var("k_lo"), kx.Int(1)
    assert kx.to_source(kx.sub(q, kx.sub(k, one))) == "q_hi - (k_lo - 1)"
    assert kx.to_source(kx.sub(kx.sub(q, k), one)) == "q_hi - k_lo - 1"
    assert kx.to_source(kx.mul(kx.add(q, one), kx.Int(3))) == "(q_hi + 1) * 3"
    assert kx.to_source(kx.Neg(kx.FAR)) == "-(1 << 30)"
    assert kx.to_source(kx.FloorDiv(kx.Neg(q), 8)) == "(-q_hi >> 3)"
    assert kx.to_source(kx.FloorDiv(kx.add(q, one), 8)) == "((q_hi + 1) >> 3)"
    assert kx.to_source(kx.FloorMod(q, 6)) == "_floor_mod(q_hi, 6)"
    assert kx.to_source(kx.Cast(kx.add(q, one), "tl.int64")) == "(q_hi + 1).to(tl.int64)"
    # a + (x - 3) is built as (a + x) - 3, the way Python reads `a + x - 3`.
    summed = kx.add(k, kx.sub(q, kx.Int(3)))
    assert summed == kx.sub(kx.add(k, q), kx.Int(3))
    assert kx.to_source(summed) == "k_lo + q_hi - 3"


def test_real_division_and_calls():
    """`/` binds like `*`: the printer brackets a product divisor, and the
    evaluator divides; `calls` finds the module's tanh."""
    s, x = kx.Var("s"), kx.Var("x")
    product = kx.mul(kx.Float(5.0), kx.Call(kx.TANH, (s,)))
    assert kx.to_source(kx.Arith("/", kx.Float(2.0), product)) == "2.0 / (5.0 * _tanh(s))"
    assert kx.to_source(kx.Arith("/", product, kx.Float(2.0))) == "5.0 * _tanh(s) / 2.0"
    assert kx.to_source(kx.Arith("/", s, kx.Arith("/", x, s))) == "s / (x / s)"
    assert kx.to_source(kx.Arith("-", kx.Float(1.0), kx.Arith("/", s, x))) == "1.0 - s / x"
    quotient = kx.Arith("/", kx.Float(2.0), product)
    assert kx.evaluate(quotient, {"s": 0.5}) == 2.0 / (5.0 * np.tanh(0.5))
    assert kx.evaluate(kx.Arith("/", s, x), {"s": 3.0, "x": 4.0}) == 0.75
    assert kx.calls([None, kx.Assign("y", quotient)], kx.TANH)
    assert not kx.calls([kx.Call("tl.exp", (s,))], kx.TANH)


@pytest.mark.parametrize("score", ["2.0 / softcap(s, 5.0)", "s * softcap(s, 5.0)"])
def test_softcap_as_a_right_operand(score):
    """softcap(x, c) is c * tanh(x / c): as a divisor it needs brackets (the
    text translation printed `2.0 / 5.0 * _tanh(...)`, which is 0.4 * tanh)."""
    from flashgen.reference import scores as reference_scores

    variant = make_variant("full", score=score)
    code = lower.score_code(variant.score, lower.ElementCode())
    s = np.linspace(-40.0, 40.0, 81)
    q = torch.from_numpy(s).reshape(1, 1, 81, 1)
    raw = ir.Variant("raw", 1, variant.dtype, scale=1.0)
    k = torch.ones(1, 1, 1, 1, dtype=torch.float64)
    expected = reference_scores(dataclasses.replace(variant, head_dim=1, scale=1.0), q, k)
    assert torch.equal(reference_scores(raw, q, k)[0, 0, :, 0], torch.from_numpy(s))
    with np.errstate(divide="ignore"):  # 2 / softcap(0, 5) is inf, as in the reference
        got = kx.evaluate(code.log2, {"s": s}) / lower.LOG2E
    np.testing.assert_allclose(got, expected[0, 0, :, 0].numpy(), rtol=1e-12)
    assert "(5.0 * _tanh(" in lower.lower(variant).score_log2_code


def test_floor_helpers_only_where_called():
    """A mask that folds to `full` calls nothing, even if a chunk was in it."""
    model = lower.lower(make_variant("!(chunk(24) & causal) | full"))
    assert model.tiles.mask_is_full and model.mask_code == "True"
    assert not model.needs_floor_div


def test_truth_builders_fold_constants():
    x = kx.Cmp("<=", kx.Var("k_lo"), kx.Var("q_hi"))
    assert kx.and_(kx.TRUE, x) == x and kx.and_(x, kx.FALSE) == kx.FALSE
    assert kx.or_(x, kx.TRUE) == kx.TRUE and kx.or_(kx.FALSE, x) == x
    assert kx.not_(kx.TRUE) == kx.FALSE and kx.not_(x) == kx.Not(x)
    assert kx.combine(x, x, kx.Min) == x and kx.combine(None, x, kx.Max) == x


@pytest.mark.parametrize(
    "mask, score, helpers",
    [
        ("chunk(16)", None, False),  # a shift
        ("chunk(24)", None, True),  # the tile code's bounds divide by 24
        ("q % 8 == 0", None, False),
        ("q % 6 == 0", None, True),
        ("causal", "s + (q div 3)", True),  # element code
    ],
)
def test_floor_helpers_from_the_code(mask, score, helpers):
    """`needs_floor_div` comes from the trees (and the element code), and
    the printed module defines `_floor_div` exactly when it calls it."""
    model = lower.lower(make_variant(mask, score))
    assert model.needs_floor_div is helpers
    t = model.tiles
    printed = [*t.tile_lines, t.key_lo or "", t.key_hi or "", model.mask_code]
    printed += [model.score_log2_code, t.query_lo or "", t.query_hi or ""]
    printed += [t.key_interior_lo or "", t.key_interior_hi or ""]
    printed += [t.query_interior_lo or "", t.query_interior_hi or ""]
    assert any("_floor_" in code for code in printed) is helpers


@pytest.mark.parametrize(
    "score, uses_s",
    [("exp(-s)", True), ("s * s", True), ("2.0 * s", False), ("softcap(s, 30.0)", False)],
)
def test_score_grad_uses_s(score, uses_s):
    model = lower.lower(make_variant("causal", score))
    assert model.score_grad_uses_s is uses_s
    assert model.score_kind is lower.ScoreKind.GENERAL


@st.composite
def _real_trees(draw, depth: int = 4) -> kx.Expr:
    """Arbitrary real-valued code trees, built without the folding builders,
    so every nesting of operators the printer can meet occurs."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return draw(
            st.sampled_from([kx.Var("s"), kx.Var("x"), kx.Float(2.5), kx.Float(-0.5), kx.Int(3)])
        )
    sub = lambda: draw(_real_trees(depth - 1))  # noqa: E731
    kind = draw(st.integers(0, 6))
    if kind <= 2:
        return kx.Arith(draw(st.sampled_from(["+", "-", "*", "/"])), sub(), sub())
    if kind == 3:
        return kx.Neg(sub())
    if kind == 4:
        return kx.Call(draw(st.sampled_from(["tl.exp", kx.TANH])), (sub(),))
    if kind == 5:
        return draw(st.sampled_from([kx.Min, kx.Max]))(sub(), sub())
    return kx.Where(kx.Cmp(draw(st.sampled_from(["<", ">="])), sub(), sub()), sub(), sub())


@settings(max_examples=300, deadline=None)
@given(tree=_real_trees())
def test_printed_trees_parse_as_the_trees(tree):
    """Any tree, printed and read back by Python, computes what the tree
    does, operation for operation (a missing bracket changes the order)."""
    env = {"s": np.linspace(-3.0, 3.0, 7), "x": np.linspace(0.5, 2.0, 7)}
    namespace = {**env, "tl": _TL, "_tanh": np.tanh}
    outcomes = []
    for compute in (
        lambda: eval(kx.to_source(tree), namespace),  # test-only: the printer's own output
        lambda: kx.evaluate(tree, env),
    ):
        try:
            with np.errstate(all="ignore"):
                outcomes.append(compute())
        except ZeroDivisionError:  # a constant subtree dividing by 0 (Python floats)
            outcomes.append("ZeroDivisionError")
    got, want = outcomes
    if isinstance(want, str):
        assert got == want, kx.to_source(tree)
    else:
        np.testing.assert_array_equal(got, want, err_msg=kx.to_source(tree))


# --------------------------------------------------------------------------- #
# Visited tiles against a dense per-tile count (issue 23 item 1)
# --------------------------------------------------------------------------- #


@st.composite
def position_masks(draw, depth: int = 3, mod: int | None = None) -> str:
    """Masks of the fragment `tiles.visible_may` decides exactly: & and | of
    ranges of q, k and q - k (named, compared, through abs, min and max,
    unequal, or negated), and congruences of q - k with one modulus; as .attn text."""
    c = st.integers(-40, 240).map(str)
    mod = mod or draw(st.sampled_from((2, 3, 5, 16)))
    ranges = st.one_of(
        st.just("causal"),
        st.builds("window({}, {})".format, st.integers(0, 90), st.integers(0, 40)),
        st.builds("prefix({})".format, st.integers(0, 220)),
        st.builds("{} {} {}".format, st.sampled_from(("q", "k", "q - k", "k - q", "-q")),
                  st.sampled_from(("<", "<=", ">", ">=")), c),  # fmt: skip
        st.builds("abs(q - k) {} {}".format, st.sampled_from(("<", "<=", ">", ">=")), c),
        st.builds("{} != {}".format, st.sampled_from(("q", "k", "q - k", "k")), c),
        st.builds("{}(q, k) {} {}".format, st.sampled_from(("min", "max")),
                  st.sampled_from(("<", "<=", ">", ">=")), c),  # fmt: skip
    )
    atoms = st.one_of(
        ranges,
        ranges.map("!({})".format),
        st.builds("(q - k + {}) % {} == {}".format, st.integers(-9, 9), st.just(mod),
                  st.integers(0, mod - 1)),  # fmt: skip
    )
    if depth == 0:
        return draw(atoms)
    left, right = (draw(position_masks(depth - 1, mod)) for _ in "lr")
    return draw(st.sampled_from((draw(atoms), f"({left}) & ({right})", f"({left}) | ({right})")))


def _visited(mask: ir.Expr, n_queries: int, n_keys: int, block: int) -> tuple[int, int]:
    """(tiles the kernels visit: in the key bounds and maybe visible; tiles
    with a visible pair), over the query and key tiles of one head."""
    lines, must, may, bounds = _analyse(nnf_of(mask))
    dense = _visible(mask, n_queries, n_keys, 1)[0]
    offset = n_keys - n_queries
    visited = nonempty = 0
    for qa in range(0, n_queries, block):
        for ka in range(0, n_keys, block):
            qb, kb = min(qa + block, n_queries) - 1, min(ka + block, n_keys) - 1
            env = _namespace(qa + offset, qb + offset, ka, kb, 0, 1)
            _, maybe, lo, hi = _run(lines, must, may, bounds, env)
            in_bounds = (lo is None or kb >= lo) and (hi is None or ka <= hi)
            any_visible = bool(dense[qa : qb + 1, ka : kb + 1].any())
            assert any_visible <= (maybe and in_bounds), "a visible tile is skipped"
            visited += maybe and in_bounds
            nonempty += any_visible
    return visited, nonempty


@settings(max_examples=150, deadline=None)
@given(text=position_masks(), block=st.sampled_from((16, 37, 64)))
def test_visited_tiles_are_the_nonempty_tiles(text, block):
    # As many tiles as FlexAttention's BlockMask marks (it evaluates every
    # pair), at any tile size, Nq != Nk with bottom-right positions.
    visited, nonempty = _visited(_mask(text), N_QUERIES, N_KEYS, block)
    assert visited == nonempty, text


@settings(max_examples=200, deadline=None)
@given(mask=masks(), block=st.sampled_from((16, 37)))
def test_key_spans_hold_every_visible_key(mask, block):
    """`loop_bounds.key_spans` (decision 114): for a union, or an intersection
    with one, every key a query tile can see lies in one of the two spans,
    checked against the dense mask at every query tile and head."""
    nnf = nnf_of(mask)
    spans = loop_bounds.key_spans(nnf)
    if spans is None:
        return
    dense = _visible(mask, N_QUERIES, N_KEYS, 2)
    offset = N_KEYS - N_QUERIES
    for head in (0, 1):
        for qa in range(0, N_QUERIES, block):
            qb = min(qa + block, N_QUERIES) - 1
            env = _namespace(qa + offset, qb + offset, 0, 0, head, 2)
            inside = np.zeros(N_KEYS, dtype=bool)
            for lo, hi in spans:
                lo = 0 if lo is None else max(_value(lo, env), 0)
                hi = N_KEYS - 1 if hi is None else min(_value(hi, env), N_KEYS - 1)
                inside[lo : hi + 1] = True
            seen = dense[head, qa : qb + 1].any(0)
            assert not (seen & ~inside).any(), (print_expr(nnf), head, qa)


@pytest.mark.parametrize(
    "mask, spans",
    [
        ("causal & (k < 64 | k >= q - 256)", True),  # sink keys beside a window
        ("k < 20 | window(10)", True),
        ("causal | k >= q + 27", True),
        ("causal", False),  # one interior: no gap loop
        ("window(10)", False),
    ],
)
def test_the_loop_between_two_interiors_gets_the_key_spans(mask, spans):
    tiles = lower.lower(make_variant(mask, dtype=ir.DType.FP16)).tiles
    assert (tiles.key_spans is not None) == spans
    assert tiles.key_spans is None or tiles.key_interior2


@settings(max_examples=150, deadline=None)
@given(mask=masks())
def test_visited_tiles_of_any_mask_are_sound_and_near_exact(mask):
    # Every mask of the language: no visible tile skipped (asserted in
    # _visited), and no more tiles than `truth` alone would visit.
    nnf = nnf_of(mask)
    tiles = lower.TileCode()
    must, may = tiles.truth(nnf)
    exact = visible_may(tiles, nnf, may)
    for qa in range(0, N_QUERIES, 64):
        for ka in range(0, N_KEYS, 64):
            env = _namespace(qa - 60, qa + 3, ka, ka + 63, 0, 1)
            kx.run(tiles.lines, env)
            assert kx.evaluate(exact, env) <= kx.evaluate(may, env)
    _visited(mask, N_QUERIES, N_KEYS, 64)


@pytest.mark.parametrize(
    "spelled, plain",
    [
        ("max(q, k) > 37", "q > 37 | k > 37"),
        ("37 < max(k, q)", "k > 37 | q > 37"),
        ("max(q, k) <= 37", "q <= 37 & k <= 37"),
        ("min(q, k - 3) >= 5", "q >= 5 & k - 3 >= 5"),
        ("min(q, k) < 5", "q < 5 | k < 5"),
        ("max(max(q, 2), k) > 9", "q > 9 | 2 > 9 | k > 9"),
        ("max(q, k) == 5", "max(q, k) == 5"),  # not split
    ],
)
def test_comparisons_of_max_and_min_are_split(spelled, plain):
    # The same pairs (the kernel tests compare them with the reference), as
    # comparisons that give the loops bounds and an interior.
    assert nnf_of(_mask(spelled)) == nnf_of(_mask(plain))


@pytest.mark.parametrize(
    "text, side",
    [
        ("max(k, h) == 20 | causal", 1),
        ("!(max(k, h) != 20 & max(q, k) > 32 & !causal)", 1),  # rand3_12 (decision 099)
        ("min(k, 150) == 150 | k >= q + 40", 0),
        ("abs(k - 50) == 3 | causal", 1),
        ("max(k, q) == 100 & k > 7", 1),
    ],
)
def test_an_equality_of_max_min_or_abs_bounds_the_keys(text, side):
    """The negation normal form keeps `max(a, b) == c` whole (no exact
    split); its key bounds are those of `a <= c & b <= c` (min: >=), so a
    union with it keeps the other terms' bounds (decision 112: the Gluon
    kernels walk the bounds' span whole, and rand3_12 walked every key tile
    at 0.49x the Triton forward).  Sound at every tile (`_visited`), and the
    bound found is the last (first) visible key of each query tile."""
    mask = _mask(text)
    bounds = _analyse(mask)[3]
    assert bounds[side] is not None, text
    dense = _visible(mask, N_QUERIES, N_KEYS, 1)[0]
    offset = N_KEYS - N_QUERIES
    for qa in range(0, N_QUERIES, 16):
        qb = min(qa + 16, N_QUERIES) - 1
        keys = np.flatnonzero(dense[qa : qb + 1].any(0))
        if len(keys):
            found = _value(bounds[side], _namespace(qa + offset, qb + offset, 0, 0, 0, 1))
            edge = keys[-1] if side else keys[0]
            assert min(max(found, 0), N_KEYS - 1) == edge, (text, qa, found, edge)  # keys exist
    for block in (16, 37):
        _visited(mask, N_QUERIES, N_KEYS, block)


@pytest.mark.parametrize(
    "spelled, plain",
    [
        # Integer terms of one value in every call become that value.
        ("q % 1 != k", "0 < k"),
        ("(q + k) div 1 - k * 0 > h % 1", "(q + k) div 1 - 0 > 0"),
        # Comparisons the value ranges decide fold into full and !full.
        ("-abs(h) <= 5 & causal", "causal"),
        ("causal | k < 0", "causal"),
        ("causal | H >= 1", "full"),
        ("causal & abs(q) < 0", "!full"),
        ("!(k >= 0) | window(4)", "window(4)"),
        ("q % 1 != k & (!q div 16 == k div 16 | -abs(h) <= 5 | prefix(233))", "0 < k"),
        # Inequality of positions is a union of two comparisons.
        ("q != k", "q < k | q > k"),
        ("!(q == k + 3)", "q < k + 3 | q > k + 3"),
        ("k != 0", "k > 0"),
        # Not folded: the ranges do not decide them, or they do not bound positions.
        ("q < 0", "q < 0"),
        ("h != 2", "h != 2"),
        ("max(q, k) == 5", "max(q, k) == 5"),
        ("abs(q - k) % 3 >= 0 & causal", "causal"),
    ],
)
def test_masks_fold_by_value_ranges(spelled, plain):
    # Keys from 0, queries anywhere, heads from 0, H >= 1 (docs/LANGUAGE.md);
    # the kernel tests compare the folded masks with the reference.
    assert nnf_of(_mask(spelled)) == nnf_of(_mask(plain))


@pytest.mark.parametrize(
    "text, lo, hi",
    [
        ("q % 1", 0, 0),
        ("-abs(h)", -math.inf, 0),
        ("(k + 3) div 2", 1, math.inf),
        ("(q - k) % 5", 0, 4),
        ("min(k, 7) * -2", -14, 0),
        ("max(h, H) - 1", 0, math.inf),
        ("q * 0", 0, 0),
    ],
)
def test_integer_ranges(text, lo, hi):
    expr = _mask(f"{text} == 0").left
    assert mask_forms.int_range(expr) == (lo, hi)


def test_an_absorbed_term_that_reads_data_is_kept():
    # `x | full` is full, but a term that reads an input stays, so that the
    # kernels read every input the spec reads.
    source = "attention t { head_dim = 16; dtype = fp32; doc: int32[B, Nk]; mask = m }"
    from flashgen.parse import parse

    for text, kept in (("doc[b, k] == 0 | k >= 0", True), ("doc[b, k] == 0 & k >= 0", True)):
        spec, diags = parse(source.replace("mask = m", f"mask = {text}"))
        assert not diags
        (setting,) = [x for x in spec.blocks[0].settings if x.key == "mask"]
        nnf = nnf_of(setting.value)
        assert ir.reads_inputs(nnf) is kept
        assert lower.ElementCode().expr(nnf) != kx.FALSE


def test_a_mask_folded_to_full_key_bounds():
    """`q % 1 != k` (rand0_16 of the random bench): every key past the first,
    so the loops start at key 1 and every key tile past the first is interior."""
    tiles = lower.lower(make_variant("q % 1 != k & -abs(h) <= 5", dtype=ir.DType.FP16)).tiles
    assert tiles.key_lo is not None and tiles.key_interior_lo is not None
    unequal = lower.lower(make_variant("q != k", dtype=ir.DType.FP16)).tiles
    assert unequal.key_interior_hi is not None and unequal.key_interior2_lo is not None


def test_a_comparison_of_max_gets_an_interior():
    """`max(q, k) > 37`: every key past 37 is seen by every query, and a
    query tile past 37 sees every key."""
    tiles = lower.lower(make_variant("max(q, k) > 37", dtype=ir.DType.FP16)).tiles
    assert tiles.key_interior and tiles.key_interior_lo is not None


@pytest.mark.parametrize(
    "spelled, plain",
    [
        ("abs(q - k) < 65", "q - k < 65 & k - q < 65"),
        ("abs(k - q) <= 64", "k - q <= 64 & q - k <= 64"),
        ("65 > abs(q - k)", "q - k < 65 & k - q < 65"),
        ("causal & abs(q - k - 3) <= 10", "causal & q - k - 3 <= 10 & 3 + k - q <= 10"),
    ],
)
def test_bands_spelled_with_abs_get_the_bounds_of_their_comparisons(spelled, plain):
    # abs(A) < X is A < X & -A < X: a band, with a band's key range, interior
    # and no per-tile test, where it was once an open range walked whole.
    for text in (spelled, plain):
        lo, hi = _analyse(_mask(text))[3]
        assert lo is not None and hi is not None, text
    for block in (16, 37):
        assert _visited(_mask(spelled), N_QUERIES, N_KEYS, block) == _visited(
            _mask(plain), N_QUERIES, N_KEYS, block
        )
    nnf = lower.negation_normal_form(lower.desugar_mask(_mask(spelled)))
    assert mask_forms.edges_dense(nnf)


def test_abs_above_a_bound_is_a_union_and_keeps_its_pairs():
    # abs(A) > X is A > X | -A > X: the same pairs (the dense matrices agree),
    # and a query tile in the middle of the gap skips its middle tiles.
    for text in ("abs(q - k) > 40", "!(abs(q - k) <= 40)", "abs(q - k) >= 7 & causal"):
        nnf = lower.negation_normal_form(lower.desugar_mask(_mask(text)))
        assert "abs" not in repr(nnf)
        visited, nonempty = _visited(_mask(text), N_QUERIES, N_KEYS, 16)
        assert visited == nonempty, text


@pytest.mark.parametrize(
    "text, positional",
    [
        ("causal & doc[b, q] == doc[b, k]", "k <= q"),
        ("doc[b, q] == doc[b, k]", None),
        ("causal | k < prefix_len[b]", None),  # the data term may admit every pair
        ("causal & (window(8) | doc[b, q] != doc[b, k])", "k <= q"),
        ("causal & window(8)", "k <= q & k >= q - 8 & k <= q"),
    ],
)
def test_the_positional_part_takes_data_terms_as_true(text, positional):
    source = (
        "attention t { head_dim = 16; dtype = fp32; doc: int32[B, Nk]; prefix_len: int32[B]; "
        f"mask = {text} }}"
    )
    from flashgen.parse import parse

    spec, diags = parse(source)
    assert not diags
    (setting,) = [x for x in spec.blocks[0].settings if x.key == "mask"]
    nnf = lower.negation_normal_form(lower.desugar_mask(setting.value))
    part = mask_forms.positional_part(nnf)
    if positional is None:
        assert part is None
    else:
        expected = lower.negation_normal_form(lower.desugar_mask(_mask(positional)))
        assert part == expected, (part, expected)


@pytest.mark.parametrize(
    "text, merged",
    [
        ("causal & chunk(1024)", True),
        ("causal & window(100)", True),
        ("abs(q - k) < 65", True),
        ("causal", False),  # long rows: three loops
        ("full", False),
        ("causal & doc[b, q] == doc[b, k]", True),  # documents bound the rows
        ("causal | k < prefix_len[b]", False),  # a prefix does not
        # Rows bounded; an edge tile whose window pairs are fewer than the
        # period may hold no pair, and runs masked (`skip_tile_test`).
        ("window(100) & (q - k) % 3 == 0", True),
        # Rows bounded, and an edge tile may hold no pair: it runs masked too
        # (decision 076: rand0_22's backward ran 1.74x faster so).
        ("window(100) & (q - k) % 40 == 0", True),
        ("max(q, k) > 10 & (abs(q - k) < 5 | window(145)) & q div 2 == k div 2", True),
        # A hole of 600 keys in the band: the test skips 43% of the tiles there.
        ("window(1024) & (q - k > 700 | q - k < 100)", False),
    ],
)
def test_rows_known_short_take_one_loop(text, merged):
    inputs = "".join(
        decl for name, decl in (("doc", "doc: int32[B, Nk]; "), ("prefix_len", "prefix_len: int32[B]; "))
        if name in text
    )  # fmt: skip
    source = f"attention t {{ head_dim = 16; dtype = fp32; {inputs}mask = {text} }}"
    from flashgen.check import check
    from flashgen.parse import parse

    spec, _ = parse(source)
    variants, diags = check([spec])
    assert not diags, diags
    assert lower.lower(variants[0]).tiles.merged_edges is merged
    # One query tile of every head after another only where documents bound the
    # rows (decision 069: a per-example prefix's long rows ran slower so at d128),
    # in the forward and the backward (decision 070).
    model = lower.lower(variants[0])
    assert model.heads_first is model.bwd_heads_first is ("doc[" in text)


@pytest.mark.parametrize(
    "text, many",
    [
        ("max(q, k) > 10 & (abs(q - k) < 5 | window(145)) & q div 2 == k div 2", False),
        ("window(1024) & (q - k > 700 | q - k < 100)", True),  # a hole of 600 keys
        ("window(1000) & (q - k) % 300 < 40", True),
        ("chunk(1024) & (q - k) % 97 == 0", False),
        ("causal & (q - k) % 4 == 0", False),
        ("k < 100 | causal & (h % 2 == 0 | q - k < 30)", True),  # odd heads: a band and a prefix
    ],
)
def test_skipped_share_counts_the_empty_tiles_inside_the_bounds(text, many):
    # loop_bounds.skipped_share (decision 076) against a dense count of the
    # same sample tiles: key tiles inside the bounds that hold no visible pair.
    from flashgen import loop_bounds

    nnf = nnf_of(_mask(text))
    tiles = lower.TileCode()
    _, may = tiles.truth(nnf)
    may = visible_may(tiles, nnf, may)
    bounds = lower.key_bounds(nnf)
    got = loop_bounds.skipped_share(tiles.lines, may, bounds)
    n, block = 4096, 64
    dense = _visible(_mask(text), n, n, 2)
    inside = empty = 0
    for q_lo in range(0, n, 8 * block):
        for head in (0, 1):
            env = _namespace(q_lo, q_lo + block - 1, 0, 0, head, 2)
            lo, hi = (_value(b, env) for b in bounds)
            lo, hi = max(0, lo or 0), min(n - 1, n - 1 if hi is None else hi)
            for k_lo in range(lo // block * block, hi + 1, block):
                inside += 1
                empty += not dense[head, q_lo : q_lo + block, k_lo : k_lo + block].any()
    assert got == pytest.approx(empty / inside)
    assert (got > kernel_choice.MERGED_MAX_SKIPPED) is many


@pytest.mark.parametrize(
    "mask, heads_seen",
    [
        ("h % 2 == 0", [True, False, True, False]),
        ("max(h, 1) > 2", [False, False, False, True]),
        ("!(h % 2 == 1 | h == 0)", [False, False, True, False]),
    ],
)
def test_a_comparison_of_heads_bounds_a_program_all_or_nothing(mask, heads_seen):
    """A mask term of heads alone (not affine: h % 2, max(h, 1)) holds for
    every tile of a program or for none.  The bounds say so: all keys and
    queries for a head that sees, an empty range for one that does not, and
    every key tile of a seeing head lies in the interior (a loop with no
    per-tile test, where the tile test would classify each tile)."""
    variant = make_variant(mask)
    nnf = nnf_of(variant.mask)
    key_lo, key_hi = lower.key_bounds(nnf)
    query_lo, query_hi = lower.query_bounds(nnf)
    interior = lower.interior_bounds(nnf, "k")
    assert interior is not None
    assert lower.lower(variant).tiles.key_interior
    for head, sees in enumerate(heads_seen):
        env = _namespace(10, 25, 30, 45, head, len(heads_seen))
        lo, hi = _value(key_lo, env), _value(key_hi, env)
        q_lo, q_hi = _value(query_lo, env), _value(query_hi, env)
        inner_lo, inner_hi = (_value(x, env) for x in interior)
        if sees:
            assert lo <= 0 and hi >= 10**6 and q_lo <= 0 and q_hi >= 10**6
            assert inner_lo <= 0 and inner_hi >= 10**6
        else:
            assert lo > hi and q_lo > q_hi and inner_lo > inner_hi


def test_a_mask_of_heads_alone_takes_the_unmasked_forward_tiles():
    """Its tiles are whole or empty, never cut: the forward's default launch
    configuration is the full mask's (the sweep's large tiles), not the
    masked one's."""
    from flashgen.launch import gpu_config

    def config(mask):
        return lower.lower(make_variant(mask, dtype=ir.DType.BF16, head_dim=128)).gpu_config

    assert config("h % 2 == 0") == config("full") == gpu_config(128, ir.DType.BF16, False)
    assert config("causal & h % 2 == 0") == gpu_config(128, ir.DType.BF16, True)


@pytest.mark.parametrize(
    "mask, score, head_dim, tiles",
    [
        ("!causal", "exp(-abs(s - 0.003 * abs(q - k)))", 128, (32, 64, 4, 3)),
        ("abs(q - k) < 22", "sqrt(abs(s))", 128, (32, 64, 4, 3)),  # few tiles a row
        ("causal", "log(1.0 + abs(s))", 96, (32, 64, 4, 3)),  # padded to 128
        ("!causal", "max(s - 0.004 * abs(q - k), -0.8)", 128, (64, 128, 8, 3)),
        ("chunk(55)", "max(s - 0.004 * abs(q - k), -0.8)", 128, (64, 64, 4, 2)),
        ("causal", "s", 128, (64, 128, 8, 3)),
        ("causal", "exp(-abs(s))", 64, (64, 64, 4, 3)),
    ],
)
def test_heavy_score_derivatives_take_small_backward_tiles_at_d128(mask, score, head_dim, tiles):
    """The Triton backward's tiles from the score (decision 097): a heavy
    derivative at the head dims padded to 128 takes the spill-free 32 x 64 x 4 x 3
    whatever its rows; a derivative that only reads positions, or the score s,
    keeps the mask's tiles; d64 keeps its own."""
    variant = make_variant(mask, score, dtype=ir.DType.BF16, head_dim=head_dim)
    heavy = kernel_choice.heavy_derivative(variant.score)
    assert heavy == (tiles == (32, 64, 4, 3)) or head_dim == 64 and heavy
    assert dataclasses.astuple(lower.lower(variant).gpu_bwd_config) == tiles


@st.composite
def _congruences(draw) -> ir.Expr:
    """`(a*q + b*k + c*h + d) % n == r` (or !=), n up to past MIN_BLOCK's reach."""
    n, b, num = ir.Name, ir.Binary, ir.Num
    terms = [
        b(ir.BinOp.MUL, num(draw(st.integers(-3, 3))), n(v)) for v in ("q", "k", "h")
    ]  # fmt: skip
    x = b(ir.BinOp.ADD, b(ir.BinOp.ADD, terms[0], terms[1]), terms[2])
    x = b(ir.BinOp.ADD, x, num(draw(st.integers(-5, 5))))
    period = draw(st.integers(1, 40))
    op = draw(st.sampled_from((ir.BinOp.EQ, ir.BinOp.NE)))
    return b(op, b(ir.BinOp.MOD, x, num(period)), num(draw(st.integers(-1, period))))


@st.composite
def _with_congruences(draw) -> ir.Expr:
    sub = masks(2) | _congruences()
    op = draw(st.sampled_from((ir.BinOp.AND, ir.BinOp.OR)))
    return ir.Binary(op, draw(_congruences() | sub), draw(sub))


def _full_tiles(n_rows: int, n_cols: int, block: int):
    """Every block x block tile, at every corner (a call's positions can put
    a kernel's tiles anywhere)."""
    for qa in range(0, n_rows - block + 1):
        for ka in range(0, n_cols - block + 1):
            yield qa, ka


@settings(max_examples=150, deadline=None)
@given(mask=_congruences() | _with_congruences(), heads=st.integers(1, 3))
def test_a_congruence_everywhere_holds_in_every_tile(mask, heads):
    # `skip_tile_test` runs every tile of such a mask without the emptiness
    # test: each full tile must hold a visible pair, at any corner and head.
    nnf = nnf_of(mask)
    if not mask_forms.congruence_everywhere(nnf):
        return
    block = mask_forms.MIN_BLOCK
    visible = _visible(mask, 80, 70, heads)
    for head in range(heads):
        for qa, ka in _full_tiles(80, 70, block):
            assert visible[head, qa : qa + block, ka : ka + block].any(), (head, qa, ka)


def test_congruences_that_miss_residues_are_not_everywhere():
    for text, everywhere in [
        ("(q - k) % 2 == 1", True),
        ("(q - k) % 31 == 30", True),  # 16 + 16 - 1 values of q - k
        ("(q - k) % 32 == 0", False),
        ("(2 * q - 2 * k) % 4 == 1", False),  # only even values
        ("(2 * q - 2 * k) % 4 != 1", True),
        ("(3 * q) % 5 == 4", True),
        ("h % 2 == 0", False),  # a whole head is empty
        ("q % 3 == 0 & k % 2 == 1", True),
        ("(q - k) % 3 == 0 & (q + k) % 3 == 1", False),  # not independent
        ("(q - k) % 3 == 5", False),  # never
        ("causal | (q - k) % 4 == 0", True),
        ("causal & (q - k) % 4 == 0", False),
    ]:
        nnf = nnf_of(_mask(text))
        assert mask_forms.congruence_everywhere(nnf) == everywhere, text
    assert mask_forms.skip_tile_test(nnf_of(_mask("causal & (q - k) % 4 == 0")))
    assert mask_forms.skip_tile_test(nnf_of(_mask("window(30) & (q - k) % 4 != 1")))
    assert not mask_forms.skip_tile_test(nnf_of(_mask("prefix(40) & (q - k) % 4 == 1")))
    assert not mask_forms.skip_tile_test(nnf_of(_mask("causal & (q - k) % 40 == 1")))


@settings(max_examples=100, deadline=None)
@given(dense=_diagonal_masks(), congruence=_congruences())
def test_a_dense_mask_and_a_congruence_leave_only_its_edge_tiles_empty(dense, congruence):
    # `skip_tile_test` of `dense & congruence`: a full tile inside the key
    # bounds that the dense side fills holds a visible pair; only the dense
    # side's edge tiles may be empty (and they run masked).
    mask = ir.Binary(ir.BinOp.AND, dense, congruence)
    nnf = nnf_of(mask)
    if not mask_forms.skip_tile_test(nnf) or mask_forms.congruence_everywhere(nnf):
        return
    block = mask_forms.MIN_BLOCK
    inner, both = _visible(dense, 80, 70, 1)[0], _visible(mask, 80, 70, 1)[0]
    for qa, ka in _full_tiles(80, 70, block):
        if inner[qa : qa + block, ka : ka + block].all():
            assert both[qa : qa + block, ka : ka + block].any(), (qa, ka)


def test_branchless_tiles_where_no_tile_is_whole_and_none_empty(monkeypatch):
    # Decisions 074 and 076: loops without an interior run every tile masked,
    # with no branch, where no tile is whole and none empty; in 16 bits.
    for text, never_fills in [
        ("causal & (q - k) % 4 == 0", True),  # some pair of every tile is off the period
        ("(q - k) % 32 == 0 & causal", True),
        ("(q - k) % 3 != 1", True),  # every tile reaches residue 1
        ("(2 * q - 2 * k) % 4 != 1", False),  # only even values: every pair visible
        ("(q - k) % 2 == 1 | !causal", False),  # above the diagonal tiles are whole
        ("causal", False),
    ]:
        assert mask_forms.never_fills_a_tile(nnf_of(_mask(text))) is never_fills, text
    for text, branchless in [
        ("causal & (q - k) % 4 == 0", True),
        ("(q - k) % 3 != 1", True),
        ("causal & (q - k) % 40 == 1", False),  # a tile may be empty: the test stays
        ("(q - k) % 2 == 1 | !causal", False),
    ]:
        for dtype in ir.DType:
            expected = branchless and dtype is not ir.DType.FP32  # fp32 spilled (decision 076)
            assert kernel_choice.branchless_tiles(nnf_of(_mask(text)), dtype) is expected, text
    monkeypatch.setattr(kernel_choice, "BRANCHLESS_TILES", False)
    assert not kernel_choice.branchless_tiles(
        nnf_of(_mask("causal & (q - k) % 4 == 0")), ir.DType.BF16
    )


def test_branchless_masks_take_the_triton_backward_at_head_dim_64():
    # Decision 076: at d64 the Triton backward without branches ran 1.20-1.24x
    # faster than the Gluon one for `causal & (q - k) % 4 == 0`; at d128 0.92x.
    from kernel_utils import make_variant

    for mask, head_dim, dtype, gluon in [
        ("causal & (q - k) % 4 == 0", 64, ir.DType.BF16, False),
        ("causal & (q - k) % 4 == 0", 64, ir.DType.FP16, False),
        ("causal & (q - k) % 4 == 0", 128, ir.DType.BF16, True),
        ("causal & (q - k) % 40 == 1", 64, ir.DType.BF16, True),  # keeps its tile test
        ("(q - k) % 2 == 1 | !causal", 64, ir.DType.BF16, True),
    ]:
        variant = make_variant(mask, dtype=dtype, head_dim=head_dim)
        assert kernel_choice.gluon_backward(variant) is gluon, (mask, head_dim, dtype)


@st.composite
def _unions_of_differences(draw) -> ir.Expr:
    """`k - q op c` joined by |: often two sides around a gap of about a
    tile's 31 values of k - q, with at most one more term."""
    n, b = ir.Name, ir.Binary
    d = b(ir.BinOp.SUB, n("k"), n("q"))
    ops = (ir.BinOp.LE, ir.BinOp.LT, ir.BinOp.GE, ir.BinOp.GT, ir.BinOp.EQ, ir.BinOp.NE)
    terms = []
    if draw(st.booleans()):
        edge, gap = draw(st.integers(-40, 40)), draw(st.integers(28, 34))
        terms += [b(ir.BinOp.LE, d, ir.Num(edge)), b(ir.BinOp.GE, d, ir.Num(edge + gap + 1))]
    for _ in range(draw(st.integers(0 if terms else 1, 1 if terms else 4))):
        terms.append(b(draw(st.sampled_from(ops)), d, ir.Num(draw(st.integers(-40, 40)))))
    mask = terms[0]
    for t in terms[1:]:
        mask = b(ir.BinOp.OR, mask, t)
    return mask


@settings(max_examples=200, deadline=None)
@given(mask=_unions_of_differences())
def test_narrow_gaps_leave_no_tile_empty(mask):
    # decision 074: a union of comparisons of k - q whose hidden runs are
    # shorter than a tile's 31 values of k - q has a pair in every full tile.
    if not mask_forms.narrow_gaps(nnf_of(mask)):
        return
    block = mask_forms.MIN_BLOCK
    visible = _visible(mask, 120, 100, 1)[0]
    for qa, ka in _full_tiles(120, 100, block):
        assert visible[qa : qa + block, ka : ka + block].any(), (qa, ka)


def test_narrow_gaps_cases():
    for text, narrow in [
        ("causal | k >= q + 27", True),
        ("causal | k >= q + 31", True),  # 30 hidden values
        ("causal | k >= q + 32", False),  # 31: a tile's whole span
        ("k - q != 5", True),
        ("causal", False),  # every key after its query hidden
        ("k <= q - 3 | k >= q + 20 | k == q", True),
        ("causal | prefix(40)", False),  # not differences alone
    ]:
        assert mask_forms.narrow_gaps(nnf_of(_mask(text))) is narrow, text


def test_narrow_gaps_drop_the_tile_test_only_when_switched_on(monkeypatch):
    # decision 074: off until measured; on, rand0_7's mask loses its tile test.
    variant = make_variant("causal | !(causal | abs(q - k) < 27)", align="bottom_right")
    assert lower.lower(variant).tiles.classify_edge_tiles
    monkeypatch.setattr(kernel_choice, "NARROW_GAPS", True)
    assert not lower.lower(variant).tiles.classify_edge_tiles


@pytest.mark.parametrize(
    "score, computed",
    [
        ("exp(-abs(s - 0.003 * abs(q - k)))", "tl.math.exp2"),
        ("tanh(s * 0.341)", "_tanh"),
        ("sqrt(abs(s + h * 0.034))", "tl.sqrt"),
    ],
)
def test_derivative_reads_the_score_back_from_s2(score, computed, monkeypatch):
    # Decision 077 (off until measured): the derivative of a score that is an
    # exp, tanh or sqrt call contains the score, which s2 holds already.
    from flashgen import element_code

    def grad_code(v):
        model = lower.lower(v)
        return "\n".join([*model.score_grad_lines, model.score_grad_code])

    variant = make_variant("causal", score, dtype=ir.DType.BF16, head_dim=64)
    assert computed in grad_code(variant)
    monkeypatch.setattr(element_code, "READ_BACK_SCORE", True)
    code = grad_code(variant)
    assert computed not in code and "s2 * 0.6931471824645996" in code, code
    # Scores of other forms keep their derivative as it was.
    other = make_variant("causal", "log(1.0 + abs(s))", dtype=ir.DType.BF16, head_dim=64)
    assert "s2" not in grad_code(other)


@settings(max_examples=200, deadline=None)
@given(mask=masks())
def test_a_shift_invariant_mask_is_the_same_from_any_origin(mask):
    """`shift_invariant` (decision 109): a mask it accepts hides the same
    pairs whether positions count from 0 or from a run's start: the mask of
    positions shifted by the call's offsets, both alike, is the mask."""
    variant = make_variant(print_expr(mask), dtype=ir.DType.FP32, head_dim=16, align="top_left")
    if not mask_forms.shift_invariant(mask_forms.desugar_mask(variant.mask)):
        return
    plain = mask_matrix(variant, 40, 40, 2)
    for shift in (1, 7, 129):
        assert torch.equal(mask_matrix(variant, 40, 40, 2, offsets=(shift, shift)), plain)


@pytest.mark.parametrize(
    "mask, score, positional",
    [
        ("causal & doc[b, q] == doc[b, k]", None, "causal"),
        ("doc[b, k] == doc[b, q]", None, "full"),
        ("doc[b, q] == doc[b, k] & window(300, 0) & h < 4", "s + alibi", "window(300, 0) & h < 4"),
        ("causal & doc[b, q] == doc[b, k]", "s - 0.01 * abs(q - k)", "causal"),
        ("(q - k) % 3 != 1 & doc[b, q] == doc[b, k]", None, "(q - k) % 3 != 1"),
        # positions from the row's start, not the document's
        ("prefix(16) & doc[b, q] == doc[b, k]", None, None),
        ("chunk(64) & doc[b, q] == doc[b, k]", None, None),
        ("causal & doc[b, q] == doc[b, k]", "s + 0.01 * q", None),
        # not a conjunct, or not one input read at [b, q] and [b, k]
        ("causal | doc[b, q] == doc[b, k]", None, None),
        ("causal & doc[b, q] == doc[b, q - 1]", None, None),
        ("causal & doc[b, q] == doc[b, k] & doc[b, k] >= 0", None, None),
    ],
)
def test_masks_over_packed_documents_carry_the_gluon_kernels_of_their_positional_part(
    mask, score, positional
):
    """Decision 109: `document_runs` finds P in `P & doc[b, q] == doc[b, k]`
    where P and the score read positions through q - k only, and the module
    carries P's plan with both Gluon kernels (d128, bf16) in place of its own
    (none for this mask at d128); the knob document_runs=off leaves it out."""
    variant = make_variant(
        mask, score, dtype=ir.DType.BF16, head_dim=128, declared="doc: int32[B, Nk]"
    )
    found = kernel_choice.document_runs(variant)
    expected = None
    if positional is not None:
        expected = make_variant(positional, score, dtype=ir.DType.BF16, head_dim=128).mask
    assert (found and found.mask) == expected
    model = lower.lower(variant, document_runs=True)
    if found is None or model.runs is None:
        assert model.runs is None
        return
    assert found.inputs == () and model.runs.element_args == ()
    assert model.runs.gluon_forward and model.runs.gluon_backward and model.runs.dense_runs
    assert model.runs.helper_prefix == "runs_" and model.helper_prefix == ""
    assert (model.gluon_forward, model.gluon_backward) == (None, False)
    assert lower.lower(variant, document_runs=False).runs is None
