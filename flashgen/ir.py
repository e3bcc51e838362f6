"""The typed, frozen IR of the `.attn` language.

In: nothing (this module defines types and the language's vocabulary only; it
imports nothing else from flashgen).  Out: the node classes that every other
stage passes around.

Two layers live here:

* the syntax tree that `parse` builds (`SpecFile` -> `Block` -> `Setting`,
  with `Expr` trees whose names and calls are still unchecked strings), and
* the checked `Variant` that `check` produces: one attention block with every
  setting resolved, defaults filled in, and constant arguments of the named
  masks and of `softcap` folded to literals.

Source spans ride on every node but never take part in equality, so two trees
that print the same compare equal wherever they came from.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Union


@dataclass(frozen=True)
class Span:
    """1-based line/column of the first character and of one past the last."""

    line: int
    column: int
    end_line: int
    end_column: int


NO_SPAN = Span(0, 0, 0, 0)


def _span() -> Span:
    return field(default=NO_SPAN, compare=False, repr=False)


# --------------------------------------------------------------------------- #
# Expressions
# --------------------------------------------------------------------------- #


class UnaryOp(enum.Enum):
    NEG = "-"
    NOT = "!"


class BinOp(enum.Enum):
    OR = "|"
    AND = "&"
    EQ = "=="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    ADD = "+"
    SUB = "-"
    MUL = "*"
    DIV = "/"
    FLOORDIV = "div"
    MOD = "%"


COMPARISONS = frozenset({BinOp.EQ, BinOp.NE, BinOp.LT, BinOp.LE, BinOp.GT, BinOp.GE})


@dataclass(frozen=True)
class Num:
    """A literal. `int` for integer literals (`8`), `float` for real ones (`8.0`)."""

    value: int | float
    span: Span = _span()


@dataclass(frozen=True)
class Name:
    """A bare name: a variable (`q`, `s`), a named mask (`causal`) or `alibi`."""

    id: str
    span: Span = _span()


@dataclass(frozen=True)
class Call:
    fn: str
    args: tuple["Expr", ...]
    span: Span = _span()


@dataclass(frozen=True)
class Unary:
    op: UnaryOp
    operand: "Expr"
    span: Span = _span()


@dataclass(frozen=True)
class Binary:
    op: BinOp
    left: "Expr"
    right: "Expr"
    span: Span = _span()


@dataclass(frozen=True)
class Index:
    """`doc[b, q]`: an element of a declared input, one index per dimension.
    `element` is the input's element type, filled in by `check`."""

    input: str
    args: tuple["Expr", ...]
    span: Span = _span()
    element: "Element | None" = None


Expr = Union[Num, Name, Call, Unary, Binary, Index]


def mentions(e: Expr, names: frozenset[str]) -> bool:
    """Whether `e` contains a bare name from `names`."""
    if isinstance(e, Name):
        return e.id in names
    if isinstance(e, Num):
        return False
    if isinstance(e, Unary):
        return mentions(e.operand, names)
    if isinstance(e, Binary):
        return mentions(e.left, names) or mentions(e.right, names)
    return any(mentions(a, names) for a in e.args)


def reads_inputs(e: Expr) -> bool:
    """Whether `e` reads a declared input anywhere."""
    if isinstance(e, Index):
        return True
    if isinstance(e, (Name, Num)):
        return False
    if isinstance(e, Unary):
        return reads_inputs(e.operand)
    if isinstance(e, Binary):
        return reads_inputs(e.left) or reads_inputs(e.right)
    return any(reads_inputs(a) for a in e.args)


def reads_runtime_data(e: Expr) -> bool:
    """Whether `e` reads a declared input or the batch index `b`: its value
    then depends on the call's data, not on positions and heads alone."""
    return reads_inputs(e) or mentions(e, frozenset({"b"}))


# --------------------------------------------------------------------------- #
# Syntax tree of a file
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class Setting:
    """`key = value` inside an attention block."""

    key: str
    value: Expr
    span: Span = _span()
    key_span: Span = _span()


@dataclass(frozen=True)
class InputDecl:
    """`name: [learnable] type[size, ...]` inside an attention block; each size
    is a named size (a str, unchecked) or an integer."""

    name: str
    element: str
    shape: tuple[str | int, ...]
    learnable: bool = False
    span: Span = _span()
    name_span: Span = _span()
    element_span: Span = _span()
    size_spans: tuple[Span, ...] = field(default=(), compare=False, repr=False)


@dataclass(frozen=True)
class Block:
    """`attention NAME { settings and input declarations }`."""

    name: str
    settings: tuple[Setting, ...]
    span: Span = _span()
    name_span: Span = _span()
    inputs: tuple[InputDecl, ...] = ()


@dataclass(frozen=True)
class SpecFile:
    blocks: tuple[Block, ...]
    path: str = field(default="<string>", compare=False)


# --------------------------------------------------------------------------- #
# The checked model
# --------------------------------------------------------------------------- #


class DType(enum.Enum):
    FP16 = "fp16"
    BF16 = "bf16"
    FP32 = "fp32"


class Align(enum.Enum):
    BOTTOM_RIGHT = "bottom_right"
    TOP_LEFT = "top_left"


class Element(enum.Enum):
    """Element types of declared inputs."""

    INT32 = "int32"
    INT64 = "int64"
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"

    @property
    def is_integer(self) -> bool:
        return self in (Element.INT32, Element.INT64)

    @property
    def torch_name(self) -> str:
        """The torch dtype, as the generated module spells it (`torch.int32`)."""
        return {"fp32": "torch.float32", "fp16": "torch.float16", "bf16": "torch.bfloat16"}.get(
            self.value, f"torch.{self.value}"
        )


# Sizes an input's shape may name: batch, query heads, key/value heads, query
# and key sequence lengths (the call's q (B, H, Nq, D) and k (B, Hkv, Nk, D)).
SIZES = ("B", "H", "Hkv", "Nq", "Nk")


@dataclass(frozen=True)
class Input:
    """A checked input declaration: a tensor passed to attention() by keyword."""

    name: str
    element: Element
    shape: tuple[str | int, ...]  # names from SIZES, or positive integers
    learnable: bool = False
    span: Span = _span()


FULL = Name("full")
IDENTITY_SCORE = Name("s")


@dataclass(frozen=True)
class Variant:
    """One checked attention block: everything the later stages need.

    `mask` is a boolean expression over q, k, h, H; `score` a real expression
    over s, q, k, h, H.  Named masks keep their names (`causal`,
    `window(L, R)`, ...) with literal integer arguments; `softcap(x, c)` keeps
    a literal real `c`.
    """

    name: str
    head_dim: int
    dtype: DType
    mask: Expr = FULL
    score: Expr = IDENTITY_SCORE
    scale: float | None = None
    align: Align = Align.BOTTOM_RIGHT
    rescale_threshold: float = 0.0
    inputs: tuple[Input, ...] = ()
    # The last dimension of v, o and dO where it differs from q's and k's
    # (DeepSeek's multi-head latent attention); None: head_dim (`v_dim`).
    v_head_dim: int | None = None
    span: Span = _span()
    path: str = field(default="<string>", compare=False)

    @property
    def v_dim(self) -> int:
        """The last dimension of v, o and dO: `v_head_dim`, by default `head_dim`."""
        return self.head_dim if self.v_head_dim is None else self.v_head_dim


# --------------------------------------------------------------------------- #
# Vocabulary: names and functions the language knows, and their kinds
# --------------------------------------------------------------------------- #


class Kind(enum.Enum):
    INT = "integer"
    REAL = "real"
    BOOL = "boolean"


# Position of the query, of the key, query head index, number of query heads,
# batch index.
INT_VARIABLES = frozenset({"q", "k", "h", "H", "b"})
# The scaled score; only meaningful in `score`.
SCORE_VARIABLE = "s"
# Nullary masks and terms written as bare names.
NAMED_MASKS = frozenset({"causal", "full"})
ALIBI = "alibi"

# Masks with literal integer arguments: name -> (min args, max args).
MASK_FUNCTIONS = {"window": (1, 2), "prefix": (1, 1), "chunk": (1, 1)}
# Real-valued unary functions of the score language.
REAL_FUNCTIONS = frozenset({"tanh", "exp", "log", "sqrt"})
# Functions that keep the kind of their arguments (int stays int).
POLY_FUNCTIONS = {"abs": 1, "min": 2, "max": 2}
SOFTCAP = "softcap"

HEAD_DIM_MIN = 16
# 576 is DeepSeek's absorbed MLA latent (512 values and 64 rotary dimensions),
# the widest K any published model reads; it pads to 1024-wide tiles.
HEAD_DIM_MAX = 576
HEAD_DIM_MULTIPLE = 8
# p = 2^(s - m) reaches 2^tau under conditional rescaling and is fed to the
# P @ V product in the input dtype: 2^15 still fits fp16 (max 65504).
RESCALE_THRESHOLD_MAX = 15.0

# --------------------------------------------------------------------------- #
# Limits: what a spec may say and what a generated module accepts at call time
# --------------------------------------------------------------------------- #

# Longest query or key sequence a generated module accepts (Nq, Nk <= this;
# a call beyond it raises ValueError).  2^24 keeps every position exact in the
# float32 that scores are computed in, and leaves int32 room for the masks'
# own arithmetic.
MAX_SEQ_LEN = 2**24
# Bound on |q| and |k| that the integer range analysis assumes: bottom-right
# alignment puts query positions in [Nk - Nq, Nk), and kernels evaluate masks
# on padded rows and columns up to a tile (at most 256) past the end.
POSITION_BOUND = 2 * MAX_SEQ_LEN
# Most query heads a generated module accepts (H <= this; h < H).
MAX_HEADS = 2**16
# Bound on the batch index b the range analysis assumes (kernels launch one
# program per batch and head along a grid axis of at most 2^16 - 1).
MAX_BATCH = 2**16
# Integer expressions that read an input are computed in 64 bits and must
# stay within +-this (int64 inputs hold values up to 2^63 - 1: arithmetic on
# them beyond a comparison is refused).
INPUT_MAGNITUDE_MAX = 2**62
# Most dimensions of an input, and the largest integer size in its shape.
MAX_INPUT_RANK = 4
MAX_INPUT_SIZE = 2**31 - 1
# Kernels evaluate integer expressions in int32.  Every integer subexpression
# of a mask or score, and the difference of the two sides of every comparison,
# must be proven to stay within +-INT_MAGNITUDE_MAX over the positions and
# heads above: half of int32's range, so that the tile bounds lowering derives
# from them (sums of the same terms, plus a tile size) cannot overflow either.
INT_MAGNITUDE_MAX = 2**30
# Deepest nesting of one expression (operators, calls, parentheses) and most
# nodes in it; deeper or larger expressions are diagnosed, never recursed into.
MAX_EXPR_DEPTH = 32
MAX_EXPR_NODES = 256
# Largest spec file read (bytes); specs are read only from regular files.
MAX_SPEC_BYTES = 1 << 20

SETTINGS = (
    "head_dim",
    "v_head_dim",
    "dtype",
    "scale",
    "mask",
    "score",
    "align",
    "rescale_threshold",
)
REQUIRED_SETTINGS = ("head_dim", "dtype")
