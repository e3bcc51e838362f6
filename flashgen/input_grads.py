"""Gradients of learnable inputs: which reads of the score get one, and how
the backward sums it (docs/decisions/048-learnable-inputs.md).

In: a checked variant.  Out: one `LearnableRead` per distinct read of a
learnable input in the score (equal reads, compared as expressions, are one)
and the problems of the reads no form below covers (`problems`, reported by
`check`).

The dQ programs of the backward (one per query tile and query head, walking
key tiles) already hold dS = d loss / d score for every pair they visit; a
read x[i(b, h, q, k)] adds dS * d score / d read to the element x[i] of the
pair.  How a program sums those depends on which indices move with q and k
(`Form`):

    SCALAR  no index mentions q or k (`temp[h]`): one sum per program;
    ROWS    one index is `q` itself, the others do not mention q or k
            (`bias[b, h, q]`): one sum per query row;
    TABLE   one index mentions q or k and its dimension is a constant of at
            most MAX_TABLE (`rel[h, min(q - k, 31)]`): a vector over that
            dimension, each tile adding the sum of the pairs of each value it
            holds;
    PAIRS   two indices are `q` and `k` themselves, the others do not mention
            them (`bias[b, h, q, k]`): every pair its own element.

Each program writes its sums into its own row (its *slot*) of a float32
buffer of shape (slots, *x.shape), and the module adds the rows up in a
fixed order: deterministic, with no atomics.  A program coordinate that
cannot share an element with another program needs no slot of its own: the
batch where an index is `b` itself, the head where one is `h`, the query
tile for ROWS and PAIRS (each row is one query's).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from flashgen import grad, ir

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


@dataclass(frozen=True)
class Problem:
    span: ir.Span
    message: str
    note: str


def _reads(e: ir.Expr, out: list[ir.Index]) -> None:
    if isinstance(e, ir.Index):
        if e not in out:
            out.append(e)
        return
    if isinstance(e, ir.Unary):
        _reads(e.operand, out)
    elif isinstance(e, ir.Binary):
        _reads(e.left, out)
        _reads(e.right, out)
    elif isinstance(e, ir.Call):
        for a in e.args:
            _reads(a, out)


def _classify(read: ir.Index, decl: ir.Input) -> tuple[Form, int | None] | Problem:
    moving = [d for d, a in enumerate(read.args) if ir.mentions(a, _POSITIONS)]
    if not moving:
        return Form.SCALAR, None
    if len(moving) == 1:
        d = moving[0]
        size = decl.shape[d]
        if read.args[d] == _Q:
            return Form.ROWS, None
        if isinstance(size, int) and size <= MAX_TABLE:
            return Form.TABLE, d
        return Problem(
            read.span,
            f"no kernel sums the gradient of this read of learnable `{read.input}`: index "
            f"{d + 1} moves with q or k, so it must be `q` itself or range over a constant "
            f"dimension of at most {MAX_TABLE} (this one is {size})",
            note="learnable reads: indices free of q and k, plus one that is `q`, one over a "
            "constant dimension, or two that are `q` and `k` (docs/LANGUAGE.md, Inputs)",
        )
    if len(moving) == 2 and {read.args[d] for d in moving} == {_Q, _K}:
        return Form.PAIRS, None
    return Problem(
        read.span,
        f"no kernel sums the gradient of this read of learnable `{read.input}`: "
        f"{len(moving)} of its indices move with q or k",
        note="learnable reads: indices free of q and k, plus one that is `q`, one over a "
        "constant dimension, or two that are `q` and `k` themselves (docs/LANGUAGE.md, Inputs)",
    )


def analyse(v: ir.Variant) -> tuple[tuple[LearnableRead, ...], tuple[Problem, ...]]:
    """The variant's learnable reads, in the order the score holds them, and
    the problems of those no form covers."""
    numbers = {i.name: n for n, i in enumerate(v.inputs) if i.learnable}
    found: list[ir.Index] = []
    _reads(v.score, found)
    reads, problems = [], []
    for read in found:
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
            )
        )
    return tuple(reads), tuple(problems)


def learnable_reads(v: ir.Variant) -> tuple[LearnableRead, ...]:
    return analyse(v)[0]
