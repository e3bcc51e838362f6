"""Emit: a checked `Variant` in, the source of its standalone module out.

The only importer of jinja2 and black.  `lower` makes every decision; the
templates loop and branch over the result: `templates/module.py.j2`, the
module's shell (header, constants, the public API), includes one template per
kernel family (`triton_forward.py.j2`, `triton_backward.py.j2`,
`gluon_forward.py.j2`, `gluon_backward.py.j2`, with the Triton kernels'
shared helpers in `triton_common.py.j2` and loop macros in `tile_loops.j2`)
and copies in the host runtime's sections (`flashgen/runtime.py`) verbatim.
black formats the result here, in exactly one place, with a fixed mode so the
output is byte-for-byte reproducible.
"""

from __future__ import annotations

import functools
from pathlib import Path

import black
import jinja2

from flashgen import __version__, ir
from flashgen.lower import Tuning, lower

_BLACK_MODE = black.Mode(
    target_versions={black.TargetVersion.PY310}, line_length=100, magic_trailing_comma=False
)
# What the generated modules were tested with, as their header says: the
# GPU suite (scripts/gpu_tests.sh) on an H200 and the CPU interpreter.
TESTED_WITH = "Triton 3.6.0 (torch 2.11 on an NVIDIA H200; torch 2.13 in the CPU interpreter)"
_SECTION = "# flashgen: section "


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
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(_templates_dir()),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render_module(variant: ir.Variant, tuning: Tuning | None = None) -> str:
    """Full, black-formatted source of the module for one attention block.

    `tuning` (from `flashgen tune`) replaces the default GPU launch configs.
    """
    model = lower(variant, tuning)
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
        )
    )
    return black.format_str(source, mode=_BLACK_MODE)
