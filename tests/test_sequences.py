"""Padded and varlen calls: `attention(..., seqlens_q=, seqlens_k=,
padding_side=)` and `attention(..., cu_seqlens_q=, cu_seqlens_k=)`.

Each sequence of such a call must be attended as if alone: positions from 0,
the spec's Nq and Nk its own lengths.  So each sequence is judged two ways:
against the float64 reference of the sequence alone, by the one tolerance
rule (forward and backward, `check_forward`/`check_backward` through an
adapter that runs the sequence inside a batch of random neighbours), and
bit for bit against the same module called on the sequence alone, which
walks the same tiles in the same order.  Padding is filled with large
values, so anything read from it shows."""

from __future__ import annotations

import functools
import itertools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashgen import ir

from kernel_utils import DEVICE, build, make_variant
from strategies import variants

# Masks and scores whose positions matter in different ways: relative
# (causal, windows, ALiBi), absolute (prefix, chunks), bottom-right or
# top-left alignment, a periodic mask, a score of positions.
SPECS = {
    "causal": ("causal", None, {}),
    "causal, top-left": ("causal", None, {"align": "top_left"}),
    "prefix": ("causal | prefix(9)", None, {}),
    "chunks and alibi": ("causal & chunk(24)", "s + alibi", {}),
    "window, periodic, top-left": (
        "window(20, 5) & (q - k) % 3 != 1",
        "s - 0.05 * abs(q - k)",
        {"align": "top_left"},
    ),
    # Residue classes (decision 085): each sequence's own lengths decide its
    # classes of keys (bottom-right positions).
    "causal, every third key": ("causal & (q - k) % 3 == 1", "s + alibi", {}),
}
# (queries, keys) of the sequence judged: lengths 1, tiles (the
# interpreter's 32, the GPU's 64 and 128) crossed and not, more queries than
# keys and fewer.  On a GPU (`kernel_utils.DEVICE`) these run in 16-bit.
CPU = DEVICE == "cpu"
LENGTHS = [(1, 1), (33, 47), (47, 33), (64, 5), (17, 70)]
if not CPU:
    LENGTHS += [(129, 200), (200, 129), (300, 7), (17, 333)]
HEADS, KV_HEADS, HEAD_DIM = 2, 1, 16 if CPU else 64
FLOAT = ir.DType.FP32 if CPU else ir.DType.BF16
HALF = ir.DType.FP16


@pytest.fixture
def _interpreter(monkeypatch):
    if CPU:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _variant(name: str, dtype=FLOAT) -> ir.Variant:
    mask, score, settings = SPECS[name]
    return make_variant(mask, score, dtype=dtype, head_dim=HEAD_DIM, **settings)


def _rand(*shape, dtype, generator, scale=1.0):
    return (scale * torch.randn(*shape, generator=generator)).to(device=DEVICE, dtype=dtype)


class _InBatch:
    """The module's calls on one sequence (1, H, n, D), run as sequence
    `index` of a varlen or padded batch with random neighbours; o, lse and
    the gradients come back for that sequence only."""

    def __init__(self, module, layout: str, index: int, neighbours, generator):
        self.module, self.layout, self.index = module, layout, index
        dtype = module.DTYPE
        # Neighbours: (queries, keys) each; their q, k, v are random and large.
        self.others = [
            tuple(
                _rand(n, h, HEAD_DIM, dtype=dtype, generator=generator, scale=30.0)
                for n, h in ((nq, HEADS), (nk, KV_HEADS), (nk, KV_HEADS))
            )
            for nq, nk in neighbours
        ]
        self.generator = generator

    def forward(self, q, k, v, scale=None):
        o, lse = self.attention(q, k, v, scale=scale, return_lse=True)
        return o.detach(), lse.detach()

    def attention(self, q, k, v, *, scale=None, return_lse=False):
        mine = tuple(x[0].transpose(0, 1) for x in (q, k, v))  # (n, heads, D)
        seqs = self.others[: self.index] + [mine] + self.others[self.index :]
        if self.layout == "varlen":
            o, lse = self._varlen(seqs, scale)
        else:
            o, lse = self._padded(seqs, scale)
        return (o, lse) if return_lse else o

    def _varlen(self, seqs, scale):
        cu = [[0], [0]]
        for s in seqs:
            cu[0].append(cu[0][-1] + s[0].shape[0])
            cu[1].append(cu[1][-1] + s[1].shape[0])
        q, k, v = (torch.cat([s[i] for s in seqs]) for i in range(3))
        cu_q, cu_k = (torch.tensor(c, dtype=torch.int32, device=DEVICE) for c in cu)
        o, lse = self.module.attention(
            q, k, v, scale=scale, return_lse=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k
        )
        rows = slice(cu[0][self.index], cu[0][self.index + 1])
        return o[rows].transpose(0, 1)[None], lse[:, rows][None]

    def _padded(self, seqs, scale):
        side = self.layout
        lengths = [[s[0].shape[0] for s in seqs], [s[1].shape[0] for s in seqs]]
        longest = [max(n) + 3 for n in lengths]  # every row padded, some more
        batch = []
        for s in seqs:
            padded = []
            for x, n in zip(s, (longest[0], longest[1], longest[1])):
                pad = _rand(n - x.shape[0], *x.shape[1:], dtype=x.dtype, generator=self.generator)
                pad = pad * 1e3
                padded.append(torch.cat([pad, x] if side == "left" else [x, pad]))
            batch.append(padded)
        q, k, v = (torch.stack([b[i] for b in batch]).transpose(1, 2) for i in range(3))
        seqlens_q, seqlens_k = (torch.tensor(n, dtype=torch.int32, device=DEVICE) for n in lengths)
        o, lse = self.module.attention(
            q, k, v, scale=scale, return_lse=True, seqlens_q=seqlens_q, seqlens_k=seqlens_k,
            padding_side=side,
        )  # fmt: skip
        n = lengths[0][self.index]
        rows = slice(longest[0] - n, longest[0]) if side == "left" else slice(0, n)
        return o[self.index : self.index + 1, :, rows], lse[self.index : self.index + 1, :, rows]


@pytest.mark.kernels
@pytest.mark.parametrize("layout", ["varlen", "right", "left"])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_each_sequence_matches_the_reference_of_the_sequence_alone(name, layout, _interpreter):
    from flashgen.verify import Shape, check_backward, check_forward, random_inputs

    variant = _variant(name)
    module = build(variant)
    generator = torch.Generator().manual_seed(1)
    neighbours = [(40, 3), (0, 9), (5, 0), (70, 66)]
    for i, (nq, nk) in enumerate(LENGTHS):
        adapter = _InBatch(module, layout, i % 3, neighbours[i % 2 :][:2], generator)
        shape = Shape(1, HEADS, KV_HEADS, nq, nk)
        q, k, v = random_inputs(shape, HEAD_DIM, module.DTYPE, DEVICE, generator=generator)
        forward = check_forward(variant, adapter, q, k, v)
        backward = check_backward(variant, adapter, q, k, v, generator=generator)
        for result in (forward, backward):
            assert result.ok, (nq, nk, [(c.what, c.error, c.bound) for c in result.checks])


def _grads(module, q, k, v, do, dlse, **kwargs):
    """o, lse and the gradients of sum(o * do) + sum(lse * dlse) over finite lse."""
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    o, lse = module.attention(q, k, v, return_lse=True, **kwargs)
    weights = torch.where(torch.isfinite(lse), dlse, 0.0)
    loss = (o * do).sum() + (torch.where(torch.isfinite(lse), lse, 0.0) * weights).sum()
    dq, dk, dv = torch.autograd.grad(loss, (q, k, v))
    return o.detach(), lse.detach(), dq, dk, dv


def _alone(module, q, k, v, do, dlse):
    """The same for one sequence called alone, by the Triton kernels with the
    launch configurations and pointer loads of padded and varlen calls (a GPU
    would otherwise take TMA or the Gluon kernels)."""
    fwd, bwd = (module._launch_config(q.device, backward=b) for b in (False, True))
    o, lse = module.forward(
        q, k, v, **dict(zip(("block_m", "block_n", "num_warps", "num_stages"), fwd)), tma=False
    )
    dlse = torch.where(torch.isfinite(lse), dlse, 0.0)
    launch = dict(zip(("block_m", "block_n", "num_warps", "num_stages"), bwd))
    return (o, lse, *module.backward(q, k, v, o, lse, do, dlse, **launch, tma=False))


@pytest.mark.kernels
@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_rows_equal_the_unpadded_call_bit_for_bit(side, _interpreter):
    """A padded batch against each row alone, outputs and gradients; the
    padding's rows are 0 in o and in every gradient, -inf in lse."""
    module = build(_variant("chunks and alibi", HALF))
    g = torch.Generator().manual_seed(2)
    lengths_q, lengths_k = [40, 17, 0, 1, 33], [50, 33, 5, 1, 0]
    if not CPU:
        lengths_q, lengths_k = lengths_q + [130, 200], lengths_k + [260, 129]
    nq, nk, dtype = max(lengths_q) + 1, max(lengths_k) + 2, torch.float16
    batch = len(lengths_q)
    q = _rand(batch, HEADS, nq, HEAD_DIM, dtype=dtype, generator=g)
    k, v = (_rand(batch, KV_HEADS, nk, HEAD_DIM, dtype=dtype, generator=g) for _ in range(2))
    do = _rand(batch, HEADS, nq, HEAD_DIM, dtype=dtype, generator=g)
    dlse = torch.randn(batch, HEADS, nq, generator=g).to(DEVICE)
    seqlens = dict(
        seqlens_q=torch.tensor(lengths_q, dtype=torch.int32, device=DEVICE),
        seqlens_k=torch.tensor(lengths_k, dtype=torch.int64, device=DEVICE),
    )
    o, lse, dq, dk, dv = _grads(module, q, k, v, do, dlse, padding_side=side, **seqlens)
    for b, (a, c) in enumerate(zip(lengths_q, lengths_k)):
        rq = slice(nq - a, nq) if side == "left" else slice(0, a)
        rk = slice(nk - c, nk) if side == "left" else slice(0, c)
        pad_q = torch.ones(nq, dtype=torch.bool, device=DEVICE)
        pad_q[rq] = False
        pad_k = torch.ones(nk, dtype=torch.bool, device=DEVICE)
        pad_k[rk] = False
        assert not o[b][:, pad_q].any() and not dq[b][:, pad_q].any()
        assert (lse[b][:, pad_q] == float("-inf")).all()
        assert not dk[b][:, pad_k].any() and not dv[b][:, pad_k].any()
        if a == 0:
            continue
        alone = _alone(
            module, q[b : b + 1, :, rq], k[b : b + 1, :, rk], v[b : b + 1, :, rk],
            do[b : b + 1, :, rq], dlse[b : b + 1, :, rq],
        )  # fmt: skip
        batched = (o, lse, dq, dk, dv)
        for name, x, y, rows in zip(("o", "lse", "dq", "dk", "dv"), batched, alone, "qqqkk"):
            part = x[b : b + 1, :, rq if rows == "q" else rk]
            assert torch.equal(part, y), (b, name)


@pytest.mark.kernels
def test_varlen_sequences_equal_calls_alone_with_gqa_and_empty_sequences(_interpreter):
    module = build(_variant("prefix", HALF))
    g = torch.Generator().manual_seed(3)
    lengths = [(13, 20), (0, 1), (27, 0), (33, 33), (1, 40), (0, 0)]
    if not CPU:
        lengths += [(130, 260), (257, 129)]
    count = len(lengths)
    cu_q = torch.tensor([0] + [sum(n for n, _ in lengths[: i + 1]) for i in range(count)])
    cu_k = torch.tensor([0] + [sum(n for _, n in lengths[: i + 1]) for i in range(count)])
    longest = [max(n) for n in zip(*lengths)]
    tq, tk = int(cu_q[-1]), int(cu_k[-1])
    q = _rand(tq, HEADS, HEAD_DIM, dtype=torch.float16, generator=g)
    k, v = (_rand(tk, KV_HEADS, HEAD_DIM, dtype=torch.float16, generator=g) for _ in range(2))
    do = _rand(tq, HEADS, HEAD_DIM, dtype=torch.float16, generator=g)
    dlse = torch.randn(HEADS, tq, generator=g).to(DEVICE)
    o, lse, dq, dk, dv = _grads(
        module, q, k, v, do, dlse, cu_seqlens_q=cu_q.to(DEVICE, torch.int32),
        cu_seqlens_k=cu_k.to(DEVICE), max_seqlen_q=longest[0], max_seqlen_k=longest[1],
    )  # fmt: skip
    assert o.shape == (tq, HEADS, HEAD_DIM) and lse.shape == (HEADS, tq)
    for i in range(len(lengths)):
        rq, rk = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        if rq.start == rq.stop:
            continue
        if rk.start == rk.stop:  # no keys: o 0, lse -inf, no gradient
            assert not o[rq].any() and (lse[:, rq] == float("-inf")).all()
            assert not dq[rq].any()
            continue
        alone = _alone(
            module, *(x[r].transpose(0, 1)[None] for x, r in ((q, rq), (k, rk), (v, rk), (do, rq))),
            dlse[:, rq][None],
        )  # fmt: skip
        alone = [alone[0][0].transpose(0, 1), alone[1][0]] + [
            x[0].transpose(0, 1) for x in alone[2:]
        ]
        batched = (o[rq], lse[:, rq], dq[rq], dk[rk], dv[rk])
        for name, x, y in zip(("o", "lse", "dq", "dk", "dv"), batched, alone):
            assert torch.equal(x, y), (i, name)


@pytest.mark.kernels
def test_packed_documents_given_by_ids_are_a_varlen_batch(_interpreter, monkeypatch):
    """`sequences(documents=doc)`: each run of one id along a row of doc (B, N)
    is a sequence of the B * N tokens, so packed (B, N, H, D) tensors seen as
    (B * N, H, D) attend within their documents as a varlen call of those
    runs (an id that comes back in a row starts a new run, and a row's first
    token always does).  The call equals the one given the runs' cu_seqlens,
    bit for bit, forward and backward; bad ids get errors naming the argument."""
    module = build(_variant("causal", HALF))
    g = torch.Generator().manual_seed(2)
    doc = torch.tensor([[5] * 13 + [7] * 20 + [5] * 7, [5] * 1 + [2] * 39], device=DEVICE)
    runs = [0, 13, 33, 40, 41, 80]
    assert module._document_runs(doc).tolist() == runs
    assert module._document_runs(doc.to(torch.int32)[:, :0]).tolist() == [0]
    q = _rand(2, 40, HEADS, HEAD_DIM, dtype=torch.float16, generator=g)
    k, v = (_rand(2, 40, KV_HEADS, HEAD_DIM, dtype=torch.float16, generator=g) for _ in "kv")
    do = _rand(80, HEADS, HEAD_DIM, dtype=torch.float16, generator=g)
    dlse = torch.randn(HEADS, 80, generator=g).to(DEVICE)
    packed = [x.reshape(80, *x.shape[2:]) for x in (q, k, v)]
    seqs = module.sequences(documents=doc)
    got = _grads(module, *packed, do, dlse, sequences=seqs)
    cu = torch.tensor(runs, dtype=torch.int32, device=DEVICE)
    want = _grads(module, *packed, do, dlse, cu_seqlens_q=cu, cu_seqlens_k=cu)
    assert all(torch.equal(x, y) for x, y in zip(got, want))
    for bad, error, message in [
        (doc.float(), TypeError, "documents must be an int32 or int64 tensor"),
        (doc[0], ValueError, r"documents must have shape \(B, N\), got \(40,\)"),
    ]:
        with pytest.raises(error, match=message):
            module.sequences(documents=bad)
    with pytest.raises(ValueError, match="pass documents= alone"):
        module.sequences(documents=doc, cu_seqlens_q=cu, cu_seqlens_k=cu)
    monkeypatch.setattr(module, "_capturing", lambda x: True)
    with pytest.raises(ValueError, match="documents= reads where runs start on the host"):
        module.sequences(documents=doc)


class _PoisonedTorch:
    """torch for a module whose floating-point torch.empty, empty_like and
    empty_strided come filled with NaN, so that a row no kernel writes shows."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def _poison(x):
        return x.fill_(float("nan")) if x.is_floating_point() else x

    def empty(self, *args, **kwargs):
        return self._poison(torch.empty(*args, **kwargs))

    def empty_like(self, *args, **kwargs):
        return self._poison(torch.empty_like(*args, **kwargs))

    def empty_strided(self, *args, **kwargs):
        return self._poison(torch.empty_strided(*args, **kwargs))


@pytest.mark.kernels
@pytest.mark.parametrize("captured", [False, True])
def test_varlen_calls_write_every_row_of_their_outputs(captured, _interpreter, monkeypatch):
    """A varlen call's outputs and gradients start as torch.empty but for
    their rows past the last sequence (decision 108), which are filled on
    the host, or while a CUDA graph is captured (forced here) on the GPU
    (`_fill_rows_past`).  With every empty float tensor of the module
    filled with NaN: no NaN comes back; rows past the last sequence (q and
    k have rows to spare) hold o = 0, lse = -inf and no gradient; the keys
    of a sequence without queries get no gradient; and every row of every
    sequence equals the call made without the poison."""
    module = build(_variant("prefix", HALF))
    g = torch.Generator().manual_seed(11)
    lengths = [(13, 20), (0, 1), (27, 0), (33, 33), (0, 0), (5, 2)]
    cu_q = torch.tensor([0, *itertools.accumulate(n for n, _ in lengths)], dtype=torch.int32)
    cu_k = torch.tensor([0, *itertools.accumulate(n for _, n in lengths)], dtype=torch.int32)
    tq, tk = int(cu_q[-1]), int(cu_k[-1])
    q = _rand(tq + 5, HEADS, HEAD_DIM, dtype=torch.float16, generator=g)
    k, v = (_rand(tk + 3, KV_HEADS, HEAD_DIM, dtype=torch.float16, generator=g) for _ in "kv")
    do = _rand(tq + 5, HEADS, HEAD_DIM, dtype=torch.float16, generator=g)
    dlse = torch.randn(HEADS, tq + 5, generator=g).to(DEVICE)
    varlen = dict(
        cu_seqlens_q=cu_q.to(DEVICE), cu_seqlens_k=cu_k.to(DEVICE), max_seqlen_q=33,
        max_seqlen_k=33,
    )  # fmt: skip
    expected = _grads(module, q, k, v, do, dlse, **varlen)
    monkeypatch.setattr(module, "torch", _PoisonedTorch())
    if captured:
        monkeypatch.setattr(module, "_capturing", lambda x: True)
    o, lse, dq, dk, dv = got = _grads(module, q, k, v, do, dlse, **varlen)
    monkeypatch.undo()
    assert not any(x.isnan().any() for x in got)
    assert not o[tq:].any() and (lse[:, tq:] == float("-inf")).all() and not dq[tq:].any()
    assert not dk[tk:].any() and not dv[tk:].any()
    assert not dk[20:21].any() and not dv[20:21].any()  # sequence 1: a key, no query
    rows = (slice(0, tq), (slice(None), slice(0, tq)), slice(0, tq), slice(0, tk), slice(0, tk))
    for name, x, y, r in zip(("o", "lse", "dq", "dk", "dv"), got, expected, rows):
        assert torch.equal(x[r], y[r]), name


@pytest.mark.kernels
def test_bad_lengths_get_errors_naming_the_argument(_interpreter):
    module = build(_variant("causal", HALF))
    q = torch.zeros(2, HEADS, 8, HEAD_DIM, dtype=torch.float16, device=DEVICE)
    k = v = torch.zeros(2, KV_HEADS, 8, HEAD_DIM, dtype=torch.float16, device=DEVICE)
    i32 = torch.int32
    t = functools.partial(torch.tensor, device=DEVICE)
    cases = [
        (dict(seqlens_k=t([8, 9], dtype=i32)), ValueError, "seqlens_k has a length 9, past k's 8"),
        (
            dict(seqlens_q=t([1, -1], dtype=i32)),
            ValueError,
            r"seqlens_q\[1\] = -1: .* non-negative",
        ),
        (
            dict(seqlens_q=t([1]), seqlens_k=t([1, 3])),
            ValueError,
            r"seqlens_k must have shape \(1,",
        ),
        (dict(seqlens_k=t([1, 2, 3], dtype=i32)), ValueError, "q has batch size 2, but the seq"),
        (dict(seqlens_k=t([1.0, 2.0])), TypeError, "seqlens_k must be an int32 or int64 tensor"),
        (dict(seqlens_k=[1, 2]), TypeError, "seqlens_k must be an int32 or int64 tensor"),
        (dict(seqlens_k=t([1, 2]), padding_side="top"), ValueError, "padding_side"),
        (
            dict(seqlens_k=torch.tensor([1, 2], device="meta")),
            ValueError,
            "seqlens_k is on meta, but q",
        ),
        (dict(max_seqlen_q=4), ValueError, "max_seqlen_q and max_seqlen_k are for varlen calls"),
        (dict(seqlens_k=t([1, 2]), cu_seqlens_k=t([0, 1])), ValueError, "not both"),
        (dict(sequences=(t([1, 2]),)), TypeError, "sequences must come from sequences"),
        (
            dict(sequences=module.sequences(seqlens_k=t([1, 2])), seqlens_q=t([1, 1])),
            ValueError,
            "pass sequences= or the lengths it was made from, not both",
        ),
    ]
    for kwargs, error, words in cases:
        with pytest.raises(error, match=words):
            module.attention(q, k, v, **kwargs)
    q3 = torch.zeros(10, HEADS, HEAD_DIM, dtype=torch.float16, device=DEVICE)
    k3 = torch.zeros(12, KV_HEADS, HEAD_DIM, dtype=torch.float16, device=DEVICE)
    cu = lambda *x: t(x, dtype=i32)  # noqa: E731
    varlen_cases = [
        (dict(cu_seqlens_q=cu(0, 10)), ValueError, "needs both"),
        (dict(cu_seqlens_q=cu(0, 10), cu_seqlens_k=cu(0, 6, 12)), ValueError, r"shape \(2,\)"),
        (
            dict(cu_seqlens_q=cu(1, 10), cu_seqlens_k=cu(0, 12)),
            ValueError,
            r"cu_seqlens_q\[0\] = 1",
        ),
        (
            dict(cu_seqlens_q=cu(0, 4, 3), cu_seqlens_k=cu(0, 6, 12)),
            ValueError,
            r"cu_seqlens_q\[2\] = 3: cu_seqlens_q must be from 0, non-decreasing",
        ),
        (
            dict(cu_seqlens_q=cu(0, 10), cu_seqlens_k=cu(0, 13)),
            ValueError,
            "cu_seqlens_k reaches row 13, past k's 12",
        ),
        (
            dict(cu_seqlens_q=cu(0, 4, 10), cu_seqlens_k=cu(0, 6, 12), max_seqlen_k=5),
            ValueError,
            r"max_seqlen_k must be an int >= the longest sequence, 6: got 5",
        ),
    ]
    for kwargs, error, words in varlen_cases:
        with pytest.raises(error, match=words):
            module.attention(q3, k3, k3, **kwargs)
    with pytest.raises(ValueError, match=r"q must be a 3-d tensor \(tokens, heads, head_dim\)"):
        module.attention(q, k, v, cu_seqlens_q=cu(0, 8), cu_seqlens_k=cu(0, 8))


@pytest.mark.kernels
def test_sequences_made_once_serve_every_call(_interpreter):
    """`sequences(...)` checks once; attention(..., sequences=) then equals the
    call with the lengths, for calls of other lengths too (padded: the table
    follows each call's Nq and Nk)."""
    module = build(_variant("prefix", HALF))
    g = torch.Generator().manual_seed(4)
    t = functools.partial(torch.tensor, device=DEVICE)
    padded = module.sequences(seqlens_k=t([5, 30]), padding_side="left")
    for nq, nk in ((7, 40), (40, 33)):
        q = _rand(2, HEADS, nq, HEAD_DIM, dtype=torch.float16, generator=g)
        k, v = (_rand(2, KV_HEADS, nk, HEAD_DIM, dtype=torch.float16, generator=g) for _ in "kv")
        expected = module.attention(q, k, v, seqlens_k=t([5, 30]), padding_side="left")
        assert torch.equal(module.attention(q, k, v, sequences=padded), expected)
    cu = t([0, 3, 40], dtype=torch.int32)
    varlen = module.sequences(cu_seqlens_q=cu, cu_seqlens_k=cu)
    q = _rand(40, HEADS, HEAD_DIM, dtype=torch.float16, generator=g)
    k, v = (_rand(40, KV_HEADS, HEAD_DIM, dtype=torch.float16, generator=g) for _ in "kv")
    expected = module.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu)
    assert torch.equal(module.attention(q, k, v, sequences=varlen), expected)
    assert module.sequences() is None


@pytest.mark.kernels
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(variant=variants(dtypes=(ir.DType.FP16,), head_dims=(16,)), data=st.data())
def test_any_spec_attends_each_varlen_sequence_as_if_alone(variant, data):
    """Over specs drawn from the whole language: every sequence of a varlen
    call bit for bit equals the Triton kernels run on that sequence alone,
    forward and backward (the per-sequence reference is the tests above)."""
    module = build(variant)
    lengths = data.draw(
        st.lists(st.tuples(st.integers(0, 45), st.integers(0, 45)), min_size=1, max_size=3)
    )
    g = torch.Generator().manual_seed(5)
    cu = [[0], [0]]
    for nq, nk in lengths:
        cu[0].append(cu[0][-1] + nq)
        cu[1].append(cu[1][-1] + nk)
    q, do = (_rand(cu[0][-1], 2, 16, dtype=torch.float16, generator=g) for _ in "qo")
    k, v = (_rand(cu[1][-1], 1, 16, dtype=torch.float16, generator=g) for _ in "kv")
    dlse = torch.randn(2, cu[0][-1], generator=g).to(DEVICE)
    cu_q, cu_k = (torch.tensor(c, dtype=torch.int32, device=DEVICE) for c in cu)
    batched = _grads(module, q, k, v, do, dlse, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    for i, (nq, nk) in enumerate(lengths):
        rq, rk = slice(cu[0][i], cu[0][i + 1]), slice(cu[1][i], cu[1][i + 1])
        if nq == 0 or nk == 0:
            assert not batched[0][rq].any() and not batched[3][rk].any()
            continue
        parts = (x[r].transpose(0, 1)[None] for x, r in ((q, rq), (k, rk), (v, rk), (do, rq)))
        alone = _alone(module, *parts, dlse[:, rq][None])
        alone = [alone[0][0].transpose(0, 1), alone[1][0]] + [
            x[0].transpose(0, 1) for x in alone[2:]
        ]
        mine = (batched[0][rq], batched[1][:, rq], batched[2][rq], batched[3][rk], batched[4][rk])
        for name, x, y in zip(("o", "lse", "dq", "dk", "dv"), mine, alone):
            assert torch.equal(x, y), (i, name, nq, nk)


@pytest.mark.kernels
def test_calls_with_sequences_being_captured_read_nothing_on_the_host(_interpreter, monkeypatch):
    """While a CUDA graph is captured (`_capturing`, forced here) a varlen or
    padded call reads no length on the host (a tensor's `tolist`, `item` and
    `__bool__` fail) and computes what the checked call computes, forward
    and backward; a varlen call then needs max_seqlen_q and max_seqlen_k.
    Lengths past the rows or past max_seqlen are clamped (never read past the
    tensors), not checked: the caller's to keep right, as in FlashAttention."""
    module = build(_variant("prefix", HALF))
    g = torch.Generator().manual_seed(5)
    t = functools.partial(torch.tensor, device=DEVICE)
    cu_q, cu_k = t([0, 13, 13, 40], dtype=torch.int32), t([0, 20, 21, 45], dtype=torch.int32)
    q = _rand(40, HEADS, HEAD_DIM, dtype=torch.float16, generator=g)
    k, v = (_rand(45, KV_HEADS, HEAD_DIM, dtype=torch.float16, generator=g) for _ in "kv")
    do = _rand(40, HEADS, HEAD_DIM, dtype=torch.float16, generator=g)
    dlse = torch.randn(HEADS, 40, generator=g).to(DEVICE)
    varlen = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=27, max_seqlen_k=24)
    expected = _grads(module, q, k, v, do, dlse, **varlen)
    seqlens = dict(seqlens_q=t([5, 9]), seqlens_k=t([11, 2]), padding_side="left")
    qp = _rand(2, HEADS, 9, HEAD_DIM, dtype=torch.float16, generator=g)
    kp, vp = (_rand(2, KV_HEADS, 12, HEAD_DIM, dtype=torch.float16, generator=g) for _ in "kv")
    dop = _rand(2, HEADS, 9, HEAD_DIM, dtype=torch.float16, generator=g)
    dlsep = torch.randn(2, HEADS, 9, generator=g).to(DEVICE)
    expected_padded = _grads(module, qp, kp, vp, dop, dlsep, **seqlens)

    def host_read(*args, **kwargs):
        raise AssertionError("a length was read on the host while capturing")

    monkeypatch.setattr(module, "_capturing", lambda x: True)
    for name in ("tolist", "item", "__bool__"):
        monkeypatch.setattr(torch.Tensor, name, host_read)
    captured = _grads(module, q, k, v, do, dlse, **varlen)
    captured_padded = _grads(module, qp, kp, vp, dop, dlsep, **seqlens)
    with pytest.raises(ValueError, match="captured in a CUDA graph needs max_seqlen_q and max"):
        module.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    # cu_seqlens_k past k's 45 rows: clamped to them, and to max_seqlen_k
    clamped = module.attention(
        q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=t([0, 20, 21, 99], dtype=torch.int32),
        max_seqlen_q=27, max_seqlen_k=24,
    )  # fmt: skip
    monkeypatch.undo()
    for x, y in zip((*captured, *captured_padded), (*expected, *expected_padded)):
        assert torch.equal(x, y)
    assert torch.equal(clamped, expected[0])
