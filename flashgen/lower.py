"""Analysis and lowering: a checked `Variant` in, a frozen view-model out.

Every decision about the generated kernel is made here, in Python; the Jinja
template only loops and branches over the `KernelModel` this module returns.
Three pieces of analysis happen on the way:

* **Element code.**  The mask and the score expression are translated into
  Triton expressions over the tile's position vectors (`q_pos`, `k_pos`), the
  query head (`head`, `num_heads`) and the scaled score `s`.  Expressions
  without variables are folded to one literal (`constant_value`), an int in
  integer contexts and a float in real ones, so that no Python constant
  meets `.to()` or a tl function in any backend.

* **Tile classification.**  Each integer sub-expression of the mask gets an
  interval over a (query tile x key tile) rectangle, and each boolean one a
  pair (`must`, `may`): true for every pair in the rectangle / for at least
  one.  Affine sub-expressions are normalised to sum(c_i * v_i) + c0 first, so
  their intervals are exact (q - k over two independent ranges is exact);
  `div`, `%`, `abs`, `min`, `max` and products get sound (possibly loose)
  intervals.  The kernel evaluates this scalar code once per key tile:
  `must` means the tile needs no elementwise mask, `not may` that it is
  skipped without loading K or V.  See docs/MASKS.md.

* **Interior.**  The same comparisons, read the other way, give the keys
  that *every* query of a tile sees.  Key tiles inside that interval form one
  contiguous run that the kernel walks in a loop with no mask and no branch,
  which Triton can software-pipeline; only the tiles before and after it pay
  for the elementwise mask and the per-tile test.

* **Key bounds.**  Conjunctions of comparisons that bound `k` by an affine
  function of `q` (causal, windows), and `q div C == k div C` (chunks), give
  the range of key positions a query tile can see at all; the kernel's key
  loop runs only over that range.  Anything else leaves the range open and the
  per-tile test does the skipping.
"""

from __future__ import annotations

import hashlib
import math
import operator
import re
import struct
from dataclasses import dataclass

from flashgen import grad, ir
from flashgen.printer import print_expr, print_variant

LOG2E = 1.4426950408889634
FLOAT32_MAX = 3.4028234663852886e38

_TORCH_DTYPES = {
    ir.DType.FP16: "torch.float16",
    ir.DType.BF16: "torch.bfloat16",
    ir.DType.FP32: "torch.float32",
}
_TL_DTYPES = {
    ir.DType.FP16: "tl.float16",
    ir.DType.BF16: "tl.bfloat16",
    ir.DType.FP32: "tl.float32",
}


@dataclass(frozen=True)
class LaunchConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def kwargs(self) -> dict[str, int]:
        """Keyword arguments of a generated module's forward() and backward()."""
        return dict(
            block_m=self.block_m,
            block_n=self.block_n,
            num_warps=self.num_warps,
            num_stages=self.num_stages,
        )


@dataclass(frozen=True)
class Tuning:
    """Launch configurations measured by `flashgen tune` on one GPU."""

    device: str
    forward: LaunchConfig
    backward: LaunchConfig
    # What was measured: the configs apply only to this head dim and dtype.
    head_dim: int | None = None
    dtype: str | None = None
    # Whether TMA loads were faster (None: not measured, keep the default).
    forward_tma: bool | None = None
    backward_tma: bool | None = None


@dataclass(frozen=True)
class KernelModel:
    """Everything the module template needs, already decided."""

    name: str
    spec_text: str
    spec_hash: str
    torch_dtype: str
    tl_dtype: str
    head_dim: int
    head_dim_pad: int
    default_scale: float
    # Call-time limits (ir.MAX_SEQ_LEN, ir.MAX_HEADS) that the module enforces.
    max_seq_len: int
    max_heads: int
    bottom_right: bool
    rescale_threshold: float
    # input_precision of every tl.dot, or None for the operands' own: float32
    # specs keep IEEE products (three TF32 products, "tf32x3", were 5-10x
    # faster but failed the float32 error rule: BENCHMARKS.md, entry 15).
    dot_precision: str | None
    # Score.  `score_kind` is "identity" (s), "additive" (s + bias) or
    # "general" (any f(s)); `score_log2_code` is log2(e) times the bias for
    # "additive" and log2(e) times f(s) for "general".
    score_kind: str
    score_log2_code: str
    # d score / d s for "general" scores (None when it is the constant 1).
    score_grad_code: str | None
    # The score can be NaN at s = 0 (sqrt, log or a division by a non-constant):
    # padded query rows (q = 0) then need p = 0 explicitly in the dK/dV kernel.
    score_nan_at_zero: bool
    score_grad_uses_s: bool
    uses_alibi: bool
    uses_positions: bool
    # Mask.
    mask_is_full: bool
    mask_code: str
    tile_lines: tuple[str, ...]
    tile_full: str
    tile_may: str
    key_lo: str | None
    key_hi: str | None
    # Query positions that can see a key tile (bounds the backward's dK/dV loop).
    query_lo: str | None
    query_hi: str | None
    # Keys that every query of a query tile sees (and the converse): tiles
    # wholly inside run in a branch-free loop without the elementwise mask.
    # `*_interior` is False when the analysis finds no such interval; a side
    # that is None is unbounded.
    key_interior: bool
    key_full_lo: str | None
    key_full_hi: str | None
    query_interior: bool
    query_full_lo: str | None
    query_full_hi: str | None
    # Every tile inside the key (and query) bounds has a visible pair.
    bounds_dense: bool
    # Helpers the element code calls.
    needs_floor_div: bool
    needs_tanh: bool
    # tanh keeps its relative accuracy near 0 (a polynomial branch) for
    # float32 specs and wherever its error is amplified (see `_tanh_small_poly`);
    # for 16-bit softcaps with a moderate cap an absolute error of ~2^-22 is
    # far below the inputs' rounding, and the branch costs 15-20% of the kernel.
    tanh_small_poly: bool
    gpu_config: LaunchConfig
    cpu_config: LaunchConfig
    gpu_bwd_config: LaunchConfig
    gpu_tma: bool
    gpu_bwd_tma: bool
    tuned_on: str | None  # GPU name when the configs come from `flashgen tune`
    # The warp-specialized Gluon forward for Hopper ("full", "causal", "any"),
    # or None (see `_gluon_forward`), and its number of K/V buffers.
    gluon_forward: str | None = None
    gluon_stages: int = 3
    # The fewest keys a call needs for the Gluon forward (0: any number).
    gluon_min_keys: int = 0
    # The warp-specialized Gluon backward for Hopper (see `_gluon_backward`),
    # its streamed buffers (dK/dV kernel, dQ kernel), and whether its dQ CTAs
    # take the last query rows first (they see the most keys).
    gluon_backward: bool = False
    gluon_bwd_stages: tuple[int, int] = (3, 2)
    gluon_dq_heavy_last: bool = False


# --------------------------------------------------------------------------- #
# Expression utilities
# --------------------------------------------------------------------------- #

_INT_OPS = {ir.BinOp.ADD, ir.BinOp.SUB, ir.BinOp.MUL, ir.BinOp.FLOORDIV, ir.BinOp.MOD}


def _kind(e: ir.Expr) -> ir.Kind:
    """Kind of a checked expression (the checker has rejected mixes)."""
    if isinstance(e, ir.Num):
        return ir.Kind.INT if isinstance(e.value, int) else ir.Kind.REAL
    if isinstance(e, ir.Name):
        if e.id in ir.INT_VARIABLES:
            return ir.Kind.INT
        if e.id in ir.NAMED_MASKS:
            return ir.Kind.BOOL
        return ir.Kind.REAL  # s, alibi
    if isinstance(e, ir.Unary):
        return ir.Kind.BOOL if e.op is ir.UnaryOp.NOT else _kind(e.operand)
    if isinstance(e, ir.Binary):
        if e.op in ir.COMPARISONS or e.op in (ir.BinOp.AND, ir.BinOp.OR):
            return ir.Kind.BOOL
        if e.op in _INT_OPS and _kind(e.left) is _kind(e.right) is ir.Kind.INT:
            return ir.Kind.INT
        return ir.Kind.REAL
    if e.fn in ir.MASK_FUNCTIONS:
        return ir.Kind.BOOL
    if e.fn in (grad.SIGN, grad.SELECT):
        return ir.Kind.REAL
    if e.fn in ir.POLY_FUNCTIONS and all(_kind(a) is ir.Kind.INT for a in e.args):
        return ir.Kind.INT
    return ir.Kind.REAL


def _int_arg(e: ir.Expr) -> int:
    assert isinstance(e, ir.Num) and isinstance(e.value, int), e
    return e.value


def _cmp(op: ir.BinOp, a: ir.Expr, b: ir.Expr) -> ir.Expr:
    return ir.Binary(op, a, b)


_Q, _K = ir.Name("q"), ir.Name("k")
TRUE = ir.Name("full")


def desugar_mask(e: ir.Expr) -> ir.Expr:
    """Replace named masks by the comparisons that define them."""
    if isinstance(e, ir.Name):
        if e.id == "causal":
            return _cmp(ir.BinOp.LE, _K, _Q)
        return e
    if isinstance(e, ir.Call) and e.fn in ir.MASK_FUNCTIONS:
        vals = [_int_arg(a) for a in e.args]
        if e.fn == "window":
            left, right = vals[0], vals[1] if len(vals) > 1 else 0
            upper = ir.Binary(ir.BinOp.ADD, _Q, ir.Num(right)) if right else _Q
            return ir.Binary(
                ir.BinOp.AND,
                _cmp(ir.BinOp.GE, _K, ir.Binary(ir.BinOp.SUB, _Q, ir.Num(left))),
                _cmp(ir.BinOp.LE, _K, upper),
            )
        if e.fn == "prefix":
            return _cmp(ir.BinOp.LT, _K, ir.Num(vals[0]))
        c = ir.Num(vals[0])  # chunk
        return _cmp(
            ir.BinOp.EQ,
            ir.Binary(ir.BinOp.FLOORDIV, _Q, c),
            ir.Binary(ir.BinOp.FLOORDIV, _K, c),
        )
    if isinstance(e, ir.Unary):
        return ir.Unary(e.op, desugar_mask(e.operand))
    if isinstance(e, ir.Binary) and e.op in (ir.BinOp.AND, ir.BinOp.OR):
        return _dedupe(ir.Binary(e.op, desugar_mask(e.left), desugar_mask(e.right)))
    return e


def _dedupe(e: ir.Binary) -> ir.Expr:
    """Drop repeated operands of an & or | chain (`causal & window(L)`)."""

    def operands(x: ir.Expr) -> list[ir.Expr]:
        if isinstance(x, ir.Binary) and x.op is e.op:
            return operands(x.left) + operands(x.right)
        return [x]

    unique: list[ir.Expr] = []
    for x in operands(e):
        if x not in unique:
            unique.append(x)
    out = unique[0]
    for x in unique[1:]:
        out = ir.Binary(e.op, out, x)
    return out


_NEGATED = {
    ir.BinOp.EQ: ir.BinOp.NE,
    ir.BinOp.NE: ir.BinOp.EQ,
    ir.BinOp.LT: ir.BinOp.GE,
    ir.BinOp.GE: ir.BinOp.LT,
    ir.BinOp.LE: ir.BinOp.GT,
    ir.BinOp.GT: ir.BinOp.LE,
}


def negation_normal_form(e: ir.Expr, negate: bool = False) -> ir.Expr:
    """Push `!` down to the comparisons of a desugared mask (De Morgan)."""
    if isinstance(e, ir.Unary) and e.op is ir.UnaryOp.NOT:
        return negation_normal_form(e.operand, not negate)
    if isinstance(e, ir.Binary) and e.op in (ir.BinOp.AND, ir.BinOp.OR):
        op = e.op
        if negate:
            op = ir.BinOp.OR if op is ir.BinOp.AND else ir.BinOp.AND
        return ir.Binary(
            op,
            negation_normal_form(e.left, negate),
            negation_normal_form(e.right, negate),
        )
    if negate and isinstance(e, ir.Binary) and e.op in _NEGATED:
        return ir.Binary(_NEGATED[e.op], e.left, e.right)
    if negate:
        return ir.Unary(ir.UnaryOp.NOT, e)
    return e


# Affine forms: {variable name or "": coefficient}, "" holding the constant.
Affine = dict[str, int]


def affine(e: ir.Expr) -> Affine | None:
    """sum(c_i * v_i) + c0 over q, k, h, H, or None if `e` is not affine."""
    if isinstance(e, ir.Num) and isinstance(e.value, int):
        return {"": e.value}
    if isinstance(e, ir.Name) and e.id in ir.INT_VARIABLES:
        return {e.id: 1}
    if isinstance(e, ir.Unary) and e.op is ir.UnaryOp.NEG:
        a = affine(e.operand)
        return None if a is None else {v: -c for v, c in a.items()}
    if isinstance(e, ir.Binary) and e.op in (ir.BinOp.ADD, ir.BinOp.SUB, ir.BinOp.MUL):
        a, b = affine(e.left), affine(e.right)
        if a is None or b is None:
            return None
        if e.op is ir.BinOp.MUL:
            if set(a) <= {""}:
                a, b = b, a
            if not set(b) <= {""}:
                return None
            c = b.get("", 0)
            return {v: x * c for v, x in a.items()}
        sign = 1 if e.op is ir.BinOp.ADD else -1
        out = dict(a)
        for v, x in b.items():
            out[v] = out.get(v, 0) + sign * x
        return out
    return None


def _clean(a: Affine) -> Affine:
    return {v: c for v, c in a.items() if c != 0}


def _difference(e: ir.Binary) -> Affine | None:
    """left - right of a comparison as an affine form (zero terms dropped),
    so that the comparison reads `difference op 0`; None if not affine."""
    d = affine(ir.Binary(ir.BinOp.SUB, e.left, e.right))
    return None if d is None else _clean(d)


_K_MINUS_Q = ({"k": 1, "q": -1}, {"k": -1, "q": 1})


def _k_minus_q(e: ir.Expr) -> tuple[ir.BinOp, int] | None:
    """A comparison of k - q with a constant, read as `k - q  op  bound`."""
    if not _is_comparison(e):
        return None
    d = _difference(e)
    if d is None:
        return None
    c = d.pop("", 0)
    if d not in _K_MINUS_Q:
        return None
    # sign * (k - q) + c  op  0   <=>   k - q  op'  -sign * c
    sign = d["k"]
    return (e.op if sign == 1 else _FLIPPED[e.op]), -sign * c


# --------------------------------------------------------------------------- #
# Triton code for elements
# --------------------------------------------------------------------------- #

_ELEMENT_NAMES = {"q": "q_pos", "k": "k_pos", "h": "head", "H": "num_heads", "s": "s"}
_CMP_SYMBOLS = {op: op.value for op in ir.COMPARISONS}
_REAL_CALLS = {"exp": "tl.exp", "log": "tl.log", "sqrt": "tl.sqrt", "tanh": "_tanh"}


def _float_literal(x: float) -> str:
    """A Python float literal that Triton, its interpreter and Gluon all read
    as the same float32 constant (infinities and NaN as `float("...")`)."""
    x = float(x)
    if math.isnan(x):
        return 'float("nan")'
    if math.isinf(x):
        return 'float("inf")' if x > 0 else 'float("-inf")'
    return repr(x)


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
        if _kind(e) is ir.Kind.INT:
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
            c = _int_arg(e.right)
            self.needs_floor_div |= not _power_of_two(c)
            fn = floor_div if op is ir.BinOp.FLOORDIV else floor_mod
            return fn(self.expr(e.left), c)
        if op in ir.COMPARISONS or _kind(e) is ir.Kind.INT:
            left = _atom(self.expr(e.left), e.left)
            right = _atom(self.expr(e.right), e.right)
        else:
            left, right = self._real_operand(e.left), self._real_operand(e.right)
        return f"{left} {op.value} {right}"

    def _real_operand(self, e: ir.Expr) -> str:
        if _kind(e) is ir.Kind.INT and not isinstance(e, ir.Num):
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
            if self.keys_before_queries and _clean(affine(e.args[0]) or {}) in _K_MINUS_Q:
                return "(q_pos - k_pos)"
            return f"tl.abs({self.expr(e.args[0])})"
        fn = "tl.minimum" if e.fn == "min" else "tl.maximum"
        if _kind(e) is ir.Kind.INT:
            return f"{fn}({self.expr(e.args[0])}, {self.expr(e.args[1])})"
        return f"{fn}({self.real(e.args[0])}, {self.real(e.args[1])})"


def keys_before_queries(mask: ir.Expr) -> bool:
    """Does the (desugared, NNF) mask hide every pair with k > q?

    True when an `&` chain holds a comparison that bounds k - q by 0 or
    less (causal, causal windows), or both sides of an `|` do.
    """
    if isinstance(mask, ir.Binary) and mask.op is ir.BinOp.AND:
        return keys_before_queries(mask.left) or keys_before_queries(mask.right)
    if isinstance(mask, ir.Binary) and mask.op is ir.BinOp.OR:
        return keys_before_queries(mask.left) and keys_before_queries(mask.right)
    read = _k_minus_q(mask)
    if read is None:
        return False
    op, bound = read
    return (op in (ir.BinOp.LE, ir.BinOp.EQ) and bound <= 0) or (op is ir.BinOp.LT and bound <= 1)


# --------------------------------------------------------------------------- #
# Interval code for tiles
# --------------------------------------------------------------------------- #

# Scalar names the kernel defines for the current (query tile, key tile).
_RANGES = {
    "q": ("q_lo", "q_hi"),
    "k": ("k_lo", "k_hi"),
    "h": ("head", "head"),
    "H": ("num_heads", "num_heads"),
}


# What the scalar names of tile code can hold, under the limits a generated
# module enforces at call time: positions of real and padded rows and columns,
# query heads, and the number of heads.
_POSITIONS = (-ir.POSITION_BOUND, ir.POSITION_BOUND)
_NAME_RANGES = {
    "q_lo": _POSITIONS,
    "q_hi": _POSITIONS,
    "k_lo": _POSITIONS,
    "k_hi": _POSITIONS,
    "head": (0, ir.MAX_HEADS - 1),
    "num_heads": (1, ir.MAX_HEADS),
}
_INT32 = (-(2**31), 2**31 - 1)


def _fits_int32(terms: list[tuple[int, str]], const: int) -> bool:
    """Whether every product and partial sum of sum(c * name) + const, taken
    left to right, stays in int32 over `_NAME_RANGES`.

    Check proves each integer subexpression of a spec within
    ir.INT_MAGNITUDE_MAX, but normalising to an affine form merges terms:
    `H * 16384 - 2^30 + H * 16384` has no subexpression beyond 2^30, while
    its form 32768 * H - 2^30 overflows int32 at H = 2^16.
    """
    low = high = 0
    for c, name in terms:
        a, b = (c * x for x in _NAME_RANGES[name])
        low, high = low + min(a, b), high + max(a, b)
        if min(a, b) < _INT32[0] or max(a, b) > _INT32[1]:
            return False
        if low < _INT32[0] or high > _INT32[1]:
            return False
    return _INT32[0] <= low + const and high + const <= _INT32[1]


def _linear(terms: list[tuple[int, str]], const: int) -> str:
    """Readable code for sum(c * name) + const, in int64 where int32 might
    overflow (see `_fits_int32`; never for the masks people write)."""
    if terms and not _fits_int32(terms, const):
        (c, name), *rest = terms
        terms = [(c, f"{name}.to(tl.int64)"), *rest]
    parts: list[str] = []
    for c, name in terms:
        mag = abs(c)
        term = name if mag == 1 else f"{mag} * {name}"
        if not parts:
            parts.append(term if c > 0 else f"-{term}")
        else:
            parts.append(f"+ {term}" if c > 0 else f"- {term}")
    if const or not parts:
        if not parts:
            parts.append(str(const))
        else:
            parts.append(f"+ {const}" if const > 0 else f"- {-const}")
    return " ".join(parts)


def _affine_bound(a: Affine, upper: bool, ranges=_RANGES) -> str:
    """Code for the max (upper) or min of an affine form over the ranges."""
    terms = []
    for v in sorted(x for x in a if x):
        c = a[v]
        lo, hi = ranges[v]
        terms.append((c, hi if (c > 0) == upper else lo))
    return _linear(terms, a.get("", 0))


class TileCode:
    """Emits scalar code for intervals and (must, may) pairs over a tile."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._n = 0
        self._truths: dict[ir.Expr, tuple[str, str]] = {}

    def _tmp(self, stem: str) -> str:
        self._n += 1
        return f"{stem}{self._n}"

    def _assign(self, stem: str, lo: str, hi: str) -> tuple[str, str]:
        name = self._tmp(stem)
        self.lines.append(f"{name}_lo = {lo}")
        self.lines.append(f"{name}_hi = {hi}")
        return f"{name}_lo", f"{name}_hi"

    def interval(self, e: ir.Expr) -> tuple[str, str]:
        value = constant_value(e)
        if value is not None:  # `abs(-2)`: one literal, not tl calls on ints
            return str(value), str(value)
        a = affine(e)
        if a is not None:
            a = _clean(a)
            if set(a) <= {""}:
                c = str(a.get("", 0))
                return c, c
            return _affine_bound(a, upper=False), _affine_bound(a, upper=True)
        if isinstance(e, ir.Unary):  # negation of a non-affine expression
            lo, hi = self.interval(e.operand)
            return f"-({hi})", f"-({lo})"
        if isinstance(e, ir.Binary):
            return self._binary(e)
        assert isinstance(e, ir.Call)
        if e.fn == "abs":
            lo, hi = self.interval(e.args[0])
            return self._assign(
                "abs",
                f"tl.where({lo} >= 0, {lo}, tl.where({hi} <= 0, -({hi}), 0))",
                f"tl.maximum(tl.abs({lo}), tl.abs({hi}))",
            )
        (alo, ahi), (blo, bhi) = self.interval(e.args[0]), self.interval(e.args[1])
        fn = "tl.minimum" if e.fn == "min" else "tl.maximum"
        return self._assign(e.fn, f"{fn}({alo}, {blo})", f"{fn}({ahi}, {bhi})")

    def _binary(self, e: ir.Binary) -> tuple[str, str]:
        if e.op is ir.BinOp.FLOORDIV:
            lo, hi = self.interval(e.left)
            c = _int_arg(e.right)
            return self._assign("div", floor_div(lo, c), floor_div(hi, c))
        if e.op is ir.BinOp.MOD:
            lo, hi = self.interval(e.left)
            c = _int_arg(e.right)
            # Exact while the range does not wrap around a multiple of c.
            name = self._tmp("mod")
            mod_lo, mod_hi = floor_mod(lo, c), floor_mod(hi, c)
            # hi - c >= lo, not hi - lo >= c: hi - lo can reach 2^31 when
            # both bounds are near +-2^30, hi - c cannot (1 <= c <= 2^30).
            self.lines.append(f"{name}_wraps = (({hi}) - {c} >= ({lo})) | ({mod_lo} > {mod_hi})")
            self.lines.append(f"{name}_lo = tl.where({name}_wraps, 0, {mod_lo})")
            self.lines.append(f"{name}_hi = tl.where({name}_wraps, {c - 1}, {mod_hi})")
            return f"{name}_lo", f"{name}_hi"
        (alo, ahi), (blo, bhi) = self.interval(e.left), self.interval(e.right)
        if e.op is ir.BinOp.ADD:
            return self._assign("add", f"{alo} + {blo}", f"{ahi} + {bhi}")
        if e.op is ir.BinOp.SUB:
            return self._assign("sub", f"{alo} - ({bhi})", f"{ahi} - ({blo})")
        assert e.op is ir.BinOp.MUL
        name = self._tmp("mul")
        corners = [f"({x}) * ({y})" for x in (alo, ahi) for y in (blo, bhi)]
        for i, c in enumerate(corners):
            self.lines.append(f"{name}_{i} = {c}")
        c = [f"{name}_{i}" for i in range(4)]
        self.lines.append(
            f"{name}_lo = tl.minimum(tl.minimum({c[0]}, {c[1]}), tl.minimum({c[2]}, {c[3]}))"
        )
        self.lines.append(
            f"{name}_hi = tl.maximum(tl.maximum({c[0]}, {c[1]}), tl.maximum({c[2]}, {c[3]}))"
        )
        return f"{name}_lo", f"{name}_hi"

    def truth(self, e: ir.Expr) -> tuple[str, str]:
        """(must, may) code for a desugared boolean expression."""
        if e not in self._truths:  # `causal & window(L)` tests k <= q twice
            self._truths[e] = self._truth(e)
        return self._truths[e]

    def _truth(self, e: ir.Expr) -> tuple[str, str]:
        if isinstance(e, ir.Name):  # full
            return "True", "True"
        if isinstance(e, ir.Unary):
            must, may = self.truth(e.operand)
            return self._bools(_not(may), _not(must))
        assert isinstance(e, ir.Binary)
        if e.op in (ir.BinOp.AND, ir.BinOp.OR):
            (am, ay), (bm, by) = self.truth(e.left), self.truth(e.right)
            combine = _and if e.op is ir.BinOp.AND else _or
            return self._bools(combine(am, bm), combine(ay, by))
        return self._compare(e)

    def _bools(self, must: str, may: str) -> tuple[str, str]:
        if must in _CONSTANTS and may in _CONSTANTS:
            return must, may
        name = self._tmp("m")
        self.lines.append(f"{name}_must = {must}")
        self.lines.append(f"{name}_may = {may}")
        return f"{name}_must", f"{name}_may"

    def _compare(self, e: ir.Binary) -> tuple[str, str]:
        self.lines.append(f"# {print_expr(e)}")
        # Work on d = left - right, compared with 0.
        d = _difference(e)
        if d is not None:
            return self._affine_compare(e.op, d)
        lo, hi = self.interval(ir.Binary(ir.BinOp.SUB, e.left, e.right))
        return self._bools(*_compare_interval(e.op, lo, hi))

    def _affine_compare(self, op: ir.BinOp, d: Affine) -> tuple[str, str]:
        """Compare sum(c_i v_i) + c0 with 0, printed as `positive <= negative`."""
        const = d.get("", 0)
        variables = sorted(v for v in d if v)
        if not variables:
            value = str(_CONSTANT_TRUTH[op](const))
            return value, value

        def side(upper: bool) -> tuple[str, str]:
            # Bound of d: terms with c > 0 on the left, c < 0 on the right.
            left, right = [], []
            for v in variables:
                c = d[v]
                lo, hi = _RANGES[v]
                name = hi if (c > 0) == upper else lo
                (left if c > 0 else right).append((abs(c), name))
            return (
                _linear(left, max(const, 0)) if left or const > 0 else "0",
                _linear(right, max(-const, 0)) if right or const < 0 else "0",
            )

        (hl, hr), (ll, lr) = side(True), side(False)
        # d_hi is hl - hr, d_lo is ll - lr.
        table = {
            ir.BinOp.LE: (f"{hl} <= {hr}", f"{ll} <= {lr}"),
            ir.BinOp.LT: (f"{hl} < {hr}", f"{ll} < {lr}"),
            ir.BinOp.GE: (f"{ll} >= {lr}", f"{hl} >= {hr}"),
            ir.BinOp.GT: (f"{ll} > {lr}", f"{hl} > {hr}"),
            ir.BinOp.EQ: (
                f"({hl} <= {hr}) & ({ll} >= {lr})",
                f"({ll} <= {lr}) & ({hl} >= {hr})",
            ),
            ir.BinOp.NE: (
                f"({ll} > {lr}) | ({hl} < {hr})",
                f"~(({hl} <= {hr}) & ({ll} >= {lr}))",
            ),
        }
        return self._bools(*table[op])


_CONSTANTS = ("True", "False")
_CONSTANT_TRUTH = {
    ir.BinOp.LE: lambda c: c <= 0,
    ir.BinOp.LT: lambda c: c < 0,
    ir.BinOp.GE: lambda c: c >= 0,
    ir.BinOp.GT: lambda c: c > 0,
    ir.BinOp.EQ: lambda c: c == 0,
    ir.BinOp.NE: lambda c: c != 0,
}


def _not(a: str) -> str:
    if a in _CONSTANTS:
        return "False" if a == "True" else "True"
    return f"~({a})"


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


def _compare_interval(op: ir.BinOp, lo: str, hi: str) -> tuple[str, str]:
    table = {
        ir.BinOp.LE: (f"{hi} <= 0", f"{lo} <= 0"),
        ir.BinOp.LT: (f"{hi} < 0", f"{lo} < 0"),
        ir.BinOp.GE: (f"{lo} >= 0", f"{hi} >= 0"),
        ir.BinOp.GT: (f"{lo} > 0", f"{hi} > 0"),
        ir.BinOp.EQ: (f"({lo} == 0) & ({hi} == 0)", f"({lo} <= 0) & ({hi} >= 0)"),
        ir.BinOp.NE: (f"({lo} > 0) | ({hi} < 0)", f"~(({lo} == 0) & ({hi} == 0))"),
    }
    return table[op]


# --------------------------------------------------------------------------- #
# Key bounds
# --------------------------------------------------------------------------- #

Bounds = tuple["str | None", "str | None"]

# For bounding one position variable, the ranges of the others over the tile.
_OTHER_RANGES = {
    "k": {"q": ("q_lo", "q_hi"), "h": ("head", "head"), "H": ("num_heads", "num_heads")},
    "q": {"k": ("k_lo", "k_hi"), "h": ("head", "head"), "H": ("num_heads", "num_heads")},
}


def key_bounds(e: ir.Expr) -> Bounds:
    """Inclusive (lo, hi) key positions visible to some query of the tile.

    `e` is a desugared mask in negation normal form.  None means unbounded.
    The code refers to q_lo, q_hi, head and num_heads only.
    """
    return position_bounds(e, "k")


def query_bounds(e: ir.Expr) -> Bounds:
    """Inclusive (lo, hi) query positions that see some key of the tile."""
    return position_bounds(e, "q")


def position_bounds(e: ir.Expr, var: str) -> Bounds:
    """Bounds on `var` ("q" or "k") implied by `e`, given the other's tile."""
    if isinstance(e, ir.Binary) and e.op in (ir.BinOp.AND, ir.BinOp.OR):
        (alo, ahi), (blo, bhi) = position_bounds(e.left, var), position_bounds(e.right, var)
        if e.op is ir.BinOp.AND:
            return _combine(alo, blo, "tl.maximum"), _combine(ahi, bhi, "tl.minimum")
        lo = None if alo is None or blo is None else _combine(alo, blo, "tl.minimum")
        hi = None if ahi is None or bhi is None else _combine(ahi, bhi, "tl.maximum")
        return lo, hi
    if isinstance(e, ir.Binary) and e.op in ir.COMPARISONS:
        free = _free_truth(e, var)
        if free is not None:
            return _all_or_none(free[1])
        return _compare_bounds(e, var)
    return None, None


# Conditional bounds use a position no tile reaches, for "unbounded" and
# "empty" alike: (-FAR, FAR) holds every position and (FAR, -FAR) none.
_FAR = "(1 << 30)"


def _all_or_none(cond: str) -> Bounds:
    """Every position where `cond` holds, none where it does not."""
    if cond == "True":
        return None, None
    if cond == "False":
        return _FAR, f"-{_FAR}"
    return f"tl.where({cond}, -{_FAR}, {_FAR})", f"tl.where({cond}, {_FAR}, -{_FAR})"


def _free_truth(e: ir.Binary, var: str) -> tuple[str, str] | None:
    """(must, may) over the other variable's tile of an affine comparison
    that does not mention `var` (`k < P` when bounding queries), or None."""
    d = _difference(e)
    if d is None or var in d:
        return None
    if set(d) <= {""}:
        value = str(_CONSTANT_TRUTH[e.op](d.get("", 0)))
        return value, value
    ranges = _OTHER_RANGES[var]
    return _compare_interval(e.op, _affine_bound(d, False, ranges), _affine_bound(d, True, ranges))


def _combine(a: str | None, b: str | None, fn: str) -> str | None:
    if a is None or a == b:
        return b
    if b is None:
        return a
    return f"{fn}({a}, {b})"


def _compare_bounds(e: ir.Binary, var: str) -> Bounds:
    chunk = _chunk_bounds(e, var)
    if chunk is not None:
        return chunk
    isolated = _isolate(e, var)
    if isolated is None:
        return None, None
    op, lo, hi = isolated
    return {
        ir.BinOp.LE: (None, hi),
        ir.BinOp.LT: (None, f"{hi} - 1"),
        ir.BinOp.GE: (lo, None),
        ir.BinOp.GT: (f"{lo} + 1", None),
        ir.BinOp.EQ: (lo, hi),
        ir.BinOp.NE: (None, None),
    }[op]


def _isolate(e: ir.Binary, var: str) -> tuple[ir.BinOp, str, str] | None:
    """Read an affine comparison as `var op rest`, with var's coefficient ±1:
    op and the code of rest's min and max over the other variable's tile."""
    d = _difference(e)
    if d is None:
        return None
    coeff = d.pop(var, 0)
    if coeff not in (1, -1):
        return None
    # coeff * var + rest  op  0   <=>   var  op'  -coeff * rest
    rest = {v: -coeff * c for v, c in d.items()}
    op = e.op if coeff == 1 else _FLIPPED[e.op]
    ranges = _OTHER_RANGES[var]
    return op, _affine_bound(rest, False, ranges), _affine_bound(rest, True, ranges)


_FLIPPED = {
    ir.BinOp.LE: ir.BinOp.GE,
    ir.BinOp.GE: ir.BinOp.LE,
    ir.BinOp.LT: ir.BinOp.GT,
    ir.BinOp.GT: ir.BinOp.LT,
    ir.BinOp.EQ: ir.BinOp.EQ,
    ir.BinOp.NE: ir.BinOp.NE,
}


def _chunk_range(e: ir.Binary, var: str) -> tuple[str, str, int] | None:
    """For `A div C == var div C` with A affine and free of var: the code of
    A's min and max over the other variable's tile, and C."""
    if e.op is not ir.BinOp.EQ:
        return None
    target = ir.Name(var)
    for a, b in ((e.left, e.right), (e.right, e.left)):
        if (
            isinstance(a, ir.Binary)
            and a.op is ir.BinOp.FLOORDIV
            and isinstance(b, ir.Binary)
            and b.op is ir.BinOp.FLOORDIV
            and b.left == target
            and a.right == b.right
        ):
            inner = affine(a.left)
            if inner is None or _clean(inner).get(var):
                return None
            inner = _clean(inner)
            ranges = _OTHER_RANGES[var]
            lo = _affine_bound(inner, False, ranges)
            hi = _affine_bound(inner, True, ranges)
            return lo, hi, _int_arg(a.right)
    return None


def _power_of_two(c: int) -> bool:
    return c > 0 and c & (c - 1) == 0


def floor_div(a: str, c: int) -> str:
    """Code for a // c (floor) with c > 0: an arithmetic shift when c is a
    power of two (exact for negative a too), else the module's `_floor_div`.
    The shift keeps chunked masks as cheap as causal ones: the helper's
    division and select cost registers in the backward."""
    if _power_of_two(c):
        return f"({_grouped(a)} >> {c.bit_length() - 1})"
    return f"_floor_div({a}, {c})"


def floor_mod(a: str, c: int) -> str:
    """Code for a mod c (floor, so in [0, c)) with c > 0."""
    if _power_of_two(c):
        return f"({_grouped(a)} & {c - 1})"
    return f"_floor_mod({a}, {c})"


def _grouped(code: str) -> str:
    """`code` as an operand of a binary operator: parenthesized unless it is
    a name or a number."""
    return code if re.fullmatch(r"-?\w+", code) else f"({code})"


def _chunk_bounds(e: ir.Binary, var: str) -> Bounds | None:
    """`A div C == var div C`: var lies in A's chunks."""
    match = _chunk_range(e, var)
    if match is None:
        return None
    lo, hi, c = match
    return _chunk_start(lo, c), _chunk_end(hi, c)


# Chunks wider than this get their bounds clamped to the sentinel: the start
# of A's chunk is A - (c - 1) at the least and its end A + c - 1, which for A
# and c near 2^30 leaves int32 (and the kernels add a tile or q_offset more).
_CLAMPED_CHUNK = ir.POSITION_BOUND


def _chunk_start(a: str, c: int) -> str:
    """Code for the first position of a's chunk of size c."""
    start = f"{floor_div(a, c)} * {c}"
    return start if c <= _CLAMPED_CHUNK else f"tl.maximum({start}, -{_FAR})"


def _chunk_end(a: str, c: int) -> str:
    """Code for the last position of a's chunk of size c.  Clamped for wide
    chunks, which is sound for bounds of either kind: no position reaches
    the sentinel."""
    if c <= _CLAMPED_CHUNK:
        return f"{floor_div(a, c)} * {c} + {c - 1}"
    return f"tl.minimum({floor_div(a, c)} * {c}, {_FAR} - {c - 1}) + {c - 1}"


def full_bounds(e: ir.Expr, var: str) -> Bounds | None:
    """Inclusive (lo, hi) positions of `var` visible to *every* position of
    the other variable's tile, or None where no such interval is found.

    `e` is a desugared mask in negation normal form; a side that is None is
    unbounded.  Sound, not always tight: an `|` whose operands' intervals do
    not touch keeps the first one.
    """
    if isinstance(e, ir.Name):  # full
        return None, None
    if isinstance(e, ir.Binary) and e.op is ir.BinOp.AND:
        a, b = full_bounds(e.left, var), full_bounds(e.right, var)
        if a is None or b is None:
            return None
        return _combine(a[0], b[0], "tl.maximum"), _combine(a[1], b[1], "tl.minimum")
    if isinstance(e, ir.Binary) and e.op is ir.BinOp.OR:
        for one, other in ((e.left, e.right), (e.right, e.left)):
            free = _free_truth(one, var) if _is_comparison(one) else None
            if free is not None:
                # Everything where `one` holds for the whole tile, else other's.
                rest = full_bounds(other, var)
                if rest is None or free[0] in _CONSTANTS:
                    return _all_or_none(free[0])
                lo, hi = rest
                return (
                    None if lo is None else f"tl.where({free[0]}, -{_FAR}, {lo})",
                    None if hi is None else f"tl.where({free[0]}, {_FAR}, {hi})",
                )
        a, b = full_bounds(e.left, var), full_bounds(e.right, var)
        if a is None or b is None:
            return a or b
        return _union(a, b)
    if _is_comparison(e):
        free = _free_truth(e, var)
        if free is not None:
            return _all_or_none(free[0])
        return _compare_full(e, var)
    return None


def _is_comparison(e: ir.Expr) -> bool:
    return isinstance(e, ir.Binary) and e.op in ir.COMPARISONS


def is_band(e: ir.Expr) -> bool:
    """Is `e` a non-empty band lo <= k - q <= hi (either side may be open)?

    Every query of such a mask sees one interval of keys that slides with
    it, so the keys a query tile sees form one interval, the one `key_bounds`
    gives (clipped to the keys that exist): when it is not empty, every key
    tile that meets it has a visible pair, and so does every query tile that
    meets `query_bounds` for a key tile.  The kernel then needs no per-tile
    emptiness test.  (When it is empty, the loop may still run the one tile
    below the rounded-down bound, masked, which costs time but not
    correctness.)
    """
    lo, hi = -math.inf, math.inf

    def walk(x: ir.Expr) -> bool:
        nonlocal lo, hi
        if isinstance(x, ir.Binary) and x.op is ir.BinOp.AND:
            return walk(x.left) and walk(x.right)
        read = _k_minus_q(x)
        if read is None or read[0] is ir.BinOp.NE:
            return False
        lo, hi = _narrow_band(lo, hi, *read)
        return True

    return walk(e) and lo <= hi


def _narrow_band(lo: float, hi: float, op: ir.BinOp, bound: int) -> tuple[float, float]:
    """The band lo <= k - q <= hi intersected with `k - q  op  bound`
    (unchanged by !=)."""
    if op in (ir.BinOp.LE, ir.BinOp.LT, ir.BinOp.EQ):
        hi = min(hi, bound - (op is ir.BinOp.LT))
    if op in (ir.BinOp.GE, ir.BinOp.GT, ir.BinOp.EQ):
        lo = max(lo, bound + (op is ir.BinOp.GT))
    return lo, hi


def edges_dense(e: ir.Expr) -> bool:
    """Does every tile inside the bounds have a visible pair?

    True for bands (`is_band`) and for the masks `_diagonal_rows` accepts.
    The kernels then run the masked tiles on either side of the interior
    without a per-tile emptiness test, a branch that measured 7% of the
    forward and 14% of the backward of causal & chunk on an H200.
    """
    return is_band(e) or _diagonal_rows(e) is not None


def _diagonal_rows(e: ir.Expr) -> bool | None:
    """For masks whose rows are intervals through the diagonal: whether the
    intervals reach key 0 (no lower bound on k); None for other masks.

    Accepted: `k - q op c` true at k = q, `q div C == k div C`, their `&`
    and `|`, and `X | k < P` where X's rows reach key 0 (causal | prefix).
    Every query q then sees an interval of keys that contains q, with ends
    that never decrease as q grows, and by symmetry every key k is seen by
    an interval of queries that contains k.  Intervals of consecutive
    positions touch, so the keys a query tile sees form one interval and
    the affine bounds, evaluated at the tile's ends, are that interval:
    every key tile that meets it has a visible pair, and likewise for query
    tiles of a key tile.
    """
    if isinstance(e, ir.Binary) and e.op in (ir.BinOp.AND, ir.BinOp.OR):
        a, b = _diagonal_rows(e.left), _diagonal_rows(e.right)
        if e.op is ir.BinOp.OR:
            for x, y, other in ((a, b, e.right), (b, a, e.left)):
                if x and y is None and _prefix_atom(other):
                    return True
        if a is None or b is None:
            return None
        return (a and b) if e.op is ir.BinOp.AND else (a or b)
    if not _is_comparison(e):
        return None
    if _chunk_range(e, "k") is not None and {e.left.left, e.right.left} == {_Q, _K}:
        return False
    read = _k_minus_q(e)
    # k - q op bound must hold at k = q, i.e. 0 op bound, i.e. -bound op 0.
    if read is None or read[0] is ir.BinOp.NE or not _CONSTANT_TRUTH[read[0]](-read[1]):
        return None
    # The rows are open below when op bounds k above.
    return read[0] in (ir.BinOp.LE, ir.BinOp.LT)


def _prefix_atom(e: ir.Expr) -> bool:
    """`k < P` or `k <= P` (any constant P): keys 0 .. P-1 for every query."""
    d = _difference(e) if _is_comparison(e) else None
    if d is None:
        return False
    d.pop("", None)
    if d == {"k": 1}:
        return e.op in (ir.BinOp.LE, ir.BinOp.LT)
    if d == {"k": -1}:
        return e.op in (ir.BinOp.GE, ir.BinOp.GT)
    return False


def _union(a: Bounds, b: Bounds) -> Bounds:
    """An interval inside the union of two: their hull where they touch."""
    (alo, ahi), (blo, bhi) = a, b
    if (alo is None) != (blo is None) or (ahi is None) != (bhi is None):
        return a
    touch = [f"({x} <= {y} + 1)" for x, y in ((alo, bhi), (blo, ahi)) if x and y]
    if not touch:  # both reach -inf or both reach +inf: they overlap
        return _combine(alo, blo, "tl.minimum"), _combine(ahi, bhi, "tl.maximum")
    cond = " & ".join(touch)
    lo = None if alo is None else f"tl.where({cond}, {_combine(alo, blo, 'tl.minimum')}, {alo})"
    hi = None if ahi is None else f"tl.where({cond}, {_combine(ahi, bhi, 'tl.maximum')}, {ahi})"
    return lo, hi


def _compare_full(e: ir.Binary, var: str) -> Bounds | None:
    chunk = _chunk_full(e, var)
    if chunk is not None:
        return chunk
    isolated = _isolate(e, var)
    if isolated is None:
        return None
    # var op rest must hold for every value of rest over the tile.
    op, lo, hi = isolated
    return {
        ir.BinOp.LE: (None, lo),
        ir.BinOp.LT: (None, f"{lo} - 1"),
        ir.BinOp.GE: (hi, None),
        ir.BinOp.GT: (f"{hi} + 1", None),
        ir.BinOp.EQ: (hi, lo),
        ir.BinOp.NE: None,
    }[op]


def _chunk_full(e: ir.Binary, var: str) -> Bounds | None:
    """`A div C == var div C`: when all of A lies in one chunk, that chunk.

    From A's last chunk's start to its first chunk's end, which is empty when
    A spans two chunks.
    """
    match = _chunk_range(e, var)
    if match is None:
        return None
    lo, hi, c = match
    return _chunk_start(hi, c), _chunk_end(lo, c)


# --------------------------------------------------------------------------- #
# Score
# --------------------------------------------------------------------------- #

_S = ir.Name("s")


def score_code(score: ir.Expr, elements: ElementCode) -> tuple[str, str, str | None]:
    """The score's kind, its code in log2 units (see KernelModel) and the
    code of d score / d s for general scores (None when it is 1)."""
    kind, expr = _score_parts(score)
    if kind == "identity":
        return kind, "", None
    log2_code = elements.scaled(expr, LOG2E)
    if kind == "general" and not grad.depends_on_s(expr):
        # A score without s (`2.0`, `q * 0.5`, `h`) may be a scalar or one
        # row or column; the softmax needs it broadcast to the tile.  s is
        # finite, so s * 0.0 adds nothing but the shape (and its layout).
        log2_code = f"s * 0.0 + ({log2_code})"
    grad_code = None
    if (
        kind == "general"
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
    elif kind == "general":
        derivative = grad.derivative(expr)
        if derivative != grad.ONE:
            grad_code = elements.real(derivative)
    return kind, log2_code, grad_code


LOG2E = 1.4426950408889634


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


def _score_parts(score: ir.Expr) -> tuple[str, ir.Expr | None]:
    """Classify the score: identity, s + bias, or general."""
    if score == _S:
        return "identity", None
    if isinstance(score, ir.Binary) and score.op in (ir.BinOp.ADD, ir.BinOp.SUB):
        s_names = frozenset({"s"})
        if score.left == _S and not ir.mentions(score.right, s_names):
            bias = score.right
            if score.op is ir.BinOp.SUB:
                bias = ir.Unary(ir.UnaryOp.NEG, bias)
            return "additive", bias
        if score.op is ir.BinOp.ADD and score.right == _S and not ir.mentions(score.left, s_names):
            return "additive", score.left
    return "general", score


# --------------------------------------------------------------------------- #
# Launch configurations
# --------------------------------------------------------------------------- #


def _gpu_config(head_dim_pad: int, dtype: ir.DType, masked: bool) -> LaunchConfig:
    """Forward block sizes that fit Hopper's 228 KB of shared memory per SM.

    Measured on the H200 (BENCHMARKS.md, sweeps 2-3): without a mask, large
    tiles win (128 x 64 at d64, 128 x 128 at d128); with a mask, 64 x 64 with
    4 warps wins, as large tiles waste work on the boundary.  `flashgen tune`
    replaces these per spec.
    """
    if dtype is ir.DType.FP32:
        if head_dim_pad <= 64:
            return LaunchConfig(64, 32, 4, 3)
        if head_dim_pad <= 128:
            # Spill-free with CUDA-core products (64 x 32 spilled 6 KB).
            return LaunchConfig(32, 16, 4, 2)
        return LaunchConfig(64, 16, 4, 2)
    if head_dim_pad > 128:
        return LaunchConfig(64, 32, 8, 2)
    if masked:
        return LaunchConfig(64, 64, 4, 3)
    return LaunchConfig(128, 64, 8, 3) if head_dim_pad <= 64 else LaunchConfig(128, 128, 8, 3)


def _gpu_bwd_config(head_dim_pad: int, dtype: ir.DType) -> LaunchConfig:
    """Backward tiles.  The dK/dV kernel keeps two BLOCK_N x HEAD_DIM fp32
    accumulators in registers, so wide heads get narrower key tiles."""
    wide = dtype is ir.DType.FP32
    if head_dim_pad <= 64:
        return LaunchConfig(64, 64, 4, 2 if wide else 3)
    if head_dim_pad <= 128:
        # Measured on the H200: 64 x 128 with 8 warps and TMA loads (see
        # `_gpu_tma`), 336-396 TFLOP/s at d128.
        return LaunchConfig(32, 32, 4, 2) if wide else LaunchConfig(64, 128, 8, 3)
    return LaunchConfig(16 if wide else 32, 16 if wide else 32, 8, 1 if wide else 2)


def _gpu_tma(head_dim_pad: int, dtype: ir.DType) -> tuple[bool, bool]:
    """Whether (forward, backward) load tiles through TMA descriptors by default.

    Measured on the H200 (BENCHMARKS.md, sweep 3): TMA made the forward 2-10%
    slower at d64 and no faster at d128, and the backward 4-6% faster at d128
    and slightly slower at d64.
    """
    return False, head_dim_pad >= 128 and dtype is not ir.DType.FP32


# The Gluon forward for any mask and score ("any" below) against the Triton
# forward on the same spec (BENCHMARKS.md, entry 29; d128, bf16): 0.84-0.99x
# at N = 1024, 1.02-1.07x at N = 4096 and 16384 when a query row sees
# thousands of keys, 0.85-0.91x for a 257-key band at every N.  It runs when
# a query row can see at least GLUON_ANY_MIN_KEYS keys: the module's mask
# must allow that many (`key_span`), the call's sequence must be that long.
GLUON_FORWARD_ANY = True
GLUON_ANY_MIN_KEYS = 4096


def key_span(e: ir.Expr) -> int | None:
    """The most keys one query position can see, when a constant bounds it
    (None: not bounded, or not by a form recognized here).

    A band lo <= k - q <= hi (the comparisons of an & chain) sees at most
    hi - lo + 1 keys, `abs(q - k) < c` 2c - 1, a chunk C (q div C == k div C)
    at most C, k < P at most P; & keeps the smallest bound of its operands,
    | adds its operands' bounds.
    """
    if isinstance(e, ir.Binary) and e.op is ir.BinOp.OR:
        left, right = key_span(e.left), key_span(e.right)
        return None if left is None or right is None else left + right
    lo, hi = -math.inf, math.inf
    spans: list[int] = []

    def walk(x: ir.Expr) -> None:
        nonlocal lo, hi
        if isinstance(x, ir.Binary) and x.op is ir.BinOp.AND:
            walk(x.left)
            walk(x.right)
            return
        if isinstance(x, ir.Binary) and x.op is ir.BinOp.OR:
            span = key_span(x)
            if span is not None:
                spans.append(span)
            return
        near = _abs_band(x)
        if near is not None:  # -near <= k - q <= near
            lo, hi = max(lo, -near), min(hi, near)
            return
        few = _chunk_size(x)
        if few is None:
            few = _keys_below(x)
        if few is not None:
            spans.append(few)
            return
        read = _k_minus_q(x)
        if read is not None:
            lo, hi = _narrow_band(lo, hi, *read)

    walk(e)
    if lo > -math.inf and hi < math.inf:
        spans.append(max(0, int(hi - lo) + 1))
    return min(spans) if spans else None


def _keys_below(e: ir.Expr) -> int | None:
    """P for `k < P` or `k <= P - 1` (the keys 0 to P - 1), 1 for `k == P`."""
    if not _is_comparison(e):
        return None
    d = _difference(e)
    if d is None:
        return None
    c = d.pop("", 0)
    if d not in ({"k": 1}, {"k": -1}):
        return None
    # sign * k + c  op  0   <=>   k  op'  -sign * c
    op = e.op if d["k"] == 1 else _FLIPPED[e.op]
    bound = -d["k"] * c
    if op is ir.BinOp.EQ:
        return int(bound >= 0)
    if op not in (ir.BinOp.LT, ir.BinOp.LE):
        return None
    return max(0, bound + (op is ir.BinOp.LE))


def _abs_band(e: ir.Expr) -> int | None:
    """The largest |k - q| that `abs(q - k) < c` (either difference, either
    side) allows, c - 1, or c for `<=`; None for other forms."""
    if not _is_comparison(e):
        return None
    for a, b, op in ((e.left, e.right, e.op), (e.right, e.left, _FLIPPED.get(e.op))):
        if not (isinstance(a, ir.Call) and a.fn == "abs" and isinstance(b, ir.Num)):
            continue
        d = affine(a.args[0])
        if d is None or _clean(d) not in _K_MINUS_Q or not isinstance(b.value, int):
            continue
        if op is ir.BinOp.LT:
            return b.value - 1
        if op is ir.BinOp.LE:
            return b.value
    return None


def _chunk_size(e: ir.Expr) -> int | None:
    """C for `q div C == k div C` (either side first), else None."""
    if not (isinstance(e, ir.Binary) and e.op is ir.BinOp.EQ):
        return None
    sides = (e.left, e.right)
    if not all(isinstance(x, ir.Binary) and x.op is ir.BinOp.FLOORDIV for x in sides):
        return None
    if {sides[0].left, sides[1].left} != {_Q, _K} or sides[0].right != sides[1].right:
        return None
    if not isinstance(sides[0].right, ir.Num) or _int_arg(sides[0].right) <= 0:
        return None
    return _int_arg(sides[0].right)


def _gluon_forward(v: ir.Variant) -> str | None:
    """Whether the module gets the warp-specialized Gluon forward for sm90
    (BENCHMARKS.md, entries 13, 16 and 29): "full", "causal", "any" or None.

    Written for the plain variants that race cuDNN: a full or causal mask,
    the score s, 16-bit inputs, head dim 128.  With GLUON_FORWARD_ANY, "any"
    for every other mask and score at 16 bits and head dim 128 without a
    rescale threshold (it reuses the Gluon backward's mask functions) whose
    query rows may see GLUON_ANY_MIN_KEYS keys or more.  The module still
    checks each call's shapes and falls back to the Triton kernel.
    """
    if v.dtype is ir.DType.FP32 or v.head_dim != 128:
        return None
    if v.score == ir.IDENTITY_SCORE and v.mask in (ir.FULL, ir.Name("causal")):
        return {ir.FULL: "full", ir.Name("causal"): "causal"}[v.mask]
    if not (GLUON_FORWARD_ANY and v.rescale_threshold == 0 and _gluon_backward(v)):
        return None
    span = key_span(negation_normal_form(desugar_mask(v.mask)))
    return "any" if span is None or span >= GLUON_ANY_MIN_KEYS else None


def _gluon_backward(v: ir.Variant) -> bool:
    """Whether the module gets the warp-specialized Gluon backward for sm90
    (BENCHMARKS.md, entry 25): any mask and score, 16-bit inputs, head dim 64
    or 128.  The module still checks each call's shapes and falls back to the
    Triton kernel."""
    return v.dtype is not ir.DType.FP32 and v.head_dim in (64, 128)


# Largest softcap cap for which 16-bit modules compute tanh without the
# polynomial branch near 0: there tanh's absolute error (~2^-25, from rounding
# exp(-2|x|) near 1) times the cap stays below 2^-17, far below the fp16
# rounding of any score that is not itself tiny.
FAST_TANH_MAX_CAP = 256.0


def _tanh_small_poly(v: ir.Variant) -> bool:
    """Whether `_tanh` needs its polynomial branch near 0.

    softcap(x, c) is c * tanh(x / c): an absolute error e of tanh becomes
    c * e in a score that is about x for |x| << c, so a huge cap (3e38 gave
    0 for every score) needs tanh's relative accuracy near 0.  A plain `tanh`
    may be scaled by anything, so it gets the branch too.
    """
    if v.dtype is ir.DType.FP32:
        return True

    def amplified(e: ir.Expr) -> bool:
        if isinstance(e, ir.Call):
            if e.fn == "tanh":
                return True
            if e.fn == ir.SOFTCAP and float(e.args[1].value) > FAST_TANH_MAX_CAP:
                return True
            return any(amplified(a) for a in e.args)
        if isinstance(e, ir.Unary):
            return amplified(e.operand)
        if isinstance(e, ir.Binary):
            return amplified(e.left) or amplified(e.right)
        return False

    return amplified(v.score)


# The Triton interpreter runs each program instance in numpy: bigger tiles mean
# fewer Python-level steps.
_CPU_CONFIG = LaunchConfig(32, 32, 1, 1)


# --------------------------------------------------------------------------- #
# Entry point
# --------------------------------------------------------------------------- #


def _pick(measured: bool | None, default: bool) -> bool:
    return default if measured is None else measured


def spec_hash(spec_text: str) -> str:
    return hashlib.sha256(spec_text.encode()).hexdigest()[:16]


def head_dim_pad(head_dim: int) -> int:
    """The head dim the kernels' tiles use: a power of two, at least 16."""
    return max(16, 1 << (head_dim - 1).bit_length())


def _nan_at_zero(e: ir.Expr) -> bool:
    """Whether `e` holds sqrt, log or a division by a non-constant."""
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, ir.Call):
            if x.fn in ("sqrt", "log"):
                return True
            stack.extend(x.args)
        elif isinstance(x, ir.Binary):
            if x.op is ir.BinOp.DIV and not isinstance(x.right, ir.Num):
                return True
            stack += [x.left, x.right]
        elif isinstance(x, ir.Unary):
            stack.append(x.operand)
    return False


def lower(v: ir.Variant, tuning: Tuning | None = None) -> KernelModel:
    spec_text = print_variant(v)
    pad = head_dim_pad(v.head_dim)

    mask = negation_normal_form(desugar_mask(v.mask))
    elements = ElementCode()
    mask_code = elements.expr(mask)
    mask_is_full = mask_code == "True"
    scores = ElementCode(keys_before_queries(mask))
    kind, score_log2_code, score_grad_code = score_code(v.score, scores)

    tiles = TileCode()
    if mask_is_full:
        tile_full, tile_may = "True", "True"
        key_lo = key_hi = query_lo = query_hi = None
        key_full = query_full = (None, None)
    else:
        tile_full, tile_may = tiles.truth(mask)
        key_lo, key_hi = key_bounds(mask)
        query_lo, query_hi = query_bounds(mask)
        key_full, query_full = full_bounds(mask, "k"), full_bounds(mask, "q")
    scalar_code = [
        *tiles.lines,
        key_lo,
        key_hi,
        query_lo,
        query_hi,
        *(key_full or ()),
        *(query_full or ()),
    ]
    needs_floor_div = (
        elements.needs_floor_div
        or scores.needs_floor_div
        or any("_floor_" in (line or "") for line in scalar_code)
    )

    positions = frozenset({"q", "k"})
    default_tma = _gpu_tma(pad, v.dtype)
    gluon = _gluon_forward(v)
    return KernelModel(
        name=v.name,
        spec_text=spec_text,
        spec_hash=spec_hash(spec_text),
        torch_dtype=_TORCH_DTYPES[v.dtype],
        tl_dtype=_TL_DTYPES[v.dtype],
        head_dim=v.head_dim,
        head_dim_pad=pad,
        default_scale=v.scale if v.scale is not None else 1.0 / math.sqrt(v.head_dim),
        max_seq_len=ir.MAX_SEQ_LEN,
        max_heads=ir.MAX_HEADS,
        bottom_right=v.align is ir.Align.BOTTOM_RIGHT,
        rescale_threshold=float(v.rescale_threshold),
        dot_precision="ieee" if v.dtype is ir.DType.FP32 else None,
        score_kind=kind,
        score_log2_code=score_log2_code,
        score_grad_code=score_grad_code,
        score_nan_at_zero=_nan_at_zero(v.score),
        score_grad_uses_s=bool(score_grad_code and re.search(r"\bs\b", score_grad_code)),
        uses_alibi=scores.uses_alibi,
        uses_positions=ir.mentions(v.score, positions) or scores.uses_alibi,
        mask_is_full=mask_is_full,
        mask_code=mask_code,
        tile_lines=tuple(tiles.lines),
        tile_full=tile_full,
        tile_may=tile_may,
        key_lo=key_lo,
        key_hi=key_hi,
        query_lo=query_lo,
        query_hi=query_hi,
        bounds_dense=mask_is_full or edges_dense(mask),
        key_interior=key_full is not None,
        key_full_lo=key_full[0] if key_full else None,
        key_full_hi=key_full[1] if key_full else None,
        query_interior=query_full is not None,
        query_full_lo=query_full[0] if query_full else None,
        query_full_hi=query_full[1] if query_full else None,
        needs_floor_div=needs_floor_div,
        needs_tanh=scores.needs_tanh,
        tanh_small_poly=_tanh_small_poly(v),
        gpu_config=(tuning.forward if tuning else _gpu_config(pad, v.dtype, not mask_is_full)),
        cpu_config=_CPU_CONFIG,
        gpu_bwd_config=tuning.backward if tuning else _gpu_bwd_config(pad, v.dtype),
        gpu_tma=_pick(tuning.forward_tma if tuning else None, default_tma[0]),
        gpu_bwd_tma=_pick(tuning.backward_tma if tuning else None, default_tma[1]),
        tuned_on=tuning.device if tuning else None,
        gluon_forward=gluon,
        gluon_min_keys=GLUON_ANY_MIN_KEYS if gluon == "any" else 0,
        gluon_backward=_gluon_backward(v),
        gluon_dq_heavy_last=keys_before_queries(mask),
    )
