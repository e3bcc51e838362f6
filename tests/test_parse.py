"""parse(): `.attn` text -> ir.SpecFile, or None plus syntax Diagnostics."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashgen import ir
from flashgen.ir import BinOp, Call, Name, Num, Unary, UnaryOp
from flashgen.parse import parse

EXAMPLES = """\
# line comments; a statement ends at a newline or ';'
attention gemma2_local {
    head_dim = 256                   # 16..256, any multiple of 8
    dtype    = bf16                  # fp16 | bf16 | fp32
    mask     = causal & window(4095)
    score    = softcap(s, 50.0)
    rescale_threshold = 8.0          # optional, log2 units; default 0
}
attention bloom_alibi  { head_dim = 128; dtype = fp16; mask = causal; score = s + alibi }
attention prefix_lm    { head_dim = 64;  dtype = bf16; mask = causal | prefix(256) }
attention llama4_local { head_dim = 128; dtype = bf16; mask = causal & chunk(8192) }
attention encoder_band { head_dim = 64;  dtype = fp16; mask = window(128, 128); align = top_left }
attention custom       { head_dim = 80;  dtype = fp32; scale = 0.1; mask = causal & (q - k) % 2 == 0; score = s - 0.05 * abs(q - k) }
"""


def parse_ok(text: str) -> ir.SpecFile:
    spec, diagnostics = parse(text, "t.attn")
    assert diagnostics == [], diagnostics
    assert spec is not None
    return spec


def expr(source: str) -> ir.Expr:
    """The parsed value of `x = source` in a one-setting block."""
    (block,) = parse_ok(f"attention t {{ x = {source} }}").blocks
    (setting,) = block.settings
    return setting.value


def errors(text: str) -> list[str]:
    spec, diagnostics = parse(text, "t.attn")
    assert spec is None
    assert diagnostics
    return [d.message for d in diagnostics]


def b(op: BinOp, left: ir.Expr, right: ir.Expr) -> ir.Binary:
    return ir.Binary(op, left, right)


q, k, s = Name("q"), Name("k"), Name("s")


# --------------------------------------------------------------------------- #
# Structure
# --------------------------------------------------------------------------- #


def test_examples_parse():
    spec = parse_ok(EXAMPLES)
    assert spec.path == "t.attn"
    assert [blk.name for blk in spec.blocks] == [
        "gemma2_local",
        "bloom_alibi",
        "prefix_lm",
        "llama4_local",
        "encoder_band",
        "custom",
    ]
    gemma = spec.blocks[0]
    assert [st.key for st in gemma.settings] == [
        "head_dim",
        "dtype",
        "mask",
        "score",
        "rescale_threshold",
    ]
    assert gemma.settings[2].value == b(BinOp.AND, Name("causal"), Call("window", (Num(4095),)))
    assert gemma.settings[3].value == Call("softcap", (s, Num(50.0)))


def test_empty_and_blank_files():
    assert parse_ok("").blocks == ()
    assert parse_ok("\n\n  # only a comment\n\n").blocks == ()


@pytest.mark.parametrize(
    "text",
    [
        "attention a {}",
        "attention a { }",
        "attention a {\n}",
        "attention a\n{\n}\n",
        "attention a { x = 1; }",
        "attention a { ; x = 1;; y = 2 }",
        "attention a {\n\n  x = 1  # c\n\n  # c\n  y = 2\n}\n",
        "attention a { x = 1 }attention b { x = 2 }",
        "attention a {\r\n  x = 1\r\n}\r\n",
        "\tattention a {\tx\t=\t1\t}",
    ],
)
def test_layout_is_free(text):
    spec = parse_ok(text)
    assert spec.blocks[0].name == "a"


def test_statements_keep_order_and_duplicates():
    (block,) = parse_ok("attention a { x = 1; x = 2\n y = 3 }").blocks
    assert [(st.key, st.value) for st in block.settings] == [
        ("x", Num(1)),
        ("x", Num(2)),
        ("y", Num(3)),
    ]


# --------------------------------------------------------------------------- #
# Expressions
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "source, value",
    [
        ("8", 8),
        ("007", 7),
        ("8.0", 8.0),
        ("8.", 8.0),
        (".5", 0.5),
        ("1e-5", 1e-5),
        ("1e-05", 1e-05),
        ("2.5e3", 2500.0),
        ("1E+16", 1e16),
        ("50.0", 50.0),
        ("0.1", 0.1),
    ],
)
def test_number_literals(source, value):
    e = expr(source)
    assert isinstance(e, Num)
    assert e.value == value
    assert type(e.value) is type(value)


def test_negative_literal_is_negation():
    assert expr("-3") == Unary(UnaryOp.NEG, Num(3))
    assert expr("--3") == Unary(UnaryOp.NEG, Unary(UnaryOp.NEG, Num(3)))


@pytest.mark.parametrize(
    "source, tree",
    [
        ("q - k - 1", b(BinOp.SUB, b(BinOp.SUB, q, k), Num(1))),
        ("q - (k - 1)", b(BinOp.SUB, q, b(BinOp.SUB, k, Num(1)))),
        ("q + k * 2", b(BinOp.ADD, q, b(BinOp.MUL, k, Num(2)))),
        ("q div 2 % 3", b(BinOp.MOD, b(BinOp.FLOORDIV, q, Num(2)), Num(3))),
        ("s / 2 * 3", b(BinOp.MUL, b(BinOp.DIV, s, Num(2)), Num(3))),
        ("-q * k", b(BinOp.MUL, Unary(UnaryOp.NEG, q), k)),
        ("q < k + 1", b(BinOp.LT, q, b(BinOp.ADD, k, Num(1)))),
        (
            "!q < k & causal",
            b(BinOp.AND, Unary(UnaryOp.NOT, b(BinOp.LT, q, k)), Name("causal")),
        ),
        (
            "a | b & c | d",
            b(
                BinOp.OR,
                b(BinOp.OR, Name("a"), b(BinOp.AND, Name("b"), Name("c"))),
                Name("d"),
            ),
        ),
        ("!!a", Unary(UnaryOp.NOT, Unary(UnaryOp.NOT, Name("a")))),
        ("f()", Call("f", ())),
        ("max(q, k + 1)", Call("max", (q, b(BinOp.ADD, k, Num(1))))),
        ("(q) == (k)", b(BinOp.EQ, q, k)),
    ],
)
def test_precedence_and_associativity(source, tree):
    assert expr(source) == tree


@pytest.mark.parametrize("op", ["==", "!=", "<", "<=", ">", ">="])
def test_every_comparison(op):
    assert expr(f"q {op} k") == b(BinOp(op), q, k)


def test_div_is_a_keyword():
    assert expr("q div k") == b(BinOp.FLOORDIV, q, k)
    assert expr("divisor") == Name("divisor")
    assert errors("attention div { }") == [
        "expected a block name after 'attention', found keyword 'div'"
    ]


# --------------------------------------------------------------------------- #
# Spans
# --------------------------------------------------------------------------- #


def test_spans():
    text = "attention a {\n    mask = causal & (q - k) % 2 == 0\n}\n"
    (block,) = parse_ok(text).blocks
    assert block.span == ir.Span(1, 1, 3, 2)
    assert block.name_span == ir.Span(1, 11, 1, 12)
    (setting,) = block.settings
    assert setting.key_span == ir.Span(2, 5, 2, 9)
    assert setting.span == ir.Span(2, 5, 2, 37)
    mask = setting.value
    assert mask.span == ir.Span(2, 12, 2, 37)
    assert mask.left.span == ir.Span(2, 12, 2, 18)
    comparison = mask.right
    modulo = comparison.left
    # Parentheses are part of the span of what they enclose.
    assert modulo.left.span == ir.Span(2, 21, 2, 28)
    assert modulo.span == ir.Span(2, 21, 2, 32)


def test_spans_do_not_affect_equality():
    assert expr("q  -  k") == expr("(q - k)")


# --------------------------------------------------------------------------- #
# Syntax errors
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "text, message",
    [
        ("attention a { x = }", "expected an expression, found '}'"),
        ("attention a { x = 1 + }", "expected an expression, found '}'"),
        (
            "attention a {\n x = 1 +\n}",
            "expected an expression, found the end of the line",
        ),
        ("attention a { x = f(1,) }", "expected an expression, found ')'"),
        ("attention a { x = f(, 1) }", "expected an expression or ')', found ','"),
        (
            "attention a { x = 1 2 }",
            "expected an operator or the end of the statement, found integer 2",
        ),
        (
            "attention a { x = f(1 2) }",
            "expected an operator, ',' or ')', found integer 2",
        ),
        (
            "attention a {\n x = (1 + 2\n}",
            "expected ')' to close the '(' at line 2, column 6, found the end of the line",
        ),
        ("attention a { x = q) }", "unmatched ')'"),
        ("attention a { x = q = k }", "unexpected '='; use '==' to compare"),
        (
            "attention a { x = q < k < 3 }",
            "comparisons do not chain: write `a < b & b < c` instead of `a < b < c`",
        ),
        (
            "attention a { x = q == k != 3 }",
            "comparisons do not chain: write `a < b & b < c` instead of `a < b < c`",
        ),
        ("attention a { x == 1 }", "expected '=' after the setting name, found '=='"),
        (
            "attention a { x 1 }",
            "expected '=' after the setting name, or ':' to declare an input, found integer 1",
        ),
        ("attention a { 1 = 1 }", "expected a setting name or '}', found integer 1"),
        (
            "attention a { x = 1 y = 2 }",
            "expected an operator or the end of the statement, found name 'y'",
        ),
        ("attention { }", "expected a block name after 'attention', found '{'"),
        ("attention a b { }", "expected '{' after the block name, found name 'b'"),
        ("attention a", "expected '{' after the block name, found the end of the file"),
        ("block a { }", "expected 'attention' to start a block, found name 'block'"),
        ("attention a { } }", "expected 'attention' to start a block, found '}'"),
        ("attention a { x = 'fp16' }", "unexpected character '\\''"),
        ('attention a { x = "fp16" }', "unexpected character '\"'"),
        ("attention a { x = s.real }", "unexpected character '.'"),
        ("attention a { x = [0] }", "expected an expression, found '['"),
        (
            "attention a { x = d[0 }",
            "expected ']' to close the '[' at line 1, column 20, found '}'",
        ),
        ("attention a { x = d[0]] }", "unmatched ']'"),
        ("attention a { x = 2 ** 3 }", "expected an expression, found '*'"),
        ("attention a { x = λ }", "unexpected character 'λ'; expected an expression"),
        (
            "attention a { x: 1 }",
            "expected an element type such as int32 or fp32 (after 'learnable' if it is one), "
            "found integer 1",
        ),
        ("attention a { x: int32 B }", "expected '[' and the input's sizes, found name 'B'"),
        (
            "attention a { x = 1 } $",
            "unexpected character '$'; expected 'attention' to start a block",
        ),
    ],
)
def test_syntax_error_messages(text, message):
    assert errors(text)[0] == message


def test_error_positions():
    _, diagnostics = parse("attention a {\n  x = 1 +\n  y = 'z'\n}\n", "p.attn")
    assert [(d.path, d.span) for d in diagnostics] == [
        ("p.attn", ir.Span(2, 10, 2, 10)),  # at the end of the line
        ("p.attn", ir.Span(3, 7, 3, 8)),  # the quote character
    ]


def test_one_error_per_broken_statement():
    text = "attention a {\n x = 1 +\n y = 1 2 3 4\n z = ( ( (\n w = 1\n}\n"
    assert len(errors(text)) == 3


def test_errors_in_later_blocks_are_found():
    text = "attention a { x = ) }\nattention b { y = 1 1 }\nattention c { z = 3 }\n"
    assert len(errors(text)) == 2


def test_top_level_error_skips_to_next_block():
    text = "atention a {\n  x = 1\n}\nattention b { y = 1 +}\n"
    assert errors(text) == [
        "expected 'attention' to start a block, found name 'atention'",
        "expected an expression, found '}'",
    ]


def test_unterminated_block_at_end_of_file():
    spec, diagnostics = parse("attention a {\n  x = 1\n", "u.attn")
    assert spec is None
    (d,) = diagnostics
    assert d.message == "unterminated block 'a': expected '}' before the end of the file"
    assert d.span == ir.Span(1, 1, 1, 12)
    assert d.note == "the block starts at line 1; the file ends at line 2 without its '}'"


def test_unterminated_block_with_incomplete_last_statement():
    assert errors("attention a {\n  x = 1 +") == [
        "expected an expression, found the end of the file",
        "unterminated block 'a': expected '}' before the end of the file",
    ]


def test_missing_brace_before_next_block():
    text = "attention a {\n  x = 1\nattention b {\n  y = 1 +\n}\n"
    assert errors(text) == [
        "expected '}' to close the block 'a' started at line 1, found keyword 'attention'",
        "expected an expression, found the end of the line",
    ]


def test_huge_integer_literal_is_a_diagnostic():
    assert errors("attention a { x = " + "9" * 5000 + " }") == ["integer literal is too large"]


# --------------------------------------------------------------------------- #
# Robustness: no input makes parse raise
# --------------------------------------------------------------------------- #

_PIECES = [
    "attention",
    "a",
    "div",
    "{",
    "}",
    "(",
    ")",
    "=",
    "==",
    "!=",
    "<",
    "<=",
    "\n",
    ";",
    ",",
    "q",
    "s",
    "1",
    "2.5",
    ".5",
    "1e",
    "-",
    "+",
    "*",
    "/",
    "%",
    "&",
    "|",
    "!",
    "'",
    ".",
    "#x\n",
    " ",
    "\t",
    "window",
    "λ",
    "\\",
    "\x00",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=40))
def test_token_soup_never_raises(pieces):
    text = " ".join(pieces)
    spec, diagnostics = parse(text)
    assert (spec is None) == bool(diagnostics)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_any_text_never_raises(text):
    spec, diagnostics = parse(text)
    assert (spec is None) == bool(diagnostics)
    for d in diagnostics:
        assert d.span.line >= 1 and d.span.column >= 1


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, len(EXAMPLES)),
    st.integers(0, 5),
    st.sampled_from(list("{}()=;\n,.'q-+*&|!# ")),
)
def test_edited_examples_never_raise(position, length, insert):
    text = EXAMPLES[:position] + insert + EXAMPLES[position + length :]
    spec, diagnostics = parse(text)
    assert (spec is None) == bool(diagnostics)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=40))
def test_replayed_reductions_agree_with_lark(pieces):
    # parse decides whether a token fits by replaying LALR reductions on the
    # state numbers (`_Recovering._accepts`); lark's own `accepts` copies the
    # whole parser to find out.  They must agree at every step.
    from flashgen import parse as parse_module

    class Checked(parse_module._Recovering):
        def _feed(self, token):
            assert self._accepts() == self.ip.accepts()
            super()._feed(token)

    Checked(" ".join(pieces), "t.attn").run()


def test_deep_nesting_does_not_slow_each_token():
    # Feeding used to copy the parser state (proportional to the nesting) for
    # every token: 10^5 nested parentheses took minutes.
    import time

    start = time.monotonic()
    spec, diagnostics = parse("attention t { x = " + "(" * 100_000 + "q" + ")" * 100_000 + " }")
    assert spec is None and len(diagnostics) == 1
    assert time.monotonic() - start < 20
