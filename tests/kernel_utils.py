"""Build generated modules for tests and judge them with the one tolerance rule."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
import triton
import triton.language as tl

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
    q, k, v, _ = kernel_inputs(variant, shape, seed, device, magnitude)
    return check_forward(variant, build(variant), q, k, v, scale=scale, **launch)


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
    q, k, v, generator = kernel_inputs(variant, shape, seed, device, magnitude)
    return check_backward(
        variant, build(variant), q, k, v, scale=scale, generator=generator, with_lse=with_lse
    )


def kernel_inputs(variant: ir.Variant, shape: Shape, seed: int, device: str, magnitude: float):
    """q, k, v from a generator seeded with `seed`, and that generator."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v = random_inputs(
        shape,
        variant.head_dim,
        torch_dtype(variant.dtype),
        device,
        generator=generator,
        magnitude=magnitude,
    )
    return q, k, v, generator


def assert_ok(result) -> None:
    detail = "; ".join(
        f"{c.what}: error {c.error:.3e} vs bound {c.bound:.3e} "
        f"(ordinary {c.ordinary_error:.3e}, finite {c.finite})"
        for c in result.checks
    )
    assert result.ok, f"{result.shape} {result.dtype}: {detail}"


def with_dtype(variant: ir.Variant, dtype: ir.DType) -> ir.Variant:
    return dataclasses.replace(variant, dtype=dtype)


def make_variant(
    mask: str = "causal",
    score: str | None = None,
    dtype=ir.DType.FP32,
    head_dim: int = 32,
    **settings,
) -> ir.Variant:
    """A checked Variant named `t` from spec fragments, through the real parser."""
    from flashgen.check import check
    from flashgen.parse import parse

    text = f"attention t {{ head_dim = {head_dim}; dtype = {dtype.value}; mask = {mask}"
    if score:
        text += f"; score = {score}"
    for key, value in settings.items():
        text += f"; {key} = {value}"
    spec, diags = parse(text + " }")
    assert not diags, diags
    (variant,), diags = check([spec])
    assert not diags, diags
    return variant


def example_variants() -> list[ir.Variant]:
    """Every block of examples/*.attn."""
    from flashgen.check import check
    from flashgen.parse import parse

    variants = []
    for path in sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.attn")):
        spec, diags = parse(path.read_text(), str(path))
        assert not diags
        checked, diags = check([spec])
        assert not diags
        variants += checked
    return variants


def shrink_masks(variant: ir.Variant) -> ir.Variant:
    """Shrink windows/chunks/prefixes so that small shapes cross their edges."""

    def shrink(e: ir.Expr) -> ir.Expr:
        if isinstance(e, ir.Call) and e.fn in ir.MASK_FUNCTIONS:
            return ir.Call(e.fn, tuple(ir.Num(min(a.value, 5 + a.value % 37)) for a in e.args))
        if isinstance(e, ir.Binary):
            return ir.Binary(e.op, shrink(e.left), shrink(e.right))
        if isinstance(e, ir.Unary):
            return ir.Unary(e.op, shrink(e.operand))
        return e

    return dataclasses.replace(variant, mask=shrink(variant.mask))


def interpretable(variant: ir.Variant) -> ir.Variant:
    """bf16 specs as fp16 on the CPU: the interpreter multiplies bf16 bit
    patterns, not values.  Their bf16 runs happen on the GPU."""
    if DEVICE == "cpu" and variant.dtype is ir.DType.BF16:
        return with_dtype(variant, ir.DType.FP16)
    return variant


@triton.jit
def _tanh_kernel(x_ptr, y_ptr, n, TANH: tl.constexpr, BLOCK: tl.constexpr):
    """y = TANH(x), TANH a generated module's `_tanh`.  It comes in as a
    constexpr, which is part of the compiled kernel's key: a global read by
    the kernel is not (Triton hashes a called function once), so a global
    set per dtype would run the first dtype's function every time."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, TANH(x), mask=offs < n)


def tanh_errors(dtype: ir.DType, device: str = DEVICE) -> tuple[float, float]:
    """The errors of a `dtype` module's `_tanh` over |x| <= 30 (dense near 0
    and in the tails), inf and 0: the largest in fp32 ulps of the true value
    where |x| >= 0.25 (everywhere for float32 modules, whose tanh keeps its
    relative accuracy near 0), and the largest absolute one."""
    tanh = build(make_variant("causal", score="softcap(s, 20.0)", dtype=dtype))._tanh
    grid = np.concatenate(
        [np.linspace(-30, 30, 60001), np.geomspace(1e-30, 30, 20000), [0.0, np.inf, -np.inf]]
    )
    grid = np.concatenate([grid, -grid])
    x = torch.tensor(grid, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    _tanh_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), TANH=tanh, BLOCK=1024)
    exact = torch.tanh(x.double()).cpu()
    error = (y.double().cpu() - exact).abs()
    ulp = torch.tensor(np.spacing(exact.abs().float().numpy()), dtype=torch.float64)
    relative = torch.ones_like(error, dtype=torch.bool)
    if dtype is not ir.DType.FP32:
        relative = x.abs().cpu() >= 0.25
    return (error / ulp)[relative].max().item(), error.max().item()


def assert_tanh_accurate(device: str = DEVICE) -> None:
    """float32 modules: 8 ulps everywhere.  16-bit modules: 8 ulps for
    |x| >= 0.25 and 2^-21 absolute near 0, where a softcap score's error
    (c times it) stays far below the rounding of 16-bit inputs."""
    assert tanh_errors(ir.DType.FP32, device)[0] <= 8
    for dtype in (ir.DType.FP16, ir.DType.BF16):
        ulps, absolute = tanh_errors(dtype, device)
        assert ulps <= 8, (dtype, ulps)
        assert absolute <= 2.0**-21, (dtype, absolute)
