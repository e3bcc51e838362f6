"""Golden records: every example's committed module under generated/ is current.

A template or lowering change that alters generated code fails here until
`flashgen build` is rerun, so such changes show up as diffs in review.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from flashgen.check import check
from flashgen.emit import render_module
from flashgen.tune import tuning_for
from flashgen.parse import parse

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.attn"))
GENERATED = ROOT / "generated"


def _variants():
    for path in EXAMPLES:
        spec, diags = parse(path.read_text(), str(path))
        assert not diags
        variants, diags = check([spec])
        assert not diags
        yield from variants


VARIANTS = list(_variants())


def test_every_example_has_a_module_and_nothing_else():
    expected = {f"{v.name}.py" for v in VARIANTS}
    present = {p.name for p in GENERATED.glob("*.py")}
    assert present == expected, "run `flashgen build` in the repository root"


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_generated_module_is_current(variant):
    committed = (GENERATED / f"{variant.name}.py").read_text()
    assert (
        render_module(variant, tuning_for(variant)) == committed
    ), f"generated/{variant.name}.py is stale: run `flashgen build` in the repository root"


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_generated_module_imports_only_torch_triton_and_stdlib(variant):
    tree = ast.parse((GENERATED / f"{variant.name}.py").read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            roots.add(node.module.split(".")[0])
    allowed = {"torch", "triton"} | set(sys.stdlib_module_names)
    assert roots <= allowed, roots - allowed


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_module_spec_reads_back_as_the_same_variant(variant):
    tree = ast.parse((GENERATED / f"{variant.name}.py").read_text())
    spec_text = next(
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and node.targets[0].id == "SPEC"
    )
    spec, diags = parse(spec_text)
    assert not diags
    (again,), diags = check([spec])
    assert not diags and again == variant


def test_emit_is_deterministic():
    for variant in VARIANTS[:3]:
        assert render_module(variant) == render_module(variant)
