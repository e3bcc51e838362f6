"""GPU property tests: fp16, bf16 and fp32, sequence lengths up to 2048.

Marked `gpu`: skipped without CUDA.  Same tolerance rule as the CPU tests
(`flashgen.verify.tolerance`).  With FLASHGEN_GPU_SUMMARY=path set, every
case's errors are appended to that file as a table for the record.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashgen import ir
from flashgen.verify import Shape, check_backward, check_forward
from kernel_utils import (
    assert_ok,
    check_spec_both_ways,
    deep_variant,
    language_variants,
    assert_tanh_accurate,
    build,
    example_variants,
    make_variant,
    run_case,
    run_grad_case,
)
from strategies import variants
from test_inputs import PLANNED_MASKS

pytestmark = pytest.mark.gpu

LENGTHS = (1, 3, 17, 113, 203, 239, 799, 1023, 1024, 2048)
# For hypothesis, which draws the first values most often (and shrinks
# towards them): multi-tile lengths first.
DRAWN_LENGTHS = (239, 1023, 113, 799, 203, 2048, 17, 1024, 3, 1)
# bf16 first: it runs only here (the CPU interpreter cannot multiply bf16).
DRAWN_DTYPES = (ir.DType.BF16, ir.DType.FP16, ir.DType.FP32)


def _record(variant: ir.Variant, result) -> None:
    path = os.environ.get("FLASHGEN_GPU_SUMMARY")
    if not path:
        return
    with open(path, "a") as f:
        for c in result.checks:
            f.write(
                f"{variant.name:<16} {variant.dtype.value:<5} {str(result.shape):<36} "
                f"{c.what:<4} {c.error:9.2e} {c.ordinary_error:9.2e} {c.bound:9.2e} "
                f"{'ok' if c.ok else 'FAIL'}\n"
            )


def _count_calls(monkeypatch, module, name: str, where=lambda keywords: True) -> list:
    """A list that grows by one on each call of module.<name> from the test's
    own thread (whose keyword arguments satisfy `where`), so that a test of a
    kernel path cannot pass on the path it falls back to.  The calls of the
    thread that compiles the backward ahead (COMPILE_AHEAD, "flashgen-compile")
    are left out: it runs the backward once on stand-ins, whenever it gets to it."""
    import threading

    calls = []
    fn = getattr(module, name)

    def counted(*args, **keywords):
        if threading.current_thread().name != "flashgen-compile" and where(keywords):
            calls.append(1)
        return fn(*args, **keywords)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("variant", example_variants(), ids=lambda v: v.name)
@pytest.mark.parametrize("dtype", [ir.DType.FP16, ir.DType.BF16, ir.DType.FP32])
def test_examples_on_gpu(variant, dtype):
    variant = dataclasses.replace(variant, dtype=dtype)
    rng = random.Random(variant.name)
    shapes = [Shape(2, 4, 2, 2048, 2048), Shape(1, 4, 1, 1023, 2048), Shape(1, 2, 2, 2048, 799)]
    shapes += [Shape(1, 2, 1, rng.choice(LENGTHS), rng.choice(LENGTHS)) for _ in range(3)]
    for i, shape in enumerate(shapes):
        # Automatic (GPU_TMA, or the Gluon forward), and on two shapes the
        # Triton forward's pointer and TMA loads (tma=True keeps the Gluon
        # forward where there is one).
        for tma in (None, False, True) if i < 2 else (None,):
            result = run_case(variant, shape, seed=i, device="cuda", tma=tma)
            _record(variant, result)
            assert_ok(result)


@settings(
    max_examples=int(os.environ.get("FLASHGEN_GPU_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    variant=variants(dtypes=DRAWN_DTYPES, head_dims=(24, 40, 64, 80, 96, 128, 192, 256)),
    kv_heads=st.integers(1, 2),
    group=st.sampled_from((1, 2)),
    n_queries=st.sampled_from(DRAWN_LENGTHS),
    n_keys=st.sampled_from(DRAWN_LENGTHS),
    magnitude=st.sampled_from((1.0, 5.0)),
    seed=st.integers(0, 2**16),
)
def test_random_specs_on_gpu(variant, kv_heads, group, n_queries, n_keys, magnitude, seed):
    shape = Shape(2, kv_heads * group, kv_heads, n_queries, n_keys)
    result = run_case(variant, shape, seed=seed, device="cuda", magnitude=magnitude)
    _record(variant, result)
    assert_ok(result)


@pytest.mark.parametrize("variant", example_variants(), ids=lambda v: v.name)
@pytest.mark.parametrize("dtype", [ir.DType.FP16, ir.DType.BF16, ir.DType.FP32])
def test_example_gradients_on_gpu(variant, dtype, monkeypatch):
    variant = dataclasses.replace(variant, dtype=dtype)
    shapes = [Shape(1, 4, 2, 2048, 2048), Shape(1, 2, 1, 1023, 2048), Shape(1, 2, 2, 2048, 799)]
    for i, shape in enumerate(shapes):
        if i == 2:  # the backward's pointer loads instead of TMA
            monkeypatch.setattr(build(variant), "GPU_BWD_TMA", False)
        result = run_grad_case(variant, shape, seed=i, device="cuda")
        _record(variant, result)
        assert_ok(result)


@settings(
    max_examples=max(1, int(os.environ.get("FLASHGEN_GPU_EXAMPLES", "40")) // 2),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    variant=variants(dtypes=DRAWN_DTYPES, head_dims=(24, 40, 64, 80, 96, 128, 192, 256)),
    kv_heads=st.integers(1, 2),
    group=st.sampled_from((1, 2)),
    n_queries=st.sampled_from(DRAWN_LENGTHS),
    n_keys=st.sampled_from(DRAWN_LENGTHS),
    magnitude=st.sampled_from((1.0, 5.0)),
    seed=st.integers(0, 2**16),
)
def test_random_spec_gradients_on_gpu(variant, kv_heads, group, n_queries, n_keys, magnitude, seed):
    shape = Shape(1, kv_heads * group, kv_heads, n_queries, n_keys)
    result = run_grad_case(variant, shape, seed=seed, device="cuda", magnitude=magnitude)
    _record(variant, result)
    assert_ok(result)


def test_tanh_is_accurate_on_gpu():
    assert_tanh_accurate("cuda")


@pytest.mark.parametrize("name", ["full", "plain_causal"])
@pytest.mark.parametrize("dtype", [ir.DType.FP16, ir.DType.BF16])
def test_gluon_forward_on_gpu(name, dtype, monkeypatch):
    """The warp-specialized Gluon forward (sm90, Nq = Nk of 128 or more):
    one CTA's tile, several tiles with GQA, long rows, large inputs, lengths
    that are no multiple of 128 (the last CTA's second consumer with some
    rows, or none, before the next head's), and gradients through the
    log-sum-exp it returns.  Counts its launches, so the test cannot pass on
    the Triton fallback."""
    (variant,) = [v for v in example_variants() if v.name == name]
    variant = dataclasses.replace(variant, dtype=dtype)
    module = build(variant)
    launches = _count_calls(monkeypatch, module, "_gluon_forward")
    shapes = [Shape(1, 2, 2, 128, 128), Shape(2, 4, 2, 384, 384), Shape(1, 4, 1, 2048, 2048)]
    shapes += RAGGED_SHAPES
    for i, shape in enumerate(shapes):
        for magnitude in (1.0, 5.0):
            result = run_case(variant, shape, seed=i, device="cuda", magnitude=magnitude)
            _record(variant, result)
            assert_ok(result)
    assert len(launches) == 2 * len(shapes)
    for i, n in enumerate((1024, 1000)):
        result = run_grad_case(variant, Shape(1, 4, 2, n, n), seed=7 + i, device="cuda")
        _record(variant, result)
        assert_ok(result)
    assert len(launches) > 2 * len(shapes)


# Lengths of no multiple of 128 for the Gluon forward: the last CTA's second
# consumer has no row (130), some (200, 1000); batches and heads follow, so a
# store past a head's last row would overwrite its neighbour's.
RAGGED_SHAPES = [Shape(2, 2, 2, 130, 130), Shape(2, 4, 2, 200, 200), Shape(1, 2, 1, 1000, 1000)]


class _VarlenBatch:
    """A module's calls on one sequence (1, H, n, D), run as sequence `index`
    of a varlen batch of self-attention sequences (as many queries as keys)
    amid neighbours of the given lengths, whose q, k and v are random and
    large; o, lse and, through autograd, the gradients come back for that
    sequence alone."""

    def __init__(self, module, index: int, neighbours, heads: int, kv_heads: int, generator):
        self.module, self.index = module, index
        d = module.HEAD_DIM
        self.others = [
            [
                (3.0 * torch.randn(n, h, d, generator=generator)).to("cuda", module.DTYPE)
                for h in (heads, kv_heads, kv_heads)
            ]
            for n in neighbours
        ]

    def forward(self, q, k, v, scale=None):
        o, lse = self.attention(q, k, v, scale=scale, return_lse=True)
        return o.detach(), lse.detach()

    def attention(self, q, k, v, *, scale=None, return_lse=False):
        mine = [x[0].transpose(0, 1) for x in (q, k, v)]  # (n, heads, D)
        seqs = self.others[: self.index] + [mine] + self.others[self.index :]
        cu = torch.tensor([0] + [s[0].shape[0] for s in seqs], device="cuda").cumsum(0)
        q, k, v = (torch.cat([s[i] for s in seqs]) for i in range(3))
        cu = cu.to(torch.int32)
        o, lse = self.module.attention(
            q, k, v, scale=scale, return_lse=True, cu_seqlens_q=cu, cu_seqlens_k=cu
        )  # fmt: skip
        rows = slice(int(cu[self.index]), int(cu[self.index + 1]))
        o, lse = o[rows].transpose(0, 1)[None], lse[:, rows][None]
        return (o, lse) if return_lse else o


@pytest.mark.parametrize(
    "mask, score", [("full", None), ("causal", None), ("causal & window(200)", "s + alibi")]
)
@pytest.mark.parametrize("dtype", [ir.DType.FP16, ir.DType.BF16])
def test_gluon_forward_of_varlen_calls_on_gpu(mask, score, dtype, monkeypatch):
    """Under the knob gluon_varlen (decision 102), varlen calls of sequences
    with as many queries as keys take the Gluon forward (full, causal and the
    any-mask kind): each sequence judged
    against the float64 reference of the sequence alone, forward and
    backward (the Triton backward from the Gluon forward's log-sum-exp), at
    1, 100, 128, 129, 300 and 1000 tokens amid neighbours of 700, 0, 1 and
    257, GQA, x1 and x5 inputs; where it has 128 tokens or more, bit for bit
    the dense Gluon call of the sequence alone (the same tiles in the same
    order).  Counts its launches."""
    from flashgen import kernel_choice
    from flashgen.verify import random_inputs

    monkeypatch.setattr(kernel_choice, "GLUON_ANY_MIN_KEYS", 0)
    variant = make_variant(mask, score, dtype=dtype, head_dim=128)
    module = build(variant, {"gluon_varlen": True})
    launches = _count_calls(monkeypatch, module, "_gluon_forward")
    generator = torch.Generator().manual_seed(0)
    for i, n in enumerate((1, 100, 128, 129, 300, 1000)):
        for magnitude in (1.0, 5.0):
            adapter = _VarlenBatch(module, i % 5, [700, 0, 1, 257], 4, 2, generator)
            q, k, v = random_inputs(
                Shape(1, 4, 2, n, n), 128, module.DTYPE, "cuda", generator=generator,
                magnitude=magnitude,
            )  # fmt: skip
            before = len(launches)
            for result in (
                check_forward(variant, adapter, q, k, v),
                check_backward(variant, adapter, q, k, v, generator=generator),
            ):
                _record(variant, result)
                assert_ok(result)
            assert len(launches) == before + 2
            if n >= 128:
                o, lse = adapter.forward(q, k, v)
                o_alone, lse_alone = module.forward(q, k, v)
                assert len(launches) == before + 4
                assert torch.equal(o, o_alone) and torch.equal(lse, lse_alone)


def _same_up_to_rounding(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether dK or dV of two compilations of the Gluon dK/dV kernel agree
    as two roundings of the same sums may: the varlen one (VARLEN) computes
    s * scale - lse as a product and a difference, the dense one as one fma
    (their PTX, plain_causal d128, 2026-12-07), so P and dS may differ in
    their last float32 bit, and so where they round to 16 bits: a term of
    the sums off by a unit in the last place of P or dS (H100, 2026-12-07:
    up to 0.0078 on elements of 0.1 beside a largest one of 3.2, bf16 d64).
    Each element within 2 units in its last place plus half the largest
    element's, and under 1% of elements off."""
    eps = torch.finfo(a.dtype).eps
    a, b = a.float(), b.float()
    off = (a - b).abs()
    bound = 2 * eps * torch.maximum(a.abs(), b.abs()) + eps * b.abs().max() / 2
    return bool((off <= bound).all()) and int((off > 0).sum()) <= a.numel() // 100


@pytest.mark.parametrize(
    "mask, score, head_dim",
    [
        ("full", None, 128),
        ("causal", None, 128),
        ("causal & window(200)", "s + alibi", 128),
        ("causal", None, 64),
    ],
)
@pytest.mark.parametrize("dtype", [ir.DType.FP16, ir.DType.BF16])
def test_gluon_backward_of_varlen_calls_on_gpu(mask, score, head_dim, dtype, monkeypatch):
    """Under the knobs gluon_varlen and gluon_varlen_backward (decisions
    103-104), varlen calls of sequences with as many queries as keys take the
    Gluon forward and backward: each sequence judged against the float64
    reference of the sequence alone, forward and backward (with dlse), at 1,
    100, 128, 129, 300 and 1000 tokens amid neighbours of 700, 0, 1 and 257,
    GQA, x1 and x5 inputs; where it has 128 tokens or more, its gradients
    those of the dense Gluon call of the sequence alone: dQ bit for bit, dK
    and dV up to the rounding of P and dS (`_same_up_to_rounding`).  Counts
    the varlen backward's launches."""
    from flashgen import kernel_choice
    from flashgen.verify import random_inputs

    monkeypatch.setattr(kernel_choice, "GLUON_ANY_MIN_KEYS", 0)
    variant = make_variant(mask, score, dtype=dtype, head_dim=head_dim)
    module = build(variant, {"gluon_varlen": True, "gluon_varlen_backward": True})
    launches = _count_calls(monkeypatch, module, "_gluon_backward", lambda kw: "seqs" in kw)
    dense = _count_calls(monkeypatch, module, "_gluon_backward", lambda kw: "seqs" not in kw)
    generator = torch.Generator().manual_seed(0)
    for i, n in enumerate((1, 100, 128, 129, 300, 1000)):
        for magnitude in (1.0, 5.0):
            adapter = _VarlenBatch(module, i % 5, [700, 0, 1, 257], 4, 2, generator)
            q, k, v = random_inputs(
                Shape(1, 4, 2, n, n), head_dim, module.DTYPE, "cuda", generator=generator,
                magnitude=magnitude,
            )  # fmt: skip
            before = len(launches)
            result = check_backward(variant, adapter, q, k, v, generator=generator)
            _record(variant, result)
            assert_ok(result)
            assert len(launches) > before
            if n >= 128:
                leaves = [x.detach().requires_grad_() for x in (q, k, v)]
                do = torch.randn(q.shape, generator=generator).to("cuda", q.dtype)
                varlen = torch.autograd.grad(adapter.attention(*leaves), leaves, do)
                before = len(dense)
                alone = torch.autograd.grad(module.attention(*leaves), leaves, do)
                assert len(dense) == before + 1
                assert torch.equal(varlen[0], alone[0])
                assert all(_same_up_to_rounding(a, b) for a, b in zip(varlen[1:], alone[1:]))


@pytest.mark.parametrize("dtype", [ir.DType.FP16, ir.DType.BF16])
def test_varlen_calls_captured_in_a_cuda_graph_on_gpu(dtype):
    """Decision 105: a varlen call given max_seqlen_q/k, and a padded call,
    made while a CUDA graph is captured read nothing on the host; replayed
    on new q, k, v, dO and new lengths written into the same tensors, the
    graph gives what the eager calls give, bit for bit, forward and
    backward.  Here a captured varlen call takes the Triton kernels (the
    knob gluon_varlen_captured off; with it, the default since decision 107,
    the next test): the eager calls are a module's without the knobs
    gluon_varlen and gluon_varlen_backward."""
    variant = make_variant("causal", None, dtype=dtype, head_dim=128)
    module = build(variant, {"gluon_varlen_captured": False})
    triton = build(variant, {"gluon_varlen": False, "gluon_varlen_backward": False})
    g = torch.Generator().manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=g).to("cuda", module.DTYPE)  # noqa: E731

    def cumulative(lengths):
        return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)

    t = 1430
    cu = cumulative([300, 0, 1, 129, 1000]).cuda()
    seqlens = torch.tensor([700, 3], device="cuda")
    varlen = [rand(t, 4, 128), rand(t, 2, 128), rand(t, 2, 128), rand(t, 4, 128)]
    padded = [
        rand(2, 4, 700, 128),
        rand(2, 2, 700, 128),
        rand(2, 2, 700, 128),
        rand(2, 4, 700, 128),
    ]
    for x in varlen[:3] + padded[:3]:
        x.requires_grad_()
    lengths = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=1000, max_seqlen_k=1000)

    def step(attention, tensors, **kwargs):
        q, k, v, do = tensors
        o = attention(q, k, v, **kwargs)
        return (o, *torch.autograd.grad(o, (q, k, v), do))

    def both(m=module):
        padding = dict(seqlens_k=seqlens, padding_side="left")
        return step(m.attention, varlen, **lengths) + step(m.attention, padded, **padding)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        both()  # compiles outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = both()
    for x in varlen + padded:
        x.data.copy_(torch.randn(x.shape, generator=g).to(x.device, x.dtype))
    cu.copy_(cumulative([1000, 5, 0, 300, 125]))
    seqlens.copy_(torch.tensor([2, 699]))
    graph.replay()
    eager = both(triton)
    assert all(torch.equal(a, b) for a, b in zip(captured, eager))


@pytest.mark.parametrize("mask", ["full", "causal"])
@pytest.mark.parametrize("dtype", [ir.DType.FP16, ir.DType.BF16])
def test_varlen_calls_captured_in_a_cuda_graph_take_the_gluon_kernels_on_gpu(
    mask, dtype, monkeypatch
):
    """Decision 107: under the knob gluon_varlen_captured (the default), a varlen call
    captured in a CUDA graph with one cu_seqlens tensor for q and k takes the
    Gluon forward and backward over a table made on the GPU (rows of length
    0 past the call's tiles, which write nothing); replayed on new q, k, v,
    dO and new lengths written into the same tensor (an empty sequence, one
    of 1 token, one of 1,000), forward and backward equal the eager calls bit
    for bit (their table made on the host: the same tiles in the same
    order)."""
    variant = make_variant(mask, None, dtype=dtype, head_dim=128)
    module = build(variant, {"gluon_varlen_captured": True})
    forward = _count_calls(monkeypatch, module, "_gluon_forward")
    backward = _count_calls(monkeypatch, module, "_gluon_backward", lambda kw: "seqs" in kw)
    g = torch.Generator().manual_seed(0)

    def cumulative(lengths):
        return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)

    t = 1430
    cu = cumulative([300, 0, 1, 129, 1000]).cuda()
    tensors = [
        torch.randn(t, h, 128, generator=g).to("cuda", module.DTYPE) for h in (4, 2, 2, 4)
    ]  # fmt: skip
    for x in tensors[:3]:
        x.requires_grad_()

    def step():
        q, k, v, do = tensors
        o = module.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=1000, max_seqlen_k=1000)  # fmt: skip
        return (o, *torch.autograd.grad(o, (q, k, v), do))

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compiles outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    before = len(forward), len(backward)
    with torch.cuda.graph(graph):
        captured = step()
    assert (len(forward), len(backward)) == (before[0] + 1, before[1] + 1)
    for x in tensors:
        x.data.copy_(torch.randn(x.shape, generator=g).to(x.device, x.dtype))
    cu.copy_(cumulative([1000, 5, 0, 300, 125]))
    graph.replay()
    eager = step()
    assert len(forward) == before[0] + 2  # the eager call's table made on the host
    assert all(torch.equal(a, b) for a, b in zip(captured, eager))


# Masks and scores for the Gluon backward: the mask's bounds, its interior
# and its per-tile classification (non-affine terms, heads, rows that see no
# key at all), score modifiers with a derivative, ALiBi.
GLUON_BACKWARD_CASES = [
    ("full", None, 128),
    ("causal", None, 128),
    ("causal & window(200)", None, 128),
    ("causal & chunk(256)", None, 64),
    ("causal | prefix(300)", None, 128),
    ("window(100, 60)", None, 64),
    ("k + 200 <= q", None, 128),  # rows below 200 see no key
    ("causal & (q - k) % 3 != 1 & (h != 1 | k >= 64)", None, 128),
    ("causal", "s + alibi", 128),
    ("causal", "softcap(s, 20.0)", 128),
    ("full", "s - 0.05 * abs(q - k)", 64),
    # Constant derivatives (-1, an integer in the IR) and negative constants:
    # `(-(1)).to(tl.float32)` once failed to compile in _gluon_attn_bwd_dq.
    ("causal", "-s", 128),
    ("full", "exp(-s)", 64),
    ("causal", "2 * s - 3", 64),
]


def _magnitudes(score: str | None) -> tuple[float, ...]:
    """Input scales for a case: x5 inputs make |s| reach about 100 at d64,
    and exp(-s) of that (e^100) is past float32, outside the language's
    numeric domain (docs/LANGUAGE.md), so that score runs at x1 alone."""
    return (1.0,) if score == "exp(-s)" else (1.0, 5.0)


# The Gluon backward's streamed tiles (`gluon_bwd_streams`): as built, and
# 128 rows wherever they are allowed: the dQ kernel's keys, and the dK/dV
# kernel's rows for a full mask at d64 (decision 095: with a mask that cuts
# tiles, its 64-row parts gave wrong dK and dV).


def _wide_streams(head_dim: int, mask: str) -> tuple[int, int]:
    return (128 if head_dim == 64 and mask == "full" else 64, 128)


@pytest.mark.parametrize("mask, score, head_dim", GLUON_BACKWARD_CASES)
@pytest.mark.parametrize("dtype", [ir.DType.FP16, ir.DType.BF16])
@pytest.mark.parametrize("streams", ["built", "wide"])
def test_gluon_backward_on_gpu(mask, score, head_dim, dtype, streams, monkeypatch):
    """The warp-specialized Gluon backward (sm90, Nq = Nk of 128 or more)
    against the float64 reference: one CTA, GQA, several tiles per CTA,
    lengths of no multiple of 128 (RAGGED_SHAPES), with a random gradient of
    the log-sum-exp.  Counts its launches, so the test cannot pass on the
    Triton fallback."""
    variant = make_variant(mask, score, dtype=dtype, head_dim=head_dim)
    wide = streams == "wide" and {"gluon_bwd_streams": _wide_streams(head_dim, mask)}
    module = build(variant, wide)
    gluon = hasattr(module, "_gluon_backward")
    launches = _count_calls(monkeypatch, module, "_gluon_backward") if gluon else []
    shapes = [Shape(1, 2, 2, 128, 128), Shape(2, 4, 2, 384, 384), Shape(1, 2, 1, 1024, 1024)]
    shapes += RAGGED_SHAPES
    for i, shape in enumerate(shapes):
        for magnitude in _magnitudes(score):
            result = run_grad_case(
                variant, shape, seed=i, device="cuda", magnitude=magnitude, module=module
            )
            _record(variant, result)
            assert_ok(result)
    # Without a gradient of the log-sum-exp: the backward gets no dlse.
    result = run_grad_case(variant, shapes[1], seed=9, device="cuda", with_lse=False, module=module)
    _record(variant, result)
    assert_ok(result)
    assert len(launches) == len(_magnitudes(score)) * len(shapes) + 1


# Decision 073: masks whose masked loops run every tile without the per-tile
# emptiness test (congruences that reach every residue in a tile, their `|`
# with anything, a dense-edged mask `&` one), and d128 scores whose derivative
# reads s and positions, which take the Triton backward instead of the Gluon
# one.  rand0_14 of `flashgen bench --random 30 --seed 0` is the first case.
TILE_TEST_CASES = [
    (
        "((q - k) % 2 == 1 | !causal) & (max(q, k) > 19 | prefix(288) | !prefix(247))",
        "max(s - 0.003 * abs(q - k), -3.266)",
        128,
    ),
    ("(q - k) % 2 == 1 | !causal", None, 64),
    ("causal & (q - k) % 4 == 0", None, 64),
    ("causal & (q - k) % 4 == 0", "softcap(s + alibi, 12.0)", 128),
    ("chunk(158) & causal", "softcap((s - 0.009 * abs(q - k)) * 0.159, 12.0)", 128),
    # Decision 076: short rows take the merged loop although the corner term
    # `max(q, k) > 10` leaves empty edge tiles; they run masked (rand0_22).
    (
        "max(q, k) > 10 & (abs(q - k) < 5 | window(145)) & q div 2 == k div 2",
        "exp(-abs(s * 0.187))",
        128,
    ),
]


@pytest.mark.parametrize("mask, score, head_dim", TILE_TEST_CASES)
@pytest.mark.parametrize("dtype", [ir.DType.FP16, ir.DType.BF16])
def test_masks_without_tile_test_and_positional_backward_on_gpu(
    mask, score, head_dim, dtype, monkeypatch
):
    """Forward and backward against the float64 reference at lengths that
    cross tiles (Nq != Nk, GQA), and at Nq = Nk = 1024, where a d128 16-bit
    call would take the Gluon backward but for the score's derivative, or a
    d64 one but for a mask whose loops run without branches: the test counts
    Gluon backward launches, so it checks the path the module chose."""
    from flashgen import kernel_choice, lower
    from flashgen.mask_forms import desugar_mask, negation_normal_form, positional_part

    variant = make_variant(mask, score, dtype=dtype, head_dim=head_dim)
    module = build(variant)
    model = lower.lower(variant)
    assert model.tiles.merged_edges or not model.tiles.classify_edge_tiles
    positional = positional_part(negation_normal_form(desugar_mask(variant.mask)))
    if score is not None:
        assert kernel_choice.positional_derivative(variant.score) or kernel_choice.heavy_derivative(
            variant.score
        )
    gluon = hasattr(module, "_gluon_backward")
    launches = _count_calls(monkeypatch, module, "_gluon_backward") if gluon else []
    shapes = [Shape(2, 4, 2, 239, 1023), Shape(1, 2, 1, 1023, 203), Shape(1, 2, 2, 1024, 1024)]
    for i, shape in enumerate(shapes):
        for result in check_spec_both_ways(variant, shape, seed=i, device="cuda"):
            _record(variant, result)
    # The d64 masks that never fill a tile take the Triton backward too (decision 076).
    assert bool(launches) is (
        score is None and not kernel_choice.branchless_tiles(positional, dtype)
    )


# Masks over runtime data whose call plans classify the Gluon backward's tiles
# (decision 078): inputs of each side, of neither side (a length per example),
# per head with GQA, and a mask whose visible tiles are not one run.
DATA_MASKS = [*PLANNED_MASKS, ("", "causal | b == 0")]


def _checked_data_calls(variant, module):
    """The calls of the data-mask tests, each checked forward and backward
    against the float64 reference before it is yielded (q, k, v, the runtime
    inputs and the generator, for the test's own checks): Nq = Nk a multiple
    of 128 (GQA, two examples), documents of a few tokens and of about 150
    (runs across tile edges, whole tiles inside)."""
    from flashgen.verify import random_inputs, random_runtime_inputs, torch_dtype

    for i, shape in enumerate([Shape(2, 4, 2, 256, 256), Shape(1, 2, 1, 1024, 1024)]):
        for mean_run in (1 / 0.15, 150.0):
            generator = torch.Generator().manual_seed(10 * i + int(mean_run))
            q, k, v = random_inputs(
                shape, variant.head_dim, torch_dtype(variant.dtype), "cuda", generator=generator
            )
            data = random_runtime_inputs(
                variant, shape, "cuda", generator=generator, mean_run=mean_run
            )
            forward = check_forward(variant, module, q, k, v, inputs=data)
            backward = check_backward(variant, module, q, k, v, generator=generator, inputs=data)
            for result in (forward, backward):
                _record(variant, result)
                assert_ok(result)
            yield q, k, v, data, generator


@pytest.mark.parametrize("declared, mask", DATA_MASKS)
@pytest.mark.parametrize("head_dim, knob", [(64, False), (128, False), (128, True)])
@pytest.mark.parametrize("dtype", [ir.DType.FP16, ir.DType.BF16])
def test_masks_over_runtime_data_and_the_gluon_backward_on_gpu(
    declared, mask, head_dim, knob, dtype, monkeypatch
):
    """At head dim 64 the Gluon backward walks the tiles a call's plan leaves
    visible (decision 078; at 128 the Triton backward, which measured faster,
    or the Gluon one under the knob `gluon_data_d128`, decision 095):
    forward and backward against the float64 reference at Nq = Nk a multiple
    of 128 (GQA, two examples), with documents of a few tokens and of about
    150 (runs across tile edges, whole tiles inside); the launches are
    counted, so the test cannot pass on the other backward.  A plan built
    once by tile_plan() gives the same bits as the plan each call builds."""
    from flashgen import kernel_choice
    from flashgen.mask_forms import desugar_mask, negation_normal_form, positional_part

    variant = make_variant(mask, dtype=dtype, head_dim=head_dim, declared=declared)
    # The module's own kernels: not the Gluon kernels of a mask over documents'
    # positional part (decision 109, test_packed_documents_as_runs_on_gpu).
    module = build(variant, {"gluon_data_d128": knob, "document_runs": False})
    gluon = hasattr(module, "_gluon_backward")
    launches = _count_calls(monkeypatch, module, "_gluon_backward") if gluon else []
    cases = 0
    for q, k, v, data, generator in _checked_data_calls(variant, module):
        cases += 1
        do = torch.randn(q.shape, generator=generator).to(device="cuda", dtype=q.dtype)
        plan = module.tile_plan(q, k, v, **data)
        grads = []
        for given_plan in (None, plan):
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]
            o = module.attention(*leaves, **data, plan=given_plan)
            grads.append(torch.autograd.grad(o, leaves, do))
        for a, b in zip(*grads, strict=True):
            assert torch.equal(a, b)
    # A mask whose loops run without branches keeps the Triton backward (decision 076).
    positional = positional_part(negation_normal_form(desugar_mask(variant.mask)))
    # (At head dim 128 the Gluon backward takes such masks too: decision 076.)
    gluon = knob or head_dim == 64 and not kernel_choice.branchless_tiles(positional, dtype)
    assert len(launches) == (3 * cases if gluon else 0)


class _Planned:
    """A module whose attention() and forward() take one TilePlan, so that
    `check_forward` and `check_backward` judge the calls that take it."""

    def __init__(self, module, plan):
        self.module, self.plan = module, plan

    def attention(self, *args, **keywords):
        return self.module.attention(*args, **keywords, plan=self.plan)

    def forward(self, q, k, v, scale=None, **inputs):
        with torch.no_grad():
            return self.attention(q, k, v, scale=scale, return_lse=True, **inputs)


def _document_ids(rows: list[list[int]], shuffled: bool, generator) -> torch.Tensor:
    """(B, N) int32 ids, row b made of runs of the lengths rows[b]: ids
    0, 1, 2, ... or, shuffled, distinct ids in no order."""
    out = []
    for lengths in rows:
        ids = torch.randperm(1000, generator=generator)[: len(lengths)].tolist()
        ids = ids if shuffled else range(len(lengths))
        out.append(
            torch.cat([torch.full((n,), i, dtype=torch.int32) for n, i in zip(lengths, ids)])
        )
    return torch.stack(out).cuda()


# Masks over packed documents whose positional part has both Gluon kernels
# (decision 109): causal (the plain kernels), full, and the any-mask kernels
# (a row of one token then sees nothing; a distance in the score).
# The last: d64's GLUON_MIN_KEYS as it is, the runs too short for the Gluon
# forward; the module's Triton forward writes o as q, and the backward takes
# the runs (decision 110).
DOCUMENT_RUNS_CASES = [
    ("causal & doc[b, q] == doc[b, k]", None, 128, ir.DType.BF16, True),
    ("causal & doc[b, q] == doc[b, k]", None, 64, ir.DType.FP16, True),
    ("doc[b, k] == doc[b, q]", None, 128, ir.DType.FP16, True),
    ("q != k & doc[b, q] == doc[b, k]", None, 128, ir.DType.BF16, True),
    ("causal & doc[b, q] == doc[b, k]", "s - 0.01 * abs(q - k)", 128, ir.DType.FP16, True),
    ("causal & doc[b, q] == doc[b, k]", None, 64, ir.DType.BF16, False),
]


@pytest.mark.parametrize("mask, score, head_dim, dtype, forward_runs", DOCUMENT_RUNS_CASES)
def test_packed_documents_as_runs_on_gpu(mask, score, head_dim, dtype, forward_runs, monkeypatch):  # fmt: skip
    """A plan whose documents' ids form runs of distinct ids takes the Gluon
    kernels of the mask's positional part over the runs (decision 109):
    forward and backward against the float64 reference, with GQA, N no
    multiple of 128, runs of 1 token, runs across 128-row edges, several
    batch rows, ids in order and shuffled, q, k and v contiguous and with
    rows of tokens ((B, N, H, D) in memory); the launches with runs are
    counted (`forward_runs` False: the forward kept off the runs, so that
    the module's Triton forward writes the o the runs' backward reads).
    Ids that come back in a row give no runs, and
    the module's own kernels, also checked.  The plan's runs are found on
    the GPU and read at the first call (decision 110)."""
    variant = make_variant(
        mask, score, dtype=dtype, head_dim=head_dim, declared="doc: int32[B, Nk]"
    )
    module = build(variant, {"document_runs": True})
    if not forward_runs:
        monkeypatch.setattr(module._Runs, "forward", property(lambda self: False))
    runs = lambda keywords: keywords.get("runs") is not None  # noqa: E731
    forwards = _count_calls(monkeypatch, module, "_gluon_forward", runs)
    backwards = _count_calls(monkeypatch, module, "_gluon_backward", runs)
    generator = torch.Generator().manual_seed(head_dim)
    from flashgen.verify import random_inputs, torch_dtype

    cases = [
        (Shape(2, 4, 2, 1000, 1000), [[1, 127, 129, 300, 443], [700, 1, 299]], False),
        (Shape(1, 2, 1, 1024, 1024), [[256, 128, 383, 1, 256]], True),
        (Shape(1, 2, 2, 600, 600), [[600]], False),
    ]
    for (shape, rows, shuffled), tokens in itertools.product(cases, (False, True)):
        q, k, v = random_inputs(
            shape, head_dim, torch_dtype(dtype), "cuda", generator=generator
        )  # fmt: skip
        if tokens:  # rows of tokens, (B, N, H, D) in memory (dO as the test makes it)
            q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
        doc = _document_ids(rows, shuffled, generator)
        plan = module.tile_plan(q, k, v, doc=doc)
        assert plan.runs is not None and plan.runs.backward
        before = (len(forwards), len(backwards))
        planned = _Planned(module, plan)
        for result in (
            check_forward(variant, planned, q, k, v, inputs={"doc": doc}),
            check_backward(variant, planned, q, k, v, generator=generator, inputs={"doc": doc}),
        ):
            _record(variant, result)
            assert_ok(result)
        # forward() and attention() with return_lse, then the backward's
        assert (len(forwards) - before[0], len(backwards) - before[1]) == (2 * forward_runs, 1)
    # An id that comes back later in a row: no runs; the module's kernels.
    q, k, v = random_inputs(Shape(1, 2, 1, 512, 512), head_dim, torch_dtype(dtype), "cuda", generator=generator)  # fmt: skip
    doc = _document_ids([[200, 100, 212]], False, generator)
    doc[0, 300:] = 0
    plan = module.tile_plan(q, k, v, doc=doc)
    assert not plan.runs.forward and not plan.runs.backward
    before = (len(forwards), len(backwards))
    planned = _Planned(module, plan)
    for result in (
        check_forward(variant, planned, q, k, v, inputs={"doc": doc}),
        check_backward(variant, planned, q, k, v, generator=generator, inputs={"doc": doc}),
    ):
        assert_ok(result)
    assert (len(forwards), len(backwards)) == before


@pytest.mark.parametrize(
    "mask, score", [("causal", None), ("causal & window(1024)", "softcap(s, 30.0)")]
)
@pytest.mark.parametrize("head_dim", [80, 192, 256])
def test_fp32_tiles_on_gpu(mask, score, head_dim):
    """The fp32 launch configurations of decision 082: the forward's 16 x 16
    tiles above d128, the backward's up to d128 (d80), and split-KV decoding's tiles of 16
    rows (one query row of GQA 8 / 2: 4 rows) and of 64 rows (16 query rows
    of GQA 8 / 2), on cache lengths off the key tiles."""
    from test_decode import _judge

    variant = make_variant(mask, score, dtype=ir.DType.FP32, head_dim=head_dim)
    for i, shape in enumerate([Shape(1, 2, 1, 1023, 2048), Shape(2, 4, 2, 200, 333)]):
        result = run_case(variant, shape, seed=i, device="cuda")
        _record(variant, result)
        assert_ok(result)
    result = run_grad_case(variant, Shape(1, 2, 1, 300, 457), seed=2, device="cuda")
    _record(variant, result)
    assert_ok(result)
    module = build(variant)
    g = torch.Generator(device="cuda").manual_seed(7)
    for n_queries in (1, 16):
        q = torch.randn(2, 8, n_queries, head_dim, device="cuda", generator=g)
        k, v = (torch.randn(2, 2, 1999, head_dim, device="cuda", generator=g) for _ in "kv")
        o = torch.empty_like(q)
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device="cuda")
        module._decode(q, k, v, o, lse, module.DEFAULT_SCALE, splits=4)
        for check in _judge(variant, q, k, v, o, lse):
            assert check.ok, (n_queries, check)


@pytest.mark.parametrize("mask", ["k < 8", "k == 63", "k >= 4 & k < 100"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_kernels_ptxas_fails_on_compile_with_fewer_stages_on_gpu(mask, head_dim):
    """Triton 3.6's ptxas crashed compiling the pipelined key loops of these
    masks (decision 067): the launch compiles them again with fewer stages,
    and the forward, a split-KV decode call and the backward match the
    float64 reference."""
    from test_decode import _judge

    variant = make_variant(mask, dtype=ir.DType.BF16, head_dim=head_dim)
    for i, shape in enumerate([Shape(1, 2, 1, 200, 200), Shape(2, 4, 2, 3, 300)]):
        result = run_case(variant, shape, seed=i, device="cuda")
        _record(variant, result)
        assert_ok(result)
    module = build(variant)
    g = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (
        torch.randn(2, 8, n, head_dim, device="cuda", generator=g).to(torch.bfloat16)
        for n in (1, 2000, 2000)
    )
    k, v = k[:, :2], v[:, :2]  # GQA 8 / 2
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device="cuda")
    module._decode(q, k, v, o, lse, module.DEFAULT_SCALE, splits=4)
    for check in _judge(variant, q, k, v, o, lse):
        assert check.ok, check
    result = run_grad_case(variant, Shape(1, 2, 2, 256, 256), seed=3, device="cuda")
    _record(variant, result)
    assert_ok(result)


@pytest.mark.parametrize("mask", ["!full", "causal & !causal", "k < 5 & k > 9"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_masks_that_hide_every_pair_on_gpu(mask, head_dim):
    """A mask that hides every pair compiles and computes (o = 0, lse = -inf,
    zero gradients) forward and backward at 16 bits and the head dims of the
    Gluon kernels, which leave it to the Triton kernels: Triton 3.6 failed to
    compile the Gluon dK/dV kernel for `causal & !causal` (H200, 2026-12-03)."""
    variant = make_variant(mask, dtype=ir.DType.BF16, head_dim=head_dim)
    for i, shape in enumerate([Shape(1, 2, 1, 128, 128), Shape(1, 2, 2, 4096, 4096)]):
        result = run_grad_case(variant, shape, seed=i, device="cuda")
        _record(variant, result)
        assert_ok(result)


@pytest.mark.parametrize("mask, score", [(m, s) for m, s, d in GLUON_BACKWARD_CASES if d == 128])
@pytest.mark.parametrize("dtype", [ir.DType.FP16, ir.DType.BF16])
def test_gluon_forward_any_mask_on_gpu(mask, score, dtype, monkeypatch):
    """The Gluon forward for any mask and score, forced on at every length
    and band width (`kernel_choice.GLUON_ANY_MIN_KEYS` = 0): forward against the
    float64 reference, rows that see no key included, and gradients through
    its log-sum-exp.  Counts its launches."""
    from flashgen import kernel_choice

    monkeypatch.setattr(kernel_choice, "GLUON_ANY_MIN_KEYS", 0)
    _check_gluon_forward(make_variant(mask, score, dtype=dtype, head_dim=128), 1024, monkeypatch)


@pytest.mark.parametrize("declared, mask", DATA_MASKS)
@pytest.mark.parametrize("dtype", [ir.DType.FP16, ir.DType.BF16])
def test_gluon_forward_any_over_runtime_data_on_gpu(declared, mask, dtype, monkeypatch):
    """Decision 098's knob `gluon_data_forward`: the any-mask Gluon forward
    walks the keys a call's plan leaves visible and takes its whole tiles
    from the plan.  Forward and backward (through its log-sum-exp) against
    the float64 reference at d128, Nq = Nk a multiple of 128 (GQA, two
    examples), documents of a few tokens and of about 150, at every length
    (GLUON_ANY_MIN_KEYS = 0); its launches are counted.  A plan built once by
    tile_plan() gives the same bits as the plan each call builds."""
    from flashgen import kernel_choice

    monkeypatch.setattr(kernel_choice, "GLUON_ANY_MIN_KEYS", 0)
    variant = make_variant(mask, dtype=dtype, head_dim=128, declared=declared)
    module = build(variant, {"gluon_data_forward": True})
    launches = _count_calls(monkeypatch, module, "_gluon_forward")
    cases = 0
    for q, k, v, data, _ in _checked_data_calls(variant, module):
        cases += 1
        plan = module.tile_plan(q, k, v, **data)
        outputs = [module.attention(q, k, v, **data, plan=p) for p in (None, plan)]
        assert torch.equal(*outputs)
    assert len(launches) == 4 * cases  # check_forward, check_backward, and the two calls


def _check_gluon_forward(variant, longest: int, monkeypatch) -> None:
    """`variant`'s Gluon forward against the float64 reference: one CTA's
    tile, GQA with several tiles, rows of `longest` keys, lengths of no
    multiple of 128, inputs x1 and x5, then gradients through its
    log-sum-exp; counts its launches, so that it cannot pass on the Triton
    fallback."""
    module = build(variant)
    launches = _count_calls(monkeypatch, module, "_gluon_forward")
    shapes = [Shape(1, 2, 2, 128, 128), Shape(2, 4, 2, 384, 384), Shape(1, 2, 1, longest, longest)]
    shapes += RAGGED_SHAPES
    for i, shape in enumerate(shapes):
        for magnitude in (1.0, 5.0):
            result = run_case(variant, shape, seed=i, device="cuda", magnitude=magnitude)
            _record(variant, result)
            assert_ok(result)
    assert len(launches) == 2 * len(shapes)
    result = run_grad_case(variant, Shape(1, 4, 2, 512, 512), seed=7, device="cuda")
    _record(variant, result)
    assert_ok(result)


# The Gluon forward at head dim 64: full and causal (its cuDNN race, on by
# default from kernel_choice.GLUON_PLAIN_MIN_KEYS keys), and masks and scores
# of the any-mask kernel (off by default there: GLUON_FORWARD_ANY_HEAD_DIMS).
GLUON_FORWARD_D64_CASES = [
    ("full", None),
    ("causal", None),
    ("causal & window(200)", None),
    ("k + 200 <= q", None),  # rows below 200 see no key
    ("causal & (q - k) % 3 != 1 & (h != 1 | k >= 64)", None),
    ("causal", "s + alibi"),
    ("full", "softcap(s, 20.0)"),
    ("causal | !(causal | abs(q - k) < 27)", "s + 0.05 * h"),  # a gap (decision 099)
    ("q != k", "s + alibi"),  # no interior (decision 099)
]


@pytest.mark.parametrize("mask, score", GLUON_FORWARD_D64_CASES)
@pytest.mark.parametrize("dtype", [ir.DType.FP16, ir.DType.BF16])
def test_gluon_forward_at_head_dim_64_on_gpu(mask, score, dtype, monkeypatch):
    """The Gluon forward at head dim 64 for every mask and score and on at
    every length (GLUON_FORWARD_ANY_HEAD_DIMS extended to 64, no fewest keys),
    as scripts/gpu_gluon_d64.sh times it: forward against the float64
    reference, GQA, several tiles per CTA, and gradients through its
    log-sum-exp.  Counts its launches."""
    from flashgen import kernel_choice

    monkeypatch.setattr(kernel_choice, "GLUON_FORWARD_ANY_HEAD_DIMS", (64, 128))
    monkeypatch.setattr(kernel_choice, "GLUON_PLAIN_MIN_KEYS", {})
    monkeypatch.setattr(kernel_choice, "GLUON_ANY_MIN_KEYS", 0)
    _check_gluon_forward(make_variant(mask, score, dtype=dtype, head_dim=64), 2048, monkeypatch)


def _check_gluon_dispatch(variant, below: int, monkeypatch) -> None:
    """The module as generated takes the Triton forward at `below` keys and the
    Gluon forward at GLUON_MIN_KEYS (4096), each against the float64
    reference, then the gradients through the Gluon forward; counts its
    launches."""
    module = build(variant)
    assert module.GLUON_MIN_KEYS == 4096
    launches = _count_calls(monkeypatch, module, "_gluon_forward")
    result = run_case(variant, Shape(1, 2, 1, below, below), seed=0, device="cuda")
    _record(variant, result)
    assert_ok(result)
    assert not launches
    result = run_case(variant, Shape(1, 2, 1, 4096, 4096), seed=1, device="cuda", magnitude=5.0)
    _record(variant, result)
    assert_ok(result)
    assert len(launches) == 1
    result = run_grad_case(variant, Shape(1, 2, 2, 4096, 4096), seed=2, device="cuda")
    _record(variant, result)
    assert_ok(result)
    assert len(launches) == 2


@pytest.mark.parametrize("name", ["mistral_sliding", "llama4_local", "bloom_alibi"])
def test_gluon_forward_any_mask_dispatch_on_gpu(name, monkeypatch):
    """The example modules as generated: the Gluon forward from
    GLUON_MIN_KEYS keys on (checked against the float64 reference, forward
    and gradients), the Triton forward below."""
    (variant,) = [v for v in example_variants() if v.name == name]
    _check_gluon_dispatch(variant, 2048, monkeypatch)


@pytest.mark.parametrize("mask", ["full", "causal"])
def test_gluon_forward_d64_plain_dispatch_on_gpu(mask, monkeypatch):
    """Full and causal at head dim 64 as generated (decision 068): the
    Triton forward below GLUON_PLAIN_MIN_KEYS[64] keys, the Gluon forward
    from there, both against the float64 reference, forward and gradients."""
    from flashgen import kernel_choice

    assert kernel_choice.GLUON_PLAIN_MIN_KEYS[64] == 4096
    _check_gluon_dispatch(make_variant(mask, dtype=ir.DType.BF16, head_dim=64), 4095, monkeypatch)


@pytest.mark.parametrize(
    "mask, score", [("causal | !(causal | abs(q - k) < 27)", "s + 0.05 * h"), ("q != k", "s")]
)
def test_gluon_forward_d64_split_walk_dispatch_on_gpu(mask, score, monkeypatch):
    """At head dim 64 a mask whose Triton key loop finds no interior or two
    takes the any-mask Gluon forward as generated under decision 099's rule
    (off by default until its held-out run): the Triton forward below
    GLUON_ANY_MIN_KEYS keys, the Gluon forward from there, both against the
    float64 reference, forward and gradients."""
    from flashgen import kernel_choice

    monkeypatch.setattr(kernel_choice, "GLUON_FORWARD_SPLIT_WALK_HEAD_DIMS", (64,))
    variant = make_variant(mask, score, dtype=ir.DType.BF16, head_dim=64)
    _check_gluon_dispatch(variant, 2048, monkeypatch)


@pytest.mark.parametrize("name", ["full", "mistral_sliding"])
def test_direct_launches_on_gpu(name, monkeypatch):
    """Repeat launches call the compiled kernels directly (`_launch`): Triton's
    launch path (whose pre-run hooks count here) is skipped, the results are
    bit for bit those of launches through Triton, and a pointer that loses
    its 16-byte alignment goes back through Triton for its own kernel."""
    import torch

    (variant,) = [v for v in example_variants() if v.name == name]
    module = build(dataclasses.replace(variant, dtype=ir.DType.FP16))
    through_triton = []
    kernel_names = ("_attn_fwd", "_attn_bwd_preprocess", "_attn_bwd", "_gluon_attn_fwd")
    for kernel_name in (*kernel_names, "_gluon_attn_bwd_dkdv", "_gluon_attn_bwd_dq"):
        kernel = getattr(module, kernel_name, None)
        if kernel is not None:
            count = lambda *args, **kwargs: through_triton.append(1)  # noqa: E731
            monkeypatch.setattr(kernel, "pre_run_hooks", [*kernel.pre_run_hooks, count])
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (2, 4, 384, module.HEAD_DIM)
    q, k, v, do = (
        torch.randn(shape, device="cuda", dtype=torch.float16, generator=gen) for _ in range(4)
    )

    def run(q):
        o, lse = module.forward(q, k, v)
        return (o, lse, *module.backward(q, k, v, o, lse, do))

    monkeypatch.setattr(module, "DIRECT_LAUNCH", False)
    expected = run(q)
    monkeypatch.setattr(module, "DIRECT_LAUNCH", True)
    run(q)  # through Triton once more: keeps the compiled kernels
    before = len(through_triton)
    direct = run(q)
    assert len(through_triton) == before
    for got, want in zip(direct, expected):
        assert torch.equal(got, want)

    buffer = torch.empty(q.numel() + 1, device="cuda", dtype=q.dtype)
    misaligned = buffer[1:].view(shape)  # 2 bytes past an aligned address
    misaligned.copy_(q)
    got = run(misaligned)
    assert len(through_triton) > before
    monkeypatch.setattr(module, "DIRECT_LAUNCH", False)
    for got_part, want in zip(got, run(misaligned)):
        assert torch.equal(got_part, want)


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("name", ["plain_causal", "mistral_sliding"])
def test_first_launch_in_a_new_thread_on_gpu(name, direct, monkeypatch):
    """A thread that has made no CUDA call has no current context, and Triton
    encodes TMA descriptors before its launcher binds one: the first forward
    and backward in such a thread (autograd's backward thread, a server's
    worker) ran into "invalid device context".  Each call here runs in a new
    thread, with the kernels compiled and without (`_COMPILED` cleared), and
    gives the main thread's bits."""
    import threading

    import torch

    (variant,) = [v for v in example_variants() if v.name == name]
    module = build(dataclasses.replace(variant, dtype=ir.DType.BF16))
    monkeypatch.setattr(module, "DIRECT_LAUNCH", direct)
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (1, 2, 512, module.HEAD_DIM)  # Nq = Nk a multiple of 128: the Gluon kernels on sm90
    q, k, v, do = (
        torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4)
    )

    def run():
        o, lse = module.forward(q, k, v)
        return (o, lse, *module.backward(q, k, v, o, lse, do))

    expected = run()
    torch.cuda.synchronize()
    for clear in (False, True):
        if clear:
            module._COMPILED.clear()
        got, failed = [], []

        def in_thread():
            try:
                got.extend(run())
                torch.cuda.synchronize()
            except Exception as exc:  # reported in the main thread
                failed.append(exc)

        thread = threading.Thread(target=in_thread)
        thread.start()
        thread.join()
        assert not failed, failed
        for a, b in zip(got, expected, strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["plain_causal", "gemma2_local"])
def test_compile_ahead_on_gpu(name, monkeypatch):
    """COMPILE_AHEAD: the first forward with a gradient compiles the
    backward's kernels in a worker thread, the backward compiles nothing
    more, and the gradients are the bits of a module without it."""
    import threading

    import torch
    import triton.runtime.jit as jit

    (variant,) = [v for v in example_variants() if v.name == name]
    variant = dataclasses.replace(variant, dtype=ir.DType.BF16, head_dim=128)
    compiles = []
    plain_compile = jit.JITFunction._do_compile

    def recorded(self, *args, **kwargs):
        compiles.append((self.fn.__name__, threading.current_thread().name))
        return plain_compile(self, *args, **kwargs)

    monkeypatch.setattr(jit.JITFunction, "_do_compile", recorded)
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (1, 2, 512, 128)  # Nq = Nk a multiple of 128: the Gluon kernels on sm90
    q, k, v, do = (
        torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4)
    )
    grads = []
    for ahead in (False, True):
        # A module of its own per pass (build memoizes by source): in one
        # module, the second pass would find every kernel compiled.
        module = build(dataclasses.replace(variant, name=f"{name}_ahead_{int(ahead)}"))
        monkeypatch.setattr(module, "COMPILE_AHEAD", ahead)
        monkeypatch.setattr(module, "_AHEAD", {})
        compiles.clear()
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        o = module.attention(*leaves)
        grads.append(torch.autograd.grad(o, leaves, do))
        torch.cuda.synchronize()
        workers = [name for _, name in compiles if name == "flashgen-compile"]
        assert bool(workers) is ahead, compiles
        if ahead:  # every backward kernel came from the worker
            backward = {n for n, t in compiles if t != "flashgen-compile" and "bwd" in n}
            assert not backward, compiles
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["full", "mistral_sliding"])
def test_inputs_on_another_gpu(name):
    """Inputs on a GPU other than the current one: the kernels launch on the
    inputs' GPU (forward, backward through autograd, and backward()), with the
    same results as on the current GPU, bit for bit."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    (variant,) = [v for v in example_variants() if v.name == name]
    module = build(dataclasses.replace(variant, dtype=ir.DType.FP16))
    gen = torch.Generator(device="cuda:0").manual_seed(0)
    shape = (2, 4, 384, module.HEAD_DIM)
    inputs = [
        torch.randn(shape, device="cuda:0", dtype=torch.float16, generator=gen) for _ in range(4)
    ]

    def run(device):
        q, k, v, do = (x.to(device) for x in inputs)
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        o, lse = module.attention(*leaves, return_lse=True)
        grads = torch.autograd.grad(o, leaves, do)
        direct = module.backward(q, k, v, *module.forward(q, k, v), do)
        return [x.to("cuda:0") for x in (o, lse, *grads, *direct)]

    assert torch.cuda.current_device() == 0
    for got, want in zip(run("cuda:1"), run("cuda:0")):
        assert torch.equal(got, want)


def test_tile_plan_on_another_gpu():
    """A plan built from tensors on a GPU other than the current one: its
    kernels (the data's tiles, the documents' runs) launch on that GPU, and
    calls with it give what they give on the current GPU, bit for bit."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    (variant,) = [v for v in example_variants() if v.name == "llama3_packed_docs"]
    module = build(variant)
    gen = torch.Generator(device="cuda:0").manual_seed(0)
    shape = (1, 4, 1024, module.HEAD_DIM)
    inputs = [
        torch.randn(shape, device="cuda:0", dtype=torch.bfloat16, generator=gen) for _ in range(4)
    ]
    doc = _document_ids([[300, 200, 524]], False, torch.Generator().manual_seed(0))

    def run(device):
        q, k, v, do = (x.to(device) for x in inputs)
        ids = doc.to(device)
        plan = module.tile_plan(q, k, v, doc=ids)
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        o, lse = module.attention(*leaves, doc=ids, plan=plan, return_lse=True)
        grads = torch.autograd.grad(o, leaves, do)
        return [x.to("cuda:0") for x in (o, lse, *grads)]

    assert torch.cuda.current_device() == 0
    for got, want in zip(run("cuda:1"), run("cuda:0")):
        assert torch.equal(got, want)


@settings(
    max_examples=int(os.environ.get("FLASHGEN_GPU_LANGUAGE_EXAMPLES", "24")),
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    variant=language_variants(dtypes=DRAWN_DTYPES, head_dims=(24, 64, 80, 128)),
    kv_heads=st.integers(1, 2),
    n_queries=st.sampled_from((239, 128, 17, 384, 1)),
    n_keys=st.sampled_from((203, 128, 384, 33, 1)),
    seed=st.integers(0, 2**16),
)
def test_whole_language_forward_and_backward_on_gpu(variant, kv_heads, n_queries, n_keys, seed):
    """Specs drawn from the whole language (every operator and function,
    integer and negative constants, softcaps from 1e-30 to 2.3e38), forward and
    backward, fp16, bf16 and fp32, odd and unequal lengths; Nq = Nk = 128 or
    384 at head dim 64 or 128 in 16 bits takes the Gluon backward.  The same
    body runs on the CPU in tests/test_gradients.py."""
    shape = Shape(1, 2 * kv_heads, kv_heads, n_queries, n_keys)
    for result in check_spec_both_ways(variant, shape, seed=seed, device="cuda"):
        _record(variant, result)


@pytest.mark.parametrize("dtype", [ir.DType.FP16, ir.DType.BF16, ir.DType.FP32])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_spec_at_the_nesting_limit_on_gpu(dtype, head_dim, monkeypatch):
    """Score and mask ir.MAX_EXPR_DEPTH levels deep: the Triton kernels
    compile them (odd, unequal lengths), and in 16 bits the Hopper Gluon
    forward ("any" mask, forced on whatever the score costs, d128) and backward (d64; at d128 this
    derivative takes the Triton backward, decision 060) do too (Nq = Nk =
    384); their launches are counted so that neither path passes on a
    fallback."""
    from flashgen import kernel_choice

    monkeypatch.setattr(kernel_choice, "GLUON_ANY_MIN_KEYS", 0)
    monkeypatch.setattr(kernel_choice, "GLUON_ANY_MAX_SPECIAL_OPS", 10**6)  # decision 089
    variant = deep_variant(dtype, head_dim)
    for i, shape in enumerate([Shape(1, 2, 1, 203, 239), Shape(1, 4, 2, 384, 384)]):
        for result in check_spec_both_ways(variant, shape, seed=i, device="cuda"):
            _record(variant, result)
    if dtype is not ir.DType.FP32:  # the any-mask Gluon forward is for head dim 128 only
        module = build(variant)
        gluon = "_gluon_forward" if head_dim == 128 else "_gluon_backward"
        launches = _count_calls(monkeypatch, module, gluon)
        check_spec_both_ways(variant, Shape(1, 4, 2, 384, 384), seed=5, device="cuda")
        assert launches


@pytest.mark.parametrize("dtype", [ir.DType.BF16, ir.DType.FP32])
@pytest.mark.parametrize("tma", [None, False])
def test_row_offsets_past_int32_on_gpu(dtype, tma):
    """K and V as (B, N, H, D) buffers seen as (B, H, N, D): a row stride of
    H * D = 4096 elements puts key rows past 2^19 beyond int32 offsets.  The
    mask shows only those keys, so an offset that wraps reads the wrong rows."""
    first = 2**19
    n_keys = first + 300
    variant = make_variant(f"k >= {first}", dtype=dtype, head_dim=256, align="top_left")
    torch_dtype = {ir.DType.BF16: torch.bfloat16, ir.DType.FP32: torch.float32}[dtype]
    generator = torch.Generator(device="cuda").manual_seed(0)

    def rows_view(n):  # (1, n, 16, 256) storage, two of its heads as (1, 2, n, 256)
        buffer = torch.randn((1, n, 16, 256), generator=generator, device="cuda")
        return buffer.to(torch_dtype)[:, :, :2].transpose(1, 2)

    q = torch.randn((1, 2, 64, 256), generator=generator, device="cuda").to(torch_dtype)
    k, v = rows_view(n_keys), rows_view(n_keys)
    assert k.stride(2) * (n_keys - 1) >= 2**31
    module = build(variant)
    result = check_forward(variant, module, q, k, v, tma=tma)
    _record(variant, result)
    assert_ok(result)
    result = check_backward(variant, module, q, k, v, generator=torch.Generator().manual_seed(1))
    _record(variant, result)
    assert_ok(result)
