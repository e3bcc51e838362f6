"""Hypothesis strategies for checked IR, and seeded draws from them.

Everything drawn here is what `check` would produce for some source text:
literals are non-negative (`-2.0` is `Unary(NEG, Num(2.0))`), named-mask
arguments, divisors and softcap caps are folded literals, and every Variant
survives print -> parse -> check unchanged (tests/test_roundtrip.py).

Numerically, scores stay finite and moderate (|value| of a few hundred at
most, usually far less) for |s| <= 50, positions in [-400, 400], h < 4 and
H <= 4, so reference and kernel comparisons are meaningful.  Integer mask
expressions multiply only by small constants and stay far inside int32.

The tests draw through `@given` (tests/strategies.py re-exports this module);
`flashgen bench --random` draws through `seeded_example`, which makes a value
a function of a key string alone (see there).  This module imports hypothesis,
a test extra: flashgen imports it only for `bench --random`.

Public: `int_exprs()`, `masks()`, `scores()`, `variants(dtypes, head_dims)`,
`block_names`, `seeded_example(strategy, key)`.
"""

from __future__ import annotations

import dataclasses
import keyword
import random
from typing import TypeVar

from hypothesis import strategies as st
from hypothesis.control import BuildContext
from hypothesis.internal.conjecture.data import ConjectureData
from hypothesis.internal.conjecture.providers import PrimitiveProvider

from flashgen import ir
from flashgen.ir import BinOp, Call, Name, Num, Unary, UnaryOp

T = TypeVar("T")

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
    names: st.SearchStrategy[str] = block_names,
    v_head_dims: tuple[int | None, ...] = (None,),
) -> ir.Variant:
    """Valid checked Variants built directly as IR.  `v_head_dims`: v's head
    dims to draw from (None: the head dim), drawn last and only where there
    is a choice, so that the other draws of a seed stay what they were."""
    variant = ir.Variant(
        name=draw(names),
        head_dim=draw(st.sampled_from(head_dims)),
        dtype=draw(st.sampled_from(dtypes)),
        mask=draw(masks()),
        score=draw(scores()),
        scale=draw(st.none() | _reals(50, 2000)),
        align=draw(st.sampled_from(list(ir.Align))),
        rescale_threshold=draw(st.sampled_from([0.0, 4.0, 8.0])),
    )
    if len(v_head_dims) > 1:
        variant = dataclasses.replace(variant, v_head_dim=draw(st.sampled_from(v_head_dims)))
    return variant


# --------------------------------------------------------------------------- #
# Seeded draws
# --------------------------------------------------------------------------- #


class _SeededChoices(PrimitiveProvider):
    """Hypothesis's primitive choices, made by one `random.Random` and nothing else.

    Hypothesis's own provider mixes in constants that it collects from the
    modules loaded at the time (those outside site-packages: an editable
    install's, a test run's), so its draws under a fixed seed still depend on
    the installation and on what the process imported.  This one answers a
    bounded integer uniformly (after the strategy's own weights for values
    near the bounds, as Hypothesis does) and a boolean with its probability,
    from `Random.random()` alone: Python guarantees that sequence for a given
    seed across versions and platforms.  The strategies here, but for
    `block_names`, draw nothing else.
    """

    lifetime = "test_case"

    def __init__(self, conjecturedata, /, *, rng: random.Random) -> None:
        super().__init__(conjecturedata)
        self._rng = rng

    def draw_boolean(self, p: float = 0.5) -> bool:
        return self._rng.random() < p

    def draw_integer(
        self,
        min_value: int | None = None,
        max_value: int | None = None,
        *,
        weights: dict[int, float] | None = None,
        shrink_towards: int = 0,
    ) -> int:
        if min_value is None or max_value is None or max_value - min_value >= 2**53:
            raise NotImplementedError("seeded draws take integers in a range below 2**53")
        if weights:
            # Each weighted value with its probability; the rest of the mass is
            # spread over the whole range (Hypothesis's meaning of `weights`).
            r = self._rng.random()
            for value, weight in weights.items():
                if r < weight:
                    return value
                r -= weight
        span = max_value - min_value + 1
        return min_value + min(int(self._rng.random() * span), span - 1)

    def draw_float(self, **constraints) -> float:
        raise NotImplementedError("seeded draws take integers and booleans only")

    def draw_string(self, intervals, **constraints) -> str:
        raise NotImplementedError("seeded draws take integers and booleans only")

    def draw_bytes(self, **constraints) -> bytes:
        raise NotImplementedError("seeded draws take integers and booleans only")


def seeded_example(strategy: st.SearchStrategy[T], key: str) -> T:
    """The value of `strategy` that `key` determines: the same on every machine,
    under every Python and in every process, whatever else it imported.

    Hypothesis's `find`, `.example()` and `@seed` runs are not that: the
    engine starts from the simplest example, adapts to earlier ones, and its
    provider's constants depend on the loaded modules.  Here one choice
    sequence is made per key, outside the engine: a `_SeededChoices` seeded
    with the string `key` (a str seeds `random.Random` through SHA-512)
    answers each choice the strategy asks for, in order.  No choice depends on
    another key's draw, so values drawn for keys "s:0", "s:1", ... do not
    depend on how many are drawn.  A Hypothesis release that changes how a
    strategy asks for its choices (rare) changes the values drawn.
    """
    data = ConjectureData(
        random=None, provider=_SeededChoices, provider_kw={"rng": random.Random(key)}
    )
    # `.map` records its calls for Hypothesis's printing in the build context.
    with BuildContext(data, wrapped_test=seeded_example):
        return data.draw(strategy)
