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
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
from dataclasses import dataclass
from types import ModuleType

import torch

from flashgen import ir
from flashgen.reference import attention_ref, mask_matrix, scores

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

# Sequence lengths that catch off-by-one tiling: primes and 2^k +- 1.
ODD_LENGTHS = (1, 2, 3, 17, 31, 33, 63, 65, 113, 127, 203, 239)


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
    diff = torch.nan_to_num(diff, nan=math.inf)
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
) -> Check:
    """FlashAttention's rule: err(out) <= factor * err(ordinary) + floor.

    `score_noise` is the magnitude of fp32 rounding that every FlashAttention
    kernel carries and a dense implementation may not: max|s| over visible
    scores times the output's scale, plus for dq and dk the noise of the
    softmax-backward row term (`_row_term_noise`).  It is multiplied by
    SCORE_ULPS fp32 ulps: negligible for 16-bit inputs.
    """
    finite_ref = ref[torch.isfinite(ref)]
    scale = max(1.0, finite_ref.abs().max().item()) if finite_ref.numel() else 1.0
    floor = FLOOR_ULPS * torch.finfo(dtype).eps * scale
    floor += SCORE_ULPS * torch.finfo(torch.float32).eps * score_noise
    ordinary_error = max_error(ordinary, ref)
    return Check(
        what=what,
        error=max_error(out, ref),
        ordinary_error=ordinary_error,
        bound=factor * ordinary_error + floor,
        finite=not bool(torch.isnan(out).any()),
    )


@dataclass(frozen=True)
class CaseResult:
    shape: Shape
    dtype: torch.dtype
    checks: tuple[Check, ...]
    note: str = ""

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def check_forward(
    variant: ir.Variant,
    module: ModuleType,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    **launch: int,
) -> CaseResult:
    """Run the module's forward on (q, k, v) and judge o and lse."""
    o, lse = module.forward(q, k, v, scale, **launch)
    ref_o, ref_lse = attention_ref(variant, q.double(), k.double(), v.double(), scale=scale)
    ord_o, ord_lse = attention_ref(variant, q, k, v, scale=scale, dtype=q.dtype)
    shape = Shape(q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2])
    s_max = max_visible_score(variant, q, k, scale)
    v_max = v.abs().max().item() if v.numel() else 0.0
    checks = (
        tolerance(o.cpu(), ref_o.cpu(), ord_o.cpu(), q.dtype, what="o", score_noise=s_max * v_max),
        tolerance(lse.cpu(), ref_lse.cpu(), ord_lse.cpu(), q.dtype, what="lse", score_noise=s_max),
    )
    return CaseResult(shape, q.dtype, checks)


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
) -> CaseResult:
    """Gradients through `module.attention` against float64 autograd of the
    reference, with the 3x rule.  The loss weights o by a random dO and, when
    `with_lse`, the finite log-sum-exps by a random dlse; without, the module
    is called without return_lse, so its backward gets no dlse at all."""
    device = q.device
    o_shape = q.shape
    do = torch.randn(o_shape, generator=generator).to(device=device, dtype=q.dtype)
    dlse = torch.randn(o_shape[:3], generator=generator).to(device)

    def grads(fn, dtype):
        inputs = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
        o, lse = fn(*inputs)
        loss = (o * do.to(o.dtype)).sum()
        if with_lse:
            weights = torch.where(torch.isfinite(lse), dlse.to(lse.dtype), 0.0)
            loss = loss + (torch.where(torch.isfinite(lse), lse, 0.0) * weights).sum()
        loss.backward()
        return [x.grad for x in inputs]

    def kernel_fn(a, b, c):
        if with_lse:
            return module.attention(a, b, c, scale=scale, return_lse=True)
        return module.attention(a, b, c, scale=scale), None

    kernel = grads(kernel_fn, q.dtype)
    ref = grads(lambda a, b, c: attention_ref(variant, a, b, c, scale=scale), torch.float64)
    ordinary = grads(
        lambda a, b, c: attention_ref(variant, a, b, c, scale=scale, dtype=q.dtype), q.dtype
    )
    s_max = max_visible_score(variant, q, k, scale)
    row_noise = _row_term_noise(variant, q, k, v, do, scale)
    checks = tuple(
        tolerance(
            g.cpu(),
            r.cpu(),
            o.cpu(),
            q.dtype,
            what=name,
            factor=GRADIENT_FACTOR,
            score_noise=(s_max * r.abs().max().item() if r.numel() else 0.0) + noise,
        )
        for name, g, r, o, noise in zip(("dq", "dk", "dv"), kernel, ref, ordinary, row_noise)
    )
    shape = Shape(q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2])
    return CaseResult(shape, q.dtype, checks)


def _row_term_noise(variant, q, k, v, do, scale) -> tuple[float, float, float]:
    """Rounding noise of FlashAttention's softmax-backward row term, per
    gradient, in units of fp32 eps (see `tolerance`).

    The backward forms dS = P (dP - delta) with delta = rowsum(dO * O)
    computed separately from dP = dO V^T; the two sums of D products differ
    by about eps * sqrt(D) * |dO| |V| even where dP - delta is exactly 0
    (a single key, say).  That error enters dq through sum_j P_ij K_j (at
    most max|K|) and dk through sum_i P_ij Q_i (at most max|Q| times the
    largest column sum of P); dv does not see it.
    """
    if q.numel() == 0 or k.numel() == 0:
        return 0.0, 0.0, 0.0
    if scale is None:
        scale = variant.scale if variant.scale is not None else variant.head_dim**-0.5
    s = scores(variant, q.double(), k.double(), scale)
    visible = mask_matrix(variant, q.shape[2], k.shape[2], q.shape[1], device=s.device)
    s = torch.where(visible, s, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    group = q.shape[1] // k.shape[1]
    column = p.sum(dim=2).unflatten(1, (k.shape[1], group)).sum(dim=2)
    per_row = math.sqrt(q.shape[3]) * do.abs().max().item() * v.abs().max().item()
    dq = per_row * scale * k.abs().max().item()
    dk = per_row * scale * q.abs().max().item() * column.max().item()
    return dq, dk, 0.0


def max_visible_score(
    variant: ir.Variant, q: torch.Tensor, k: torch.Tensor, scale: float | None
) -> float:
    """max |s| over the (query, key) pairs the mask keeps, in float64."""
    if q.numel() == 0 or k.numel() == 0:
        return 0.0
    s = scores(variant, q.double(), k.double(), scale)
    visible = mask_matrix(variant, q.shape[2], k.shape[2], q.shape[1], device=s.device)
    s = torch.where(visible, s.abs(), torch.zeros_like(s))
    return s.max().item()


def random_inputs(
    shape: Shape,
    head_dim: int,
    dtype: torch.dtype,
    device: str | torch.device,
    *,
    generator: torch.Generator,
    magnitude: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    def draw(heads: int, n: int) -> torch.Tensor:
        x = torch.randn(shape.batch, heads, n, head_dim, generator=generator)
        return (x * magnitude).to(dtype=dtype, device=device)

    return (
        draw(shape.heads, shape.n_queries),
        draw(shape.kv_heads, shape.n_keys),
        draw(shape.kv_heads, shape.n_keys),
    )


def random_shapes(rng: random.Random, count: int, max_len: int) -> list[Shape]:
    """Odd lengths, Nq != Nk both ways, MHA/GQA/MQA."""
    lengths = [n for n in ODD_LENGTHS if n <= max_len] + [max_len]
    shapes = []
    for i in range(count):
        kv_heads = rng.choice((1, 2))
        heads = kv_heads * rng.choice((1, 2))
        nq, nk = rng.choice(lengths), rng.choice(lengths)
        if i == 0:
            nq, nk = max_len, max_len
        shapes.append(Shape(rng.choice((1, 2)), heads, kv_heads, nq, nk))
    return shapes


@dataclass(frozen=True)
class Report:
    name: str
    results: tuple[CaseResult, ...]
    note: str = ""

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def table(self) -> str:
        header = (
            f"{'shape':<34} {'dtype':<9} {'what':<4} {'error':>9} "
            f"{'ordinary':>9} {'bound':>9}  result"
        )
        lines = [f"verify {self.name}"]
        if self.note:
            lines.append(f"note: {self.note}")
        lines += [header, "-" * len(header)]
        for r in self.results:
            for c in r.checks:
                lines.append(
                    f"{str(r.shape):<34} {str(r.dtype).replace('torch.', ''):<9} "
                    f"{c.what:<4} {c.error:>9.2e} {c.ordinary_error:>9.2e} "
                    f"{c.bound:>9.2e}  {'ok' if c.ok else 'FAIL'}"
                )
        passed = sum(r.ok for r in self.results)
        verdict = "ok" if self.ok else "FAILED"
        lines.append(f"{verdict}: {passed} of {len(self.results)} cases within tolerance")
        return "\n".join(lines)


def verify(
    variant: ir.Variant,
    *,
    device: str = "cpu",
    examples: int = 8,
    seed: int = 0,
    max_len: int | None = None,
    module: ModuleType | None = None,
    gradients: bool = True,
) -> Report:
    """Property-test one variant's kernels against the dense reference.

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
    results = []
    for shape in random_shapes(rng, examples, max_len):
        q, k, v = random_inputs(shape, variant.head_dim, dtype, device, generator=generator)
        results.append(check_forward(variant, module, q, k, v))
        if gradients:
            results.append(check_backward(variant, module, q, k, v, generator=generator))
    return Report(variant.name, tuple(results), note)
