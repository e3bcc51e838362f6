"""The fuzzer of issue 19: inputs for the whole pipeline and the one invariant they must keep.

In: spec inputs, drawn by the Hypothesis strategies here (`grammar_inputs()`: text over the
whole `.attn` language, with extreme literals, nesting and size around the limits, long and odd
names, comments, odd whitespace and bytes; `mutated_inputs()`: byte-, token- and line-level
mutations and splices of examples/*.attn).  Out: a `Campaign` that runs each input through
`flashgen check`, `flashgen build` and `flashgen.api.build_sources`, then runs the kernels of a
bounded, deterministic selection of the distinct accepted variants against the float64
reference, and collects every broken promise as a `Violation` with the smallest input seen.

The invariant, per input (a spec FILE; `FuzzInput.text` also goes to the Python API as a str):

* `flashgen check FILE` exits 0 ("ok: ..." on stdout), or exits 1 with nothing on stdout and
  every stderr entry a diagnostic `FILE:LINE:COL: error: MESSAGE`, then the source line at
  LINE (indentation stripped, tabs as four spaces), then a caret line whose first caret sits
  under COL; optional `    = note:` lines.  No traceback, no exception out of `main`, no
  file written anywhere.
* If it checked, `flashgen build FILE -o DIR` exits 0 and writes exactly DIR/<block>.py for
  every block; otherwise build exits 1 with the same diagnostics and DIR stays empty.
* `api.build_sources(text)` treats the str as spec text: it returns the same modules, or
  raises `SpecError` whose diagnostics point into the text (path "<string>") and, when the
  text has no carriage return, equal the CLI's.  A CR is whitespace to the lexer but a line
  break to a file read in text mode, so only then may the two differ.
* Every built module imports, and for the selected variants the forward (o, lse) and the
  backward (dq, dk, dv) match the float64 reference under `flashgen.verify`'s tolerance rule,
  on tiny shapes with Nq != Nk and a fully masked row where the mask has one.

The numeric domain.  Kernels compute scores in float32 and the reference in float64, so a
score that leaves float32's range on the drawn inputs cannot be compared.  A kernel run is
judged only where, at every visible (query, key) pair, every subexpression of the score is
finite and is zero or between float32's smallest normal (2^-126) and a quarter of its largest
value, and its float64 gradient with respect to q and k is finite and below that same bound
(`numeric_domain`).  The quarter leaves room for the kernels' change to base 2 (times
log2(e) < 2) and their subtraction of the running row maximum (up to 2x).  Runs outside the
domain are counted per reason, never judged; the language documents the domain.

Deterministic: Hypothesis runs derandomized (tests/conftest.py), kernel inputs are seeded by
the variant's normalized text.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import io
import math
import re
import shutil
import sys
import time
import traceback
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from flashgen import api, cli, ir
from flashgen.diagnostics import SpecError
from flashgen.printer import print_expr, print_variant
from flashgen.reference import mask_matrix, scores
from flashgen.verify import (
    Shape,
    check_backward,
    check_forward,
    check_refusal,
    random_inputs,
    random_runtime_inputs,
    torch_dtype,
)

import strategies

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_PATHS = tuple(sorted((REPO / "examples").glob("*.attn")))
EXAMPLES = tuple(p.read_bytes() for p in EXAMPLE_PATHS)

# --------------------------------------------------------------------------- #
# Inputs
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class FuzzInput:
    """One input: the bytes of the spec file and, when it is text, the str the API gets.

    `text` is None for bytes that are not UTF-8.  Lone surrogates exist only in `text`:
    the file then holds their "surrogatepass" encoding, which is not UTF-8.
    """

    data: bytes
    text: str | None

    @classmethod
    def of_text(cls, text: str) -> FuzzInput:
        return cls(text.encode("utf-8", "surrogatepass"), text)

    @classmethod
    def of_bytes(cls, data: bytes) -> FuzzInput:
        try:
            return cls(data, data.decode("utf-8"))
        except UnicodeDecodeError:
            return cls(data, None)

    def __repr__(self) -> str:
        shown = self.text if self.text is not None else self.data
        if len(shown) > 600:
            return f"FuzzInput({shown[:300]!r} ... {shown[-300:]!r}, {len(self.data)} bytes)"
        return f"FuzzInput({shown!r})"


# Literals at and around the edges: int32, float32 and float64 ranges, subnormals,
# overflow to inf, spellings the grammar allows (`.5`, `5.`, `1E+2`, leading zeros).
INT_LITERALS = (
    "0",
    "00",
    "007",
    "1",
    "2",
    "255",
    "4095",
    "65535",
    "1073741823",
    "1073741824",
    "2147483647",
    "2147483648",
    "4294967296",
    "9223372036854775808",
    "1" + "0" * 40,
    "9" * 4001,
)
REAL_LITERALS = (
    "0.0",
    "0.",
    ".5",
    "1.0",
    "1e-05",
    "2.5e3",
    "1E+2",
    "0e0",
    "1e-320",
    "4.9e-324",
    "1e-400",
    "1e-45",
    "1.4e-45",
    "1.2e-38",
    "1.17549435e-38",
    "3.4e38",
    "3.4028235e38",
    "3.5e38",
    "65504.0",
    "1e308",
    "1.7976931348623157e308",
    "1.8e308",
    "1e999",
    "1" + "0" * 400 + ".0",
)
# Characters the lexer does not expect, that some tool treats as a line break, that look like
# ASCII, or that are no characters at all (a lone surrogate, only in API text).
ODD_CHARS = (
    "\x00",
    "\ufeff",
    "\u200b",
    "\u00a0",
    "\u3000",
    "\u0301",
    "\x7f",
    "\x0b",
    "\x0c",
    "\x1c",
    "\x85",
    "\u2028",
    "\u2029",
    "\r",
    "\t",
    "\\",
    "'",
    '"',
    "`",
    "@",
    "$",
    "?",
    "[",
    ":",
    ".",
    "{",
    "}",
    "é",
    "λ",
    "ｑ",
    "名",
    "\U0001f600",
    "\ud800",
    "\udfff",
)
# The longest run of a source line a diagnostic shows (flashgen/diagnostics.py's
# docstring: a longer line is shown as an excerpt around the span).
EXCERPT_MAX = 120

# Byte strings that are not UTF-8 (or a BOM, which is).
ODD_BYTES = (
    b"\xff",
    b"\xfe",
    b"\x80",
    b"\xc3",
    b"\xc0\xaf",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\xef\xbb\xbf",
    b"\x00",
)
BLOCK_NAMES = (
    "a",
    "A",
    "t0",
    "attn_1",
    "Variant",
    "x" * 64,
    "x" * 65,
    "y" * 300,
    # Python keywords and constants, the language's own keywords, bad starts and characters.
    "if",
    "class",
    "None",
    "True",
    "lambda",
    "attention",
    "div",
    "_x",
    "__init__",
    "1abc",
    "a-b",
    "café",
    "名前",
    # Modules a generated module (or its user) imports: a file of that name shadows them.
    "torch",
    "triton",
    "math",
    "os",
    "sys",
    "functools",
    "typing",
    "numpy",
    "flashgen",
    "tl",
    "random",
    "types",
    "site",
    "test",
)
SETTING_KEYS = (
    "head_dim", "dtype", "scale", "mask", "score", "align", "rescale_threshold", "v_head_dim"
)  # fmt: skip
ODD_KEYS = ("Head_dim", "head_dims", "window", "s", "dtype_", "k" * 200, "attention", "div")
# Input declarations (runtime data), well formed and not: the accepted ones build and run
# their kernels on random inputs of the declared shapes (and the gradients of the learnable
# ones the backward sums).
INPUT_DECLS = (
    "doc: int32[B, Nk]", "rel: learnable fp32[H, 32]", "t: fp16[H]", "p: int64[B]",
    "w: bf16[B, Hkv, Nq, Nk]", "x: int33[B]", "q: int32[B]", "d: int32[]", "d: int32[B, N]",
    "d int32[B]", "d: int32 B", "d: int32[B", "d: learnable int32[B]", "d: fp32[B, 0]",
    "scale: fp32[H]", "lambda: fp32[H]", "d: fp32[B, Nk, H, Hkv, 3]", "doc: int32[B, Nk]",
)  # fmt: skip
INDEXED_MASKS = (
    "causal & doc[b, q] == doc[b, k]", "causal | k < p[b]", "doc[b, q] == doc[b]",
    "doc[b, q] + 1 > doc[b, k]", "t[h] > 0", "doc[b, doc[b, k]] == 0", "causal | b == 0",
    "doc[b, q] == doc[b, k",
)  # fmt: skip
INDEXED_SCORES = (
    "s + rel[h, min(q - k, 31)]", "s * t[h]", "s + rel[h, s]", "softcap(s + w[b, h, q, k], 5.0)",
    "s + doc[b, k] / 2.0", "s + nothere[h]", "s + rel[h, q - k]] ",
)  # fmt: skip
# Coherent runtime data: declarations, and a mask and a score that read them, each with a
# random positional part ({m}: a boolean expression, {s}: a real one).  Indices in range for
# every call, and ones that some calls' sizes push out (which the language refuses per call).
DATA_VARIANTS = (
    ("doc: int32[B, Nk]", "{m} & doc[b, q] == doc[b, k]", "{s}"),
    ("doc: int64[B, Nk]", "doc[b, q] == doc[b, k] | {m}", "{s}"),
    ("p: int32[B]", "{m} | k < p[b]", "{s}"),
    ("t: learnable fp32[H]", "{m}", "({s}) * t[h]"),
    ("rel: learnable fp32[H, 32]", "{m}", "{s} + rel[h, min(max(q - k, 0), 31)]"),
    ("rel: bf16[H, 16]", "causal & {m}", "{s} + rel[h, (q - k) % 16]"),
    ("rel: fp16[16]", "{m}", "{s} + rel[q - k + 8]"),
    ("doc: int32[B, Nk]; w: fp32[B, Nk]", "{m} & doc[b, q] >= doc[b, k]", "{s} + w[b, k]"),
    ("", "{m} | b == 1", "{s} + b"),
    ("t: fp32[H]", "{m}", "{s} * t[h]"),
    ("rel: fp32[H, 32]", "{m}", "{s} + rel[h, min(max(q - k, 0), 31)]"),
    ("w: learnable fp16[B, H, Nk, Nk]", "{m}", "{s} + w[b, h, q, k]"),
    ("c: learnable fp32[B, H, Nk]; t: learnable bf16[B, Nk]", "{m}", "({s}) * t[b, k] - c[b, h, k]"),
)  # fmt: skip
# Texts the API could take for a path (it must not): existing files, `.attn` names.
PATH_LIKE_TEXTS = (
    "x.attn",
    "../x.attn",
    "/etc/hostname",
    "/etc/passwd",
    "README.md",
    "examples/full.attn",
    ".",
    "/",
)

# Nesting depths and node counts around MAX_EXPR_DEPTH and MAX_EXPR_NODES, and far beyond
# (Python's recursion limit is 1000).
DEPTHS = (1, 2, 16, 30, 31, 32, 33, 34, 64, 100, 200, 1000, 3000)
NODE_COUNTS = (200, 254, 255, 256, 257, 258, 511, 1000, 5000)

# Binding strength of a piece of text, loosest first, as in grammars/attn.lark.
_OR, _AND, _NOT, _COMPARE, _SUM, _PRODUCT, _NEGATION, _ATOM = range(8)
Piece = tuple[str, int]


def _at(piece: Piece, level: int) -> str:
    text, strength = piece
    return text if strength >= level else f"({text})"


def _binary(left: Piece, op: str, right: Piece, level: int, space: str = " ") -> Piece:
    # Left-associative: the left operand may bind as loosely as the operator, the right one
    # must bind tighter; comparisons do not associate at all.
    left_level = level + 1 if level == _COMPARE else level
    return f"{_at(left, left_level)}{space}{op}{space}{_at(right, level + 1)}", level


def _call(fn: str, *args: Piece) -> Piece:
    return f"{fn}({', '.join(text for text, _ in args)})", _ATOM


def _atom(text: str) -> Piece:
    return text, _ATOM


def _rare(draw, one_in: int) -> bool:
    # Not 0: Hypothesis draws the smallest value (and the bounds) more often than the rest.
    return draw(st.integers(0, one_in - 1)) == one_in // 2


def _space(draw) -> str:
    if not _rare(draw, 8):
        return " "
    return draw(st.sampled_from(["", "  ", "\t", " \t ", "\f", "\r"]))


def _int_literal(draw, small_max: int = 12) -> Piece:
    if _rare(draw, 10):
        return _atom(draw(st.sampled_from(INT_LITERALS)))
    return _atom(str(draw(st.integers(0, small_max))))


def _real_literal(draw) -> Piece:
    if _rare(draw, 8):
        return _atom(draw(st.sampled_from(REAL_LITERALS)))
    return _atom(draw(st.sampled_from(["0.5", "0.25", "1.0", "2.0", "0.1", "1.5", "0.05", "3.0"])))


def _wild(draw) -> Piece:
    """An operand of the wrong kind or unknown to the language."""
    return _atom(
        draw(
            st.sampled_from(
                [
                    "s",
                    "alibi",
                    "causal",
                    "full",
                    "1.5",
                    "x",
                    "sigmoid(s)",
                    "window",
                    "q(1)",
                    "tanh(s, s)",
                    "window()",
                    "window(1, 2, 3)",
                    "softcap(s)",
                    "softcap(s, 0.0)",
                    "softcap(s, -1.0)",
                    "softcap(s, q)",
                    "min(s)",
                    "abs()",
                    "chunk(0)",
                    "prefix(-1)",
                    "window(q)",
                    "window(2.5)",
                    "(q < k)",
                    "(1 / 0)",
                    "(q div 0)",
                    "(q % -3)",
                    "(q div k)",
                    "(s div 2)",
                    "(q / 2)",
                    "(q < k < 3)",
                    "(q = k)",
                    "(causal + 1)",
                    "(!s)",
                    "(s & s)",
                    "div",
                    "attention",
                    "fp16",
                    "",
                    "(",
                    ")",
                    ",",
                ]
            )
        )
    )


@st.composite
def int_exprs(draw, depth: int = 3) -> Piece:
    """Integer expressions over q, k, h, H; small constants mostly, extremes sometimes."""
    if depth <= 0 or draw(st.integers(0, 2)) == 0:
        if _rare(draw, 3):
            return _int_literal(draw)
        return _atom(draw(st.sampled_from(["q", "k", "h", "H"])))
    if _rare(draw, 60):
        return _wild(draw)
    sub = lambda: draw(int_exprs(depth - 1))  # noqa: E731
    choice = draw(st.integers(0, 6))
    space = _space(draw)
    if choice == 0:
        return _binary(sub(), draw(st.sampled_from(["+", "-"])), sub(), _SUM, space)
    if choice == 1:
        right = _int_literal(draw) if draw(st.booleans()) else sub()
        return _binary(sub(), "*", right, _PRODUCT, space)
    if choice == 2:
        divisor = _int_literal(draw) if not _rare(draw, 6) else sub()
        return _binary(sub(), draw(st.sampled_from(["div", "%"])), divisor, _PRODUCT, " ")
    if choice == 3:
        return f"-{_at(sub(), _NEGATION)}", _NEGATION
    if choice == 4:
        return _call("abs", sub())
    if choice == 5:
        return _call(draw(st.sampled_from(["min", "max"])), sub(), sub())
    return _atom(f"({sub()[0]})")


@st.composite
def real_exprs(draw, depth: int = 3) -> Piece:
    """Score expressions: every function, alibi, reals and integers mixed."""
    if depth <= 0 or draw(st.integers(0, 2)) == 0:
        choice = draw(st.integers(0, 5))
        if choice <= 1:
            return _atom("s")
        if choice == 2:
            return _atom("alibi")
        if choice == 3:
            return _real_literal(draw)
        return draw(int_exprs(1))
    if _rare(draw, 60):
        return _wild(draw)
    sub = lambda: draw(real_exprs(depth - 1))  # noqa: E731
    choice = draw(st.integers(0, 9))
    space = _space(draw)
    if choice == 0:
        return _binary(sub(), draw(st.sampled_from(["+", "-"])), sub(), _SUM, space)
    if choice == 1:
        return _binary(sub(), draw(st.sampled_from(["*", "/"])), sub(), _PRODUCT, space)
    if choice == 2:
        # A constant factor keeps most products tame.
        factor = _real_literal(draw) if draw(st.booleans()) else _int_literal(draw, 4)
        return _binary(sub(), draw(st.sampled_from(["*", "/"])), factor, _PRODUCT, space)
    if choice == 3:
        return f"-{_at(sub(), _NEGATION)}", _NEGATION
    if choice == 4:
        return _call(draw(st.sampled_from(["tanh", "exp", "log", "sqrt"])), sub())
    if choice == 5:
        # The forms a model would write: log1p, a decaying weight, a bounded root.
        x = sub()
        return draw(
            st.sampled_from(
                [
                    _call("log", (f"1.0 + abs({x[0]})", _SUM)),
                    _call("exp", (f"-abs({x[0]})", _NEGATION)),
                    _call("sqrt", _call("abs", x)),
                    _call("tanh", x),
                ]
            )
        )
    if choice == 6:
        return _call("abs", sub())
    if choice == 7:
        return _call(draw(st.sampled_from(["min", "max"])), sub(), sub())
    if choice == 8:
        cap = _real_literal(draw) if not _rare(draw, 5) else _int_literal(draw, 60)
        return _call("softcap", sub(), cap)
    return _atom(f"({sub()[0]})")


def _mask_argument(draw) -> Piece:
    """A named mask's argument: small, so that tiny shapes cross its edges; or odd."""
    choice = draw(st.integers(0, 11))
    if choice <= 7:
        return _atom(str(draw(st.integers(0, 9))))
    if choice == 8:
        return draw(st.sampled_from([("4096 - 1", _SUM), ("2 * 3", _PRODUCT), ("(7)", _ATOM)]))
    if choice == 9:
        return draw(st.sampled_from([("-3", _NEGATION), ("-0", _NEGATION), ("2.5", _ATOM)]))
    if choice == 10:
        return _int_literal(draw)
    return draw(int_exprs(1))


@st.composite
def bool_exprs(draw, depth: int = 3) -> Piece:
    """Masks: named masks with constant arguments, comparisons, & | !."""
    if depth <= 0 or draw(st.integers(0, 2)) == 0:
        choice = draw(st.integers(0, 7))
        if choice == 0:
            return _atom(draw(st.sampled_from(["causal", "full"])))
        if choice == 1:
            return _call("window", _mask_argument(draw))
        if choice == 2:
            return _call("window", _mask_argument(draw), _mask_argument(draw))
        if choice == 3:
            return _call("prefix", _mask_argument(draw))
        if choice == 4:
            return _call("chunk", _mask_argument(draw))
        op = draw(st.sampled_from(["==", "!=", "<", "<=", ">", ">="]))
        return _binary(draw(int_exprs(2)), op, draw(int_exprs(2)), _COMPARE, _space(draw))
    if _rare(draw, 60):
        return _wild(draw)
    sub = lambda: draw(bool_exprs(depth - 1))  # noqa: E731
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return f"!{_at(sub(), _NOT)}", _NOT
    if choice == 1:
        return _binary(sub(), "&", sub(), _AND, _space(draw))
    if choice == 2:
        return _binary(sub(), "|", sub(), _OR, _space(draw))
    return _atom(f"({sub()[0]})")


def _balanced(leaves: Sequence[Piece], op: str, level: int) -> Piece:
    """A balanced tree of `op` over `leaves`: many nodes, shallow."""
    if len(leaves) == 1:
        return leaves[0]
    half = len(leaves) // 2
    return _binary(
        _balanced(leaves[:half], op, level), op, _balanced(leaves[half:], op, level), level
    )


def _with_nodes(leaf: Piece, op: str, level: int, nodes: int) -> Piece:
    """An expression of exactly `nodes` nodes: a balanced `op` tree, one leaf negated when
    the count is even (`-x` is two nodes)."""
    leaves = [leaf] * ((nodes + 1) // 2)
    if nodes % 2 == 0:
        leaves[0] = (f"-{_at(leaf, _NEGATION)}", _NEGATION)
    return _balanced(leaves, op, level)


@st.composite
def limit_exprs(draw, kind: str) -> str:
    """Expressions at and beyond the nesting and size limits, of `kind` "mask" or "score"."""
    if draw(st.booleans()):
        depth = draw(st.sampled_from(DEPTHS))
        if kind == "score":
            form = draw(st.sampled_from(["paren", "neg", "tanh", "min", "sum", "right", "abs"]))
            if form == "paren":
                return "(" * depth + "s" + ")" * depth
            if form == "neg":
                return "-" * depth + "s"
            if form == "tanh":
                return "tanh(" * depth + "s" + ")" * depth
            if form == "abs":
                return "abs(" * depth + "s" + ")" * depth
            if form == "min":
                return "min(s, " * depth + "s" + ")" * depth
            if form == "sum":
                return "s" + " + 0.5" * depth
            return "s + (" * depth + "s" + ")" * depth
        form = draw(st.sampled_from(["paren", "not", "and", "window", "offset"]))
        if form == "paren":
            return "(" * depth + "causal" + ")" * depth
        if form == "not":
            return "!" * depth + "causal"
        if form == "and":
            return "causal" + " & causal" * depth
        if form == "window":
            return "window(" + "(" * depth + "3" + ")" * depth + ")"
        return "q" + " - 1" * depth + " <= k"
    nodes = draw(st.sampled_from(NODE_COUNTS))
    if kind == "score":
        return _with_nodes(_atom("s"), draw(st.sampled_from(["+", "*"])), _SUM, nodes)[0]
    # Comparisons of nodes // 4 + ... : build from `q < k` leaves (3 nodes each) joined by
    # `|`, then pad with negations to the exact count.
    leaves = max(1, (nodes + 1) // 4)
    text, _ = _balanced([("q < k", _COMPARE)] * leaves, "|", _OR)
    used = 4 * leaves - 1
    return "!" * max(0, nodes - used) + _at((text, _OR), _NOT)


def _head_dim_value(draw) -> str:
    if not _rare(draw, 8):
        return draw(st.sampled_from(["16", "32", "64", "128", "24", "80", "256", "16", "16"]))
    return draw(
        st.sampled_from(
            ["0", "8", "15", "17", "257", "264", "-16", "16.0", "8 * 2", "(64)", "1e2", "fp16"]
            + list(INT_LITERALS)
        )
    )


def _v_head_dim_value(draw) -> str:
    if not _rare(draw, 8):
        return draw(st.sampled_from(["16", "32", "64", "128", "24", "40", "16"]))
    return draw(st.sampled_from(["0", "8", "12", "577", "584", "-16", "16.0", "s", "head_dim"]))


def _setting_value(draw, key: str) -> str:
    if key == "head_dim":
        return _head_dim_value(draw)
    if key == "v_head_dim":
        return _v_head_dim_value(draw)
    if key == "dtype":
        if not _rare(draw, 8):
            return draw(st.sampled_from(["fp16", "fp32", "bf16"]))
        return draw(st.sampled_from(["float16", "bf17", "f32", "16", "FP16", "fp16.0", "s"]))
    if key == "scale":
        if not _rare(draw, 5):
            return draw(st.sampled_from(["0.125", "0.25", "0.5", "1.0", "1 / 8", "0.1", "2"]))
        return draw(st.sampled_from(["0", "-0.5", "s", "1 / 0", "q"] + list(REAL_LITERALS)))
    if key == "align":
        if not _rare(draw, 8):
            return draw(st.sampled_from(["bottom_right", "top_left"]))
        return draw(st.sampled_from(["left", "top_left_", "0", "causal"]))
    if key == "rescale_threshold":
        if not _rare(draw, 5):
            return draw(st.sampled_from(["0", "0.0", "4.0", "8.0", "15", "15.0"]))
        return draw(st.sampled_from(["15.5", "-1", "16", "1e999", "nan", "inf", "-0.0"]))
    kind = "mask" if key == "mask" else "score"
    if _rare(draw, 25):
        return draw(st.sampled_from(INDEXED_MASKS if kind == "mask" else INDEXED_SCORES))
    if _rare(draw, 15):
        return draw(limit_exprs(kind))
    if _rare(draw, 30):
        # The other setting's language: a score as mask or a mask as score.
        return draw(real_exprs() if kind == "mask" else bool_exprs())[0]
    return draw(bool_exprs() if kind == "mask" else real_exprs())[0]


_SEPARATORS = ("\n", "\n", "\n", ";", "; ", "\n\n", "\r\n", "\t;\t", "  # note\n", ";\n", " ;; ")


@st.composite
def _blocks(draw) -> str:
    name = draw(st.sampled_from(BLOCK_NAMES)) if _rare(draw, 6) else "v"
    keys = [
        key
        for key, keep in zip(SETTING_KEYS, (7, 7, 3, 5, 5, 3, 4, 2))
        if draw(st.integers(0, 7)) < keep
    ]
    if _rare(draw, 10):
        keys.insert(draw(st.integers(0, len(keys))), draw(st.sampled_from(ODD_KEYS + SETTING_KEYS)))
    if _rare(draw, 6):
        keys = draw(st.permutations(keys))
    settings_text = []
    for key in keys:
        space = _space(draw)
        settings_text.append(f"{key}{space}={space}{_setting_value(draw, key)}")
    if _rare(draw, 8):
        decls, mask, score = draw(st.sampled_from(DATA_VARIANTS))
        settings_text = [t for t in settings_text if not t.startswith(("mask", "score"))]
        settings_text += [d for d in decls.split("; ") if d]
        settings_text.append("mask = " + mask.format(m=_at(draw(bool_exprs()), _AND + 1)))
        settings_text.append("score = " + score.format(s=_at(draw(real_exprs()), _SUM + 1)))
    if _rare(draw, 12):
        for _ in range(draw(st.integers(1, 2))):
            at = draw(st.integers(0, len(settings_text)))
            settings_text.insert(at, draw(st.sampled_from(INPUT_DECLS)))
    sep = draw(st.sampled_from(_SEPARATORS))
    opener = draw(st.sampled_from([" {\n    ", " {", "\n{\n", " { ", "{"]))
    closer = draw(st.sampled_from(["\n}", " }", "}", ";}", "\n\n}"]))
    indent = "\t" if _rare(draw, 10) else "    "
    body = (sep if sep != "\n" else f"\n{indent}").join(settings_text)
    return f"attention {name}{opener}{body}{closer}"


@st.composite
def spec_texts(draw) -> str:
    """Whole spec files: comments, zero to three blocks, odd whitespace and characters."""
    parts = []
    if _rare(draw, 4):
        parts.append(draw(st.sampled_from(["# a comment\n", "#\n\n", "\n", "# é 名 \U0001f600\n"])))
    n_blocks = draw(st.sampled_from([1, 1, 1, 1, 1, 1, 2, 3, 0]))
    names = []
    for _ in range(n_blocks):
        block = draw(_blocks())
        if names and _rare(draw, 4):
            # Same name, or one that differs only in case.
            block = block.replace(
                "attention v", f"attention {draw(st.sampled_from(['v', 'V']))}", 1
            )
        elif n_blocks > 1:
            block = block.replace("attention v", f"attention v{len(names)}", 1)
        names.append(block)
    text = draw(st.sampled_from(["\n", "\n\n", "\n# between\n", " "])).join(names)
    parts.append(text)
    parts.append(draw(st.sampled_from(["\n", "", "\n\n", "  # trailing", "\r\n"])))
    text = "".join(parts)
    for _ in range(draw(st.sampled_from([0, 0, 0, 0, 0, 1, 2]))):
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.sampled_from(ODD_CHARS)) + text[at:]
    if _rare(draw, 20):
        text = draw(st.sampled_from(["\ufeff", "\r\n"])) + text
    if _rare(draw, 20):
        text = text.replace("\n", draw(st.sampled_from(["\r\n", "\r", "\u2028", "\x85"])))
    return text


def _as_bytes(draw, text: str) -> FuzzInput:
    """The file of `text`, sometimes with bytes that are not UTF-8 or in another encoding."""
    choice = draw(st.integers(0, 19))
    if choice == 0:
        data = text.encode("utf-8", "surrogatepass")
        at = draw(st.integers(0, len(data)))
        return FuzzInput.of_bytes(data[:at] + draw(st.sampled_from(ODD_BYTES)) + data[at:])
    if choice == 1:
        encoding = draw(st.sampled_from(["utf-16", "latin-1", "utf-8-sig"]))
        return FuzzInput.of_bytes(text.encode(encoding, "replace"))
    return FuzzInput.of_text(text)


@st.composite
def printed_variants(draw) -> str:
    """A valid variant (tests/strategies.py: tame numerics, every mask and score form),
    printed in normal form and then laid out differently."""
    text = print_variant(draw(strategies.variants(dtypes=tuple(ir.DType))))
    layout = draw(st.integers(0, 4))
    if layout == 1:
        text = text.replace("\n    ", "; ").replace("{; ", "{ ")
    elif layout == 2:
        text = text.replace("\n", "  # comment\r\n")
    elif layout == 3:
        text = text.replace("    ", "\t").replace(" = ", "=")
    return text


@st.composite
def grammar_inputs(draw) -> FuzzInput:
    """Grammar-aware inputs: mostly spec files, sometimes path-like or empty text."""
    if _rare(draw, 40):
        return FuzzInput.of_text(draw(st.sampled_from(PATH_LIKE_TEXTS + ("", "\n", "#"))))
    if draw(st.integers(0, 3)) == 1:
        return FuzzInput.of_text(draw(printed_variants()))
    text = draw(spec_texts())
    if _rare(draw, 40):
        text += draw(st.sampled_from(["\n# see x.attn", "# x.attn"]))
    return _as_bytes(draw, text)


# -- mutation of the examples ------------------------------------------------- #

_TOKEN = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*|[0-9.]+(?:[eE][+-]?[0-9]+)?|==|!=|<=|>=|\s+|.", re.S)
MUTATION_TOKENS = tuple(
    t.encode()
    for t in (
        "attention div { } ( ) , ; = == != < <= > >= + - * / % & | ! # \n "
        "s q k h H alibi causal full window prefix chunk softcap tanh exp log sqrt abs min max "
        "head_dim dtype scale mask score align rescale_threshold fp16 bf16 fp32 top_left "
        "bottom_right [ ] : learnable int32 int64 b B Nk doc doc[b,q]"
    ).split(" ")
    + ["\n", " "]
    + list(INT_LITERALS[:15])
    + list(REAL_LITERALS[:23])
)


@st.composite
def _mutate(draw, data: bytes) -> bytes:
    op = draw(st.integers(0, 10))
    at = draw(st.integers(0, max(0, len(data) - 1)))
    if op == 0 and data:  # flip one bit
        bit = draw(st.integers(0, 7))
        return data[:at] + bytes([data[at] ^ (1 << bit)]) + data[at + 1 :]
    if op == 1:  # insert an odd or arbitrary byte string
        if draw(st.booleans()):
            piece = draw(st.sampled_from(ODD_BYTES))
        else:
            piece = draw(st.sampled_from(ODD_CHARS)).encode("utf-8", "surrogatepass")
        return data[:at] + piece + data[at:]
    if op == 2:  # delete a run
        return data[:at] + data[at + draw(st.integers(1, 12)) :]
    if op == 3:  # duplicate a run
        run = data[at : at + draw(st.integers(1, 40))]
        return data[:at] + run * draw(st.integers(2, 3)) + data[at:]
    if op == 4:  # insert a token of the language
        return data[:at] + draw(st.sampled_from(MUTATION_TOKENS)) + data[at:]
    tokens = _TOKEN.findall(data)
    lines = data.split(b"\n")
    if op <= 7 and tokens:
        i = draw(st.integers(0, len(tokens) - 1))
        if op == 5:  # replace a token
            tokens[i] = draw(st.sampled_from(MUTATION_TOKENS))
        elif op == 6:  # delete or duplicate a token
            tokens[i] = b"" if draw(st.booleans()) else tokens[i] * 2
        else:  # swap two tokens
            j = draw(st.integers(0, len(tokens) - 1))
            tokens[i], tokens[j] = tokens[j], tokens[i]
        return b"".join(tokens)
    if op == 8 and lines:  # delete, duplicate or swap lines
        i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
        how = draw(st.integers(0, 2))
        if how == 0:
            del lines[i]
        elif how == 1:
            lines.insert(i, lines[j])
        else:
            lines[i], lines[j] = lines[j], lines[i]
        return b"\n".join(lines)
    if op == 9:  # line endings
        return data.replace(b"\n", draw(st.sampled_from([b"\r\n", b"\r", b"\n\n", b";"])))
    # splice with another example
    other = draw(st.sampled_from(EXAMPLES))
    return data[:at] + other[draw(st.integers(0, len(other))) :]


@st.composite
def mutated_inputs(draw) -> FuzzInput:
    """An example file with one to six mutations."""
    data = draw(st.sampled_from(EXAMPLES))
    for _ in range(draw(st.integers(1, 6))):
        data = draw(_mutate(data))
    return FuzzInput.of_bytes(data)


def boundary_inputs() -> list[FuzzInput]:
    """Explicit inputs run before the drawn ones: every example as it is, files of exactly
    MAX_SPEC_BYTES and one byte more (valid apart from their size), and known trouble."""
    inputs = [FuzzInput.of_bytes(data) for data in EXAMPLES]
    spec = "attention big {\n    head_dim = 16\n    dtype = fp32\n    mask = causal\n}\n"
    for size in (ir.MAX_SPEC_BYTES, ir.MAX_SPEC_BYTES + 1):
        line = "#" * 99 + "\n"
        padding = line * ((size - len(spec)) // len(line))
        padding += "#" * (size - len(spec) - len(padding) - 1) + "\n"
        inputs.append(FuzzInput.of_text(padding + spec))
        assert len(inputs[-1].data) == size
    for setting in (
        "score = -s",
        "score = s + 0.5 * h - 2",
        "score = -(s * 2)",
        "score = exp(s) - 1.5",
        # int32 arithmetic past its range at tiny positions.
        "mask = k + 2147483647 > q",
        "mask = q * 1073741824 < k",
        "mask = (q - k) * 65536 * 65536 == 0",
        "score = s - abs(q * 1000000000) / 1000000000.0",
        # ... and the largest constants check accepts, which kernels must still get right.
        "mask = k <= q + 1006632960 & q - 1000000 <= k",
        "mask = window(1006632960, 3) | prefix(1040187392) & chunk(1040187392)",
        "score = s - 0.001 * abs(q * 31 - k) + h * 16384",
        # Nesting and size at the limits, and far past Python's recursion limit.
        *(f"score = {'tanh(' * n}s{')' * n}" for n in (31, 32, 33)),
        *(f"mask = {'(' * n}causal{')' * n}" for n in (31, 32, 33, 1000)),
        *(f"score = {'-' * n}s" for n in (31, 32, 33, 5000)),
        *(f"score = {_with_nodes(_atom('s'), '+', _SUM, n)[0]}" for n in (255, 256, 257)),
    ):
        inputs.append(
            FuzzInput.of_text(f"attention n {{ head_dim = 16; dtype = fp32; {setting} }}")
        )
    # Learnable reads of three forms the backward sums, in one variant.
    inputs.append(
        FuzzInput.of_text(
            "attention n { head_dim = 16; dtype = fp16; rel: learnable fp32[H, 8]; "
            "t: learnable bf16[H]; w: learnable fp32[B, H, Nk, Nk]; mask = causal; "
            "score = softcap(s * t[h], 5.0) + rel[h, min(q - k, 7)] + w[b, h, q, k] }"
        )
    )
    return inputs


# --------------------------------------------------------------------------- #
# What a variant uses: features, for choosing which variants run kernels
# --------------------------------------------------------------------------- #

# Every kernel-running campaign over the grammar must judge at least one in-domain variant
# with each of these.
REQUIRED_FEATURES = frozenset(
    {
        "mask:window",
        "mask:window2",
        "mask:prefix",
        "mask:chunk",
        "mask:causal",
        "mask:NOT",
        "mask:OR",
        "mask:FLOORDIV",
        "mask:MOD",
        "mask:bigint",
        *(f"score:{fn}" for fn in ("tanh", "exp", "log", "sqrt", "abs", "min", "max")),
        "score:softcap",
        "score:alibi",
        "score:neg",
        "score:negconst",
        "score:intconst",
        "score:DIV",
        "dtype:fp16",
        "dtype:bf16",
        "dtype:fp32",
        "align:top_left",
        "align:bottom_right",
        "scale",
        "rescale",
        "mask:input",
        "score:input",
        "score:learnable",
        "mask:b",
        "v_head_dim",
    }
)


def _nodes(e: ir.Expr) -> Iterator[ir.Expr]:
    """Every node of `e`, without recursion (accepted trees may be deep)."""
    stack = [e]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ir.Unary):
            stack.append(node.operand)
        elif isinstance(node, ir.Binary):
            stack += [node.left, node.right]
        elif isinstance(node, (ir.Call, ir.Index)):
            stack += node.args


# Arithmetic that can carry a big constant past int32's range.
_INT32_EDGE_OPS = frozenset({ir.BinOp.ADD, ir.BinOp.SUB, ir.BinOp.MUL})


def features(v: ir.Variant) -> frozenset[str]:
    found = {f"dtype:{v.dtype.value}", f"align:{v.align.value}"}
    if v.scale is not None:
        found.add("scale")
    if v.rescale_threshold > 0:
        found.add("rescale")
    if v.v_dim != v.head_dim:
        found.add("v_head_dim")
    for where, expr in (("mask", v.mask), ("score", v.score)):
        for node in _nodes(expr):
            if isinstance(node, ir.Name):
                found.add(f"{where}:{node.id}")
            elif isinstance(node, ir.Index):
                found.add(f"{where}:input")
                if any(i.name == node.input and i.learnable for i in v.inputs):
                    found.add(f"{where}:learnable")
            elif isinstance(node, ir.Call):
                found.add(f"{where}:{node.fn}" + ("2" if len(node.args) == 2 else ""))
                found.add(f"{where}:{node.fn}")
            elif isinstance(node, ir.Unary):
                found.add(f"{where}:{node.op.name}")
                if node.op is ir.UnaryOp.NEG:
                    found.add(f"{where}:neg")
                    if isinstance(node.operand, ir.Num):
                        found.add(f"{where}:negconst")
            elif isinstance(node, ir.Binary):
                found.add(f"{where}:{node.op.name}")
                if node.op in _INT32_EDGE_OPS and any(
                    isinstance(x, ir.Num) and isinstance(x.value, int) and x.value >= 2**20
                    for x in (node.left, node.right)
                ):
                    found.add(f"{where}:bigarith")
            elif isinstance(node, ir.Num):
                found.add(f"{where}:{'intconst' if isinstance(node.value, int) else 'realconst'}")
                if isinstance(node.value, int) and node.value >= 2**20:
                    # Big enough to take int32 arithmetic near its edge.
                    found.add(f"{where}:bigint")
    return frozenset(found)


# --------------------------------------------------------------------------- #
# The numeric domain
# --------------------------------------------------------------------------- #

FLOAT32 = torch.finfo(torch.float32)
DOMAIN_MAX = FLOAT32.max / 4
DOMAIN_TINY = FLOAT32.tiny


def numeric_domain(
    variant: ir.Variant, q: torch.Tensor, k: torch.Tensor, inputs: dict | None = None
) -> tuple[str, str] | None:
    """None if the kernels' float32 can represent this score on these inputs (see the
    module docstring), else (which bound is broken, the subexpression that breaks it).
    `inputs`: the variant's declared inputs by name."""
    batch, heads, nq, nk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    visible = mask_matrix(variant, nq, nk, heads, batch=batch, inputs=inputs)
    visible = visible.expand(batch, heads, nq, nk)
    if not visible.any():
        return None
    # Gradients come back in the module's dtype: past its largest value they
    # cannot be represented (16-bit modules also feed dS to the tensor cores in it).
    gradient_max = min(DOMAIN_MAX, torch.finfo(torch_dtype(variant.dtype)).max / 4)
    q64 = q.double().requires_grad_()
    k64 = k.double().requires_grad_()
    seen: set[ir.Expr] = set()
    for e in _nodes(variant.score):
        if e in seen:
            continue
        seen.add(e)
        values = scores(dataclasses.replace(variant, score=e), q64, k64, inputs=inputs)[visible]
        if not bool(torch.isfinite(values).all()):
            return "a subexpression is not finite", _short(e)
        magnitude = values.detach().abs()
        if magnitude.max().item() > DOMAIN_MAX:
            return "a subexpression exceeds float32 max / 4", _short(e)
        if bool(((magnitude > 0) & (magnitude < DOMAIN_TINY)).any()):
            return "a subexpression underflows float32 (below 2^-126)", _short(e)
        if values.requires_grad:
            grads = torch.autograd.grad(values.sum(), (q64, k64), allow_unused=True)
            for g in grads:
                if g is not None and not (
                    bool(torch.isfinite(g).all()) and g.abs().max().item() <= gradient_max
                ):
                    return "a subexpression's gradient leaves float32's range", _short(e)
    return None


def _short(e: ir.Expr) -> str:
    try:
        text = print_expr(e)
    except (ValueError, RecursionError):
        text = type(e).__name__
    return text if len(text) <= 60 else text[:57] + "..."


# Modules that a file <block>.py next to the user's code would hide: the standard library's
# and the two a generated module imports besides it.
SHADOWED_MODULES = frozenset(sys.stdlib_module_names | {"torch", "triton"})


def unrepresentable_constant(v: ir.Variant) -> str | None:
    """A real constant of `v` that becomes inf or 0 in float32 (|x| > float32 max, or
    0 < |x| < 2^-150, half the smallest subnormal), which kernels then compute with
    instead of the spec's value; None if there is none.  Subnormals are representable and
    left to the numeric domain."""
    reals = [("scale", v.scale), ("rescale_threshold", v.rescale_threshold)]
    for where, expr in (("mask", v.mask), ("score", v.score)):
        reals += [(where, n.value) for n in _nodes(expr) if isinstance(n, ir.Num)]
    for where, value in reals:
        if isinstance(value, float) and not (
            math.isfinite(value) and (value == 0 or 2.0**-150 < abs(value) <= FLOAT32.max)
        ):
            return f"{value!r} in {where}"
    return None


# --------------------------------------------------------------------------- #
# Diagnostics in the project's format
# --------------------------------------------------------------------------- #

_HEADER = re.compile(r"(?P<path>.+?):(?P<line>\d+):(?P<col>\d+): (?P<severity>error|warning): .+")
_CARETS = re.compile(r" {4}(?P<pad> *)\^+")
_TAB = "    "


def _excerpt_problem(shown: str, raw: str, indent: int, col: int, caret: int) -> str | None:
    """A line too long to show whole may be shown as an excerpt: `...` + a run of
    the line + `...` (either mark only where text is cut), at most `EXCERPT_MAX`
    characters of it.  "" when `shown` is such an excerpt with the caret under
    column `col`; a problem when it is an excerpt with the caret elsewhere; None
    when it is no excerpt of this line at all."""
    # Tabs are shown as _TAB: compare on the line as shown.  A caret in the
    # indentation stands at its end, as on lines shown whole.
    col = len(raw[: max(col - 1, indent)].replace("\t", _TAB)) + 1
    indent = len(raw[:indent].replace("\t", _TAB))
    raw = raw.replace("\t", _TAB)
    shown_body = shown[len(_TAB) :]
    found = False
    # "..." may be a cut mark or the line's own text: try each reading.
    for head in {"", "..."} & {"", shown_body[:3]}:
        for tail in {"", "..."} & {"", shown_body[-3:]}:
            body = shown_body[len(head) : len(shown_body) - len(tail)]
            if not (head or tail) or len(body) > EXCERPT_MAX * len(_TAB):
                continue
            i = raw.find(body, indent)
            while i != -1:
                cut_as_shown = (i > indent) == bool(head) and (i + len(body) < len(raw)) == bool(
                    tail
                )
                if cut_as_shown and caret == len(head) + (col - 1 - i):
                    return ""
                found = found or cut_as_shown
                i = raw.find(body, i + 1)
    if not found:
        return None
    return f"caret at {caret + 1} of the excerpt {shown!r}, not under column {col}"


def diagnostic_problems(output: str, path: str, lines: Sequence[str] | None) -> list[str]:
    """What is wrong with `output` as a list of rendered diagnostics for `path`.

    `lines` are the file's lines as the lexer counts them (split at "\\n"), or None when the
    file is not text (then only the shape of each entry is checked).  Each entry is a
    header, the source line at LINE shown without its indentation, and a caret line whose
    first caret sits under COL, then any number of note lines.
    """
    if not output.endswith("\n"):
        return ["diagnostics do not end with a newline"]
    rows = output[:-1].split("\n")
    problems = []
    i = 0
    while i < len(rows):
        header = _HEADER.fullmatch(rows[i])
        if header is None:
            return problems + [f"not a diagnostic header `PATH:LINE:COL: error: ...`: {rows[i]!r}"]
        if header["path"] != path:
            return problems + [f"names the file {header['path']!r}, not {path!r}"]
        line, col = int(header["line"]), int(header["col"])
        if i + 2 >= len(rows):
            return problems + [f"no source line and caret after {rows[i]!r}"]
        shown, carets = rows[i + 1], _CARETS.fullmatch(rows[i + 2])
        if carets is None:
            problems.append(f"no caret line after {rows[i]!r}: {rows[i + 2]!r}")
        elif lines is not None:
            if not (1 <= line <= len(lines) and 1 <= col <= len(lines[line - 1]) + 1):
                problems.append(f"position {line}:{col} is outside the file: {rows[i]!r}")
            else:
                # The grammar's white space (grammars/attn.lark), not str.strip's.
                raw = lines[line - 1].rstrip(" \t\f\r")
                indent = len(raw) - len(raw.lstrip(" \t\f\r"))
                expected = _TAB + raw[indent:].replace("\t", _TAB)
                pad = len(raw[indent : max(col - 1, indent)].replace("\t", _TAB))
                if shown != expected:
                    problem = _excerpt_problem(shown, raw, indent, col, len(carets["pad"]))
                    if problem == "":
                        pass
                    elif problem is not None:
                        problems.append(problem)
                    else:
                        problems.append(f"shows {shown!r} for line {line}, which is {expected!r}")
                elif len(carets["pad"]) != pad:
                    problems.append(f"caret at {len(carets['pad']) + 1}, column {col} is {pad + 1}")
        i += 3
        while i < len(rows) and rows[i].startswith(f"{_TAB}= note: "):
            i += 1
    return problems


# --------------------------------------------------------------------------- #
# The campaign
# --------------------------------------------------------------------------- #


@dataclass
class Violation:
    """One class of broken promise, with the smallest input that showed it."""

    label: str
    detail: str
    example: FuzzInput | str
    count: int = 1

    def describe(self) -> str:
        return f"[{self.label}] x{self.count}\n    {self.detail}\n    input: {self.example!r}"


@dataclass
class Accepted:
    """A distinct accepted variant and the first input that produced it."""

    variant: ir.Variant
    source: FuzzInput
    features: frozenset[str]
    # Runs its kernels before any chosen by features (an explicit input of known trouble).
    first: bool = False


# Kernel shapes: Nq < Nk with MQA first; then the first of the others that has a fully masked
# row under the variant's mask, else the last (Nq > Nk, batch 2).
FIRST_SHAPE = Shape(1, 2, 1, 7, 12)
MASKED_ROW_SHAPES = (
    Shape(1, 1, 1, 20, 20),
    Shape(1, 2, 1, 40, 9),
    Shape(1, 3, 1, 5, 40),
    Shape(1, 2, 2, 70, 70),
    Shape(2, 2, 2, 12, 5),
)


@dataclass
class Campaign:
    """Runs inputs through the invariant and collects violations (see the module docstring).

    `root` is an empty scratch directory and is the working directory while inputs run, so
    a stray write shows; `build_every`: accepted inputs are built (and imported, and built
    through the API) when the first byte of their sha256 is a multiple of it, every
    rejected input is built; `kernel_cap`: the most variants whose kernels run.
    """

    root: Path
    build_every: int
    kernel_cap: int
    violations: dict[str, Violation] = field(default_factory=dict)
    accepted: dict[str, Accepted] = field(default_factory=dict)
    stats: Counter = field(default_factory=Counter)
    excluded: Counter = field(default_factory=Counter)
    excluded_examples: dict[str, str] = field(default_factory=dict)
    covered: set[str] = field(default_factory=set)
    timings: dict[str, float] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.cwd = self.root / "cwd"
        self.cwd.mkdir()
        self.case = self.root / "case"
        self._modules = 0
        self._seen: set[bytes] = set()
        self._kernels_first = False

    # -- violations ---------------------------------------------------------- #

    def _violation(self, label: str, detail: str, example: FuzzInput | str) -> None:
        known = self.violations.get(label)
        size = len(example.data) if isinstance(example, FuzzInput) else len(example)
        if known is None:
            self.violations[label] = Violation(label, detail, example)
            return
        known.count += 1
        old = known.example
        if size < (len(old.data) if isinstance(old, FuzzInput) else len(old)):
            known.detail, known.example = detail, example

    def report(self) -> str:
        lines = [
            f"{self.stats['inputs']} distinct inputs ({self.stats['drawn']} drawn): "
            f"{self.stats['accepted']} accepted, "
            f"{self.stats['rejected']} rejected; {len(self.accepted)} distinct accepted "
            f"variants; {self.stats['builds']} builds ({self.stats['accepted_builds']} of "
            f"accepted inputs); {self.stats['kernel_variants']} variants ran kernels "
            f"({self.stats['kernel_cases']} shapes judged, "
            f"{sum(self.excluded.values())} outside the numeric domain, "
            f"{self.stats['refused_cases']} calls the language refuses)",
            "time: " + ", ".join(f"{k} {v:.1f}s" for k, v in self.timings.items()),
        ]
        for reason, n in self.excluded.most_common():
            lines.append(
                f"outside the domain x{n}: {reason}, e.g. {self.excluded_examples[reason]}"
            )
        for violation in self.violations.values():
            lines.append(violation.describe())
        return "\n".join(lines)

    # -- one input ----------------------------------------------------------- #

    def run(self, item: FuzzInput, *, kernels_first: bool = False) -> None:
        """Check, build and call the API on one input; record what it broke.  An input
        seen before is counted and skipped: every step is deterministic.  With
        `kernels_first`, the variants it defines run their kernels before all others."""
        self.stats["drawn"] += 1
        digest = hashlib.sha256(item.data + b"\0" + repr(item.text).encode()).digest()
        if digest in self._seen:
            return
        self._seen.add(digest)
        self.stats["inputs"] += 1
        self._kernels_first = kernels_first
        try:
            self._run(item)
        except _Stop:
            pass

    def _fail(self, label: str, detail: str, item: FuzzInput) -> None:
        self._violation(label, detail, item)
        raise _Stop

    def _cli(self, item: FuzzInput, step: str, *argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = cli.main(list(argv))
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else 1
        except Exception as e:  # noqa: BLE001 - the point is that none escapes
            where = traceback.extract_tb(e.__traceback__)[-1]
            self._fail(
                f"{step}: {type(e).__name__} escapes main",
                f"{type(e).__name__}: {_clip(str(e))} at {Path(where.filename).name}:{where.lineno}",
                item,
            )
        stdout, stderr = out.getvalue(), err.getvalue()
        if "Traceback" in stdout + stderr:
            self._fail(f"{step}: traceback printed", _clip(stderr), item)
        return code, stdout, stderr

    def _fresh_case(self) -> tuple[Path, Path]:
        if self.case.exists():
            shutil.rmtree(self.case)
        self.case.mkdir()
        out = self.case / "out"
        out.mkdir()
        return self.case / "spec.attn", out

    def _run(self, item: FuzzInput) -> None:
        spec, out = self._fresh_case()
        spec.write_bytes(item.data)
        path = str(spec)
        # The CLI decodes the file's bytes as they are: a '\r' is white space
        # to the grammar, and only '\n' ends a line.
        cli_text = None
        if _is_utf8(item.data):
            cli_text = item.data.decode("utf-8")
        lines = cli_text.split("\n") if cli_text is not None else None

        start = time.perf_counter()
        code, stdout, stderr = self._cli(item, "check", "check", path)
        self.timings["check"] += time.perf_counter() - start
        self._nothing_written(item, "check", spec, out)
        variants: tuple[ir.Variant, ...] = ()
        if code == 0:
            variants = self._variants(item, path, cli_text)
            expected = f"ok: {_plural(len(variants), 'attention block')} in 1 file\n"
            if stdout != expected:
                self._fail("check: exit 0 but unexpected stdout", f"{stdout!r}", item)
            problems = diagnostic_problems(stderr, path, lines) if stderr else []
            if problems:
                self._fail("check: malformed warning", problems[0], item)
            self.stats["accepted"] += 1
            if len(item.data) > ir.MAX_SPEC_BYTES:
                self._fail(
                    "check: accepts a file over ir.MAX_SPEC_BYTES",
                    f"{len(item.data)} bytes",
                    item,
                )
        elif code == 1:
            self.stats["rejected"] += 1
            if stdout:
                self._fail("check: exit 1 with stdout", _clip(stdout), item)
            problems = diagnostic_problems(stderr, path, lines)
            if problems or ": error: " not in stderr:
                self._fail(
                    "check: diagnostic not in the PATH:LINE:COL + source + caret format",
                    (problems or ["no error reported"])[0],
                    item,
                )
        else:
            self._fail(f"check: exit {code}", _clip(stderr), item)

        accepted = code == 0
        sampled = accepted and hashlib.sha256(item.data).digest()[0] % self.build_every == 0
        if not accepted or sampled:
            self._build(item, spec, out, stderr, [v.name for v in variants] if accepted else None)
        if item.text is not None and (not accepted or sampled):
            self._api(item, path, stderr, out if accepted else None)
        for variant in variants:
            self._record(variant, item)

    def _nothing_written(self, item: FuzzInput, step: str, spec: Path, out: Path) -> None:
        stray = [p for p in self.case.iterdir() if p not in (spec, out)] + list(out.iterdir())
        stray += list(self.cwd.iterdir())
        if stray:
            self._fail(f"{step}: wrote files", ", ".join(p.name for p in stray[:5]), item)

    def _variants(self, item: FuzzInput, path: str, text: str | None) -> tuple[ir.Variant, ...]:
        try:
            variants, _ = api.check_sources({path: text})
        except Exception as e:  # noqa: BLE001
            self._fail("check_sources disagrees with `flashgen check`", repr(e)[:300], item)
        return variants

    def _build(
        self, item: FuzzInput, spec: Path, out: Path, check_err: str, names: list[str] | None
    ) -> None:
        """`names`: the blocks check accepted, None if it rejected the file."""
        start = time.perf_counter()
        code, stdout, stderr = self._cli(item, "build", "build", str(spec), "-o", str(out))
        self.timings["build"] += time.perf_counter() - start
        self.stats["builds"] += 1
        written = sorted(p.name for p in out.iterdir())
        stray = [p.name for p in self.case.iterdir() if p not in (spec, out)]
        stray += [p.name for p in self.cwd.iterdir()]
        if stray:
            self._fail("build: wrote outside -o DIR", ", ".join(stray[:5]), item)
        if names is None:
            if code != 1 or written or stdout:
                self._fail(
                    "build: a spec that check rejects is not rejected cleanly",
                    f"exit {code}, wrote {written}, stdout {_clip(stdout)!r}",
                    item,
                )
            if stderr != check_err:
                self._fail("build: diagnostics differ from check's", _clip(stderr), item)
            return
        self.stats["accepted_builds"] += 1
        if code != 0 or written != sorted(f"{n}.py" for n in names):
            self._fail(
                "build: a spec that checks does not build",
                f"exit {code}, wrote {written} for blocks {names}: {_clip(stderr)}",
                item,
            )
        for name in names:
            self._import(item, out / f"{name}.py")

    def _import(self, item: FuzzInput, path: Path) -> ModuleType:
        start = time.perf_counter()
        self._modules += 1
        module_name = f"flashgen_fuzz_{self._modules}_{path.stem}"
        try:
            spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001
            self._fail("built module does not import", f"{type(e).__name__}: {_clip(str(e))}", item)
        finally:
            self.timings["import"] += time.perf_counter() - start
        return module

    def _api(self, item: FuzzInput, path: str, cli_err: str, built: Path | None) -> None:
        text = item.text
        start = time.perf_counter()
        try:
            if "\r" in text:
                # Its meaning differs from the file's; only the form of its diagnostics is
                # compared, without building (rendering costs about a second).
                api.check_sources({"<string>": text})
                return
            modules = api.build_sources(text)
        except SpecError as e:
            # A lone surrogate cannot be printed: diagnostics show U+FFFD in its place.
            shown = re.sub("[\ud800-\udfff]", "\ufffd", text)
            problems = diagnostic_problems(str(e) + "\n", "<string>", shown.split("\n"))
            if problems:
                self._fail("api: SpecError not in the diagnostic format", problems[0], item)
            if "\r" not in text:
                mine = [(d.span.line, d.span.column, d.message) for d in e.diagnostics]
                theirs = [
                    (int(m["line"]), int(m["col"]), m.group(0).split(": ", 2)[-1])
                    for m in map(_HEADER.fullmatch, cli_err.split("\n"))
                    if m is not None
                ]
                if built is not None or mine != theirs:
                    self._fail(
                        "api: build_sources(text) disagrees with `flashgen check` on the file",
                        f"api {mine[:2]} vs cli {theirs[:2]}",
                        item,
                    )
            return
        except Exception as e:  # noqa: BLE001
            self._fail(
                f"api: build_sources(text) raises {type(e).__name__}",
                _clip(f"{type(e).__name__}: {e}"),
                item,
            )
        finally:
            self.timings["api"] += time.perf_counter() - start
        if built is None:
            self._fail("api: build_sources(text) accepts what `flashgen check` rejects", "", item)
        on_disk = {p.stem: p.read_text(encoding="utf-8") for p in built.iterdir()}
        if modules != on_disk:
            self._fail("api: build_sources(text) differs from `flashgen build`", "", item)

    def _record(self, variant: ir.Variant, item: FuzzInput) -> None:
        if variant.name in SHADOWED_MODULES:
            self._fail(
                "check: accepts a block name that shadows a module",
                f"`{variant.name}.py` in the output directory hides the module {variant.name!r}",
                item,
            )
        constant = unrepresentable_constant(variant)
        if constant is not None:
            self._fail("check: accepts a real constant that float32 cannot hold", constant, item)
        try:
            key = print_variant(dataclasses.replace(variant, name="v"))
        except Exception as e:  # noqa: BLE001
            self._fail("printer: cannot print a checked variant", f"{type(e).__name__}: {e}", item)
        if key not in self.accepted:
            self.accepted[key] = Accepted(variant, item, features(variant), self._kernels_first)

    # -- drawn inputs -------------------------------------------------------- #

    def fuzz(self, strategy: st.SearchStrategy[FuzzInput], count: int) -> None:
        """Run `count` distinct inputs drawn from `strategy` (derandomized under the test
        profile; Hypothesis draws some inputs more than once, and those run once)."""
        start = time.perf_counter()
        target = self.stats["inputs"] + count

        @settings(
            # An upper bound: drawing stops at `count` distinct inputs.
            max_examples=20 * count,
            deadline=None,
            database=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(strategy)
        def drawn(item: FuzzInput) -> None:
            if self.stats["inputs"] >= target:
                raise _Enough
            self.run(item)

        try:
            drawn()
        except _Enough:
            pass
        self.timings["inputs (all)"] += time.perf_counter() - start

    # -- kernels ------------------------------------------------------------- #

    def run_kernels(self, required: frozenset[str] = REQUIRED_FEATURES) -> None:
        """Run the kernels of up to `kernel_cap` distinct accepted variants: those marked
        `first`, then greedily the one that brings the most `required` features not yet judged inside the numeric domain
        (first seen on ties), then likewise for any feature, then others at an even stride."""
        start = time.perf_counter()
        records = list(self.accepted.values())
        done: set[int] = set()

        def run(i: int) -> None:
            done.add(i)
            if self._kernels(records[i]):
                self.covered.update(records[i].features)

        for i, record in enumerate(records):
            if record.first and self.stats["kernel_variants"] < self.kernel_cap:
                run(i)
        for wanted in (required, None):
            while self.stats["kernel_variants"] < self.kernel_cap:
                gains = [
                    (
                        len((r.features if wanted is None else r.features & wanted) - self.covered),
                        -i,
                    )
                    for i, r in enumerate(records)
                    if i not in done
                ]
                best = max(gains, default=(0, 0))
                if best[0] == 0:
                    break
                run(-best[1])
        rest = [i for i in range(len(records)) if i not in done]
        spare = self.kernel_cap - self.stats["kernel_variants"]
        if spare > 0 and rest:
            for i in rest[:: max(1, len(rest) // spare)][:spare]:
                run(i)
        self.timings["kernels"] += time.perf_counter() - start

    def _kernels(self, record: Accepted) -> bool:
        """Build the record's input with the CLI and judge its kernels; whether any shape
        was inside the numeric domain."""
        self.stats["kernel_variants"] += 1
        item, variant = record.source, record.variant
        reproducer = item
        try:
            reproducer = print_variant(variant)
            spec, out = self._fresh_case()
            spec.write_bytes(item.data)
            code, _, stderr = self._cli(item, "build", "build", str(spec), "-o", str(out))
            path = out / f"{variant.name}.py"
            if code != 0 or not path.exists():
                self._fail("build: a spec that checks does not build", _clip(stderr), item)
            # Keep the module: Triton's interpreter reads kernel source from its file.
            kept = self.root / "modules" / f"{self.stats['kernel_variants']}"
            kept.mkdir(parents=True)
            module = self._import(item, shutil.copy(path, kept / path.name))
            if variant.dtype is ir.DType.BF16:
                # The CPU interpreter has no bf16 dot product: run the same variant as fp16
                # (same mask, score and code paths; bf16 itself runs on the GPU suite).
                variant = dataclasses.replace(variant, dtype=ir.DType.FP16)
                fp16 = kept / "fp16.py"
                fp16.write_text(api.build_source(print_variant(variant)), encoding="utf-8")
                module = self._import(item, fp16)
            judged = False
            for shape in self._shapes(variant):
                judged |= self._judge(variant, module, shape, reproducer)
            return judged
        except _Stop:
            return False

    def _shapes(self, variant: ir.Variant) -> list[Shape]:
        if ir.reads_runtime_data(variant.mask):  # rows masked by the data drawn per case
            return [FIRST_SHAPE, MASKED_ROW_SHAPES[-1]]

        def masked_row(shape: Shape) -> bool:
            visible = mask_matrix(variant, shape.n_queries, shape.n_keys, shape.heads)
            return bool((~visible.any(dim=-1)).any())

        second = next((s for s in MASKED_ROW_SHAPES if masked_row(s)), MASKED_ROW_SHAPES[-1])
        return [FIRST_SHAPE, second]

    def _judge(
        self, variant: ir.Variant, module: ModuleType, shape: Shape, reproducer: str
    ) -> bool:
        seed = int.from_bytes(hashlib.sha256(reproducer.encode()).digest()[:4], "little")
        generator = torch.Generator().manual_seed(seed)
        dtype = torch_dtype(variant.dtype)
        q, k, v = random_inputs(
            shape, variant.head_dim, dtype, "cpu", generator=generator, v_head_dim=variant.v_dim
        )
        data = random_runtime_inputs(variant, shape, "cpu", generator=generator)
        refusal = check_refusal(variant, module, q, k, v, data)
        if refusal is not None:  # the language refuses this call: the module must too
            self.stats["refused_cases"] += 1
            if not refusal.ok:
                self._violation(
                    "kernel: a call the language refuses is not refused alike",
                    f"{shape}: reference: {refusal.refused}; module: "
                    f"{refusal.module_refused or 'no error'}",
                    reproducer,
                )
            return False
        try:
            outside = numeric_domain(variant, q, k, data)
        except Exception as e:  # noqa: BLE001
            self._violation(
                f"reference raises {type(e).__name__}", f"{shape}: {_clip(str(e))}", reproducer
            )
            return False
        if outside is not None:
            reason, expr = outside
            self.excluded[reason] += 1
            self.excluded_examples.setdefault(reason, f"`{expr}` in {reproducer!r}")
            return False
        self.stats["kernel_cases"] += 1
        for what, judge in (
            ("forward", lambda: check_forward(variant, module, q, k, v, inputs=data)),
            (
                "backward",
                lambda: check_backward(variant, module, q, k, v, generator=generator, inputs=data),
            ),
        ):
            try:
                result = judge()
            except Exception as e:  # noqa: BLE001
                self._violation(
                    f"kernel: {what} raises {type(e).__name__}: {_signature(e)}",
                    f"{shape}: {_clip(str(e))}",
                    reproducer,
                )
                return True
            bad = [c for c in result.checks if not c.ok]
            if bad:
                worst = bad[0]
                label = f"kernel: {what} {worst.what} " + (
                    "not finite" if not worst.finite else "outside tolerance"
                )
                self._violation(
                    label,
                    f"{shape} {variant.dtype.value}: {worst.what} error {worst.error:.3g} > bound "
                    f"{worst.bound:.3g}; also: {[c.what for c in bad]}",
                    reproducer,
                )
        return True


class _Stop(Exception):
    """An input broke the invariant; it has been recorded."""


class _Enough(BaseException):
    """Enough distinct inputs have run.  A BaseException, so that Hypothesis passes it on
    instead of taking it for a failure to shrink."""


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _signature(e: Exception) -> str:
    """The gist of an error message, to tell causes apart: Triton's interpreter nests the
    real error in quoted InterpreterError layers; numbers vary between inputs."""
    text = re.sub(r"InterpreterError|[\\'\"]", "", str(e))
    text = re.sub(r"[()\s]+", " ", re.sub(r"\d+", "N", text))
    return text.strip()[:60]


def _clip(text: str, limit: int = 300) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + "..."
