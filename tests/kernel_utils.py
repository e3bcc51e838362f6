"""Build generated modules for tests and judge them with the one tolerance rule;
draw specs from the whole language (`language_variants`, `deep_variant`) for the
forward-and-backward tests that run on both the interpreter and the GPU."""

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
from hypothesis import strategies as st

from flashgen import ir
from flashgen.ir import BinOp, Call, Name, Num, Unary, UnaryOp
from flashgen.emit import render_module
from flashgen.verify import (
    Shape,
    check_backward,
    check_forward,
    random_inputs,
    random_runtime_inputs,
    torch_dtype,
)

# Kernels run on the GPU when there is one, else under the Triton interpreter.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
_DIR = Path(tempfile.mkdtemp(prefix="flashgen-test-modules-"))
_MODULES: dict[str, ModuleType] = {}


def build(variant: ir.Variant, experiments: dict | None = None) -> ModuleType:
    """Generate, write and import the module of `variant` (memoized), with
    plan knobs `experiments` (flashgen/experiments.py, parsed values)."""
    source = render_module(variant, None, experiments)
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
    """Random inputs of `shape` (and of the variant's declared inputs);
    returns the verify CaseResult."""
    q, k, v, generator = kernel_inputs(variant, shape, seed, device, magnitude)
    data = runtime_inputs(variant, shape, device, generator)
    return check_forward(variant, build(variant), q, k, v, scale=scale, inputs=data, **launch)


def run_grad_case(
    variant: ir.Variant,
    shape: Shape,
    *,
    seed: int = 0,
    device: str = DEVICE,
    magnitude: float = 1.0,
    scale: float | None = None,
    with_lse: bool = True,
    module: ModuleType | None = None,
):
    """Random inputs of `shape` (and of the variant's declared inputs); judges
    dq, dk, dv and the learnable inputs' gradients (CaseResult) of `module`
    (default: the variant's module as built)."""
    q, k, v, generator = kernel_inputs(variant, shape, seed, device, magnitude)
    data = runtime_inputs(variant, shape, device, generator)
    module = module or build(variant)
    return check_backward(
        variant, module, q, k, v, scale=scale, generator=generator, with_lse=with_lse,
        inputs=data,
    )  # fmt: skip


def runtime_inputs(
    variant: ir.Variant, shape: Shape, device: str, generator: torch.Generator
) -> dict[str, torch.Tensor] | None:
    """Random values of the variant's declared inputs (None: it declares none)."""
    if not variant.inputs:
        return None
    return random_runtime_inputs(variant, shape, device, generator=generator)


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
        v_head_dim=variant.v_dim,
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
    declared: str = "",
    **settings,
) -> ir.Variant:
    """A checked Variant named `t` from spec fragments, through the real parser
    (warnings allowed: a mask that hides every pair is a case too); `declared`:
    input declarations (`doc: int32[B, Nk]; t: int32[H]`)."""
    from flashgen.check import check
    from flashgen.parse import parse

    inputs = f"{declared}; " if declared else ""
    text = f"attention t {{ head_dim = {head_dim}; dtype = {dtype.value}; {inputs}mask = {mask}"
    if score:
        text += f"; score = {score}"
    for key, value in settings.items():
        text += f"; {key} = {value}"
    spec, diags = parse(text + " }")
    assert not diags, diags
    (variant,), diags = check([spec])
    assert all(d.severity == "warning" for d in diags), diags
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


def tanh_errors(dtype: ir.DType, device: str = DEVICE) -> tuple[float, float, float]:
    """The errors of a `dtype` module's `_tanh` over |x| <= 30 (dense near 0
    and in the tails), inf and 0: the largest in fp32 ulps of the true value
    where |x| >= 0.25 (everywhere for float32 modules, whose tanh keeps its
    relative accuracy near 0), the largest absolute one, and the largest
    relative one (where tanh is not 0)."""
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
    nonzero = exact != 0
    worst_relative = (error[nonzero] / exact[nonzero].abs()).max().item()
    return (error / ulp)[relative].max().item(), error.max().item(), worst_relative


# tanh.approx.f32's relative error (PTX ISA: about 2^-11), with a margin: the
# bound 16-bit modules' `_tanh` must meet on the GPU (docs/decisions/049).
FAST_TANH_RELATIVE = 2.0**-10.5


def assert_tanh_accurate(device: str = DEVICE) -> None:
    """float32 modules: 8 ulps everywhere.  16-bit modules: on the GPU
    (tanh.approx.f32) FAST_TANH_RELATIVE everywhere, under one rounding of a
    16-bit score; on the interpreter (the portable exp2 branch) 8 ulps for
    |x| >= 0.25 and 2^-21 absolute near 0, where a softcap score's error (c
    times it) stays far below the rounding of 16-bit inputs."""
    assert tanh_errors(ir.DType.FP32, device)[0] <= 8
    for dtype in (ir.DType.FP16, ir.DType.BF16):
        ulps, absolute, relative = tanh_errors(dtype, device)
        if device == "cuda":
            assert relative <= FAST_TANH_RELATIVE, (dtype, relative)
        else:
            assert ulps <= 8, (dtype, ulps)
            assert absolute <= 2.0**-21, (dtype, absolute)


# --------------------------------------------------------------------------- #
# Specs from the whole language, for forward-and-backward tests on both the
# interpreter and the GPU (tests/test_gradients.py, tests/test_gpu.py)
# --------------------------------------------------------------------------- #

_S, _Q, _K = Name("s"), Name("q"), Name("k")


def _neg(e: ir.Expr) -> ir.Expr:
    return Unary(UnaryOp.NEG, e)


def _b(op: BinOp, left: ir.Expr, right: ir.Expr) -> ir.Expr:
    return ir.Binary(op, left, right)


@st.composite
def _constants(draw) -> ir.Expr:
    """Integer and real literals, either sign, sometimes a constant expression."""
    value = draw(st.integers(1, 4) | st.integers(1, 40).map(lambda i: i / 10))
    e: ir.Expr = Num(value)
    if draw(st.booleans()):
        e = _neg(e)
    if draw(st.integers(0, 3)) == 0:  # `(2 - 3)`, `(1 div 2 + 0.5)`: constants, not literals
        e = _b(draw(st.sampled_from([BinOp.ADD, BinOp.SUB])), e, Num(draw(st.integers(0, 3))))
    return e


@st.composite
def _position_terms(draw) -> ir.Expr:
    """Integer terms over q, k, h, H (every integer operator), scaled down to
    a real of at most a few units at the test lengths."""
    choice = draw(st.integers(0, 4))
    distance = _b(BinOp.SUB, _Q, _K)
    if choice == 0:
        term = Call("abs", (distance,))
    elif choice == 1:
        term = _b(BinOp.SUB, _b(BinOp.FLOORDIV, _Q, Num(3)), _b(BinOp.MOD, _K, Num(5)))
    elif choice == 2:
        term = _b(BinOp.MUL, Name("h"), Num(2))
    elif choice == 3:
        term = Call("min", (Name("H"), _b(BinOp.MOD, distance, Num(4))))
    else:
        term = Call("max", (_neg(Name("h")), _b(BinOp.FLOORDIV, distance, Num(8))))
    return _b(BinOp.MUL, term, Num(draw(st.sampled_from([0.01, 0.02, -0.01]))))


@st.composite
def language_scores(draw, depth: int = 3) -> ir.Expr:
    """Real score expressions that use every operator and function of the
    language, negative and integer constants included, kept finite and
    moderate (a few tens at most) for |s| of a few units."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        choice = draw(st.integers(0, 5))
        if choice == 0:
            return _S
        if choice == 1:
            return _neg(_S)
        if choice == 2:
            return _b(BinOp.MUL, draw(_constants()), _S)
        if choice == 3:
            return _b(BinOp.ADD, _S, Name("alibi"))
        if choice == 4:
            return _b(BinOp.ADD, _S, draw(_position_terms()))
        return _b(BinOp.SUB, _S, draw(_constants()))
    x = draw(language_scores(depth - 1))
    choice = draw(st.integers(0, 13))
    if choice == 0:
        return _neg(x)
    if choice == 1:
        return _b(BinOp.ADD, x, draw(language_scores(depth - 1)))
    if choice == 2:
        return _b(BinOp.SUB, draw(_constants()), x)
    if choice == 3:
        return _b(BinOp.MUL, x, draw(_constants()))
    if choice == 4:  # a product of two score terms, one of them bounded
        return _b(BinOp.MUL, x, Call("tanh", (draw(language_scores(depth - 1)),)))
    if choice == 5:  # a denominator of at least 2
        return _b(BinOp.DIV, x, _b(BinOp.ADD, Num(2), Call("abs", (draw(language_scores(0)),))))
    if choice == 6:
        return Call("tanh", (x,))
    if choice == 7:  # exp of at most 1
        return Call("exp", (_neg(Call("abs", (Call("tanh", (x,)),))),))
    if choice == 8:
        return Call("log", (_b(BinOp.ADD, Num(1.0), Call("abs", (x,))),))
    if choice == 9:
        return Call("sqrt", (_b(BinOp.ADD, Num(1), _b(BinOp.MUL, x, x)),))
    if choice == 10:
        return Call("abs", (x,))
    if choice == 11:
        return Call(draw(st.sampled_from(["min", "max"])), (x, draw(_constants())))
    if choice == 12:
        cap = draw(st.sampled_from([0.5, 2.0, 30.0, 1e-30, 2.3e38]))
        return Call("softcap", (x, Num(cap)))
    return _b(BinOp.ADD, x, draw(_position_terms()))


@st.composite
def language_variants(draw, dtypes: tuple[ir.DType, ...], head_dims: tuple[int, ...]):
    """Variants with `language_scores` and the masks of tests/strategies.py."""
    from strategies import masks

    return ir.Variant(
        name="lang",
        head_dim=draw(st.sampled_from(head_dims)),
        dtype=draw(st.sampled_from(dtypes)),
        mask=draw(masks()),
        score=draw(language_scores()),
        scale=draw(st.none() | st.sampled_from([0.05, 0.3, 1.0])),
        align=draw(st.sampled_from(list(ir.Align))),
    )


def deep_variant(dtype: ir.DType, head_dim: int) -> ir.Variant:
    """A spec at the nesting limit: a score and a mask each ir.MAX_EXPR_DEPTH
    levels deep, the leaf counting as one.  The score nests every function
    under a `+` chain 12 long; the mask nests & and | over comparisons
    with deep integer arithmetic."""
    score: ir.Expr = _S
    wraps = [
        lambda x: Call("tanh", (x,)),
        lambda x: _b(BinOp.ADD, x, _S),
        lambda x: Call("max", (x, _neg(Num(2.5)))),
        lambda x: _b(BinOp.MUL, x, Num(2)),
        lambda x: Call("min", (x, Num(3))),
        lambda x: Call("exp", (_neg(Call("abs", (x,))),)),  # two levels
        lambda x: _b(BinOp.SUB, x, _b(BinOp.MUL, Num(0.5), _S)),
        lambda x: Call("softcap", (x, Num(5.0))),
        lambda x: Call("log", (_b(BinOp.ADD, Num(6), x),)),  # after softcap(x, 5): > 1
        lambda x: Call("sqrt", (_b(BinOp.ADD, Num(1), Call("abs", (x,))),)),  # three levels
    ]
    i = 0
    while _depth(score) < ir.MAX_EXPR_DEPTH - 12:
        score = wraps[i % len(wraps)](score)
        i += 1
    while _depth(score) < ir.MAX_EXPR_DEPTH:
        score = _b(BinOp.ADD, score, _b(BinOp.MUL, Num(0.01), _S))
    # k <= q + (1 + (1 + ...)): integer nesting inside a comparison.
    offset: ir.Expr = Num(1)
    while _depth(offset) < ir.MAX_EXPR_DEPTH - 4:
        offset = _b(
            BinOp.ADD, Num(1), Call("abs", (offset,)) if _depth(offset) % 5 == 0 else offset
        )
    mask: ir.Expr = _b(BinOp.LE, _K, _b(BinOp.ADD, _Q, offset))
    comparisons = [
        _b(BinOp.NE, _b(BinOp.MOD, _b(BinOp.SUB, _Q, _K), Num(7)), Num(3)),
        _b(BinOp.GE, _K, _b(BinOp.SUB, _Q, Num(300))),
        _b(BinOp.EQ, _b(BinOp.MOD, Name("h"), Num(2)), Num(0)),
        _b(BinOp.LT, _K, Num(16)),
    ]
    deep_mask: ir.Expr = comparisons[0]
    j = 1
    while _depth(deep_mask) < ir.MAX_EXPR_DEPTH - 1:
        op = BinOp.AND if j % 2 else BinOp.OR
        deep_mask = _b(op, comparisons[j % len(comparisons)], deep_mask)
        j += 1
    mask = _b(BinOp.AND, mask, deep_mask)
    assert _depth(score) == _depth(mask) == ir.MAX_EXPR_DEPTH, (_depth(score), _depth(mask))
    return ir.Variant("deep", head_dim, dtype, mask=mask, score=score)


def _depth(e: ir.Expr) -> int:
    if isinstance(e, (ir.Num, ir.Name)):
        return 1
    if isinstance(e, ir.Unary):
        return 1 + _depth(e.operand)
    if isinstance(e, ir.Binary):
        return 1 + max(_depth(e.left), _depth(e.right))
    return 1 + max(_depth(a) for a in e.args)


def check_spec_both_ways(variant: ir.Variant, shape: Shape, *, seed: int, device: str = DEVICE):
    """The body of the whole-language tests: forward and backward of one
    spec against the float64 reference, each by the one tolerance rule.
    Returns both results (for records)."""
    forward = run_case(variant, shape, seed=seed, device=device)
    assert_ok(forward)
    backward = run_grad_case(variant, shape, seed=seed + 1, device=device)
    assert_ok(backward)
    return forward, backward
