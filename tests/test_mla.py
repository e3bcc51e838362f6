"""`v_head_dim` (DeepSeek's multi-head latent attention, decision 055): q and k
have head_dim D, v, o and dO have v_head_dim Dv.

Parse, check and print; the kernel choice (no Gluon kernel at Dv != D) and the
launch configuration of the wide latent; the module's argument checks; then,
in the kernels tier, forward and backward against the float64 reference by
the project's one rule (`flashgen.verify.tolerance`) at Dv < D and Dv > D
(padded and not), split-KV decoding, v passed as a view of k (the absorbed MLA
decode form: one latent cache, V its first Dv columns) and DeepSeek's 576/512.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from flashgen import ir
from flashgen.check import check
from flashgen.emit import render_module
from flashgen.kernel_choice import gluon_backward, gluon_forward
from flashgen.lower import lower
from flashgen.parse import parse
from flashgen.printer import print_variant
from flashgen.reference import attention_ref
from flashgen.verify import Shape, max_visible_score, tolerance
from kernel_utils import (
    DEVICE,
    assert_ok,
    build,
    example_variants,
    interpretable,
    make_variant,
    run_case,
    run_grad_case,
)
from test_limits import accepted, caret_under, rejected


def test_v_head_dim_defaults_to_head_dim_and_prints_only_when_set():
    plain = accepted("mask = causal")
    assert plain.v_head_dim is None and plain.v_dim == 64
    assert "v_head_dim" not in print_variant(plain)
    mla = accepted("v_head_dim = 32")
    assert (mla.head_dim, mla.v_head_dim, mla.v_dim) == (64, 32, 32)
    (again,), diagnostics = check([parse(print_variant(mla), "x.attn")[0]])
    assert diagnostics == [] and again == mla
    assert "    v_head_dim = 32\n" in print_variant(mla)


@pytest.mark.parametrize(
    "value, nearest",
    [("0", "16"), ("12", "16"), ("100", "96 or 104"), ("600", "576"), ("-8", "16")],
)
def test_bad_v_head_dims_are_diagnosed_with_the_head_dim_rule(value, nearest):
    message, rendered = rejected(f"v_head_dim = {value}")
    assert message == f"`v_head_dim` must be a multiple of 8 between 16 and 576, got {value}"
    assert f"nearest valid: {nearest}" in rendered
    assert caret_under(rendered) == value


def test_v_head_dim_must_be_an_integer_constant_set_once():
    message, rendered = rejected("v_head_dim = 1.5")
    assert message.startswith("`v_head_dim` must be an integer constant")
    assert caret_under(rendered) == "1.5"
    message, _ = rejected("v_head_dim = 32; v_head_dim = 48")
    assert message == "duplicate setting `v_head_dim`"


def test_mla_takes_the_triton_kernels():
    """The Gluon kernels' tiles assume one head dim: at Dv != D the module has
    none, and every call runs the Triton kernels."""
    mla = make_variant("causal", dtype=ir.DType.BF16, head_dim=128, v_head_dim=64)
    same = make_variant("causal", dtype=ir.DType.BF16, head_dim=128, v_head_dim=128)
    assert gluon_forward(mla) is None and not gluon_backward(mla)
    assert gluon_forward(same) is not None and gluon_backward(same)
    assert "_gluon" not in render_module(mla)
    # Set to head_dim, the setting changes nothing but the spec text.
    plain = make_variant("causal", dtype=ir.DType.BF16, head_dim=128)
    model = dataclasses.replace(lower(same), spec_text="", spec_hash="")
    assert model == dataclasses.replace(lower(plain), spec_text="", spec_hash="")


def test_the_wider_tile_sets_the_launch_and_no_tma_past_256():
    wide_v = lower(make_variant("causal", dtype=ir.DType.BF16, head_dim=64, v_head_dim=256))
    d256 = lower(make_variant("causal", dtype=ir.DType.BF16, head_dim=256))
    assert (wide_v.gpu_config, wide_v.gpu_bwd_config) == (d256.gpu_config, d256.gpu_bwd_config)
    latent = lower(make_variant("full", dtype=ir.DType.BF16, head_dim=576, v_head_dim=512))
    assert (latent.head_dim_pad, latent.v_head_dim_pad) == (1024, 512)
    assert latent.gpu_tma is False and latent.gpu_bwd_tma is False  # a TMA box is <= 256 wide
    assert latent.gpu_config.block_m == latent.gpu_config.block_n == 16


def test_the_module_checks_v_o_and_do_by_v_head_dim():
    module = build(make_variant("causal", head_dim=32, v_head_dim=16))
    assert (module.HEAD_DIM, module.V_DIM, module.V_DIM_PAD) == (32, 16, 16)
    q, k, v = (
        torch.randn(shape).to(DEVICE) for shape in ((1, 2, 5, 32), (1, 1, 7, 32), (1, 1, 7, 16))
    )
    with pytest.raises(ValueError, match="^v has head_dim 32, but .* v_head_dim = 16$"):
        module.forward(q, k, k)
    with pytest.raises(ValueError, match="^k has head_dim 16, but .* head_dim = 32$"):
        module.forward(q, v, v)
    with pytest.raises(ValueError, match="same shape bar the last"):
        module.forward(q, k, v[:, :, :6])
    o, lse, wide = (torch.zeros(s).to(DEVICE) for s in ((1, 2, 5, 16), (1, 2, 5), (1, 2, 5, 32)))
    with pytest.raises(ValueError, match="^o must have shape \\(1, 2, 5, 16\\)"):
        module.backward(q, k, v, wide, lse, o)
    with pytest.raises(ValueError, match="^do must have shape \\(1, 2, 5, 16\\)"):
        module.backward(q, k, v, o, lse, wide)
    with pytest.raises(ValueError, match="v_head_dim"):
        attention_ref(module_variant(module), q, k, k)


def module_variant(module) -> ir.Variant:
    (variant,), _ = check([parse(module.SPEC, "m.attn")[0]])
    return variant


# (mask, score): every kind of kernel code the head dims meet (masks with
# bounds and tile classes, a score with a derivative, one with per-head slopes).
SPECS = [
    ("full", None),
    ("causal", None),
    ("causal & window(9)", None),
    ("causal", "softcap(s, 5.0)"),
    ("causal", "s + alibi"),
]
# (head_dim, v_head_dim): Dv < D and Dv > D; 48 pads to 64-wide tiles.
DIMS = [(32, 16), (16, 48)]
# (B, H, Hkv, Nq, Nk): GQA with Nq != Nk and odd lengths past the interpreter's
# 32-row tiles, and MQA with more queries than keys.
SHAPES = [Shape(1, 4, 2, 37, 45), Shape(2, 2, 1, 33, 19)]


@pytest.mark.kernels
@pytest.mark.parametrize("dims", DIMS, ids=lambda d: f"d{d[0]}-dv{d[1]}")
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: " ".join(filter(None, s)))
def test_forward_and_backward_match_the_reference(spec, dims):
    mask, score = spec
    head_dim, v_head_dim = dims
    for dtype in (ir.DType.FP32, ir.DType.FP16):
        variant = make_variant(mask, score, dtype=dtype, head_dim=head_dim, v_head_dim=v_head_dim)
        for shape in SHAPES:
            assert_ok(run_case(variant, shape, seed=shape.n_keys))
            assert_ok(run_grad_case(variant, shape, seed=shape.n_queries))


@pytest.mark.kernels
def test_the_example_forward_and_backward():
    (variant,) = [interpretable(v) for v in example_variants() if v.name == "deepseek_mla"]
    assert (variant.head_dim, variant.v_dim) == (192, 128)
    shape = Shape(1, 2, 1, 40, 40)
    assert_ok(run_case(variant, shape, seed=1))
    assert_ok(run_grad_case(variant, shape, seed=2))


def _judge_decode(variant, q, k, v, o, lse):
    ref_o, ref_lse = attention_ref(variant, q.double(), k.double(), v.double())
    ord_o, ord_lse = attention_ref(variant, q, k, v, dtype=q.dtype)
    s_max = max_visible_score(variant, q, k, None)
    v_max = v.abs().max().item()
    checks = [
        tolerance(o.cpu(), ref_o.cpu(), ord_o.cpu(), q.dtype, score_noise=s_max * v_max),
        tolerance(lse.cpu(), ref_lse.cpu(), ord_lse.cpu(), q.dtype, what="lse", score_noise=s_max),
    ]  # fmt: skip
    for c in checks:
        assert c.ok, c


def _latent(batch, heads, n_queries, n_keys, head_dim, dtype, seed=0):
    """q and one latent cache k (Hkv = 1: MQA, as absorbed MLA decodes)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, n_queries, head_dim, generator=g).to(DEVICE, dtype)
    k = torch.randn(batch, 1, n_keys, head_dim, generator=g).to(DEVICE, dtype)
    return q, k


@pytest.mark.kernels
@pytest.mark.parametrize("mask", ["causal", "causal & window(20)"])
def test_split_kv_decode_writes_v_head_dim_columns(mask, monkeypatch):
    variant = make_variant(mask, dtype=ir.DType.FP16, head_dim=32, v_head_dim=48)
    module = build(variant)
    calls = []
    real = module._decode
    monkeypatch.setattr(module, "_decode", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q, k = _latent(2, 4, 2, 70, 32, torch.float16)
    v = torch.randn(2, 1, 70, 48).to(DEVICE, torch.float16)
    o, lse = module.forward(q, k, v)
    assert calls and o.shape == (2, 4, 2, 48)
    _judge_decode(variant, q, k, v, o, lse)
    for splits in (1, 3):
        o, lse = torch.empty_like(o), torch.empty_like(lse)
        real(q, k, v, o, lse, module.DEFAULT_SCALE, splits=splits)
        _judge_decode(variant, q, k, v, o, lse)


@pytest.mark.kernels
def test_v_as_a_view_of_k_forward_decode_and_backward():
    """The absorbed form: v = k[..., :Dv], a strided view of the one cache.
    Gradients reach k through both uses (dK plus dV in its first columns)."""
    variant = make_variant("causal", dtype=ir.DType.FP32, head_dim=48, v_head_dim=32)
    module = build(variant)
    q, k = _latent(1, 4, 3, 45, 48, torch.float32)
    v = k[..., :32]
    assert not v.is_contiguous()
    o, lse = module.forward(q, k, v)  # decoding: 12 query rows
    _judge_decode(variant, q, k, v, o, lse)
    o, lse = module.forward(q, k, v, block_m=32, block_n=32)  # the ordinary kernel
    _judge_decode(variant, q, k, v, o, lse)

    def grads(fn, dtype):
        a, b = q.detach().to(dtype).requires_grad_(), k.detach().to(dtype).requires_grad_()
        out = fn(a, b, b[..., :32])
        (out * weight.to(dtype)).sum().backward()
        return a.grad, b.grad

    weight = torch.randn(1, 4, 3, 32, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    kernel = grads(lambda a, b, c: module.attention(a, b, c), torch.float32)
    ref = grads(lambda a, b, c: attention_ref(variant, a, b, c)[0], torch.float64)
    ordinary = grads(
        lambda a, b, c: attention_ref(variant, a, b, c, dtype=a.dtype)[0], torch.float32
    )
    for name, x, r, d in zip(("dq", "dk"), kernel, ref, ordinary):
        check_ = tolerance(x.cpu(), r.cpu(), d.cpu(), torch.float32, what=name, factor=3.0)
        assert check_.ok, check_


@pytest.mark.kernels
def test_deepseek_absorbed_latent_576_512_decode_and_prefill():
    """DeepSeek-V3's absorbed decode: 16 heads against one 576-wide latent cache,
    v its first 512 columns (tiles 1024 and 512 wide)."""
    variant = make_variant("causal", dtype=ir.DType.FP16, head_dim=576, v_head_dim=512)
    module = build(variant)
    q, k = _latent(1, 16, 1, 40, 576, torch.float16)
    o, lse = module.forward(q, k, k[..., :512])
    assert o.shape == (1, 16, 1, 512)
    _judge_decode(variant, q, k, k[..., :512], o, lse)
    assert_ok(run_case(variant, Shape(1, 2, 1, 17, 20), seed=3))
    assert_ok(run_grad_case(variant, Shape(1, 2, 1, 17, 20), seed=4))


@pytest.mark.kernels
@pytest.mark.parametrize("dims", [(48, 32), (40, 16)], ids=lambda d: f"d{d[0]}-dv{d[1]}")
def test_a_view_of_k_is_read_once(dims, monkeypatch):
    """v = k[..., :Dv] (same data pointer and strides) sets V_IN_K: the forward and
    decode kernels load k's first Dv columns once, as v and as the first part of
    k in q.k, and the rest apart (24 columns padded to 32 at d40/16); a copy of
    those columns does not.  Both against the reference."""
    head_dim, v_head_dim = dims
    variant = make_variant("causal & window(30)", dtype=ir.DType.FP16, head_dim=head_dim, v_head_dim=v_head_dim)  # fmt: skip
    module = build(variant)
    seen = []
    real = module._launch

    def spy(kernel, grid, *args, **options):
        seen.append((getattr(kernel, "fn", kernel).__name__, args[-1]))
        return real(kernel, grid, *args, **options)

    monkeypatch.setattr(module, "_launch", spy)
    q, k = _latent(1, 4, 3, 70, head_dim, torch.float16)
    for launch, kernel in (({}, "_attn_decode"), (dict(block_m=32, block_n=32), "_attn_fwd")):
        for v, in_k in ((k[..., :v_head_dim], True), (k[..., :v_head_dim].clone(), False)):
            seen.clear()
            o, lse = module.forward(q, k, v, **launch)
            assert (kernel, in_k) in seen, seen
            _judge_decode(variant, q, k, v, o, lse)
