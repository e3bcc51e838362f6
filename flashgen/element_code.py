"""Element code: the mask and the score, as Triton expressions per element.

Checked expressions in, Triton source over the tile's position vectors
(`q_pos`, `k_pos`), the query head (`head`, `num_heads`) and the scaled score
`s` out.  Expressions without variables are folded to one literal
(`constant_value`), an int in integer contexts and a float in real ones, so
that no Python constant meets `.to()` or a tl function in any backend.  The
score is classified (`ScoreKind`) and its derivative with respect to s, from
`flashgen.grad`, translated the same way.
"""

from __future__ import annotations

import enum
import math
import operator
import re
import struct
from dataclasses import dataclass

from flashgen import grad, ir
from flashgen.kernel_expr import float_literal as _float_literal
from flashgen.kernel_expr import power_of_two
from flashgen.mask_forms import K_MINUS_Q, affine, clean, int_arg, kind

LOG2E = 1.4426950408889634
FLOAT32_MAX = 3.4028234663852886e38


class ScoreKind(str, enum.Enum):
    """How the kernels apply the score: s itself, s + bias, or any f(s)."""

    IDENTITY = "identity"
    ADDITIVE = "additive"
    GENERAL = "general"


_ELEMENT_NAMES = {"q": "q_pos", "k": "k_pos", "h": "head", "H": "num_heads", "s": "s"}
_REAL_CALLS = {"exp": "tl.exp", "log": "tl.log", "sqrt": "tl.sqrt", "tanh": "_tanh"}


def _ieee(op, *args: float) -> float:
    """op(*args) in float64 with IEEE results where Python's math raises."""
    try:
        return op(*args)
    except OverflowError:
        return math.inf
    except (ValueError, ZeroDivisionError):
        return math.nan


def _real_divide(a: float, b: float) -> float:
    if b == 0:  # IEEE: x / +-0 is +-inf, 0 / 0 is NaN
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
            return _real_divide(float(a), float(b))
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
        return cap * math.tanh(_real_divide(x, cap))
    if e.fn == "abs":
        return abs(args[0])
    if e.fn in ("min", "max"):
        return _nan_or(min if e.fn == "min" else max, *args)
    return None


def _atom(code: str, e: ir.Expr) -> str:
    """Parenthesise `code`, the translation of `e`, unless it is atomic."""
    if constant_value(e) is not None:  # one literal
        return f"({code})" if code.startswith("-") else code
    if isinstance(e, ir.Name) and e.id == ir.ALIBI:
        return f"({code})"
    if isinstance(e, (ir.Name, ir.Call)) or (isinstance(e, ir.Num) and e.value >= 0):
        return code
    if isinstance(e, ir.Binary) and e.op in (ir.BinOp.FLOORDIV, ir.BinOp.MOD):
        return code  # emitted as a call
    return f"({code})"


class ElementCode:
    """Translates checked expressions into Triton source for one tile."""

    def __init__(self, keys_before_queries: bool = False) -> None:
        self.needs_floor_div = False
        self.needs_tanh = False
        self.uses_alibi = False
        # Score code may assume k <= q: the mask hides every other pair (see
        # `keys_before_queries`).  Then |q - k| is q - k, one operation less.
        self.keys_before_queries = keys_before_queries

    def scaled(self, e: ir.Expr, c: float) -> str:
        """Code for c * e as a float32 value, with c folded into a constant
        factor of e where there is one (`50.0 * _tanh(...)` times log2(e) is
        `72.13... * _tanh(...)`): one multiplication per element less."""
        value = constant_value(e)
        if value is not None:
            return _float_literal(c * value)
        if isinstance(e, ir.Unary) and e.op is ir.UnaryOp.NEG:
            return self.scaled(e.operand, -c)
        if isinstance(e, ir.Binary) and e.op is ir.BinOp.MUL:
            for factor, rest in ((e.left, e.right), (e.right, e.left)):
                value = constant_value(factor)
                if value is not None and math.isfinite(c * value):
                    return self.scaled(rest, c * value)
        if isinstance(e, ir.Name) and e.id == ir.ALIBI:
            return self._alibi(c)
        if isinstance(e, ir.Call) and e.fn == ir.SOFTCAP:
            return self._softcap(e, c)
        return f"{_float_literal(c)} * {self._real_operand(e)}"

    def _alibi(self, c: float) -> str:
        """c * alibi, alibi = -slope * |q - k|, with c * slope computed once."""
        self.uses_alibi = True
        if self.keys_before_queries:
            coeff, distance = c, "(k_pos - q_pos)"
        else:
            coeff, distance = -c, "tl.abs(q_pos - k_pos)"
        slope = {1.0: "alibi_slope", -1.0: "-alibi_slope"}.get(coeff)
        slope = slope or f"(alibi_slope * {_float_literal(coeff)})"
        return f"{slope} * {distance}.to(tl.float32)"

    def _softcap(self, e: ir.Call, c: float) -> str:
        """c * softcap(x, cap) = (c * cap) * tanh(x / cap)."""
        self.needs_tanh = True
        cap = float(e.args[1].value)  # type: ignore[union-attr]
        x = self.real(e.args[0])
        t = f"_tanh(({x}) * {_float_literal(1.0 / cap)})"
        if abs(c * cap) > FLOAT32_MAX:  # a cap near float32's max: c * cap overflows
            return f"{_float_literal(c)} * ({_float_literal(cap)} * {t})"
        return f"{_float_literal(c * cap)} * {t}"

    def real(self, e: ir.Expr) -> str:
        """Code for `e` as a float32 value."""
        value = constant_value(e)
        if value is not None:
            return _float_literal(value)
        if kind(e) is ir.Kind.INT:
            return f"({self.expr(e)}).to(tl.float32)"
        return self.expr(e)

    def expr(self, e: ir.Expr) -> str:
        value = constant_value(e)
        if value is not None:
            return str(value) if isinstance(value, int) else _float_literal(value)
        if isinstance(e, ir.Name):
            if e.id == ir.ALIBI:
                return self._alibi(1.0)
            if e.id == "full":
                return "True"
            return _ELEMENT_NAMES[e.id]
        if isinstance(e, ir.Unary):
            if e.op is ir.UnaryOp.NOT:
                return _not(self.expr(e.operand))
            return f"-({self.expr(e.operand)})"
        if isinstance(e, ir.Binary):
            return self._binary(e)
        return self._call(e)

    def _binary(self, e: ir.Binary) -> str:
        op = e.op
        if op in (ir.BinOp.AND, ir.BinOp.OR):
            combine = _and if op is ir.BinOp.AND else _or
            return combine(self.expr(e.left), self.expr(e.right))
        if op in (ir.BinOp.FLOORDIV, ir.BinOp.MOD):
            c = int_arg(e.right)
            self.needs_floor_div |= not power_of_two(c)
            fn = floor_div if op is ir.BinOp.FLOORDIV else floor_mod
            return fn(self.expr(e.left), c)
        if op in ir.COMPARISONS or kind(e) is ir.Kind.INT:
            left = _atom(self.expr(e.left), e.left)
            right = _atom(self.expr(e.right), e.right)
        else:
            left, right = self._real_operand(e.left), self._real_operand(e.right)
        return f"{left} {op.value} {right}"

    def _real_operand(self, e: ir.Expr) -> str:
        if kind(e) is ir.Kind.INT and not isinstance(e, ir.Num):
            return self.real(e)  # `(...).to(tl.float32)` is atomic
        return _atom(self.real(e), e)

    def _call(self, e: ir.Call) -> str:
        if e.fn == grad.SIGN:
            x = self.real(e.args[0])
            return f"tl.where({x} > 0, 1.0, tl.where({x} < 0, -1.0, 0.0))"
        if e.fn == grad.SELECT:
            cond, a, b = e.args
            return f"tl.where({self.expr(cond)}, {self.real(a)}, {self.real(b)})"
        if e.fn == ir.SOFTCAP:
            return self._softcap(e, 1.0)
        if e.fn in _REAL_CALLS:
            self.needs_tanh |= e.fn == "tanh"
            return f"{_REAL_CALLS[e.fn]}({self.real(e.args[0])})"
        if e.fn == "abs":
            if self.keys_before_queries and clean(affine(e.args[0]) or {}) in K_MINUS_Q:
                return "(q_pos - k_pos)"
            return f"tl.abs({self.expr(e.args[0])})"
        fn = "tl.minimum" if e.fn == "min" else "tl.maximum"
        if kind(e) is ir.Kind.INT:
            return f"{fn}({self.expr(e.args[0])}, {self.expr(e.args[1])})"
        return f"{fn}({self.real(e.args[0])}, {self.real(e.args[1])})"


def _not(a: str) -> str:
    return {"True": "False", "False": "True"}.get(a, f"~({a})")


def _and(a: str, b: str) -> str:
    if "False" in (a, b):
        return "False"
    if a == "True":
        return b
    return a if b == "True" else f"({a}) & ({b})"


def _or(a: str, b: str) -> str:
    if "True" in (a, b):
        return "True"
    if a == "False":
        return b
    return a if b == "False" else f"({a}) | ({b})"


def floor_div(a: str, c: int) -> str:
    """Code for a // c (floor) with c > 0: an arithmetic shift when c is a
    power of two (exact for negative a too), else the module's `_floor_div`.
    The shift keeps chunked masks as cheap as causal ones: the helper's
    division and select cost registers in the backward."""
    if power_of_two(c):
        return f"({_grouped(a)} >> {c.bit_length() - 1})"
    return f"_floor_div({a}, {c})"


def floor_mod(a: str, c: int) -> str:
    """Code for a mod c (floor, so in [0, c)) with c > 0."""
    if power_of_two(c):
        return f"({_grouped(a)} & {c - 1})"
    return f"_floor_mod({a}, {c})"


def _grouped(code: str) -> str:
    """`code` as an operand of a binary operator: parenthesized unless it is
    a name or a number."""
    return code if re.fullmatch(r"-?\w+", code) else f"({code})"


_S = ir.Name("s")


@dataclass(frozen=True)
class ScoreCode:
    """The score as the kernels compute it (see KernelModel)."""

    kind: ScoreKind
    # log2(e) times the bias (ADDITIVE) or times f(s) (GENERAL); "" for IDENTITY.
    log2_code: str
    # d score / d s for GENERAL scores (None when it is the constant 1).
    grad_code: str | None
    # Whether grad_code reads s (softcap's reads the score s2 back instead).
    grad_uses_s: bool


def score_code(score: ir.Expr, elements: ElementCode) -> ScoreCode:
    """The score's kind, its code in log2 units and the code of its
    derivative with respect to s."""
    score_kind, expr = _score_parts(score)
    if score_kind is ScoreKind.IDENTITY:
        return ScoreCode(score_kind, "", None, False)
    log2_code = elements.scaled(expr, LOG2E)
    if score_kind is ScoreKind.GENERAL and not grad.depends_on_s(expr):
        # A score without s (`2.0`, `q * 0.5`, `h`) may be a scalar or one
        # row or column; the softmax needs it broadcast to the tile.  s is
        # finite, so s * 0.0 adds nothing but the shape (and its layout).
        log2_code = f"s * 0.0 + ({log2_code})"
    grad_code, grad_uses_s = None, False
    if (
        score_kind is ScoreKind.GENERAL
        and isinstance(expr, ir.Call)
        and expr.fn == ir.SOFTCAP
        and expr.args[0] == _S
        and abs(LOG2E * float(expr.args[1].value)) <= FLOAT32_MAX
    ):
        # d/ds c tanh(s / c) = 1 - tanh(s / c)^2, and tanh(s / c) is the
        # score s2 = fl32(log2(e) c) tanh(s / c) read back as s2 * r: no
        # second tanh in the backward.  r is chosen so that a saturated tanh
        # (+-1, where every pair sits when the cap is tiny) gives a
        # derivative of exactly 0, not a few ulps of noise.
        inverse, exact = tanh_reader(LOG2E * float(expr.args[1].value))
        t = f"(s2 * {_float_literal(inverse)})"
        grad_code = f"1.0 - {t} * {t}" if exact else f"1.0 - tl.minimum({t} * {t}, 1.0)"
    elif score_kind is ScoreKind.GENERAL:
        derivative = grad.derivative(expr)
        if derivative != grad.ONE:
            grad_code = elements.real(derivative)
            grad_uses_s = ir.mentions(derivative, frozenset({"s"}))
    return ScoreCode(score_kind, log2_code, grad_code, grad_uses_s)


def _f32(x: float) -> float:
    """x rounded to float32 (to nearest, ties to even)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def _f32_neighbour(x: float, steps: int) -> float:
    """The float32 `steps` units in the last place above x (a float32)."""
    bits = struct.unpack("i", struct.pack("f", x))[0]
    return struct.unpack("f", struct.pack("i", bits + (steps if x > 0 else -steps)))[0]


def tanh_reader(factor: float) -> tuple[float, bool]:
    """(r, exact) for reading tanh back from s2 = fl32(factor) * tanh as
    s2 * r, r a float32 (products of two float32 values are exact in
    float64, so fl32 of them is the kernel's product).  exact: fl32(a * r)
    is 1, so a saturated tanh (+-1) reads back as exactly +-1.  Otherwise r
    makes it at least 1 in magnitude, and the derivative 1 - t^2 needs a
    clamp at 0."""
    a = _f32(factor)
    r = _f32(1.0 / a)
    candidates = [_f32_neighbour(r, step) for step in (0, -1, 1, 2)]
    for candidate in candidates:
        if _f32(a * candidate) == 1.0:
            return candidate, True
    above = [c for c in candidates if _f32(a * c) > 1.0]
    return (min(above, key=lambda c: a * c) if above else _f32_neighbour(r, 3)), False


def _score_parts(score: ir.Expr) -> tuple[ScoreKind, ir.Expr | None]:
    """Classify the score: identity, s + bias, or general."""
    if score == _S:
        return ScoreKind.IDENTITY, None
    if isinstance(score, ir.Binary) and score.op in (ir.BinOp.ADD, ir.BinOp.SUB):
        s_names = frozenset({"s"})
        if score.left == _S and not ir.mentions(score.right, s_names):
            bias = score.right
            if score.op is ir.BinOp.SUB:
                bias = ir.Unary(ir.UnaryOp.NEG, bias)
            return ScoreKind.ADDITIVE, bias
        if score.op is ir.BinOp.ADD and score.right == _S and not ir.mentions(score.left, s_names):
            return ScoreKind.ADDITIVE, score.left
    return ScoreKind.GENERAL, score
