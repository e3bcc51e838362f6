"""Kernel-side scalar and element code as data: an expression IR, its Triton
printer and an evaluator.

The lowering builds these trees (tile classification, loop bounds), reads
facts off them (`uses`, `needs_floor_helpers`), and prints them to Triton
source in one place at the end.  A tree is the parse tree of its own printed
text: the printer adds the parentheses Python's precedence requires, and
`Paren` records the ones the generated code has beyond that (`-(hi)`,
`(x) * (y)`), so that evaluating a tree computes exactly what the kernel
computes, operation by operation, in the same order.

The builders (`add`, `and_`, `or_`, `not_`, `combine`, `linear`) do the
simplifications the lowering relies on: constant truth folding, dropping
a repeated bound, left-associating sums.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Union

import numpy as np

# --------------------------------------------------------------------------- #
# Nodes
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class Var:
    """A name the kernel defines (`q_lo`, `head`, `mod3_lo`)."""

    name: str


@dataclass(frozen=True)
class Int:
    value: int


@dataclass(frozen=True)
class Float:
    value: float


@dataclass(frozen=True)
class Bool:
    value: bool


@dataclass(frozen=True)
class Arith:
    """An integer or real binary operator: + - * / << >> and bitwise &
    (`/` on reals only)."""

    op: str
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Neg:
    operand: Expr


@dataclass(frozen=True)
class Paren:
    """Parentheses the code has where precedence does not need them."""

    operand: Expr


@dataclass(frozen=True)
class FloorDiv:
    """operand div divisor (floor), divisor > 0: a shift for powers of two,
    else the module's `_floor_div` helper."""

    operand: Expr
    divisor: int


@dataclass(frozen=True)
class FloorMod:
    """operand mod divisor (floor, in [0, divisor)): a bitwise & for powers of
    two, else the module's `_floor_mod` helper."""

    operand: Expr
    divisor: int


@dataclass(frozen=True)
class Min:
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Max:
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Abs:
    operand: Expr


@dataclass(frozen=True)
class Where:
    cond: Expr
    then: Expr
    otherwise: Expr


@dataclass(frozen=True)
class Cmp:
    op: str  # "<=", "<", ">=", ">", "==", "!="
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Not:
    operand: Expr


@dataclass(frozen=True)
class And:
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Or:
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Call:
    """A kernel function of real arguments: `tl.exp`, `tl.sqrt`, `_tanh`..."""

    fn: str
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class Load:
    """An element of a declared input at the given indices, read through the
    module's `_read_<input>` helper (masked: an index out of range reads 0)."""

    input: str
    indices: tuple[Expr, ...]


@dataclass(frozen=True)
class Cast:
    """`operand.to(dtype)`, dtype as the kernel spells it (`tl.int64`)."""

    operand: Expr
    dtype: str


Expr = Union[
    Var, Int, Float, Bool, Arith, Neg, Paren, FloorDiv, FloorMod, Min, Max, Abs, Where, Cmp,
    Not, And, Or, Call, Cast, Load,
]  # fmt: skip


@dataclass(frozen=True)
class Assign:
    """One line of scalar code: `name = value`."""

    name: str
    value: Expr


@dataclass(frozen=True)
class Comment:
    text: str


Stmt = Union[Assign, Comment]

TRUE, FALSE = Bool(True), Bool(False)
# The module's tanh (a Triton function: tl has none), its log (16-bit
# modules: lg2.approx.f32 on the GPU) and exp2 (exp with log2(e) folded).
TANH = "_tanh"
LOG = "_log"
EXP2 = "tl.math.exp2"
# A position no tile reaches: (-FAR, FAR) holds every position, (FAR, -FAR) none.
FAR = Paren(Arith("<<", Int(1), Int(30)))


def power_of_two(c: int) -> bool:
    return c > 0 and c & (c - 1) == 0


# --------------------------------------------------------------------------- #
# Builders with the lowering's simplifications
# --------------------------------------------------------------------------- #


def not_(a: Expr) -> Expr:
    return Bool(not a.value) if isinstance(a, Bool) else Not(a)


def and_(a: Expr, b: Expr) -> Expr:
    if FALSE in (a, b):
        return FALSE
    if a == TRUE:
        return b
    return a if b == TRUE else And(a, b)


def or_(a: Expr, b: Expr) -> Expr:
    if TRUE in (a, b):
        return TRUE
    if a == FALSE:
        return b
    return a if b == FALSE else Or(a, b)


def add(a: Expr, b: Expr) -> Expr:
    """a + b, with a sum b re-associated to the left (`a + x - 3` is read by
    Python as (a + x) - 3, and so it is built)."""
    if isinstance(b, Arith) and b.op in ("+", "-"):
        return Arith(b.op, add(a, b.left), b.right)
    return Arith("+", a, b)


def sub(a: Expr, b: Expr) -> Expr:
    return Arith("-", a, b)


def mul(a: Expr, b: Expr) -> Expr:
    return Arith("*", a, b)


def combine(a: Expr | None, b: Expr | None, fn: type[Min] | type[Max]) -> Expr | None:
    """fn(a, b) for two optional bounds (None: unbounded), one of two equal."""
    if a is None or a == b:
        return b
    if b is None:
        return a
    return fn(a, b)


def linear(terms: list[tuple[int, Expr]], const: int) -> Expr:
    """sum(c * x) + const, as `3 * q_hi - k_lo + 2`."""
    out: Expr | None = None
    for c, x in terms:
        mag = abs(c)
        term = x if mag == 1 else mul(Int(mag), x)
        if out is None:
            out = term if c > 0 else (Neg(x) if mag == 1 else mul(Int(-mag), x))
        else:
            out = Arith("+" if c > 0 else "-", out, term)
    if out is None:
        return Int(const)
    if const:
        out = Arith("+" if const > 0 else "-", out, Int(abs(const)))
    return out


# --------------------------------------------------------------------------- #
# Walking
# --------------------------------------------------------------------------- #


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, (Var, Int, Float, Bool)):
        return ()
    if isinstance(e, (Neg, Paren, FloorDiv, FloorMod, Abs, Not, Cast)):
        return (e.operand,)
    if isinstance(e, Where):
        return (e.cond, e.then, e.otherwise)
    if isinstance(e, Call):
        return e.args
    if isinstance(e, Load):
        return e.indices
    return (e.left, e.right)


def walk(e: Expr) -> Iterator[Expr]:
    """Every node of `e`, parents first."""
    stack = [e]
    while stack:
        x = stack.pop()
        yield x
        stack.extend(reversed(children(x)))


def walk_code(code: list[Stmt | Expr | None]) -> Iterator[Expr]:
    for item in code:
        if isinstance(item, Assign):
            yield from walk(item.value)
        elif item is not None and not isinstance(item, Comment):
            yield from walk(item)


def needs_floor_helpers(code: list[Stmt | Expr | None]) -> bool:
    """Does the code call `_floor_div` / `_floor_mod` (a divisor that is not
    a power of two)?"""
    return any(
        isinstance(x, (FloorDiv, FloorMod)) and not power_of_two(x.divisor) for x in walk_code(code)
    )


def calls(code: list[Stmt | Expr | None], fn: str) -> bool:
    """Does the code call the function `fn` (a `Call` node)?"""
    return any(isinstance(x, Call) and x.fn == fn for x in walk_code(code))


def uses(e: Expr, name: str) -> bool:
    """Does `e` read the kernel variable `name`?"""
    return any(isinstance(x, Var) and x.name == name for x in walk(e))


# --------------------------------------------------------------------------- #
# Printer
# --------------------------------------------------------------------------- #

_CMP, _OR, _AND, _SHIFT, _ADD, _MUL, _UNARY, _ATOM = 1, 2, 4, 5, 6, 7, 8, 10
_ARITH = {"+": _ADD, "-": _ADD, "*": _MUL, "/": _MUL, "<<": _SHIFT, ">>": _SHIFT, "&": _AND}


def float_literal(x: float) -> str:
    """A Python float literal that Triton, its interpreter and Gluon all read
    as the same float32 constant (infinities and NaN as `float("...")`)."""
    x = float(x)
    if math.isnan(x):
        return 'float("nan")'
    if math.isinf(x):
        return 'float("inf")' if x > 0 else 'float("-inf")'
    return repr(x)


def to_source(e: Expr) -> str:
    """Triton source for `e`."""
    return _print(e)[0]


def stmt_source(s: Stmt) -> str:
    if isinstance(s, Comment):
        return f"# {s.text}"
    return f"{s.name} = {_unwrapped(to_source(s.value))}"


def _unwrapped(text: str) -> str:
    """`text` without parentheses around all of it (an assignment needs none)."""
    while text.startswith("(") and _closing(text) == len(text) - 1:
        text = text[1:-1]
    return text


def _closing(text: str) -> int:
    """Index of the parenthesis that closes text[0]."""
    depth = 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return i
    return -1


def _wrap(e: Expr, least: int) -> str:
    text, prec = _print(e)
    return text if prec >= least else f"({text})"


def _print(e: Expr) -> tuple[str, int]:
    if isinstance(e, Var):
        return e.name, _ATOM
    if isinstance(e, Int):
        return str(e.value), _UNARY if e.value < 0 else _ATOM
    if isinstance(e, Float):
        text = float_literal(e.value)
        return text, _UNARY if text.startswith("-") else _ATOM
    if isinstance(e, Bool):
        return str(e.value), _ATOM
    if isinstance(e, Paren):
        return f"({to_source(e.operand)})", _ATOM
    if isinstance(e, Arith):
        p = _ARITH[e.op]
        return f"{_wrap(e.left, p)} {e.op} {_wrap(e.right, p + 1)}", p
    if isinstance(e, Neg):
        return f"-{_wrap(e.operand, _UNARY)}", _UNARY
    if isinstance(e, FloorDiv):
        if power_of_two(e.divisor):
            return f"({_grouped(e.operand)} >> {e.divisor.bit_length() - 1})", _ATOM
        return f"_floor_div({to_source(e.operand)}, {e.divisor})", _ATOM
    if isinstance(e, FloorMod):
        if power_of_two(e.divisor):
            return f"({_grouped(e.operand)} & {e.divisor - 1})", _ATOM
        return f"_floor_mod({to_source(e.operand)}, {e.divisor})", _ATOM
    if isinstance(e, (Min, Max)):
        fn = "tl.minimum" if isinstance(e, Min) else "tl.maximum"
        return f"{fn}({to_source(e.left)}, {to_source(e.right)})", _ATOM
    if isinstance(e, Abs):
        return f"tl.abs({to_source(e.operand)})", _ATOM
    if isinstance(e, Where):
        args = ", ".join(to_source(x) for x in (e.cond, e.then, e.otherwise))
        return f"tl.where({args})", _ATOM
    if isinstance(e, Cmp):
        return f"{_wrap(e.left, _CMP + 1)} {e.op} {_wrap(e.right, _CMP + 1)}", _CMP
    if isinstance(e, Not):
        return f"~({to_source(e.operand)})", _UNARY
    if isinstance(e, (And, Or)):
        op, p = ("&", _AND) if isinstance(e, And) else ("|", _OR)
        return f"({to_source(e.left)}) {op} ({to_source(e.right)})", p
    if isinstance(e, Call):
        return f"{e.fn}({', '.join(to_source(a) for a in e.args)})", _ATOM
    if isinstance(e, Load):
        args = [to_source(i) for i in e.indices] + [f"{e.input}{x}" for x in INPUT_PARTS]
        return f"{read_helper(e.input)}({', '.join(args)})", _ATOM
    assert isinstance(e, Cast), e
    return f"{_wrap(e.operand, _ATOM)}.to({e.dtype})", _ATOM


# What a kernel holds of input `name`: `name_ptr`, and the tuples
# `name_strides` and `name_sizes` (one entry per dimension).
INPUT_PARTS = ("_ptr", "_strides", "_sizes")


def read_helper(name: str) -> str:
    """The module's function that reads input `name`."""
    return f"_read_{name}"


def _grouped(e: Expr) -> str:
    """`e` as the operand of a shift or mask: bare when it is a name or a
    number, or the negation of one."""
    simple = isinstance(e, (Var, Int)) or (isinstance(e, Neg) and isinstance(e.operand, Var))
    return to_source(e) if simple else f"({to_source(e)})"


# --------------------------------------------------------------------------- #
# Evaluator
# --------------------------------------------------------------------------- #


class NumpyOps:
    """The kernel's tl functions over numpy values (int64 for ints, float64
    standing in for float32)."""

    where = staticmethod(np.where)
    minimum = staticmethod(np.minimum)
    maximum = staticmethod(np.maximum)
    abs = staticmethod(np.abs)
    floor_div = staticmethod(np.floor_divide)
    floor_mod = staticmethod(np.mod)
    functions: Mapping[str, Callable[..., Any]] = {
        "tl.exp": np.exp,
        EXP2: np.exp2,
        "tl.log": np.log,
        LOG: np.log,
        "tl.sqrt": np.sqrt,
        TANH: np.tanh,
    }

    @staticmethod
    def cast(x: Any, dtype: str) -> Any:
        target = {"tl.int64": np.int64, "tl.float32": np.float64}[dtype]
        return np.asarray(x).astype(target)[()]

    @staticmethod
    def boolean(value: bool) -> Any:
        return np.bool_(value)


_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
    "<<": lambda a, b: a << b,
    ">>": lambda a, b: a >> b,
    "&": lambda a, b: a & b,
    "<=": lambda a, b: a <= b,
    "<": lambda a, b: a < b,
    ">=": lambda a, b: a >= b,
    ">": lambda a, b: a > b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}


def evaluate(e: Expr, env: Mapping[str, Any], ops: Any = NumpyOps) -> Any:
    """The value of `e`, its variables read from `env`, the tl functions and
    literals from `ops` (`NumpyOps` or a stand-in with the same members)."""
    ev = lambda x: evaluate(x, env, ops)  # noqa: E731
    if isinstance(e, Var):
        return env[e.name]
    if isinstance(e, (Int, Float)):
        return e.value
    if isinstance(e, Bool):
        return ops.boolean(e.value)
    if isinstance(e, Paren):
        return ev(e.operand)
    if isinstance(e, (Arith, Cmp)):
        return _BINARY[e.op](ev(e.left), ev(e.right))
    if isinstance(e, Neg):
        return -ev(e.operand)
    if isinstance(e, FloorDiv):
        if power_of_two(e.divisor):
            return ev(e.operand) >> (e.divisor.bit_length() - 1)
        return ops.floor_div(ev(e.operand), e.divisor)
    if isinstance(e, FloorMod):
        if power_of_two(e.divisor):
            return ev(e.operand) & (e.divisor - 1)
        return ops.floor_mod(ev(e.operand), e.divisor)
    if isinstance(e, Min):
        return ops.minimum(ev(e.left), ev(e.right))
    if isinstance(e, Max):
        return ops.maximum(ev(e.left), ev(e.right))
    if isinstance(e, Abs):
        return ops.abs(ev(e.operand))
    if isinstance(e, Where):
        return ops.where(ev(e.cond), ev(e.then), ev(e.otherwise))
    if isinstance(e, Not):
        return ~ev(e.operand)
    if isinstance(e, And):
        return ev(e.left) & ev(e.right)
    if isinstance(e, Or):
        return ev(e.left) | ev(e.right)
    if isinstance(e, Call):
        return ops.functions[e.fn](*(ev(a) for a in e.args))
    if isinstance(e, Load):
        return ops.read(e.input, *(ev(i) for i in e.indices))
    assert isinstance(e, Cast), e
    return ops.cast(ev(e.operand), e.dtype)


def run(code: list[Stmt], env: dict[str, Any], ops: Any = NumpyOps) -> dict[str, Any]:
    """Execute scalar code: each assignment adds its name to `env`."""
    for s in code:
        if isinstance(s, Assign):
            env[s.name] = evaluate(s.value, env, ops)
    return env
