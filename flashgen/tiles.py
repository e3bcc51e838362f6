"""Tile classification: a mask in negation normal form in, kernel scalar
code (`flashgen.kernel_expr` trees) out.

Each integer sub-expression of the mask gets an interval over a (query tile
x key tile) rectangle, and each boolean one a pair (`must`, `may`): true for
every pair in the rectangle / for at least one.  Affine sub-expressions are
normalised first, so their intervals are exact (q - k over two independent
ranges is exact); `div`, `%`, `abs`, `min`, `max` and products get sound
(possibly loose) intervals.  The kernel evaluates this scalar code once per
key tile: `must` means the tile needs no elementwise mask, `not may` that it
is skipped without loading K or V.  See docs/MASKS.md.  The loop bounds
(`flashgen.loop_bounds`) use the same affine bounds over the tile.
"""

from __future__ import annotations

from flashgen import ir
from flashgen import kernel_expr as kx
from flashgen.element_code import constant_value
from flashgen.mask_forms import (
    CONSTANT_TRUTH,
    Affine,
    affine,
    clean,
    difference,
    int_arg,
)
from flashgen.printer import print_expr

# Scalar names the kernel defines for the current (query tile, key tile).
_RANGES = {
    "q": ("q_lo", "q_hi"),
    "k": ("k_lo", "k_hi"),
    "h": ("head", "head"),
    "H": ("num_heads", "num_heads"),
}
# For bounding one position variable, the ranges of the others over the tile.
OTHER_RANGES = {
    var: {v: r for v, r in _RANGES.items() if v != var} for var in ("q", "k")
}  # fmt: skip

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

Truth = tuple[kx.Expr, kx.Expr]  # (must, may)


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


def _linear(terms: list[tuple[int, str]], const: int) -> kx.Expr:
    """sum(c * name) + const, in int64 where int32 might overflow (see
    `_fits_int32`; never for the masks people write)."""
    names: list[tuple[int, kx.Expr]] = [(c, kx.Var(name)) for c, name in terms]
    if terms and not _fits_int32(terms, const):
        c, first = names[0]
        names[0] = (c, kx.Cast(first, "tl.int64"))
    return kx.linear(names, const)


def affine_bound(a: Affine, upper: bool, ranges=_RANGES) -> kx.Expr:
    """The max (upper) or min of an affine form over the ranges."""
    terms = []
    for v in sorted(x for x in a if x):
        c = a[v]
        lo, hi = ranges[v]
        terms.append((c, hi if (c > 0) == upper else lo))
    return _linear(terms, a.get("", 0))


def compare_interval(op: ir.BinOp, lo: kx.Expr, hi: kx.Expr) -> Truth:
    """(must, may) of `d op 0` for d in [lo, hi]."""
    zero = kx.Int(0)

    def cmp(sym: str, x: kx.Expr) -> kx.Expr:
        return kx.Cmp(sym, x, zero)

    table = {
        ir.BinOp.LE: (cmp("<=", hi), cmp("<=", lo)),
        ir.BinOp.LT: (cmp("<", hi), cmp("<", lo)),
        ir.BinOp.GE: (cmp(">=", lo), cmp(">=", hi)),
        ir.BinOp.GT: (cmp(">", lo), cmp(">", hi)),
        ir.BinOp.EQ: (kx.And(cmp("==", lo), cmp("==", hi)), kx.And(cmp("<=", lo), cmp(">=", hi))),
        ir.BinOp.NE: (
            kx.Or(cmp(">", lo), cmp("<", hi)),
            kx.Not(kx.And(cmp("==", lo), cmp("==", hi))),
        ),
    }
    return table[op]


class TileCode:
    """Scalar code for intervals and (must, may) pairs over a tile: `lines`
    are the statements, the returned expressions read their names."""

    def __init__(self, reads: dict[ir.Index, str] | None = None) -> None:
        self.lines: list[kx.Stmt] = []
        self._n = 0
        self._truths: dict[ir.Expr, Truth] = {}
        # With `reads`, comparisons of runtime data are classified too: each
        # read of an input has the interval `{name}_lo .. {name}_hi` over the
        # tile (the kernel defines those names), and `b` is the batch index.
        # Without, any tile may hold a visible pair of them, none is whole.
        self.reads = reads

    def _tmp(self, stem: str) -> str:
        self._n += 1
        return f"{stem}{self._n}"

    def _set(self, name: str, value: kx.Expr) -> kx.Var:
        self.lines.append(kx.Assign(name, value))
        return kx.Var(name)

    def _assign(self, stem: str, lo: kx.Expr, hi: kx.Expr) -> tuple[kx.Expr, kx.Expr]:
        name = self._tmp(stem)
        return self._set(f"{name}_lo", lo), self._set(f"{name}_hi", hi)

    def interval(self, e: ir.Expr) -> tuple[kx.Expr, kx.Expr]:
        if isinstance(e, ir.Index):
            assert self.reads is not None
            name = self.reads[e]
            return kx.Var(f"{name}_lo"), kx.Var(f"{name}_hi")
        if isinstance(e, ir.Name) and e.id == "b":
            return kx.Var("batch"), kx.Var("batch")
        value = constant_value(e)
        if value is not None:  # `abs(-2)`: one literal, not tl calls on ints
            return kx.Int(value), kx.Int(value)
        a = affine(e)
        if a is not None:
            a = clean(a)
            if set(a) <= {""}:
                c = kx.Int(a.get("", 0))
                return c, c
            return affine_bound(a, upper=False), affine_bound(a, upper=True)
        if isinstance(e, ir.Unary):  # negation of a non-affine expression
            lo, hi = self.interval(e.operand)
            return kx.Neg(kx.Paren(hi)), kx.Neg(kx.Paren(lo))
        if isinstance(e, ir.Binary):
            return self._binary(e)
        assert isinstance(e, ir.Call)
        if e.fn == "abs":
            lo, hi = self.interval(e.args[0])
            zero = kx.Int(0)
            return self._assign(
                "abs",
                kx.Where(
                    kx.Cmp(">=", lo, zero),
                    lo,
                    kx.Where(kx.Cmp("<=", hi, zero), kx.Neg(kx.Paren(hi)), zero),
                ),
                kx.Max(kx.Abs(lo), kx.Abs(hi)),
            )
        (alo, ahi), (blo, bhi) = self.interval(e.args[0]), self.interval(e.args[1])
        fn = kx.Min if e.fn == "min" else kx.Max
        return self._assign(e.fn, fn(alo, blo), fn(ahi, bhi))

    def _binary(self, e: ir.Binary) -> tuple[kx.Expr, kx.Expr]:
        if e.op is ir.BinOp.FLOORDIV:
            lo, hi = self.interval(e.left)
            c = int_arg(e.right)
            return self._assign("div", kx.FloorDiv(lo, c), kx.FloorDiv(hi, c))
        if e.op is ir.BinOp.MOD:
            lo, hi = self.interval(e.left)
            c = int_arg(e.right)
            # Exact while the range does not wrap around a multiple of c.
            name = self._tmp("mod")
            mod_lo, mod_hi = kx.FloorMod(lo, c), kx.FloorMod(hi, c)
            # hi - c >= lo, not hi - lo >= c: hi - lo can reach 2^31 when
            # both bounds are near +-2^30, hi - c cannot (1 <= c <= 2^30).
            wraps = self._set(
                f"{name}_wraps",
                kx.Or(
                    kx.Cmp(">=", kx.sub(kx.Paren(hi), kx.Int(c)), kx.Paren(lo)),
                    kx.Cmp(">", mod_lo, mod_hi),
                ),
            )
            return (
                self._set(f"{name}_lo", kx.Where(wraps, kx.Int(0), mod_lo)),
                self._set(f"{name}_hi", kx.Where(wraps, kx.Int(c - 1), mod_hi)),
            )
        (alo, ahi), (blo, bhi) = self.interval(e.left), self.interval(e.right)
        if e.op is ir.BinOp.ADD:
            return self._assign("add", kx.add(alo, blo), kx.add(ahi, bhi))
        if e.op is ir.BinOp.SUB:
            return self._assign(
                "sub", kx.sub(alo, kx.Paren(bhi)), kx.sub(ahi, kx.Paren(blo))
            )  # fmt: skip
        assert e.op is ir.BinOp.MUL
        name = self._tmp("mul")
        corners = [
            self._set(f"{name}_{i}", kx.mul(kx.Paren(x), kx.Paren(y)))
            for i, (x, y) in enumerate((x, y) for x in (alo, ahi) for y in (blo, bhi))
        ]
        c = corners
        return (
            self._set(f"{name}_lo", kx.Min(kx.Min(c[0], c[1]), kx.Min(c[2], c[3]))),
            self._set(f"{name}_hi", kx.Max(kx.Max(c[0], c[1]), kx.Max(c[2], c[3]))),
        )

    def truth(self, e: ir.Expr) -> Truth:
        """(must, may) for a desugared boolean expression."""
        if e not in self._truths:  # `causal & window(L)` tests k <= q twice
            self._truths[e] = self._truth(e)
        return self._truths[e]

    def _truth(self, e: ir.Expr) -> Truth:
        if isinstance(e, ir.Name):  # the mask `full`
            return kx.TRUE, kx.TRUE
        if isinstance(e, ir.Unary):
            must, may = self.truth(e.operand)
            return self._bools(kx.not_(may), kx.not_(must))
        assert isinstance(e, ir.Binary)
        if e.op in (ir.BinOp.AND, ir.BinOp.OR):
            (am, ay), (bm, by) = self.truth(e.left), self.truth(e.right)
            join = kx.and_ if e.op is ir.BinOp.AND else kx.or_
            return self._bools(join(am, bm), join(ay, by))
        return self._compare(e)

    def _bools(self, must: kx.Expr, may: kx.Expr) -> Truth:
        if isinstance(must, kx.Bool) and isinstance(may, kx.Bool):
            return must, may
        name = self._tmp("m")
        return self._set(f"{name}_must", must), self._set(f"{name}_may", may)

    def _compare(self, e: ir.Binary) -> Truth:
        self.lines.append(kx.Comment(print_expr(e)))
        if ir.reads_runtime_data(e):
            if self.reads is None:
                # Decided by runtime data: any tile may hold a visible pair,
                # none is known to be whole.
                return kx.FALSE, kx.TRUE
            return self._data_compare(e)
        # Work on d = left - right, compared with 0.
        d = difference(e)
        if d is not None:
            return self._affine_compare(e.op, d)
        lo, hi = self.interval(ir.Binary(ir.BinOp.SUB, e.left, e.right))
        return self._bools(*compare_interval(e.op, lo, hi))

    def _data_compare(self, e: ir.Binary) -> Truth:
        """(must, may) of `left op right` from the two sides' intervals, with
        no difference taken: a comparison that reads an input is evaluated as
        written (its sides are within +-2^62, their difference need not be)."""
        (alo, ahi), (blo, bhi) = self.interval(e.left), self.interval(e.right)
        cmp = kx.Cmp
        single = kx.And(kx.And(cmp("==", alo, ahi), cmp("==", blo, bhi)), cmp("==", alo, blo))
        table = {
            ir.BinOp.LT: (cmp("<", ahi, blo), cmp("<", alo, bhi)),
            ir.BinOp.LE: (cmp("<=", ahi, blo), cmp("<=", alo, bhi)),
            ir.BinOp.GT: (cmp(">", alo, bhi), cmp(">", ahi, blo)),
            ir.BinOp.GE: (cmp(">=", alo, bhi), cmp(">=", ahi, blo)),
            ir.BinOp.EQ: (single, kx.And(cmp("<=", alo, bhi), cmp("<=", blo, ahi))),
            ir.BinOp.NE: (kx.Or(cmp("<", ahi, blo), cmp("<", bhi, alo)), kx.Not(single)),
        }
        return self._bools(*table[e.op])

    def _affine_compare(self, op: ir.BinOp, d: Affine) -> Truth:
        """Compare sum(c_i v_i) + c0 with 0, written as `positive <= negative`."""
        const = d.get("", 0)
        variables = sorted(v for v in d if v)
        if not variables:
            value = kx.Bool(CONSTANT_TRUTH[op](const))
            return value, value

        def side(upper: bool) -> tuple[kx.Expr, kx.Expr]:
            # Bound of d: terms with c > 0 on the left, c < 0 on the right.
            left, right = [], []
            for v in variables:
                c = d[v]
                lo, hi = _RANGES[v]
                name = hi if (c > 0) == upper else lo
                (left if c > 0 else right).append((abs(c), name))
            return (
                _linear(left, max(const, 0)) if left or const > 0 else kx.Int(0),
                _linear(right, max(-const, 0)) if right or const < 0 else kx.Int(0),
            )

        (hl, hr), (ll, lr) = side(True), side(False)
        # d_hi is hl - hr, d_lo is ll - lr.
        cmp = kx.Cmp
        table = {
            ir.BinOp.LE: (cmp("<=", hl, hr), cmp("<=", ll, lr)),
            ir.BinOp.LT: (cmp("<", hl, hr), cmp("<", ll, lr)),
            ir.BinOp.GE: (cmp(">=", ll, lr), cmp(">=", hl, hr)),
            ir.BinOp.GT: (cmp(">", ll, lr), cmp(">", hl, hr)),
            ir.BinOp.EQ: (
                kx.And(cmp("<=", hl, hr), cmp(">=", ll, lr)),
                kx.And(cmp("<=", ll, lr), cmp(">=", hl, hr)),
            ),
            ir.BinOp.NE: (
                kx.Or(cmp(">", ll, lr), cmp("<", hl, hr)),
                kx.Not(kx.And(cmp("<=", hl, hr), cmp(">=", ll, lr))),
            ),
        }
        return self._bools(*table[op])
