"""Masks as forms the lowering can read: a checked mask in, facts about it out.

Named masks are desugared into the comparisons that define them and `!` is
pushed down to the comparisons (negation normal form); integer expressions
are read as affine forms sum(c_i * v_i) + c0 where they are affine.  On top
of those forms: which comparisons bound k - q (`k_minus_q`), whether the mask
hides every key after its query (`keys_before_queries`), whether every
tile inside the loop bounds has a visible pair (`edges_dense`), and whether
the kernels test each tile for emptiness at all (`skip_tile_test`).  Nothing here
writes kernel code; `flashgen.tiles` turns these forms into scalar code.
"""

from __future__ import annotations

import math

from flashgen import grad, ir

_INT_OPS = {ir.BinOp.ADD, ir.BinOp.SUB, ir.BinOp.MUL, ir.BinOp.FLOORDIV, ir.BinOp.MOD}


def kind(e: ir.Expr) -> ir.Kind:
    """Kind of a checked expression (the checker has rejected mixes)."""
    if isinstance(e, ir.Num):
        return ir.Kind.INT if isinstance(e.value, int) else ir.Kind.REAL
    if isinstance(e, ir.Name):
        if e.id in ir.INT_VARIABLES:
            return ir.Kind.INT
        if e.id in ir.NAMED_MASKS:
            return ir.Kind.BOOL
        return ir.Kind.REAL  # s, alibi
    if isinstance(e, ir.Index):  # checked: it knows its input's element type
        return ir.Kind.INT if e.element is not None and e.element.is_integer else ir.Kind.REAL
    if isinstance(e, ir.Unary):
        return ir.Kind.BOOL if e.op is ir.UnaryOp.NOT else kind(e.operand)
    if isinstance(e, ir.Binary):
        if e.op in ir.COMPARISONS or e.op in (ir.BinOp.AND, ir.BinOp.OR):
            return ir.Kind.BOOL
        if e.op in _INT_OPS and kind(e.left) is kind(e.right) is ir.Kind.INT:
            return ir.Kind.INT
        return ir.Kind.REAL
    if e.fn in ir.MASK_FUNCTIONS:
        return ir.Kind.BOOL
    if e.fn in (grad.SIGN, grad.SELECT):
        return ir.Kind.REAL
    if e.fn in ir.POLY_FUNCTIONS and all(kind(a) is ir.Kind.INT for a in e.args):
        return ir.Kind.INT
    return ir.Kind.REAL


def int_arg(e: ir.Expr) -> int:
    assert isinstance(e, ir.Num) and isinstance(e.value, int), e
    return e.value


def _cmp(op: ir.BinOp, a: ir.Expr, b: ir.Expr) -> ir.Expr:
    return ir.Binary(op, a, b)


Q, K = ir.Name("q"), ir.Name("k")


def desugar_mask(e: ir.Expr) -> ir.Expr:
    """Replace named masks by the comparisons that define them."""
    if isinstance(e, ir.Name):
        if e.id == "causal":
            return _cmp(ir.BinOp.LE, K, Q)
        return e
    if isinstance(e, ir.Call) and e.fn in ir.MASK_FUNCTIONS:
        vals = [int_arg(a) for a in e.args]
        if e.fn == "window":
            left, right = vals[0], vals[1] if len(vals) > 1 else 0
            upper = ir.Binary(ir.BinOp.ADD, Q, ir.Num(right)) if right else Q
            return ir.Binary(
                ir.BinOp.AND,
                _cmp(ir.BinOp.GE, K, ir.Binary(ir.BinOp.SUB, Q, ir.Num(left))),
                _cmp(ir.BinOp.LE, K, upper),
            )
        if e.fn == "prefix":
            return _cmp(ir.BinOp.LT, K, ir.Num(vals[0]))
        c = ir.Num(vals[0])  # chunk
        return _cmp(
            ir.BinOp.EQ,
            ir.Binary(ir.BinOp.FLOORDIV, Q, c),
            ir.Binary(ir.BinOp.FLOORDIV, K, c),
        )
    if isinstance(e, ir.Unary):
        inner = desugar_mask(e.operand)
        truth = _truth(inner)
        if truth is not None:
            return constant(not truth)
        if is_comparison(inner):  # `!(q == k)` is `q != k`, which may split
            return desugar_mask(_cmp(NEGATED[inner.op], inner.left, inner.right))
        return ir.Unary(e.op, inner)
    if isinstance(e, ir.Binary) and e.op in (ir.BinOp.AND, ir.BinOp.OR):
        return _junction(e.op, desugar_mask(e.left), desugar_mask(e.right))
    if not is_comparison(e):
        return e
    e = _cmp(e.op, _fold_int(e.left), _fold_int(e.right))
    truth = decided(e)
    if truth is not None:
        return constant(truth)
    for split_rule in (_unequal_split, _abs_split, _extremum_split):
        if (split := split_rule(e)) is not None:
            return split
    return e


# --------------------------------------------------------------------------- #
# Folding by value ranges
# --------------------------------------------------------------------------- #

# The values the integer variables take in every call (docs/LANGUAGE.md,
# Positions and alignment): keys from 0, queries anywhere (negative under
# bottom-right alignment when Nq > Nk), heads and batch rows from 0, at least
# one head.  The kernels evaluate masks past the last key or query too, but
# those pairs are hidden by the bounds test, whatever the mask says there.
VALUE_RANGES: dict[str, tuple[float, float]] = {
    "q": (-math.inf, math.inf),
    "k": (0, math.inf),
    "h": (0, math.inf),
    "H": (1, math.inf),
    "b": (0, math.inf),
}


def constant(truth: bool) -> ir.Expr:
    """The mask `full`, or `!full`: what a comparison decided by the value
    ranges becomes."""
    return ir.FULL if truth else ir.Unary(ir.UnaryOp.NOT, ir.FULL)


def hides_every_pair(e: ir.Expr) -> bool:
    """Does the (desugared, NNF) mask hide every pair: `!full`, an `&` with
    such an operand (reads of runtime data may stand beside it), or an `|`
    of such operands?"""
    if isinstance(e, ir.Binary) and e.op in (ir.BinOp.AND, ir.BinOp.OR):
        sides = hides_every_pair(e.left), hides_every_pair(e.right)
        return any(sides) if e.op is ir.BinOp.AND else all(sides)
    return _truth(e) is False


def _truth(e: ir.Expr) -> bool | None:
    if e == ir.FULL:
        return True
    if isinstance(e, ir.Unary) and e.op is ir.UnaryOp.NOT and e.operand == ir.FULL:
        return False
    return None


def _junction(op: ir.BinOp, a: ir.Expr, b: ir.Expr) -> ir.Expr:
    """a & b or a | b, a constant side folded in: `x & full` is x, `x | full`
    is full.  A side that reads runtime data is kept beside an absorbing
    constant, so that the kernels read every input the spec reads."""
    for x, y in ((a, b), (b, a)):
        truth = _truth(x)
        if truth is None:
            continue
        if truth is (op is ir.BinOp.AND):  # the identity: full for &, !full for |
            return y
        if not ir.reads_inputs(y):
            return x
    return _dedupe(ir.Binary(op, a, b))


def int_range(e: ir.Expr) -> tuple[float, float] | None:
    """Inclusive (lo, hi) of an integer expression over VALUE_RANGES (either
    side may be infinite), or None for what is not an integer expression of
    the variables (a read of runtime data, a real)."""
    if isinstance(e, ir.Num):
        return (e.value, e.value) if isinstance(e.value, int) else None
    if isinstance(e, ir.Name):
        return VALUE_RANGES.get(e.id)
    if isinstance(e, ir.Unary) and e.op is ir.UnaryOp.NEG:
        r = int_range(e.operand)
        return None if r is None else (-r[1], -r[0])
    if isinstance(e, ir.Binary) and e.op in _INT_OPS:
        a = int_range(e.left)
        if e.op in (ir.BinOp.FLOORDIV, ir.BinOp.MOD):
            c = e.right.value if isinstance(e.right, ir.Num) else None
            if a is None or not isinstance(c, int) or c <= 0:
                return None
            if e.op is ir.BinOp.FLOORDIV:
                return tuple(x if math.isinf(x) else x // c for x in a)
            if not any(map(math.isinf, a)) and a[0] // c == a[1] // c:
                return a[0] % c, a[1] % c
            return 0, c - 1
        b = int_range(e.right)
        if a is None or b is None:
            return None
        if e.op is ir.BinOp.ADD:
            return a[0] + b[0], a[1] + b[1]
        if e.op is ir.BinOp.SUB:
            return a[0] - b[1], a[1] - b[0]
        corners = [0 if x == 0 or y == 0 else x * y for x in a for y in b]
        return min(corners), max(corners)
    if isinstance(e, ir.Call) and e.fn in ir.POLY_FUNCTIONS:
        args = [int_range(x) for x in e.args]
        if None in args:
            return None
        if e.fn == "abs":
            lo, hi = args[0]
            return (lo, hi) if lo >= 0 else (-hi, -lo) if hi <= 0 else (0, max(-lo, hi))
        pick = min if e.fn == "min" else max
        return pick(r[0] for r in args), pick(r[1] for r in args)
    return None


def _fold_int(e: ir.Expr) -> ir.Expr:
    """`e` with every integer subexpression that has one value in every call
    written as that value (`q % 1` is 0)."""
    r = int_range(e)
    if r is not None and r[0] == r[1]:
        return ir.Num(int(r[0]))
    if isinstance(e, ir.Unary) and e.op is ir.UnaryOp.NEG:
        return ir.Unary(e.op, _fold_int(e.operand))
    if isinstance(e, ir.Binary) and e.op in _INT_OPS and kind(e) is ir.Kind.INT:
        return ir.Binary(e.op, _fold_int(e.left), _fold_int(e.right))
    if isinstance(e, ir.Call) and e.fn in ir.POLY_FUNCTIONS and kind(e) is ir.Kind.INT:
        return ir.Call(e.fn, tuple(_fold_int(x) for x in e.args))
    return e


def decided(e: ir.Binary) -> bool | None:
    """The truth of a comparison of integers that the value ranges decide
    (`-abs(h) <= 5` holds everywhere, `k < 0` nowhere), or None."""
    a, b = int_range(e.left), int_range(e.right)
    if a is None or b is None:
        return None
    lo, hi = a[0] - b[1], a[1] - b[0]  # of left - right
    truth = {
        ir.BinOp.LT: (hi < 0, lo >= 0),
        ir.BinOp.LE: (hi <= 0, lo > 0),
        ir.BinOp.GT: (lo > 0, hi <= 0),
        ir.BinOp.GE: (lo >= 0, hi < 0),
        ir.BinOp.EQ: (lo == hi == 0, lo > 0 or hi < 0),
        ir.BinOp.NE: (lo > 0 or hi < 0, lo == hi == 0),
    }[e.op]
    return True if truth[0] else False if truth[1] else None


def _unequal_split(e: ir.Binary) -> ir.Expr | None:
    """`A != B` as `A < B | A > B`, for A and B affine with a position in
    their difference: the same pairs, as two comparisons that bound k by q
    (`q != k` gives the keys before and after a query tile as interiors, `k
    != 0` every key past the first).  None otherwise."""
    if e.op is not ir.BinOp.NE or affine(e.left) is None or affine(e.right) is None:
        return None
    if not {"q", "k"} & set(difference(e) or ()):
        return None
    below, above = _cmp(ir.BinOp.LT, e.left, e.right), _cmp(ir.BinOp.GT, e.left, e.right)
    return _junction(ir.BinOp.OR, desugar_mask(below), desugar_mask(above))


def _abs_split(e: ir.Expr) -> ir.Expr | None:
    """`abs(A) < X` as `A < X & -A < X`, `abs(A) > X` as `A > X | -A > X`
    (<= and >= alike, abs on either side), for A and X affine in positions:
    the same pairs, but as comparisons that bound k by q, so a band spelled
    with abs gets the loop bounds and interior of a window.  None otherwise."""
    order = (ir.BinOp.LT, ir.BinOp.LE, ir.BinOp.GT, ir.BinOp.GE)
    if not isinstance(e, ir.Binary) or e.op not in order:
        return None
    op, left, right = e.op, e.left, e.right
    if not _is_abs(left):
        op, left, right = FLIPPED[op], right, left
    if not _is_abs(left) or affine(left.args[0]) is None or affine(right) is None:
        return None
    a = left.args[0]
    join = ir.BinOp.AND if op in (ir.BinOp.LT, ir.BinOp.LE) else ir.BinOp.OR
    return ir.Binary(join, _cmp(op, a, right), _cmp(op, ir.Unary(ir.UnaryOp.NEG, a), right))


def _extremum_split(e: ir.Expr) -> ir.Expr | None:
    """`max(A, B) > X` as `A > X | B > X` and `max(A, B) < X` as `A < X & B < X`;
    `min` the other way round (<= and >= alike, the call on either side), for
    X affine in positions, and A and B split again where they are such calls:
    the same pairs, as comparisons that bound k by q (`max(q, k) > 37` is
    `q > 37 | k > 37`, whose keys past 37 every query sees), where the whole
    gave the loops neither bounds nor an interior.  None otherwise."""
    order = (ir.BinOp.LT, ir.BinOp.LE, ir.BinOp.GT, ir.BinOp.GE)
    if not isinstance(e, ir.Binary) or e.op not in order:
        return None
    op, left, right = e.op, e.left, e.right
    if not _is_extremum(left):
        op, left, right = FLIPPED[op], right, left
    if not _is_extremum(left) or affine(right) is None:
        return None
    a, b = left.args
    above = op in (ir.BinOp.GT, ir.BinOp.GE)
    join = ir.BinOp.OR if (left.fn == "max") == above else ir.BinOp.AND
    return desugar_mask(ir.Binary(join, _cmp(op, a, right), _cmp(op, b, right)))


def _is_extremum(e: ir.Expr) -> bool:
    return isinstance(e, ir.Call) and e.fn in ("max", "min") and len(e.args) == 2


def _is_abs(e: ir.Expr) -> bool:
    return isinstance(e, ir.Call) and e.fn == "abs" and len(e.args) == 1


def _dedupe(e: ir.Binary) -> ir.Expr:
    """Drop repeated operands of an & or | chain (`causal & window(L)`), and
    merge its comparisons of one affine form with constants (`_merged`)."""
    unique: list[ir.Expr] = []
    for x in operands(e, e.op):
        if x not in unique:
            unique.append(x)
    return chain(e.op, _merged(e.op, unique))


def operands(e: ir.Expr, op: ir.BinOp) -> list[ir.Expr]:
    """The operands of the `op` chain `e`, left to right."""
    if isinstance(e, ir.Binary) and e.op is op:
        return operands(e.left, op) + operands(e.right, op)
    return [e]


def chain(op: ir.BinOp, items: list[ir.Expr]) -> ir.Expr:
    """items[0] op items[1] op ..., grouped from the left."""
    out = items[0]
    for x in items[1:]:
        out = ir.Binary(op, out, x)
    return out


def _values(e: ir.Expr) -> tuple[tuple[tuple[str, int], ...], float, float] | None:
    """A comparison of an affine form with a constant (`k < 288`, `q - k >= 3`)
    as (L, lo, hi): its linear part L (variables and coefficients, the first
    coefficient positive) and the integers lo .. hi (inclusive, either side may
    be infinite) that L takes where it holds, clipped to L's range over
    VALUE_RANGES.  None for other expressions and for `!=`."""
    if not is_comparison(e) or e.op is ir.BinOp.NE:
        return None
    d = difference(e)
    if d is None or not set(d) - {""}:
        return None
    c, op = d.pop("", 0), e.op
    terms = tuple(sorted(d.items()))
    if terms[0][1] < 0:  # L + c op 0 with L negated: -L - c flipped op 0
        terms, c, op = tuple((v, -x) for v, x in terms), -c, FLIPPED[op]
    lo, hi = {
        ir.BinOp.LT: (-math.inf, -c - 1),
        ir.BinOp.LE: (-math.inf, -c),
        ir.BinOp.GT: (-c + 1, math.inf),
        ir.BinOp.GE: (-c, math.inf),
        ir.BinOp.EQ: (-c, -c),
    }[op]
    low, high = _linear_range(terms)
    return terms, max(lo, low), min(hi, high)


def _linear_range(terms: tuple[tuple[str, int], ...]) -> tuple[float, float]:
    """The values sum(x * v) takes over VALUE_RANGES (either side may be infinite)."""
    ends = [
        (x * VALUE_RANGES[v][0], x * VALUE_RANGES[v][1])[:: 1 if x > 0 else -1] for v, x in terms
    ]
    return sum(e[0] for e in ends), sum(e[1] for e in ends)


def _merged(op: ir.BinOp, items: list[ir.Expr]) -> list[ir.Expr]:
    """The operands of an & (op AND) or | chain with its comparisons of one
    affine form L with constants merged, as sets of integers: a comparison
    whose set holds (for |) or lies in (for &) another's is dropped (`k < 9
    | k < 5` is `k < 9`, `k >= 3 & k >= 5` is `k >= 5`); comparisons whose
    sets cover every value of L (for |: `k < 288 | k >= 247`) or share none
    (for &: `k < 5 & k > 9`) become the absorbing constant, beside the
    operands that read runtime data (`_junction`).  Then each nested `|` of an
    `&` chain (`&` of an `|` chain) is read where the chain's comparisons
    leave it open (`_in_context`).  Exact over all integers, so every pair
    keeps its visibility."""
    values = [_values(x) for x in items]
    dropped = set()
    for i, a in enumerate(values):
        for j, b in enumerate(values):
            if a is None or b is None or i == j or j in dropped or a[0] != b[0]:
                continue
            inner, outer = (a, b) if op is ir.BinOp.OR else (b, a)
            if outer[1] <= inner[1] and inner[2] <= outer[2] and (inner != outer or j < i):
                dropped.add(i)
                break
    groups: dict[tuple, list[tuple[float, float]]] = {}
    for i, a in enumerate(values):
        if a is not None and i not in dropped:
            groups.setdefault(a[0], []).append(a[1:])
    for terms, spans in groups.items():
        if op is ir.BinOp.AND:
            absorbed = max(s[0] for s in spans) > min(s[1] for s in spans)
        else:  # the spans leave no value of L out
            absorbed = not _gaps(terms, spans)
        if absorbed:
            return [constant(op is ir.BinOp.OR)] + [x for x in items if ir.reads_inputs(x)]
    kept = [x for i, x in enumerate(items) if i not in dropped]
    identity, absorbing = constant(op is ir.BinOp.AND), constant(op is ir.BinOp.OR)
    # Where the other operands leave the chain's value open (where an & chain's
    # comparisons all hold, where an | chain's all fail), each form L lies in
    # one interval, when it does.
    context = {}
    for terms, spans in groups.items():
        if op is ir.BinOp.AND:
            context[terms] = max(s[0] for s in spans), min(s[1] for s in spans)
        elif len(gaps := _gaps(terms, spans)) == 1:
            context[terms] = gaps[0]
    kept = [x for x in (_in_context(x, op, context) for x in kept) if x != identity]
    if absorbing in kept:
        return [absorbing] + [x for x in kept if ir.reads_inputs(x)]
    return kept or [identity]


def _gaps(terms: tuple, spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The values of L (over VALUE_RANGES) in none of `spans`, as inclusive
    intervals in increasing order."""
    low, high = _linear_range(terms)
    gaps, reach = [], low - 1
    for lo, hi in sorted(spans):
        if lo > reach + 1:
            gaps.append((reach + 1, lo - 1))
        reach = max(reach, hi)
    if reach < high:
        gaps.append((reach + 1, high))
    return gaps


def _in_context(e: ir.Expr, op: ir.BinOp, context: dict[tuple, tuple[float, float]]) -> ir.Expr:
    """An operand of an `op` chain, read where the chain's own comparisons
    leave its value open, that is where form L lies in `context[L]`.

    - For an `|` inside an `&` chain: the disjuncts that cannot hold there are
      dropped (`k > q & (q div 12 == k div 12 | k <= q)` is `k > q & q div 12
      == k div 12`). If one disjunct holds throughout, the `|` is `full`
      (`k > q & (k < q - 268 | k > q)`). If none is left, it is `!full`.
    - For an `&` inside an `|` chain, the other way round: the conjuncts that
      hold throughout are dropped (`k <= q | k > q & q % 3 == 0` is `k <= q |
      q % 3 == 0`). If one cannot hold there, the `&` is `!full`. If none is
      left, it is `full`.

    An operand that reads runtime data is not folded to a constant."""
    inner = ir.BinOp.OR if op is ir.BinOp.AND else ir.BinOp.AND
    if not (isinstance(e, ir.Binary) and e.op is inner):
        return e
    kept = []
    for x in operands(e, inner):
        values = _values(x)
        span = context.get(values[0]) if values is not None else None
        if span is None:
            kept.append(x)
            continue
        covers = values[1] <= span[0] and span[1] <= values[2]
        meets = values[2] >= span[0] and values[1] <= span[1]
        if covers if inner is ir.BinOp.OR else not meets:  # decides the operand
            return e if ir.reads_inputs(e) else constant(inner is ir.BinOp.OR)
        if meets if inner is ir.BinOp.OR else not covers:  # may still matter
            kept.append(x)
    return chain(inner, kept) if kept else constant(inner is ir.BinOp.AND)


NEGATED = {
    ir.BinOp.EQ: ir.BinOp.NE,
    ir.BinOp.NE: ir.BinOp.EQ,
    ir.BinOp.LT: ir.BinOp.GE,
    ir.BinOp.GE: ir.BinOp.LT,
    ir.BinOp.LE: ir.BinOp.GT,
    ir.BinOp.GT: ir.BinOp.LE,
}


def negation_normal_form(e: ir.Expr, negate: bool = False) -> ir.Expr:
    """Push `!` down to the comparisons of a desugared mask (De Morgan),
    folding and merging the junctions it rebuilds as `desugar_mask` does."""
    if isinstance(e, ir.Unary) and e.op is ir.UnaryOp.NOT:
        return negation_normal_form(e.operand, not negate)
    if isinstance(e, ir.Binary) and e.op in (ir.BinOp.AND, ir.BinOp.OR):
        op = e.op
        if negate:
            op = ir.BinOp.OR if op is ir.BinOp.AND else ir.BinOp.AND
        left, right = negation_normal_form(e.left, negate), negation_normal_form(e.right, negate)
        return _junction(op, left, right)
    if negate and isinstance(e, ir.Binary) and e.op in NEGATED:
        return ir.Binary(NEGATED[e.op], e.left, e.right)
    if negate:
        return ir.Unary(ir.UnaryOp.NOT, e)
    return e


# Affine forms: {variable name or "": coefficient}, "" holding the constant.
Affine = dict[str, int]


def affine(e: ir.Expr) -> Affine | None:
    """sum(c_i * v_i) + c0 over q, k, h, H, or None if `e` is not affine."""
    if isinstance(e, ir.Num) and isinstance(e.value, int):
        return {"": e.value}
    if isinstance(e, ir.Name) and e.id in ir.INT_VARIABLES - {"b"}:
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


def clean(a: Affine) -> Affine:
    return {v: c for v, c in a.items() if c != 0}


def difference(e: ir.Binary) -> Affine | None:
    """left - right of a comparison as an affine form (zero terms dropped),
    so that the comparison reads `difference op 0`; None if not affine."""
    d = affine(ir.Binary(ir.BinOp.SUB, e.left, e.right))
    return None if d is None else clean(d)


K_MINUS_Q = ({"k": 1, "q": -1}, {"k": -1, "q": 1})


def k_minus_q(e: ir.Expr) -> tuple[ir.BinOp, int] | None:
    """A comparison of k - q with a constant, read as `k - q  op  bound`."""
    if not is_comparison(e):
        return None
    d = difference(e)
    if d is None:
        return None
    c = d.pop("", 0)
    if d not in K_MINUS_Q:
        return None
    # sign * (k - q) + c  op  0   <=>   k - q  op'  -sign * c
    sign = d["k"]
    return (e.op if sign == 1 else FLIPPED[e.op]), -sign * c


def keys_before_queries(mask: ir.Expr) -> bool:
    """Does the (desugared, NNF) mask hide every pair with k > q?

    True when an `&` chain holds a comparison that bounds k - q by 0 or
    less (causal, causal windows), or both sides of an `|` do.
    """
    if isinstance(mask, ir.Binary) and mask.op is ir.BinOp.AND:
        return keys_before_queries(mask.left) or keys_before_queries(mask.right)
    if isinstance(mask, ir.Binary) and mask.op is ir.BinOp.OR:
        return keys_before_queries(mask.left) and keys_before_queries(mask.right)
    read = k_minus_q(mask)
    if read is None:
        return False
    op, bound = read
    return (op in (ir.BinOp.LE, ir.BinOp.EQ) and bound <= 0) or (op is ir.BinOp.LT and bound <= 1)


CONSTANT_TRUTH = {
    ir.BinOp.LE: lambda c: c <= 0,
    ir.BinOp.LT: lambda c: c < 0,
    ir.BinOp.GE: lambda c: c >= 0,
    ir.BinOp.GT: lambda c: c > 0,
    ir.BinOp.EQ: lambda c: c == 0,
    ir.BinOp.NE: lambda c: c != 0,
}


FLIPPED = {
    ir.BinOp.LE: ir.BinOp.GE,
    ir.BinOp.GE: ir.BinOp.LE,
    ir.BinOp.LT: ir.BinOp.GT,
    ir.BinOp.GT: ir.BinOp.LT,
    ir.BinOp.EQ: ir.BinOp.EQ,
    ir.BinOp.NE: ir.BinOp.NE,
}


def is_comparison(e: ir.Expr) -> bool:
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
    reads = difference_reads(e, ir.BinOp.AND)
    if reads is None or any(op is ir.BinOp.NE for op, _ in reads):
        return False
    lo, hi = -math.inf, math.inf
    for read in reads:
        lo, hi = narrow_band(lo, hi, *read)
    return lo <= hi


def difference_reads(e: ir.Expr, junction: ir.BinOp) -> list[tuple[ir.BinOp, int]] | None:
    """The reads `k - q  op  bound` (`k_minus_q`) of a chain of `junction`
    (`&` or `|`) over comparisons of k - q; None if a term is anything else."""
    if isinstance(e, ir.Binary) and e.op is junction:
        a, b = difference_reads(e.left, junction), difference_reads(e.right, junction)
        return None if a is None or b is None else a + b
    read = k_minus_q(e)
    return None if read is None else [read]


def narrow_band(lo: float, hi: float, op: ir.BinOp, bound: int) -> tuple[float, float]:
    """The band lo <= k - q <= hi intersected with `k - q  op  bound`
    (unchanged by !=)."""
    if op in (ir.BinOp.LE, ir.BinOp.LT, ir.BinOp.EQ):
        hi = min(hi, bound - (op is ir.BinOp.LT))
    if op in (ir.BinOp.GE, ir.BinOp.GT, ir.BinOp.EQ):
        lo = max(lo, bound + (op is ir.BinOp.GT))
    return lo, hi


def edges_dense(e: ir.Expr) -> bool:
    """Does every tile inside the bounds have a visible pair?

    True for bands (`is_band`) and for the masks `diagonal_rows` accepts.
    The kernels then run the masked tiles on either side of the interior
    without a per-tile emptiness test, a branch that measured 7% of the
    forward and 14% of the backward of causal & chunk on an H200.
    """
    return is_band(e) or diagonal_rows(e) is not None


# The fewest query rows and keys of a tile the kernels launch with (every
# launch configuration's blocks are at least this large).
MIN_BLOCK = 16


def congruence_everywhere(e: ir.Expr) -> bool:
    """Does every tile of MIN_BLOCK consecutive queries by MIN_BLOCK
    consecutive keys, wherever it lies, hold a pair of `e`?

    True for a congruence of positions `(a*q + b*k + c) % n == r` (or `!=`)
    whose values over such a tile, a*i + b*j for i, j < MIN_BLOCK shifted by
    the tile's corner, reach every residue r could be (any other for `!=`),
    for `|` with one such side and `&` of two whose positions are
    independent (one on q alone, the other on k alone).  Heads and constants
    may enter the congruence: they shift the residues of a whole tile."""
    if isinstance(e, ir.Binary) and e.op is ir.BinOp.OR:
        return congruence_everywhere(e.left) or congruence_everywhere(e.right)
    if isinstance(e, ir.Binary) and e.op is ir.BinOp.AND:
        a, b = _congruence(e.left), _congruence(e.right)
        return bool(a and b and a[1] and b[1] and {a[0], b[0]} == {"q", "k"})
    form = _congruence(e)
    return form is not None and form[1]


def _congruence(e: ir.Expr) -> tuple[str, bool] | None:
    """A congruence of positions as (which positions it reads: "q", "k" or
    "qk", whether every MIN_BLOCK x MIN_BLOCK tile holds a pair of it), or None."""
    if not (isinstance(e, ir.Binary) and e.op in (ir.BinOp.EQ, ir.BinOp.NE)):
        return None
    left, right = e.left, e.right
    if not (isinstance(left, ir.Binary) and left.op is ir.BinOp.MOD):
        left, right = right, left
    if not (isinstance(left, ir.Binary) and left.op is ir.BinOp.MOD):
        return None
    r, n, x = affine(right), affine(left.right), affine(left.left)
    if r is None or n is None or x is None or set(r) - {""} or set(n) - {""}:
        return None
    r, n, x = r.get("", 0), n.get("", 0), clean(x)
    if n <= 0 or set(x) - {"q", "k", "h", "H", ""}:
        return None
    a, b = x.get("q", 0), x.get("k", 0)
    reads = ("q" if a else "") + ("k" if b else "")
    if not reads:
        return None
    steps = range(MIN_BLOCK)
    residues = {(a * i + b * j) % n for i in steps for j in steps}
    if e.op is ir.BinOp.EQ:
        # Shifted by the corner, the residues are all n when they were.
        return reads, 0 <= r < n and len(residues) == n
    return reads, len(residues) >= 2 or not 0 <= r < n


def narrow_gaps(e: ir.Expr) -> bool:
    """Does every tile of MIN_BLOCK consecutive queries by MIN_BLOCK
    consecutive keys, wherever it lies, hold a pair of `e`, for `e` a union
    (`|`) of comparisons of k - q with constants?  Such a tile spans
    2 * MIN_BLOCK - 1 consecutive values of k - q, so it does when the values
    the union hides form only finite runs shorter than that
    (`causal | k >= q + 27` hides 1 .. 26)."""
    reads = difference_reads(e, ir.BinOp.OR)
    if reads is None:
        return False
    spans: list[tuple[float, float]] = []
    for op, c in reads:
        if op is ir.BinOp.NE:
            spans.extend([(-math.inf, c - 1), (c + 1, math.inf)])
        else:
            spans.append(narrow_band(-math.inf, math.inf, op, c))
    spans.sort()
    if spans[0][0] != -math.inf or max(hi for _, hi in spans) != math.inf:
        return False
    reach = spans[0][1]
    for lo, hi in spans[1:]:
        if lo - reach - 1 >= 2 * MIN_BLOCK - 1:  # a hidden run a whole tile fits in
            return False
        reach = max(reach, hi)
    return True


def never_fills_a_tile(e: ir.Expr) -> bool:
    """Does every tile of MIN_BLOCK consecutive queries by MIN_BLOCK
    consecutive keys, wherever it lies, hide a pair of `e`?  True for a
    congruence of positions whose values over such a tile take two residues
    or more (for `!=`: every residue), and for `&` with one."""
    if isinstance(e, ir.Binary) and e.op is ir.BinOp.AND:
        return never_fills_a_tile(e.left) or never_fills_a_tile(e.right)
    if not (isinstance(e, ir.Binary) and e.op in (ir.BinOp.EQ, ir.BinOp.NE)):
        return False
    negated = ir.Binary(ir.BinOp.NE if e.op is ir.BinOp.EQ else ir.BinOp.EQ, e.left, e.right)
    form = _congruence(negated)
    return form is not None and form[1]


def skip_tile_test(e: ir.Expr) -> bool:
    """Whether the kernels run every tile inside the loop bounds of the
    masked loops without the per-tile emptiness test.  In a Triton loop that
    test is a branch around the tile's loads, which keeps the loop from
    pipelining them: it pays only where it skips tiles.

    True where every tile inside the bounds has a visible pair
    (`edges_dense`, and `congruence_everywhere`: tiles of fewer than
    MIN_BLOCK rows or keys, the last ones of a call, may be empty and run
    masked, which costs time but not correctness), and for a mask `&`
    such a congruence whose other side has dense edges (`causal & (q - k) %
    4 == 0`): its tiles inside the bounds hold a visible pair but where the
    dense side's pairs in the tile are fewer than the congruence's period,
    at most the edge tiles of that side."""
    if edges_dense(e) or congruence_everywhere(e):
        return True
    if isinstance(e, ir.Binary) and e.op is ir.BinOp.AND:
        for x, y in ((e.left, e.right), (e.right, e.left)):
            if congruence_everywhere(y) and skip_tile_test(x):
                return True
    return False


def positional_part(e: ir.Expr) -> ir.Expr | None:
    """A mask in negation normal form with each comparison that reads runtime
    data taken as true (None: true everywhere), as the kernels' tile tests
    take it: they classify only the positional terms, and leave the data's
    to the call's plan and the elementwise mask."""
    if isinstance(e, ir.Binary) and e.op in (ir.BinOp.AND, ir.BinOp.OR):
        a, b = positional_part(e.left), positional_part(e.right)
        if e.op is ir.BinOp.OR:
            return None if a is None or b is None else ir.Binary(e.op, a, b)
        return a if b is None else b if a is None else ir.Binary(e.op, a, b)
    return None if ir.reads_runtime_data(e) else e


def shift_invariant(e: ir.Expr) -> bool:
    """Whether `e` keeps its value when q and k are both moved by the same
    amount: every position it reads is read through an affine form whose q
    and k coefficients cancel (`k <= q`, `abs(q - k)`, ALiBi's distance), so
    it holds alike for positions counted from a row's start or from a
    document's.  `e` checked; a mask desugared."""
    if not ir.mentions(e, frozenset({"q", "k"})):
        return True
    if is_comparison(e):
        d = difference(e)
        if d is not None:
            return d.get("q", 0) + d.get("k", 0) == 0
    elif kind(e) is ir.Kind.INT:
        a = affine(e)
        if a is not None:
            return a.get("q", 0) + a.get("k", 0) == 0
    if isinstance(e, ir.Name):
        return False
    if isinstance(e, ir.Unary):
        return shift_invariant(e.operand)
    if isinstance(e, ir.Binary):
        return shift_invariant(e.left) and shift_invariant(e.right)
    return all(shift_invariant(a) for a in e.args)


def diagonal_rows(e: ir.Expr) -> bool | None:
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
        a, b = diagonal_rows(e.left), diagonal_rows(e.right)
        if e.op is ir.BinOp.OR:
            for x, y, other in ((a, b, e.right), (b, a, e.left)):
                if x and y is None and prefix_atom(other):
                    return True
        if a is None or b is None:
            return None
        return (a and b) if e.op is ir.BinOp.AND else (a or b)
    if not is_comparison(e):
        return None
    if chunk_match(e, "k") is not None and {e.left.left, e.right.left} == {Q, K}:
        return False
    read = k_minus_q(e)
    # k - q op bound must hold at k = q, i.e. 0 op bound, i.e. -bound op 0.
    if read is None or read[0] is ir.BinOp.NE or not CONSTANT_TRUTH[read[0]](-read[1]):
        return None
    # The rows are open below when op bounds k above.
    return read[0] in (ir.BinOp.LE, ir.BinOp.LT)


def prefix_atom(e: ir.Expr) -> bool:
    """`k < P` or `k <= P` (any constant P): keys 0 .. P-1 for every query."""
    d = difference(e) if is_comparison(e) else None
    if d is None:
        return False
    d.pop("", None)
    if d == {"k": 1}:
        return e.op in (ir.BinOp.LE, ir.BinOp.LT)
    if d == {"k": -1}:
        return e.op in (ir.BinOp.GE, ir.BinOp.GT)
    return False


def chunk_match(e: ir.Binary, var: str) -> tuple[Affine, int] | None:
    """For `A div C == var div C` with A affine and free of var: A's affine
    form and C."""
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
            if inner is None or clean(inner).get(var):
                return None
            return clean(inner), int_arg(a.right)
    return None
