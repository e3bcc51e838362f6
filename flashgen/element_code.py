"""Element code: the mask and the score, as kernel expressions per element.

Checked expressions in, `flashgen.kernel_expr` trees over the tile's
position vectors (`q_pos`, `k_pos`), the query head (`head`, `num_heads`)
and the scaled score `s` out; `flashgen.lower` prints them, and the facts
the module needs (`_tanh`, `_log`, the ALiBi slopes, the floor helpers) are
read off the trees.  Expressions without variables are folded to one literal
(`constant_value`), an int in integer contexts and a float in real ones, so
that no Python constant meets `.to()` or a tl function in any backend.  The
score is simplified first (`flashgen.simplify`: constants, no-ops, division
by constants, softcap spellings), classified (`ScoreKind`), and its
derivative with respect to s, from `flashgen.grad`, translated the same way.
A function call that the score (or its derivative) makes more than once is
computed once per element, into a local (`ScoreCode.lines`).

Functions take the fast path the module's dtype allows (docs/decisions/049):
exp as exp2 with log2(e) folded into the argument's constant factor (the GPU
instruction `tl.exp` becomes anyway, less one product), log as the module's
`_log` in 16-bit modules (lg2.approx.f32 on the GPU) and `tl.log` in float32
ones, tanh as the module's `_tanh`, sqrt as `tl.sqrt` (sqrt.approx.f32 on
the GPU for every dtype, as before).
"""

from __future__ import annotations

import enum
import math
import struct
from dataclasses import dataclass

from flashgen import grad, ir
from flashgen import kernel_expr as kx
from flashgen.mask_forms import K_MINUS_Q, affine, clean, int_arg, kind
from flashgen.simplify import constant_value, simplify

LOG2E = 1.4426950408889634
FLOAT32_MAX = 3.4028234663852886e38


class ScoreKind(str, enum.Enum):
    """How the kernels apply the score: s itself, s + bias, or any f(s)."""

    IDENTITY = "identity"
    ADDITIVE = "additive"
    GENERAL = "general"


_ELEMENT_NAMES = {
    "q": "q_pos", "k": "k_pos", "h": "head", "H": "num_heads", "s": "s", "b": "batch"
}  # fmt: skip
_REAL_CALLS = {"log": "tl.log", "sqrt": "tl.sqrt", "tanh": kx.TANH}


def _negative_literal(value: int | float) -> bool:
    """Whether the literal for `value` starts with a minus sign."""
    if isinstance(value, int):
        return value < 0
    return math.isfinite(value) and math.copysign(1.0, value) < 0


def _literal(value: int | float) -> kx.Expr:
    return kx.Int(value) if isinstance(value, int) else kx.Float(value)


def _atom(code: kx.Expr, e: ir.Expr) -> kx.Expr:
    """`code`, the translation of `e`, as an operand: bracketed unless `e` is
    a name, a call, a non-negative literal or a floor division (a shift or a
    mask in brackets, or a helper call).  softcap's call is the product
    `c * _tanh(...)`; the printer brackets it where precedence needs."""
    value = constant_value(e)
    if value is not None:  # one literal
        return kx.Paren(code) if _negative_literal(value) else code
    if isinstance(e, ir.Name) and e.id == ir.ALIBI:
        return kx.Paren(code)
    if isinstance(e, (ir.Name, ir.Call, ir.Index)) or (isinstance(e, ir.Num) and e.value >= 0):
        return code
    if isinstance(e, ir.Binary) and e.op in (ir.BinOp.FLOORDIV, ir.BinOp.MOD):
        return code
    return kx.Paren(code)


_F32 = "tl.float32"
Q_POS, K_POS, S, S2, ALIBI_SLOPE = (
    kx.Var(name) for name in ("q_pos", "k_pos", "s", "s2", "alibi_slope")
)


class ElementCode:
    """Translates checked expressions into `kernel_expr` trees over one tile's
    elements (printed by `flashgen.lower`)."""

    def __init__(
        self,
        keys_before_queries: bool = False,
        fast_log: bool = False,
        named: dict[ir.Index, str] | None = None,
        float_distances: bool = False,
    ) -> None:
        # Score code may assume k <= q: the mask hides every other pair (see
        # `keys_before_queries`).  Then |q - k| is q - k, one operation less.
        self.keys_before_queries = keys_before_queries
        # log through the module's `_log` (lg2.approx.f32 on the GPU) rather
        # than `tl.log` (libdevice's logf): 16-bit modules (kernel_choice.fast_math).
        self.fast_log = fast_log
        # Reads that the kernel has already loaded into variables of these names.
        self.named = named or {}
        # Experiment (decision 094): distances in a real context as float32
        # differences of positions converted per row and per column.
        self.float_distances = float_distances
        # Subexpressions the kernel has computed already, as the code that reads
        # them back (the score itself from s2 in the derivative: `reading`).
        self.known: dict[ir.Expr, kx.Expr] = {}

    def reading(self, e: ir.Expr, code: kx.Expr) -> ElementCode:
        """A translator like this one that gives `code` for `e`."""
        other = ElementCode(
            self.keys_before_queries, self.fast_log, self.named, self.float_distances
        )  # fmt: skip
        other.known = {**self.known, e: code}
        return other

    def scaled(self, e: ir.Expr, c: float) -> kx.Expr:
        """c * e as a float32 value, with c folded into a constant factor of
        e where there is one (`50.0 * _tanh(...)` times log2(e) is
        `72.13... * _tanh(...)`): one multiplication per element less."""
        value = constant_value(e)
        if value is not None:
            return kx.Float(c * value)
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
        if isinstance(e, ir.Binary) and e.op in (ir.BinOp.ADD, ir.BinOp.SUB):
            if kind(e) is ir.Kind.REAL:  # c (a + b) = c a + c b: c folds into each term
                combine = kx.add if e.op is ir.BinOp.ADD else kx.sub
                return combine(self.scaled(e.left, c), self.scaled(e.right, c))
        return kx.mul(kx.Float(c), self._real_operand(e))

    def _alibi(self, c: float) -> kx.Expr:
        """c * alibi, alibi = -slope * |q - k|, with c * slope computed once."""
        # alibi = slope * (k - q) where the mask hides k > q, else -slope * |q - k|.
        if self.keys_before_queries:
            coeff, distance = c, self._difference(K_POS, Q_POS)
        else:
            coeff, distance = -c, self._absolute_difference()
        if coeff == 1.0:
            slope: kx.Expr = ALIBI_SLOPE
        elif coeff == -1.0:
            slope = kx.Neg(ALIBI_SLOPE)
        else:
            slope = kx.Paren(kx.mul(ALIBI_SLOPE, kx.Float(coeff)))
        return kx.mul(slope, distance)

    def _softcap(self, e: ir.Call, c: float) -> kx.Expr:
        """c * softcap(x, cap) = (c * cap) * tanh(x / cap)."""
        cap = float(e.args[1].value)  # type: ignore[union-attr]
        x = self.real(e.args[0])
        t = kx.Call(kx.TANH, (kx.mul(x, kx.Float(1.0 / cap)),))
        if abs(c * cap) > FLOAT32_MAX:  # a cap near float32's max: c * cap overflows
            return kx.mul(kx.Float(c), kx.Paren(kx.mul(kx.Float(cap), t)))
        return kx.mul(kx.Float(c * cap), t)

    def real(self, e: ir.Expr) -> kx.Expr:
        """`e` as a float32 value."""
        value = constant_value(e)
        if value is not None:
            return kx.Float(float(value))
        if kind(e) is ir.Kind.INT:
            distance = self._distance(e) if self.float_distances else None
            return distance or kx.Cast(kx.Paren(self.expr(e)), _F32)
        return self.expr(e)

    def _difference(self, a: kx.Var, b: kx.Var) -> kx.Expr:
        """a - b of two position tensors as float32."""
        return _float_difference(a, b) if self.float_distances else kx.Cast(kx.sub(a, b), _F32)

    def _absolute_difference(self) -> kx.Expr:
        """|q - k| as float32."""
        if self.float_distances:
            return kx.Abs(_float_difference(Q_POS, K_POS))
        return kx.Cast(kx.Abs(kx.sub(Q_POS, K_POS)), _F32)

    def _distance(self, e: ir.Expr) -> kx.Expr | None:
        """k - q, q - k or |q - k| as a float32 value, or None for any other
        integer expression (called with float_distances on)."""
        absolute = isinstance(e, ir.Call) and e.fn == "abs"
        form = affine(e.args[0] if absolute else e)  # type: ignore[union-attr]
        if form is None or clean(form) not in K_MINUS_Q:
            return None
        if absolute:
            if self.keys_before_queries:  # |q - k| = q - k where the mask hides k > q
                return self._difference(Q_POS, K_POS)
            return self._absolute_difference()
        return self._difference(K_POS, Q_POS) if form["k"] == 1 else self._difference(Q_POS, K_POS)

    def expr(self, e: ir.Expr) -> kx.Expr:
        if e in self.known:
            return self.known[e]
        value = constant_value(e)
        if value is not None:
            return _literal(value)
        if isinstance(e, ir.Name):
            if e.id == ir.ALIBI:
                return self._alibi(1.0)
            if e.id == "full":
                return kx.TRUE
            return kx.Var(_ELEMENT_NAMES[e.id])
        if isinstance(e, ir.Unary):
            if e.op is ir.UnaryOp.NOT:
                return kx.not_(self.expr(e.operand))
            return kx.Neg(kx.Paren(self.expr(e.operand)))
        if isinstance(e, ir.Binary):
            return self._binary(e)
        if isinstance(e, ir.Index):
            if e in self.named:
                return kx.Var(self.named[e])
            return kx.Load(e.input, tuple(self.expr(a) for a in e.args))
        return self._call(e)

    def _binary(self, e: ir.Binary) -> kx.Expr:
        op = e.op
        if op in (ir.BinOp.AND, ir.BinOp.OR):
            combine = kx.and_ if op is ir.BinOp.AND else kx.or_
            return combine(self.expr(e.left), self.expr(e.right))
        if op is ir.BinOp.FLOORDIV:
            return kx.FloorDiv(self.expr(e.left), int_arg(e.right))
        if op is ir.BinOp.MOD:
            return kx.FloorMod(self.expr(e.left), int_arg(e.right))
        if op in ir.COMPARISONS:
            left, right = _atom(self.expr(e.left), e.left), _atom(self.expr(e.right), e.right)
            return kx.Cmp(op.value, left, right)
        if kind(e) is ir.Kind.INT:
            left, right = _atom(self.expr(e.left), e.left), _atom(self.expr(e.right), e.right)
        else:
            left, right = self._real_operand(e.left), self._real_operand(e.right)
        return kx.Arith(op.value, left, right)

    def _real_operand(self, e: ir.Expr) -> kx.Expr:
        if kind(e) is ir.Kind.INT and not isinstance(e, ir.Num):
            return self.real(e)  # `(...).to(tl.float32)` is atomic
        return _atom(self.real(e), e)

    def _call(self, e: ir.Call) -> kx.Expr:
        if e.fn == grad.SIGN:
            x = self.real(e.args[0])
            zero = kx.Int(0)
            negative = kx.Where(kx.Cmp("<", x, zero), kx.Float(-1.0), kx.Float(0.0))
            return kx.Where(kx.Cmp(">", x, zero), kx.Float(1.0), negative)
        if e.fn == grad.SELECT:
            cond, a, b = e.args
            return kx.Where(self.expr(cond), self.real(a), self.real(b))
        if e.fn == ir.SOFTCAP:
            return self._softcap(e, 1.0)
        if e.fn == "exp":  # exp(x) = exp2(log2(e) x), log2(e) folded into x's constant factor
            return kx.Call(kx.EXP2, (self.scaled(e.args[0], LOG2E),))
        if e.fn == "log" and self.fast_log:
            return kx.Call(kx.LOG, (self.real(e.args[0]),))
        if e.fn in _REAL_CALLS:
            return kx.Call(_REAL_CALLS[e.fn], (self.real(e.args[0]),))
        if e.fn == "abs":
            if self.keys_before_queries and clean(affine(e.args[0]) or {}) in K_MINUS_Q:
                return kx.Paren(kx.sub(Q_POS, K_POS))
            return kx.Abs(self.expr(e.args[0]))
        fn = kx.Min if e.fn == "min" else kx.Max
        if kind(e) is ir.Kind.INT:
            return fn(self.expr(e.args[0]), self.expr(e.args[1]))
        return fn(self.real(e.args[0]), self.real(e.args[1]))


def _float_difference(a: kx.Var, b: kx.Var) -> kx.Expr:
    """a - b of two position tensors as float32, each converted on its own:
    `(a.to(tl.float32) - b.to(tl.float32))`.  The same bits as `(a - b).to(
    tl.float32)`: positions lie within +-MAX_SEQ_LEN = 2^24, where float32
    holds every integer, and a float subtraction rounds the exact difference
    once, as the conversion does.  A tile's positions are a column and a row
    (q_pos (M, 1), k_pos (1, N)), so the conversions, a quarter-rate
    instruction on recent GPUs, run per row and per column rather than per
    pair, and each pair costs one float subtraction instead of an integer
    subtraction and a conversion."""
    return kx.Paren(kx.sub(kx.Cast(a, _F32), kx.Cast(b, _F32)))


_S = ir.Name("s")


@dataclass(frozen=True)
class ScoreCode:
    """The score as the kernels compute it (see KernelModel)."""

    kind: ScoreKind
    # log2(e) times the bias (ADDITIVE) or times f(s) (GENERAL); None for IDENTITY.
    log2: kx.Expr | None
    # d score / d s for GENERAL scores (None when it is the constant 1).
    grad: kx.Expr | None
    # Locals computed before `log2` and before `grad`: each function call
    # that either makes more than once (`tanh0 = _tanh(s * 0.1)`).
    lines: tuple[kx.Assign, ...] = ()
    grad_lines: tuple[kx.Assign, ...] = ()

    def trees(self) -> list[kx.Stmt | kx.Expr | None]:
        return [*self.lines, self.log2, *self.grad_lines, self.grad]

    @property
    def grad_uses_s(self) -> bool:
        """Whether the derivative reads s (softcap's reads the score s2 back
        instead)."""
        code = [*self.grad_lines, self.grad]
        return self.grad is not None and any(
            isinstance(x, kx.Var) and x.name == S.name for x in kx.walk_code(code)
        )

    @property
    def uses_alibi(self) -> bool:
        return any(
            isinstance(x, kx.Var) and x.name == ALIBI_SLOPE.name for x in kx.walk_code(self.trees())
        )

    @property
    def needs_tanh(self) -> bool:
        return kx.calls(self.trees(), kx.TANH)

    @property
    def needs_log(self) -> bool:
        """Whether the code calls the module's `_log` (16-bit modules)."""
        return kx.calls(self.trees(), kx.LOG)


# The local that holds a shared call of each function (`tanh0`, `exp1`): no
# name a kernel passes to the score functions ends in a digit but the
# inputs' (`rel_ptr`, never bare `rel`).
_SHARED_NAMES = {kx.TANH: "tanh", kx.EXP2: "exp", kx.LOG: "log", "tl.log": "log", "tl.sqrt": "sqrt"}


def share_calls(root: kx.Expr | None) -> tuple[tuple[kx.Assign, ...], kx.Expr | None]:
    """(lines, root'): each function call that `root` makes more than once
    computed once into a local (inner calls first), and root reading it."""
    if root is None:
        return (), None
    counts: dict[kx.Call, int] = {}
    for x in kx.walk(root):
        if isinstance(x, kx.Call) and x.fn in _SHARED_NAMES:
            counts[x] = counts.get(x, 0) + 1
    names: dict[kx.Expr, kx.Var] = {}
    lines: list[kx.Assign] = []
    numbers: dict[str, int] = {}

    def rebuild(e: kx.Expr) -> kx.Expr:
        if e in names:
            return names[e]
        rebuilt = _with_children(e, [rebuild(c) for c in kx.children(e)])
        if isinstance(e, kx.Call) and counts.get(e, 0) > 1:
            stem = _SHARED_NAMES[e.fn]
            number = numbers.get(stem, 0)
            numbers[stem] = number + 1
            names[e] = kx.Var(f"{stem}{number}")
            lines.append(kx.Assign(names[e].name, rebuilt))
            return names[e]
        return rebuilt

    rebuilt = rebuild(root)
    return tuple(lines), rebuilt


def _with_children(e: kx.Expr, kids: list[kx.Expr]) -> kx.Expr:
    """`e` with its children (in `kx.children`'s order) replaced."""
    if not kids or kids == list(kx.children(e)):
        return e
    if isinstance(e, (kx.Neg, kx.Paren, kx.Abs, kx.Not)):
        return type(e)(kids[0])
    if isinstance(e, (kx.FloorDiv, kx.FloorMod)):
        return type(e)(kids[0], e.divisor)
    if isinstance(e, kx.Cast):
        return kx.Cast(kids[0], e.dtype)
    if isinstance(e, kx.Where):
        return kx.Where(*kids)
    if isinstance(e, kx.Call):
        return kx.Call(e.fn, tuple(kids))
    if isinstance(e, kx.Load):
        return kx.Load(e.input, tuple(kids))
    if isinstance(e, (kx.Arith, kx.Cmp)):
        return type(e)(e.op, *kids)
    return type(e)(*kids)  # Min, Max, And, Or


def score_code(score: ir.Expr, elements: ElementCode) -> ScoreCode:
    """The score's kind, its code in log2 units and the code of its
    derivative with respect to s, from the simplified score."""
    score_kind, expr = _score_parts(simplify(score))
    if score_kind is ScoreKind.IDENTITY:
        return ScoreCode(score_kind, None, None)
    log2 = elements.scaled(expr, LOG2E)
    if score_kind is ScoreKind.GENERAL and not grad.depends_on_s(expr):
        # A score without s (`2.0`, `q * 0.5`, `h`) may be a scalar or one
        # row or column; the softmax needs it broadcast to the tile.  s is
        # finite, so s * 0.0 adds nothing but the shape (and its layout).
        log2 = kx.add(kx.mul(S, kx.Float(0.0)), kx.Paren(log2))
    derivative: kx.Expr | None = None
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
        t = kx.Paren(kx.mul(S2, kx.Float(inverse)))
        squared = kx.mul(t, t)
        derivative = kx.sub(kx.Float(1.0), squared if exact else kx.Min(squared, kx.Float(1.0)))
    elif score_kind is ScoreKind.GENERAL:
        d = simplify(grad.derivative(expr))
        if d != grad.ONE and constant_value(d) != 1:
            read_back = _read_back(expr) if READ_BACK_SCORE else None
            if read_back is not None:
                elements = elements.reading(expr, read_back)
            derivative = elements.real(d)
    lines, log2 = share_calls(log2)
    grad_lines, derivative = share_calls(derivative)
    return ScoreCode(score_kind, log2, derivative, lines, grad_lines)


# The derivative reads the score back from s2 where it contains the score
# itself (d exp(u) = exp(u) u', d tanh(u) = (1 - tanh(u)^2) u', d sqrt(a) =
# a' / (2 sqrt(a))) instead of computing it again.  LLVM already computes the
# call once; this frees the registers that kept its value live (decision 077:
# an experiment, off until measured by scripts/gpu_read_back.sh).
READ_BACK_SCORE = False
_READ_BACK_CALLS = ("exp", "tanh", "sqrt")


def _read_back(expr: ir.Expr) -> kx.Expr | None:
    """The score `expr`'s value read back from s2 = fl32(log2(e)) * expr (the
    code `ElementCode.scaled` gives a call), or None for other scores.  tanh
    reads back through `tanh_reader`, so that a saturated tanh reads as
    exactly +-1 and 1 - tanh^2 as 0; the others within an ulp or two."""
    if not (isinstance(expr, ir.Call) and expr.fn in _READ_BACK_CALLS):
        return None
    if expr.fn == "tanh":
        inverse, exact = tanh_reader(LOG2E)
        if not exact:
            return None
    else:
        inverse = _f32(1.0 / _f32(LOG2E))
    return kx.Paren(kx.mul(S2, kx.Float(inverse)))


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
