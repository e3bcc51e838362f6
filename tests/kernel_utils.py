"""Build generated modules for tests and judge them with the one tolerance rule."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import torch

from flashgen import ir
from flashgen.emit import render_module
from flashgen.verify import Shape, check_backward, check_forward, random_inputs, torch_dtype

# Kernels run on the GPU when there is one, else under the Triton interpreter.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
_DIR = Path(tempfile.mkdtemp(prefix="flashgen-test-modules-"))
_MODULES: dict[str, ModuleType] = {}


def build(variant: ir.Variant) -> ModuleType:
    """Generate, write and import the module of `variant` (memoized)."""
    source = render_module(variant)
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    if digest not in _MODULES:
        path = _DIR / f"{variant.name}_{digest}.py"
        path.write_text(source)
        name = f"flashgen_test_{variant.name}_{digest}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        _MODULES[digest] = module
    return _MODULES[digest]


def run_case(
    variant: ir.Variant,
    shape: Shape,
    *,
    seed: int = 0,
    device: str = DEVICE,
    magnitude: float = 1.0,
    scale: float | None = None,
    **launch: int,
):
    """Random inputs of `shape`; returns the verify CaseResult."""
    module = build(variant)
    generator = torch.Generator().manual_seed(seed)
    q, k, v = random_inputs(
        shape,
        variant.head_dim,
        torch_dtype(variant.dtype),
        device,
        generator=generator,
        magnitude=magnitude,
    )
    return check_forward(variant, module, q, k, v, scale=scale, **launch)


def run_grad_case(
    variant: ir.Variant,
    shape: Shape,
    *,
    seed: int = 0,
    device: str = DEVICE,
    magnitude: float = 1.0,
    scale: float | None = None,
    with_lse: bool = True,
):
    """Random inputs of `shape`; judges dq, dk, dv (CaseResult)."""
    module = build(variant)
    generator = torch.Generator().manual_seed(seed)
    q, k, v = random_inputs(
        shape,
        variant.head_dim,
        torch_dtype(variant.dtype),
        device,
        generator=generator,
        magnitude=magnitude,
    )
    return check_backward(
        variant, module, q, k, v, scale=scale, generator=generator, with_lse=with_lse
    )


def assert_ok(result) -> None:
    detail = "; ".join(
        f"{c.what}: error {c.error:.3e} vs bound {c.bound:.3e} "
        f"(ordinary {c.ordinary_error:.3e}, finite {c.finite})"
        for c in result.checks
    )
    assert result.ok, f"{result.shape} {result.dtype}: {detail}"


def with_dtype(variant: ir.Variant, dtype: ir.DType) -> ir.Variant:
    return dataclasses.replace(variant, dtype=dtype)
