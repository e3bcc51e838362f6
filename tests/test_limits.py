"""The language's limits (docs/LANGUAGE.md, "Limits"): integer ranges, real
constants, expression size, reserved block names.

Every spec that `check` accepts must compute the right answer in kernels that
evaluate integers in int32 and reals in float32; everything else is a
diagnostic with a place and a caret, never a traceback or a silently wrong
module.  Expected bounds are worked out here from the documented rules
(positions up to 2^25 with padding, heads up to 2^16, integers within
±2^30), not read back from flashgen.check.
"""

from __future__ import annotations

import math
import re
import sys
import time
from pathlib import Path

import pytest

from flashgen import ir
from flashgen.check import check, integer_magnitude
from flashgen.diagnostics import render_all
from flashgen.ir import BinOp, Name, Num, Unary, UnaryOp
from flashgen.parse import parse
from test_diagnostics import diagnose

ROOT = Path(__file__).parent.parent
# What a generated module is made of: the templates and the host runtime.
MODULE_SOURCES = sorted((ROOT / "templates").glob("*.j2")) + [ROOT / "flashgen" / "runtime.py"]

# The documented rules, written out independently of the checker.
POSITIONS = 2**25  # |q|, |k| with padding: twice the longest sequence, 2^24
HEADS = 2**16
LIMIT = 2**30
LARGEST_WINDOW = LIMIT - 2 * POSITIONS  # k - (q - L) within 2 * 2^25 + L
LARGEST_PREFIX = LIMIT - POSITIONS  # k - P within 2^25 + P
LARGEST_CHUNK = LIMIT - POSITIONS  # floor division shifts q by up to C
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_MIN = 2.0**-126
LOG2E = 1.4426950408889634
ABOVE_FLOAT32_MAX = math.nextafter(FLOAT32_MAX, math.inf)
BELOW_FLOAT32_MIN = math.nextafter(FLOAT32_MIN, 0.0)


def block(body: str, name: str = "v") -> str:
    return f"attention {name} {{\n    head_dim = 64\n    dtype = fp16\n    {body}\n}}\n"


def accepted(body: str) -> ir.Variant:
    spec, diagnostics = parse(block(body), "ok.attn")
    assert diagnostics == [], [d.message for d in diagnostics]
    variants, diagnostics = check([spec])
    assert diagnostics == [], [d.message for d in diagnostics]
    (v,) = variants
    return v


def rejected(body: str, name: str = "v") -> tuple[str, str]:
    """The one diagnostic of a block with `body` on its line 4: (message,
    rendered text); the rendering must have file:line:col and a caret."""
    text = block(body, name)
    diagnostics = diagnose("x.attn", text)
    assert len(diagnostics) == 1, [d.message for d in diagnostics]
    rendered = render_all(diagnostics, {"x.attn": text})
    header, source, carets, *_ = rendered.splitlines()
    assert re.match(r"x\.attn:\d+:\d+: error: ", header), header
    assert carets.strip() and set(carets.strip()) == {"^"}, rendered
    return diagnostics[0].message, rendered


def caret_under(rendered: str) -> str:
    """The source text the carets of a rendered diagnostic underline."""
    _, source, carets, *_ = rendered.splitlines()
    start = carets.index("^")
    return source[start : len(carets)]


# --------------------------------------------------------------------------- #
# Integer ranges (issue 19, item 1)
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "mask, underlined, message",
    [
        (
            "window(0, 2147483647)",
            "2147483647",
            f"window size 2147483647 is too large; the largest accepted is {LARGEST_WINDOW}",
        ),
        (
            "k <= q + 2147483647",
            "2147483647",
            "the integer 2147483647 is too large; integer expressions must stay within "
            "±2^30 for sequences of up to 16777216 positions",
        ),
        (
            "q - k >= -2147483647",
            "2147483647",
            "the integer 2147483647 is too large; integer expressions must stay within "
            "±2^30 for sequences of up to 16777216 positions",
        ),
        (
            "window(2147483647)",
            "2147483647",
            f"window size 2147483647 is too large; the largest accepted is {LARGEST_WINDOW}",
        ),
        (
            "q*q*q*q*q*q > k",
            "q*q",
            "`q * q` can reach 2^50; integer expressions must stay within ±2^30 "
            "for sequences of up to 16777216 positions",
        ),
        (
            "q * 65536 * 65536 == 0",
            "q * 65536",
            "`q * 65536` can reach 2^41; integer expressions must stay within ±2^30 "
            "for sequences of up to 16777216 positions",
        ),
    ],
)
def test_issue_integer_overflows_are_diagnosed(mask, underlined, message):
    got, rendered = rejected(f"mask = {mask}")
    assert got == message
    assert caret_under(rendered) == underlined


def test_overflow_note_names_the_assumptions():
    _, rendered = rejected("mask = q * q > k")
    assert "32 bits" in rendered and "33554432" in rendered and "65536" in rendered


@pytest.mark.parametrize(
    "mask",
    [
        f"window({LARGEST_WINDOW})",
        f"window(0, {LARGEST_WINDOW})",
        f"window({LARGEST_WINDOW}, {LARGEST_WINDOW})",
        f"prefix({LARGEST_PREFIX})",
        f"chunk({LARGEST_CHUNK})",
        f"q div {LARGEST_CHUNK} == k div {LARGEST_CHUNK}",
        # k - (q + c) within 2^25 + 2^25 + c = 2^30 exactly
        f"k <= q + {LIMIT - 2 * POSITIONS}",
        # 2^25 * 31 + 2^25 = 2^30
        "q * 31 > k",
        # h * H reaches 2^32 but only h * 2^14 ... : 2^16 * 2^14 = 2^30
        "h * 16384 > 0",
        "(q - k) % 7 == 0",
        "abs(q - k) < 20",
    ],
)
def test_accepted_right_at_the_integer_limit(mask):
    accepted(f"mask = {mask}")


@pytest.mark.parametrize(
    "mask, underlined",
    [
        (f"window({LARGEST_WINDOW + 1})", str(LARGEST_WINDOW + 1)),
        (f"window(3, {LARGEST_WINDOW + 1})", str(LARGEST_WINDOW + 1)),
        (f"prefix({LARGEST_PREFIX + 1})", str(LARGEST_PREFIX + 1)),
        (f"chunk({LARGEST_CHUNK + 1})", str(LARGEST_CHUNK + 1)),
        (f"q div {LARGEST_CHUNK + 1} == 0", f"q div {LARGEST_CHUNK + 1}"),
        (f"q % {LARGEST_CHUNK + 1} == 0", f"q % {LARGEST_CHUNK + 1}"),
        (f"k <= q + {LIMIT - 2 * POSITIONS + 1}", f"k <= q + {LIMIT - 2 * POSITIONS + 1}"),
        ("q * 32 > k", "q * 32 > k"),
        ("h * 16385 > 0", "h * 16385"),
        ("h * H > 0", "h * H"),
        (f"q < {LIMIT + 1}", str(LIMIT + 1)),
    ],
)
def test_rejected_just_past_the_integer_limit(mask, underlined):
    _, rendered = rejected(f"mask = {mask}")
    assert caret_under(rendered) == underlined


@pytest.mark.parametrize(
    "mask, instead",
    [
        ("window(2000000000)", "`window(2000000000)` is `causal`"),
        ("window(2000000000, 5)", "`window(2000000000, 5)` is `k <= q + 5`"),
        ("window(7, 2000000000)", "`window(7, 2000000000)` is `q - 7 <= k`"),
        ("window(16777215, 2000000000)", "`window(16777215, 2000000000)` is `full`"),
        ("prefix(2000000000)", "`prefix(2000000000)` is `full`"),
        ("chunk(2000000000)", "`chunk(2000000000)` is `q >= 0`"),
    ],
)
def test_named_mask_arguments_too_large_say_what_to_write(mask, instead):
    _, rendered = rejected(f"mask = {mask}")
    assert instead in rendered


def test_only_the_innermost_overflow_is_reported():
    message, rendered = rejected("mask = q * q * q * q > k * k * k")
    assert message.startswith("`q * q` can reach 2^50")
    assert caret_under(rendered) == "q * q"


@pytest.mark.parametrize(
    "score, underlined",
    [
        ("s + q * q", "q * q"),
        ("s * (h * H)", "(h * H)"),
        ("s + 0.5 * (q * k)", "(q * k)"),
        ("s + 2000000000", "2000000000"),
    ],
)
def test_integers_in_the_score_are_checked_until_they_meet_a_real(score, underlined):
    _, rendered = rejected(f"score = {score}")
    assert caret_under(rendered) == underlined


@pytest.mark.parametrize("score", ["0.5 * q * k", "s + 1.0 * q * q * q", "s / (1.0 + q * 31)"])
def test_reals_are_not_bounded_as_integers(score):
    accepted(f"score = {score}")


@pytest.mark.parametrize(
    "source, bound",
    [
        ("q", POSITIONS),
        ("-k", POSITIONS),
        ("h", HEADS),
        ("q - k + 3", 2 * POSITIONS + 3),
        ("q * 5", 5 * POSITIONS),
        ("q div 3", POSITIONS // 3 + 1),
        ("(q - k) % 7", 6),
        ("abs(q - k)", 2 * POSITIONS),
        ("min(q, h)", POSITIONS),
        ("max(h, 3)", HEADS),
        ("q * q", POSITIONS**2),
        ("0.5 * q", None),
        ("q < k", None),
    ],
)
def test_integer_magnitude(source, bound):
    (blk,) = parse(f"attention t {{ x = {source} }}")[0].blocks
    assert integer_magnitude(blk.settings[0].value) == bound


# --------------------------------------------------------------------------- #
# Real constants (issue 19, item 2)
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "setting, underlined, message",
    [
        (
            "score = s + 1.7e308",
            "1.7e308",
            "the real 1.7e+308 is outside the range of float32, which kernels compute in",
        ),
        (
            "score = softcap(s, 1e-320)",
            "1e-320",
            "the cap of `softcap` must be between 2^-126 and 2.35866e+38, got 1e-320",
        ),
        (
            "score = softcap(s, 1.7e308)",
            "1.7e308",
            "the cap of `softcap` must be between 2^-126 and 2.35866e+38, got 1.7e+308",
        ),
        (
            "score = s + 1e308 * (10.0 * 0.0)",
            "1e308",
            "the real 1e+308 is outside the range of float32, which kernels compute in",
        ),
        (
            "scale = 1e300",
            "1e300",
            "`scale` must be between 2^-126 and 2.35866e+38, got 1e+300",
        ),
    ],
)
def test_issue_real_constants_are_diagnosed(setting, underlined, message):
    got, rendered = rejected(setting)
    assert got == message
    assert caret_under(rendered) == underlined


@pytest.mark.parametrize(
    "score, underlined",
    [
        ("s + 1e30 * 1e30", "1e30 * 1e30"),
        ("s + 1e-30 * 1e-30", "1e-30 * 1e-30"),
        ("s + 4 * 1e38", "4 * 1e38"),
        ("s * exp(100.0)", "exp(100.0)"),
        ("s + log(0.0)", "log(0.0)"),
        ("s + sqrt(-1.0)", "sqrt(-1.0)"),
        ("s + 1e-39", "1e-39"),
        (f"s + {ABOVE_FLOAT32_MAX!r}", repr(ABOVE_FLOAT32_MAX)),
        (f"s + {BELOW_FLOAT32_MIN!r}", repr(BELOW_FLOAT32_MIN)),
    ],
)
def test_real_constants_outside_float32_are_diagnosed(score, underlined):
    _, rendered = rejected(f"score = {score}")
    assert caret_under(rendered) == underlined
    assert "3.4028234663852886e+38" in rendered  # the note states the range


@pytest.mark.parametrize(
    "score",
    [
        "s + 3.4028234663852886e38",
        "s - 3.4028234663852886e38",
        "s + 1.1754943508222875e-38",
        "s * 0.0",
        "s + 1e30 * 1e-30",
        "s * exp(80.0)",
        f"softcap(s, {FLOAT32_MAX / LOG2E!r})",
        f"softcap(s, {FLOAT32_MIN!r})",
    ],
)
def test_real_constants_at_the_edges_of_float32_are_accepted(score):
    accepted(f"score = {score}")


def test_scale_range():
    assert accepted(f"scale = {FLOAT32_MAX / LOG2E!r}").scale * LOG2E <= FLOAT32_MAX
    assert accepted(f"scale = {FLOAT32_MIN!r}").scale == FLOAT32_MIN
    assert rejected(f"scale = {FLOAT32_MAX!r}")[0].startswith("`scale` must be between")
    assert (
        rejected("scale = 1e-39")[0] == "`scale` must be between 2^-126 and 2.35866e+38, got 1e-39"
    )


def test_rescale_threshold_must_be_zero_or_normal():
    message, _ = rejected("rescale_threshold = 1e-40")
    assert message == "`rescale_threshold` must be 0 or at least 2^-126, got 1e-40"
    assert accepted(f"rescale_threshold = {FLOAT32_MIN!r}").rescale_threshold == FLOAT32_MIN


# --------------------------------------------------------------------------- #
# Non-finite literals never crash the printer (issue 19, item 4)
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "setting, message",
    [
        ("dtype = 1e999", "`dtype` must be one of fp16, bf16, fp32, got `1e999`"),
        ("align = 1e999", "`align` must be bottom_right or top_left, got `1e999`"),
        (
            "scale = foo(1e999)",
            "`scale` must be a positive constant; `foo(1e999)` is not a constant",
        ),
        (
            "rescale_threshold = sqrt(1e999)",
            "`rescale_threshold` must be a constant between 0 and 15.0; "
            "`sqrt(1e999)` is not a constant",
        ),
        (
            "mask = window(tanh(1e999))",
            "the arguments of `window` must be integer constants; `tanh(1e999)` is not a constant",
        ),
    ],
)
def test_non_finite_literals_give_clean_diagnostics(setting, message):
    text = f"attention v {{\n    head_dim = 64\n    {setting}\n}}\n"
    if not setting.startswith("dtype"):
        text = text.replace("head_dim = 64", "head_dim = 64; dtype = fp16")
    diagnostics = diagnose("x.attn", text)
    assert [d.message for d in diagnostics] == [message]
    assert render_all(diagnostics, {"x.attn": text}).startswith("x.attn:3:")


# --------------------------------------------------------------------------- #
# Expression size (issue 19, item 4)
# --------------------------------------------------------------------------- #

DEEP = "expression nested more than 32 levels deep"
LARGE = "expression has more than 256 parts"


def _balanced(leaves: int) -> str:
    """`s + s` trees of `leaves` leaves, parenthesised, about log2 deep."""
    if leaves == 1:
        return "s"
    half = leaves // 2
    return f"({_balanced(half)} + {_balanced(leaves - half)})"


def _nested(kind: str, n: int) -> str:
    return {
        "parens": "(" * n + "s" + ")" * n,
        "minus": "-" * n + "s",
        "tanh": "tanh(" * n + "s" + ")" * n,
        "sum": "s" + " + s" * n,
    }[kind]


@pytest.mark.parametrize("kind", ["parens", "minus", "tanh"])
@pytest.mark.parametrize("n", [10_000, 100_000])
def test_deep_nesting_is_a_quick_diagnostic(kind, n):
    text = block(f"score = {_nested(kind, n)}")
    start = time.monotonic()
    diagnostics = diagnose("x.attn", text)
    elapsed = time.monotonic() - start
    assert [d.message for d in diagnostics] == [DEEP]
    (d,) = diagnostics
    # The 33rd opening: after "    score = " (column 5 + 8) and 32 openings.
    width = {"parens": 1, "minus": 1, "tanh": 5}[kind]
    assert (d.span.line, d.span.column) == (4, 13 + 32 * width)
    rendered = render_all(diagnostics, {"x.attn": text})
    assert len(rendered) < 1000  # the long line is shown as an excerpt
    assert elapsed < 20, elapsed  # linear: a fraction of a second unshared


def test_a_one_mebibyte_sum_is_a_quick_diagnostic():
    terms = ir.MAX_SPEC_BYTES // 4
    text = block(f"score = {_nested('sum', terms)}")
    assert len(text) >= ir.MAX_SPEC_BYTES
    start = time.monotonic()
    diagnostics = diagnose("x.attn", text)
    assert time.monotonic() - start < 20
    assert [d.message for d in diagnostics] == [LARGE]
    # The 257th part: `s + ` repeated, the 129th `s`.
    assert diagnostics[0].span.column == 13 + 128 * 4


def test_every_oversized_expression_is_reported_at_once():
    text = (
        block(f"score = {_nested('parens', 10_000)}", "a")
        + block(f"score = {_nested('minus', 10_000)}", "b")
        + block(f"score = {_nested('tanh', 10_000)}\n    mask = {'(' * 40}causal{')' * 40}", "c")
        + block(f"score = {_nested('sum', 40)}", "d")
        + block(f"scale = {_nested('parens', 33).replace('s', '0.5')}", "e")
    )
    diagnostics = diagnose("x.attn", text)
    assert [(d.span.line, d.message) for d in diagnostics] == [
        (4, DEEP),
        (9, DEEP),
        (14, DEEP),
        (15, DEEP),
        (20, DEEP),
        (25, DEEP),
    ]


@pytest.mark.parametrize(
    "score",
    [
        _nested("parens", 32),
        _nested("minus", 32),
        _nested("tanh", 32),
        _nested("sum", 32),  # 32 operators grouping left to right
        "-" * 16 + "(" * 16 + "s" + ")" * 16,
        "-" + _balanced(128),  # 255 nodes of the tree, plus the negation
    ],
)
def test_expressions_at_the_limits_are_accepted(score):
    accepted(f"score = {score}")


@pytest.mark.parametrize(
    "score, message",
    [
        (_nested("parens", 33), DEEP),
        (_nested("minus", 33), DEEP),
        (_nested("tanh", 33), DEEP),
        (_nested("sum", 33), DEEP),
        ("-" * 16 + "(" * 17 + "s" + ")" * 17, DEEP),
        ("- -" + _balanced(128), LARGE),
    ],
)
def test_expressions_just_past_the_limits_are_rejected(score, message):
    got, _ = rejected(f"score = {score}")
    assert got == message


def test_the_sum_limit_points_at_the_operator_that_crosses_it():
    # s + s + ... groups to the left: the outermost `+` is the last one, and
    # the 33rd level from the top is the 33rd `+` from the right.
    _, rendered = rejected(f"score = {_nested('sum', 40)}")
    header = rendered.splitlines()[0]
    column = 13 + 4 * (40 - 33) + 2
    assert header.startswith(f"x.attn:4:{column}: error: {DEEP}")


def test_check_refuses_deep_trees_built_by_hand():
    # `parse` never makes these; `check` must not recurse into them either.
    deep: ir.Expr = Name("s")
    for _ in range(100_000):
        deep = Unary(UnaryOp.NEG, deep)
    wide: ir.Expr = Name("causal")
    for _ in range(9):  # 2^9 leaves, 2^10 - 1 nodes, 9 levels
        wide = ir.Binary(BinOp.AND, wide, wide)
    settings = (
        ir.Setting("head_dim", Num(64)),
        ir.Setting("dtype", Name("fp16")),
        ir.Setting("score", deep),
        ir.Setting("mask", wide),
    )
    spec = ir.SpecFile((ir.Block("v", settings),))
    limit = sys.getrecursionlimit()
    variants, diagnostics = check([spec])
    assert sys.getrecursionlimit() == limit
    assert variants == ()
    assert [d.message for d in diagnostics] == [DEEP, LARGE]


# --------------------------------------------------------------------------- #
# Reserved block names (issue 19, item 7)
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "name, why",
    [
        ("torch", "`torch` is a module that generated modules import"),
        ("triton", "`triton` is a module that generated modules import"),
        ("math", "`math` is a module that generated modules import"),
        ("os", "`os` is a module that generated modules import"),
        ("functools", "`functools` is a module that generated modules import"),
        ("sys", "`sys` is a module of Python's standard library"),
        ("json", "`json` is a module of Python's standard library"),
        ("SPEC", "`SPEC` is a name every generated module defines"),
        ("print", "`print` is a Python builtin"),
        ("Torch", "`torch` is a module that generated modules import"),
        ("Print", "`print` is a Python builtin"),
        ("spec", "`SPEC` is a name every generated module defines"),
        ("flashgen", "`flashgen` is flashgen's own package"),
        (
            "flashgen_generated",
            "`flashgen_generated` is the package that `flashgen.load` puts modules in",
        ),
    ],
)
def test_reserved_block_names(name, why):
    text = f"attention {name} {{ head_dim = 64; dtype = fp16 }}\n"
    diagnostics = diagnose("x.attn", text)
    assert [d.message for d in diagnostics] == [f"block name '{name}' is reserved: {why}"]
    rendered = render_all(diagnostics, {"x.attn": text})
    assert rendered.startswith("x.attn:1:11: error: ")
    assert f"block names become Python module names (`{name}.py`)" in rendered


def test_every_module_the_template_imports_is_reserved():
    imported = set()
    for line in "\n".join(p.read_text(encoding="utf-8") for p in MODULE_SOURCES).splitlines():
        if match := re.match(r"\s*(?:import|from)\s+([A-Za-z_]\w*)", line):
            imported.add(match.group(1))
    assert {"torch", "triton", "math", "os", "functools"} <= imported
    for module in imported:
        text = f"attention {module} {{ head_dim = 64; dtype = fp16 }}\n"
        assert any("is reserved" in d.message for d in diagnose("x.attn", text)), module


@pytest.mark.parametrize("name", ["gemma2_local", "custom", "full", "torch2", "my_math", "spec_v2"])
def test_ordinary_block_names_are_fine(name):
    text = f"attention {name} {{ head_dim = 64; dtype = fp16 }}\n"
    assert diagnose("x.attn", text) == []


def test_python_keywords_are_still_refused_as_keywords():
    text = "attention import { head_dim = 64; dtype = fp16 }\n"
    assert [d.message for d in diagnose("x.attn", text)] == [
        "block name 'import' is a Python keyword"
    ]


def test_limits_are_documented():
    doc = (Path(__file__).parent.parent / "docs" / "LANGUAGE.md").read_text(encoding="utf-8")
    section = doc[doc.index("## Limits") :]
    for number in (
        "16777216",  # MAX_SEQ_LEN
        "65536",  # MAX_HEADS
        "2^30",
        str(LARGEST_WINDOW),
        str(LARGEST_PREFIX),
        "32 levels",
        "256",
        "1 MiB",
        "3.4028234663852886e38",
        "2^-126",
    ):
        assert number in section, number
    assert math.isclose(FLOAT32_MAX / LOG2E, 2.3586574916681825e38)
