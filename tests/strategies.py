"""Hypothesis strategies for checked IR: masks, scores and whole Variants.

Everything drawn here is what `check` would produce for some source text:
literals are non-negative (`-2.0` is `Unary(NEG, Num(2.0))`), named-mask
arguments, divisors and softcap caps are folded literals, and every Variant
survives print -> parse -> check unchanged (tests/test_roundtrip.py).

Numerically, scores stay finite and moderate (|value| of a few hundred at
most, usually far less) for |s| <= 50, positions in [-400, 400], h < 4 and
H <= 4, so reference and kernel comparisons are meaningful.  Integer mask
expressions multiply only by small constants and stay far inside int32.

Public: `int_exprs()`, `masks()`, `scores()`, `variants(dtypes, head_dims)`.
"""

from __future__ import annotations

import keyword

from hypothesis import strategies as st

from flashgen import ir
from flashgen.ir import BinOp, Call, Name, Num, Unary, UnaryOp

Q, K, S = Name("q"), Name("k"), Name("s")
H_INDEX, H_COUNT = Name("h"), Name("H")


def _bin(op: BinOp, left: ir.Expr, right: ir.Expr) -> ir.Binary:
    return ir.Binary(op, left, right)


def _neg(e: ir.Expr) -> ir.Unary:
    return Unary(UnaryOp.NEG, e)


def _q_minus_k() -> ir.Expr:
    return _bin(BinOp.SUB, Q, K)


# Reals with short, exact reprs: k / 1000.
def _reals(low: int, high: int) -> st.SearchStrategy[float]:
    """Reals in [low/1000, high/1000] on a 0.001 grid."""
    return st.integers(low, high).map(lambda i: i / 1000)


# --------------------------------------------------------------------------- #
# Integer expressions and masks
# --------------------------------------------------------------------------- #


@st.composite
def int_exprs(draw, depth: int = 2) -> ir.Expr:
    """Small integer expressions over q, k, h, H: + -, * div % by constants, abs/min/max."""
    leaf = st.sampled_from([Q, K, H_INDEX, H_COUNT]) | st.integers(0, 20).map(Num)
    if depth == 0 or draw(st.booleans()):
        return draw(leaf)
    sub = int_exprs(depth - 1)
    choice = draw(st.integers(0, 5))
    if choice == 0:
        return _bin(draw(st.sampled_from([BinOp.ADD, BinOp.SUB])), draw(sub), draw(sub))
    if choice == 1:
        # Multiplying only by constants keeps values far inside int32.
        return _bin(BinOp.MUL, draw(sub), Num(draw(st.integers(1, 8))))
    if choice == 2:
        op = draw(st.sampled_from([BinOp.FLOORDIV, BinOp.MOD]))
        return _bin(op, draw(sub), Num(draw(st.integers(1, 9))))
    if choice == 3:
        return Call("abs", (draw(sub),))
    if choice == 4:
        return Call(draw(st.sampled_from(["min", "max"])), (draw(sub), draw(sub)))
    return _neg(draw(sub))


@st.composite
def _comparisons(draw) -> ir.Expr:
    """Comparisons in the shapes real masks use, plus random ones."""
    choice = draw(st.integers(0, 6))
    if choice == 0:  # (q - k) % m == r
        m = draw(st.integers(2, 5))
        return _bin(
            BinOp.EQ,
            _bin(BinOp.MOD, _q_minus_k(), Num(m)),
            Num(draw(st.integers(0, m - 1))),
        )
    if choice == 1:  # k <= q + d
        return _bin(BinOp.LE, K, _bin(BinOp.ADD, Q, Num(draw(st.integers(0, 20)))))
    if choice == 2:  # h % 2 == 0
        return _bin(BinOp.EQ, _bin(BinOp.MOD, H_INDEX, Num(2)), Num(0))
    if choice == 3:  # q div m == k div m
        m = Num(draw(st.integers(1, 16)))
        return _bin(BinOp.EQ, _bin(BinOp.FLOORDIV, Q, m), _bin(BinOp.FLOORDIV, K, m))
    if choice == 4:  # abs(q - k) < w
        return _bin(BinOp.LT, Call("abs", (_q_minus_k(),)), Num(draw(st.integers(1, 50))))
    if choice == 5:  # max(q, k) > t
        return _bin(BinOp.GT, Call("max", (Q, K)), Num(draw(st.integers(0, 50))))
    op = draw(st.sampled_from(sorted(ir.COMPARISONS, key=lambda o: o.value)))
    return _bin(op, draw(int_exprs()), draw(int_exprs()))


@st.composite
def _named_masks(draw) -> ir.Expr:
    choice = draw(st.integers(0, 4))
    if choice == 0:
        return Name(draw(st.sampled_from(["causal", "full"])))
    if choice == 1:
        size = st.integers(0, 300).map(Num)
        args = (draw(size),) if draw(st.booleans()) else (draw(size), draw(size))
        return Call("window", args)
    if choice == 2:
        return Call("prefix", (Num(draw(st.integers(0, 300))),))
    if choice == 3:
        return Call("chunk", (Num(draw(st.integers(1, 300))),))
    return Name("causal")


@st.composite
def masks(draw, depth: int = 3) -> ir.Expr:
    """Boolean trees (depth <= `depth`) of named masks and comparisons, with & | !."""
    leaf = _named_masks() | _comparisons()
    if depth == 0 or draw(st.integers(0, 2)) == 0:
        return draw(leaf)
    sub = masks(depth - 1)
    choice = draw(st.integers(0, 2))
    if choice == 0:
        return Unary(UnaryOp.NOT, draw(sub))
    return _bin(BinOp.AND if choice == 1 else BinOp.OR, draw(sub), draw(sub))


# --------------------------------------------------------------------------- #
# Scores
# --------------------------------------------------------------------------- #


@st.composite
def _score_bases(draw) -> ir.Expr:
    """A term in s that stays within about |s| + 200 (alibi) for |s| <= 50."""
    choice = draw(st.integers(0, 5))
    distance = Call("abs", (_q_minus_k(),))
    if choice == 0:
        return S
    if choice == 1:
        return _bin(BinOp.ADD, S, Name("alibi"))
    if choice == 2:
        return _bin(BinOp.MUL, S, Num(draw(_reals(100, 1000))))
    if choice == 3:  # s - c * abs(q - k): at most 8 off for |q - k| <= 800
        return _bin(BinOp.SUB, S, _bin(BinOp.MUL, Num(draw(_reals(1, 10))), distance))
    if choice == 4:
        return _bin(BinOp.ADD, S, _bin(BinOp.MUL, Num(draw(_reals(1, 100))), H_INDEX))
    # s / (1.0 + c * abs(q - k)): shrinks.
    denominator = _bin(BinOp.ADD, Num(1.0), _bin(BinOp.MUL, Num(draw(_reals(1, 10))), distance))
    return _bin(BinOp.DIV, S, denominator)


@st.composite
def _score_wrap(draw, x: ir.Expr) -> ir.Expr:
    """One magnitude-preserving (or -shrinking) function around `x`."""
    choice = draw(st.integers(0, 7))
    if choice == 0:
        return Call("softcap", (x, Num(float(draw(st.integers(1, 60))))))
    if choice == 1:
        return Call("tanh", (x,))
    if choice == 2:  # log(1.0 + abs(x))
        return Call("log", (_bin(BinOp.ADD, Num(1.0), Call("abs", (x,))),))
    if choice == 3:
        return Call("sqrt", (Call("abs", (x,)),))
    if choice == 4:  # exp(-abs(x)) <= 1
        return Call("exp", (_neg(Call("abs", (x,))),))
    if choice == 5:
        return Call("min", (x, Num(draw(_reals(0, 5000)))))
    if choice == 6:  # max(x, -c)
        return Call("max", (x, _neg(Num(draw(_reals(1, 5000))))))
    return _bin(BinOp.MUL, x, Num(draw(_reals(100, 1000))))


@st.composite
def scores(draw) -> ir.Expr:
    """Real score expressions in s, finite and moderate for moderate inputs."""
    score = draw(_score_bases())
    for _ in range(draw(st.integers(0, 2))):
        score = draw(_score_wrap(score))
    return score


# --------------------------------------------------------------------------- #
# Variants
# --------------------------------------------------------------------------- #

# Names the .attn lexer reserves, on top of Python's keywords.
_RESERVED = frozenset({"attention", "div"})

block_names = st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,20}", fullmatch=True).filter(
    lambda n: not keyword.iskeyword(n) and n not in _RESERVED
)


@st.composite
def variants(
    draw,
    dtypes: tuple[ir.DType, ...] = (ir.DType.FP32, ir.DType.FP16),
    head_dims: tuple[int, ...] = (16, 24, 32, 40, 64, 80),
) -> ir.Variant:
    """Valid checked Variants built directly as IR."""
    return ir.Variant(
        name=draw(block_names),
        head_dim=draw(st.sampled_from(head_dims)),
        dtype=draw(st.sampled_from(dtypes)),
        mask=draw(masks()),
        score=draw(scores()),
        scale=draw(st.none() | _reals(50, 2000)),
        align=draw(st.sampled_from(list(ir.Align))),
        rescale_threshold=draw(st.sampled_from([0.0, 4.0, 8.0])),
    )
