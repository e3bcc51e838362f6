"""Emit: a checked `Variant` in, the source of its standalone module out.

The only importer of jinja2.  `lower` makes every decision; the
templates loop and branch over the result: `templates/module.py.j2`, the
module's shell (header, constants, the public API), includes one template per
kernel family (`triton_forward.py.j2`, `triton_backward.py.j2`,
`gluon_forward.py.j2`, `gluon_backward.py.j2`, with the Triton kernels'
shared helpers in `triton_common.py.j2` and loop macros in `tile_loops.j2`)
and copies in the host runtime's sections (`flashgen/runtime.py`) verbatim.
The templates are written as black (the project's formatter, line length
100) would write them, with long argument lists grouped by meaning and kept
so by `# fmt: skip`; a code line the lowering made longer than a line gets
the same mark here (`_mark_long_lines`).  So the output is final: building
needs no formatter, and tests/test_golden.py checks that every golden module
is black-clean.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import tokenize
from collections.abc import Mapping
from pathlib import Path

import jinja2

from flashgen import __version__, ir
from flashgen.experiments import LOWERING_KNOBS
from flashgen.experiments import apply as apply_experiments
from flashgen.lower import Tuning, lower

# black's line length for this project (pyproject.toml, [tool.black]).
LINE_LENGTH = 100
# What the generated modules were tested with, as their header says: the
# GPU suite (scripts/gpu_tests.sh) on an H200 and the CPU interpreter.
TESTED_WITH = (
    "Triton 3.6.0 (torch 2.11 on an NVIDIA H200; torch 2.13 in the CPU interpreter,"
    " where Triton 3.5.1 and 3.9.0 pass too)"
)
# Version prefixes of the Triton that the Gluon kernels and the direct launches
# were tested on (flashgen/runtime.py's TESTED_TRITON is the same).
TESTED_TRITON = ("3.6.",)
_SECTION = "# flashgen: section "


def python_literal(value: object) -> str:
    """A tuple of str, int, bool and None as black writes it (double quotes)."""
    if isinstance(value, tuple):
        inner = ", ".join(python_literal(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, str):
        return python_string(value)
    if value is None or isinstance(value, (bool, int)):
        return repr(value)
    raise TypeError(f"not a literal the modules hold: {value!r}")


def python_string(text: str) -> str:
    """A Python literal of `text` as black writes it: double quotes unless
    that needs more escapes than single ones."""
    literal = repr(text)
    if literal[0] == "'" and '"' not in text:
        return '"' + literal[1:-1].replace("\\'", "'") + '"'
    return literal


@functools.lru_cache(maxsize=1)
def runtime_sections() -> dict[str, str]:
    """The sections of flashgen/runtime.py by name, each as it is copied."""
    text = (Path(__file__).resolve().parent / "runtime.py").read_text(encoding="utf-8")
    chunks = text.split("\n" + _SECTION)[1:]
    sections = {}
    for chunk in chunks:
        name, _, body = chunk.partition("\n")
        sections[name.strip()] = body.strip("\n")
    return sections


def _templates_dir() -> Path:
    try:
        from importlib.resources import files

        return Path(str(files("flashgen.templates")))
    except ModuleNotFoundError:  # running from a checkout without installing
        return Path(__file__).resolve().parent.parent / "templates"


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_templates_dir()),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    environment.filters["literal"] = python_literal
    return environment


def render_module(
    variant: ir.Variant,
    tuning: Tuning | None = None,
    experiments: Mapping[str, object] | None = None,
    triton_only: bool = False,
) -> str:
    """Full source of the module for one attention block, in its final form.

    `tuning` (from `flashgen tune`) replaces the default GPU launch configs;
    `experiments` sets plan knobs (flashgen/experiments.py, parsed values);
    `triton_only` leaves out the Hopper (Gluon) kernels, for a shorter module
    that runs the Triton kernels everywhere.
    """
    experiments = experiments or {}
    lowering = {name: experiments[name] for name in LOWERING_KNOBS if name in experiments}
    model = apply_experiments(lower(variant, tuning, **lowering), experiments)
    if triton_only:
        model = dataclasses.replace(
            model,
            gluon_forward=None,
            gluon_backward=False,
            gluon_varlen=False,
            gluon_varlen_backward=False,
            gluon_varlen_captured=False,
            runs=None,
            triton_only=True,
        )
    source = (
        _environment()
        .get_template("module.py.j2")
        .render(
            m=model,
            version=__version__,
            spec_lines=model.spec_text.rstrip("\n").splitlines(),
            spec_literal=python_string(model.spec_text),
            runtime=runtime_sections(),
            tested_with=TESTED_WITH,
            tested_triton=TESTED_TRITON,
        )
    )
    return _mark_long_lines(source)


_NOT_CODE = {tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}


def _mark_long_lines(source: str) -> str:
    """`source` with `  # fmt: skip` after each statement that is longer than
    LINE_LENGTH and stands on one line: code the lowering made (a long mask
    interval, a score with many terms) that black would wrap."""
    lines = source.split("\n")
    first = None  # the physical line where the current logical line began
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if first is None and token.type not in _NOT_CODE:
            first = token.start[0]
        if token.type == tokenize.NEWLINE:
            row = token.start[0]
            line = lines[row - 1]
            if row == first and len(line) > LINE_LENGTH and "#" not in line:
                lines[row - 1] = line + "  # fmt: skip"
            first = None
    return "\n".join(lines)
