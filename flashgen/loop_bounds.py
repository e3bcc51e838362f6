"""Loop bounds: a mask in negation normal form in, the ranges the kernels'
loops walk out, as `flashgen.kernel_expr` trees over the other side's tile.

* **Position bounds.**  Conjunctions of comparisons that bound k by an
  affine function of q (causal, windows), and `q div C == k div C` (chunks),
  give the range of key positions a query tile can see at all (and the
  converse for queries); the loops run only over that range.  Anything else
  leaves the range open and the per-tile test does the skipping.  A
  comparison of heads alone (`h % 2 == 0`) holds for every tile of a
  program or for none: all or nothing.

* **Interior.**  The same comparisons, read the other way, give the keys
  that *every* query of a tile sees: tiles inside that interval run in a
  loop with no mask and no branch, which Triton can software-pipeline; only
  the tiles before and after it pay for the elementwise mask.
"""

from __future__ import annotations

import numpy as np

from flashgen import ir
from flashgen import kernel_expr as kx
from flashgen.element_code import ElementCode
from flashgen.mask_forms import CONSTANT_TRUTH, FLIPPED, chunk_match, difference, is_comparison
from flashgen.tiles import OTHER_RANGES, Truth, affine_bound, compare_interval

Bounds = tuple["kx.Expr | None", "kx.Expr | None"]  # None: unbounded on that side

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
        weaker = _without_extremum(e) if ir.mentions(e, frozenset({var})) else None
        if weaker is not None:
            return position_bounds(weaker, var)
        return _compare_bounds(e, var)
    return None, None


def key_spans(e: ir.Expr) -> tuple[Bounds, Bounds] | None:
    """Two spans of key positions, (lo, hi) each as `key_bounds` gives them,
    that hold every key a query tile can see, where `e` (negation normal
    form) is a union or an intersection with one: the bounds of each side
    (with the rest of the intersection), so that a loop between two
    interiors walks only the tiles of either span (`causal & (k < 64 | k >=
    q - 256)`: keys 0 .. 63 and q - 256 .. q, not every key up to q).  None
    for any other mask."""
    parts = _union_sides(e)
    if parts is None:
        return None
    return position_bounds(parts[0], "k"), position_bounds(parts[1], "k")


def _union_sides(e: ir.Expr) -> tuple[ir.Expr, ir.Expr] | None:
    """`e` as `A | B` (X & (A | B) as X & A | X & B), or None."""
    if isinstance(e, ir.Binary) and e.op is ir.BinOp.OR:
        return e.left, e.right
    if isinstance(e, ir.Binary) and e.op is ir.BinOp.AND:
        for this, other in ((e.left, e.right), (e.right, e.left)):
            sides = _union_sides(this)
            if sides is not None:
                return tuple(ir.Binary(ir.BinOp.AND, other, side) for side in sides)
    return None


def _without_extremum(e: ir.Binary) -> ir.Expr | None:
    """`max(a, b) == c` (min, abs(x) as max(x, -x)), which the negation
    normal form leaves whole (it splits only the comparisons that split
    exactly, mask_forms), read as the weaker `a <= c & b <= c` (min: `>=`):
    bounds taken from it hold for the comparison, so that `max(k, h) == 20`
    bounds k by 20 where it once left a union's keys unbounded.  None for
    any other comparison."""
    left, right = e.left, e.right
    if not _extremum(left):
        left, right = right, left
    if e.op is not ir.BinOp.EQ or not _extremum(left):
        return None
    args = left.args if left.fn != "abs" else (left.args[0], ir.Unary(ir.UnaryOp.NEG, left.args[0]))
    op = ir.BinOp.GE if left.fn == "min" else ir.BinOp.LE
    return ir.Binary(ir.BinOp.AND, *(ir.Binary(op, arg, right) for arg in args))


def _extremum(e: ir.Expr) -> bool:
    return isinstance(e, ir.Call) and (e.fn, len(e.args)) in (("max", 2), ("min", 2), ("abs", 1))


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
    if d is None and _of_heads_only(e):
        # h % 2 == 0, max(h, 3) > 5: one truth for every tile of a program.
        cond = ElementCode().expr(e)
        return cond, cond
    if d is None or var in d:
        return None
    if set(d) <= {""}:
        value = kx.Bool(CONSTANT_TRUTH[e.op](d.get("", 0)))
        return value, value
    ranges = OTHER_RANGES[var]
    return compare_interval(e.op, affine_bound(d, False, ranges), affine_bound(d, True, ranges))


def _of_heads_only(e: ir.Expr) -> bool:
    """Whether `e` reads no position, batch index, score or runtime data:
    a function of the head and constants, a scalar in every kernel."""
    return not ir.mentions(e, _PER_ELEMENT) and not ir.reads_runtime_data(e)


_PER_ELEMENT = frozenset({"q", "k", "b", "s"})


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
    ranges = OTHER_RANGES[var]
    return op, affine_bound(rest, False, ranges), affine_bound(rest, True, ranges)


def _chunk_range(e: ir.Binary, var: str) -> tuple[kx.Expr, kx.Expr, int] | None:
    """For `A div C == var div C`: A's min and max over the other variable's
    tile, and C."""
    match = chunk_match(e, var)
    if match is None:
        return None
    inner, c = match
    ranges = OTHER_RANGES[var]
    return affine_bound(inner, False, ranges), affine_bound(inner, True, ranges), c


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
    the other variable's tile, or None where no such interval is found: the
    first of `interiors`."""
    found = interiors(e, var)
    return None if found is None else found[0]


# Intervals an interior keeps: a union with a gap (`causal | k >= q + 27`,
# `abs(q - k) >= 40`) has two, and the kernels run the tiles of each without
# the mask.  More are dropped (an interior may always be smaller than the
# truth), the ones that cover least of the sample tiles below first.
MAX_INTERIORS = 2


def interiors(e: ir.Expr, var: str) -> tuple[Bounds, ...] | None:
    """Up to MAX_INTERIORS intervals of `var` positions visible to *every*
    position of the other variable's tile, or None where none is found.

    `e` is a desugared mask in negation normal form; a side that is None is
    unbounded.  Sound, not always tight: `&` intersects each interval of one
    side with each of the other, `|` keeps the intervals of both (their hull
    where two touch), and past MAX_INTERIORS intervals the narrowest go.
    """
    if isinstance(e, ir.Name):  # the mask `full`
        return ((None, None),)
    if isinstance(e, ir.Binary) and e.op is ir.BinOp.AND:
        a, b = interiors(e.left, var), interiors(e.right, var)
        if a is None or b is None:
            return None
        return _widest(
            [(kx.combine(x[0], y[0], kx.Max), kx.combine(x[1], y[1], kx.Min)) for x in a for y in b]
        )
    if isinstance(e, ir.Binary) and e.op is ir.BinOp.OR:
        for one, other in ((e.left, e.right), (e.right, e.left)):
            free = _free_truth(one, var) if is_comparison(one) else None
            if free is not None:
                # Everything where `one` holds for the whole tile, else other's.
                rest = interiors(other, var)
                if rest is None or isinstance(free[0], kx.Bool):
                    return (_all_or_none(free[0]),)
                lo, hi = rest[0]
                first = (
                    None if lo is None else kx.Where(free[0], kx.Neg(kx.FAR), lo),
                    None if hi is None else kx.Where(free[0], kx.FAR, hi),
                )
                return (first, *rest[1:])
        a, b = interiors(e.left, var), interiors(e.right, var)
        if a is None or b is None:
            return a or b
        if len(a) == len(b) == 1:
            return _union(a[0], b[0])
        return _widest([*a, *b])
    if is_comparison(e):
        free = _free_truth(e, var)
        if free is not None:
            return (_all_or_none(free[0]),)
        found = _compare_interior(e, var)
        return None if found is None else (found,)
    return None


def _union(a: Bounds, b: Bounds) -> tuple[Bounds, ...]:
    """Intervals inside the union of two: their hull where they touch, else
    both (the second empty where they touch)."""
    (alo, ahi), (blo, bhi) = a, b
    if (alo is None) != (blo is None) or (ahi is None) != (bhi is None):
        # (-inf, x] and [y, +inf): the order of the kernels' loops.
        return (a, b) if alo is None or bhi is None else (b, a)
    touch = [
        kx.Cmp("<=", x, kx.add(y, kx.Int(1)))
        for x, y in ((alo, bhi), (blo, ahi))
        if x is not None and y is not None
    ]
    if not touch:  # both reach -inf or both reach +inf: they overlap
        return ((kx.combine(alo, blo, kx.Min), kx.combine(ahi, bhi, kx.Max)),)
    cond = kx.And(*touch) if len(touch) == 2 else kx.Paren(touch[0])
    lo = None if alo is None else kx.Where(cond, kx.combine(alo, blo, kx.Min), alo)
    hi = None if ahi is None else kx.Where(cond, kx.combine(ahi, bhi, kx.Max), ahi)
    # Both are finite here: b where they do not touch, else nothing.
    return (lo, hi), (kx.Where(cond, kx.FAR, blo), kx.Where(cond, kx.Neg(kx.FAR), bhi))


# Tiles of the other side (positions, inclusive) at which `_widest` weighs
# intervals: early, middle and late in a 4096-long sequence, 16 wide.
_SAMPLE_TILES = ((0, 15), (1000, 1015), (2040, 2055), (3000, 3015), (4080, 4095))
_SAMPLE_LENGTH = 4096


def _widest(found: list[Bounds]) -> tuple[Bounds, ...]:
    """The MAX_INTERIORS intervals of `found` that cover the most positions
    of the sample tiles, in their order; an interval that covers none of
    them goes when others remain.  Which intervals stay changes how many
    tiles run without the mask, never what is computed."""
    if len(found) <= 1:
        return tuple(found)
    widths = [_sample_width(bounds) for bounds in found]
    ranked = sorted(range(len(found)), key=lambda i: -widths[i])
    keep = sorted(i for i in ranked[:MAX_INTERIORS] if widths[i] > 0 or i == ranked[0])
    return tuple(found[i] for i in keep)


def _sample_width(bounds: Bounds) -> int:
    total = 0
    for other_lo, other_hi in _SAMPLE_TILES:
        for head, heads in ((0, 2), (1, 2)):
            env = {"q_lo": other_lo, "q_hi": other_hi, "k_lo": other_lo, "k_hi": other_hi}
            env.update(head=head, num_heads=heads)
            lo = 0 if bounds[0] is None else max(0, int(kx.evaluate(bounds[0], env)))
            hi = _SAMPLE_LENGTH - 1
            if bounds[1] is not None:
                hi = min(hi, int(kx.evaluate(bounds[1], env)))
            total += max(0, hi - lo + 1)
    return total


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


# --------------------------------------------------------------------------- #
# Census: how many tiles inside the bounds the tile test would skip
# --------------------------------------------------------------------------- #

# Query tiles of a 4096-long sequence at which `skipped_share` counts, 64 x 64
# (the kernels' usual tile), heads 0 and 1 of two.
_CENSUS_TILE = 64
_CENSUS_QUERY_TILES = tuple(range(0, _SAMPLE_LENGTH, 8 * _CENSUS_TILE))


def skipped_share(lines: list[kx.Stmt], may: kx.Expr, bounds: Bounds) -> float:
    """The share of the key tiles inside the key bounds whose tile test
    (`may`, after the tile code `lines`) says no pair is visible, over a
    sample of query tiles: what a loop that skips no tile would compute for
    nothing.  0.0 where the bounds hold no tile at the sample."""
    inside = skipped = 0
    for q_lo in _CENSUS_QUERY_TILES:
        for head in (0, 1):
            env: dict = dict(q_lo=np.int64(q_lo), q_hi=np.int64(q_lo + _CENSUS_TILE - 1))
            env.update(head=np.int64(head), num_heads=np.int64(2))
            lo = 0 if bounds[0] is None else max(0, int(kx.evaluate(bounds[0], env)))
            hi = _SAMPLE_LENGTH - 1
            if bounds[1] is not None:
                hi = min(hi, int(kx.evaluate(bounds[1], env)))
            for k_lo in range(lo // _CENSUS_TILE * _CENSUS_TILE, hi + 1, _CENSUS_TILE):
                tile = dict(env, k_lo=np.int64(k_lo), k_hi=np.int64(k_lo + _CENSUS_TILE - 1))
                kx.run(lines, tile)
                inside += 1
                skipped += not bool(kx.evaluate(may, tile))
    return skipped / inside if inside else 0.0
