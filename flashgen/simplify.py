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

Integer subexpressions are left as they are: their ranges are what `check`
proved (docs/LANGUAGE.md, Limits), and a rewrite must not move a product of
integers where no bound was taken.  For the same reason a no-op that makes an
integer expression real (`q * 1.0`, `q + 0.0`) stays.
"""

from __future__ import annotations

import math
import operator
import struct

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
        return ir.Call(e.fn, tuple(simplify(a) for a in e.args))
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
