"""Tile classification and loop bounds: a mask in negation normal form in,
kernel scalar code (`flashgen.kernel_expr` trees) out.

* **Classification.**  Each integer sub-expression of the mask gets an
  interval over a (query tile x key tile) rectangle, and each boolean one a
  pair (`must`, `may`): true for every pair in the rectangle / for at least
  one.  Affine sub-expressions are normalised first, so their intervals are
  exact (q - k over two independent ranges is exact); `div`, `%`, `abs`,
  `min`, `max` and products get sound (possibly loose) intervals.  The kernel
  evaluates this scalar code once per key tile: `must` means the tile needs
  no elementwise mask, `not may` that it is skipped without loading K or V.
  See docs/MASKS.md.

* **Position bounds.**  Conjunctions of comparisons that bound k by an
  affine function of q (causal, windows), and `q div C == k div C` (chunks),
  give the range of key positions a query tile can see at all (and the
  converse for queries); the loops run only over that range.

* **Interior.**  The same comparisons, read the other way, give the keys
  that *every* query of a tile sees: tiles inside that interval run in a
  loop with no mask and no branch, which Triton can software-pipeline.
"""

from __future__ import annotations

from flashgen import ir
from flashgen import kernel_expr as kx
from flashgen.element_code import constant_value
from flashgen.mask_forms import (
    CONSTANT_TRUTH,
    FLIPPED,
    Affine,
    affine,
    chunk_match,
    clean,
    difference,
    int_arg,
    is_comparison,
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
_OTHER_RANGES = {
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

Bounds = tuple["kx.Expr | None", "kx.Expr | None"]
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


def _affine_bound(a: Affine, upper: bool, ranges=_RANGES) -> kx.Expr:
    """The max (upper) or min of an affine form over the ranges."""
    terms = []
    for v in sorted(x for x in a if x):
        c = a[v]
        lo, hi = ranges[v]
        terms.append((c, hi if (c > 0) == upper else lo))
    return _linear(terms, a.get("", 0))


def _compare_interval(op: ir.BinOp, lo: kx.Expr, hi: kx.Expr) -> Truth:
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

    def __init__(self) -> None:
        self.lines: list[kx.Stmt] = []
        self._n = 0
        self._truths: dict[ir.Expr, Truth] = {}

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
        value = constant_value(e)
        if value is not None:  # `abs(-2)`: one literal, not tl calls on ints
            return kx.Int(value), kx.Int(value)
        a = affine(e)
        if a is not None:
            a = clean(a)
            if set(a) <= {""}:
                c = kx.Int(a.get("", 0))
                return c, c
            return _affine_bound(a, upper=False), _affine_bound(a, upper=True)
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
        # Work on d = left - right, compared with 0.
        d = difference(e)
        if d is not None:
            return self._affine_compare(e.op, d)
        lo, hi = self.interval(ir.Binary(ir.BinOp.SUB, e.left, e.right))
        return self._bools(*_compare_interval(e.op, lo, hi))

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


# --------------------------------------------------------------------------- #
# Position bounds: what some pair of the tile can see
# --------------------------------------------------------------------------- #


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
            return kx.combine(alo, blo, kx.Max), kx.combine(ahi, bhi, kx.Min)
        lo = None if alo is None or blo is None else kx.combine(alo, blo, kx.Min)
        hi = None if ahi is None or bhi is None else kx.combine(ahi, bhi, kx.Max)
        return lo, hi
    if is_comparison(e):
        free = _free_truth(e, var)
        if free is not None:
            return _all_or_none(free[1])
        return _compare_bounds(e, var)
    return None, None


def _all_or_none(cond: kx.Expr) -> Bounds:
    """Every position where `cond` holds, none where it does not: bounds at
    kx.FAR, a position no tile reaches, for "unbounded" and "empty" alike."""
    if cond == kx.TRUE:
        return None, None
    far, near = kx.FAR, kx.Neg(kx.FAR)
    if cond == kx.FALSE:
        return far, near
    return kx.Where(cond, near, far), kx.Where(cond, far, near)


def _free_truth(e: ir.Binary, var: str) -> Truth | None:
    """(must, may) over the other variable's tile of an affine comparison
    that does not mention `var` (`k < P` when bounding queries), or None."""
    d = difference(e)
    if d is None or var in d:
        return None
    if set(d) <= {""}:
        value = kx.Bool(CONSTANT_TRUTH[e.op](d.get("", 0)))
        return value, value
    ranges = _OTHER_RANGES[var]
    return _compare_interval(e.op, _affine_bound(d, False, ranges), _affine_bound(d, True, ranges))


def _compare_bounds(e: ir.Binary, var: str) -> Bounds:
    chunk = _chunk_range(e, var)
    if chunk is not None:
        lo, hi, c = chunk  # var lies in A's chunks
        return _chunk_start(lo, c), _chunk_end(hi, c)
    isolated = _isolate(e, var)
    if isolated is None:
        return None, None
    op, lo, hi = isolated
    one = kx.Int(1)
    return {
        ir.BinOp.LE: (None, hi),
        ir.BinOp.LT: (None, kx.sub(hi, one)),
        ir.BinOp.GE: (lo, None),
        ir.BinOp.GT: (kx.add(lo, one), None),
        ir.BinOp.EQ: (lo, hi),
        ir.BinOp.NE: (None, None),
    }[op]


def _isolate(e: ir.Binary, var: str) -> tuple[ir.BinOp, kx.Expr, kx.Expr] | None:
    """Read an affine comparison as `var op rest`, with var's coefficient ±1:
    op and rest's min and max over the other variable's tile."""
    d = difference(e)
    if d is None:
        return None
    coeff = d.pop(var, 0)
    if coeff not in (1, -1):
        return None
    # coeff * var + rest  op  0   <=>   var  op'  -coeff * rest
    rest = {v: -coeff * c for v, c in d.items()}
    op = e.op if coeff == 1 else FLIPPED[e.op]
    ranges = _OTHER_RANGES[var]
    return op, _affine_bound(rest, False, ranges), _affine_bound(rest, True, ranges)


def _chunk_range(e: ir.Binary, var: str) -> tuple[kx.Expr, kx.Expr, int] | None:
    """For `A div C == var div C`: A's min and max over the other variable's
    tile, and C."""
    match = chunk_match(e, var)
    if match is None:
        return None
    inner, c = match
    ranges = _OTHER_RANGES[var]
    return _affine_bound(inner, False, ranges), _affine_bound(inner, True, ranges), c


# Chunks wider than this get their bounds clamped to the sentinel: the start
# of A's chunk is A - (c - 1) at the least and its end A + c - 1, which for A
# and c near 2^30 leaves int32 (and the kernels add a tile or q_offset more).
_CLAMPED_CHUNK = ir.POSITION_BOUND


def _chunk_start(a: kx.Expr, c: int) -> kx.Expr:
    """The first position of a's chunk of size c."""
    start = kx.mul(kx.FloorDiv(a, c), kx.Int(c))
    return start if c <= _CLAMPED_CHUNK else kx.Max(start, kx.Neg(kx.FAR))


def _chunk_end(a: kx.Expr, c: int) -> kx.Expr:
    """The last position of a's chunk of size c.  Clamped for wide chunks,
    which is sound for bounds of either kind: no position reaches the
    sentinel."""
    start = kx.mul(kx.FloorDiv(a, c), kx.Int(c))
    if c <= _CLAMPED_CHUNK:
        return kx.add(start, kx.Int(c - 1))
    return kx.add(kx.Min(start, kx.sub(kx.FAR, kx.Int(c - 1))), kx.Int(c - 1))


# --------------------------------------------------------------------------- #
# Interior bounds: what every pair of the tile sees
# --------------------------------------------------------------------------- #


def interior_bounds(e: ir.Expr, var: str) -> Bounds | None:
    """Inclusive (lo, hi) positions of `var` visible to *every* position of
    the other variable's tile, or None where no such interval is found.

    `e` is a desugared mask in negation normal form; a side that is None is
    unbounded.  Sound, not always tight: an `|` whose operands' intervals do
    not touch keeps the first one.
    """
    if isinstance(e, ir.Name):  # the mask `full`
        return None, None
    if isinstance(e, ir.Binary) and e.op is ir.BinOp.AND:
        a, b = interior_bounds(e.left, var), interior_bounds(e.right, var)
        if a is None or b is None:
            return None
        return kx.combine(a[0], b[0], kx.Max), kx.combine(a[1], b[1], kx.Min)
    if isinstance(e, ir.Binary) and e.op is ir.BinOp.OR:
        for one, other in ((e.left, e.right), (e.right, e.left)):
            free = _free_truth(one, var) if is_comparison(one) else None
            if free is not None:
                # Everything where `one` holds for the whole tile, else other's.
                rest = interior_bounds(other, var)
                if rest is None or isinstance(free[0], kx.Bool):
                    return _all_or_none(free[0])
                lo, hi = rest
                return (
                    None if lo is None else kx.Where(free[0], kx.Neg(kx.FAR), lo),
                    None if hi is None else kx.Where(free[0], kx.FAR, hi),
                )
        a, b = interior_bounds(e.left, var), interior_bounds(e.right, var)
        if a is None or b is None:
            return a or b
        return _union(a, b)
    if is_comparison(e):
        free = _free_truth(e, var)
        if free is not None:
            return _all_or_none(free[0])
        return _compare_interior(e, var)
    return None


def _union(a: Bounds, b: Bounds) -> Bounds:
    """An interval inside the union of two: their hull where they touch."""
    (alo, ahi), (blo, bhi) = a, b
    if (alo is None) != (blo is None) or (ahi is None) != (bhi is None):
        return a
    touch = [
        kx.Cmp("<=", x, kx.add(y, kx.Int(1)))
        for x, y in ((alo, bhi), (blo, ahi))
        if x is not None and y is not None
    ]
    if not touch:  # both reach -inf or both reach +inf: they overlap
        return kx.combine(alo, blo, kx.Min), kx.combine(ahi, bhi, kx.Max)
    cond = kx.And(*touch) if len(touch) == 2 else kx.Paren(touch[0])
    lo = None if alo is None else kx.Where(cond, kx.combine(alo, blo, kx.Min), alo)
    hi = None if ahi is None else kx.Where(cond, kx.combine(ahi, bhi, kx.Max), ahi)
    return lo, hi


def _compare_interior(e: ir.Binary, var: str) -> Bounds | None:
    chunk = _chunk_range(e, var)
    if chunk is not None:
        # When all of A lies in one chunk, that chunk: from A's last chunk's
        # start to its first chunk's end, empty when A spans two chunks.
        lo, hi, c = chunk
        return _chunk_start(hi, c), _chunk_end(lo, c)
    isolated = _isolate(e, var)
    if isolated is None:
        return None
    # var op rest must hold for every value of rest over the tile.
    op, lo, hi = isolated
    one = kx.Int(1)
    return {
        ir.BinOp.LE: (None, lo),
        ir.BinOp.LT: (None, kx.sub(lo, one)),
        ir.BinOp.GE: (hi, None),
        ir.BinOp.GT: (kx.add(hi, one), None),
        ir.BinOp.EQ: (hi, lo),
        ir.BinOp.NE: None,
    }[op]
