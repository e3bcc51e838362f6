"""Position offsets: `attention(..., q_offset=, k_offset=)` puts query row i
at position i + q_offset and key row j at j + k_offset, in place of the
spec's alignment (a chunk of a prefill, a shard of a sequence).

The reference takes the same offsets (`attention_ref(..., offsets=)`); it is
checked here against identities that do not use them (a query offset is a
slice of a longer problem's rows; a shift of both leaves relative masks and
scores alone; an absolute mask moves with the keys), and the kernels are
judged against it by the 2x/3x rule, forward and backward."""

from __future__ import annotations

import pytest
import torch

from flashgen import ir
from flashgen.reference import attention_ref, mask_matrix
from flashgen.verify import GRADIENT_FACTOR, tolerance

from kernel_utils import DEVICE, build, make_variant

CPU = DEVICE == "cpu"
DTYPE = ir.DType.FP32 if CPU else ir.DType.BF16
HEAD_DIM = 16 if CPU else 64


@pytest.fixture
def _interpreter(monkeypatch):
    if CPU:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _qkv(nq, nk, heads=2, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, heads, n, d, generator=g, dtype=torch.float64) for n in (nq, nk, nk))


def test_a_query_offset_is_a_slice_of_a_longer_problem():
    variant = make_variant("causal | prefix(4)", align="top_left", head_dim=16)
    q, k, v = _qkv(30, 20)
    o, lse = attention_ref(variant, q[:, :, 10:17], k, v, offsets=(10, 0))
    full_o, full_lse = attention_ref(variant, q, k, v, rows=range(10, 17))
    assert torch.equal(o, full_o) and torch.equal(lse, full_lse)


def test_shifting_both_leaves_a_relative_variant_alone():
    variant = make_variant("window(5, 2) & (q - k) % 3 != 1", "s + alibi", head_dim=16)
    q, k, v = _qkv(9, 12)
    reference = attention_ref(variant, q, k, v, offsets=(3, 0))
    for shift in (1, 50, 1000):
        shifted = attention_ref(variant, q, k, v, offsets=(3 + shift, shift))
        assert all(torch.allclose(a, b) for a, b in zip(reference, shifted))


def test_an_absolute_mask_moves_with_the_keys():
    variant = make_variant("prefix(10)", align="top_left", head_dim=16)
    visible = mask_matrix(variant, 4, 8, 1, offsets=(20, 6))
    expected = (torch.arange(8) + 6 < 10).expand(1, 4, 8)  # keys at 6 .. 13, prefix below 10
    assert torch.equal(visible, expected)


SPECS = {
    "causal": ("causal", None, {}),
    "prefix, top-left": ("causal | prefix(40)", None, {"align": "top_left"}),
    "chunks and alibi": ("causal & chunk(24)", "s + alibi", {}),
    "window, periodic": ("window(20, 5) & (q - k) % 3 != 1", "s - 0.05 * abs(q - k)", {}),
    # Residue classes (decision 085): the offsets decide each class's keys.
    "causal, every third key": ("causal & (q - k) % 3 == 1", "s - 0.05 * abs(q - k)", {}),
}
# (q_offset, k_offset, Nq, Nk): a prefill chunk after a cache, a shard of
# keys ahead of the queries (rows that see nothing), both past a tile.
OFFSETS = [(0, 0, 33, 47), (37, 5, 20, 70), (5, 90, 45, 33), (1000, 990, 17, 40)]


@pytest.mark.kernels
@pytest.mark.parametrize("name", sorted(SPECS))
def test_offsets_match_the_reference(name, _interpreter):
    mask, score, settings = SPECS[name]
    variant = make_variant(mask, score, dtype=DTYPE, head_dim=HEAD_DIM, **settings)
    module = build(variant)
    dtype = module.DTYPE
    g = torch.Generator().manual_seed(3)
    for q_offset, k_offset, nq, nk in OFFSETS:
        if not CPU:  # across the GPU's tiles
            nq, nk = 3 * nq, 3 * nk

        def rand(*size):
            return torch.randn(*size, generator=g).to(device=DEVICE, dtype=dtype)

        q, k, v, do = (
            rand(2, 4, nq, HEAD_DIM),
            rand(2, 2, nk, HEAD_DIM),
            rand(2, 2, nk, HEAD_DIM),
            rand(2, 4, nq, HEAD_DIM),
        )
        dlse = torch.randn(2, 4, nq, generator=g).to(DEVICE)

        def run(fn, cast):
            leaves = [x.detach().to(cast).requires_grad_() for x in (q, k, v)]
            o, lse = fn(*leaves)
            weights = torch.where(torch.isfinite(lse), dlse.to(lse.dtype), 0.0)
            loss = (o * do.to(cast)).sum() + (
                torch.where(torch.isfinite(lse), lse, 0.0) * weights
            ).sum()
            return [o.detach(), lse.detach(), *torch.autograd.grad(loss, leaves)]

        offsets = dict(q_offset=q_offset, k_offset=k_offset)
        kernel = run(lambda a, b, c: module.attention(a, b, c, return_lse=True, **offsets), dtype)
        at = (q_offset, k_offset)
        ref = run(lambda a, b, c: attention_ref(variant, a, b, c, offsets=at), torch.float64)
        ordinary = run(
            lambda a, b, c: attention_ref(variant, a, b, c, offsets=at, dtype=dtype), dtype
        )
        for what, x, r, y in zip(("o", "lse", "dq", "dk", "dv"), kernel, ref, ordinary):
            factor = 2.0 if what in ("o", "lse") else GRADIENT_FACTOR
            check = tolerance(x.cpu(), r.cpu(), y.cpu(), dtype, what=what, factor=factor)
            assert check.ok, (at, nq, nk, check)


@pytest.mark.kernels
def test_offsets_apply_to_every_sequence_of_a_varlen_call(_interpreter):
    variant = make_variant("causal | prefix(8)", dtype=DTYPE, head_dim=HEAD_DIM, align="top_left")
    module = build(variant)
    g = torch.Generator().manual_seed(4)
    lengths = [5, 40] if CPU else [50, 300]
    q, k, v = (
        torch.randn(sum(lengths), 2, HEAD_DIM, generator=g).to(device=DEVICE, dtype=module.DTYPE)
        for _ in "qkv"
    )
    cu = torch.tensor([0, lengths[0], sum(lengths)], dtype=torch.int32, device=DEVICE)
    o = module.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, q_offset=6, k_offset=2)
    for a, b in ((0, lengths[0]), (lengths[0], sum(lengths))):
        part = [x[a:b].transpose(0, 1)[None] for x in (q, k, v)]
        ref, _ = attention_ref(variant, *(x.double() for x in part), offsets=(6, 2))
        ordinary, _ = attention_ref(variant, *part, offsets=(6, 2), dtype=module.DTYPE)
        mine = o[a:b].transpose(0, 1)[None]
        check = tolerance(mine.cpu(), ref.cpu(), ordinary.cpu(), module.DTYPE)
        assert check.ok, check


@pytest.mark.kernels
def test_bad_offsets_get_errors_naming_them(_interpreter):
    module = build(make_variant("causal", dtype=DTYPE, head_dim=HEAD_DIM))
    q = torch.zeros(1, 2, 4, HEAD_DIM, dtype=module.DTYPE, device=DEVICE)
    for kwargs, error, words in (
        (dict(q_offset=-1), ValueError, "q_offset must be >= 0"),
        (dict(k_offset=1.5), TypeError, "k_offset must be an int"),
        (dict(k_offset=module.MAX_SEQ_LEN), ValueError, "k_offset \\+ 4 rows passes"),
    ):
        with pytest.raises(error, match=words):
            module.attention(q, q, q, **kwargs)
