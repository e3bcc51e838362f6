"""check(): parsed SpecFiles -> checked Variants and semantic Diagnostics."""

from __future__ import annotations

import pytest

from flashgen import ir
from flashgen.check import check
from flashgen.ir import BinOp, Call, Name, Num, Unary, UnaryOp
from flashgen.parse import parse
from test_parse import EXAMPLES

q, k, s = Name("q"), Name("k"), Name("s")


def b(op: BinOp, left: ir.Expr, right: ir.Expr) -> ir.Binary:
    return ir.Binary(op, left, right)


def spec(text: str, path: str = "c.attn") -> ir.SpecFile:
    parsed, diagnostics = parse(text, path)
    assert diagnostics == [], diagnostics
    return parsed


def variant(body: str) -> ir.Variant:
    """The Variant of one block with settings `body` (head_dim/dtype added if absent)."""
    if "head_dim" not in body:
        body = "head_dim = 64; " + body
    if "dtype" not in body:
        body = "dtype = fp16; " + body
    variants, diagnostics = check([spec(f"attention v {{ {body} }}")])
    assert diagnostics == [], [d.message for d in diagnostics]
    (v,) = variants
    return v


def messages(body: str) -> list[str]:
    variants, diagnostics = check([spec(f"attention v {{ {body} }}")])
    assert variants == ()
    assert diagnostics
    return [d.message for d in diagnostics]


def one_error(body: str) -> str:
    """The only message for a block that has head_dim and dtype plus `body`."""
    (message,) = messages("head_dim = 64; dtype = fp16; " + body)
    return message


# --------------------------------------------------------------------------- #
# Whole variants
# --------------------------------------------------------------------------- #


def test_examples_check():
    variants, diagnostics = check([spec(EXAMPLES)])
    assert diagnostics == []
    gemma, bloom, prefix_lm, llama4, band, custom = variants
    assert gemma == ir.Variant(
        name="gemma2_local",
        head_dim=256,
        dtype=ir.DType.BF16,
        mask=b(BinOp.AND, Name("causal"), Call("window", (Num(4095),))),
        score=Call("softcap", (s, Num(50.0))),
        rescale_threshold=8.0,
    )
    assert gemma.path == "c.attn"
    assert gemma.span.line == 2
    assert bloom.score == b(BinOp.ADD, s, Name("alibi"))
    assert bloom.mask == Name("causal")
    assert prefix_lm.mask == b(BinOp.OR, Name("causal"), Call("prefix", (Num(256),)))
    assert llama4.mask == b(BinOp.AND, Name("causal"), Call("chunk", (Num(8192),)))
    assert band.mask == Call("window", (Num(128), Num(128)))
    assert band.align is ir.Align.TOP_LEFT
    assert custom.scale == 0.1
    assert custom.dtype is ir.DType.FP32
    assert custom.head_dim == 80


def test_defaults():
    v = variant("")
    assert v.mask == ir.FULL
    assert v.score == ir.IDENTITY_SCORE
    assert v.scale is None
    assert v.align is ir.Align.BOTTOM_RIGHT
    assert v.rescale_threshold == 0.0
    assert isinstance(v.rescale_threshold, float)


def test_types_of_settings():
    v = variant("head_dim = 128; scale = 2; rescale_threshold = 8")
    assert v.head_dim == 128 and type(v.head_dim) is int
    assert v.scale == 2.0 and type(v.scale) is float
    assert v.rescale_threshold == 8.0 and type(v.rescale_threshold) is float


def test_constant_settings_are_folded():
    assert variant("scale = 1.0 / 8.0").scale == 0.125
    assert variant("head_dim = 64 * 2").head_dim == 128
    assert variant("rescale_threshold = 16 div 2").rescale_threshold == 8.0


def test_spans_survive_checking():
    v = variant("mask = causal & window(4 * 32)")
    folded = v.mask.right.args[0]
    assert folded == Num(128)
    assert folded.span.column > 0  # the span of `4 * 32`
    assert v.mask.left.span.column > 0


# --------------------------------------------------------------------------- #
# Folding inside expressions
# --------------------------------------------------------------------------- #


def test_named_mask_arguments_are_folded():
    v = variant("mask = window(2 * 64, 128 - 1) & prefix(-(-3)) & chunk(max(4, 8))")
    assert v.mask == b(
        BinOp.AND,
        b(BinOp.AND, Call("window", (Num(128), Num(127))), Call("prefix", (Num(3),))),
        Call("chunk", (Num(8),)),
    )
    assert isinstance(v.mask.right.args[0].value, int)


def test_divisors_are_folded():
    v = variant("mask = q div (3 + 4) == k % (2 * 2)")
    assert v.mask == b(BinOp.EQ, b(BinOp.FLOORDIV, q, Num(7)), b(BinOp.MOD, k, Num(4)))


def test_softcap_cap_is_folded_to_a_real():
    v = variant("score = softcap(s, 50)")
    assert v.score == Call("softcap", (s, Num(50.0)))
    assert type(v.score.args[1].value) is float
    assert variant("score = softcap(s * 2.0, 100 / 2)").score.args[1] == Num(50.0)


def test_other_expressions_are_kept_as_written():
    v = variant("mask = causal & q - k + 1 >= 0; score = s - 0.05 * abs(q - k) + -1")
    assert v.mask == b(
        BinOp.AND,
        Name("causal"),
        b(BinOp.GE, b(BinOp.ADD, b(BinOp.SUB, q, k), Num(1)), Num(0)),
    )
    assert v.score.right == Unary(UnaryOp.NEG, Num(1))


@pytest.mark.parametrize(
    "mask",
    [
        "full",
        "!causal",
        "causal | full",
        "window(0)",
        "window(0, 0)",
        "prefix(0)",
        "chunk(1)",
        "h % 2 == 0",
        "q div 7 == k div 7",
        "abs(q - k) < 20",
        "max(q, k) > 10 & min(q, H) >= 0",
        "-q < k",
        "(q - k) % 3 == 0 | !(k <= q + 5)",
    ],
)
def test_valid_masks(mask):
    variant(f"mask = {mask}")


@pytest.mark.parametrize(
    "score",
    [
        "s",
        "1",
        "q - k",
        "s + alibi",
        "tanh(s) * exp(-abs(s)) + log(1.0 + abs(s)) + sqrt(abs(s))",
        "min(s, 3.0) + max(s, -2.0)",
        "s / (1.0 + 0.001 * abs(q - k))",
        "s + 0.1 * h + (q div 2) % 5",
        "softcap(softcap(s, 10.0), 5)",
    ],
)
def test_valid_scores(score):
    variant(f"score = {score}")


# --------------------------------------------------------------------------- #
# Settings
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "value, message",
    [
        ("8", "`head_dim` must be a multiple of 8 between 16 and 576, got 8"),
        ("584", "`head_dim` must be a multiple of 8 between 16 and 576, got 584"),
        ("60", "`head_dim` must be a multiple of 8 between 16 and 576, got 60"),
        ("64.0", "`head_dim` must be an integer constant, got 64.0"),
        ("q", "`head_dim` must be an integer constant; `q` is not a constant"),
    ],
)
def test_head_dim_rules(value, message):
    (m,) = messages(f"head_dim = {value}; dtype = fp16")
    assert m == message


@pytest.mark.parametrize("head_dim", range(16, 257, 8))
def test_every_valid_head_dim(head_dim):
    assert variant(f"head_dim = {head_dim}").head_dim == head_dim


@pytest.mark.parametrize(
    "value, message",
    [
        ("fp8", "unknown dtype 'fp8'"),
        ("bfloat16", "unknown dtype 'bfloat16'; did you mean 'bf16'?"),
        ("fp61", "unknown dtype 'fp61'; did you mean 'fp16'?"),
        ("16", "`dtype` must be one of fp16, bf16, fp32, got `16`"),
    ],
)
def test_dtype_rules(value, message):
    (m,) = messages(f"head_dim = 64; dtype = {value}")
    assert m == message


def test_dtypes():
    for dtype in ir.DType:
        assert variant(f"dtype = {dtype.value}").dtype is dtype


@pytest.mark.parametrize(
    "setting, message",
    [
        ("scale = 0", "`scale` must be a positive constant, got 0"),
        ("scale = -0.5", "`scale` must be a positive constant, got -0.5"),
        ("scale = s", "`scale` must be a positive constant; `s` is not a constant"),
        ("scale = 1 / 0", "`scale` must be a positive constant; division by zero"),
        (
            "scale = 1e999",
            "`scale` must be a positive constant; the real literal is too large",
        ),
        (
            "scale = 1e300 * 1e300",
            "`scale` must be a positive constant; the value is not finite",
        ),
        (
            "rescale_threshold = -1",
            "`rescale_threshold` must be a constant between 0 and 15.0, got -1",
        ),
        (
            "rescale_threshold = 15.5",
            "`rescale_threshold` must be a constant between 0 and 15.0, got 15.5",
        ),
        ("align = middle", "unknown alignment 'middle'"),
        ("align = top_lft", "unknown alignment 'top_lft'; did you mean 'top_left'?"),
        ("align = 1", "`align` must be bottom_right or top_left, got `1`"),
        ("maks = full", "unknown setting 'maks'; did you mean 'mask'?"),
        ("colour = 3", "unknown setting 'colour'"),
        ("mask = causal; mask = full", "duplicate setting `mask`"),
    ],
)
def test_setting_rules(setting, message):
    assert one_error(setting) == message


def test_rescale_threshold_bounds_are_inclusive():
    assert variant("rescale_threshold = 0").rescale_threshold == 0.0
    assert variant("rescale_threshold = 15").rescale_threshold == ir.RESCALE_THRESHOLD_MAX


def test_duplicate_setting_points_at_the_second():
    (v,) = check([spec("attention v {\n head_dim = 64\n dtype = fp16\n head_dim = 64\n}")])[1]
    assert v.span.line == 4
    assert v.note == "first set at line 2, column 2"


def test_missing_required_settings_point_at_the_name():
    _, diagnostics = check([spec("attention nothing { }")])
    assert [d.message for d in diagnostics] == [
        "block 'nothing' is missing the required setting `head_dim`",
        "block 'nothing' is missing the required setting `dtype`",
    ]
    assert {d.span for d in diagnostics} == {ir.Span(1, 11, 1, 18)}


@pytest.mark.parametrize(
    "name, message",
    [
        (
            "_private",
            "block name '_private' must start with a letter and contain only letters, digits and '_'",
        ),
        ("class", "block name 'class' is a Python keyword"),
        ("None", "block name 'None' is a Python keyword"),
        ("a" * 65, "block name is 65 characters long; the limit is 64"),
    ],
)
def test_block_name_rules(name, message):
    _, diagnostics = check([spec(f"attention {name} {{ head_dim = 64; dtype = fp16 }}")])
    assert [d.message for d in diagnostics] == [message]


def test_block_name_of_64_characters_is_fine():
    variants, diagnostics = check([spec(f"attention {'a' * 64} {{ head_dim = 64; dtype = fp16 }}")])
    assert diagnostics == [] and len(variants) == 1


# --------------------------------------------------------------------------- #
# Across blocks and files
# --------------------------------------------------------------------------- #

GOOD = "head_dim = 64; dtype = fp16"


def test_duplicate_block_names_across_files():
    one = spec(f"attention same {{ {GOOD} }}", "one.attn")
    two = spec(f"attention other {{ {GOOD} }}\nattention same {{ {GOOD} }}", "two.attn")
    variants, diagnostics = check([one, two])
    (d,) = diagnostics
    assert d.path == "two.attn"
    assert d.message == "duplicate block name 'same'"
    assert d.span == ir.Span(2, 11, 2, 15)
    assert d.note == "first defined at one.attn:1:11"
    # Blocks that checked clean still come back; the duplicate does not.
    assert [v.name for v in variants] == ["same", "other"]


def test_block_names_differing_only_in_case_collide():
    _, diagnostics = check([spec(f"attention Causal {{ {GOOD} }}\nattention causal {{ {GOOD} }}")])
    (d,) = diagnostics
    assert d.message == "block name 'causal' differs from 'Causal' only in case"


def test_every_problem_is_listed_in_source_order():
    text = (
        "attention a {\n"
        "  head_dim = 7\n"
        "  dtype = fp7\n"
        "  mask = window(-1) & q < 1.5 & foo\n"
        "  score = bar(s) + causal\n"
        "}\n"
        "attention b { head_dim = 64 }\n"
        "attention c { head_dim = 64; dtype = fp16 }\n"
    )
    variants, diagnostics = check([spec(text)])
    assert [v.name for v in variants] == ["c"]
    assert [(d.span.line, d.message) for d in diagnostics] == [
        (2, "`head_dim` must be a multiple of 8 between 16 and 576, got 7"),
        (3, "unknown dtype 'fp7'"),
        (4, "window size must be non-negative, got -1"),
        (4, "the mask must be an integer/boolean expression; 1.5 is a real number"),
        (4, "unknown name 'foo'"),
        (5, "unknown function 'bar'"),
        (5, "the mask `causal` cannot be used in the score"),
        (7, "block 'b' is missing the required setting `dtype`"),
    ]


# --------------------------------------------------------------------------- #
# Mask and score expressions
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "mask, message",
    [
        (
            "s > 0",
            "the mask must be an integer/boolean expression; `s` is only defined in the score",
        ),
        (
            "alibi > 0",
            "the mask must be an integer/boolean expression; `alibi` is only defined in the score",
        ),
        (
            "q < 1.5",
            "the mask must be an integer/boolean expression; 1.5 is a real number",
        ),
        (
            "q / 2 == k",
            "the mask must be an integer/boolean expression; `/` gives a real number",
        ),
        (
            "tanh(q) > 0",
            "the mask must be an integer/boolean expression; `tanh` gives a real number",
        ),
        (
            "softcap(q, 2) > 0",
            "the mask must be an integer/boolean expression; `softcap` gives a real number",
        ),
        ("q - k", "the mask must be a boolean expression, got an integer expression"),
        ("casual", "unknown name 'casual'; did you mean 'causal'?"),
        ("foo", "unknown name 'foo'"),
        ("window", "`window` is a function; call it with arguments: window(...)"),
        ("windw(3)", "unknown function 'windw'; did you mean 'window'?"),
        ("causal(3)", "`causal` is not a function"),
        ("window(1, 2, 3)", "`window` takes 1 or 2 arguments, got 3"),
        ("window()", "`window` takes 1 or 2 arguments, got 0"),
        ("prefix(1, 2)", "`prefix` takes 1 argument, got 2"),
        ("max(q) > 0", "`max` takes 2 arguments, got 1"),
        ("window(-3)", "window size must be non-negative, got -3"),
        ("window(3, -1)", "window size must be non-negative, got -1"),
        ("prefix(-1)", "prefix length must be non-negative, got -1"),
        ("chunk(0)", "chunk size must be at least 1, got 0"),
        ("window(2.5)", "the arguments of `window` must be integer constants, got 2.5"),
        (
            "window(5 / 2)",
            "the arguments of `window` must be integer constants, got 2.5",
        ),
        (
            "window(q)",
            "the arguments of `window` must be integer constants; `q` is not a constant",
        ),
        (
            "chunk(2147483648)",
            "the arguments of `chunk` must be integer constants; the integer literal 2147483648 does not fit in 32 bits (|value| < 2^31)",
        ),
        (
            "window(2147483647 + 1)",
            "the arguments of `window` must be integer constants; 2147483648 does not fit in 32 bits",
        ),
        (
            "q < 2147483648",
            "the integer literal 2147483648 does not fit in 32 bits (|value| < 2^31)",
        ),
        (
            "q % 0 == 0",
            "the right operand of `%` must be a positive integer constant, got 0",
        ),
        (
            "q div -2 == 0",
            "the right operand of `div` must be a positive integer constant, got -2",
        ),
        (
            "q div k == 0",
            "the right operand of `div` must be a positive integer constant; `k` is not a constant",
        ),
        (
            "q % 1.5 == 0",
            "the right operand of `%` must be a positive integer constant, got 1.5",
        ),
        ("!q", "`!` needs a boolean, got an integer"),
        ("causal & 1", "`&` needs a boolean, got an integer"),
        ("-causal", "`-` needs a number, got a boolean"),
        ("causal == 1", "`==` needs a number, got a boolean"),
        ("abs(causal) > 0", "`abs` needs a number, got a boolean"),
    ],
)
def test_mask_errors(mask, message):
    assert one_error(f"mask = {mask}") == message


@pytest.mark.parametrize(
    "score, message",
    [
        ("causal", "the mask `causal` cannot be used in the score"),
        ("window(3)", "the mask `window` cannot be used in the score"),
        ("s < 3", "comparisons are only allowed in the mask"),
        ("!s", "`!` is only allowed in the mask"),
        ("s & s", "`&` combines masks and is not allowed in the score"),
        ("__import__(s)", "unknown function '__import__'"),
        ("eval(s)", "unknown function 'eval'"),
        ("sofcap(s, 3.0)", "unknown function 'sofcap'; did you mean 'softcap'?"),
        ("softcap(s)", "`softcap` takes 2 arguments, got 1"),
        (
            "softcap(s, 0.0)",
            "the cap of `softcap` must be a positive constant, got 0.0",
        ),
        (
            "softcap(s, s)",
            "the cap of `softcap` must be a positive constant; `s` is not a constant",
        ),
        ("tanh(s, s)", "`tanh` takes 1 argument, got 2"),
        ("s div 2", "`div` needs integer operands, got a real"),
        ("s / 0", "division by zero"),
        ("s / (1.0 - 1.0)", "division by zero"),
        ("s * 1e999", "the real literal is too large"),
        ("x", "unknown name 'x'"),
        ("ss", "unknown name 'ss'; did you mean 's'?"),
        ("alibi(2)", "`alibi` is not a function"),
    ],
)
def test_score_errors(score, message):
    assert one_error(f"score = {score}") == message


def test_errors_in_several_operands_are_all_reported():
    assert messages("head_dim = 64; dtype = fp16; score = foo + bar(s) * baz") == [
        "unknown name 'foo'",
        "unknown function 'bar'",
        "unknown name 'baz'",
    ]


# --------------------------------------------------------------------------- #
# Warnings: accepted blocks that may not mean what they say
# --------------------------------------------------------------------------- #

HIDING = [
    "!full",
    "causal & !causal",
    "k < 5 & k > 9",
    "q - k > 3 & q - k < 4 | !full",  # no integer between 3 and 4
    "causal & !(q - k < 8) & q - k < 8",
]
SHOWING = ["causal", "!causal", "k < 5 | k > 9", "causal & k > 9", "q - k > 3 & q - k < 5"]


def _checked(mask: str, inputs: str = "") -> tuple[tuple[ir.Variant, ...], list]:
    text = f"attention v {{\n    head_dim = 64\n    dtype = fp16\n{inputs}    mask = {mask}\n}}\n"
    return check([spec(text)])


@pytest.mark.parametrize("mask", HIDING)
def test_a_mask_that_hides_every_pair_is_kept_with_a_warning_at_it(mask):
    variants, diagnostics = _checked(mask)
    assert len(variants) == 1  # kept: its outputs are defined (all 0)
    (d,) = diagnostics
    assert d.severity == "warning" and "hides every (query, key) pair" in d.message
    assert (d.span.line, d.span.column) == (4, 12)  # the mask, after `mask = `
    assert d.span.end_column == 12 + len(mask)


def test_a_mask_with_reads_that_hides_every_pair_is_warned_too():
    variants, diagnostics = _checked("doc[b, q] == doc[b, k] & !full", "    doc: int32[B, Nk]\n")
    assert len(variants) == 1 and [d.severity for d in diagnostics] == ["warning"]
    variants, diagnostics = _checked("doc[b, q] == doc[b, k] & causal", "    doc: int32[B, Nk]\n")
    assert len(variants) == 1 and diagnostics == []


@pytest.mark.parametrize("mask", SHOWING)
def test_a_mask_that_shows_some_pair_gets_no_warning(mask):
    variants, diagnostics = _checked(mask)
    assert len(variants) == 1 and diagnostics == []


def test_a_warning_does_not_stop_the_cli_or_the_api(tmp_path, capsys):
    import warnings

    import flashgen
    from flashgen.cli import main

    text = "attention v {\n    head_dim = 64\n    dtype = fp16\n    mask = causal & !causal\n}\n"
    path = tmp_path / "v.attn"
    path.write_text(text)
    assert main(["check", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out == "ok: 1 attention block in 1 file\n"
    assert err.startswith(f"{path}:4:12: warning: this mask hides every (query, key) pair")
    assert "    mask = causal & !causal\n           ^^^^^^^^^^^^^^^^\n" in err
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sources = flashgen.build_sources(text)
    assert list(sources) == ["v"]
    (w,) = caught
    assert w.category is flashgen.SpecWarning and w.filename == __file__  # the caller's line
    assert w.message.diagnostic.severity == "warning"
    assert str(w.message).startswith("<string>:4:12: warning: this mask hides every")
