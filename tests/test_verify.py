"""`flashgen.verify`: shapes chosen from the mask's edges, row bands, and the
report's coverage lines.  Kernels run under the Triton interpreter."""

from __future__ import annotations

import dataclasses
import functools
import random

import pytest
import torch

from flashgen import ir
from flashgen.api import check_sources, load_variant
from flashgen.reference import positions, score_curvature, score_slope, scores
from flashgen.verify import (
    EDGE_MARGIN,
    GRADIENT_FACTOR,
    HEAD_LAYOUTS,
    TILE_EDGE,
    CaseResult,
    Check,
    Report,
    Shape,
    check_backward,
    check_forward,
    max_visible_score,
    plan_edges,
    random_inputs,
    random_shapes,
    tile_edge_lengths,
    tolerance,
    verify,
)


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _variant(mask: str, align: str = "bottom_right") -> ir.Variant:
    text = f"attention w {{ head_dim = 16; dtype = fp32; mask = {mask}; align = {align} }}"
    (variant,), _ = check_sources({"<w>": text})
    return variant


def _module(mask: str, name: str = "w"):
    return load_variant(dataclasses.replace(_variant(mask), name=name))


@pytest.mark.kernels
def test_window_255_is_crossed_on_the_cpu():
    """The old lengths (at most 128 on the CPU) never reached window(255)'s
    edge; now a shape's compared rows sit well past it."""
    variant = _variant("causal & window(255)")
    plan = plan_edges(variant, "cpu")
    assert not plan.unchecked and not plan.no_effect
    [(shape, rows, names)] = plan.cases
    assert names == ("window(255) left edge 255",)
    assert shape.n_queries != shape.n_keys
    q_pos, _ = positions(shape.n_queries, shape.n_keys, variant.align)
    # Some compared row has at least a margin of keys beyond the window's edge.
    assert max(q_pos[list(rows)].tolist()) - 255 >= EDGE_MARGIN["cpu"] - 1
    report = verify(variant, examples=1)
    assert report.ok and report.complete
    assert report.crossed == (f"{shape}, rows 0-{shape.n_queries - 1}: window(255) left edge 255",)
    assert report.table().endswith("ok: 4 of 4 cases within tolerance, every mask edge crossed")


@pytest.mark.kernels
@pytest.mark.parametrize("wrong", ["causal & window(256)", "causal & window(254)"])
def test_a_window_off_by_one_fails_at_the_edge(wrong):
    """Negative control: a module built from a window one key wider (or
    narrower) passes every shape of the old capped lengths, and fails
    verify now."""
    variant = _variant("causal & window(255)")
    module = _module(wrong)
    generator = torch.Generator().manual_seed(0)
    for shape in random_shapes(random.Random(0), 8, 128):  # the old CPU default
        q, k, v = random_inputs(shape, 16, torch.float32, "cpu", generator=generator)
        assert check_forward(variant, module, q, k, v).ok
    report = verify(variant, examples=1, module=module)
    assert not report.ok
    assert [r.ok for r in report.results] == [True, True, False, False]  # random, then edge
    assert "FAIL  (rows 0-63)" in report.table()
    assert report.table().splitlines()[-1].startswith("FAILED: 2 of 4")


@pytest.mark.kernels
def test_an_edge_beyond_the_cpu_budget_is_not_checked_and_not_ok():
    variant = _variant("causal & window(4095)")
    report = verify(variant, examples=1, max_len=16, gradients=False)
    assert report.passed and not report.complete and not report.ok
    [line] = report.unchecked
    assert line.startswith("window(4095) left edge 4095 (needs Nq=64 Nk=4223")
    assert line.endswith("use --device cuda)")
    table = report.table()
    assert f"not checked: {line}" in table
    assert table.endswith("INCOMPLETE: 1 of 1 cases within tolerance, but 1 mask edge not checked")
    partial = dataclasses.replace(report, accept_partial=True)
    assert partial.ok
    assert partial.table().endswith(
        "ok (partial): 1 of 1 cases within tolerance, 1 mask edge not checked"
    )


def test_the_gpu_budget_reaches_the_long_examples():
    for mask in ("causal & window(4095)", "causal & chunk(8192)"):
        plan = plan_edges(_variant(mask), "cuda")
        assert not plan.unchecked and len(plan.cases) == 1
        shape, rows, _ = plan.cases[0]
        assert shape.n_keys > 4095 + EDGE_MARGIN["cuda"] and len(rows) <= shape.n_queries


def test_top_left_needs_long_query_sequences_and_compares_a_band():
    variant = _variant("window(300)", "top_left")
    [(shape, rows, _)] = plan_edges(variant, "cpu").cases
    # Top-left: query i sits at position i, so the rows past the edge are the
    # last ones; only a band around where the edge starts to show is compared.
    assert shape.n_queries > 300 and rows[0] > 0 and len(rows) < shape.n_queries
    assert 301 in rows


def test_prefix_under_causal_is_crossed_by_rows_before_its_end():
    """`causal | prefix(256)`: the prefix shows only on rows before 256
    (later rows see every earlier key anyway)."""
    variant = _variant("causal | prefix(256)")
    [(shape, rows, names)] = plan_edges(variant, "cpu").cases
    q_pos, _ = positions(shape.n_queries, shape.n_keys, variant.align)
    assert names == ("prefix(256) end 256",) and shape.n_keys > 256
    assert min(q_pos[list(rows)].tolist()) < 256


def test_a_hidden_bound_has_no_effect_and_a_chunk_of_one_moves_one_way():
    plan = plan_edges(_variant("causal & window(8, 5)"), "cpu")
    assert plan.no_effect == ("window(8, 5) right edge 5",) and not plan.unchecked
    assert [names for _, _, names in plan.cases] == [("window(8, 5) left edge 8",)]
    plan = plan_edges(_variant("chunk(1)"), "cpu")  # chunk(0) is not a mask
    assert [names for _, _, names in plan.cases] == [("chunk(1) boundaries 1",)]


def test_comparison_constants_are_edges():
    plan = plan_edges(_variant("causal & (q - k) % 3 == 0 & k >= 70"), "cpu")
    names = {name for _, _, ns in plan.cases for name in ns}
    assert names == {
        "(q - k) % 3 == 0 constant 3",
        "(q - k) % 3 == 0 constant 0",
        "k >= 70 constant 70",
    }
    assert not plan.unchecked


def test_random_shapes_include_unequal_lengths():
    for seed in range(20):
        shapes = random_shapes(random.Random(seed), 2, 128)
        assert any(s.n_queries != s.n_keys for s in shapes)


def test_random_shapes_are_the_same_for_a_seed_on_every_machine():
    """Pinned: `flashgen verify --seed 0` checks these shapes on the CPU
    (Python's Mersenne Twister, nothing of the machine's)."""
    shapes = random_shapes(random.Random(0), 8, 128)
    assert [(s.batch, s.heads, s.kv_heads, s.n_queries, s.n_keys) for s in shapes] == [
        (2, 4, 2, 128, 128),
        (2, 1, 1, 79, 128),
        (2, 4, 2, 128, 127),
        (2, 2, 1, 1, 128),
        (1, 2, 1, 128, 1),
        (2, 2, 2, 17, 65),
        (2, 2, 2, 16, 85),
        (1, 4, 2, 63, 53),
    ]
    assert random_shapes(random.Random(7), 30, 2048) == random_shapes(random.Random(7), 30, 2048)


@pytest.mark.parametrize("max_len", [1, 2, 16, 128, 2048])
def test_random_shapes_start_with_the_edge_cases(max_len):
    """Whatever the seed: the longest square, Nq < Nk and Nq > Nk with the
    shorter length one off a tile edge, one query, one key; then draws near
    tile edges and anywhere, all within 1..max_len, Hkv dividing H."""
    drawn: set[int] = set()
    for seed in range(50):
        shapes = random_shapes(random.Random(seed), 12, max_len)
        lengths = [(s.n_queries, s.n_keys) for s in shapes]
        short = 1 if max_len <= 2 else None
        assert lengths[0] == (max_len, max_len)
        assert lengths[1][1] == max_len and lengths[2][0] == max_len
        for n in (lengths[1][0], lengths[2][1]):
            assert n == short if short else (n < max_len and n % TILE_EDGE in (1, TILE_EDGE - 1))
        assert lengths[3:5] == [(1, max_len), (max_len, 1)]
        for s in shapes:
            assert 1 <= s.n_queries <= max_len and 1 <= s.n_keys <= max_len
            assert (s.heads, s.kv_heads) in HEAD_LAYOUTS and s.batch in (1, 2)
        drawn |= {n for pair in lengths[5:] for n in pair}
    if max_len >= 128:  # the draws reach tile edges and lengths between them
        assert set(tile_edge_lengths(max_len)) & drawn and drawn - set(tile_edge_lengths(max_len))


def test_the_report_is_a_table_then_coverage_then_the_verdict():
    ok = Check("o", 1e-3, 1e-3, 3e-3, True)
    results = (
        CaseResult(Shape(1, 2, 1, 128, 128), torch.float16, (ok, dataclasses.replace(ok, what="lse"))),
        CaseResult(Shape(2, 4, 2, 33, 90), torch.float16, (Check("dq", 1.0, 1e-3, 3e-3, True),),
                   rows="rows 0-63"),
        CaseResult(Shape(1, 2, 2, 3, 4), torch.float16, (), refused="doc[b, q] may leave doc",
                   module_refused="doc[b, q] may leave doc"),
    )  # fmt: skip
    report = Report("tiny", results, "bf16 checked as fp16", crossed=("an edge",))
    lines = report.table().splitlines()
    assert lines[:3] == [
        "verify tiny",
        "note: bf16 checked as fp16",
        "shape                    dtype    what     error  ordinary     bound  result",
    ]
    assert set(lines[3]) == {"-"}
    assert lines[4:8] == [
        "B=1 H=2/1 Nq=128 Nk=128  float16  o     1.00e-03  1.00e-03  3.00e-03  ok",
        "B=1 H=2/1 Nq=128 Nk=128  float16  lse   1.00e-03  1.00e-03  3.00e-03  ok",
        "B=2 H=4/2 Nq=33 Nk=90    float16  dq    1.00e+00  1.00e-03  3.00e-03  FAIL  (rows 0-63)",
        "B=1 H=2/2 Nq=3 Nk=4               call                                "
        "ok, refused: doc[b, q] may leave doc",
    ]
    assert lines[8:] == [
        "crossed: an edge",
        "FAILED: 2 of 3 cases within tolerance (1 of them calls the language refuses, "
        "refused alike)",
    ]


def test_tile_edge_lengths():
    assert tile_edge_lengths(40) == [1, 15, 16, 17, 31, 32, 33, 40]
    assert tile_edge_lengths(1) == [1]


@pytest.mark.kernels
def test_row_bands_judge_only_their_rows_but_every_gradient():
    """With rows, the reference covers just those rows; a right module passes
    forward and backward, a module off by one at the edge fails both even
    when a single row is compared."""
    variant = _variant("causal & window(40)")
    generator = torch.Generator().manual_seed(1)
    shape = random_shapes(random.Random(0), 1, 16)[0]
    shape = dataclasses.replace(shape, n_queries=20, n_keys=90)
    q, k, v = random_inputs(shape, 16, torch.float32, "cpu", generator=generator)
    right, wrong = _module("causal & window(40)"), _module("causal & window(41)")
    # Bottom-right: rows at positions 70..89 all reach past the edge at q - 40.
    assert check_forward(variant, right, q, k, v, rows=[0, 5, 19]).ok
    assert check_backward(variant, right, q, k, v, rows=[0, 5, 19], generator=generator).ok
    assert not check_forward(variant, wrong, q, k, v, rows=[3]).ok
    assert not check_backward(variant, wrong, q, k, v, rows=[3], generator=generator).ok


# --------------------------------------------------------------------------- #
# The rounding floor of steep scores (docs/decisions/040)
# --------------------------------------------------------------------------- #


def _scored(score: str, head_dim: int = 16, mask: str = "full") -> ir.Variant:
    text = (
        f"attention w {{ head_dim = {head_dim}; dtype = fp32; mask = {mask}; "
        f"score = {score}; align = top_left }}"
    )
    (variant,), _ = check_sources({"<w>": text})
    return variant


SLOPE_SCORES = ["s", "exp(s * 2.0) * 2.0", "softcap(s, 3.0)", "sqrt(abs(s)) + alibi", "s * s - s"]


def _slope_case(score: str):
    variant = _scored(score)
    g = torch.Generator().manual_seed(0)
    q, k, _ = random_inputs(Shape(1, 2, 2, 5, 7), 16, torch.float64, "cpu", generator=g)
    return variant, q, k


def _central_difference(fn, q, k, s, step: float = 1e-6) -> torch.Tensor:
    """d fn / d s by central differences in s itself: q scaled so that s moves by +-step/2 * s."""
    return (fn(q * (1 + step / 2), k) - fn(q * (1 - step / 2), k)) / (step * s)


@pytest.mark.parametrize("score", SLOPE_SCORES)
def test_score_slope_is_the_derivative_of_the_score(score):
    variant, q, k = _slope_case(score)
    s, slope = score_slope(variant, q, k)
    plain = dataclasses.replace(variant, score=ir.Name("s"))
    assert torch.allclose(s, scores(plain, q, k))
    numeric = _central_difference(lambda a, b: scores(variant, a, b), q, k, s)
    assert torch.allclose(slope, numeric, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("score", SLOPE_SCORES)
def test_score_curvature_is_the_derivative_of_the_slope(score):
    variant, q, k = _slope_case(score)
    s, slope, curvature = score_curvature(variant, q, k)
    assert torch.equal(slope, score_slope(variant, q, k)[1])
    numeric = _central_difference(lambda a, b: score_slope(variant, a, b)[1], q, k, s)
    assert torch.allclose(curvature, numeric, rtol=1e-4, atol=1e-5)
    if score in ("s", "sqrt(abs(s)) + alibi"):  # linear in s, or not
        assert bool((curvature == 0).all()) == (score == "s")


# Seeds of the singular-slope cases: about one in thirteen gives a dq or dk off
# by more than 3x the ordinary error (9 of seeds 100-219 on 2026-12-06).  Which
# ones depends on the machine's float32 rounding (seed 118's dq was off by 3.6x
# where decision 081 was written, and by 1.0x with its dk at 3.3x elsewhere),
# so the tests find theirs rather than name one.
SINGULAR_SEEDS = range(100, 180)


@functools.lru_cache(maxsize=None)
def _singular_case(seed: int):
    """sqrt(abs(s)) in fp32, causal, at seed `seed`: (variant, module, q, k, v)."""
    variant = dataclasses.replace(
        _scored("sqrt(abs(s))", head_dim=32, mask="causal"), align=ir.Align.BOTTOM_RIGHT
    )
    module = load_variant(dataclasses.replace(variant, name="singular"))
    generator = torch.Generator().manual_seed(seed)
    q, k, v = random_inputs(Shape(1, 2, 1, 7, 12), 32, torch.float32, "cpu", generator=generator)
    return variant, module, q, k, v


def _floor_cases():
    """Each seed's check of the singular slope, and whether its dq or dk is
    off by more than GRADIENT_FACTOR times the ordinary error: the cases the
    floor is for."""
    for seed in SINGULAR_SEEDS:
        variant, module, q, k, v = _singular_case(seed)
        result = check_backward(
            variant, module, q, k, v, generator=torch.Generator().manual_seed(1000 + seed)
        )
        dq, dk = result.checks[:2]
        needs_floor = any(c.error > GRADIENT_FACTOR * c.ordinary_error for c in (dq, dk))
        yield seed, result, needs_floor


@pytest.mark.kernels
def test_a_singular_slope_passes():
    """sqrt(abs(s)) in fp32: f'(s) = 1/(2 sqrt|s|) is singular at 0, and s rounds by
    about eps times the size of its terms however small it is, so f''(s) turns one
    pair's rounding into most of both the kernel's and the ordinary implementation's
    max error, and the 3x rule compares two roundings of one number (4 and 5 of 300
    seeds failed dq and dk before decision 081).  Every seed passes, and some of them
    only by the floor."""
    floor_cases = []
    for seed, result, needs_floor in _floor_cases():
        assert result.ok, (seed, result)
        if needs_floor:
            floor_cases.append(seed)
    assert floor_cases, "no seed needed the floor: the test no longer tests it"


@pytest.mark.kernels
@pytest.mark.parametrize("factor", [1.01, 0.99])
def test_a_gradient_off_by_a_percent_still_fails_where_the_floor_admits_rounding(factor):
    """The floor that admits the singular slope's rounding (about 0.1% of max |dq|)
    must still reject a dq off by 1%, on the first seed that needs the floor."""
    seed = next(seed for seed, _, needs_floor in _floor_cases() if needs_floor)
    variant, module, q, k, v = _singular_case(seed)

    class Scaled:
        @staticmethod
        def attention(a, b, c, **kwargs):
            return module.attention(_ScaleGradient.apply(a, factor), b, c, **kwargs)

    g = torch.Generator().manual_seed(1000 + seed)
    result = check_backward(variant, Scaled, q, k, v, generator=g)
    assert [c.what for c in result.checks if not c.ok] == ["dq"]


@pytest.mark.parametrize("score", ["s", "softcap(s, 3.0)", "s * 0.5", "-s"])
def test_the_rounding_scale_of_flat_scores_is_their_largest_value(score):
    """|f'(s) s| <= |f(s)| for these, so the floor is the one of max |f| it always was."""
    variant = _scored(score)
    g = torch.Generator().manual_seed(1)
    q, k, _ = random_inputs(Shape(1, 1, 1, 6, 6), 16, torch.float32, "cpu", generator=g)
    f = scores(variant, q.double(), k.double())
    assert max_visible_score(variant, q, k, None) == pytest.approx(f.abs().max().item())


def test_a_steep_score_raises_the_rounding_scale_by_its_slope():
    variant = _scored("exp(s * 2.0) * 2.0")
    g = torch.Generator().manual_seed(2)
    q, k, _ = random_inputs(Shape(1, 1, 1, 6, 6), 16, torch.float32, "cpu", generator=g)
    s, _ = score_slope(variant, q, k)
    f = scores(variant, q.double(), k.double())
    # f' s = 2 s f: larger than f wherever s > 1/2.
    expected = torch.maximum(f.abs(), (2 * s * f).abs()).max().item()
    assert max_visible_score(variant, q, k, None) == pytest.approx(expected)
    assert expected > f.abs().max().item()


@pytest.mark.kernels
@pytest.mark.parametrize("factor", [1.5, 0.5])
def test_a_steep_score_still_fails_a_gradient_that_is_off_by_half(factor):
    """exp(s * 2) * 2 at d256: the backward's recomputed scores differ from the
    forward's by fp32 rounding, which this score's slope (about 1e5) turns into P
    off by up to 10% and dk off by about 11% (seed 6; the fuzz run of 2026-12-01).
    The floor that admits this (about 28% of max |dk| here) must still reject dq
    scaled by 1.5 or 0.5, while the kernel's own gradients pass."""
    variant = dataclasses.replace(
        _scored("exp(s * 2.0) * 2.0", head_dim=256, mask="window(6)"), scale=0.125
    )
    module = load_variant(dataclasses.replace(variant, name="steep"))
    g = torch.Generator().manual_seed(6)
    q, k, v = random_inputs(Shape(1, 2, 1, 40, 9), 256, torch.float32, "cpu", generator=g)
    state = g.get_state()
    assert check_backward(variant, module, q, k, v, generator=g).ok

    class Scaled:
        @staticmethod
        def attention(a, b, c, **kwargs):
            a = _ScaleGradient.apply(a, factor)
            return module.attention(a, b, c, **kwargs)

    g.set_state(state)
    result = check_backward(variant, Scaled, q, k, v, generator=g)
    assert [c.what for c in result.checks if not c.ok] == ["dq"]


class _ScaleGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def test_an_output_that_overflows_fails_where_the_ordinary_one_overflows_too():
    """Where the same-dtype implementation overflows, its error is infinite and
    so is the bound; an output that is infinite where the reference is finite
    still fails (rand0_5's score, sqrt(abs(exp(...))), gave inf gradients in
    bf16 before decision 079, and the report said ok)."""
    ref = torch.tensor([1.0, 2.0, 300.0], dtype=torch.float64)
    ordinary = torch.tensor([1.01, 2.0, float("inf")])
    good = tolerance(torch.tensor([1.0, 2.01, 300.0]), ref, ordinary, torch.bfloat16)
    assert good.ok and good.ordinary_error == float("inf")
    overflowed = tolerance(torch.tensor([1.0, 2.0, float("inf")]), ref, ordinary, torch.bfloat16)
    assert overflowed.error == float("inf") and not overflowed.ok
    masked = torch.tensor([1.0, float("-inf")], dtype=torch.float64)  # e.g. the lse of a masked row
    assert tolerance(masked.float(), masked, masked.float(), torch.float32).ok


@pytest.mark.kernels  # a learnable read: Triton 3.9's interpreter refuses its mask's dtype
@pytest.mark.parametrize("wrong", [None, "dq", "drel"])
def test_check_backward_at_launch_settings_judges_forward_and_backward(wrong):
    """`launch` runs the module's forward() and backward() at the given
    settings (what `flashgen tune` checks before it takes a config), learnable
    inputs' gradients included; a gradient that is off fails by name."""
    text = (
        "attention t { head_dim = 16; dtype = fp32; rel: learnable fp32[H, 8]; mask = causal; "
        "score = s + rel[h, min(q - k, 7)] }"
    )
    (variant,), _ = check_sources({"<t>": text})
    module = load_variant(variant)
    seen = []

    class Spy:
        def __getattr__(self, name):
            return getattr(module, name)

        def forward(self, *args, **kwargs):
            seen.append(("forward", kwargs["block_m"], kwargs["num_stages"]))
            return module.forward(*args, **kwargs)

        def backward(self, *args, **kwargs):
            seen.append(("backward", kwargs["block_m"], kwargs["num_stages"]))
            dq, dk, dv, drel = module.backward(*args, **kwargs)
            return (
                dq + 0.5 if wrong == "dq" else dq,
                dk,
                dv,
                drel * 2 if wrong == "drel" else drel,
            )

    gen = torch.Generator().manual_seed(3)
    q, k, v = random_inputs(Shape(1, 2, 1, 37, 45), 16, torch.float32, "cpu", generator=gen)
    rel = torch.randn(2, 8, generator=gen)
    launch = dict(block_m=16, block_n=32, num_warps=1, num_stages=1, tma=None)
    result = check_backward(
        variant, Spy(), q, k, v, generator=gen, inputs={"rel": rel}, launch=launch
    )
    assert seen == [("forward", 16, 1), ("backward", 16, 1)]
    assert [c.what for c in result.checks] == ["dq", "dk", "dv", "drel"]
    assert [c.what for c in result.checks if not c.ok] == ([wrong] if wrong else [])
