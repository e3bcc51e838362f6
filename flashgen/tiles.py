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

import math

from flashgen import ir
from flashgen import kernel_expr as kx
from flashgen.element_code import constant_value
from flashgen.mask_forms import (
    CONSTANT_TRUTH,
    FLIPPED,
    NEGATED,
    Affine,
    affine,
    clean,
    difference,
    hides_every_pair,
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


# --------------------------------------------------------------------------- #
# Exact emptiness of conjunctions
# --------------------------------------------------------------------------- #
# `TileCode.truth` joins the (must, may) of a mask's parts, so `may` of
# `A & B` is may(A) & may(B): sound, but a tile where A holds only at pairs
# where B fails still counts as maybe visible (`prefix(2) & window(64)` far
# below the diagonal, `window(L) & !window(L)`, `(q - k) % 3 == 1 & causal
# & k <= q + 1` on a diagonal tile).  `visible_may` instead reads the mask
# as a disjunction of conjunctions and decides each conjunction of ranges of
# q, of k and of d = q - k, congruences of d, and one excluded value of d,
# exactly over the tile: the ranges of q and k shrink the tile, d ranges
# over every integer between its corners, and the first d in range with the
# wanted residue either fits or not.  Other comparisons (chunks, h, div,
# products) keep their own may.

DNF_LIMIT = 64  # conjunctions at most; beyond, `truth`'s may
# Bounds past every position a tile can hold change nothing but could leave
# int32 once added to: they are clamped to this.
_CLAMP = 2 * ir.POSITION_BOUND + 1


def disjuncts(e: ir.Expr) -> tuple[list[tuple[ir.Expr, ...]], bool] | None:
    """A mask in negation normal form as a disjunction of conjunctions of
    comparisons (`abs`, `min` and `max` compared with a constant split), less
    the conjunctions empty whatever the tile, and whether there were such; or
    None past DNF_LIMIT conjunctions."""
    if isinstance(e, ir.Binary) and e.op in (ir.BinOp.AND, ir.BinOp.OR):
        left, right = disjuncts(e.left), disjuncts(e.right)
        if left is None or right is None:
            return None
        if e.op is ir.BinOp.OR:
            out = left[0] + right[0]
        else:
            out = [a + b for a in left[0] for b in right[0]]
        kept = [x for x in out if not _Box(x).empty()]
        if len(kept) > DNF_LIMIT:
            return None
        return kept, left[1] or right[1] or len(kept) < len(out)
    split = _split_abs(e) or _split_min_max(e)
    if split is not None:
        return disjuncts(split)
    return [(e,)], False


def _split_min_max(e: ir.Expr) -> ir.Expr | None:
    """`max(a, b) > c` as `a > c | b > c`, `min(a, b) < c` as `a < c & b < c`,
    and their kin; == and != stay whole."""
    found = _call_compared(e, ("min", "max"))
    if found is None or found[1] in (ir.BinOp.EQ, ir.BinOp.NE):
        return None
    call, op, right = found
    above = op in (ir.BinOp.GT, ir.BinOp.GE)  # max(a, b) > c: either is
    join = ir.BinOp.OR if above == (call.fn == "max") else ir.BinOp.AND
    a, b = call.args
    return ir.Binary(join, ir.Binary(op, a, right), ir.Binary(op, b, right))


def _call_compared(e: ir.Expr, fns: tuple[str, ...]) -> tuple[ir.Call, ir.BinOp, ir.Expr] | None:
    """A comparison with a call of one of `fns` on either side, as (call, op,
    other side) read with the call on the left; None for anything else."""
    if not (isinstance(e, ir.Binary) and e.op in FLIPPED):
        return None
    left, op, right = e.left, e.op, e.right
    if isinstance(right, ir.Call) and right.fn in fns:
        left, op, right = right, FLIPPED[op], left
    return (left, op, right) if isinstance(left, ir.Call) and left.fn in fns else None


def _split_abs(e: ir.Expr) -> ir.Expr | None:
    """`abs(x) op c` with x affine and c constant, as comparisons of x."""
    found = _call_compared(e, ("abs",))
    c = None if found is None else constant_value(found[2])
    if c is None:
        return None
    (x,), op = found[0].args, found[1]
    if affine(x) is None or (op in (ir.BinOp.EQ, ir.BinOp.NE) and c < 0):
        return None
    pos, neg = ir.Num(c), ir.Num(-c)
    # -c < x < c (and <=); x > c or x < -c (and >=); x == c or x == -c; both !=.
    join = {ir.BinOp.LT: ir.BinOp.AND, ir.BinOp.LE: ir.BinOp.AND, ir.BinOp.NE: ir.BinOp.AND}
    other = op if op in (ir.BinOp.EQ, ir.BinOp.NE) else FLIPPED[op]
    return ir.Binary(join.get(op, ir.BinOp.OR), ir.Binary(op, x, pos), ir.Binary(other, x, neg))


def _range_of(op: ir.BinOp, bound: int) -> tuple[int | None, int | None] | None:
    """`x op bound` as an integer range of x (None ends: unbounded)."""
    return {
        ir.BinOp.LE: (None, bound),
        ir.BinOp.LT: (None, bound - 1),
        ir.BinOp.GE: (bound, None),
        ir.BinOp.GT: (bound + 1, None),
        ir.BinOp.EQ: (bound, bound),
    }.get(op)


def _position_form(a: Affine) -> tuple[str, int] | None:
    """A form over q, k as (`q`, `k` or `d`, sign): sign * that + const."""
    variables = {v: c for v, c in a.items() if v}
    if variables in ({"q": 1}, {"k": 1}):
        return next(iter(variables)), 1
    if variables in ({"q": -1}, {"k": -1}):
        return next(iter(variables)), -1
    if variables == {"q": 1, "k": -1}:
        return "d", 1
    if variables == {"q": -1, "k": 1}:
        return "d", -1
    return None


def _constraint(e: ir.Expr) -> tuple | None:
    """An atom as ("range", var, lo, hi), ("mod", n, r, equal) or ("not", c)
    on d = q - k, or None: left to `truth`."""
    if not (isinstance(e, ir.Binary) and e.op in FLIPPED) or ir.reads_runtime_data(e):
        return None
    d = difference(e)
    if d is not None:
        form = _position_form(d)
        if form is None:
            return None
        var, sign = form
        op, bound = e.op, -d.get("", 0)  # sign * var op bound
        if sign < 0:
            op, bound = FLIPPED[op], -bound
        if op is ir.BinOp.NE:
            return ("not", bound) if var == "d" else None
        lo, hi = _range_of(op, bound)
        return ("range", var, lo, hi)
    if e.op not in (ir.BinOp.EQ, ir.BinOp.NE):
        return None
    left, right = e.left, e.right
    if not (isinstance(left, ir.Binary) and left.op is ir.BinOp.MOD):
        left, right = right, left
    r = constant_value(right)
    if not (isinstance(left, ir.Binary) and left.op is ir.BinOp.MOD) or r is None:
        return None
    n, x = constant_value(left.right), affine(left.left)
    form = None if x is None else _position_form(clean(x))
    if not n or n <= 0 or not 0 <= r < n or form is None or form[0] != "d":
        return None
    # (sign * d + c0) % n == r  <=>  d % n == sign * (r - c0) % n
    residue = form[1] * (r - x.get("", 0)) % n
    return ("mod", n, residue, e.op is ir.BinOp.EQ)


def _negated(e: ir.Expr) -> ir.Expr | None:
    if isinstance(e, ir.Binary) and e.op in NEGATED:
        return ir.Binary(NEGATED[e.op], e.left, e.right)
    return None


def _clamped(x: int | None) -> int | None:
    return None if x is None else max(-_CLAMP, min(_CLAMP, x))


class _Box:
    """One conjunction's ranges of q, k, d, its congruences and excluded
    values of d, and the atoms left to `truth`."""

    def __init__(self, atoms: tuple[ir.Expr, ...]) -> None:
        self.ranges: dict[str, list[int | None]] = {v: [None, None] for v in "qkd"}
        self.mods: list[tuple[int, int, bool]] = []
        self.excluded: list[int] = []
        self.rest: list[ir.Expr] = []
        for atom in atoms:
            c = _constraint(atom)
            if c is None:
                self.rest.append(atom)
            elif c[0] == "range":
                _, var, lo, hi = c
                r = self.ranges[var]
                r[0] = lo if r[0] is None else r[0] if lo is None else max(r[0], lo)
                r[1] = hi if r[1] is None else r[1] if hi is None else min(r[1], hi)
            elif c[0] == "mod":
                self.mods.append(c[1:])
            else:
                self.excluded.append(c[1])
        self._merge_congruences()

    def _merge_congruences(self) -> None:
        """d % n1 == r1 and d % n2 == r2 as one congruence modulo lcm(n1, n2)
        (the Chinese remainder theorem), or `clash` where none solves both."""
        self.clash = False
        wanted = [(n, r) for n, r, equal in self.mods if equal]
        if len(wanted) < 2:
            return
        n, r = wanted[0]
        for m, t in wanted[1:]:
            g = math.gcd(n, m)
            if (t - r) % g:
                self.clash = True
                return
            lcm = n // g * m
            if lcm > ir.INT_MAGNITUDE_MAX:
                return  # left as they are: each decided alone
            # r + n * x == t (mod m): x == (t - r) / g * inverse(n / g) (mod m / g)
            x = (t - r) // g * pow(n // g, -1, m // g) % (m // g) if m // g > 1 else 0
            n, r = lcm, (r + n * x) % lcm
        self.mods = [(n, r, True)] + [c for c in self.mods if not c[2]]

    def empty(self) -> bool:
        """Empty whatever the tile: a range inverted, residues that clash, a
        comparison beside its negation."""
        if any(_negated(a) in self.rest for a in self.rest):
            return True
        if any(lo is not None and hi is not None and lo > hi for lo, hi in self.ranges.values()):
            return True
        if self.clash:
            return True  # d % n1 == r1 and d % n2 == r2 have no common solution
        wanted = [(n, r) for n, r, equal in self.mods if equal]
        # d % n == r fixes d % m for every m dividing n
        return any(
            n % m == 0 and r % m == t for m, t, equal in self.mods if not equal for n, r in wanted
        )

    def joint(self) -> bool:
        """Whether deciding the constraints together can differ from
        joining their separate mays."""
        ranged = {v for v, (lo, hi) in self.ranges.items() if lo is not None or hi is not None}
        checks = len(self.mods) + len(self.excluded)
        return ("d" in ranged and len(ranged) > 1) or (checks and (ranged or checks > 1))


def visible_may(tiles: TileCode, mask: ir.Expr, may: kx.Expr) -> kx.Expr:
    """`may` of a mask in negation normal form, exact for conjunctions of
    ranges of q, k and q - k, congruences and excluded values of q - k (see
    above); `may` (`tiles.truth`'s) where no conjunction gains by it."""
    found = disjuncts(mask)
    if found is None:
        return may
    terms, dropped = found
    boxes = [_Box(atoms) for atoms in terms]
    if not dropped and not any(b.joint() for b in boxes):
        return may
    out: kx.Expr = kx.FALSE
    for box in boxes:
        out = kx.or_(out, kx.FALSE if box.empty() else _box_may(tiles, box))
    return out


def _box_may(tiles: TileCode, box: _Box) -> kx.Expr:
    name = tiles._tmp("box")
    ok: kx.Expr = kx.TRUE
    ends = {}
    for var in "qk":
        lo_name, hi_name = _RANGES[var]
        lo, hi = (_clamped(x) for x in box.ranges[var])
        a = kx.Var(lo_name) if lo is None else kx.Max(kx.Var(lo_name), kx.Int(lo))
        b = kx.Var(hi_name) if hi is None else kx.Min(kx.Var(hi_name), kx.Int(hi))
        if lo is not None or hi is not None:
            a, b = tiles._set(f"{name}_{var}lo", a), tiles._set(f"{name}_{var}hi", b)
            ok = kx.and_(ok, kx.Cmp("<=", a, b))
        ends[var] = a, b
    (qa, qb), (ka, kb) = ends["q"], ends["k"]
    lo, hi = (_clamped(x) for x in box.ranges["d"])
    dlo: kx.Expr = kx.sub(qa, kx.Paren(kb))
    dhi: kx.Expr = kx.sub(qb, kx.Paren(ka))
    dlo = tiles._set(f"{name}_dlo", dlo if lo is None else kx.Max(dlo, kx.Int(lo)))
    dhi = tiles._set(f"{name}_dhi", dhi if hi is None else kx.Min(dhi, kx.Int(hi)))
    ok = kx.and_(ok, kx.Cmp("<=", dlo, dhi))
    for n, r, equal in box.mods:
        if equal:  # the first d >= dlo with d % n == r is at most dhi
            step = kx.FloorMod(kx.Paren(kx.sub(kx.Int(r), kx.FloorMod(dlo, n))), n)
            ok = kx.and_(ok, kx.Cmp("<=", kx.add(dlo, step), dhi))
        else:
            ok = kx.and_(
                ok, kx.Or(kx.Cmp(">", dhi, dlo), kx.Cmp("!=", kx.FloorMod(dlo, n), kx.Int(r)))
            )
    for c in box.excluded:
        ok = kx.and_(ok, kx.Or(kx.Cmp(">", dhi, dlo), kx.Cmp("!=", dlo, kx.Int(c))))
    for atom in box.rest:
        ok = kx.and_(ok, tiles.truth(atom)[1])
    return tiles._set(f"{name}_may", ok)


# --------------------------------------------------------------------------- #
# Residue classes (decision 085)
# --------------------------------------------------------------------------- #
# A congruence of q - k, such as `(q - k) % 4 == 0`, hides pairs inside every
# tile of consecutive positions, so no tile is whole.  Split queries and keys
# by position mod n (n a multiple of every such modulus) instead: on the rows
# of one query class and one key class, q - k mod n is one residue r, every
# congruence is then true or false, and the mask is a mask of ranges whose
# tiles the usual analysis classifies.


def residue_masks(
    mask: ir.Expr, max_step: int
) -> tuple[int, tuple[tuple[int, ir.Expr], ...]] | None:
    """A mask in negation normal form as (n, ((r, mask on q - k = r mod n),
    ...)): n the lcm of the moduli of its congruences of q - k (at most
    `max_step`), each residue r whose mask may hold, that mask with every such
    congruence decided (`full` where nothing else is left).  None where the
    mask has no congruence of q - k or n would pass max_step."""
    moduli = set()

    def collect(e: ir.Expr) -> None:
        if isinstance(e, ir.Binary) and e.op in (ir.BinOp.AND, ir.BinOp.OR):
            collect(e.left)
            collect(e.right)
        elif isinstance(e, ir.Unary):
            collect(e.operand)
        else:
            c = _constraint(e)
            if c is not None and c[0] == "mod" and c[1] > 1:
                moduli.add(c[1])

    collect(mask)
    if not moduli:
        return None
    n = math.lcm(*moduli)
    if n > max_step:
        return None
    out = []
    for r in range(n):
        part = _decided(mask, r)
        if part is True:
            out.append((r, ir.FULL))
        elif part is not False and not hides_every_pair(part):
            out.append((r, part))
    return n, tuple(out)


def _decided(e: ir.Expr, r: int) -> ir.Expr | bool:
    """`e` where q - k = r mod every congruence's modulus: True (`full`),
    False, or the mask left."""
    if isinstance(e, ir.Binary) and e.op in (ir.BinOp.AND, ir.BinOp.OR):
        a, b = _decided(e.left, r), _decided(e.right, r)
        if e.op is ir.BinOp.AND:
            if a is False or b is False:
                return False
            return b if a is True else a if b is True else ir.Binary(e.op, a, b)
        if a is True or b is True:
            return True
        return b if a is False else a if b is False else ir.Binary(e.op, a, b)
    if isinstance(e, ir.Unary):
        inner = _decided(e.operand, r)
        return (not inner) if isinstance(inner, bool) else ir.Unary(e.op, inner)
    if e == ir.FULL:
        return True
    c = _constraint(e)
    if c is not None and c[0] == "mod" and c[1] > 1:
        _, m, t, equal = c
        return (r % m == t) == equal
    return e
