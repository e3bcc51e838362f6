"""Attention sinks (gpt-oss): `attention(..., sinks=)`, one logit per query
head that joins every row's softmax sum with no value.

The kernels fold the sink into the forward's final sum (so the saved lse
includes it and the backward kernels need nothing new); the sinks' gradient
is a torch reduction of exp(sink - lse) and rowsum(dO * O) - dlse.  Both are
judged against float64 autograd through the reference's sink column
(`attention_ref(..., sinks=)`), which is checked here against the sink
written out by hand as an extra key with a zero value."""

from __future__ import annotations

import pytest
import torch

from flashgen import ir
from flashgen.reference import attention_ref
from flashgen.verify import GRADIENT_FACTOR, tolerance

from kernel_utils import DEVICE, build, make_variant

CPU = DEVICE == "cpu"
DTYPE = ir.DType.FP32 if CPU else ir.DType.BF16
HEAD_DIM = 16 if CPU else 64


@pytest.fixture
def _interpreter(monkeypatch):
    if CPU:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def test_the_reference_sink_is_a_key_with_a_zero_value():
    variant = make_variant("causal & q - k <= 3", head_dim=16, dtype=ir.DType.FP32)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 16, generator=g, dtype=torch.float64) for n in (5, 7, 7))
    sinks = torch.randn(3, generator=g, dtype=torch.float64)
    o, lse = attention_ref(variant, q, k, v, sinks=sinks)
    # By hand: scores of the visible keys, then the sink as one more column.
    scale = variant.scale if variant.scale is not None else 16**-0.5
    s = (q @ k.transpose(-1, -2)) * scale
    i = torch.arange(5)[:, None] + 2  # bottom-right: query row i at position i + Nk - Nq
    j = torch.arange(7)[None, :]
    s = torch.where((j <= i) & (i - j <= 3), s, float("-inf"))
    s = torch.cat([s, sinks.view(1, 3, 1, 1).expand(2, 3, 5, 1)], -1)
    p = torch.softmax(s, -1)
    assert torch.allclose(o, p[..., :-1] @ v)
    assert torch.allclose(lse, torch.logsumexp(s, -1))


def _loss(o, lse, do, dlse):
    return (o * do).sum() + (lse * dlse).sum()


@pytest.mark.kernels
@pytest.mark.parametrize(
    "mask, shape",
    [
        ("causal & window(20)", (2, 4, 2, 45, 70)),  # GQA, Nq < Nk
        ("causal & k >= 30", (1, 2, 1, 40, 33)),  # rows that see no key: lse = sink
        ("full", (1, 2, 2, 1, 1)),
        ("(q - k) % 3 == 0", (1, 2, 1, 40, 33)),  # residue classes (decision 085)
    ],
)
def test_sinks_match_the_reference_forward_and_backward(mask, shape, _interpreter):
    variant = make_variant(mask, dtype=DTYPE, head_dim=HEAD_DIM)
    module = build(variant)
    batch, heads, kv_heads, nq, nk = shape
    if not CPU:  # lengths across the GPU's tiles
        nq, nk = nq * 5, nk * 5
    g = torch.Generator().manual_seed(1)
    dtype = module.DTYPE

    def rand(*size):
        return torch.randn(*size, generator=g).to(device=DEVICE, dtype=dtype)

    q, k, v = rand(batch, heads, nq, HEAD_DIM), *(rand(batch, kv_heads, nk, HEAD_DIM) for _ in "kv")
    sinks = (2 * torch.randn(heads, generator=g)).to(DEVICE)
    do, dlse = rand(batch, heads, nq, HEAD_DIM), torch.randn(batch, heads, nq, generator=g).to(
        DEVICE
    )

    def run(fn, cast):
        leaves = [x.detach().to(cast).requires_grad_() for x in (q, k, v, sinks)]
        o, lse = fn(*leaves)
        grads = torch.autograd.grad(_loss(o, lse, do.to(o.dtype), dlse.to(lse.dtype)), leaves)
        return [o.detach(), lse.detach(), *grads]

    kernel = run(lambda a, b, c, s: module.attention(a, b, c, sinks=s, return_lse=True), dtype)
    ref = run(lambda a, b, c, s: attention_ref(variant, a, b, c, sinks=s), torch.float64)
    ordinary = run(lambda a, b, c, s: attention_ref(variant, a, b, c, sinks=s, dtype=dtype), dtype)
    assert torch.isfinite(kernel[1]).all()  # every row sees at least its sink
    for name, x, r, y in zip(("o", "lse", "dq", "dk", "dv", "dsinks"), kernel, ref, ordinary):
        factor = 2.0 if name in ("o", "lse") else GRADIENT_FACTOR
        check = tolerance(x.cpu(), r.cpu(), y.cpu(), dtype, what=name, factor=factor)
        assert check.ok, (name, check)
    again = run(lambda a, b, c, s: module.attention(a, b, c, sinks=s, return_lse=True), dtype)
    for x, y in zip(kernel[2:], again[2:]):  # deterministic: the same bits every call
        assert torch.equal(x, y)


@pytest.mark.kernels
def test_sinks_with_varlen_sequences(_interpreter):
    """Sinks apply per head to every sequence's rows; their gradient sums the
    sequences' rows, as the references of the sequences alone do."""
    variant = make_variant("causal", dtype=DTYPE, head_dim=HEAD_DIM)
    module = build(variant)
    g = torch.Generator().manual_seed(2)
    dtype = module.DTYPE
    lengths = [7, 0, 40] if CPU else [70, 0, 300]
    total = sum(lengths)
    q, k, v, do = (
        torch.randn(total, 2, HEAD_DIM, generator=g).to(device=DEVICE, dtype=dtype)
        for _ in range(4)
    )
    sinks = torch.randn(2, generator=g).to(DEVICE)
    cu = torch.tensor([0, lengths[0], lengths[0], total], dtype=torch.int32, device=DEVICE)
    spans = ((0, lengths[0]), (lengths[0] + lengths[1], total))

    def run(fn, cast):
        leaf = sinks.detach().to(cast).requires_grad_()
        outs = fn(leaf)
        loss = sum((o * do[a:b].to(cast)).sum() for o, (a, b) in zip(outs, spans))
        return [o.detach() for o in outs] + list(torch.autograd.grad(loss, leaf))

    def alone(cast):
        def fn(leaf):
            parts = ([x[a:b].transpose(0, 1)[None].to(cast) for x in (q, k, v)] for a, b in spans)
            outs = (attention_ref(variant, *p, sinks=leaf, dtype=cast)[0] for p in parts)
            return [o[0].transpose(0, 1) for o in outs]

        return fn

    def kernel(leaf):
        o = module.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, sinks=leaf)
        return [o[a:b] for a, b in spans]

    results = run(kernel, torch.float32), run(alone(torch.float64), torch.float64)
    ordinary = run(alone(torch.float32 if CPU else dtype), torch.float32 if CPU else dtype)
    for name, x, r, y in zip(("o 1", "o 2", "dsinks"), *results, ordinary):
        factor = GRADIENT_FACTOR if name == "dsinks" else 2.0
        check = tolerance(
            x.float().cpu(), r.cpu(), y.float().cpu(), dtype, what=name, factor=factor
        )
        assert check.ok, (name, check)


@pytest.mark.kernels
def test_bad_sinks_get_errors_naming_them(_interpreter):
    module = build(make_variant("causal", dtype=DTYPE, head_dim=HEAD_DIM))
    q = torch.zeros(1, 2, 4, HEAD_DIM, dtype=module.DTYPE, device=DEVICE)
    for sinks, error, words in (
        (torch.zeros(3, device=DEVICE), ValueError, r"sinks must have shape \(2,\)"),
        (torch.zeros(2, dtype=torch.int32, device=DEVICE), TypeError, "sinks must be a real"),
        ([0.0, 1.0], TypeError, "sinks must be a real"),
        (torch.zeros(2, device="meta"), ValueError, "sinks is on meta"),
    ):
        with pytest.raises(error, match=words):
            module.attention(q, q, q, sinks=sinks)
