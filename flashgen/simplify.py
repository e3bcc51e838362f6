"""Score algebra: a checked score in, an equal score that costs less per element out.

In: a real expression of a checked `Variant` (its score, or the derivative
`flashgen.grad` takes of it).  Out: an `ir.Expr` of the same language that
computes the same function of s, q, k, h, H in exact arithmetic, and within
float64 rounding in float64 (tests/test_simplify.py draws both and compares).
Only the kernels compute the simplified form (`flashgen.element_code`); the
float64 reference, FlexAttention's mods and the module's printed spec keep the
score as written, so the reference judges the rewrite too.

The rewrites, bottom up:

* constant subexpressions become one literal (`constant_value`);
* `x * 1`, `1 * x`, `x / 1`, `x + 0`, `x - 0` and `--x` lose the no-op;
* constant factors gather into one coefficient: `0.5 * (0.2 * x)` is
  `0.1 * x`, `-(2.0 * x)` is `-2.0 * x`, and `x / c` is `x * (1 / c)`.
  Division by a constant becomes a product because a product is one
  instruction and the GPU's float32 `/` is `div.full.f32` (a reciprocal, a
  product and range checks; measured in the PTX of Triton 3.6).  The two
  round differently: fl(x * fl(1/c)) is within 1.5 ulp of x / c and exact
  when c is a power of two, while `div.full.f32` itself is within 2 ulp, so
  the kernels lose nothing on the GPU; on the CPU interpreter (correctly
  rounded `/`) the difference is one float32 ulp of the score, which the
  tolerance's score rounding floor already counts (flashgen/verify.py);
* the constant terms of a sum fold into one, written last, and equal terms into one
  (`s + s` is `s * 2.0`);
* every spelling of a softcap becomes `softcap(x, c)`, the form the kernels
  have a tuned path for (`flashgen.element_code`): a term k * tanh(m * x)
  whose k * m is 1 within float64 rounding, so `c * tanh(s / c)`,
  `tanh(s / c) * c`, `c * tanh(s * (1 / c))`, `tanh(s * a) / a` and
  `-c * tanh(-s / c)`, also among other terms (`softcap(s, 30.0) - abs(q - k)`).

* `abs(exp(a))` is `exp(a)`, and `sqrt(exp(a))` is `exp(a * 0.5)`: the
  same function, and one whose derivative stays finite where exp(a)
  underflows to 0 (the chain rule through sqrt multiplies 1 / (2 * 0) by
  0 there, while exp(a * 0.5) underflows only at twice the distance:
  `sqrt(abs(exp(-abs(s + alibi))))`, drawn spec rand0_5, decision 079);

* `min` and `max` lose an argument that bounds cannot let win
  (`value_range`): `max(log(1.0 + abs(s)), -0.4)` is the log, since the
  log is at least 0, and `min(min(x, 1.5), 2.0)` is `min(x, 1.5)`.  Only
  where one argument's bounds lie strictly beyond the other's, so that no
  tie (whose derivative the reference splits in half) can occur, and never
  where an argument may be NaN (which `torch.maximum` propagates); the
  kept argument is not a constant.

Integer subexpressions are left as they are: their ranges are what `check`
proved (docs/LANGUAGE.md, Limits), and a rewrite must not move a product of
integers where no bound was taken.  For the same reason a no-op that makes an
integer expression real (`q * 1.0`, `q + 0.0`) stays.
"""

from __future__ import annotations

import math
import operator
import struct
from typing import NamedTuple

from flashgen import grad, ir
from flashgen.mask_forms import kind

# Kernels multiply a softcap's cap by log2(e) (docs/LANGUAGE.md, Limits): a
# cap above this would overflow float32 there.
_LOG2E = 1.4426950408889634
_FLOAT32_MAX = 3.4028234663852886e38
_FLOAT32_TINY = 2.0**-126
# k * m of a softcap spelling may be 1 within this many float64 ulps.
_UNIT_ULPS = 4


def _ieee(op, *args: float) -> float:
    """op(*args) in float64 with IEEE results where Python's math raises."""
    try:
        return op(*args)
    except OverflowError:
        return math.inf
    except (ValueError, ZeroDivisionError):
        return math.nan


def real_divide(a: float, b: float) -> float:
    """a / b in float64 with IEEE results (x / +-0 is +-inf, 0 / 0 is NaN)."""
    if b == 0:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, b) * math.copysign(1.0, a)
    return _ieee(operator.truediv, a, b)


def _log(x: float) -> float:
    return -math.inf if x == 0 else _ieee(math.log, x)


def _nan_or(fn, a: int | float, b: int | float) -> int | float:
    """min / max that propagate NaN, as torch.minimum and tl.minimum do."""
    if isinstance(a, float) and math.isnan(a) or isinstance(b, float) and math.isnan(b):
        return math.nan
    result = fn(a, b)
    return float(result) if isinstance(a, float) or isinstance(b, float) else result


_CONSTANT_CALLS = {
    "exp": lambda x: _ieee(math.exp, x),
    "log": _log,
    "sqrt": lambda x: _ieee(math.sqrt, x),
    "tanh": math.tanh,
}


def constant_value(e: ir.Expr) -> int | float | None:
    """The value of an expression without variables (`2 - 3`, `exp(1.0)`, the
    constants of grad's derivatives, `-1` for `-s`), or None when it mentions
    a variable.  An int for an integer expression, exactly (`div` and `%` by
    floor, as the kernels and the reference compute them); a float for a real
    one, evaluated in float64 with IEEE results (inf, NaN), as Triton folds
    Python constants itself.  Kernels get such expressions as one literal:
    a Python int or float has no `.to()`, and tl/gl functions want tensors.
    """
    if isinstance(e, ir.Num):
        return e.value
    if isinstance(e, ir.Unary):
        if e.op is not ir.UnaryOp.NEG:
            return None
        value = constant_value(e.operand)
        return None if value is None else -value
    if isinstance(e, ir.Binary):
        if e.op in ir.COMPARISONS or e.op in (ir.BinOp.AND, ir.BinOp.OR):
            return None
        a = constant_value(e.left)
        b = None if a is None else constant_value(e.right)
        if b is None:
            return None
        if e.op is ir.BinOp.DIV:
            return real_divide(float(a), float(b))
        if isinstance(a, int) and isinstance(b, int):
            return {
                ir.BinOp.ADD: a + b,
                ir.BinOp.SUB: a - b,
                ir.BinOp.MUL: a * b,
                ir.BinOp.FLOORDIV: a // b if b > 0 else None,
                ir.BinOp.MOD: a % b if b > 0 else None,
            }[e.op]
        a, b = float(a), float(b)
        if e.op is ir.BinOp.ADD:
            return a + b
        if e.op is ir.BinOp.SUB:
            return a - b
        return a * b if e.op is ir.BinOp.MUL else None
    if not isinstance(e, ir.Call) or e.fn in (grad.SIGN, grad.SELECT):
        return None
    args = [constant_value(a) for a in e.args]
    if None in args:
        return None
    if e.fn in _CONSTANT_CALLS:
        return _CONSTANT_CALLS[e.fn](float(args[0]))
    if e.fn == ir.SOFTCAP:
        x, cap = float(args[0]), float(args[1])
        return cap * math.tanh(real_divide(x, cap))
    if e.fn == "abs":
        return abs(args[0])
    if e.fn in ("min", "max"):
        return _nan_or(min if e.fn == "min" else max, *args)
    return None


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _normal_f32(x: float) -> bool:
    """Whether x is a normal float32 (the language's rule for real constants)."""
    return math.isfinite(x) and _FLOAT32_TINY <= abs(x) <= _FLOAT32_MAX


def _literal(value: int | float) -> ir.Expr:
    """A literal for a constant; a negative one as the negation of a literal,
    as the parser reads `-2.0`."""
    if value < 0 or (isinstance(value, float) and math.copysign(1.0, value) < 0):
        return ir.Unary(ir.UnaryOp.NEG, ir.Num(-value))
    return ir.Num(value)


def _real(e: ir.Expr) -> bool:
    return kind(e) is ir.Kind.REAL


def simplify(e: ir.Expr) -> ir.Expr:
    """`e` rewritten as the module docstring says; integer parts untouched."""
    value = constant_value(e)
    if value is not None:
        return _literal(value) if not (isinstance(value, float) and math.isnan(value)) else e
    if not _real(e):
        return e
    if isinstance(e, ir.Call):
        if e.fn == grad.SELECT:  # the condition is a comparison: kept
            cond, a, b = e.args
            return ir.Call(e.fn, (cond, simplify(a), simplify(b)))
        if e.fn == ir.SOFTCAP:  # the cap is a literal
            return ir.Call(e.fn, (simplify(e.args[0]), e.args[1]))
        args = tuple(simplify(a) for a in e.args)
        exp_arg = args[0].args[0] if isinstance(args[0], ir.Call) and args[0].fn == "exp" else None
        if exp_arg is not None and e.fn == "abs":  # exp is never negative
            return args[0]
        if exp_arg is not None and e.fn == "sqrt":
            return ir.Call("exp", (simplify(ir.Binary(ir.BinOp.MUL, exp_arg, _literal(0.5))),))
        if e.fn in ("min", "max"):
            winner = _sole_winner(e.fn, *args)
            if winner is not None:
                return winner if _real(winner) else _join(1.0, winner)  # `q * 1.0`: real
        return ir.Call(e.fn, args)
    if isinstance(e, ir.Binary) and e.op in (ir.BinOp.ADD, ir.BinOp.SUB):
        return _sum(e)
    if isinstance(e, (ir.Unary, ir.Binary)):
        coefficient, rest = _split(e)
        softcap = _softcap(coefficient, rest)
        return softcap if softcap is not None else _join(coefficient, rest)
    return e


def _split(e: ir.Expr) -> tuple[float, ir.Expr]:
    """(k, x) with e = k * x, x simplified and without a constant factor of
    its own; e real and not constant."""
    if isinstance(e, ir.Unary):  # NEG (NOT is not real)
        k, x = _split_factor(e.operand)
        return -k, x
    if isinstance(e, ir.Binary) and e.op in (ir.BinOp.MUL, ir.BinOp.DIV):
        right = constant_value(e.right)
        if e.op is ir.BinOp.MUL:
            left = constant_value(e.left)
            if left is not None and math.isfinite(left):
                k, x = _split_factor(e.right)
                return float(left) * k, x
            if right is not None and math.isfinite(right):
                k, x = _split_factor(e.left)
                return k * float(right), x
        elif right is not None and _normal_f32(real_divide(1.0, float(right))):
            # x / c = x * (1 / c): see the module docstring for the rounding.
            k, x = _split_factor(e.left)
            return real_divide(k, float(right)), x
        elif right is None:  # a / (y * c) = (a / y) * (1 / c)
            ka, a = _split_factor(e.left)
            kb, b = _split_factor(e.right)
            if kb != 0 and _normal_f32(real_divide(1.0, kb)) and _real(b):
                return real_divide(ka, kb), ir.Binary(e.op, a, b)
        return 1.0, ir.Binary(e.op, simplify(e.left), simplify(e.right))
    return 1.0, simplify(e)


def _split_factor(e: ir.Expr) -> tuple[float, ir.Expr]:
    """_split of a factor: a sum or a call is one factor, simplified."""
    if isinstance(e, ir.Binary) and e.op in (ir.BinOp.MUL, ir.BinOp.DIV):
        return _split(e)
    if isinstance(e, ir.Unary):
        return _split(e)
    return 1.0, simplify(e)


def _join(k: float, x: ir.Expr) -> ir.Expr:
    """k * x as `x * k`, a real: the coefficient written only where it is
    not 1 (or -1, a negation) or where x is an integer expression (`q * 1.0`,
    a real).  The constant goes right, where `softcap`'s kernel code has it,
    so that equal products print alike."""
    if not _real(x):
        return ir.Binary(ir.BinOp.MUL, x, _literal(float(k)))
    if k == 1.0:
        return x
    if k == -1.0:
        return ir.Unary(ir.UnaryOp.NEG, x)
    return ir.Binary(ir.BinOp.MUL, x, _literal(k))


def _softcap(k: float, x: ir.Expr) -> ir.Expr | None:
    """softcap(y, |k|) with coefficient 1 when k * x is a softcap spelling,
    k * tanh(m * y) with k * m = 1 within float64 rounding, else None.  tanh
    is odd, so k < 0 (and m < 0) spells softcap(y, -k) too.  The cap must be a
    cap the language accepts (docs/LANGUAGE.md, Limits)."""
    if not (isinstance(x, ir.Call) and x.fn == "tanh"):
        return None
    m, y = _split(x.args[0])
    if not (math.isfinite(k) and math.isfinite(m)) or k == 0:
        return None
    if abs(k * m - 1.0) > _UNIT_ULPS * 2.0**-52:
        return None
    cap = abs(k)
    if not (_normal_f32(cap) and cap * _LOG2E <= _FLOAT32_MAX) or _f32(cap) <= 0:
        return None
    return ir.Call(ir.SOFTCAP, (y, ir.Num(cap)))


def _term(k: int | float, x: ir.Expr) -> ir.Expr:
    """A term of a sum: an integer term (an int k, +-1) as it is or negated,
    a real one as `_join` writes it."""
    if isinstance(k, int):
        return x if k == 1 else ir.Unary(ir.UnaryOp.NEG, x)
    return _join(k, x)


def _terms(e: ir.Expr, sign: float, out: list[tuple[float, ir.Expr]]) -> None:
    """The real terms of a sum, each as (sign, term); an integer sum inside
    is one term (its additions are integer ones)."""
    if _real(e) and isinstance(e, ir.Binary) and e.op in (ir.BinOp.ADD, ir.BinOp.SUB):
        _terms(e.left, sign, out)
        _terms(e.right, -sign if e.op is ir.BinOp.SUB else sign, out)
    elif _real(e) and isinstance(e, ir.Unary) and e.op is ir.UnaryOp.NEG:
        _terms(e.operand, -sign, out)
    else:
        out.append((sign, e))


def _like_terms(kept: list[tuple[int | float, ir.Expr]]) -> list[tuple[int | float, ir.Expr]]:
    """Equal real terms as one, their coefficients added (exactly: they are
    small multiples of the written constants), in the order they first
    appear: `s + s + (s + s)` is `s * 4.0`, one rounding where adding the
    terms left to right, as the rebuilt sum would, rounds at every step (a
    balanced sum of 256 copies of s is exact as written; the chain is off by
    up to 2^7 ulps).  Integer terms stay as they are."""
    merged: dict[ir.Expr, float] = {}
    out: list[tuple[int | float, ir.Expr]] = []
    for k, x in kept:
        if isinstance(k, int):
            out.append((k, x))
        elif x in merged:
            merged[x] += k
        else:
            merged[x] = k
            out.append((0.0, x))  # a placeholder: the coefficient comes from `merged`
    return [(k, x) if isinstance(k, int) else (merged[x], x) for k, x in out]


def _sum(e: ir.Expr) -> ir.Expr:
    """A real sum: terms simplified, constants folded into one written last,
    zeros dropped (and softcaps recognized term by term)."""
    terms: list[tuple[float, ir.Expr]] = []
    _terms(e, 1.0, terms)
    constant = 0.0
    kept: list[tuple[int | float, ir.Expr]] = []
    for sign, term in terms:
        value = constant_value(term)
        if value is not None:
            constant += sign * float(value)
            continue
        if _real(term):
            k, x = _split_factor(term)
            softcap = _softcap(sign * k, x)
            kept.append((1.0, softcap) if softcap is not None else (sign * k, x))
        else:  # an integer term, added as it is (an int sign marks it)
            kept.append((int(sign), term))
    kept = _like_terms(kept)
    out: ir.Expr | None = None
    if constant != 0.0 and kept[0][0] < 0:  # `1.0 - t * t`, not `-(t * t) + 1.0`
        out, constant = _literal(constant), 0.0
    for k, x in kept:
        if out is None:
            out = _term(k, x)
        elif k < 0:
            out = ir.Binary(ir.BinOp.SUB, out, _term(-k, x))
        else:
            out = ir.Binary(ir.BinOp.ADD, out, _term(k, x))
    assert out is not None  # a sum of constants is constant
    if constant != 0.0 or (not _real(out) and _real(e)):
        # A real 0.0 added to an integer expression keeps it real.
        op = ir.BinOp.SUB if constant < 0 else ir.BinOp.ADD
        out = ir.Binary(op, out, ir.Num(abs(constant)))
    return out


# --------------------------------------------------------------------------- #
# Value ranges
# --------------------------------------------------------------------------- #


class Range(NamedTuple):
    """What a score expression's values may be: every value that is not NaN
    lies in [lo, hi]; `nan`: it may be NaN; `inf`: it may be infinite (a
    bound of +-inf alone means only "unbounded": q - k is never infinite)."""

    lo: float
    hi: float
    nan: bool = False
    inf: bool = False


_ANY = Range(-math.inf, math.inf)
_UNKNOWN = Range(-math.inf, math.inf, True, True)
# ALiBi's bias, -slope * |q - k|: at most 0, never infinite.
_ALIBI = Range(-math.inf, 0.0)


def _sole_winner(fn: str, a: ir.Expr, b: ir.Expr) -> ir.Expr | None:
    """The argument of min or max (`fn`) that wins for every value of both,
    strictly, unless it is a constant; the other may not be NaN (torch's
    min and max propagate it).  None when there is no such argument."""
    ra, rb = value_range(a), value_range(b)
    if fn == "max":
        winner = a if ra.lo > rb.hi and not rb.nan else b if rb.lo > ra.hi and not ra.nan else None
    else:
        winner = a if ra.hi < rb.lo and not rb.nan else b if rb.hi < ra.lo and not ra.nan else None
    return None if winner is None or constant_value(winner) is not None else winner


def _floor(x: float) -> float:
    """floor, with an unbounded side kept unbounded."""
    return x if math.isinf(x) else float(math.floor(x))


def _times(x: float, y: float) -> float:
    """A bound of a product: 0 times an unbounded side is 0 (whether the
    side may really be infinite, giving NaN, is the range's `nan`)."""
    return 0.0 if x == 0 or y == 0 else x * y


def value_range(e: ir.Expr) -> Range:
    """The `Range` of a score expression for any s, q, k, h and inputs, by
    interval arithmetic (each operation's extremes at its operands' bounds).
    s is any number (not infinite: q . k times the scale); integer
    variables and integer input reads any integer; real input reads
    anything, NaN included."""
    value = constant_value(e)
    if value is not None:
        v = float(value)
        return Range(v, v, math.isnan(v), math.isinf(v))
    if isinstance(e, ir.Name):
        return _ALIBI if e.id == ir.ALIBI else _ANY
    if isinstance(e, ir.Index):
        return _UNKNOWN if _real(e) else _ANY
    if isinstance(e, ir.Unary):
        r = value_range(e.operand)
        return r._replace(lo=-r.hi, hi=-r.lo) if e.op is ir.UnaryOp.NEG else _UNKNOWN
    if isinstance(e, ir.Binary):
        return _binary_range(e)
    if isinstance(e, ir.Call):
        return _call_range(e)
    return _UNKNOWN


def _binary_range(e: ir.Binary) -> Range:
    if e.op in (ir.BinOp.FLOORDIV, ir.BinOp.MOD):
        divisor, left = constant_value(e.right), value_range(e.left)
        if not isinstance(divisor, int) or divisor <= 0:
            return _ANY
        if e.op is ir.BinOp.MOD:
            return Range(0.0, float(divisor - 1))
        return Range(*(_floor(bound / divisor) for bound in (left.lo, left.hi)))
    if e.op not in (ir.BinOp.ADD, ir.BinOp.SUB, ir.BinOp.MUL, ir.BinOp.DIV):
        return _UNKNOWN  # a comparison or a logical operator: no real value
    a, b = value_range(e.left), value_range(e.right)
    nan, inf = a.nan or b.nan, a.inf or b.inf
    if e.op in (ir.BinOp.ADD, ir.BinOp.SUB):
        if e.op is ir.BinOp.SUB:
            b = b._replace(lo=-b.hi, hi=-b.lo)
        # inf + -inf: one side may be +inf and the other -inf
        up = lambda r: r.inf and r.hi == math.inf  # noqa: E731
        down = lambda r: r.inf and r.lo == -math.inf  # noqa: E731
        nan = nan or up(a) and down(b) or down(a) and up(b)
        lo, hi = a.lo + b.lo, a.hi + b.hi
        if math.isnan(lo) or math.isnan(hi):
            return _UNKNOWN
        return Range(lo, hi, nan, inf)
    if e.op is ir.BinOp.MUL:
        corners = [_times(x, y) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
        zero_times_inf = (a.lo <= 0 <= a.hi and b.inf) or (b.lo <= 0 <= b.hi and a.inf)
        return Range(min(corners), max(corners), nan or zero_times_inf, inf)
    if b.lo <= 0.0 <= b.hi:
        return _UNKNOWN  # x / 0
    corners = [real_divide(x, y) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
    if any(math.isnan(c) for c in corners):
        return Range(-math.inf, math.inf, nan or a.inf and b.inf, a.inf)
    return Range(min(corners), max(corners), nan, a.inf)


def _call_range(e: ir.Call) -> Range:
    if e.fn == grad.SELECT:
        a, b = value_range(e.args[1]), value_range(e.args[2])
        return Range(min(a.lo, b.lo), max(a.hi, b.hi), a.nan or b.nan, a.inf or b.inf)
    r = value_range(e.args[0])
    if e.fn in ("min", "max"):
        b = value_range(e.args[1])
        pick = min if e.fn == "min" else max
        return Range(pick(r.lo, b.lo), pick(r.hi, b.hi), r.nan or b.nan, r.inf or b.inf)
    if e.fn == "abs":
        if r.lo >= 0.0:
            return r
        return (
            r._replace(lo=-r.hi, hi=-r.lo)
            if r.hi <= 0.0
            else r._replace(lo=0.0, hi=max(-r.lo, r.hi))
        )
    if e.fn == grad.SIGN:
        return Range(-1.0 if r.lo < 0 else 0.0, 1.0 if r.hi > 0 else 0.0, r.nan)
    if e.fn in ("tanh", ir.SOFTCAP):
        cap = 1.0 if e.fn == "tanh" else float(constant_value(e.args[1]))
        return Range(cap * math.tanh(r.lo / cap), cap * math.tanh(r.hi / cap), r.nan)
    if e.fn == "exp":  # overflows to inf, underflows to 0
        lo, hi = _CONSTANT_CALLS["exp"](r.lo), _CONSTANT_CALLS["exp"](r.hi)
        return Range(lo, hi, r.nan, hi == math.inf)
    if e.fn in ("log", "sqrt"):
        fn = _CONSTANT_CALLS[e.fn]
        if r.lo < 0.0:
            return Range(-math.inf if e.fn == "log" else 0.0, fn(max(r.hi, 0.0)), True, True)
        return Range(fn(r.lo), fn(r.hi), r.nan, r.inf or fn(r.lo) == -math.inf)
    return _UNKNOWN
