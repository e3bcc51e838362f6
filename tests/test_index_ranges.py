"""Index ranges (flashgen/index_ranges.py and the runtime's `_index_problem`):
the interval rule that decides, per call, whether an input's index may leave
its dimension.

Soundness is checked against exact evaluation: for random index expressions
under random positional masks and call sizes, every value the index takes
at a pair the mask keeps lies within the interval.  The module's copy of the
rule (flashgen/runtime.py) must give the same verdict as the reference's."""

from __future__ import annotations

import itertools
from unittest import mock

import pytest
import torch
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from flashgen import index_ranges, ir, runtime
from flashgen.check import check
from flashgen.emit import render_module
from flashgen.parse import parse
from flashgen.reference import attention_ref, mask_matrix
from flashgen.verify import check_forward, check_refusal


def _variant(text: str) -> ir.Variant:
    variant = _accepted(text)
    assert variant is not None, text
    return variant


def _accepted(text: str) -> ir.Variant | None:
    """The checked variant, or None where check refuses the spec (an index
    whose integers could overflow, such as `q * q`)."""
    spec, diagnostics = parse(text, "<t>")
    assert not diagnostics
    variants, diagnostics = check([spec])
    return None if diagnostics else variants[0]


def _spec(mask: str, index: str, table: str = "16", align: str = "bottom_right") -> str:
    return (
        f"attention r {{ head_dim = 16; dtype = fp32; align = {align}; t: fp32[{table}]; "
        f"mask = {mask}; score = s + t[{index}] }}"
    )


# --------------------------------------------------------------------------- #
# Exact values
# --------------------------------------------------------------------------- #


def _value(e: ir.Expr, env: dict) -> int:
    """An integer index expression at one (b, h, q, k), evaluated directly."""
    match e:
        case ir.Num(value=value):
            return value
        case ir.Name(id=name):
            return env[name]
        case ir.Unary(op=ir.UnaryOp.NEG, operand=operand):
            return -_value(operand, env)
        case ir.Binary(op=op, left=left, right=right):
            a, b = _value(left, env), _value(right, env)
            return {
                ir.BinOp.ADD: a + b,
                ir.BinOp.SUB: a - b,
                ir.BinOp.MUL: a * b,
                ir.BinOp.FLOORDIV: a // b if b else 0,
                ir.BinOp.MOD: a % b if b else 0,
            }[op]
        case ir.Call(fn=fn, args=args):
            values = [_value(a, env) for a in args]
            return {"abs": abs, "min": min, "max": max}[fn](*values)
    raise AssertionError(e)


def _exact_range(variant: ir.Variant, sizes: dict, offsets=None) -> tuple[int, int] | None:
    """(min, max) of the score's index over every pair the mask keeps (with a
    call's position offsets, when given)."""
    (read,) = [n for n in _walk(variant.score) if isinstance(n, ir.Index)]
    visible = mask_matrix(variant, sizes["Nq"], sizes["Nk"], sizes["H"], offsets=offsets)
    offset = sizes["Nk"] - sizes["Nq"] if variant.align is ir.Align.BOTTOM_RIGHT else 0
    offset, k_offset = offsets or (offset, 0)
    values = []
    for b, (h, i, j) in itertools.product(range(sizes["B"]), visible.nonzero().tolist()):
        env = {"b": b, "h": h, "H": sizes["H"], "q": i + offset, "k": j + k_offset}
        values.append(_value(read.args[0], env))
    return (min(values), max(values)) if values else None


def _walk(e):
    yield e
    for child in (getattr(e, "left", None), getattr(e, "right", None), getattr(e, "operand", None)):
        if child is not None:
            yield from _walk(child)
    for child in getattr(e, "args", ()):
        yield from _walk(child)


# --------------------------------------------------------------------------- #
# Random index expressions and masks
# --------------------------------------------------------------------------- #

_LEAVES = ("q", "k", "h", "H", "b", "0", "1", "3", "7")
_leaves = st.sampled_from(_LEAVES)


def _combine(children):
    binary = st.tuples(st.sampled_from(["+", "-", "*"]), children, children).map(
        lambda t: f"({t[1]} {t[0]} {t[2]})"
    )
    divided = st.tuples(st.sampled_from(["div", "%"]), children, st.sampled_from([1, 2, 3, 5])).map(
        lambda t: f"({t[1]} {t[0]} {t[2]})"
    )
    calls = st.tuples(st.sampled_from(["min", "max"]), children, children).map(
        lambda t: f"{t[0]}({t[1]}, {t[2]})"
    )
    return st.one_of(binary, divided, calls, children.map(lambda c: f"abs({c})"))


_indices = st.recursive(_leaves, _combine, max_leaves=6)
# Without the batch index (a varlen call's sequence number), drawn so rather
# than filtered: with `assume` alone, fresh draws failed Hypothesis's
# filter_too_much health check about one run in ten.
_indices_without_b = st.recursive(
    st.sampled_from([leaf for leaf in _LEAVES if leaf != "b"]), _combine, max_leaves=6
)
_masks = st.sampled_from(
    [
        "full",
        "causal",
        "window(3)",
        "window(2, 4)",
        "prefix(5)",
        "causal & k >= 2",
        "q - k < 4 & k <= q",
        "causal | k < 2",
        "chunk(4)",
        "!(k > q) & q >= 3",
    ]
)


@settings(max_examples=1000, deadline=None)
@example("(q % 3)", "full", "bottom_right", 1, 1, 10, 10)
@example("((k - q) div 2)", "window(3)", "top_left", 1, 1, 9, 11)
@example("abs(q - k)", "causal | k < 2", "bottom_right", 1, 2, 7, 11)
@example("(min(q, k) * (h - 1))", "chunk(4)", "top_left", 2, 3, 11, 6)
@example("max(q - 7, 3 - k)", "!(k > q) & q >= 3", "bottom_right", 1, 1, 11, 4)
@given(
    index=_indices,
    mask=_masks,
    align=st.sampled_from(["bottom_right", "top_left"]),
    batch=st.integers(1, 2),
    heads=st.integers(1, 3),
    nq=st.integers(1, 11),
    nk=st.integers(1, 11),
)
def test_the_interval_holds_every_value_the_index_takes(index, mask, align, batch, heads, nq, nk):
    variant = _accepted(_spec(mask, index, align=align))
    assume(variant is not None)
    sizes = {"B": batch, "H": heads, "Hkv": heads, "Nq": nq, "Nk": nk}
    exact = _exact_range(variant, sizes)
    queries, keys, env = index_ranges.call_ranges(sizes, variant.align)
    (entry,) = index_ranges.indices(variant)
    lo, hi = index_ranges.interval(entry.expr, entry.guard, queries, keys, env)
    if exact is not None:  # else never read: any verdict is sound
        assert lo <= exact[0] and exact[1] <= hi, (entry, exact)
    if exact is not None and (exact[0] < 0 or exact[1] >= 16):
        # A value out of range at a visible pair: the rule must refuse the call.
        assert index_ranges.out_of_range(variant, sizes) is not None


@settings(max_examples=200, deadline=None)
@given(
    index=_indices,
    mask=_masks,
    align=st.sampled_from(["bottom_right", "top_left"]),
    batch=st.integers(0, 3),
    heads=st.integers(0, 3),
    nq=st.integers(0, 40),
    nk=st.integers(0, 40),
)
def test_the_modules_rule_gives_the_references_verdict(index, mask, align, batch, heads, nq, nk):
    variant = _accepted(_spec(mask, index, align=align))
    assume(variant is not None)
    table = tuple(r.as_tuple() for r in index_ranges.ranges(variant))
    bottom_right = variant.align is ir.Align.BOTTOM_RIGHT
    sizes = {"B": batch, "H": heads, "Hkv": heads, "Nq": nq, "Nk": nk}
    runtime._index_problem.cache_clear()
    try:
        with (
            mock.patch.object(runtime, "_INDEX_RANGES", table),
            mock.patch.object(runtime, "BOTTOM_RIGHT", bottom_right),
        ):
            verdict = runtime._index_problem(*sizes.values())
    finally:
        runtime._index_problem.cache_clear()
    assert verdict == index_ranges.out_of_range(variant, sizes)


def _module_verdict(variant, sizes, lengths=(None, None), shifts=None):
    """The module's rule (runtime._positions and _index_problem) for a call of
    these sizes with sequences of these lengths and offsets."""
    table = tuple(r.as_tuple() for r in index_ranges.ranges(variant))
    bottom_right = variant.align is ir.Align.BOTTOM_RIGHT
    runtime._index_problem.cache_clear()
    runtime._positions.cache_clear()
    try:
        with (
            mock.patch.object(runtime, "_INDEX_RANGES", table),
            mock.patch.object(runtime, "BOTTOM_RIGHT", bottom_right),
        ):
            positions = runtime._positions(*lengths, sizes["Nq"], sizes["Nk"], shifts)
            if positions is None:
                return None
            return runtime._index_problem(*sizes.values(), positions)
    finally:
        runtime._index_problem.cache_clear()
        runtime._positions.cache_clear()


@settings(max_examples=300, deadline=None)
@given(
    index=_indices,
    mask=_masks,
    align=st.sampled_from(["bottom_right", "top_left"]),
    heads=st.integers(1, 2),
    nq=st.integers(1, 9),
    nk=st.integers(1, 9),
    offsets=st.tuples(st.integers(0, 12), st.integers(0, 12)),
)
def test_with_offsets_the_rule_holds_and_the_module_agrees(
    index, mask, align, heads, nq, nk, offsets
):
    """Decision 051: under q_offset and k_offset the interval holds every value
    the index takes at the shifted positions, a value outside makes the call
    refused, and the module's rule gives the reference's words."""
    variant = _accepted(_spec(mask, index, align=align))
    assume(variant is not None)
    sizes = {"B": 1, "H": heads, "Hkv": heads, "Nq": nq, "Nk": nk}
    exact = _exact_range(variant, sizes, offsets)
    verdict = index_ranges.out_of_range(variant, sizes, offsets)
    if exact is not None and (exact[0] < 0 or exact[1] >= 16):
        assert verdict is not None, (exact, offsets)
    assert _module_verdict(variant, sizes, shifts=offsets) == verdict


@settings(max_examples=300, deadline=None)
# The first sequence in range, the second not: a hull of the first sequence
# alone would pass the call (the draws did not catch that on their own).
@example("q", "full", "bottom_right", [(2, 2), (9, 9)], (8, 0))
@example("k - q", "full", "top_left", [(0, 3), (4, 4), (1, 9)], None)
@given(
    index=_indices_without_b,
    mask=_masks,
    align=st.sampled_from(["bottom_right", "top_left"]),
    lengths=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), min_size=1, max_size=3),
    offsets=st.one_of(st.none(), st.tuples(st.integers(0, 12), st.integers(0, 12))),
)
def test_sequences_are_refused_where_any_sequence_reads_outside(
    index, mask, align, lengths, offsets
):
    """Decision 051: the hull of a varlen call's sequences is sound: where one
    sequence alone (its own sizes, b its number) would read outside, the
    module refuses the call."""
    variant = _accepted(_spec(mask, index, align=align))
    assume(variant is not None)
    outside = False
    for nq, nk in lengths:
        if nq and nk:
            sizes = {"B": 1, "H": 2, "Hkv": 2, "Nq": nq, "Nk": nk}
            exact = _exact_range(variant, sizes, offsets)
            outside |= exact is not None and (exact[0] < 0 or exact[1] >= 16)
    sizes = {"B": len(lengths), "H": 2, "Hkv": 2, "Nq": 30, "Nk": 30}  # the packed rows
    queries, keys = (tuple(n[i] for n in lengths) for i in (0, 1))
    verdict = _module_verdict(variant, sizes, (queries, keys), offsets)
    if outside:
        assert verdict is not None, (lengths, offsets)


# --------------------------------------------------------------------------- #
# What the rule settles at build time, and what it asks of a call
# --------------------------------------------------------------------------- #


def test_indices_in_range_for_every_call_are_settled_at_build_time():
    settled = [
        ("window(15, 0)", "q - k", "16"),  # the window bounds q - k to 0 .. 15
        ("causal & q - k < 16", "q - k", "16"),
        ("full", "min(max(q - k + 8, 0), 15)", "16"),  # a clamped bucket
        ("full", "(q - k) % 16", "16"),
        ("full", "h", "H"),
        ("full", "k", "Nk"),
    ]
    for mask, index, table in settled:
        assert index_ranges.ranges(_variant(_spec(mask, index, table))) == (), (mask, index)
    kept = [("causal", "q - k", "16"), ("full", "q", "Nq"), ("full", "k", "Nq")]
    for mask, index, table in kept:
        assert len(index_ranges.ranges(_variant(_spec(mask, index, table)))) == 1, (mask, index)


def test_a_document_mask_is_refused_only_where_its_positions_leave_the_tensor():
    text = (
        "attention d {{ head_dim = 16; dtype = fp32; align = {align}; doc: int32[B, Nk]; "
        "mask = causal & doc[b, q] == doc[b, k] }}"
    )
    bottom_right, top_left = (_variant(text.format(align=a)) for a in ("bottom_right", "top_left"))

    def sizes(nq, nk):
        return {"B": 2, "H": 1, "Hkv": 1, "Nq": nq, "Nk": nk}

    for nq, nk in ((8, 8), (3, 8), (8, 3)):
        # Bottom-right: query positions are Nk - Nq .. Nk - 1, and the rows with
        # negative positions (Nq > Nk) see no key, so `doc[b, q]` is never read there.
        assert index_ranges.out_of_range(bottom_right, sizes(nq, nk)) is None
    assert index_ranges.out_of_range(top_left, sizes(3, 8)) is None
    problem = index_ranges.out_of_range(top_left, sizes(8, 3))
    assert problem == (
        "`doc`: index 1 may reach 0 .. 7 in this call, outside its dimension of size 3 "
        "(clamp the index with min and max, or pass a larger `doc`)"
    )


def test_the_reference_and_the_module_refuse_the_same_call_with_the_same_words():
    text = _spec("full", "q - k", table="4")
    variant = _variant(text)
    q, k, v = (torch.randn(1, 1, 6, 16) for _ in range(3))
    rel = torch.zeros(4)
    with pytest.raises(ValueError) as from_reference:
        attention_ref(variant, q, k, v, inputs={"t": rel})
    namespace: dict = {"__name__": "r_module"}
    exec(compile(render_module(variant), "r_module.py", "exec"), namespace)
    with pytest.raises(ValueError) as from_module:
        namespace["attention"](q, k, v, t=rel)
    assert str(from_module.value) == str(from_reference.value)
    assert str(from_module.value).startswith("`t`: index 0 may reach -5 .. 5 in this call")
    # In range: the same call with a table of 11 runs.
    wide = _variant(_spec("full", "q - k + 5", table="11"))
    namespace = {"__name__": "r_module"}
    exec(compile(render_module(wide), "r_module.py", "exec"), namespace)
    module = type("module", (), {"forward": staticmethod(namespace["forward"])})
    assert check_forward(wide, module, q, k, v, inputs={"t": torch.randn(11)}).ok


def test_verify_counts_a_refused_call_only_when_the_module_refuses_it_alike():
    variant = _variant(_spec("full", "q - k", table="4"))
    q, k, v = (torch.randn(1, 1, 6, 16) for _ in range(3))
    data = {"t": torch.zeros(4)}
    namespace: dict = {"__name__": "r_module"}
    exec(compile(render_module(variant), "r_module.py", "exec"), namespace)
    module = type("module", (), {"forward": staticmethod(namespace["forward"])})
    case = check_refusal(variant, module, q, k, v, data)
    assert case.ok and case.refused.startswith("`t`: index 0 may reach -5 .. 5")

    lenient = type("module", (), {"forward": staticmethod(lambda q, k, v, **inputs: None)})
    case = check_refusal(variant, lenient, q, k, v, data)
    assert not case.ok and case.module_refused == ""

    def refuses_otherwise(q, k, v, **inputs):
        raise ValueError("some other reason")

    wrong_words = type("module", (), {"forward": staticmethod(refuses_otherwise)})
    assert not check_refusal(variant, wrong_words, q, k, v, data).ok
    in_range = _variant(_spec("full", "q - k + 5", table="11"))
    assert check_refusal(in_range, module, q, k, v, {"t": torch.zeros(11)}) is None
