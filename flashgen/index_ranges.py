"""Index ranges: which reads of a declared input could fall outside it, as data.

An index such as `doc[b, q]` or `rel[h, q - k + 15]` is an integer
expression over the positions, heads and batch of a call.  The kernels load
inputs through masked loads, so no read ever leaves the tensor; the language
still requires every index to lie within its dimension, and a call where it
might not is refused with a ValueError naming the input (docs/LANGUAGE.md,
"Inputs").  The rule is interval arithmetic, cheap enough to run on every call:

* `q` ranges over the call's query positions, `k` over its keys, `b` and `h`
  over the batch and the heads, `H` is the number of heads;
* the comparisons of positions that must hold for the read to happen
  narrow those ranges: for a read in `score`, the top-level `&` conjuncts
  of the mask; for a read in `mask`, the conjuncts on its left in the `&`
  chains around it (`&` reads its right side only where its left holds).
  Comparisons of `k - q` with a constant bound `d = k - q` (causal, windows),
  comparisons of `q` or `k` with a constant bound those;
* in an index, an affine part `a k + c q` with a and c of opposite signs is
  read as `a (k - q) + (a + c) q`, so that `q - k` under a window is as narrow
  as the window;
* `+ - * div % abs min max` follow the usual interval rules.  (An index may
  not read an input: `check` refuses that, so every index is a function of
  the call's sizes and positions.)

`ranges(variant)` returns one `IndexRange` per index that the rule cannot
settle at build time, as plain tuples; the generated module holds them as
data and evaluates them with its runtime's `_index_interval`
(flashgen/runtime.py), and the reference with `interval` here.  An index that
lies within a constant dimension whatever the call's sizes (`rel[h, q - k]`
under `window(15, 0)` in a table of 16), or is the batch or head index of a
dimension of that size, is settled here and left out.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from flashgen import ir
from flashgen.mask_forms import FLIPPED, affine, clean, desugar_mask, difference, is_comparison
from flashgen.mask_forms import k_minus_q, negation_normal_form

# An interval expression: nested tuples of str and int (see `interval`).
Node = tuple
# What must hold where a read happens: (d_lo, d_hi, q_lo, q_hi, k_lo, k_hi),
# None where unbounded; d = k - q.
Guard = tuple["int | None", ...]
OPEN: Guard = (None,) * 6


@dataclass(frozen=True)
class IndexRange:
    """Index `dim` of a read of input `input`: its interval expression, the
    guard that holds where it is read, and the dimension's size ("B", "H",
    "Hkv", "Nq", "Nk" or a constant)."""

    input: str
    dim: int
    size: str | int
    expr: Node
    guard: Guard

    def as_tuple(self) -> tuple:
        """What the generated module holds: plain Python literals."""
        return (self.input, self.dim, self.size, self.expr, self.guard)


def ranges(variant: ir.Variant) -> tuple[IndexRange, ...]:
    """Every index of `variant` that a call must check, once each."""
    return tuple(dict.fromkeys(r for r in indices(variant) if not _settled(r)))


def indices(variant: ir.Variant) -> list[IndexRange]:
    """Every index of every read of `variant`, with the guard of its read."""
    mask = negation_normal_form(desugar_mask(variant.mask))
    guarded = list(_mask_reads(mask, OPEN))
    score_guard = _facts(mask, OPEN)
    guarded += [(read, score_guard) for read in reads(variant.score)]
    found = []
    for read, guard in guarded:
        shape = next(i.shape for i in variant.inputs if i.name == read.input)
        for dim, (arg, size) in enumerate(zip(read.args, shape)):
            found.append(IndexRange(read.input, dim, size, encode(arg, variant), guard))
    return found


def _settled(entry: IndexRange) -> bool:
    """Whether the index lies within its dimension for every call."""
    if (entry.expr, entry.size) in ((("v", "b"), "B"), (("v", "h"), "H"), (("v", "k"), "Nk")):
        return True
    if not isinstance(entry.size, int):
        return False
    env = {"b": (0, ir.MAX_BATCH - 1), "h": (0, ir.MAX_HEADS - 1), "H": (1, ir.MAX_HEADS)}
    bound = ir.POSITION_BOUND
    lo, hi = interval(entry.expr, entry.guard, (-bound, bound), (-bound, bound), env)
    return lo > hi or (0 <= lo and hi < entry.size)


# --------------------------------------------------------------------------- #
# Reads and the facts that guard them
# --------------------------------------------------------------------------- #


def reads(e: ir.Expr) -> Iterator[ir.Index]:
    """Every read in `e` (an index reads no input: `check` refuses that)."""
    if isinstance(e, ir.Index):
        yield e
    elif isinstance(e, ir.Unary):
        yield from reads(e.operand)
    elif isinstance(e, ir.Binary):
        yield from reads(e.left)
        yield from reads(e.right)
    elif isinstance(e, ir.Call):
        for a in e.args:
            yield from reads(a)


def _mask_reads(e: ir.Expr, guard: Guard) -> Iterator[tuple[ir.Index, Guard]]:
    """The reads of a mask in negation normal form, each with the facts that
    hold where it is evaluated (the left sides of the `&` around it)."""
    if isinstance(e, ir.Binary) and e.op is ir.BinOp.AND:
        yield from _mask_reads(e.left, guard)
        yield from _mask_reads(e.right, _facts(e.left, guard))
    elif isinstance(e, ir.Binary) and e.op is ir.BinOp.OR:
        yield from _mask_reads(e.left, guard)
        yield from _mask_reads(e.right, guard)
    else:
        for read in reads(e):
            yield read, guard


def _facts(e: ir.Expr, guard: Guard) -> Guard:
    """`guard` narrowed by the position comparisons of the `&` chain `e`."""
    if isinstance(e, ir.Binary) and e.op is ir.BinOp.AND:
        return _facts(e.right, _facts(e.left, guard))
    if not is_comparison(e) or ir.reads_runtime_data(e):
        return guard
    bounds = _comparison_bounds(e)
    if bounds is None:
        return guard
    slot, lo, hi = bounds
    out = list(guard)
    if lo is not None:
        out[2 * slot] = lo if out[2 * slot] is None else max(out[2 * slot], lo)
    if hi is not None:
        out[2 * slot + 1] = hi if out[2 * slot + 1] is None else min(out[2 * slot + 1], hi)
    return tuple(out)


def _comparison_bounds(e: ir.Binary) -> tuple[int, int | None, int | None] | None:
    """(slot, lo, hi) of `k - q` (slot 0), `q` (1) or `k` (2) that the
    comparison implies; None when it bounds none of them alone."""
    read = k_minus_q(e)
    if read is not None:
        slot, (op, c) = 0, read
    else:
        d = difference(e)
        if d is None or set(d) - {""} not in ({"q"}, {"k"}):
            return None
        (var,) = set(d) - {""}
        coef, const = d[var], d.get("", 0)
        if coef not in (1, -1):
            return None
        # coef * var + const  op  0   <=>   var  op'  -coef * const
        op = e.op if coef == 1 else FLIPPED[e.op]
        slot, c = (1 if var == "q" else 2), -coef * const
    if op is ir.BinOp.LE:
        return slot, None, c
    if op is ir.BinOp.LT:
        return slot, None, c - 1
    if op is ir.BinOp.GE:
        return slot, c, None
    if op is ir.BinOp.GT:
        return slot, c + 1, None
    if op is ir.BinOp.EQ:
        return slot, c, c
    return None


# --------------------------------------------------------------------------- #
# Index expressions as interval expressions
# --------------------------------------------------------------------------- #

_BINARY = {ir.BinOp.ADD: "+", ir.BinOp.MUL: "*"}


def encode(e: ir.Expr, variant: ir.Variant) -> Node:
    """The interval expression of an integer index expression."""
    a = affine(e)
    if a is not None and not isinstance(e, (ir.Num, ir.Name)):
        return _affine_node(clean(a))
    match e:
        case ir.Num(value=value):
            return ("n", value)
        case ir.Name(id=name):
            return ("v", name)
        case ir.Unary(op=ir.UnaryOp.NEG, operand=operand):
            return ("neg", encode(operand, variant))
        case ir.Binary(op=ir.BinOp.SUB, left=left, right=right):
            return ("+", encode(left, variant), ("neg", encode(right, variant)))
        case ir.Binary(op=op, left=left, right=right) if op in _BINARY:
            return (_BINARY[op], encode(left, variant), encode(right, variant))
        case ir.Binary(op=ir.BinOp.FLOORDIV, left=left, right=ir.Num(value=c)):
            return ("div", encode(left, variant), c)
        case ir.Binary(op=ir.BinOp.MOD, left=left, right=ir.Num(value=c)):
            return ("%", encode(left, variant), c)
        case ir.Call(fn="abs", args=(arg,)):
            return ("abs", encode(arg, variant))
        case ir.Call(fn=fn, args=args) if fn in ("min", "max"):
            node = encode(args[0], variant)
            for arg in args[1:]:
                node = (fn, node, encode(arg, variant))
            return node
    raise ValueError(f"not an integer index expression: {e!r}")


def _affine_node(a: Mapping[str, int]) -> Node:
    """sum of coefficient * variable + constant, with `a k + c q` (a, c of
    opposite signs) read as `a (k - q) + (a + c) q`."""
    a = dict(a)
    terms: list[Node] = []
    cq, ck = a.pop("q", 0), a.pop("k", 0)
    if cq and ck and (cq > 0) != (ck > 0):
        terms.append(_times(ck, ("d",)))
        cq += ck
        ck = 0
    for var, coef in (("q", cq), ("k", ck), *sorted((v, c) for v, c in a.items() if v)):
        if coef:
            terms.append(_times(coef, ("v", var)))
    node: Node = ("n", a.get("", 0))
    for term in terms:
        node = term if node == ("n", 0) else ("+", node, term)
    return node


def _times(coef: int, node: Node) -> Node:
    return node if coef == 1 else ("*", ("n", coef), node)


# --------------------------------------------------------------------------- #
# Evaluation
# --------------------------------------------------------------------------- #

Interval = tuple[int, int]


def interval(
    node: Node,
    guard: Guard,
    queries: Interval,
    keys: Interval,
    env: Mapping[str, Interval],
) -> Interval:
    """The interval of `node` over positions q in `queries` and k in `keys`
    (inclusive) narrowed by `guard`, and `env`'s ranges of b, h and H.  An
    empty interval (lo > hi) means the read never happens."""
    positions = narrow(guard, queries, keys)
    if positions is None:
        return (1, 0)
    q, k, d = positions
    return _eval(node, {**env, "q": q, "k": k, "d": d})


def narrow(guard: Guard, q: Interval, k: Interval) -> tuple[Interval, ...] | None:
    """The ranges of q, k and d = k - q where the guard holds; None if empty."""
    d_lo, d_hi, gq_lo, gq_hi, gk_lo, gk_hi = guard
    q = _meet(q, (gq_lo, gq_hi))
    k = _meet(k, (gk_lo, gk_hi))
    d = _meet((k[0] - q[1], k[1] - q[0]), (d_lo, d_hi))
    for _ in range(2):  # q and k through d, and back
        q = _meet(q, (k[0] - d[1], k[1] - d[0]))
        k = _meet(k, (q[0] + d[0], q[1] + d[1]))
        d = _meet(d, (k[0] - q[1], k[1] - q[0]))
    if q[0] > q[1] or k[0] > k[1] or d[0] > d[1]:
        return None
    return q, k, d


def _meet(a: Interval, b: tuple) -> Interval:
    lo = a[0] if b[0] is None else max(a[0], b[0])
    hi = a[1] if b[1] is None else min(a[1], b[1])
    return lo, hi


def _eval(node: Node, env: Mapping[str, Interval]) -> Interval:
    tag = node[0]
    if tag == "n":
        return node[1], node[1]
    if tag == "v":
        return env[node[1]]
    if tag == "d":
        return env["d"]
    if tag == "neg":
        lo, hi = _eval(node[1], env)
        return -hi, -lo
    if tag == "abs":
        lo, hi = _eval(node[1], env)
        if lo >= 0:
            return lo, hi
        if hi <= 0:
            return -hi, -lo
        return 0, max(-lo, hi)
    if tag in ("div", "%"):
        (lo, hi), c = _eval(node[1], env), node[2]
        if tag == "div":
            return lo // c, hi // c
        if lo // c == hi // c:
            return lo % c, hi % c
        return 0, c - 1
    (alo, ahi), (blo, bhi) = _eval(node[1], env), _eval(node[2], env)
    if tag == "+":
        return alo + blo, ahi + bhi
    if tag == "*":
        corners = (alo * blo, alo * bhi, ahi * blo, ahi * bhi)
        return min(corners), max(corners)
    if tag == "min":
        return min(alo, blo), min(ahi, bhi)
    if tag == "max":
        return max(alo, blo), max(ahi, bhi)
    raise ValueError(f"not an interval expression: {node!r}")


def call_ranges(
    sizes: Mapping[str, int], align: ir.Align, offsets: tuple[int, int] | None = None
) -> tuple[Interval, Interval, dict]:
    """The query and key positions and the ranges of b, h and H of a call
    with these sizes (`B`, `H`, `Nq`, `Nk`); `offsets`, a call's (q_offset,
    k_offset), shift the positions in place of the alignment."""
    if offsets is not None:
        offset, k_offset = offsets
    else:
        offset = sizes["Nk"] - sizes["Nq"] if align is ir.Align.BOTTOM_RIGHT else 0
        k_offset = 0
    queries = (offset, offset + sizes["Nq"] - 1)
    keys = (k_offset, k_offset + sizes["Nk"] - 1)
    env = {"b": (0, sizes["B"] - 1), "h": (0, sizes["H"] - 1), "H": (sizes["H"], sizes["H"])}
    return queries, keys, env


def out_of_range(
    variant: ir.Variant, sizes: Mapping[str, int], offsets: tuple[int, int] | None = None
) -> str | None:
    """The ValueError message for the first index of `variant` that may leave
    its dimension in a call with these sizes (and position offsets), or None."""
    if 0 in (sizes["B"], sizes["H"], sizes["Nq"], sizes["Nk"]):
        return None  # nothing is read
    queries, keys, env = call_ranges(sizes, variant.align, offsets)
    for entry in ranges(variant):
        lo, hi = interval(entry.expr, entry.guard, queries, keys, env)
        size = sizes[entry.size] if isinstance(entry.size, str) else entry.size
        if lo <= hi and (lo < 0 or hi >= size):
            return message(entry.input, entry.dim, lo, hi, size)
    return None


def message(name: str, dim: int, lo: int, hi: int, size: int) -> str:
    """The words of the ValueError, shared by the reference and the modules."""
    return (
        f"`{name}`: index {dim} may reach {lo} .. {hi} in this call, outside its "
        f"dimension of size {size} (clamp the index with min and max, or pass a "
        f"larger `{name}`)"
    )
