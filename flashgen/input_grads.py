"""Gradients of learnable inputs: which reads of the score get one, and how
the backward sums it (docs/decisions/048-learnable-inputs.md).

In: a checked variant.  Out: one `LearnableRead` per distinct read of a
learnable input in the score (equal reads, compared as expressions, are one)
and the problems of the reads no form below covers (`problems`, reported by
`check`).

The backward's programs already hold dS = d loss / d score for every pair
they visit: the dQ programs (one per query tile and query head, walking key
tiles) and the dK/dV programs (one per key tile and kv head, walking query
tiles and the kv head's query heads).  A read x[i(b, h, q, k)] adds
dS * d score / d read to the element x[i] of the pair.  Which programs sum
it, and how, depends on which indices move with q and k (`Form`):

    SCALAR  no index mentions q or k (`temp[h]`): one sum per program;
    ROWS    one index is `q` itself, the others do not mention q or k
            (`bias[b, h, q]`): one sum per query row;
    TABLE   one index mentions q or k and its dimension is a constant of at
            most MAX_TABLE (`rel[h, min(q - k, 31)]`): a vector over that
            dimension, each tile adding the sum of the pairs of each value it
            holds;
    PAIRS   two indices are `q` and `k` themselves, the others do not mention
            them (`bias[b, h, q, k]`): every pair its own element;
    COLS    one index is `k` itself, the others do not mention q or k
            (`c[b, h, k]`, the key side of Forgetting Transformer's
            `c[b, h, q] - c[b, h, k]`): one sum per key, in the dK/dV
            programs (docs/decisions/087-learnable-reads-per-key.md).

The other forms are summed by the dQ programs.  Each program writes its sums into its own row (its *slot*) of a float32
buffer of shape (slots, *x.shape), and the module adds the rows up in a
fixed order: deterministic, with no atomics.  A program coordinate that
cannot share an element with another program needs no slot of its own: the
batch where an index is `b` itself, the head where one is `h`, the query
tile for ROWS and PAIRS (each row is one query's); COLS never has one per
tile (each key is one key tile's).  A dK/dV program stores a COLS read's
sums once per query head where an index mentions `h` (each head's element
may differ), else once for its kv head (the slot is then the kv head's).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from flashgen import grad, index_ranges, ir

# The largest constant dimension a TABLE read may vary over: the program
# keeps one float32 per element (padded to a power of two) in registers.
MAX_TABLE = 1024

_POSITIONS = frozenset({"q", "k"})
_Q, _K, _B, _H = (ir.Name(n) for n in "qkbh")


class Form(str, enum.Enum):
    SCALAR = "scalar"
    ROWS = "rows"
    TABLE = "table"
    PAIRS = "pairs"
    COLS = "cols"


@dataclass(frozen=True)
class LearnableRead:
    """One read of a learnable input and how its gradient is summed."""

    read: ir.Index
    input_number: int  # position of the input among the variant's inputs
    form: Form
    # d score / d read (IR); grad.ONE where the read is added to the score.
    derivative: ir.Expr
    # TABLE: the dimension the index moves in, and its size.
    table_dim: int | None
    table_size: int | None
    # Program coordinates that get slots of their own (see the module's doc).
    slot_batch: bool
    slot_head: bool
    slot_tile: bool
    # COLS: an index mentions h, so the dK/dV program stores per query head.
    per_query_head: bool = False


@dataclass(frozen=True)
class Problem:
    span: ir.Span
    message: str
    note: str


def _classify(read: ir.Index, decl: ir.Input) -> tuple[Form, int | None] | Problem:
    moving = [d for d, a in enumerate(read.args) if ir.mentions(a, _POSITIONS)]
    if not moving:
        return Form.SCALAR, None
    if len(moving) == 1:
        d = moving[0]
        size = decl.shape[d]
        if read.args[d] == _Q:
            return Form.ROWS, None
        if read.args[d] == _K:
            return Form.COLS, None
        if isinstance(size, int) and size <= MAX_TABLE:
            return Form.TABLE, d
        return Problem(
            read.span,
            f"no kernel sums the gradient of this read of learnable `{read.input}`: index "
            f"{d + 1} moves with q or k, so it must be `q` or `k` itself or range over a "
            f"constant dimension of at most {MAX_TABLE} (this one is {size})",
            note="learnable reads: indices free of q and k, plus one that is `q` or `k`, one "
            "over a constant dimension, or two that are `q` and `k` (docs/LANGUAGE.md, Inputs)",
        )
    if len(moving) == 2 and {read.args[d] for d in moving} == {_Q, _K}:
        return Form.PAIRS, None
    return Problem(
        read.span,
        f"no kernel sums the gradient of this read of learnable `{read.input}`: "
        f"{len(moving)} of its indices move with q or k",
        note="learnable reads: indices free of q and k, plus one that is `q` or `k`, one over "
        "a constant dimension, or two that are `q` and `k` themselves (docs/LANGUAGE.md, Inputs)",
    )


def analyse(v: ir.Variant) -> tuple[tuple[LearnableRead, ...], tuple[Problem, ...]]:
    """The variant's learnable reads, in the order the score holds them, and
    the problems of those no form covers."""
    numbers = {i.name: n for n, i in enumerate(v.inputs) if i.learnable}
    reads, problems = [], []
    for read in dict.fromkeys(index_ranges.reads(v.score)):  # distinct, in order
        if read.input not in numbers:
            continue
        decl = v.inputs[numbers[read.input]]
        form = _classify(read, decl)
        if isinstance(form, Problem):
            problems.append(form)
            continue
        form, dim = form
        reads.append(
            LearnableRead(
                read=read,
                input_number=numbers[read.input],
                form=form,
                derivative=grad.derivative(v.score, read),
                table_dim=dim,
                table_size=None if dim is None else int(decl.shape[dim]),
                slot_batch=_B not in read.args,
                slot_head=_H not in read.args,
                slot_tile=form in (Form.SCALAR, Form.TABLE),
                per_query_head=form is Form.COLS
                and any(ir.mentions(a, frozenset({"h"})) for a in read.args),
            )
        )
    return tuple(reads), tuple(problems)


def learnable_reads(v: ir.Variant) -> tuple[LearnableRead, ...]:
    return analyse(v)[0]
