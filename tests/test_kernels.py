"""Generated forward kernels against the float64 dense reference (CPU interpreter).

Every check goes through `flashgen.verify.tolerance`: FlashAttention's rule,
kernel error at most 2x that of a dense same-dtype implementation plus a
floor of a few ulps.  Shapes stay small because the Triton interpreter runs
each program instance in numpy.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashgen import ir
from flashgen.emit import render_module
from flashgen.verify import Shape, torch_dtype
from kernel_utils import (
    DEVICE,
    assert_ok,
    build,
    example_variants,
    interpretable,
    assert_tanh_accurate,
    make_variant,
    run_case,
    runtime_inputs,
    run_grad_case,
    kernel_inputs,
    shrink_masks,
)
from strategies import variants

# Every test here runs generated kernels under the Triton interpreter.
pytestmark = pytest.mark.kernels

BLOCKS = [(16, 16), (16, 32), (32, 16), (32, 32), (64, 32)]


@pytest.mark.parametrize("variant", example_variants(), ids=lambda v: v.name)
@pytest.mark.parametrize(
    "shape",
    [
        Shape(1, 2, 1, 113, 113),
        Shape(2, 2, 2, 17, 203),
        Shape(1, 3, 1, 127, 33),
        Shape(1, 1, 1, 1, 65),
        # Diagonal 1 and 15 positions off the 16-wide tiles.
        Shape(1, 1, 1, 113, 130),
        Shape(1, 2, 2, 61, 46),
    ],
    ids=str,
)
def test_examples(variant, shape):
    variant = interpretable(variant)
    for v in (variant, shrink_masks(variant)):
        assert_ok(run_case(v, shape, seed=shape.n_keys))
        assert_ok(run_case(v, shape, seed=shape.n_keys, block_m=16, block_n=16))


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    variant=variants(),
    batch=st.integers(1, 2),
    kv_heads=st.integers(1, 2),
    group=st.sampled_from((1, 2)),
    # Hypothesis draws the first values most often: multi-tile lengths first.
    n_queries=st.sampled_from((47, 113, 17, 97, 31, 160, 64, 5, 2, 1)),
    n_keys=st.sampled_from((61, 101, 33, 203, 29, 127, 64, 16, 3, 1)),
    blocks=st.sampled_from(BLOCKS),
    seed=st.integers(0, 2**16),
)
def test_random_specs(variant, batch, kv_heads, group, n_queries, n_keys, blocks, seed):
    shape = Shape(batch, kv_heads * group, kv_heads, n_queries, n_keys)
    block_m, block_n = blocks
    assert_ok(run_case(variant, shape, seed=seed, block_m=block_m, block_n=block_n))


@pytest.mark.parametrize("dtype", [ir.DType.FP32, ir.DType.FP16])
@pytest.mark.parametrize(
    "mask,shape",
    [
        # Bottom-right with Nq > Nk: the first Nq - Nk rows see nothing.
        ("causal", Shape(1, 2, 1, 77, 20)),
        # Top-left prefix(0)-like: rows that see nothing in the middle.
        ("window(3) & q % 10 > 4", Shape(1, 1, 1, 50, 50)),
        # Whole heads masked.
        ("h % 2 == 1 & causal", Shape(2, 4, 2, 33, 40)),
        ("!full", Shape(1, 1, 1, 20, 20)),
    ],
)
def test_fully_masked_rows(mask, shape, dtype):
    variant = make_variant(mask, dtype=dtype)
    module = build(variant)
    q = torch.randn(shape.batch, shape.heads, shape.n_queries, 32, device=DEVICE)
    q = q.to(torch_dtype(variant.dtype))
    k = torch.randn(shape.batch, shape.kv_heads, shape.n_keys, 32, device=DEVICE)
    k = k.to(q.dtype)
    v = torch.randn_like(k)
    o, lse = module.attention(q, k, v, return_lse=True)
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    from flashgen.reference import mask_matrix

    sees_nothing = ~mask_matrix(variant, shape.n_queries, shape.n_keys, shape.heads).any(-1)
    o, lse = o.cpu(), lse.cpu()
    assert sees_nothing.any(), "the case must contain fully masked rows"
    rows = sees_nothing.expand(shape.batch, -1, -1)
    assert torch.all(o[rows] == 0)
    assert torch.all(lse[rows] == float("-inf"))
    assert_ok(run_case(variant, shape, seed=1, block_m=16, block_n=16))


@pytest.mark.parametrize("n_queries,n_keys", [(1, 1), (1, 97), (97, 1), (1, 2), (2, 1)])
@pytest.mark.parametrize("mask", ["full", "causal", "window(4, 2)"])
@pytest.mark.parametrize("align", ["bottom_right", "top_left"])
def test_single_query_or_key(n_queries, n_keys, mask, align):
    variant = make_variant(mask, dtype=ir.DType.FP16, align=align)
    assert_ok(run_case(variant, Shape(2, 2, 1, n_queries, n_keys), seed=n_keys))


@pytest.mark.parametrize(
    "mask",
    [
        "q div 8 == k div 8",  # a power of two: shifts
        "(q - k) % 4 == 1 | k div 2 == q div 2",
        "q div 3 == k div 3",  # `_floor_div`
        "(q - k) % 5 == 2",
    ],
)
def test_floor_division_of_negative_positions(mask):
    """Bottom-right alignment with Nq > Nk puts the first queries at negative
    positions and q - k is negative below the diagonal: floor division and
    modulo must round toward -inf there, as the reference's do, both as
    shifts (powers of two) and through `_floor_div`."""
    variant = make_variant(mask, align="bottom_right")
    assert_ok(run_case(variant, Shape(1, 2, 1, 45, 19), seed=5))
    assert_ok(run_grad_case(variant, Shape(1, 2, 1, 45, 19), seed=6))


@pytest.mark.parametrize(
    "mask",
    [
        "causal & (k < 8 | k >= q - 24)",  # sink keys beside a sliding window
        "k < 20 | window(10)",
        "k < 16 | k > q + 40",
    ],
)
@pytest.mark.parametrize("align", ["bottom_right", "top_left"])
def test_masked_tiles_between_two_interiors_walk_only_the_key_spans(mask, align):
    """Decision 114: between a mask's two key interiors the forward and the dQ
    loops walk only the tiles of its two key spans (`key_spans`); outputs and
    gradients against the reference, Nq != Nk, lengths that cross the tiles."""
    variant = make_variant(mask, dtype=ir.DType.FP16, align=align)
    assert "range(gap2_lo, gap2_hi, BLOCK_N)" in render_module(variant, None)
    shape = Shape(1, 2, 1, 157, 131)
    assert_ok(run_case(variant, shape, seed=11))
    assert_ok(run_grad_case(variant, shape, seed=12))


@pytest.mark.parametrize("threshold", [0.0, 8.0])
@pytest.mark.parametrize("dtype", [ir.DType.FP32, ir.DType.FP16])
@pytest.mark.parametrize("score", [None, "softcap(s, 30.0)", "s + alibi"])
def test_large_scores(threshold, dtype, score):
    """Scale 10 and inputs x5: scores in the thousands, no overflow, no NaN.

    In fp16 the ordinary implementation's scores are rounded to fp16 (an ulp
    of 1-2 at these magnitudes), so the usual bound is loose; the kernel,
    which multiplies fp16 inputs exactly and accumulates in fp32, is also
    held to what it must reach: o within an fp16 ulp of max |o| (its
    rounding) plus half an ulp of max |v| (P is rounded to fp16 for P V), and
    lse within 4 fp32 ulps of max |lse|."""
    from flashgen.reference import attention_ref

    variant = make_variant(
        "causal", score=score, dtype=dtype, rescale_threshold=threshold, scale=10.0
    )
    shape = Shape(1, 2, 2, 67, 90)
    result = run_case(variant, shape, seed=3, magnitude=5.0, block_m=16, block_n=16)
    assert_ok(result)
    if dtype is ir.DType.FP16:
        q, k, v, _ = kernel_inputs(variant, shape, 3, DEVICE, 5.0)
        o, lse = build(variant).forward(q, k, v, block_m=16, block_n=16)
        o_ref, lse_ref = attention_ref(variant, q.double(), k.double(), v.double())
        o_bound = 2.0**-10 * o_ref.abs().max() + 2.0**-11 * v.double().abs().max()
        assert (o.double() - o_ref).abs().max() <= o_bound
        lse_bound = 4 * 2.0**-23 * lse_ref.abs().max()
        assert (lse.double() - lse_ref).abs().max() <= lse_bound


@pytest.mark.parametrize("threshold", [4.0, 8.0, 15.0])
def test_rescale_threshold_bounds_p_in_fp16(threshold):
    """Scores that climb along the keys move the row max by ~4.6 log2 units
    per 16-key tile.  The reference max must follow within the threshold, or
    p = 2^(s - m) overflows fp16 in the P @ V product."""
    variant = make_variant(
        "causal", score="s + 0.2 * k", dtype=ir.DType.FP16, rescale_threshold=threshold
    )
    result = run_case(variant, Shape(1, 1, 1, 40, 300), seed=5, block_m=16, block_n=16)
    assert_ok(result)


def test_rescale_threshold_changes_only_rounding():
    base = make_variant("causal", score="softcap(s, 20.0)", head_dim=40)
    lazy = dataclasses.replace(base, rescale_threshold=8.0)
    q, k, v = (torch.randn(1, 2, 150, 40, device=DEVICE) * 3 for _ in range(3))
    o0, lse0 = build(base).forward(q, k, v, block_m=16, block_n=16)
    o1, lse1 = build(lazy).forward(q, k, v, block_m=16, block_n=16)
    torch.testing.assert_close(o0, o1, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse0, lse1, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_gqa_and_mqa_read_the_right_kv_head(kv_heads):
    variant = make_variant("causal", score="s + alibi", dtype=ir.DType.FP16)
    assert_ok(run_case(variant, Shape(2, 4, kv_heads, 45, 70), seed=kv_heads))


def test_any_strides():
    variant = make_variant("causal & window(20)", dtype=ir.DType.FP32, head_dim=40)
    module = build(variant)
    # (B, N, H, D) memory layout viewed as (B, H, N, D), and a sliced tensor.
    q = torch.randn(2, 37, 3, 40, device=DEVICE).transpose(1, 2)
    k = torch.randn(2, 3, 80, 50, device=DEVICE)[..., 5:45]
    v = torch.randn(2, 90, 3, 40, device=DEVICE).transpose(1, 2)[:, :, :80]
    o = module.attention(q, k, v)
    o_ref = module.attention(q.contiguous(), k.contiguous(), v.contiguous())
    torch.testing.assert_close(o, o_ref, rtol=0, atol=0)
    from flashgen.verify import check_forward

    assert check_forward(variant, module, q, k, v).ok  # the strided inputs, by the usual rule


@pytest.mark.parametrize("variant", example_variants(), ids=lambda v: v.name)
def test_tma_path_matches_pointer_path(variant, monkeypatch):
    """TMA descriptor loads (sm90+, here the interpreter) and pointer loads
    read the same values, zeros past the last row and in the head-dim padding,
    so forward and backward agree exactly; a padded head dim and ragged,
    unequal lengths with GQA exercise both.

    The rows are 40 wide in storage 48 wide whose last 8 columns are NaN:
    neither path may read past a row's end.  (Storage 48 wide also makes every
    stride a multiple of 16 elements, which Triton 3.5's interpreter wants of
    a descriptor: it checks the strides in elements where the GPU, and 3.6's
    interpreter, want 16 bytes.)"""
    variant = dataclasses.replace(shrink_masks(interpretable(variant)), head_dim=40)
    if variant.v_head_dim is not None:  # MLA: v and dO 24 wide (tiles of 32)
        variant = dataclasses.replace(variant, v_head_dim=24)
    module = build(variant)
    gen = torch.Generator().manual_seed(7)
    dtype = torch_dtype(variant.dtype)

    def rows(heads: int, n: int, width: int = 40) -> torch.Tensor:
        storage = torch.full((1, heads, n, 48), float("nan"), dtype=dtype, device=DEVICE)
        storage[..., :width] = torch.randn(1, heads, n, width, generator=gen).to(dtype)
        return storage[..., :width]

    q, do = rows(4, 45), rows(4, 45, variant.v_dim)
    k, v = rows(2, 77), rows(2, 77, variant.v_dim)
    launch = dict(block_m=16, block_n=32)
    if DEVICE == "cuda":  # compiled code may round differently: judge each path
        for tma in (False, True):
            assert_ok(run_case(variant, Shape(1, 4, 2, 45, 77), tma=tma, **launch))
            monkeypatch.setattr(module, "GPU_BWD_TMA", tma)  # the backward's default
            assert_ok(run_grad_case(variant, Shape(1, 4, 2, 45, 77)))
        return
    launch.update(runtime_inputs(variant, Shape(1, 4, 2, 45, 77), DEVICE, gen) or {})
    o, lse = module.forward(q, k, v, tma=False, **launch)
    o_tma, lse_tma = module.forward(q, k, v, tma=True, **launch)
    assert torch.equal(o, o_tma) and torch.equal(lse, lse_tma)
    grads = module.backward(q, k, v, o, lse, do, tma=False, **launch)
    grads_tma = module.backward(q, k, v, o, lse, do, tma=True, **launch)
    for g, g_tma in zip(grads, grads_tma):
        assert torch.equal(g, g_tma)


def test_tma_needs_aligned_strides(monkeypatch):
    """tma=True refuses rows that are not 16-byte aligned.  Automatic mode
    with TMA as the default then loads through pointers: on a GPU that is the
    fallback; the interpreter's automatic mode never takes TMA."""
    module = build(make_variant("causal", dtype=ir.DType.FP16, head_dim=40))
    monkeypatch.setattr(module, "GPU_TMA", True)
    q = torch.randn(1, 1, 20, 40, device=DEVICE, dtype=torch.float16)
    k = torch.randn(1, 1, 20, 41, device=DEVICE, dtype=torch.float16)[..., :40]  # 82-byte rows
    with pytest.raises(ValueError, match="tma=True needs"):
        module.forward(q, k, k, tma=True)
    o, _ = module.forward(q, k, k)
    o_ref, _ = module.forward(q, k.contiguous(), k.contiguous(), tma=False)
    assert torch.equal(o, o_ref)


def test_empty_inputs():
    module = build(make_variant("causal"))
    q = torch.randn(1, 2, 0, 32, device=DEVICE)
    o, lse = module.attention(q, q, q, return_lse=True)
    assert o.shape == (1, 2, 0, 32) and lse.shape == (1, 2, 0)
    k = torch.randn(1, 2, 0, 32, device=DEVICE)
    q = torch.randn(1, 2, 5, 32, device=DEVICE)
    o, lse = module.attention(q, k, k, return_lse=True)
    assert torch.all(o == 0) and torch.all(lse == float("-inf"))


def test_explicit_scale_overrides_spec():
    variant = make_variant("causal", scale=0.5)
    assert_ok(run_case(variant, Shape(1, 1, 1, 30, 30), scale=0.05))
    assert build(variant).DEFAULT_SCALE == 0.5


@pytest.mark.parametrize(
    "q,k,v,error,match",
    [
        ("f64", "ok", "ok", TypeError, "q has dtype torch.float64"),
        ("ok", "ok", "list", TypeError, "v must be a torch.Tensor"),
        ("3d", "ok", "ok", ValueError, "q must have 4 dimensions"),
        ("ok", "d16", "d16", ValueError, "k has head_dim 16"),
        ("ok", "short", "ok", ValueError, "k and v must have the same shape"),
        ("ok", "3heads", "3heads", ValueError, "k has 3 heads"),
        ("ok", "batch3", "batch3", ValueError, "k has batch size 3"),
    ],
)
def test_bad_inputs_get_named_errors(q, k, v, error, match):
    module = build(make_variant("causal"))
    shapes = {
        "ok": (2, 4, 8, 32),
        "3d": (4, 8, 32),
        "d16": (2, 4, 8, 16),
        "short": (2, 4, 7, 32),
        "3heads": (2, 3, 8, 32),
        "batch3": (3, 4, 8, 32),
    }
    make = {name: (lambda s=s: torch.randn(*s, device=DEVICE)) for name, s in shapes.items()}
    make["f64"] = lambda: torch.randn(2, 4, 8, 32, dtype=torch.float64, device=DEVICE)
    make["list"] = lambda: [1, 2]
    with pytest.raises(error, match=match):
        module.attention(make[q](), make[k](), make[v]())


def test_bad_scale_and_blocks():
    module = build(make_variant("causal"))
    x = torch.randn(1, 1, 8, 32, device=DEVICE)
    with pytest.raises(TypeError, match="scale"):
        module.attention(x, x, x, scale="0.1")
    with pytest.raises(ValueError, match="scale must be finite"):
        module.attention(x, x, x, scale=float("nan"))
    with pytest.raises(ValueError, match="block_m"):
        module.forward(x, x, x, block_m=24)


def test_tanh_is_accurate():
    """softcap and tanh compute tanh with exp2 (and, for float32 modules, a
    polynomial near 0): its error is part of every softcap kernel's budget."""
    assert_tanh_accurate()


@pytest.mark.parametrize(
    "name,bad,error,match",
    [
        ("o", lambda o: o[:, :, :4], ValueError, r"o must have shape \(2, 4, 8, 32\)"),
        ("o", lambda o: [1], TypeError, "o must be a torch.Tensor"),
        ("lse", lambda lse: lse[:, :1], ValueError, r"lse must have shape \(2, 4, 8\)"),
        ("lse", lambda lse: lse.half(), TypeError, "lse has dtype torch.float16"),
        ("do", lambda do: do[..., :16], ValueError, "do must have shape"),
        ("do", lambda do: do.double(), TypeError, "do has dtype torch.float64"),
        ("dlse", lambda lse: lse[:, :, :3], ValueError, "dlse must have shape"),
    ],
)
def test_bad_backward_inputs_get_named_errors(name, bad, error, match):
    """backward() checks its own tensors: the kernels index o, lse, do and
    dlse by q's shape, so a wrong one would be read out of bounds."""
    module = build(make_variant("causal"))
    q = torch.randn(2, 4, 8, 32, device=DEVICE)
    o, lse = module.forward(q, q, q)
    args = dict(o=o, lse=lse, do=torch.randn_like(o), dlse=lse.clone())
    args[name] = bad(args[name])
    with pytest.raises(error, match=match):
        module.backward(q, q, q, args["o"], args["lse"], args["do"], args["dlse"])


def test_backward_takes_any_strides():
    """q, k, v, o and dO laid out as (B, N, H, D) and viewed as (B, H, N, D),
    k and v sliced, with GQA: the kernels read every tensor through its own
    strides (last stride 1, so nothing is copied), and the gradients equal,
    bit for bit, those of contiguous copies.  Through autograd too."""
    module = build(make_variant("causal & window(9)", score="s + alibi"))
    gen = torch.Generator().manual_seed(3)

    def bnhd(heads, n, d=32):
        return torch.randn(2, n, heads, d, generator=gen).to(DEVICE).transpose(1, 2)

    q, do = bnhd(4, 37), bnhd(4, 37)
    k = torch.randn(2, 2, 50, 48, generator=gen).to(DEVICE)[..., 8:40]
    v = bnhd(2, 60)[:, :, 5:55]
    o = torch.empty(2, 37, 4, 32, device=DEVICE).transpose(1, 2)
    o_c, lse = module.forward(q.contiguous(), k.contiguous(), v.contiguous())
    o.copy_(o_c)
    assert not any(x.is_contiguous() for x in (q, k, v, o, do))
    contiguous = [x.contiguous() for x in (q, k, v, o)]
    want = module.backward(*contiguous, lse, do.contiguous())
    for got, expected in zip(module.backward(q, k, v, o, lse, do), want):
        assert torch.equal(got, expected)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    grads = torch.autograd.grad(module.attention(*leaves), leaves, do)
    for got, expected in zip(grads, want):
        assert torch.equal(got, expected)


def test_backward_takes_strided_lse_and_do():
    """A log-sum-exp or dO laid out differently (here transposed copies) gives
    the same gradients: backward() does not assume their strides."""
    module = build(make_variant("causal & window(5)"))
    gen = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 2, 16, 32, generator=gen).to(DEVICE) for _ in range(4))
    o, lse = module.forward(q, k, v)
    want = module.backward(q, k, v, o, lse, do)
    lse_t = lse.transpose(1, 2).contiguous().transpose(1, 2)
    do_t = do.transpose(2, 3).contiguous().transpose(2, 3)
    assert not lse_t.is_contiguous() and not do_t.is_contiguous()
    for got, expected in zip(module.backward(q, k, v, o, lse_t, do_t), want):
        assert torch.equal(got, expected)


class _Perturbed:
    """A module whose outputs (forward) or gradients (attention) are off by
    a relative `eps`: a stand-in for a kernel with a subtle bug."""

    def __init__(self, module, eps: float):
        self.module, self.eps = module, eps

    def forward(self, *args, **kwargs):
        o, lse = self.module.forward(*args, **kwargs)
        return o * (1 + self.eps), lse

    def attention(self, q, k, v, **kwargs):
        eps = self.eps

        class Scale(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.clone()

            @staticmethod
            def backward(ctx, g):
                return g * (1 + eps)

        return self.module.attention(Scale.apply(q), k, v, **kwargs)


@pytest.mark.parametrize("dtype", [ir.DType.FP32, ir.DType.FP16])
def test_the_checks_reject_wrong_kernels(dtype):
    """Negative controls for `verify`: a mask off by the diagonal fails, and
    so do outputs or dq off by 2^-13 relative in fp32 (far below an fp16
    rounding: TF32 products or a 16-bit P would show more) or 2^-7 in fp16
    (a few fp16 roundings); the kernels themselves pass."""
    from flashgen.verify import check_backward, check_forward

    variant = make_variant("causal & window(8)", score="s + alibi", dtype=dtype)
    shape = Shape(1, 2, 1, 40, 40)
    q, k, v, gen = kernel_inputs(variant, shape, 0, DEVICE, 1.0)
    module = build(variant)
    assert check_forward(variant, module, q, k, v).ok
    assert check_backward(variant, module, q, k, v, generator=gen).ok
    strict = build(dataclasses.replace(variant, mask=make_variant("k < q & window(8)").mask))
    assert not check_forward(variant, strict, q, k, v).ok
    wrong = _Perturbed(module, 2.0**-13 if dtype is ir.DType.FP32 else 2.0**-7)
    assert not check_forward(variant, wrong, q, k, v).ok
    q, k, v, gen = kernel_inputs(variant, shape, 0, DEVICE, 1.0)
    assert not check_backward(variant, wrong, q, k, v, generator=gen).ok


def _no_launches(monkeypatch, module) -> list:
    """Records every kernel launch of `module`: the checks must come first."""
    launches = []
    monkeypatch.setattr(module, "_launch", lambda *a, **k: launches.append(a[0]))
    return launches


@pytest.mark.parametrize("which", ["q", "k"])
def test_sequences_beyond_the_limit_are_refused(which, monkeypatch):
    """Nq or Nk past ir.MAX_SEQ_LEN: a ValueError naming the tensor and the
    limit, from forward(), backward() and attention(), before any launch.
    The long tensor is an expanded view: nothing of its size is allocated."""
    module = build(make_variant("causal"))
    assert module.MAX_SEQ_LEN == ir.MAX_SEQ_LEN and module.MAX_HEADS == ir.MAX_HEADS
    launches = _no_launches(monkeypatch, module)
    long = torch.empty(1, 1, 1, 32, device=DEVICE).expand(1, 1, ir.MAX_SEQ_LEN + 1, 32)
    short = torch.randn(1, 1, 8, 32, device=DEVICE)
    q, k = (long, short) if which == "q" else (short, long)
    match = f"{which} has sequence length {ir.MAX_SEQ_LEN + 1}.*MAX_SEQ_LEN = {ir.MAX_SEQ_LEN}"
    with pytest.raises(ValueError, match=match):
        module.forward(q, k, k)
    with pytest.raises(ValueError, match=match):
        module.attention(q, k, k)
    o = torch.empty(q.shape, device=DEVICE)
    lse = torch.empty(q.shape[:3], device=DEVICE)
    with pytest.raises(ValueError, match=match):
        module.backward(q, k, k, o, lse, o)
    assert not launches


def test_sequences_at_the_limit_pass_the_check():
    module = build(make_variant("causal"))
    at_limit = torch.empty(1, 1, 1, 32, device=DEVICE).expand(1, 1, ir.MAX_SEQ_LEN, 32)
    module._check_inputs(at_limit, at_limit, at_limit)  # no error


def test_too_many_heads_are_refused(monkeypatch):
    module = build(make_variant("causal"))
    launches = _no_launches(monkeypatch, module)
    q = torch.empty(1, 1, 4, 32, device=DEVICE).expand(1, ir.MAX_HEADS + 1, 4, 32)
    k = torch.randn(1, 1, 4, 32, device=DEVICE)
    match = f"q has {ir.MAX_HEADS + 1} heads.*MAX_HEADS = {ir.MAX_HEADS}"
    for call in (module.forward, module.attention):
        with pytest.raises(ValueError, match=match):
            call(q, k, k)
    with pytest.raises(ValueError, match=match):
        module.backward(q, k, k, q, torch.empty(q.shape[:3], device=DEVICE), q)
    assert not launches


@pytest.mark.parametrize("scale", [1e300, -0.5, 0.0, 1e-40, float("inf"), float("nan"), 3e38])
def test_scales_outside_float32_are_refused(scale, monkeypatch):
    """scale * log2(e) is a float32 kernel argument: 1e300 gave NaN silently.
    A non-positive scale, or one whose log2(e) multiple is not a normal
    float32, is a ValueError naming `scale`, before any launch, everywhere."""
    module = build(make_variant("causal"))
    launches = _no_launches(monkeypatch, module)
    x = torch.randn(1, 1, 8, 32, device=DEVICE)
    with pytest.raises(ValueError, match="scale must"):
        module.forward(x, x, x, scale)
    with pytest.raises(ValueError, match="scale must"):
        module.attention(x, x, x, scale=scale)
    lse = torch.zeros(1, 1, 8, device=DEVICE)
    with pytest.raises(ValueError, match="scale must"):
        module.backward(x, x, x, x, lse, x, scale=scale)
    assert not launches


@pytest.mark.parametrize("scale", [1e-37, 1e30])
def test_extreme_accepted_scales_run(scale):
    """Accepted extremes: finite outputs that match the reference.  (Near the
    top of the range, scale * q.k itself overflows float32 for ordinary
    inputs, as any float32 kernel would.)"""
    assert_ok(run_case(make_variant("causal"), Shape(1, 1, 1, 9, 12), scale=scale))


def test_gluon_kernels_refuse_2_31_rows(monkeypatch):
    """The Gluon kernels address rows of the (B * H * N, D) view in int32:
    from 2^31 rows on, the call falls back to the Triton kernels.  (Checked
    with stand-in tensors on a pretended sm90 GPU with Triton 3.6, whose Gluon
    the modules take: no memory is needed.)"""
    import types

    module = build(make_variant("causal", dtype=ir.DType.FP16, head_dim=128))
    monkeypatch.setattr(module, "GLUON", True)
    monkeypatch.setattr(module, "_interpreting", lambda: False)
    monkeypatch.setattr(module, "_capability", lambda device: (9, 0))

    def fake(batch, heads, n):
        return types.SimpleNamespace(
            shape=(batch, heads, n, 128),
            device=types.SimpleNamespace(type="cuda"),
            is_contiguous=lambda: True,
            data_ptr=lambda: 0,
        )

    assert module._gluon_fits(128, fake(1, 127, 2**24), fake(1, 1, 2**24))
    assert not module._gluon_fits(128, fake(1, 128, 2**24), fake(1, 1, 2**24))
    assert not module._gluon_fits(128, fake(2, 64, 2**24), fake(2, 1, 2**24))


@pytest.mark.parametrize(
    "mask",
    [
        "window(1000000000)",
        "window(0, 1000000000)",
        "k <= q + 1000000000",
        "q - k >= -1000000000",
        "prefix(1000000000)",
        "chunk(536870912)",
        "causal | prefix(1000000000)",
    ],
)
@pytest.mark.parametrize("align", ["bottom_right", "top_left"])
@pytest.mark.parametrize(
    "shape", [Shape(1, 2, 1, 21, 21), Shape(1, 2, 1, 13, 40), Shape(1, 2, 1, 40, 13)], ids=str
)
def test_masks_near_the_int32_limit(mask, align, shape):
    """Masks whose constants come near ir.INT_MAGNITUDE_MAX: the tile bounds
    built from them (sentinels, chunk ends, interiors) stay in int32 and the
    kernels agree with the reference, forward and backward."""
    variant = make_variant(mask, align=align)
    assert_ok(run_case(variant, shape, seed=1, block_m=16, block_n=16))
    assert_ok(run_grad_case(variant, shape, seed=2))


def test_rows_stay_within_32_bit_offsets():
    """The Triton kernels address a head's rows with 32-bit offsets: a
    strided view whose rows pass 2^31 elements is copied contiguous, and a
    sequence too long even then is refused with the tensor's name."""
    module = build(make_variant("causal", head_dim=256))
    longest = (2**31 - 1) // 256 - 257
    fits = torch.empty((1, 1, longest, 256), device="meta")
    assert module._rows_in_int32("k", fits) is fits
    view = torch.empty((1, 2**19 + 300, 16, 256), device="meta").transpose(1, 2)
    copied = module._rows_in_int32("k", view)
    assert copied.is_contiguous() and not view.is_contiguous()
    too_long = torch.empty((1, 1, longest + 1, 256), device="meta")
    with pytest.raises(ValueError, match=r"k has 8388351 rows of head_dim 256.* 8388350 at"):
        module._rows_in_int32("k", too_long)
