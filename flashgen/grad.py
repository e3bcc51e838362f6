"""Symbolic differentiation of a score expression with respect to `s`, or
to one read of a learnable input (`rel[h, min(q - k, 31)]`, compared as an
expression, so equal reads are one variable).

In: a checked score expression (`ir.Expr`).  Out: the expression for
d score / d s (or d score / d read), as IR, simplified so that the generated backward reads like
hand-written code (`softcap(s, c)` gives `1 - tanh(s / c) * tanh(s / c)`,
`s + alibi` gives the constant 1).

Rules (x' is the derivative of x):

    s' = 1, and 0 for literals, q, k, h, H, alibi and every integer expression
    (with respect to a read: the read' = 1, s' = 0)
    (a + b)' = a' + b'            (a * b)' = a' b + a b'
    (a / b)' = a' / b - a b' / b^2
    tanh(a)' = (1 - tanh(a)^2) a'   exp(a)' = exp(a) a'
    log(a)'  = a' / a               sqrt(a)' = a' / (2 sqrt(a))
    softcap(a, c)' = (1 - tanh(a / c)^2) a'

Subgradient conventions, the same as PyTorch's autograd so that the dense
reference's gradients are the specification:

    abs(a)'    = sign(a) a', with sign(0) = 0
    min(a, b)' = a' where a < b, b' where b < a, (a' + b') / 2 where a == b
    max(a, b)' likewise with >

Two internal functions appear only in derivatives, never in specs (the
checker rejects them as unknown): `sign(x)` and `select(cond, a, b)`.
"""

from __future__ import annotations

from flashgen import ir

SIGN = "sign"
SELECT = "select"

ZERO = ir.Num(0)
ONE = ir.Num(1)


def _is(e: ir.Expr, value: float) -> bool:
    return isinstance(e, ir.Num) and e.value == value


def _num(value: float) -> ir.Expr:
    if value < 0:
        return ir.Unary(ir.UnaryOp.NEG, ir.Num(-value))
    return ir.Num(value)


def _value(e: ir.Expr) -> float | None:
    if isinstance(e, ir.Num):
        return e.value
    if isinstance(e, ir.Unary) and e.op is ir.UnaryOp.NEG and isinstance(e.operand, ir.Num):
        return -e.operand.value
    return None


def add(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    if _is(a, 0):
        return b
    if _is(b, 0):
        return a
    va, vb = _value(a), _value(b)
    if va is not None and vb is not None:
        return _num(va + vb)
    return ir.Binary(ir.BinOp.ADD, a, b)


def neg(a: ir.Expr) -> ir.Expr:
    va = _value(a)
    if va is not None:
        return _num(-va)
    if isinstance(a, ir.Unary) and a.op is ir.UnaryOp.NEG:
        return a.operand
    return ir.Unary(ir.UnaryOp.NEG, a)


def sub(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    if _is(b, 0):
        return a
    if _is(a, 0):
        return neg(b)
    va, vb = _value(a), _value(b)
    if va is not None and vb is not None:
        return _num(va - vb)
    return ir.Binary(ir.BinOp.SUB, a, b)


def mul(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    if _is(a, 0) or _is(b, 0):
        return ZERO
    if _is(a, 1):
        return b
    if _is(b, 1):
        return a
    va, vb = _value(a), _value(b)
    if va is not None and vb is not None:
        return _num(va * vb)
    return ir.Binary(ir.BinOp.MUL, a, b)


def div(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    if _is(a, 0):
        return ZERO
    if _is(b, 1):
        return a
    return ir.Binary(ir.BinOp.DIV, a, b)


def select(cond: ir.Expr, a: ir.Expr, b: ir.Expr) -> ir.Expr:
    if a == b:
        return a
    return ir.Call(SELECT, (cond, a, b))


S = ir.Name(ir.SCORE_VARIABLE)


def depends_on_s(e: ir.Expr) -> bool:
    return ir.mentions(e, frozenset({ir.SCORE_VARIABLE}))


def _contains(e: ir.Expr, part: ir.Expr) -> bool:
    if e == part:
        return True
    if isinstance(e, (ir.Name, ir.Num)):
        return False
    if isinstance(e, ir.Unary):
        return _contains(e.operand, part)
    if isinstance(e, ir.Binary):
        return _contains(e.left, part) or _contains(e.right, part)
    return any(_contains(a, part) for a in e.args)


def derivative(e: ir.Expr, wrt: ir.Expr = S) -> ir.Expr:
    """d e / d wrt, simplified; `wrt` is `s` or a read of a real input."""
    if not _contains(e, wrt):
        return ZERO
    if e == wrt:
        return ONE
    if isinstance(e, ir.Unary):  # NEG; NOT cannot reach a score
        return neg(derivative(e.operand, wrt))
    if isinstance(e, ir.Binary):
        return _binary(e, wrt)
    return _call(e, wrt)


def _binary(e: ir.Binary, wrt: ir.Expr) -> ir.Expr:
    a, b = e.left, e.right
    da, db = derivative(a, wrt), derivative(b, wrt)
    if e.op is ir.BinOp.ADD:
        return add(da, db)
    if e.op is ir.BinOp.SUB:
        return sub(da, db)
    if e.op is ir.BinOp.MUL:
        return add(mul(da, b), mul(a, db))
    if e.op is ir.BinOp.DIV:
        if _is(db, 0):
            return div(da, b)
        return sub(div(da, b), div(mul(a, db), mul(b, b)))
    raise ValueError(f"cannot differentiate {e.op.value!r}")


def _call(e: ir.Call, wrt: ir.Expr) -> ir.Expr:
    a = e.args[0]
    da = derivative(a, wrt)
    if e.fn == "tanh":
        return mul(sub(ONE, mul(e, e)), da)
    if e.fn == ir.SOFTCAP:
        t = ir.Call("tanh", (ir.Binary(ir.BinOp.DIV, a, e.args[1]),))
        return mul(sub(ONE, mul(t, t)), da)
    if e.fn == "exp":
        return mul(e, da)
    if e.fn == "log":
        return div(da, a)
    if e.fn == "sqrt":
        return div(da, mul(ir.Num(2.0), e))
    if e.fn == "abs":
        return mul(ir.Call(SIGN, (a,)), da)
    if e.fn in ("min", "max"):
        b = e.args[1]
        db = derivative(b, wrt)
        first = ir.BinOp.LT if e.fn == "min" else ir.BinOp.GT
        second = ir.Binary(first, b, a)
        tie = mul(ir.Num(0.5), add(da, db))
        return select(ir.Binary(first, a, b), da, select(second, db, tie))
    raise ValueError(f"cannot differentiate {e.fn}()")
