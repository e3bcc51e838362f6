"""Diagnostics: problems found in `.attn` sources, and their rendering.

In: `Diagnostic` values made by `parse` and `check` (a path, an `ir.Span`, a
message) plus the source text they point into.  Out: text in the one format
every stage and the CLI share, in the style of gcc/clang with a rustc-like
note line:

    specs/x.attn:3:21: error: window size must be non-negative, got -3
        mask = causal & window(-3)
                        ^^^^^^^^^^
        = note: ...

The source line is shown without its own indentation, indented four spaces;
carets underline the span (one caret for an empty span; a span running over
several lines is underlined to the end of its first line; a line longer than
`_SHOWN_MAX` characters is shown as an excerpt around the span).  `SpecError`
carries diagnostics through the Python API as an exception whose `str()` is
that text; in IPython or Jupyter an uncaught one shows that text and no
traceback.  The wording of the limits that both `parse` and `check` enforce
lives here too.  This module imports nothing of ours but `ir`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from flashgen import ir

_TAB = "    "
# Longest source line shown whole; longer ones (a 1 MiB one-line spec) are
# cut to this many characters around the start of the span.
_SHOWN_MAX = 120
# White space as the grammar has it (grammars/attn.lark: WHITESPACE).
_BLANK = " \t\f\r"
_ELLIPSIS = "..."


@dataclass(frozen=True)
class Diagnostic:
    """One problem at one place in one file."""

    path: str
    span: ir.Span
    message: str
    severity: str = "error"
    # Extra context shown on its own line under the source excerpt.
    note: str | None = None


def render(diag: Diagnostic, source: str | None) -> str:
    """Render one diagnostic against the text of its file, newline-terminated.

    `source` may be None (text unavailable) or shorter than the span claims;
    then only the header (and note) are printed.
    """
    span = diag.span
    if span.line <= 0:
        lines = [f"{diag.path}: {diag.severity}: {diag.message}"]
    else:
        lines = [f"{diag.path}:{span.line}:{span.column}: {diag.severity}: {diag.message}"]
        excerpt = _excerpt(span, source)
        if excerpt is not None:
            lines.extend(excerpt)
    if diag.note:
        lines.append(f"{_TAB}= note: {diag.note}")
    return "\n".join(lines) + "\n"


def render_all(diags: Iterable[Diagnostic], sources: Mapping[str, str]) -> str:
    """Render diagnostics in the order given; `sources` maps path -> file text."""
    return "".join(render(d, sources.get(d.path)) for d in diags)


class SpecError(Exception):
    """Raised by the Python API when specs do not parse or check.

    `diagnostics` lists every problem; `sources` maps path -> text so that the
    message can show the offending lines.  `str(error)` is the rendered text.
    """

    def __init__(self, diagnostics: Iterable[Diagnostic], sources: Mapping[str, str]) -> None:
        self.diagnostics = tuple(diagnostics)
        self.sources = dict(sources)
        super().__init__(render_all(self.diagnostics, self.sources).rstrip("\n"))

    def _render_traceback_(self) -> list[str]:
        """What IPython and Jupyter show for this error in place of a traceback:
        the diagnostics, as `flashgen check` prints them (IPython calls this
        method, by name, on an exception that has it)."""
        return str(self).split("\n")


class SpecWarning(UserWarning):
    """Issued by the Python API (`warnings.warn`) for a spec that checks but
    may not mean what it says (a mask that hides every pair); `diagnostic`
    is the warning, `str(warning)` its rendered text, as `flashgen check`
    prints it."""

    def __init__(self, diagnostic: Diagnostic, source: str | None) -> None:
        self.diagnostic = diagnostic
        super().__init__(render(diagnostic, source).rstrip("\n"))


def expression_too_deep() -> tuple[str, str]:
    """Message and note for an expression nested deeper than the limit."""
    return (
        f"expression nested more than {ir.MAX_EXPR_DEPTH} levels deep",
        "operators, function calls and parentheses each add a level; `a + b + c` "
        "is two levels, as operators group left to right",
    )


def expression_too_large() -> tuple[str, str]:
    """Message and note for an expression with more nodes than the limit."""
    return (
        f"expression has more than {ir.MAX_EXPR_NODES} parts",
        "names, numbers, operators and function calls count as parts",
    )


def _excerpt(span: ir.Span, source: str | None) -> list[str] | None:
    """The source line of `span` and the caret line under it."""
    if source is None:
        return None
    # Lines end at '\n' alone, as the parser counts them (str.splitlines
    # would also break at '\r', '\v', '\u2028' and others).
    source_lines = source.split("\n")
    if source_lines[-1] == "":
        source_lines.pop()
    if span.line > len(source_lines) + 1:
        return None
    # A span just past the last line (end of file after a final newline) shows
    # an empty line with a caret at its start.
    raw = source_lines[span.line - 1] if span.line <= len(source_lines) else ""
    # A lone surrogate (possible in a str, never in a file) cannot be printed.
    # Only the grammar's own white space is trimmed: str.strip would also take
    # characters such as '\x1c' that may be the very thing the caret points at.
    raw = re.sub("[\ud800-\udfff]", "\ufffd", raw.rstrip(_BLANK))
    indent = len(raw) - len(raw.lstrip(_BLANK))
    shown = raw[indent:]

    start = max(span.column - 1, indent)
    if span.end_line == span.line:
        end = span.end_column - 1
    else:
        end = len(raw)
    end = min(end, len(raw))

    if len(raw) - indent > _SHOWN_MAX:
        # Show from a little before the span, cut to _SHOWN_MAX characters.
        first = max(indent, start - _SHOWN_MAX // 4)
        last = min(len(raw), first + _SHOWN_MAX)
        head = _ELLIPSIS if first > indent else ""
        tail = _ELLIPSIS if last < len(raw) else ""
        shown = head + raw[first:last] + tail
        pad = len(head) + _width(raw[first:start])
        width = max(1, _width(raw[start : min(end, last)]))
    else:
        # Tabs are displayed as four spaces, so carets are counted in display width.
        pad = _width(raw[indent:start])
        width = max(1, _width(raw[start:end]))
    return [_TAB + shown.replace("\t", _TAB), _TAB + " " * pad + "^" * width]


def _width(text: str) -> int:
    return len(text.replace("\t", _TAB))
