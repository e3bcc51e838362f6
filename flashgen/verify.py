"""Verification: a built module against the dense reference, on random shapes.

In: a checked `Variant` (and optionally its already-loaded module).  Out: a
`Report` with one row per case and a printable table.  This is the one place
that defines the tolerance rule; the test suite and `flashgen verify` both use
it.

The rule is FlashAttention's: compute the float64 reference, and an "ordinary"
dense implementation in the kernel's own dtype; the kernel passes when its max
error against the reference is at most 2x the ordinary implementation's (3x
for gradients), plus a small floor.  The floor has two parts, both below any real bug:

* one unit in the last place of the output's dtype at the output's scale,
  for cases where the ordinary implementation happens to be exact (Nk = 1)
  while the kernel still rounds its output once;
* a few fp32 ulps of the largest visible score, times the largest |v| (for o)
  or 1 (for the log-sum-exp).  Every implementation rounds scores to fp32 at
  least once, which moves o by up to about eps32 * |s| * |v|; for fp32 inputs
  the ordinary implementation's max error is that same rounding noise, and on
  small outputs (a single row, say) its max can come out several times lower
  than the kernel's by chance.  For dq and dk the same holds for the
  softmax-backward row term delta = rowsum(dO * O), which FlashAttention
  computes apart from dP (see `_row_term_noise`).  For 16-bit inputs these
  terms are negligible and the 2x / 3x rule alone decides.

Both parts scale with the score's slope f'(s) where it is steep
(`max_visible_score`, docs/decisions/040-steep-scores.md).  The backward
recomputes s = q.k in another summation order than the forward, so its P
differs from the forward's normalization by about f'(s) times fp32 rounding
of s; a dense implementation keeps P and has no such error.  For score = s,
softcap, scaling and biases the floor is what it was without the slope.
Where the slope changes fast, dq's and dk's floor also follows the
curvature f''(s) (`_curvature_noise`, docs/decisions/081-singular-slopes.md).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType

import torch

from flashgen import display, index_ranges, input_grads, ir
from flashgen.reference import (
    attention_ref,
    input_dtype,
    input_shape,
    mask_matrix,
    read_sums,
    score_curvature,
    scores,
)

_TORCH_DTYPES = {
    ir.DType.FP16: torch.float16,
    ir.DType.BF16: torch.bfloat16,
    ir.DType.FP32: torch.float32,
}

OUTPUT_FACTOR = 2.0
GRADIENT_FACTOR = 3.0  # softmax backward amplifies rounding more
# Units in the last place allowed on top of the factor (see module docstring).
FLOOR_ULPS = 1.0
SCORE_ULPS = 4.0
# fp32 ulps of the products' rounding where the score's slope changes fast
# (`_curvature_noise`, decision 081): a typical size, not a worst case.
CURVATURE_ULPS = 2.0

# Every block size flashgen launches (16 to 128 query rows or keys; the
# interpreter's 32) is a multiple of TILE_EDGE, so lengths at a multiple of it
# and one off either way fill a last tile, cut it one short, or spill one row
# or key into a new one: where off-by-one tiling bugs show.
TILE_EDGE = 16
# (H, Hkv) of random shapes: multi-head, multi-query and grouped-query.
HEAD_LAYOUTS = ((1, 1), (2, 2), (2, 1), (4, 2))


def torch_dtype(dtype: ir.DType) -> torch.dtype:
    return _TORCH_DTYPES[dtype]


@dataclass(frozen=True)
class Shape:
    batch: int
    heads: int
    kv_heads: int
    n_queries: int
    n_keys: int

    def __str__(self) -> str:
        return (
            f"B={self.batch} H={self.heads}/{self.kv_heads} "
            f"Nq={self.n_queries} Nk={self.n_keys}"
        )


@dataclass(frozen=True)
class Check:
    """One quantity (o or lse) of one case."""

    what: str
    error: float
    ordinary_error: float
    bound: float
    finite: bool

    @property
    def ok(self) -> bool:
        return self.finite and self.error <= self.bound


def max_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Max |x - ref|, treating equal infinities as exact and NaN as infinite."""
    x, ref = x.double(), ref.double()
    same_inf = torch.isinf(ref) & (x == ref)
    diff = torch.where(same_inf, torch.zeros_like(ref), (x - ref).abs())
    diff = torch.nan_to_num(diff, nan=math.inf, posinf=math.inf)
    return diff.max().item() if diff.numel() else 0.0


def tolerance(
    out: torch.Tensor,
    ref: torch.Tensor,
    ordinary: torch.Tensor,
    dtype: torch.dtype,
    *,
    what: str = "o",
    factor: float = OUTPUT_FACTOR,
    score_noise: float = 0.0,
    curvature_noise: float = 0.0,
) -> Check:
    """FlashAttention's rule: err(out) <= factor * err(ordinary) + floor.

    `score_noise` is the magnitude of fp32 rounding that every FlashAttention
    kernel carries and a dense implementation may not: max|s| over visible
    scores times the output's scale, plus for dq and dk the noise of the
    softmax-backward row term (`_row_term_noise`).  It is multiplied by
    SCORE_ULPS fp32 ulps: negligible for 16-bit inputs.  `curvature_noise`
    (`_curvature_noise`) is multiplied by CURVATURE_ULPS fp32 ulps.

    `out` must be finite wherever the reference is: where the ordinary
    implementation overflows (an exp in the score past the dtype's range),
    its error and so the bound are infinite, and an output that overflows
    too would pass the bound.
    """
    finite_ref = ref[torch.isfinite(ref)]
    scale = max(1.0, finite_ref.abs().max().item()) if finite_ref.numel() else 1.0
    floor = FLOOR_ULPS * torch.finfo(dtype).eps * scale
    floor += SCORE_ULPS * torch.finfo(torch.float32).eps * score_noise
    floor += CURVATURE_ULPS * torch.finfo(torch.float32).eps * curvature_noise
    ordinary_error = max_error(ordinary, ref)
    overflowed = torch.isinf(out) & torch.isfinite(ref)
    return Check(
        what=what,
        error=max_error(out, ref),
        ordinary_error=ordinary_error,
        bound=factor * ordinary_error + floor,
        finite=not bool(torch.isnan(out).any() or overflowed.any()),
    )


@dataclass(frozen=True)
class CaseResult:
    shape: Shape
    dtype: torch.dtype
    checks: tuple[Check, ...]
    note: str = ""
    rows: str = ""  # the query rows compared ("" for all), e.g. "rows 0-63"
    # A call the language refuses (an index that may leave its input, see
    # `flashgen.index_ranges`): the reference's ValueError, and what the
    # module raised for the same call ("" if it raised nothing).
    refused: str = ""
    module_refused: str = ""

    @property
    def ok(self) -> bool:
        if self.refused:
            return self.module_refused == self.refused
        return all(c.ok for c in self.checks)


def check_refusal(
    variant: ir.Variant,
    module: ModuleType,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    inputs: Mapping[str, torch.Tensor],
) -> CaseResult | None:
    """None where the language accepts the call; else the case of a refused
    call, ok when the module's forward refuses it with the reference's words."""
    sizes = dict(zip(("B", "H", "Nq"), q.shape[:3])) | {"Hkv": k.shape[1], "Nk": k.shape[2]}
    refused = index_ranges.out_of_range(variant, sizes)
    if refused is None:
        return None
    try:
        module.forward(q, k, v, **inputs)
        module_refused = ""
    except ValueError as e:
        module_refused = str(e)
    shape = Shape(q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2])
    return CaseResult(shape, q.dtype, (), refused=refused, module_refused=module_refused)


def check_forward(
    variant: ir.Variant,
    module: ModuleType,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    rows: Sequence[int] | None = None,
    inputs: Mapping[str, torch.Tensor] | None = None,
    **launch: int,
) -> CaseResult:
    """Run the module's forward on (q, k, v) and judge o and lse (on the
    query rows `rows` only, when given: the reference is computed for just
    those rows).  `inputs`: the variant's declared inputs by name."""
    inputs = dict(inputs or {})
    o, lse = module.forward(q, k, v, scale, **launch, **inputs)
    if rows is not None:
        index = torch.tensor(rows, dtype=torch.int64, device=o.device)
        o, lse = o[:, :, index], lse[:, :, index]
    ref_o, ref_lse = attention_ref(
        variant, q.double(), k.double(), v.double(), scale=scale, rows=rows, inputs=inputs
    )
    ord_o, ord_lse = attention_ref(
        variant, q, k, v, scale=scale, dtype=q.dtype, rows=rows, inputs=inputs
    )
    shape = Shape(q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2])
    s_max = max_visible_score(variant, q, k, scale, rows=rows, inputs=inputs)
    v_max = v.abs().max().item() if v.numel() else 0.0
    checks = (
        tolerance(o.cpu(), ref_o.cpu(), ord_o.cpu(), q.dtype, what="o", score_noise=s_max * v_max),
        tolerance(lse.cpu(), ref_lse.cpu(), ord_lse.cpu(), q.dtype, what="lse", score_noise=s_max),
    )
    return CaseResult(shape, q.dtype, checks, rows=_describe_rows(rows))


def check_backward(
    variant: ir.Variant,
    module: ModuleType,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    generator: torch.Generator | None = None,
    with_lse: bool = True,
    rows: Sequence[int] | None = None,
    inputs: Mapping[str, torch.Tensor] | None = None,
    launch: Mapping[str, object] | None = None,
) -> CaseResult:
    """Gradients through `module.attention` against float64 autograd of the
    reference, with the 3x rule.  The loss weights o by a random dO and, when
    `with_lse`, the finite log-sum-exps by a random dlse; without, the module
    is called without return_lse, so its backward gets no dlse at all.

    `launch`: keyword arguments of the module's forward() and backward()
    (block_m, block_n, num_warps, num_stages, tma).  The gradients then come
    from those two functions at these settings (the Triton kernels at a
    configuration `flashgen tune` measured), not from `module.attention`.

    With `rows`, the loss reads only those query rows: dO and dlse are zero
    on every other row, so dq is zero there and dk, dv depend on those rows
    alone, and the reference computes just them; all of dq, dk and dv are
    still compared in full."""
    device = q.device
    o_shape = (*q.shape[:3], v.shape[3])  # o and dO have v's last dimension
    do = torch.randn(o_shape, generator=generator).to(device=device, dtype=q.dtype)
    dlse = torch.randn(o_shape[:3], generator=generator).to(device)
    index = None if rows is None else torch.tensor(rows, dtype=torch.int64, device=device)
    if index is not None:
        do, dlse = do[:, :, index], dlse[:, :, index]

    inputs = dict(inputs or {})
    learnable = [i.name for i in variant.inputs if i.learnable and i.name in inputs]

    def grads(fn, dtype, all_rows=True):
        tensors = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
        # Learnable inputs keep their dtype (the reference reads them in its own).
        data = {**inputs, **{n: inputs[n].detach().clone().requires_grad_() for n in learnable}}
        o, lse = fn(*tensors, data)
        if index is not None and all_rows:  # the kernel's: every row, keep `rows`
            o, lse = o[:, :, index], None if lse is None else lse[:, :, index]
        loss = (o * do.to(o.dtype)).sum()
        if with_lse:
            weights = torch.where(torch.isfinite(lse), dlse.to(lse.dtype), 0.0)
            loss = loss + (torch.where(torch.isfinite(lse), lse, 0.0) * weights).sum()
        loss.backward()
        # A score without `s` leaves q and k out of the reference's graph:
        # their gradient is zero, not missing.
        leaves = tensors + [data[n] for n in learnable]
        return [torch.zeros_like(x) if x.grad is None else x.grad for x in leaves]

    def kernel_fn(a, b, c, data):
        if launch is not None:
            learned = [data[n] for n in learnable]
            fixed = {n: x for n, x in data.items() if n not in learnable}
            o, lse = _Launched.apply(
                module, scale, dict(launch), fixed, learnable, a, b, c, *learned
            )
            return o, lse if with_lse else None
        if with_lse:
            return module.attention(a, b, c, scale=scale, return_lse=True, **data)
        return module.attention(a, b, c, scale=scale, **data), None

    kernel = grads(kernel_fn, q.dtype)
    ref = grads(
        lambda a, b, c, data: attention_ref(variant, a, b, c, scale=scale, rows=rows, inputs=data),
        torch.float64,
        all_rows=False,
    )
    ordinary = grads(
        lambda a, b, c, data: attention_ref(
            variant, a, b, c, scale=scale, dtype=q.dtype, rows=rows, inputs=data
        ),
        q.dtype,
        all_rows=False,
    )
    facts = _score_facts(variant, q, k, scale, rows, inputs)
    s_max = _rounding_scale(facts)
    row_noise = _row_term_noise(q, k, v, do, facts)
    row_noise += _input_row_noise(variant, q, v, do, facts, rows, inputs, learnable)
    curved = _curvature_noise(q, k, v, do, dlse if with_lse else None, facts, index)
    curved += (0.0,) * len(learnable)
    names = ("dq", "dk", "dv", *(f"d{n}" for n in learnable))
    checks = tuple(
        tolerance(
            g.cpu(),
            r.cpu(),
            o.cpu(),
            q.dtype,
            what=name,
            factor=GRADIENT_FACTOR,
            score_noise=(s_max * r.abs().max().item() if r.numel() else 0.0) + noise,
            curvature_noise=curve,
        )
        for name, g, r, o, noise, curve in zip(names, kernel, ref, ordinary, row_noise, curved)
    )
    shape = Shape(q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2])
    return CaseResult(shape, q.dtype, checks, rows=_describe_rows(rows))


class _Launched(torch.autograd.Function):
    """A module's forward() and backward() at given launch settings, as one
    autograd operation of q, k, v and the learnable inputs (`names`, in the
    order backward() returns their gradients: the spec's)."""

    @staticmethod
    def forward(ctx, module, scale, launch, fixed, names, q, k, v, *learned):
        inputs = {**fixed, **dict(zip(names, learned))}
        o, lse = module.forward(q, k, v, scale, **launch, **inputs)
        ctx.save_for_backward(q, k, v, o, lse, *learned)
        ctx.call = (module, scale, launch, fixed, names)
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        module, scale, launch, fixed, names = ctx.call
        q, k, v, o, lse, *learned = ctx.saved_tensors
        inputs = {**fixed, **dict(zip(names, learned))}
        grads = module.backward(q, k, v, o, lse, do, dlse, scale, **launch, **inputs)
        return (None, None, None, None, None, *grads)


@dataclass(frozen=True)
class _ScoreFacts:
    """float64 scores of a case, once for every rounding floor: the score f,
    the products s, the slope f'(s), the curvature f''(s), the mask, and the
    call's scale (the variant's, else 1/sqrt(head_dim), where none is given)."""

    f: torch.Tensor
    s: torch.Tensor
    slope: torch.Tensor
    curvature: torch.Tensor
    visible: torch.Tensor
    scale: float

    @functools.cached_property
    def probs(self) -> torch.Tensor:
        """The float64 softmax of the visible scores (0 where a row sees no key)."""
        return torch.softmax(torch.where(self.visible, self.f, float("-inf")), dim=-1).nan_to_num(
            0.0
        )


def _score_facts(variant, q, k, scale, rows=None, inputs=None) -> _ScoreFacts | None:
    """None for an empty case (no rows, no keys)."""
    if q.numel() == 0 or k.numel() == 0 or (rows is not None and not len(rows)):
        return None
    f = scores(variant, q.double(), k.double(), scale, rows=rows, inputs=inputs)
    s, slope, curvature = score_curvature(
        variant, q.double(), k.double(), scale, rows=rows, inputs=inputs
    )
    visible = mask_matrix(
        variant, q.shape[2], k.shape[2], q.shape[1], device=f.device, rows=rows,
        batch=q.shape[0], inputs=inputs,
    )  # fmt: skip
    if scale is None:
        scale = variant.scale if variant.scale is not None else variant.head_dim**-0.5
    return _ScoreFacts(f, s, slope, curvature, visible, scale)


def _row_term_noise(q, k, v, do, facts: _ScoreFacts | None) -> tuple[float, float, float]:
    """Rounding noise of FlashAttention's softmax-backward row term, per
    gradient, in units of fp32 eps (see `tolerance`).

    The backward forms dS = P (dP - delta) with delta = rowsum(dO * O)
    computed separately from dP = dO V^T; the two sums of D products differ
    by about eps * sqrt(D) * |dO| |V| even where dP - delta is exactly 0
    (a single key, say).  That error reaches the products s through the
    score's slope f'(s) (1 for score = s): it enters dq through
    sum_j P_ij |f'_ij| K_j (at most max|K| times the largest such row sum)
    and dk through sum_i P_ij |f'_ij| Q_i (at most max|Q| times the largest
    column sum); dv does not see it.  `do` holds the compared rows only.
    """
    if facts is None:
        return 0.0, 0.0, 0.0
    scale = facts.scale
    p = facts.probs
    slope = torch.where(facts.visible, facts.slope.abs(), 0.0)
    weight = p * slope.nan_to_num(0.0, posinf=0.0)
    group = q.shape[1] // k.shape[1]
    column = weight.sum(dim=2).unflatten(1, (k.shape[1], group)).sum(dim=2)
    per_row = math.sqrt(v.shape[3]) * do.abs().max().item() * v.abs().max().item()
    dq = per_row * scale * k.abs().max().item() * weight.sum(dim=3).max().item()
    dk = per_row * scale * q.abs().max().item() * column.max().item()
    return dq, dk, 0.0


def _curvature_noise(
    q, k, v, do, dlse, facts: _ScoreFacts | None, index=None
) -> tuple[float, float, float]:
    """Rounding noise of the products s where the score's slope changes fast,
    per gradient, in units of fp32 eps (see `tolerance`; decision 081).

    Every implementation evaluates f'(s) at s rounded to fp32, and the dot
    product q.k rounds its partial sums, not just its result: where they
    cancel (|s| much smaller than its terms), s is off by about eps times
    the size of its terms, sqrt(sum_d (q_d k_d)^2) * scale, however small
    s itself is.  That moves dS_ij = g_ij f'(s_ij) (g = dL/d score) by
    g_ij f''(s_ij) times that, which reaches dq through K and dk through Q
    as in `_row_term_noise`.  For a score whose slope is singular (sqrt(|s|)
    at s near 0), one pair's rounding then decides both the kernel's and the
    ordinary implementation's max error, and the 3x rule compares two
    roundings of one number.  Where f'' is small (s, softcap, biases) the
    term is negligible.  `do` and `dlse` hold the compared rows only, `index`
    (None: all); dlse None: no log-sum-exp in the loss."""
    if facts is None:
        return 0.0, 0.0, 0.0
    curvature = torch.where(facts.visible, facts.curvature.abs(), 0.0)
    curvature = curvature.nan_to_num(0.0, posinf=0.0)  # no bound at a singular point
    if not bool((curvature > 0).any()):
        return 0.0, 0.0, 0.0
    scale = facts.scale
    group = q.shape[1] // k.shape[1]
    q64 = q.double() if index is None else q.double()[:, :, index]
    k64, v64 = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    # g = dL/d score: P (dP - delta + dlse), dP = dO V^T, delta = rowsum(P dP).
    p = facts.probs
    dp = do.double() @ v64.transpose(-1, -2)
    g = dp - (p * dp).sum(dim=-1, keepdim=True)
    if dlse is not None:
        g = g + dlse.double()[..., None]
    g = p * g
    terms = scale * (q64.square() @ k64.square().transpose(-1, -2)).sqrt()
    weight = g.abs() * curvature * terms
    column = weight.sum(dim=2).unflatten(1, (k.shape[1], group)).sum(dim=2)
    dq = scale * k.abs().max().item() * weight.sum(dim=3).max().item()
    dk = scale * q.abs().max().item() * column.max().item()
    return dq, dk, 0.0


def _input_row_noise(variant, q, v, do, facts, rows, inputs, names) -> tuple[float, ...]:
    """The row term's noise (see `_row_term_noise`) in the gradients of the
    learnable inputs `names`: dS_ij is off by up to P_ij times the row's
    noise, and reaches each element through |d score / d read| of every pair
    that reads it (`flashgen.input_grads`); the largest element's sum."""
    if facts is None or not names:
        return (0.0,) * len(names)
    p = facts.probs
    per_row = math.sqrt(v.shape[3]) * do.abs().max().item() * v.abs().max().item()
    noise = []
    learnable = input_grads.learnable_reads(variant)
    for name in names:
        total = torch.zeros((), dtype=torch.float64)
        for r in learnable:
            if r.read.input == name:
                sums = read_sums(
                    variant, r.read, r.derivative, facts.s, p, q.shape[2], rows=rows, inputs=inputs
                )  # fmt: skip
                total = total + sums.cpu()
        noise.append(per_row * total.max().item())
    return tuple(noise)


def max_visible_score(
    variant: ir.Variant,
    q: torch.Tensor,
    k: torch.Tensor,
    scale: float | None,
    rows: Sequence[int] | None = None,
    inputs: Mapping[str, torch.Tensor] | None = None,
) -> float:
    """The scale of fp32 rounding in the scores, over the (query, key) pairs
    the mask keeps, in float64 (of the query rows `rows`, when given): the
    largest of |f(s)| and |f'(s) s|.  Rounding the score f moves it by a few
    ulps of |f|; rounding the products s (which the backward recomputes, in
    another order than the forward) moves f by a few ulps of |s| times the
    slope f'(s).  For score = s the two are the same."""
    return _rounding_scale(_score_facts(variant, q, k, scale, rows, inputs))


def _rounding_scale(facts: _ScoreFacts | None) -> float:
    if facts is None:
        return 0.0
    # An infinite slope (sqrt at 0) leaves the gradient undefined there: no bound from it.
    sloped = (facts.slope * facts.s).abs().nan_to_num(0.0, posinf=0.0)
    scale_of = torch.maximum(facts.f.abs(), sloped)
    return torch.where(facts.visible, scale_of, torch.zeros_like(facts.f)).max().item()


def _zero_inputs(variant: ir.Variant, c: "_Candidate", device: str) -> dict[str, torch.Tensor]:
    sizes = {"B": 1, "H": c.heads, "Hkv": c.heads, "Nq": c.n_queries, "Nk": c.n_keys}
    return {
        i.name: torch.zeros(input_shape(i, sizes), dtype=input_dtype(i), device=device)
        for i in variant.inputs
    }


def random_runtime_inputs(
    variant: ir.Variant,
    shape: Shape,
    device: str | torch.device,
    *,
    generator: torch.Generator,
    mean_run: float = 1 / 0.15,
) -> dict[str, torch.Tensor]:
    """Random values of the variant's declared inputs for one case.  Reals are
    standard normal; integers run up from 0 along their last dimension in
    steps of 0 or 1 (a new value with probability 1 / mean_run), so that,
    read as document ids, they make documents of `mean_run` tokens on
    average (by default a few tokens to a few dozen, some crossing tile
    edges), and read as lengths they reach past short prefixes."""
    sizes = {
        "B": shape.batch, "H": shape.heads, "Hkv": shape.kv_heads,
        "Nq": shape.n_queries, "Nk": shape.n_keys,
    }  # fmt: skip
    out = {}
    for i in variant.inputs:
        dims = input_shape(i, sizes)
        if i.element.is_integer:
            steps = (torch.rand(dims, generator=generator) < 1 / mean_run).to(torch.int64)
            values = torch.cumsum(steps, dim=-1) if dims else steps
        else:
            values = torch.randn(dims, generator=generator)
        out[i.name] = values.to(dtype=input_dtype(i), device=device)
    return out


def random_inputs(
    shape: Shape,
    head_dim: int,
    dtype: torch.dtype,
    device: str | torch.device,
    *,
    generator: torch.Generator,
    magnitude: float = 1.0,
    v_head_dim: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k and v of `shape`; v's last dimension is `v_head_dim` (default head_dim)."""

    def draw(heads: int, n: int, dim: int = head_dim) -> torch.Tensor:
        x = torch.randn(shape.batch, heads, n, dim, generator=generator)
        return (x * magnitude).to(dtype=dtype, device=device)

    return (
        draw(shape.heads, shape.n_queries),
        draw(shape.kv_heads, shape.n_keys),
        draw(shape.kv_heads, shape.n_keys, v_head_dim or head_dim),
    )


def tile_edge_lengths(max_len: int) -> list[int]:
    """1, max_len, and each multiple of TILE_EDGE up to max_len with its two
    neighbours, sorted: the lengths where tiling goes wrong if it does."""
    lengths = {1, max_len}
    for m in range(TILE_EDGE, max_len + 2, TILE_EDGE):
        lengths |= {m - 1, m, m + 1}
    return sorted(n for n in lengths if 1 <= n <= max_len)


def random_shapes(rng: random.Random, count: int, max_len: int) -> list[Shape]:
    """`count` shapes with lengths from 1 to `max_len`, drawn from `rng` alone
    (Python's Mersenne Twister: the same shapes for the same seed on every
    machine).

    The first shapes are fixed edge cases, in this order, as many as `count`
    allows:

    1. Nq = Nk = max_len, the longest square;
    2. Nq < Nk = max_len, with Nq one off a multiple of TILE_EDGE (drawn);
    3. Nq = max_len > Nk, with Nk one off a multiple of TILE_EDGE (drawn);
    4. Nq = 1 against Nk = max_len: one query, a decoding step's shape;
    5. Nq = max_len against Nk = 1: one key (under a bottom-right causal
       mask, every row but the last fully masked).

    Every later shape draws Nq and Nk independently, each with probability
    1/2 uniformly from `tile_edge_lengths(max_len)` and otherwise uniformly
    from 1 to max_len.  Every shape draws its heads (H, Hkv) uniformly from
    HEAD_LAYOUTS and its batch from {1, 2}.  (When max_len is 1 every length
    is 1; when it is 2, the lengths one off a tile edge are 1.)
    """
    edges = tile_edge_lengths(max_len)
    off_by_one = [n for n in edges if n % TILE_EDGE and 1 < n < max_len] or [1]

    def draw() -> int:
        return rng.choice(edges) if rng.random() < 0.5 else rng.randint(1, max_len)

    shapes = []
    for i in range(count):
        heads, kv_heads = rng.choice(HEAD_LAYOUTS)
        batch = rng.choice((1, 2))
        if i == 0:
            nq, nk = max_len, max_len
        elif i == 1:
            nq, nk = rng.choice(off_by_one), max_len
        elif i == 2:
            nq, nk = max_len, rng.choice(off_by_one)
        elif i == 3:
            nq, nk = 1, max_len
        elif i == 4:
            nq, nk = max_len, 1
        else:
            nq, nk = draw(), draw()
        shapes.append(Shape(batch, heads, kv_heads, nq, nk))
    return shapes


# --------------------------------------------------------------------------- #
# Mask edges: shapes that reach every constant of the mask
# --------------------------------------------------------------------------- #
#
# Random short sequences never reach the edge of window(4095) or chunk(8192),
# so a kernel wrong there would pass.  Every integer literal of the mask is an
# edge: the window sizes, chunk sizes, prefix lengths and constants of
# comparisons (and of `%` or `div`).  A shape crosses an edge when, on the
# query rows it compares, the mask with that literal moved by +1 differs from
# the spec's mask, and so does the mask with it moved by -1: a kernel whose
# constant is off by one either way would give a different answer there.  A
# direction that changes nothing at any length tried (`causal & window(8, 5)`:
# the right bound 5 is hidden by causal) is not asked for.
#
# Lengths are built around each literal c: Nq and Nk from {m, 2m, |c| + 2m,
# 2|c| + 2m} (Nq also |c| + m) with a margin m of a few tiles, cheapest first.
# Bottom-right alignment puts the queries at the end of the keys, so a few
# queries with Nk = |c| + 2m reach position |c| + m cheaply; top-left needs
# Nq that long.  Only a band of rows around where the edge shows is compared
# (the reference is computed for those rows alone), so the cost is the
# kernel's, bounded by EDGE_BUDGET query-key pairs per shape.

# Margin past an edge: two tiles of the interpreter's 32 x 32 config, two of
# the GPU's widest 128.
EDGE_MARGIN = {"cpu": 64, "cuda": 256}
# Largest Nq * Nk (times H / 2 for head edges) of an edge shape.  The
# interpreter runs about 40k query-key pairs a second forward and backward:
# 2^17 is a few seconds per shape.
EDGE_BUDGET = {"cpu": 1 << 17, "cuda": 1 << 30}
# Largest Nq * Nk * H over which the mask alone is evaluated to find shapes.
MASK_SCAN_LIMIT = 1 << 25
# Head counts tried for a literal compared with h or H are capped here.
EDGE_MAX_HEADS = 64

_Path = tuple[object, ...]


@dataclass(frozen=True)
class Edge:
    """One integer literal of the mask: where it is, and how to name it."""

    name: str
    path: _Path
    value: int


# What each literal argument of a mask function is, for the report.
_ROLES = {
    ("window", 0): "left edge",
    ("window", 1): "right edge",
    ("chunk", 0): "boundaries",
    ("prefix", 0): "end",
}


def mask_edges(variant: ir.Variant) -> tuple[Edge, ...]:
    """Every integer literal of the mask, named by the atom it sits in:
    "window(128, 128) right edge 128", "(q - k) % 2 == 0 constant 2"."""
    from flashgen.printer import print_expr

    edges: list[Edge] = []

    def walk(e: ir.Expr, path: _Path, atom: ir.Expr | None) -> None:
        if isinstance(e, ir.Num):
            if isinstance(e.value, int) and not isinstance(e.value, bool):
                where = print_expr(atom) if atom is not None else print_expr(variant.mask)
                role = _ROLES.get((atom.fn, path[-1])) if isinstance(atom, ir.Call) else None
                literal = role if role and atom.args[path[-1]] is e else "constant"
                edges.append(Edge(f"{where} {literal} {e.value}", path, e.value))
            return
        if isinstance(e, ir.Call):
            inner = e if e.fn in ir.MASK_FUNCTIONS else atom
            for i, arg in enumerate(e.args):
                walk(arg, path + (i,), inner)
        elif isinstance(e, ir.Unary):
            walk(e.operand, path + ("operand",), atom)
        elif isinstance(e, ir.Binary):
            inner = e if e.op in ir.COMPARISONS else atom
            walk(e.left, path + ("left",), inner)
            walk(e.right, path + ("right",), inner)

    walk(variant.mask, (), None)
    return tuple(edges)


def _replace(e: ir.Expr, path: _Path, value: int) -> ir.Expr:
    if not path:
        return ir.Num(value)
    step, rest = path[0], path[1:]
    if isinstance(step, int):
        args = list(e.args)
        args[step] = _replace(args[step], rest, value)
        return dataclasses.replace(e, args=tuple(args))
    return dataclasses.replace(e, **{step: _replace(getattr(e, step), rest, value)})


@dataclass(frozen=True)
class _Candidate:
    n_queries: int
    n_keys: int
    heads: int

    @property
    def cost(self) -> int:
        return self.n_queries * self.n_keys * max(1, self.heads // 2)


def _candidates(edge: Edge, margin: int, head_edge: bool) -> list[_Candidate]:
    a = abs(edge.value)
    keys = {margin, 2 * margin, a + 2 * margin, 2 * a + 2 * margin}
    queries = keys | {a + margin}
    heads = {2} | ({min(a + 2, EDGE_MAX_HEADS)} if head_edge else set())
    found = {
        _Candidate(nq, nk, h)
        for nq in queries
        for nk in keys
        for h in heads
        if nq <= ir.MAX_SEQ_LEN and nk <= ir.MAX_SEQ_LEN
    }
    # Cheapest first; at equal cost Nq != Nk first.
    return sorted(found, key=lambda c: (c.cost, c.n_queries == c.n_keys, c.n_queries, c.heads))


def _moved_rows(
    variant: ir.Variant, edge: Edge, c: _Candidate, device: str
) -> dict[int, list[int] | None]:
    """For the literal moved by +1 and by -1: the query rows whose mask
    changes (None: the moved mask is not defined, e.g. chunk(0))."""
    chunk = max(1, (1 << 22) // max(1, c.n_keys * c.heads))
    moved = {}
    for delta in (1, -1):
        other = dataclasses.replace(
            variant, mask=_replace(variant.mask, edge.path, edge.value + delta)
        )
        rows: list[int] = []
        try:
            for start in range(0, c.n_queries, chunk):
                part = list(range(start, min(c.n_queries, start + chunk)))
                args = (c.n_queries, c.n_keys, c.heads)
                # Inputs all zero (one document, say): the mask's positional edges.
                data = dict(batch=1, inputs=_zero_inputs(variant, c, device))
                base = mask_matrix(variant, *args, device=device, rows=part, **data)
                changed = mask_matrix(other, *args, device=device, rows=part, **data) != base
                if changed.dim() == 4:  # a mask that reads runtime data: batch 1
                    changed = changed[0]
                changed = changed.any(dim=0)
                rows += [part[i] for i in changed.any(dim=1).nonzero().flatten().tolist()]
        except (RuntimeError, ValueError, ZeroDivisionError):  # e.g. division by zero
            moved[delta] = None
            continue
        moved[delta] = rows
    return moved


@dataclass(frozen=True)
class EdgePlan:
    """Shapes that cross the mask's edges, and the edges they cannot."""

    # (shape, query rows to compare, names of the edges it crosses)
    cases: tuple[tuple[Shape, tuple[int, ...], tuple[str, ...]], ...]
    unchecked: tuple[str, ...]  # "NAME (why)"
    no_effect: tuple[str, ...]


def plan_edges(variant: ir.Variant, device: str = "cpu") -> EdgePlan:
    """Pick, for every edge of the mask, the cheapest shape within
    EDGE_BUDGET[device] that crosses it (see the section comment)."""
    kind = "cpu" if device == "cpu" else "cuda"
    margin, budget = EDGE_MARGIN[kind], EDGE_BUDGET[kind]
    head_edge = ir.mentions(variant.mask, frozenset({"h", "H"}))
    # The mask alone is evaluated wherever the kernels run, or on the CPU
    # when planning for a GPU this machine lacks.
    scan = device if device != "cpu" and torch.cuda.is_available() else "cpu"
    chosen: dict[_Candidate, tuple[set[int], list[str]]] = {}
    unchecked, no_effect = [], []
    for edge in mask_edges(variant):
        scanned: list[tuple[_Candidate, dict[int, list[int] | None]]] = []
        for c in _candidates(edge, margin, head_edge):
            if c.n_queries * c.n_keys * c.heads > MASK_SCAN_LIMIT:
                break
            moved = _moved_rows(variant, edge, c, scan)
            scanned.append((c, moved))
            valid = [d for d, rows in moved.items() if rows is not None]
            if valid and all(moved[d] for d in valid) and (c in chosen or c.cost <= budget):
                break  # every direction shows: no larger shape can do better
        effective = {d for _, moved in scanned for d, rows in moved.items() if rows}
        covering = [(c, m) for c, m in scanned if all(m[d] for d in effective)]
        if not effective:
            no_effect.append(edge.name)
            continue
        usable = [(c, m) for c, m in covering if c in chosen] or [
            (c, m) for c, m in covering if c.cost <= budget
        ]
        if not usable:
            if covering:
                c = covering[0][0]
                why = (
                    f"needs Nq={c.n_queries} Nk={c.n_keys}, {c.cost} query-key pairs "
                    f"over the {kind} budget of {budget}"
                    + ("; use --device cuda" if kind == "cpu" else "")
                )
            else:
                why = f"no shape up to {MASK_SCAN_LIMIT} mask entries crosses it both ways"
            unchecked.append(f"{edge.name} ({why})")
            continue
        c, moved = usable[0]
        rows, names = chosen.setdefault(c, (set(), []))
        names.append(edge.name)
        changed = sorted({r for d in effective for r in moved[d]})
        for centre in (changed[0], changed[-1]):
            rows.update(range(max(0, centre - margin), min(c.n_queries, centre + margin)))
    cases = tuple(
        (Shape(1, c.heads, 1, c.n_queries, c.n_keys), tuple(sorted(rows)), tuple(names))
        for c, (rows, names) in chosen.items()
    )
    return EdgePlan(cases, tuple(unchecked), tuple(no_effect))


def _describe_rows(rows: Sequence[int] | None) -> str:
    """ "rows 0-63, 190-255" for sorted rows; "" for every row."""
    if rows is None:
        return ""
    runs: list[list[int]] = []
    for r in rows:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return "rows " + ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs)


# --------------------------------------------------------------------------- #
# Report
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class Report:
    """One variant's verification.

    `ok` needs every case within tolerance and, unless `accept_partial`,
    every mask edge crossed (`unchecked` empty): a spec whose edges were not
    all reached is not reported as verified.
    """

    name: str
    results: tuple[CaseResult, ...]
    note: str = ""
    # "SHAPE, ROWS: EDGE, EDGE" for each edge shape.
    crossed: tuple[str, ...] = ()
    unchecked: tuple[str, ...] = ()
    no_effect: tuple[str, ...] = ()
    accept_partial: bool = False

    @property
    def passed(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def complete(self) -> bool:
        return not self.unchecked

    @property
    def ok(self) -> bool:
        return self.passed and (self.complete or self.accept_partial)

    def table(self) -> str:
        """The report as text: a title, one row per checked quantity of
        each case (o and lse forward; dq, dk and dv backward; one row for a
        refused call), then the edges crossed and not, and the verdict."""
        columns = [
            display.Column("shape"),
            display.Column("dtype"),
            display.Column("what"),
            display.Column("error", "right"),
            display.Column("ordinary", "right"),
            display.Column("bound", "right"),
            display.Column("result"),
        ]
        rows = []
        for r in self.results:
            if r.refused:  # what the reference refused, and whether the module did alike
                module = "" if r.ok else f" (module: {r.module_refused or 'no error'})"
                verdict = f"{'ok' if r.ok else 'FAIL'}, refused: {r.refused}{module}"
                rows.append([str(r.shape), "", "call", "", "", "", verdict])
            for c in r.checks:
                result = ("ok" if c.ok else "FAIL") + (f"  ({r.rows})" if r.rows else "")
                dtype = str(r.dtype).replace("torch.", "")
                numbers = (f"{x:.2e}" for x in (c.error, c.ordinary_error, c.bound))
                rows.append([str(r.shape), dtype, c.what, *numbers, result])
        lines = [f"verify {self.name}"]
        if self.note:
            lines.append(f"note: {self.note}")
        lines.append(display.table(columns, rows))
        lines += [f"crossed: {line}" for line in self.crossed]
        lines += [f"not checked: {line}" for line in self.unchecked]
        lines += [f"no effect at the lengths tried: {line}" for line in self.no_effect]
        passed = sum(r.ok for r in self.results)
        counts = f"{passed} of {len(self.results)} cases within tolerance"
        refused = sum(bool(r.refused) for r in self.results)
        if refused:
            counts += f" ({refused} of them calls the language refuses, refused alike)"
        edges = _plural(len(self.unchecked), "mask edge")
        if not self.passed:
            verdict = f"FAILED: {counts}"
        elif self.complete:
            verdict = f"ok: {counts}"
            if self.crossed:
                verdict += ", every mask edge crossed"
        elif self.accept_partial:
            verdict = f"ok (partial): {counts}, {edges} not checked"
        else:
            verdict = f"INCOMPLETE: {counts}, but {edges} not checked"
        lines.append(verdict)
        return "\n".join(lines)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def verify(
    variant: ir.Variant,
    *,
    device: str = "cpu",
    examples: int = 8,
    seed: int = 0,
    max_len: int | None = None,
    module: ModuleType | None = None,
    gradients: bool = True,
    accept_partial: bool = False,
) -> Report:
    """Property-test one variant's kernels against the dense reference.

    Two kinds of cases, each checked forward and (with `gradients`) backward:
    the `examples` shapes of `random_shapes` for `seed` (edge cases first:
    Nq = Nk, Nq < Nk, Nq > Nk, one query, one key; then lengths near tile
    edges and anywhere) up to `max_len` (128 on the CPU, 2048 on the GPU),
    compared on every row; and one shape per group of mask
    edges (`plan_edges`): lengths chosen so that the compared rows see keys on
    both sides of every integer literal of the mask, compared on a band of
    rows around where each edge shows.  An edge that no shape within the
    device's budget crosses is listed as "not checked", and the report is
    then not ok (exit status 1 in the CLI) unless `accept_partial`.

    On the CPU the kernels run under the Triton interpreter, which cannot
    multiply bf16 matrices: a bf16 variant is then verified in fp16 (same
    mask, score and code paths) and the report says so.
    """
    note = ""
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        if variant.dtype is ir.DType.BF16:
            variant = dataclasses.replace(variant, dtype=ir.DType.FP16)
            note = "bf16 checked as fp16: the CPU interpreter has no bf16 dot product"
    elif not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch sees no CUDA device")
    if module is None:
        from flashgen.api import load_variant

        module = load_variant(variant)
    if max_len is None:
        max_len = 128 if device == "cpu" else 2048
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    dtype = torch_dtype(variant.dtype)
    plan = plan_edges(variant, device)
    cases = [(shape, None) for shape in random_shapes(rng, examples, max_len)]
    cases += [(shape, rows) for shape, rows, _ in plan.cases]
    results = []
    for shape, rows in cases:
        q, k, v = random_inputs(
            shape, variant.head_dim, dtype, device, generator=generator, v_head_dim=variant.v_dim
        )
        data = random_runtime_inputs(variant, shape, device, generator=generator)
        refusal = check_refusal(variant, module, q, k, v, data)
        if refusal is not None:
            results.append(refusal)
            continue
        results.append(check_forward(variant, module, q, k, v, rows=rows, inputs=data))
        if gradients:
            results.append(
                check_backward(
                    variant, module, q, k, v, generator=generator, rows=rows, inputs=data
                )
            )
    crossed = tuple(
        f"{shape}, {_describe_rows(rows)}: {', '.join(names)}" for shape, rows, names in plan.cases
    )
    return Report(
        variant.name,
        tuple(results),
        note,
        crossed=crossed,
        unchecked=plan.unchecked,
        no_effect=plan.no_effect,
        accept_partial=accept_partial,
    )
