"""Independent checks of the dense reference (`flashgen.reference`).

Masks are compared with torch.tril or with explicit Python loops, attention
with torch's own scaled_dot_product_attention, slopes with numbers written out
by hand.  Variants are built directly from IR nodes, so these tests need
neither the parser nor the checker.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from flashgen import ir
from flashgen.reference import (
    alibi_slopes,
    attention_ref,
    mask_matrix,
    positions,
    scores,
)

BR = ir.Align.BOTTOM_RIGHT
TL = ir.Align.TOP_LEFT
NEG_INF = float("-inf")

# Shapes (Nq, Nk): equal, more queries than keys, fewer queries than keys.
SHAPES = [(1, 1), (5, 5), (7, 3), (3, 7), (1, 9), (9, 1), (17, 13), (13, 17)]


# --------------------------------------------------------------------------- #
# Helpers
# --------------------------------------------------------------------------- #


def num(x):
    return ir.Num(x)


def name(x):
    return ir.Name(x)


def call(fn, *args):
    return ir.Call(fn, tuple(args))


def bin_(op, a, b):
    return ir.Binary(op, a, b)


def variant(mask=ir.FULL, score=ir.IDENTITY_SCORE, *, head_dim=16, **kw):
    return ir.Variant(
        name="t", head_dim=head_dim, dtype=ir.DType.FP32, mask=mask, score=score, **kw
    )


def loop_mask(pred, nq, nk, num_heads, align):
    """Boolean (H, Nq, Nk) from a Python predicate pred(qpos, kpos, h, H)."""
    offset = nk - nq if align is BR else 0
    out = torch.zeros(num_heads, nq, nk, dtype=torch.bool)
    for h in range(num_heads):
        for i in range(nq):
            for j in range(nk):
                out[h, i, j] = bool(pred(i + offset, j, h, num_heads))
    return out


def rand_qkv(b, h, hkv, nq, nk, d, dtype=torch.float64, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, nq, d, generator=g, dtype=dtype)
    k = torch.randn(b, hkv, nk, d, generator=g, dtype=dtype)
    v = torch.randn(b, hkv, nk, d, generator=g, dtype=dtype)
    if grad:
        for t in (q, k, v):
            t.requires_grad_(True)
    return q, k, v


def masked_lse(s, visible):
    return torch.logsumexp(s.masked_fill(~visible, NEG_INF), dim=-1)


CAUSAL = name("causal")


# --------------------------------------------------------------------------- #
# Positions and masks
# --------------------------------------------------------------------------- #


def test_positions_bottom_right_and_top_left():
    q, k = positions(2, 4, BR)
    assert q.tolist() == [2, 3] and k.tolist() == [0, 1, 2, 3]
    assert q.dtype == k.dtype == torch.int64
    q, _ = positions(2, 4, TL)
    assert q.tolist() == [0, 1]
    q, _ = positions(4, 2, BR)
    assert q.tolist() == [-2, -1, 0, 1]


@pytest.mark.parametrize("nq,nk", SHAPES)
def test_causal_matches_tril(nq, nk):
    ones = torch.ones(nq, nk, dtype=torch.bool)
    br = mask_matrix(variant(CAUSAL), nq, nk, 3)
    tl = mask_matrix(variant(CAUSAL, align=TL), nq, nk, 3)
    assert br.shape == tl.shape == (3, nq, nk) and br.dtype == torch.bool
    assert torch.equal(br, ones.tril(nk - nq).expand(3, nq, nk))
    assert torch.equal(tl, ones.tril(0).expand(3, nq, nk))


def test_bottom_right_leaves_first_rows_fully_masked_when_nq_exceeds_nk():
    m = mask_matrix(variant(CAUSAL), 7, 3, 1)[0]
    assert m.any(-1).tolist() == [False] * 4 + [True] * 3
    # Top-left never does: key 0 is visible from every row.
    assert mask_matrix(variant(CAUSAL, align=TL), 7, 3, 1)[0].any(-1).all()


def test_full_mask_is_all_true():
    assert mask_matrix(variant(), 4, 6, 2).all()


MASK_CASES = [
    (call("window", num(2)), lambda q, k, h, H: q - 2 <= k <= q),
    (call("window", num(0)), lambda q, k, h, H: k == q),
    (call("window", num(1), num(3)), lambda q, k, h, H: q - 1 <= k <= q + 3),
    (call("prefix", num(3)), lambda q, k, h, H: k < 3),
    (call("chunk", num(4)), lambda q, k, h, H: q // 4 == k // 4),
    (call("chunk", num(1)), lambda q, k, h, H: q == k),
    (
        bin_(ir.BinOp.OR, CAUSAL, call("prefix", num(2))),
        lambda q, k, h, H: k <= q or k < 2,
    ),
    (
        bin_(ir.BinOp.AND, CAUSAL, call("chunk", num(3))),
        lambda q, k, h, H: k <= q and q // 3 == k // 3,
    ),
    (
        # causal & (q - k) % 2 == 0
        bin_(
            ir.BinOp.AND,
            CAUSAL,
            bin_(
                ir.BinOp.EQ,
                bin_(ir.BinOp.MOD, bin_(ir.BinOp.SUB, name("q"), name("k")), num(2)),
                num(0),
            ),
        ),
        lambda q, k, h, H: k <= q and (q - k) % 2 == 0,
    ),
    (ir.Unary(ir.UnaryOp.NOT, CAUSAL), lambda q, k, h, H: not k <= q),
    (
        # per-head masks: k <= q + h, and heads in the lower half see everything
        bin_(
            ir.BinOp.OR,
            bin_(ir.BinOp.LE, name("k"), bin_(ir.BinOp.ADD, name("q"), name("h"))),
            bin_(ir.BinOp.LT, name("h"), bin_(ir.BinOp.FLOORDIV, name("H"), num(2))),
        ),
        lambda q, k, h, H: k <= q + h or h < H // 2,
    ),
    (
        # `/` is true division: q / 4 > 1 differs from q div 4 > 1 at q = 5..7
        bin_(ir.BinOp.GT, bin_(ir.BinOp.DIV, name("q"), num(4)), num(1)),
        lambda q, k, h, H: q / 4 > 1,
    ),
    (
        bin_(ir.BinOp.GT, bin_(ir.BinOp.FLOORDIV, name("q"), num(4)), num(1)),
        lambda q, k, h, H: q // 4 > 1,
    ),
    (
        bin_(
            ir.BinOp.LE,
            call("abs", bin_(ir.BinOp.SUB, name("q"), name("k"))),
            call("max", name("h"), num(1)),
        ),
        lambda q, k, h, H: abs(q - k) <= max(h, 1),
    ),
    (
        bin_(
            ir.BinOp.NE,
            call("min", name("q"), name("k")),
            ir.Unary(ir.UnaryOp.NEG, num(1)),
        ),
        lambda q, k, h, H: min(q, k) != -1,
    ),
]


@pytest.mark.parametrize("align", [BR, TL], ids=["br", "tl"])
@pytest.mark.parametrize("nq,nk", [(5, 5), (11, 4), (4, 11), (13, 13)])
@pytest.mark.parametrize("case", range(len(MASK_CASES)))
def test_masks_match_python_loops(case, nq, nk, align):
    expr, pred = MASK_CASES[case]
    got = mask_matrix(variant(expr, align=align), nq, nk, 4)
    assert torch.equal(got, loop_mask(pred, nq, nk, 4, align))


def test_floor_div_and_mod_on_negative_positions():
    # Nq = 10 > Nk = 3 under bottom-right: query positions -7 .. 2.
    q, k = name("q"), name("k")
    for c in (1, 2, 3, 5):
        mod = bin_(ir.BinOp.EQ, bin_(ir.BinOp.MOD, q, num(c)), bin_(ir.BinOp.MOD, k, num(c)))
        div = bin_(ir.BinOp.LT, bin_(ir.BinOp.FLOORDIV, q, num(c)), k)
        chunk = call("chunk", num(c))
        assert torch.equal(
            mask_matrix(variant(mod), 10, 3, 1),
            loop_mask(lambda a, b, h, H: a % c == b % c, 10, 3, 1, BR),
        )
        assert torch.equal(
            mask_matrix(variant(div), 10, 3, 1),
            loop_mask(lambda a, b, h, H: a // c < b, 10, 3, 1, BR),
        )
        assert torch.equal(
            mask_matrix(variant(chunk), 10, 3, 1),
            loop_mask(lambda a, b, h, H: a // c == b // c, 10, 3, 1, BR),
        )
    # Spelled out: -7 div 3 = -3 and -7 % 3 = 2 (floor semantics, not C's -2 and -1).
    first_row = lambda e: mask_matrix(variant(e), 10, 3, 1)[0, 0, 0].item()  # noqa: E731
    assert first_row(bin_(ir.BinOp.EQ, bin_(ir.BinOp.FLOORDIV, q, num(3)), num(-3)))
    assert first_row(bin_(ir.BinOp.EQ, bin_(ir.BinOp.MOD, q, num(3)), num(2)))


def test_bad_expressions_raise_value_error():
    bad = [
        name("nope"),
        call("nope", num(1)),
        call("window"),
        call("window", num(1), num(2), num(3)),
        bin_(ir.BinOp.ADD, name("q"), name("k")),  # not boolean
        bin_(ir.BinOp.AND, name("q"), CAUSAL),  # & on an integer
        bin_(ir.BinOp.ADD, CAUSAL, num(1)),  # arithmetic on a boolean
        name("s"),  # s does not exist in a mask
        ir.Num("7"),
        "causal",
    ]
    for expr in bad:
        with pytest.raises(ValueError):
            mask_matrix(variant(expr), 3, 3, 1)
    q, k, _ = rand_qkv(1, 1, 1, 2, 2, 16)
    with pytest.raises(ValueError):
        scores(variant(score=CAUSAL), q, k)
    with pytest.raises(ValueError):
        scores(variant(score=call("softcap", name("s"))), q, k)


# --------------------------------------------------------------------------- #
# ALiBi
# --------------------------------------------------------------------------- #


def test_alibi_slopes_power_of_two_are_the_paper_values():
    s = alibi_slopes(8)
    assert s.dtype == torch.float64
    assert s.tolist() == [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256]
    assert alibi_slopes(16).tolist() == pytest.approx([2 ** (-(i + 1) / 2) for i in range(16)])
    assert alibi_slopes(1).tolist() == [1 / 256]


def test_alibi_slopes_non_power_of_two_by_hand():
    # H = 12: n = 8 gives 2^-1 .. 2^-8; then the 16-head rule 2^(-(i+1)/2) at
    # i = 0, 2, 4, 6: 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.
    expected = [
        0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625,
        0.7071067811865476, 0.35355339059327373, 0.17677669529663687, 0.08838834764831843,
    ]  # fmt: skip
    assert alibi_slopes(12).tolist() == pytest.approx(expected, rel=1e-15)
    # H = 6: n = 4 gives 2^-2, 2^-4, 2^-6, 2^-8; then the 8-head rule at i = 0, 2.
    assert alibi_slopes(6).tolist() == pytest.approx([1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8])
    with pytest.raises(ValueError):
        alibi_slopes(0)


@pytest.mark.parametrize("align", [BR, TL], ids=["br", "tl"])
def test_alibi_score_is_minus_slope_times_distance(align):
    nq, nk, heads = 5, 8, 12
    q, k, _ = rand_qkv(2, heads, 4, nq, nk, 16)
    plain = scores(variant(align=align), q, k)
    got = scores(variant(score=bin_(ir.BinOp.ADD, name("s"), name("alibi")), align=align), q, k)
    slopes = alibi_slopes(heads)
    offset = nk - nq if align is BR else 0
    want = plain.clone()
    for h in range(heads):
        for i in range(nq):
            for j in range(nk):
                want[:, h, i, j] -= slopes[h] * abs(i + offset - j)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


# --------------------------------------------------------------------------- #
# Scores
# --------------------------------------------------------------------------- #


def test_scores_scale_default_variant_and_override():
    q, k, _ = rand_qkv(2, 3, 3, 4, 6, 16)
    raw = q @ k.transpose(-2, -1)
    assert scores(variant(), q, k).dtype == torch.float64
    torch.testing.assert_close(scores(variant(), q, k), raw / 4.0)
    torch.testing.assert_close(scores(variant(scale=0.1), q, k), raw * 0.1)
    torch.testing.assert_close(scores(variant(scale=0.1), q, k, scale=2.0), raw * 2.0)


def test_softcap_matches_formula():
    q, k, _ = rand_qkv(1, 2, 2, 5, 5, 16)
    q = q * 10  # push scores into tanh's saturating range
    plain = scores(variant(), q, k)
    capped = scores(variant(score=call("softcap", name("s"), num(5.0))), q, k)
    torch.testing.assert_close(capped, 5.0 * torch.tanh(plain / 5.0), rtol=0, atol=1e-14)
    assert capped.abs().max() < 5.0 < plain.abs().max()


def test_custom_score_with_int_and_real_mixing():
    # s - 0.05 * abs(q - k); also a constant score that ignores s broadcasts.
    q, k, _ = rand_qkv(1, 2, 1, 3, 6, 16)
    dist = call("abs", bin_(ir.BinOp.SUB, name("q"), name("k")))
    expr = bin_(ir.BinOp.SUB, name("s"), bin_(ir.BinOp.MUL, num(0.05), dist))
    qp, kp = positions(3, 6, BR)
    d = (qp[:, None] - kp[None, :]).abs().double()
    torch.testing.assert_close(
        scores(variant(score=expr), q, k), scores(variant(), q, k) - 0.05 * d
    )
    const = scores(variant(score=bin_(ir.BinOp.DIV, dist, num(2))), q, k)
    assert const.shape == (1, 2, 3, 6)
    torch.testing.assert_close(const, (d / 2).expand(1, 2, 3, 6))
    exp_log = call("log", call("exp", call("sqrt", bin_(ir.BinOp.MUL, name("s"), name("s")))))
    torch.testing.assert_close(scores(variant(score=exp_log), q, k), scores(variant(), q, k).abs())
    torch.testing.assert_close(
        scores(variant(score=call("tanh", name("s"))), q, k),
        torch.tanh(scores(variant(), q, k)),
    )


def test_head_dim_mismatch_raises():
    q, k, v = rand_qkv(1, 1, 1, 2, 2, 8)
    with pytest.raises(ValueError):
        attention_ref(variant(), q, k, v)


# --------------------------------------------------------------------------- #
# Attention against torch's SDPA
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("nq,nk", [(1, 1), (5, 5), (7, 3), (3, 7), (17, 33)])
def test_full_attention_matches_sdpa(nq, nk):
    q, k, v = rand_qkv(2, 3, 3, nq, nk, 32)
    o, lse = attention_ref(variant(head_dim=32), q, k, v)
    assert o.dtype == lse.dtype == torch.float64
    assert o.shape == (2, 3, nq, 32) and lse.shape == (2, 3, nq)
    torch.testing.assert_close(o, F.scaled_dot_product_attention(q, k, v))
    s = q @ k.transpose(-2, -1) / math.sqrt(32)
    torch.testing.assert_close(lse, torch.logsumexp(s, dim=-1))


@pytest.mark.parametrize("nq,nk", [(5, 5), (7, 3), (3, 7), (13, 29)])
def test_top_left_causal_matches_sdpa_is_causal(nq, nk):
    q, k, v = rand_qkv(2, 2, 2, nq, nk, 16)
    o, _ = attention_ref(variant(CAUSAL, align=TL), q, k, v)
    torch.testing.assert_close(o, F.scaled_dot_product_attention(q, k, v, is_causal=True))


@pytest.mark.parametrize("nq,nk", [(5, 5), (3, 7), (1, 9), (13, 29)])
def test_bottom_right_causal_matches_sdpa_with_tril_mask(nq, nk):
    q, k, v = rand_qkv(1, 2, 2, nq, nk, 16)
    o, _ = attention_ref(variant(CAUSAL), q, k, v)
    tril = torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq)
    torch.testing.assert_close(o, F.scaled_dot_product_attention(q, k, v, attn_mask=tril))


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2), (6, 1)])
def test_gqa_and_mqa_match_repeated_kv(heads, kv_heads):
    q, k, v = rand_qkv(2, heads, kv_heads, 9, 11, 16)
    r = heads // kv_heads
    o, lse = attention_ref(variant(CAUSAL, align=TL), q, k, v, scale=0.3)
    k_r, v_r = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
    want = F.scaled_dot_product_attention(q, k_r, v_r, is_causal=True, scale=0.3)
    torch.testing.assert_close(o, want)
    # Also against the reference itself on the repeated tensors (plain MHA).
    o_mha, lse_mha = attention_ref(variant(CAUSAL, align=TL), q, k_r, v_r, scale=0.3)
    torch.testing.assert_close(o, o_mha, rtol=0, atol=0)
    torch.testing.assert_close(lse, lse_mha, rtol=0, atol=0)


def test_bad_shapes_raise_value_error():
    q, k, v = rand_qkv(1, 6, 4, 3, 3, 16)
    with pytest.raises(ValueError):
        attention_ref(variant(), q, k, v)  # 4 kv heads do not divide 6
    q, k, v = rand_qkv(1, 4, 2, 3, 3, 16)
    with pytest.raises(ValueError):
        attention_ref(variant(), q, k, v[:, :, :2])


MIXED_VARIANTS = {
    "window": variant(call("window", num(2), num(1)), scale=0.7),
    "prefix_lm": variant(bin_(ir.BinOp.OR, CAUSAL, call("prefix", num(3)))),
    "chunk_softcap": variant(
        bin_(ir.BinOp.AND, CAUSAL, call("chunk", num(4))),
        call("softcap", name("s"), num(2.0)),
    ),
    "alibi_tl": variant(CAUSAL, bin_(ir.BinOp.ADD, name("s"), name("alibi")), align=TL),
}


@pytest.mark.parametrize("key", list(MIXED_VARIANTS))
@pytest.mark.parametrize("nq,nk", [(6, 6), (9, 4), (4, 9)])
def test_lse_and_output_equal_masked_softmax(key, nq, nk):
    var = MIXED_VARIANTS[key]
    q, k, v = rand_qkv(2, 4, 2, nq, nk, 16, seed=3)
    o, lse = attention_ref(var, q, k, v)
    s = scores(var, q, k)
    visible = mask_matrix(var, nq, nk, 4)
    torch.testing.assert_close(lse, masked_lse(s, visible))
    # Rows with visible keys: ordinary softmax of the masked scores.
    p = torch.softmax(s.masked_fill(~visible, NEG_INF), dim=-1)
    want = p @ v.repeat_interleave(2, dim=1)
    rows = visible.any(-1).expand_as(lse)
    torch.testing.assert_close(o[rows], want[rows])
    assert (o[~rows] == 0).all() and (lse[~rows] == NEG_INF).all()


# --------------------------------------------------------------------------- #
# Fully masked rows and gradients
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "mask,align,nq,nk",
    [
        (CAUSAL, BR, 7, 3),  # first 4 rows fully masked
        (call("prefix", num(0)), BR, 4, 5),  # every row fully masked
        (call("window", num(1)), TL, 4, 2),  # rows 3.. see nothing
    ],
)
def test_fully_masked_rows_zero_output_minus_inf_lse_zero_grads(mask, align, nq, nk):
    var = variant(mask, align=align)
    q, k, v = rand_qkv(2, 2, 1, nq, nk, 16, grad=True)
    o, lse = attention_ref(var, q, k, v)
    dead = ~mask_matrix(var, nq, nk, 2).any(-1).expand_as(lse)
    assert dead.any()
    assert not o.isnan().any() and not lse.isnan().any()
    assert (o[dead] == 0).all()
    assert (lse[dead] == NEG_INF).all() and lse[~dead].isfinite().all()
    # Upstream gradients on every output, including the dead rows' lse (which
    # feeds a -inf into a product would be a NaN source in a naive softmax).
    g = torch.Generator().manual_seed(1)
    do = torch.randn(o.shape, generator=g, dtype=o.dtype)
    dlse = torch.randn(lse.shape, generator=g, dtype=lse.dtype)
    torch.autograd.backward([o, lse], [do, dlse])
    for t in (q, k, v):
        assert t.grad is not None and not t.grad.isnan().any()
    assert (q.grad[dead] == 0).all()
    if dead.all():
        assert (k.grad == 0).all() and (v.grad == 0).all()


def test_gradcheck_with_partially_masked_rows():
    var = variant(
        bin_(ir.BinOp.AND, CAUSAL, call("window", num(2))),
        call("softcap", name("s"), num(3.0)),
    )
    q, k, v = rand_qkv(1, 2, 1, 5, 3, 16, grad=True)

    def f(q, k, v):
        o, lse = attention_ref(var, q, k, v)
        # Fully masked rows have lse = -inf with zero gradient; keep the finite part.
        return o, torch.where(lse.isfinite(), lse, torch.zeros_like(lse))

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_gradients_match_sdpa():
    q, k, v = rand_qkv(2, 4, 2, 6, 9, 16, grad=True)
    o, _ = attention_ref(variant(CAUSAL, align=TL), q, k, v)
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    q2, k2, v2 = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    o2 = F.scaled_dot_product_attention(
        q2,
        k2.repeat_interleave(2, dim=1),
        v2.repeat_interleave(2, dim=1),
        is_causal=True,
    )
    for got, want in zip(grads, torch.autograd.grad(o2, (q2, k2, v2), do)):
        torch.testing.assert_close(got, want)


# --------------------------------------------------------------------------- #
# Same-dtype ("ordinary") implementation
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "dtype,lse_dtype,tol",
    [
        (torch.float32, torch.float32, 1e-5),
        (torch.float16, torch.float32, 1e-2),
        (torch.bfloat16, torch.float32, 5e-2),
    ],
)
def test_low_precision_dtypes(dtype, lse_dtype, tol):
    var = variant(
        bin_(ir.BinOp.AND, CAUSAL, call("window", num(5))),
        bin_(ir.BinOp.ADD, name("s"), name("alibi")),
    )
    q, k, v = rand_qkv(1, 4, 2, 12, 8, 16)
    o64, lse64 = attention_ref(var, q, k, v)
    qd, kd, vd = (t.to(dtype) for t in (q, k, v))
    o, lse = attention_ref(var, qd, kd, vd, dtype=dtype)
    assert o.dtype == dtype and lse.dtype == lse_dtype
    torch.testing.assert_close(o.double(), o64, rtol=0, atol=tol)
    dead = lse64 == NEG_INF
    assert dead.any() and (lse[dead] == NEG_INF).all() and (o[dead.expand_as(lse)] == 0).all()
    torch.testing.assert_close(lse[~dead].double(), lse64[~dead], rtol=0, atol=tol)


def test_low_precision_is_differentiable():
    q, k, v = rand_qkv(1, 2, 2, 6, 3, 16, dtype=torch.float16, grad=True)
    o, lse = attention_ref(variant(CAUSAL), q, k, v, dtype=torch.float16)
    (o.float().sum() + lse[lse.isfinite()].sum()).backward()
    for t in (q, k, v):
        assert t.grad.dtype == torch.float16 and not t.grad.isnan().any()


# --------------------------------------------------------------------------- #
# Property: windows and chunks against loops for drawn sizes
# --------------------------------------------------------------------------- #


@settings(max_examples=60, deadline=None)
@given(
    nq=st.integers(1, 12),
    nk=st.integers(1, 12),
    left=st.integers(0, 6),
    right=st.integers(0, 6),
    c=st.integers(1, 5),
    top_left=st.booleans(),
)
def test_window_and_chunk_property(nq, nk, left, right, c, top_left):
    align = TL if top_left else BR
    win = mask_matrix(variant(call("window", num(left), num(right)), align=align), nq, nk, 1)
    assert torch.equal(
        win, loop_mask(lambda q, k, h, H: q - left <= k <= q + right, nq, nk, 1, align)
    )
    chk = mask_matrix(variant(call("chunk", num(c)), align=align), nq, nk, 1)
    assert torch.equal(chk, loop_mask(lambda q, k, h, H: q // c == k // c, nq, nk, 1, align))


# --------------------------------------------------------------------------- #
# Empty key sequences and row subsets
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("expr", [name("full"), CAUSAL])
def test_no_keys_gives_minus_inf_lse_and_zero_output(expr):
    """Nk = 0: every row is fully masked, so lse is -inf per row (shape
    (B, H, Nq), not (B, H, Nq, 0)) and o is zero, with zero gradients."""
    q, k, v = rand_qkv(2, 3, 1, 4, 0, 16, grad=True)
    o, lse = attention_ref(variant(expr), q, k, v)
    assert o.shape == (2, 3, 4, 16) and lse.shape == (2, 3, 4)
    assert torch.equal(o, torch.zeros_like(o))
    assert torch.equal(lse, torch.full((2, 3, 4), NEG_INF, dtype=torch.float64))
    o.sum().backward()
    assert torch.equal(q.grad, torch.zeros_like(q))


ROW_VARIANTS = {
    "window_br": variant(call("window", num(3), num(1))),
    "chunk_tl": variant(bin_(ir.BinOp.AND, CAUSAL, call("chunk", num(4))), align=TL),
    "prefix_alibi": variant(
        bin_(ir.BinOp.OR, CAUSAL, call("prefix", num(3))),
        bin_(ir.BinOp.ADD, name("s"), name("alibi")),
    ),
}


@pytest.mark.parametrize("key", list(ROW_VARIANTS))
@pytest.mark.parametrize("nq,nk", [(9, 9), (11, 5), (4, 13)])
def test_rows_select_the_same_rows_of_the_full_problem(key, nq, nk):
    """`rows` keeps each row at its position in the full problem: the
    result equals the full result's rows (an index that shifted positions,
    say to 0..len(rows)-1, would move the window, chunk and ALiBi terms)."""
    var = ROW_VARIANTS[key]
    q, k, v = rand_qkv(1, 2, 1, nq, nk, 16, seed=5)
    rows = [nq - 1, 0, nq // 2]
    o, lse = attention_ref(var, q, k, v)
    o_rows, lse_rows = attention_ref(var, q, k, v, rows=rows)
    assert o_rows.shape == (1, 2, 3, 16) and lse_rows.shape == (1, 2, 3)
    torch.testing.assert_close(o_rows, o[:, :, rows], rtol=0, atol=1e-14)
    torch.testing.assert_close(lse_rows, lse[:, :, rows], rtol=0, atol=1e-14)
    assert torch.equal(mask_matrix(var, nq, nk, 2, rows=rows), mask_matrix(var, nq, nk, 2)[:, rows])
    torch.testing.assert_close(scores(var, q, k, rows=rows), scores(var, q, k)[:, :, rows])


def test_row_gradients_are_those_of_a_loss_on_those_rows():
    var = ROW_VARIANTS["window_br"]
    q, k, v = rand_qkv(1, 2, 2, 7, 10, 16, seed=2, grad=True)
    rows = [1, 5]
    attention_ref(var, q, k, v, rows=rows)[0].sum().backward()
    got = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    attention_ref(var, q, k, v)[0][:, :, rows].sum().backward()
    for g, t in zip(got, (q, k, v)):
        torch.testing.assert_close(g, t.grad, rtol=0, atol=1e-13)
    assert torch.equal(got[0][:, :, [0, 2, 3, 4, 6]], torch.zeros(1, 2, 5, 16, dtype=torch.float64))


@pytest.mark.parametrize("rows", [[7], [-1], [[0, 1]], [0.5], [True]])
def test_bad_rows_raise_value_error(rows):
    q, k, v = rand_qkv(1, 1, 1, 7, 7, 16)
    with pytest.raises(ValueError, match="rows"):
        attention_ref(variant(), q, k, v, rows=rows)


def test_masked_pairs_with_an_infinite_score_derivative_leave_the_gradients_finite():
    """`s / (alibi + alibi)` divides by zero on the diagonal, which the mask
    hides: the gradient the mask sends there is zero, and must not come back
    as 0 * inf = NaN.  Rows that see nothing get zero gradients."""
    from flashgen.api import _check_specs

    (variant,) = _check_specs(
        [
            "attention t { head_dim = 16; dtype = fp32; mask = causal & q - k >= 1; "
            "score = s / (alibi + alibi) }"
        ]
    )
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    for x in (q, k, v):
        x.requires_grad_()
    o, lse = attention_ref(variant, q, k, v)
    (o.sum() + lse[torch.isfinite(lse)].sum()).backward()
    for x in (q, k, v):
        assert torch.isfinite(x.grad).all()
    assert (q.grad[:, :, 0] == 0).all()  # row 0 sees no key (k <= q - 1)
