"""print -> parse -> check is the identity on checked Variants (and on expressions)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from hypothesis import given, settings

from flashgen import ir
from flashgen.check import check, reserved_block_name
from flashgen.ir import BinOp, Name, Num, Unary, UnaryOp
from flashgen.parse import parse
from flashgen.printer import print_expr, print_file, print_variant
from strategies import int_exprs, masks, scores, variants
from test_parse import EXAMPLES

EXAMPLE_FILES = sorted((Path(__file__).parent.parent / "examples").glob("*.attn"))


def reparse(text: str) -> tuple[ir.Variant, ...]:
    spec, diagnostics = parse(text, "printed.attn")
    assert diagnostics == [], (text, diagnostics)
    result, diagnostics = check([spec])
    # Warnings (a drawn mask that hides every pair) do not stop a round trip.
    assert all(d.severity == "warning" for d in diagnostics), (text, diagnostics)
    return result


def assert_round_trips(v: ir.Variant) -> None:
    text = print_variant(v)
    (again,) = reparse(text)
    assert again == v
    # Equality cannot tell Num(1) from Num(1.0); the printed text can.
    assert print_variant(again) == text


def test_examples_round_trip():
    variants, diagnostics = check([parse(EXAMPLES, "e.attn")[0]])
    assert diagnostics == []
    assert reparse(print_file(variants)) == variants
    for v in variants:
        assert_round_trips(v)


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.stem)
def test_example_files_round_trip(path):
    spec, diagnostics = parse(path.read_text(encoding="utf-8"), str(path))
    assert diagnostics == []
    variants, diagnostics = check([spec])
    assert diagnostics == []
    for v in variants:
        assert_round_trips(v)


def test_print_variant_normal_form():
    (v,) = reparse(
        "attention custom { head_dim = 80;  dtype = fp32; scale = 0.1\n"
        " mask = causal & ((q - k) % 2 == 0); score = (s - (0.05 * abs(q - k))) }"
    )
    assert print_variant(v) == (
        "attention custom {\n"
        "    head_dim = 80\n"
        "    dtype = fp32\n"
        "    scale = 0.1\n"
        "    mask = causal & (q - k) % 2 == 0\n"
        "    score = s - 0.05 * abs(q - k)\n"
        "    align = bottom_right\n"
        "    rescale_threshold = 0.0\n"
        "}\n"
    )


def test_print_file_separates_blocks():
    a = ir.Variant(name="a", head_dim=64, dtype=ir.DType.FP16)
    b = ir.Variant(name="b", head_dim=64, dtype=ir.DType.FP16, rescale_threshold=8.0)
    text = print_file([a, b])
    assert text == print_variant(a) + "\n" + print_variant(b)
    assert reparse(text) == (a, b)
    assert print_file([]) == ""


q, k, s = Name("q"), Name("k"), Name("s")


@pytest.mark.parametrize(
    "e, text",
    [
        (ir.Binary(BinOp.SUB, q, ir.Binary(BinOp.SUB, k, Num(1))), "q - (k - 1)"),
        (ir.Binary(BinOp.SUB, ir.Binary(BinOp.SUB, q, k), Num(1)), "q - k - 1"),
        (ir.Binary(BinOp.MUL, ir.Binary(BinOp.ADD, q, k), Num(2)), "(q + k) * 2"),
        (ir.Binary(BinOp.LT, ir.Binary(BinOp.LT, q, k), Num(1)), "(q < k) < 1"),
        (Unary(UnaryOp.NOT, ir.Binary(BinOp.LT, q, k)), "!q < k"),
        (Unary(UnaryOp.NOT, ir.Binary(BinOp.AND, q, k)), "!(q & k)"),
        (Unary(UnaryOp.NEG, ir.Binary(BinOp.MUL, q, k)), "-(q * k)"),
        (ir.Binary(BinOp.MUL, Unary(UnaryOp.NEG, q), k), "-q * k"),
        (Unary(UnaryOp.NEG, Unary(UnaryOp.NEG, Num(2.5))), "--2.5"),
        (ir.Binary(BinOp.FLOORDIV, q, Num(7)), "q div 7"),
        (Num(1e-05), "1e-05"),
        (Num(1e16), "1e+16"),
        (Num(50.0), "50.0"),
        (Num(-3), "-3"),
        (ir.Binary(BinOp.SUB, q, Num(-3)), "q - -3"),
        (ir.Call("max", (s, Unary(UnaryOp.NEG, Num(2.0)))), "max(s, -2.0)"),
        (ir.Call("f", ()), "f()"),
    ],
)
def test_print_expr_minimal_parentheses(e, text):
    assert print_expr(e) == text


def test_print_expr_prints_infinity_as_a_literal_that_reads_back():
    # `parse` reads `1e999` as infinity; `check` reports it, and its messages
    # print the tree (`dtype = 1e999` used to raise here).
    assert print_expr(Num(math.inf)) == "1e999"
    assert print_expr(ir.Binary(BinOp.MUL, s, Num(math.inf))) == "s * 1e999"
    assert print_expr(Num(-math.inf)) == "-1e999"
    _expr_round_trips(ir.Binary(BinOp.MUL, s, Num(math.inf)))
    _expr_round_trips(Unary(UnaryOp.NEG, Num(math.inf)))


def test_print_expr_rejects_nan():
    # No literal reads as NaN, so `parse` never makes one.
    with pytest.raises(ValueError):
        print_expr(Num(math.nan))


def _expr_round_trips(e: ir.Expr) -> None:
    text = print_expr(e)
    spec, diagnostics = parse(f"attention t {{ x = {text} }}")
    assert diagnostics == [], text
    again = spec.blocks[0].settings[0].value
    assert again == e
    assert print_expr(again) == text


@settings(max_examples=100, deadline=None)
@given(
    variants(dtypes=tuple(ir.DType), head_dims=(16, 64, 128, 256)).filter(
        # The strategy may draw a name that `check` reserves, such as `os`.
        lambda v: reserved_block_name(v.name)
        is None
    )
)
def test_variants_round_trip(v):
    assert_round_trips(v)


@settings(max_examples=100, deadline=None)
@given(masks())
def test_masks_round_trip_as_expressions(mask):
    _expr_round_trips(mask)


@settings(max_examples=100, deadline=None)
@given(scores())
def test_scores_round_trip_as_expressions(score):
    _expr_round_trips(score)


@settings(max_examples=100, deadline=None)
@given(int_exprs(depth=3))
def test_integer_expressions_round_trip(e):
    _expr_round_trips(e)


# --------------------------------------------------------------------------- #
# The strategies' own promises (other test modules rely on them)
# --------------------------------------------------------------------------- #


def _evaluate(e: ir.Expr, env: dict[str, float]) -> float:
    """Plain-Python value of a checked expression; alibi is bounded by 0.5 |q - k|."""
    match e:
        case Num(value=value):
            return value
        case Name(id=name):
            return env[name]
        case Unary(op=op, operand=operand):
            value = _evaluate(operand, env)
            return -value if op is UnaryOp.NEG else not value
        case ir.Binary(op=op, left=left, right=right):
            a, b = _evaluate(left, env), _evaluate(right, env)
            return {
                BinOp.ADD: lambda: a + b,
                BinOp.SUB: lambda: a - b,
                BinOp.MUL: lambda: a * b,
                BinOp.DIV: lambda: a / b,
                BinOp.FLOORDIV: lambda: a // b,
                BinOp.MOD: lambda: a % b,
            }.get(op, lambda: True)()
        case ir.Call(fn=fn, args=args):
            values = [_evaluate(a, env) for a in args]
            if fn == "softcap":
                return values[1] * math.tanh(values[0] / values[1])
            functions = {
                "tanh": math.tanh,
                "exp": math.exp,
                "log": math.log,
                "sqrt": math.sqrt,
                "abs": abs,
                "min": min,
                "max": max,
            }
            return functions[fn](*values) if fn in functions else True
    raise TypeError(e)


@settings(max_examples=100, deadline=None)
@given(scores(), masks())
def test_drawn_expressions_stay_moderate(score, mask):
    rng = random.Random(0)
    for _ in range(20):
        q_, k_ = rng.randint(-400, 400), rng.randint(-400, 400)
        big_h = rng.randint(1, 4)
        env = {
            "s": rng.uniform(-50, 50),
            "q": q_,
            "k": k_,
            "h": rng.randrange(big_h),
            "H": big_h,
            "alibi": -0.5 * abs(q_ - k_),
            "causal": True,
            "full": True,
        }
        value = _evaluate(score, env)
        assert abs(value) <= 500, (print_expr(score), env, value)
        _evaluate(mask, env)  # integer arithmetic only: must not raise
