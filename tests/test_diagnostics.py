"""Snapshot tests of rendered diagnostics.

Each `tests/diagnostics/<case>.attn` is parsed and checked under the path
`<case>.attn`; everything reported, rendered, must equal
`tests/diagnostics/<case>.txt`.  To rewrite the snapshots after an intended
change of wording, run with FLASHGEN_UPDATE_SNAPSHOTS=1 and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flashgen import ir
from flashgen.check import check
from flashgen.diagnostics import Diagnostic, SpecError, render, render_all
from flashgen.parse import parse

FIXTURES = Path(__file__).parent / "diagnostics"
CASES = sorted(p.stem for p in FIXTURES.glob("*.attn"))
UPDATE = os.environ.get("FLASHGEN_UPDATE_SNAPSHOTS") == "1"


def diagnose(path: str, text: str) -> list[Diagnostic]:
    spec, diagnostics = parse(text, path)
    if spec is not None:
        _, diagnostics = check([spec])
    return diagnostics


def test_there_are_enough_cases():
    assert len(CASES) >= 12


@pytest.mark.parametrize("case", CASES)
def test_snapshot(case):
    path = f"{case}.attn"
    text = (FIXTURES / path).read_text(encoding="utf-8")
    diagnostics = diagnose(path, text)
    assert diagnostics, "every fixture is meant to fail"
    rendered = render_all(diagnostics, {path: text})
    expected_file = FIXTURES / f"{case}.txt"
    if UPDATE:
        expected_file.write_text(rendered, encoding="utf-8")
    assert rendered == expected_file.read_text(encoding="utf-8")


# --------------------------------------------------------------------------- #
# The renderer itself
# --------------------------------------------------------------------------- #


def _diag(line, column, end_line, end_column, message="bad", note=None):
    return Diagnostic("x.attn", ir.Span(line, column, end_line, end_column), message, note=note)


def test_render_underlines_span_and_strips_indentation():
    source = "attention a {\n    mask = causal & window(-3)\n}\n"
    out = render(_diag(2, 21, 2, 31, "window size must be non-negative, got -3"), source)
    assert out == (
        "x.attn:2:21: error: window size must be non-negative, got -3\n"
        "    mask = causal & window(-3)\n"
        "                    ^^^^^^^^^^\n"
    )


def test_render_empty_span_gets_one_caret():
    out = render(_diag(1, 3, 1, 3), "abc\n")
    assert out.splitlines()[1:] == ["    abc", "      ^"]


def test_render_multiline_span_underlines_to_end_of_first_line():
    out = render(_diag(1, 2, 3, 1), "abcd\nef\n")
    assert out.splitlines()[1:] == ["    abcd", "     ^^^"]


def test_render_expands_tabs_consistently():
    out = render(_diag(1, 3, 1, 4), "a\tb\n")
    assert out.splitlines()[1:] == ["    a    b", "         ^"]


def test_render_note_and_severity():
    d = Diagnostic("x.attn", ir.Span(1, 1, 1, 2), "odd", severity="warning", note="why")
    assert render(d, "x\n") == "x.attn:1:1: warning: odd\n    x\n    ^\n    = note: why\n"


def test_render_without_source_or_span():
    assert render(_diag(5, 1, 5, 2), None) == "x.attn:5:1: error: bad\n"
    d = Diagnostic("x.attn", ir.NO_SPAN, "no place")
    assert render(d, "text") == "x.attn: error: no place\n"


def test_render_past_end_of_file():
    assert render(_diag(2, 1, 2, 1), "abc\n").splitlines()[1:] == ["    ", "    ^"]


def test_spec_error_str_is_rendered_text():
    source = "attention a { head_dim = 64 }\n"
    diagnostics = diagnose("a.attn", source)
    error = SpecError(diagnostics, {"a.attn": source})
    assert error.diagnostics == tuple(diagnostics)
    assert str(error) == render_all(diagnostics, {"a.attn": source}).rstrip("\n")
    assert str(error).startswith("a.attn:1:11: error: block 'a' is missing")


def test_render_long_line_shows_an_excerpt_around_the_span():
    source = "    score = " + "s + " * 300 + "BAD" + " + s" * 300 + "\n"
    column = source.index("BAD") + 1
    out = render(_diag(1, column, 1, column + 3), source).splitlines()
    shown, carets = out[1], out[2]
    assert shown.startswith("    ...") and shown.endswith("...")
    assert len(shown) < 140
    assert shown[carets.index("^") : len(carets)] == "BAD"


def test_render_long_line_excerpt_at_its_start_has_no_leading_ellipsis():
    source = "mask = " + "q + " * 100 + "k\n"
    out = render(_diag(1, 8, 1, 9), source).splitlines()
    assert out[1].startswith("    mask = q + ") and out[1].endswith("...")
    assert out[2] == "    " + " " * 7 + "^"
