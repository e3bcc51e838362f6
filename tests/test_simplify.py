"""Score algebra (flashgen/simplify.py): what it rewrites, what it leaves, and
that the rewritten score is the score as written, value and slope, within
float64 rounding (the float64 reference keeps the spec as written)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flashgen import element_code, ir, lower
from flashgen import kernel_expr as kx
from flashgen.emit import render_module
from flashgen.printer import print_expr
from flashgen.reference import score_slope, scores
from flashgen.simplify import simplify
from kernel_utils import make_variant
from strategies import scores as score_exprs

S = ir.Name("s")


def _score(text: str, dtype: ir.DType = ir.DType.FP32) -> ir.Expr:
    return make_variant("causal", score=text, dtype=dtype).score


def _simplified(text: str) -> str:
    return print_expr(simplify(_score(text)))


SOFTCAP_SPELLINGS = [
    "softcap(s, 30.0)",
    "30.0 * tanh(s / 30.0)",
    "tanh(s / 30.0) * 30.0",
    "30.0 * tanh(s * (1.0 / 30.0))",
    "tanh(s * (1.0 / 30.0)) * 30.0",
    "-30.0 * tanh(-s / 30.0)",
    "-(30.0 * tanh(s / -30.0))",
    "30.0 * (tanh(s / 30.0) * 1.0)",
    "tanh(0.5 * (s / 15.0)) / (1.0 / 30.0)",
    "2.0 * (15.0 * tanh(s / 30.0))",
]


@pytest.mark.parametrize("spelling", SOFTCAP_SPELLINGS)
@pytest.mark.parametrize("around", ["{}", "{} - 0.1 * abs(q - k)", "alibi + {}", "0.5 + {} - h"])
def test_every_softcap_spelling_is_a_softcap(spelling, around):
    """c * tanh(s / c) however written, alone or among other terms, is
    `softcap(s, c)`, the form with the kernels' tuned path."""
    got = simplify(_score(around.format(spelling)))
    calls = [e for e in _walk(got) if isinstance(e, ir.Call)]
    assert ir.Call(ir.SOFTCAP, (S, ir.Num(30.0))) in calls, print_expr(got)
    assert not any(c.fn == "tanh" for c in calls), print_expr(got)


@pytest.mark.parametrize("spelling", SOFTCAP_SPELLINGS)
def test_a_softcap_spelling_alone_reads_tanh_back_in_the_backward(spelling):
    """The softcap path whole: log2(e) folded into the cap in the forward
    (`43.28... * _tanh(s * 0.0333...)`) and the derivative read back from the
    score, with no second tanh."""
    model = lower.lower(make_variant("causal", score=spelling, dtype=ir.DType.BF16))
    assert model.score_log2_code == "43.2808512266689 * _tanh(s * 0.03333333333333333)"
    assert "s2" in model.score_grad_code and not model.score_grad_uses_s
    assert "_tanh" not in model.score_grad_code and not model.tanh_small_poly


def test_softcap_among_terms_computes_tanh_once_per_function():
    """With other terms the derivative is 1 - t^2 of the same tanh (one call,
    shared), and the forward folds log2(e) into every term."""
    model = lower.lower(
        make_variant(
            "causal", score="tanh(s / 30.0) * 30.0 - 0.1 * abs(q - k)", dtype=ir.DType.BF16
        )
    )
    assert model.score_log2_code == (
        "43.2808512266689 * _tanh(s * 0.03333333333333333)"
        " - 0.14426950408889636 * ((q_pos - k_pos)).to(tl.float32)"
    )
    assert model.score_grad_lines == ("tanh0 = _tanh(s * 0.03333333333333333)",)
    assert model.score_grad_code == "1.0 - (tanh0 * tanh0)"


@pytest.mark.parametrize(
    "score",
    [
        "30.0 * tanh(s / 29.0)",  # k * m = 30 / 29
        "3.0 * tanh(s * 0.333)",  # a rounded 1/3: not 1 within float64 rounding
        "tanh(s) * 3.0",
        "30.0 * tanh(s / 30.0 + 1.0)",  # a sum inside: no constant factor to read
    ],
)
def test_near_softcaps_are_not_softcaps(score):
    assert "softcap" not in _simplified(score)


@pytest.mark.parametrize(
    "score, expected",
    [
        ("s * 1.0", "s"),
        ("1.0 * s", "s"),
        ("s / 1.0", "s"),
        ("s + 0.0", "s"),
        ("0.0 + s", "s"),
        ("s - 0.0", "s"),
        ("-(-s)", "s"),
        ("--s", "s"),
        ("2.0 + 3.0 * 4.0", "14.0"),
        ("s * (2.0 - 1.5)", "s * 0.5"),
        ("0.5 * (0.2 * s)", "s * 0.1"),
        ("-(2.0 * s)", "s * -2.0"),
        ("s / 4.0", "s * 0.25"),
        ("(s + 2.0) - 3.0", "s - 1.0"),
        ("1.0 - s * s", "1.0 - s * s"),
        ("exp(s / 2.0) * 1.0 + 0.0", "exp(s * 0.5)"),
        ("s / (2.0 * sqrt(abs(s)))", "s / sqrt(abs(s)) * 0.5"),
        # exp is never negative, and its square root is exp of half.
        ("sqrt(abs(exp(-abs(s + alibi))))", "exp(abs(s + alibi) * -0.5)"),
        ("abs(exp(s)) + 1.0", "exp(s) + 1.0"),
        ("sqrt(exp(s * 4.0))", "exp(s * 2.0)"),
        ("sqrt(abs(tanh(s)))", "sqrt(abs(tanh(s)))"),
        ("abs(exp(s) - 1.0)", "abs(exp(s) - 1.0)"),
        # Equal terms as one product: exact where a left-to-right chain of the
        # terms would round at every step (found by tests/test_fuzz.py).
        ("s + s + (s + s)", "s * 4.0"),
        ("exp(s) - 2.0 * s + exp(s) + s", "exp(s) * 2.0 - s"),
        ("s - s", "s * 0.0"),
        # Integer parts stay as written: no int product where none was bounded.
        ("q * 1.0", "q * 1.0"),
        ("q + 0.0", "q + 0.0"),
        ("s + (q - k) * 1", "s + (q - k) * 1"),
        ("s - abs(q - k)", "s - abs(q - k)"),
        ("s + q div 3", "s + q div 3"),
    ],
)
def test_no_ops_constants_and_division_by_constants(score, expected):
    assert _simplified(score) == expected


@pytest.mark.parametrize(
    "score, expected",
    [
        ("max(log(1.0 + abs(s + alibi)), -0.381)", "log(abs(s + alibi) + 1.0)"),
        ("min(min(s, 1.789), 2.245)", "min(s, 1.789)"),
        ("min(2.0, softcap(s, 1.5))", "softcap(s, 1.5)"),
        ("max(abs(q - k), -0.5) + s", "abs(q - k) * 1.0 + s"),  # still real
        ("max(exp(s) - exp(s), -1.0)", "exp(s) * 0.0"),  # NaN where exp(s) is inf, as before
        # Kept: a tie is possible, the loser may be NaN, or the winner is a constant.
        ("max(exp(s), 0.0)", "max(exp(s), 0.0)"),
        ("min(tanh(s), exp(s) + 1.0)", "min(tanh(s), exp(s) + 1.0)"),
        ("max(tanh(s) + 3.0, tanh(log(s)))", "max(softcap(s, 1.0) + 3.0, tanh(log(s)))"),
        ("max(log(s), -1e30)", "max(log(s), -1e+30)"),
        ("min(sqrt(abs(s)), -1.0)", "min(sqrt(abs(s)), -1.0)"),
        ("max(s, -0.5)", "max(s, -0.5)"),
        ("max(s * rel[h], 100.0)", "max(s * rel[h], 100.0)"),
        # Integer arguments: floor division and its unbounded sides.
        ("max(s, q div 3)", "max(s, q div 3)"),
        ("max(2.0 + exp(s), (q div 3) % 2)", "exp(s) + 2.0"),
        ("min(s, max(q, k) div 4)", "min(s, max(q, k) div 4)"),
        ("max(tanh(s), abs(q div 2) + 2)", "(abs(q div 2) + 2) * 1.0"),
    ],
)
def test_min_and_max_lose_an_argument_that_cannot_win(score, expected):
    """By the value ranges of both arguments (`value_range`), strictly."""
    if "rel" in score:  # a real input's values may be NaN
        from flashgen.check import check
        from flashgen.parse import parse

        text = f"attention t {{ head_dim = 32; dtype = fp32; rel: fp32[H]; score = {score} }}"
        (variant,), _ = check([parse(text)[0]])
    else:
        variant = make_variant("causal", score=score)
    assert print_expr(simplify(variant.score)) == expected


def test_a_dropped_max_leaves_the_derivative_without_its_branches():
    """max(log(1 + |x|), c) with c < 0 is the log: the backward's derivative
    is sign(x) / (1 + |x|), with no log and no tie branch (drawn spec rand0_25)."""
    model = lower.lower(
        make_variant("causal", score="max(log(1.0 + abs(s + alibi)), -0.381)", dtype=ir.DType.BF16)
    )
    assert "_log" not in model.score_grad_code and "0.5" not in model.score_grad_code
    assert "maximum" not in model.score_log2_code


def test_value_ranges():
    from flashgen.simplify import Range, value_range

    def rng(text: str) -> Range:
        return value_range(make_variant("causal", score=text).score)

    assert rng("log(1.0 + abs(s))") == Range(0.0, math.inf, False, False)
    assert rng("tanh(s) * 2.0 - 1.0") == Range(-3.0, 1.0)
    assert rng("exp(s)") == Range(0.0, math.inf, False, True)  # overflows to inf
    assert rng("s + alibi") == Range(-math.inf, math.inf)
    assert rng("s / (1.0 + 0.01 * abs(q - k))") == Range(-math.inf, math.inf)
    assert rng("exp(s) - exp(s)").nan  # inf - inf
    assert rng("sqrt(s)").nan and not rng("sqrt(abs(s))").nan
    assert rng("s / (q - k)").nan  # x / 0
    assert rng("min(s, 2.0) * 0.5") == Range(-math.inf, 1.0)
    assert rng("softcap(s, 30.0) + (q % 4) * 1.0") == Range(-30.0, 33.0)
    assert rng("(q div 4) * 1.0") == Range(-math.inf, math.inf)
    assert rng("((q % 10) div 4) * 1.0") == Range(0.0, 2.0)


def test_division_by_a_constant_is_a_product_only_with_a_normal_reciprocal():
    """1 / c must be a normal float32, as every real constant of a spec."""
    assert _simplified("s / 1e-30") == "s * 9.999999999999999e+29"
    assert _simplified("s / 1e38") == "s / 1e+38"  # 1e-38 is subnormal in float32


def test_kinds_are_kept():
    """A real score stays real, an integer subexpression integer."""
    from flashgen.mask_forms import kind

    for text in ["q * 1.0", "q + 0.0", "2.0 * (0.5 * q)", "(q - k) / 1", "s + q * 1.0"]:
        assert kind(simplify(_score(text))) is ir.Kind.REAL, text


def test_a_function_called_twice_is_computed_once():
    code = lower.score_code(_score("tanh(s) * tanh(s) + exp(s) - exp(s) * s"), lower.ElementCode())
    assert [kx.stmt_source(line) for line in code.lines] == [
        "tanh0 = _tanh(s)",
        "exp0 = tl.math.exp2(1.4426950408889634 * s)",
    ]
    assert kx.to_source(code.log2).count("tanh0") == 2
    assert not kx.calls([code.log2], kx.TANH)  # only in the line


@pytest.mark.parametrize(
    "dtype, log, fast", [(ir.DType.FP16, "_log(", True), (ir.DType.FP32, "tl.log(", False)]
)
def test_function_paths_per_dtype(dtype, log, fast):
    """exp is exp2 with log2(e) folded into its argument's factor in every
    module; log is `_log` (lg2.approx on the GPU) in 16-bit ones only; tanh
    is tanh.approx on the GPU in 16-bit modules only, and the module shows
    the choice as a branch on the interpreter."""
    variant = make_variant(
        "causal", score="exp(s * 0.5) + log(1.0 + abs(s)) + tanh(s)", dtype=dtype
    )
    model = lower.lower(variant)
    assert "tl.math.exp2(0.7213475204444817 * s)" in model.score_log2_code
    assert log in model.score_log2_code and model.fast_math is fast
    source = render_module(variant)
    assert ("tanh.approx.f32" in source) is fast and ("lg2.approx.f32" in source) is fast
    assert ("if _INTERPRETED:" in source) is fast
    # The spec in the module is the spec as written; the reference reads that.
    assert "exp(s * 0.5) + log(1.0 + abs(s)) + tanh(s)" in source


def test_fast_math_off_keeps_the_accurate_paths():
    """The `fast_math=off` knob (for measuring the fast paths against the
    accurate ones on a GPU) leaves no approximate instruction in the module."""
    variant = make_variant("causal", score="tanh(s) + log(2.0 + s * s)", dtype=ir.DType.BF16)
    source = render_module(variant, experiments={"fast_math": False})
    assert "tanh.approx" not in source and "lg2.approx" not in source
    assert "y = tl.log(x)" in source and "_INTERPRETED" not in source
    assert "tanh.approx" in render_module(variant)


def _walk(e: ir.Expr):
    yield e
    if isinstance(e, ir.Unary):
        yield from _walk(e.operand)
    elif isinstance(e, ir.Binary):
        yield from _walk(e.left)
        yield from _walk(e.right)
    elif isinstance(e, (ir.Call, ir.Index)):
        for a in e.args:
            yield from _walk(a)


# --------------------------------------------------------------------------- #
# Semantics: the simplified score is the score, value and slope
# --------------------------------------------------------------------------- #


def _bin(op: ir.BinOp, a: ir.Expr, b: ir.Expr) -> ir.Expr:
    return ir.Binary(op, a, b)


def _neg(e: ir.Expr) -> ir.Expr:
    return ir.Unary(ir.UnaryOp.NEG, e)


_CONSTANTS = st.integers(1, 6000).map(lambda i: ir.Num(i / 100))


@st.composite
def _respelled(draw, x: ir.Expr) -> ir.Expr:
    """x written another way the simplifier should see through: a softcap
    spelling around it, a no-op, a division by a constant, constants to
    fold, or the terms a softcap spelling meets in practice."""
    c = draw(_CONSTANTS)
    inverse = ir.Num(1.0 / c.value)
    tanh = lambda y: ir.Call("tanh", (y,))  # noqa: E731
    B = ir.BinOp
    forms = [
        lambda: _bin(B.MUL, c, tanh(_bin(B.DIV, x, c))),
        lambda: _bin(B.MUL, tanh(_bin(B.DIV, x, c)), c),
        lambda: _bin(B.MUL, c, tanh(_bin(B.MUL, x, _bin(B.DIV, ir.Num(1.0), c)))),
        lambda: _bin(B.DIV, tanh(_bin(B.MUL, x, inverse)), inverse),
        lambda: _bin(B.MUL, _neg(c), tanh(_bin(B.DIV, _neg(x), c))),
        lambda: _bin(B.MUL, x, ir.Num(1.0)),
        lambda: _bin(B.ADD, ir.Num(0.0), x),
        lambda: _neg(_neg(x)),
        lambda: _bin(B.DIV, x, c),
        lambda: _bin(B.SUB, _bin(B.ADD, x, c), ir.Num(1.5)),
        lambda: _bin(B.MUL, c, _bin(B.MUL, ir.Num(0.25), x)),
        lambda: _bin(
            B.SUB, x, _bin(B.MUL, c, ir.Call("abs", (_bin(B.SUB, ir.Name("q"), ir.Name("k")),)))
        ),
        lambda: _bin(B.ADD, ir.Name("alibi"), x),
        lambda: _bin(
            B.MUL, ir.Call("exp", (_bin(B.DIV, x, c),)), ir.Call("exp", (_bin(B.DIV, x, c),))
        ),
    ]
    return forms[draw(st.integers(0, len(forms) - 1))]()


@st.composite
def _spelled_scores(draw) -> ir.Expr:
    score = draw(score_exprs())
    for _ in range(draw(st.integers(1, 3))):
        score = draw(_respelled(score))
    return score


def _values(score: ir.Expr, q: torch.Tensor, k: torch.Tensor):
    variant = ir.Variant("t", q.shape[-1], ir.DType.FP32, score=score, scale=1.0)
    with np.errstate(all="ignore"):
        return scores(variant, q, k), score_slope(variant, q, k)[1]


@settings(max_examples=200, deadline=None)
@given(score=_spelled_scores(), seed=st.integers(0, 2**16))
def test_the_simplified_score_is_the_score(score, seed):
    """Value and d/ds of the simplified score against the score as written,
    both evaluated by the float64 reference on random s and positions: equal
    within float64 rounding of the values they pass through."""
    _assert_same_score(score, seed)


@st.composite
def _bounded_by_integers(draw) -> ir.Expr:
    """min or max of a drawn score and a drawn integer expression (floor
    division, remainders, abs, min and max of positions and heads), either
    side first: the value ranges' integer half."""
    from strategies import int_exprs

    args = [draw(score_exprs()), draw(int_exprs())]
    if draw(st.booleans()):
        args.reverse()
    return ir.Call(draw(st.sampled_from(["min", "max"])), tuple(args))


@settings(max_examples=100, deadline=None)
@given(score=_bounded_by_integers(), seed=st.integers(0, 2**16))
def test_a_score_bounded_by_integers_simplifies_to_itself(score, seed):
    _assert_same_score(score, seed)


def _assert_same_score(score: ir.Expr, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    q = (torch.rand(1, 3, 11, 11, generator=gen, dtype=torch.float64) - 0.5) * 60
    k = torch.eye(11, dtype=torch.float64).expand(1, 3, 11, 11)  # s = q, element by element
    simplified = simplify(score)
    want, want_slope = _values(score, q, k)
    got, got_slope = _values(simplified, q, k)
    for a, b in ((got, want), (got_slope, want_slope)):
        finite = torch.isfinite(b)
        assert torch.equal(finite, torch.isfinite(a)), (print_expr(score), print_expr(simplified))
        scale = 1.0 + b[finite].abs().max().item() if finite.any() else 1.0
        torch.testing.assert_close(
            a[finite],
            b[finite],
            rtol=1e-9,
            atol=1e-9 * scale,
            msg=lambda m: f"{m}\n" f"{print_expr(score)}\n-> {print_expr(simplified)}",
        )


def test_the_property_test_fails_a_wrong_rewrite(monkeypatch):
    """The check above can fail: a simplifier that drops a softcap's cap
    (tanh(s / c) for c * tanh(s / c)) is caught on the first example."""
    from flashgen import simplify as module

    real = module._softcap

    def wrong(k, x):
        found = real(k, x)
        return None if found is None else ir.Call("tanh", (found.args[0],))

    monkeypatch.setattr(module, "_softcap", wrong)
    score = _score("30.0 * tanh(s / 30.0)")
    q = torch.linspace(-20, 20, 11, dtype=torch.float64).reshape(1, 1, 11, 1)
    k = torch.ones(1, 1, 1, 1, dtype=torch.float64)
    got, _ = _values(module.simplify(score), q, k)
    want, _ = _values(score, q, k)
    assert not torch.allclose(got, want, rtol=1e-9, atol=1e-9)


def test_the_property_test_fails_a_wrong_min_max_rewrite(monkeypatch):
    """And a simplifier that drops min's or max's second argument whatever
    the ranges is caught too."""
    from flashgen import simplify as module

    monkeypatch.setattr(module, "_sole_winner", lambda fn, a, b: a)
    score = _score("max(s, -0.5)")
    q = torch.linspace(-20, 20, 11, dtype=torch.float64).reshape(1, 1, 11, 1)
    k = torch.ones(1, 1, 1, 1, dtype=torch.float64)
    got, _ = _values(module.simplify(score), q, k)
    want, _ = _values(score, q, k)
    assert not torch.allclose(got, want, rtol=1e-9, atol=1e-9)


def test_reciprocal_rounding_is_within_an_ulp():
    """The decision behind x / c -> x * (1 / c): in float32, x * fl(1/c)
    is within 1.5 ulp of x / c (and equal for powers of two), over a sweep."""
    x = np.linspace(-100, 100, 20001, dtype=np.float32)
    for c in (3.0, 7.0, 30.0, 50.0, 0.1, 1e-3, 4.0):
        c32 = np.float32(c)
        quotient = (x / c32).astype(np.float64)
        product = (x * np.float32(1.0 / c)).astype(np.float64)
        exact = x.astype(np.float64) / float(c32)
        ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
        assert np.all(np.abs(product - exact) <= 1.5 * ulp + 1e-300)
        if math.log2(c).is_integer():
            assert np.array_equal(product, quotient)


def test_shared_calls_keep_the_element_code_equal():
    """Sharing changes no value: the code with its lines computes the tree
    without them (numpy standing in for tl)."""
    code = lower.score_code(
        _score("tanh(s) * tanh(s) - exp(-abs(s)) * exp(-abs(s))"), lower.ElementCode()
    )
    s = np.linspace(-5, 5, 41)
    env = kx.run(list(code.lines), {"s": s})
    got = kx.evaluate(code.log2, env) / element_code.LOG2E
    np.testing.assert_allclose(got, np.tanh(s) ** 2 - np.exp(-np.abs(s)) ** 2, rtol=1e-14)
    assert dataclasses.is_dataclass(code)
