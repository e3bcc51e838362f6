"""Declared inputs in padded and varlen calls and under position offsets
(docs/decisions/051-inputs-in-sequence-calls.md).

In a padded call `b` is the batch row; in a varlen call it is the sequence
(0 .. S - 1) and `B` is S; q and k are each sequence's own positions (from 0,
as the sequence alone), or the shifted ones under q_offset/k_offset.  So each
sequence is judged against the float64 reference of the sequence alone, with
its own slice of every input that has a `B` dimension, by the one tolerance
rule (forward and backward); padded rows must also equal, bit for bit, the
module called on the row alone.  A learnable input's gradient must be the sum
of the sequences' (each from the reference), and the same bits on a repeated
call.  The index rule must use the positions the call really has.  An input
with an Nq or Nk dimension holds entry j for each sequence's position j
(decision 090): the sequence alone gets its first nq or nk entries, and the
call's entries past a sequence's length hold large random values that no
read may reach."""

from __future__ import annotations

import pytest
import torch

from flashgen import ir, verify
from flashgen.check import check
from flashgen.diagnostics import render_all
from flashgen.index_ranges import message
from flashgen.parse import parse
from flashgen.reference import attention_ref, input_dtype, input_shape
from flashgen.verify import GRADIENT_FACTOR, OUTPUT_FACTOR, tolerance

from kernel_utils import DEVICE, build

CPU = DEVICE == "cpu"
DTYPE = "fp32" if CPU else "bf16"  # the interpreter has no bf16 dot product
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16 if CPU else 64
# (queries, keys) per sequence: tiles crossed and not (the interpreter's 32),
# no queries, no keys, one of each, more queries than keys (bottom-right rows
# that see nothing) and fewer.
LENGTHS = [(33, 47), (0, 9), (1, 1), (5, 0), (70, 66), (17, 40)]
if not CPU:
    LENGTHS += [(129, 200), (300, 7)]
assert max(nk for _, nk in LENGTHS) <= 256  # the "key bias" table's keys

SPECS = {
    # A T5 table (H, 32) read by distance: relative positions.
    "t5": "rel: fp32[H, 32]; mask = causal; score = s + rel[h, min(q - k, 31)]",
    # A per-example prefix (B): b is the row or sequence; the mask reads data (the plan).
    "prefix per example": "prefix_len: int32[B]; mask = causal | k < prefix_len[b]",
    # Documents by position (a table over positions, not Nk): the plan reads both sides.
    "documents by position": "seg: int32[2048]; mask = causal & seg[q] == seg[k]",
    # ALiBi slopes (H) under a top-left window, and a temperature per example and head.
    "alibi window": (
        "slope: fp32[H]; t: fp32[B, H]; align = top_left; mask = window(20, 5); "
        "score = s * t[b, h] - slope[h] * abs(q - k)"
    ),
    # Packed documents per key position (Nk, decision 090), read at the query's position
    # too: the plan reads both sides of each sequence's own entries.
    "documents": "doc: int32[B, Nk]; mask = causal & doc[b, q] == doc[b, k]",
    # A bias per query position (Nq) and head, top-left so that positions stay below Nq.
    "query bias": (
        "bias: fp32[B, H, Nq]; align = top_left; mask = causal; score = s + bias[b, h, q]"
    ),
}
LEARNABLE = {
    "t5 learned": "rel: learnable fp32[H, 32]; mask = causal; score = s + rel[h, min(q - k, 31)]",
    # One slot per batch and query tile (slots the sequences must not share).
    "alibi learned": "slope: learnable fp32[H]; mask = causal; score = s - slope[h] * abs(q - k)",
    # A slot per query tile only: b indexes the input.
    "temperature per sequence": "t: learnable fp32[B, H]; score = softcap(s * t[b, h], 20.0)",
    # A bias per key position, summed by the dK/dV programs (decision 087): a slot per
    # sequence, as each sequence's keys restart at position 0.  Its 256 entries cover the
    # longest sequence's keys (200 on the GPU): a longer one is refused by the index rule.
    "key bias": "w: learnable fp32[H, 256]; mask = causal; score = s + w[h, k]",
    # Forgetting Transformer's decay per key position (Nk), read by query and by key: the
    # dQ programs' row sums and the dK/dV programs' column sums, a slot per sequence.
    "fox": "c: learnable fp32[B, H, Nk]; mask = causal; score = s + c[b, h, q] - c[b, h, k]",
    # A learnable table under a data-reading mask (the plan, per sequence).
    "prefix and table": (
        "prefix_len: int32[B]; rel: learnable fp32[H, 16]; mask = causal | k < prefix_len[b]; "
        "score = s + rel[h, min(max(q - k, 0), 15)]"
    ),
}


@pytest.fixture
def _interpreter(monkeypatch):
    if CPU:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _variant(body: str, dtype: str = DTYPE) -> ir.Variant:
    text = f"attention v {{ head_dim = {HEAD_DIM}; dtype = {dtype}; {body} }}"
    spec, diagnostics = parse(text, "<t>")
    assert not diagnostics, render_all(diagnostics, {"<t>": text})
    (variant,), diagnostics = check([spec])
    assert not diagnostics, render_all(diagnostics, {"<t>": text})
    return variant


def _rand(*shape, dtype, g, scale=1.0):
    return (scale * torch.randn(*shape, generator=g)).to(device=DEVICE, dtype=dtype)


def _inputs(variant, sequences: int, g, n=(None, None)) -> dict[str, torch.Tensor]:
    """Random inputs of a call of `sequences` sequences (B = sequences) whose
    Nq and Nk are `n`."""
    sizes = {"B": sequences, "H": HEADS, "Hkv": KV_HEADS, "Nq": n[0], "Nk": n[1]}
    data = {}
    for i in variant.inputs:
        shape = input_shape(i, sizes)
        if i.element.is_integer:  # prefix lengths (none, some, past every key); documents
            x = torch.randint(0, 50, shape, generator=g).sort(-1).values
        else:
            x = 1.0 + 0.5 * torch.randn(shape, generator=g)
        data[i.name] = x.to(device=DEVICE, dtype=input_dtype(i))
    return data


def _own(variant, data: dict, s: int, lengths=None) -> dict[str, torch.Tensor]:
    """Sequence s's inputs: its slice of every `B` dimension (kept, of size 1)
    and the first nq or nk entries of every Nq or Nk dimension (`lengths`:
    the sequence's (nq, nk); positions restart at 0 in each)."""
    return {i.name: _slice(i, data[i.name], s, lengths) for i in variant.inputs}


def _slice(decl, x: torch.Tensor, s: int | None, lengths=None) -> torch.Tensor:
    """`x` of input `decl` narrowed to sequence s's row of B (s None: all)
    and to the first entries of Nq and Nk (lengths (nq, nk))."""
    for dim, size in enumerate(decl.shape):
        if size == "B" and s is not None:
            x = x.narrow(dim, s, 1)
        elif size in ("Nq", "Nk"):
            x = x.narrow(dim, 0, lengths[size == "Nk"])
    return x


def _widen(decl, x: torch.Tensor, n, g) -> torch.Tensor:
    """`x` of input `decl` with every Nq or Nk dimension grown to the call's
    `n` (Nq, Nk), the entries past the sequence's own large random values (1000
    and up for integers, documents none of the sequence's): no read reaches them."""
    for dim, size in enumerate(decl.shape):
        if size in ("Nq", "Nk"):
            extra = list(x.shape)
            extra[dim] = n[size == "Nk"] - x.shape[dim]
            if x.dtype.is_floating_point:
                junk = 1e3 * torch.randn(extra, generator=g)
            else:
                junk = torch.randint(1000, 2000, extra, generator=g)
            x = torch.cat([x, junk.to(device=x.device, dtype=x.dtype)], dim)
    return x


def _draw(lengths, dtype, g) -> list[tuple]:
    """Random (1, H, n, D) q, k, v, dO and (1, H, n) dlse per sequence."""
    seqs = []
    for nq, nk in lengths:
        q, do = (_rand(1, HEADS, nq, HEAD_DIM, dtype=dtype, g=g) for _ in "qo")
        k, v = (_rand(1, KV_HEADS, nk, HEAD_DIM, dtype=dtype, g=g) for _ in "kv")
        seqs.append((q, k, v, do, torch.randn(1, HEADS, nq, generator=g).to(DEVICE)))
    return seqs


class _Call:
    """Sequences of (1, H, n, D) q, k, v[, dO] and (1, H, n) dlse, laid out as
    one varlen or padded (right or left) call, padding filled with large
    random values; `part` takes a sequence's rows back out of the call's
    tensors (autograd flows through both)."""

    def __init__(self, layout, seqs, g, sides=(0, 1, 1, 0, 0)):
        self.layout, self.seqs = layout, seqs
        self.lengths = [(s[0].shape[2], s[1].shape[2]) for s in seqs]
        count = len(seqs[0])
        if layout == "varlen":
            self.tensors = []
            for i in range(count):  # (1, H, n, D) -> (T, H, D); (1, H, n) -> (H, T)
                if seqs[0][i].dim() == 4:
                    self.tensors.append(torch.cat([x[i][0].transpose(0, 1) for x in seqs]))
                else:
                    self.tensors.append(torch.cat([x[i][0] for x in seqs], 1))
            cu = [[0], [0]]
            for nq, nk in self.lengths:
                cu[0].append(cu[0][-1] + nq)
                cu[1].append(cu[1][-1] + nk)
            self.cu = cu
            self.kwargs = dict(
                cu_seqlens_q=torch.tensor(cu[0], dtype=torch.int32, device=DEVICE),
                cu_seqlens_k=torch.tensor(cu[1], dtype=torch.int64, device=DEVICE),
            )
            # The inputs' Nq and Nk: the longest sequences (no max_seqlen_* given).
            self.n = [max(n, default=0) for n in zip(*self.lengths)]
        else:
            self.n = [max(n for n, _ in self.lengths) + 3, max(n for _, n in self.lengths) + 2]
            self.tensors = []
            for i, side in enumerate(sides[:count]):
                rows = []
                for seq in seqs:
                    x = seq[i]
                    pad = torch.randn(
                        *x.shape[:2], self.n[side] - x.shape[2], *x.shape[3:], generator=g
                    )
                    pad = (1e3 * pad).to(device=DEVICE, dtype=x.dtype)
                    rows.append(torch.cat([pad, x] if layout == "left" else [x, pad], 2))
                self.tensors.append(torch.cat(rows))
            self.kwargs = dict(
                seqlens_q=torch.tensor(
                    [n for n, _ in self.lengths], dtype=torch.int32, device=DEVICE
                ),
                seqlens_k=torch.tensor(
                    [n for _, n in self.lengths], dtype=torch.int32, device=DEVICE
                ),
                padding_side=layout,
            )

    def rows(self, s: int, side: int) -> slice:
        """Sequence s's rows of a padded call (side 0: queries, 1: keys)."""
        n = self.lengths[s][side]
        return slice(self.n[side] - n, self.n[side]) if self.layout == "left" else slice(0, n)

    def part(self, x: torch.Tensor, s: int, side: int) -> torch.Tensor:
        """Sequence s's rows of a call tensor (side 0: query rows, 1: key rows)
        as (1, H, n[, D])."""
        n = self.lengths[s][side]
        if self.layout == "varlen":
            a = self.cu[side][s]
            return x[a : a + n].transpose(0, 1)[None] if x.dim() == 3 else x[:, a : a + n][None]
        return x[s : s + 1, :, self.rows(s, side)]


class _InBatch:
    """The module's calls on one sequence (1, H, n, D), run as sequence
    `index` of a varlen or padded call with random neighbours, each with its
    own random rows of the inputs' `B` dimensions (the judged sequence's rows
    are the inputs passed); o and lse come back for that sequence only, so
    `verify.check_backward` and `check_forward` judge it against the reference
    of the sequence alone.  The neighbours' rows get no dO, so a learnable
    input's gradient is the judged sequence's alone.

    `forward` makes no call of its own: it gives back the o and lse of the
    last `attention` call (the one `check_backward` made, a call of the same
    kernels), after checking that it was made on the same q, k, v, scale and
    inputs; a `forward` before any `attention` call fails."""

    def __init__(self, module, variant, layout, index, neighbours, g):
        self.module, self.variant, self.layout, self.index = module, variant, layout, index
        self.others = [s[:3] for s in _draw(neighbours, module.DTYPE, g)]
        self.other_inputs = [_inputs(variant, 1, g, n) for n in neighbours]
        self.g = g
        self.last = None  # (q, k, v, scale, inputs), (o, lse) of the last call

    def forward(self, q, k, v, scale=None, **inputs):
        assert self.last is not None, "forward() gives back the last attention() call's o, lse"
        (q0, k0, v0, scale0, inputs0), outputs = self.last
        assert scale == scale0 and inputs.keys() == inputs0.keys()
        for x, y in zip((q, k, v, *inputs.values()), (q0, k0, v0, *inputs0.values())):
            assert torch.equal(x, y), "forward() on other arguments than the last call's"
        return outputs

    def attention(self, q, k, v, *, scale=None, return_lse=False, **inputs):
        i = self.index
        call = _Call(self.layout, self.others[:i] + [(q, k, v)] + self.others[i:], self.g)
        data = {}
        for decl in self.variant.inputs:
            x = _widen(decl, inputs[decl.name], call.n, self.g)
            if "B" in decl.shape:
                rows = [_widen(decl, o[decl.name], call.n, self.g) for o in self.other_inputs]
                x = torch.cat(rows[:i] + [x] + rows[i:], decl.shape.index("B"))
            data[decl.name] = x
        o, lse = self.module.attention(
            *call.tensors, scale=scale, return_lse=True, **call.kwargs, **data
        )
        o, lse = call.part(o, i, 0), call.part(lse, i, 0)
        arguments = [x.detach().clone() for x in (q, k, v)]
        kept = {n: x.detach().clone() for n, x in inputs.items()}
        self.last = ((*arguments, scale, kept), (o.detach(), lse.detach()))
        return (o, lse) if return_lse else o


class _Replay:
    """One sequence's part of a call already made (o, lse, and dq, dk, dv and
    the learnable inputs' gradients, by name, for the dO and dlse that
    `verify.check_backward` draws), given back as `module.forward` and
    `module.attention` of that sequence alone, so that `verify.check_forward`
    and `check_backward` judge it.  Each call must come with the sequence's
    own q, k, v and inputs, and the backward with the very dO and dlse that
    the call was made with."""

    def __init__(self, seq, inputs, outputs, grads, input_grads):
        self.q, self.k, self.v, self.do, self.dlse = seq
        self.inputs, (self.o, self.lse) = inputs, outputs
        self.grads, self.input_grads = grads, input_grads

    def _same(self, q, k, v, scale, inputs):
        assert scale is None and inputs.keys() == self.inputs.keys()
        for x, y in zip(
            (q, k, v, *inputs.values()), (self.q, self.k, self.v, *self.inputs.values())
        ):
            assert torch.equal(x, y), "a call on other arguments than the sequence's"

    def forward(self, q, k, v, scale=None, **inputs):
        self._same(q, k, v, scale, inputs)
        return self.o, self.lse

    def attention(self, q, k, v, *, scale=None, return_lse=False, **inputs):
        self._same(q, k, v, scale, inputs)
        names = [n for n, x in inputs.items() if x.requires_grad]
        o, lse = _Replayed.apply(self, names, q, k, v, *(inputs[n] for n in names))
        return (o, lse) if return_lse else o


class _Replayed(torch.autograd.Function):
    """`_Replay`'s o and lse as an autograd operation of q, k, v and the
    learnable inputs `names`: its backward gives the call's gradients."""

    @staticmethod
    def forward(ctx, replay, names, q, k, v, *learned):
        ctx.replay, ctx.names = replay, names
        return replay.o.clone(), replay.lse.clone()

    @staticmethod
    def backward(ctx, do, dlse):
        r = ctx.replay
        # verify's loss weights the finite log-sum-exps only.
        assert torch.equal(do, r.do.to(do.dtype)), "check_backward drew another dO"
        assert torch.equal(dlse, torch.where(torch.isfinite(r.lse), r.dlse, 0.0)), "another dlse"
        return (None, None, *r.grads, *(r.input_grads[n] for n in ctx.names))


def _run(fn, tensors, dtype, data, learnable):
    """o, lse and the gradients of sum(o * dO) + sum(finite lse * dlse) in q,
    k, v and the learnable inputs."""
    q, k, v, do, dlse = tensors
    leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
    data = {**data, **{n: data[n].detach().clone().requires_grad_() for n in learnable}}
    o, lse = fn(*leaves, data)
    weights = torch.where(torch.isfinite(lse), dlse.to(lse.dtype), 0.0)
    loss = (o * do.to(o.dtype)).sum() + (torch.where(torch.isfinite(lse), lse, 0.0) * weights).sum()
    leaves += [data[n] for n in learnable]
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)  # None: no pair reached it
    grads = [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, grads)]
    return [o.detach(), lse.detach(), *grads]


def _per_sequence_reference(variant, call, data, dtype, learnable):
    """Each sequence alone through the reference in `dtype`: its o, lse, dq,
    dk, dv, and the learnable inputs' gradients summed over the sequences."""
    results, sums = [], None
    for s, seq in enumerate(call.seqs):
        own = _own(variant, data, s, call.lengths[s])
        out = _run(
            lambda a, b, c, d: attention_ref(variant, a, b, c, inputs=d, dtype=dtype),
            seq,
            dtype,
            own,
            learnable,
        )
        results.append(out[:5])
        # A learnable input with a B dimension: the sequence's slice of the gradient.
        grads = []
        for name, grad in zip(learnable, out[5:]):
            full = torch.zeros(data[name].shape, dtype=grad.dtype, device=grad.device)
            i = next(i for i in variant.inputs if i.name == name)
            _slice(i, full, s, call.lengths[s]).copy_(grad)
            grads.append(full)
        sums = grads if sums is None else [a + b for a, b in zip(sums, grads)]
    return results, sums


def _call_inputs(variant, call, g) -> dict[str, torch.Tensor]:
    """Random inputs of `call` (its sequences' Nq and Nk), each sequence's
    entries past its own length large random values, as `_widen` makes them."""
    data = _inputs(variant, len(call.seqs), g, call.n)
    for decl in variant.inputs:
        x = data[decl.name]
        for s, lengths in enumerate(call.lengths if "B" in decl.shape else ()):
            own = _slice(decl, x, s, lengths)
            x.narrow(decl.shape.index("B"), s, 1).copy_(_widen(decl, own, call.n, g))
    return data


def _learnable_sums(variant, module, layout, g):
    """A call of LENGTHS in `layout`: its learnable inputs' gradients against
    the sum of each sequence's from the float64 reference (the rule's floor
    with the scores' fp32 rounding, as `verify.check_backward` has it);
    returns the call, the kernel's o, lse and gradients, and the inputs."""
    dtype = module.DTYPE
    call = _Call(layout, _draw(LENGTHS, dtype, g), g)
    data = _call_inputs(variant, call, g)
    learnable = [i.name for i in variant.inputs if i.learnable]

    def kernel(a, b, c, d):
        return module.attention(a, b, c, return_lse=True, **call.kwargs, **d)

    mine = _run(kernel, call.tensors, dtype, data, learnable)
    _, ref_sums = _per_sequence_reference(variant, call, data, torch.float64, learnable)
    _, ord_sums = _per_sequence_reference(variant, call, data, dtype, learnable)
    s_max = max(
        verify.max_visible_score(
            variant, q, k, None, inputs=_own(variant, data, s, call.lengths[s])
        )
        for s, (q, k, *_) in enumerate(call.seqs)
    )
    for name, x, r, y in zip(learnable, mine[5:], ref_sums, ord_sums):
        noise = s_max * r.abs().max().item()
        c = tolerance(
            x.cpu(), r.cpu(), y.cpu(), dtype, what=f"d{name}", factor=GRADIENT_FACTOR,
            score_noise=noise,
        )  # fmt: skip
        assert c.ok, (layout, c)
    return call, mine, data


# Learnable inputs with a `B` dimension: a sequence's gradient is its own row of the
# call's, so a call of all the sequences judges each alone; any other learnable input
# sums the sequences', and each is judged in a call whose neighbours get no dO.
BY_ROW = [
    n
    for n, text in LEARNABLE.items()
    if all("B" in i.shape for i in _variant(text).inputs if i.learnable)
]
ONE_CALL = [(name, layout) for name in sorted(SPECS) for layout in ("varlen", "right", "left")]
ONE_CALL += [(name, layout) for name in sorted(BY_ROW) for layout in ("varlen", "left")]


@pytest.mark.kernels
@pytest.mark.parametrize("name, layout", ONE_CALL)
def test_each_sequence_matches_the_reference_of_the_sequence_alone(name, layout, _interpreter):
    """Forward and backward (learnable inputs' gradients included: each
    sequence's rows of theirs) of each length in LENGTHS, as one sequence of
    a call that holds them all (each the others' neighbour, each with its
    own dO and dlse), by the one tolerance rule against the float64
    reference of the sequence alone: `verify.check_forward` and
    `check_backward` judge each sequence's part of that one call
    (`_Replay`).  A learnable input's entries that no sequence reads (past
    its length) get a zero gradient."""
    variant = _variant({**SPECS, **LEARNABLE}[name])
    module = build(variant)
    dtype = module.DTYPE
    g = torch.Generator().manual_seed(5)
    # check_backward draws each sequence's dO, then its dlse, from grads_g; `drawn`
    # draws the same values first, for the call (`_Replayed` checks that they are).
    grads_g = torch.Generator().manual_seed(10)
    drawn = torch.Generator().set_state(grads_g.get_state())
    seqs = []
    for nq, nk in LENGTHS:
        q = _rand(1, HEADS, nq, HEAD_DIM, dtype=dtype, g=g)
        k, v = (_rand(1, KV_HEADS, nk, HEAD_DIM, dtype=dtype, g=g) for _ in "kv")
        do = _rand(1, HEADS, nq, HEAD_DIM, dtype=dtype, g=drawn)
        seqs.append((q, k, v, do, torch.randn(1, HEADS, nq, generator=drawn).to(DEVICE)))
    call = _Call(layout, seqs, g)
    data = _call_inputs(variant, call, g)
    learnable = [i for i in variant.inputs if i.learnable]
    mine = _run(
        lambda a, b, c, d: module.attention(a, b, c, return_lse=True, **call.kwargs, **d),
        call.tensors, dtype, data, [i.name for i in learnable],
    )  # fmt: skip
    for decl, grad in zip(learnable, mine[5:]):
        read = torch.zeros_like(grad, dtype=torch.bool)
        for s, lengths in enumerate(call.lengths):
            _slice(decl, read, s, lengths).fill_(True)
        assert not grad[~read].any(), decl.name
    for s, seq in enumerate(seqs):
        parts = [call.part(x, s, side) for x, side in zip(mine, (0, 0, 0, 1, 1))]
        own = {i.name: _slice(i, x, s, call.lengths[s]) for i, x in zip(learnable, mine[5:])}
        replay = _Replay(seq, _own(variant, data, s, call.lengths[s]), parts[:2], parts[2:], own)
        q, k, v = seq[:3]
        forward = verify.check_forward(variant, replay, q, k, v, inputs=replay.inputs)
        backward = verify.check_backward(
            variant, replay, q, k, v, generator=grads_g, inputs=replay.inputs
        )
        learned = [c.what for c in backward.checks if c.what not in ("dq", "dk", "dv")]
        assert learned == [f"d{i.name}" for i in learnable]
        for result in (forward, backward):
            checks = [(c.what, c.error, c.bound) for c in result.checks]
            assert result.ok, (layout, call.lengths[s], checks)


@pytest.mark.kernels
@pytest.mark.parametrize("layout", ["varlen", "left"])
@pytest.mark.parametrize("name", sorted(set(LEARNABLE) - set(BY_ROW)))
def test_each_sequence_with_learnable_inputs_matches_the_reference_alone(
    name, layout, _interpreter
):
    """Forward and backward (learnable inputs' gradients included) of each
    length in LENGTHS, as one sequence among neighbours that get no dO (these
    inputs' gradients sum a call's sequences: so they are the judged
    sequence's alone), by the one tolerance rule against the float64
    reference of the sequence alone; o and lse are those of the call that
    gives the gradients (`_InBatch.forward`)."""
    variant = _variant(LEARNABLE[name])
    module = build(variant)
    g = torch.Generator().manual_seed(5)
    neighbours = [(40, 3), (0, 9), (5, 0), (70, 66)]
    for i, (nq, nk) in enumerate(LENGTHS):
        adapter = _InBatch(module, variant, layout, i % 3, neighbours[i % 2 :][:2], g)
        shape = verify.Shape(1, HEADS, KV_HEADS, nq, nk)
        q, k, v = verify.random_inputs(shape, HEAD_DIM, module.DTYPE, DEVICE, generator=g)
        data = _inputs(variant, 1, g, (nq, nk))
        backward = verify.check_backward(variant, adapter, q, k, v, generator=g, inputs=data)
        forward = verify.check_forward(variant, adapter, q, k, v, inputs=data)
        learned = [c.what for c in backward.checks if c.what not in ("dq", "dk", "dv")]
        assert len(learned) == sum(i.learnable for i in variant.inputs)
        for result in (forward, backward):
            assert result.ok, (layout, nq, nk, [(c.what, c.error, c.bound) for c in result.checks])


@pytest.mark.kernels
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize(
    "name", ["prefix per example", "documents by position", "alibi window", "documents"]
)
def test_padded_rows_equal_each_row_called_alone_bit_for_bit(name, side, _interpreter):
    """Outputs and gradients of every padded row equal the module's on the
    row alone (its slice of each B-shaped input, the same launch
    configuration); padding rows are 0 (lse -inf) with zero gradients."""
    variant = _variant(SPECS[name])
    module = build(variant)
    g = torch.Generator().manual_seed(6)
    call = _Call(side, _draw(LENGTHS, module.DTYPE, g), g)
    data = _call_inputs(variant, call, g)
    o, lse, dq, dk, dv = _run(
        lambda a, b, c, d: module.attention(a, b, c, return_lse=True, **call.kwargs, **d),
        call.tensors,
        module.DTYPE,
        data,
        [],
    )
    fwd, bwd = (module._launch_config(o.device, backward=b) for b in (False, True))
    names = ("block_m", "block_n", "num_warps", "num_stages")
    for s, (q, k, v, do, dlse) in enumerate(call.seqs):
        own = _own(variant, data, s, call.lengths[s])
        pad_q = torch.ones(call.n[0], dtype=torch.bool, device=DEVICE)
        pad_k = torch.ones(call.n[1], dtype=torch.bool, device=DEVICE)
        pad_q[call.rows(s, 0)], pad_k[call.rows(s, 1)] = False, False
        assert not o[s][:, pad_q].any() and not dq[s][:, pad_q].any()
        assert (lse[s][:, pad_q] == float("-inf")).all()
        assert not dk[s][:, pad_k].any() and not dv[s][:, pad_k].any()
        if q.shape[2] == 0:
            continue
        o1, lse1 = module.forward(q, k, v, **dict(zip(names, fwd)), tma=False, **own)
        dlse1 = torch.where(torch.isfinite(lse1), dlse, 0.0)
        alone = (o1, lse1) + module.backward(
            q, k, v, o1, lse1, do, dlse1, **dict(zip(names, bwd)), tma=False, **own
        )
        for what, x, y, rows in zip(
            ("o", "lse", "dq", "dk", "dv"), (o, lse, dq, dk, dv), alone, (0, 0, 0, 1, 1)
        ):
            assert torch.equal(call.part(x, s, rows), y), (s, what)


@pytest.mark.kernels
@pytest.mark.parametrize("name", sorted(LEARNABLE))
def test_learnable_gradients_of_a_varlen_call_sum_its_sequences(name, _interpreter):
    """The learnable inputs' gradients of a varlen call equal the sum of each
    sequence's (float64 reference), and a repeated call gives the same bits."""
    variant = _variant(LEARNABLE[name])
    module = build(variant)
    g = torch.Generator().manual_seed(7)
    call, first, data = _learnable_sums(variant, module, "varlen", g)
    learnable = [i.name for i in variant.inputs if i.learnable]

    def kernel(a, b, c, d):
        return module.attention(a, b, c, return_lse=True, **call.kwargs, **d)

    again = _run(kernel, call.tensors, module.DTYPE, data, learnable)
    for x, y in zip(first, again):
        assert torch.equal(x, y)
    assert all(x.abs().max() > 0 for x in first[5:])


@pytest.mark.kernels
@pytest.mark.parametrize("spec", ["alibi learned", "key bias", "fox"])
@pytest.mark.parametrize("name", ["right", "left"])
def test_learnable_gradients_of_a_padded_call_sum_its_rows(name, spec, _interpreter):
    variant = _variant(LEARNABLE[spec])
    g = torch.Generator().manual_seed(8)
    _learnable_sums(variant, build(variant), name, g)


# (q_offset, k_offset, Nq, Nk): a prefill chunk after a cache, keys ahead of
# the queries (rows that see nothing), both past a tile.
OFFSETS = [(37, 5, 20, 70), (5, 90, 45, 33), (1000, 990, 17, 40)]


@pytest.mark.kernels
@pytest.mark.parametrize(
    "name", ["t5", "prefix per example", "documents by position", "alibi window", "alibi learned"]
)
def test_offsets_with_inputs_match_the_reference(name, _interpreter):
    """The shifted positions reach the inputs' indices (the reference's
    `offsets=`), with GQA, a batch of two and sinks."""
    variant = _variant({**SPECS, **LEARNABLE}[name])
    module = build(variant)
    dtype = module.DTYPE
    g = torch.Generator().manual_seed(9)
    learnable = [i.name for i in variant.inputs if i.learnable]
    sinks = torch.randn(HEADS, generator=g).to(DEVICE)
    for q_offset, k_offset, nq, nk in OFFSETS:
        data = _inputs(variant, 2, g, (nq, nk))
        tensors = (
            _rand(2, HEADS, nq, HEAD_DIM, dtype=dtype, g=g),
            _rand(2, KV_HEADS, nk, HEAD_DIM, dtype=dtype, g=g),
            _rand(2, KV_HEADS, nk, HEAD_DIM, dtype=dtype, g=g),
            _rand(2, HEADS, nq, HEAD_DIM, dtype=dtype, g=g),
            torch.randn(2, HEADS, nq, generator=g).to(DEVICE),
        )
        at = (q_offset, k_offset)
        kernel = _run(
            lambda a, b, c, d: module.attention(
                a, b, c, return_lse=True, q_offset=q_offset, k_offset=k_offset, sinks=sinks, **d
            ),
            tensors, dtype, data, learnable,
        )  # fmt: skip

        def ref(cast):
            return _run(
                lambda a, b, c, d: attention_ref(
                    variant, a, b, c, inputs=d, offsets=at, sinks=sinks, dtype=cast
                ),
                tensors, cast, data, learnable,
            )  # fmt: skip

        names = ("o", "lse", "dq", "dk", "dv", *(f"d{n}" for n in learnable))
        for what, x, r, y in zip(names, kernel, ref(torch.float64), ref(dtype)):
            factor = OUTPUT_FACTOR if what in ("o", "lse") else GRADIENT_FACTOR
            c = tolerance(x.cpu(), r.cpu(), y.cpu(), dtype, what=what, factor=factor)
            assert c.ok, (at, nq, nk, c)


# --------------------------------------------------------------------------- #
# The index rule over the positions a call really has (quick tier: every
# refusal happens before a kernel runs; accepted calls are checked by
# `_check_runtime_inputs` alone).
# --------------------------------------------------------------------------- #


def _qkv(batch, nq, nk, varlen=False):
    if varlen:
        return torch.zeros(nq, HEADS, HEAD_DIM), torch.zeros(nk, KV_HEADS, HEAD_DIM)
    return torch.zeros(batch, HEADS, nq, HEAD_DIM), torch.zeros(batch, KV_HEADS, nk, HEAD_DIM)


def _accepts(module, q, k, data, seqs=None, shifts=None, varlen=False):
    """Whether the module's call-time check lets the call through (else its message)."""
    view = (lambda x: module._kernel_view(x, seqs)) if seqs is not None else (lambda x: x)
    try:
        module._check_runtime_inputs(view(q), view(k), tuple(data.values()), seqs, shifts)
    except ValueError as e:
        return str(e)
    return True


def test_an_index_out_of_range_under_offsets_is_refused_naming_the_input():
    variant = _variant("pos: fp32[64]; mask = causal; score = s + pos[q]", "fp32")
    module = build(variant)
    q, k = _qkv(1, 32, 32)
    pos = torch.zeros(64)
    # q = i + q_offset: 10 .. 41 fits, 40 .. 71 does not (and 0 .. 31 without offsets).
    assert _accepts(module, q, k, {"pos": pos}, shifts=(10, 0)) is True
    refusal = message("pos", 0, 40, 71, 64)
    with pytest.raises(ValueError) as e:
        module.attention(q, k, k, q_offset=40, pos=pos)
    assert str(e.value) == refusal
    with pytest.raises(ValueError) as e:  # the reference's rule, word for word
        attention_ref(variant, q, k, k, inputs={"pos": pos}, offsets=(40, 0))
    assert str(e.value) == refusal
    # k_offset alone leaves the queries at 0 .. 31.
    assert _accepts(module, q, k, {"pos": pos}, shifts=(0, 500)) is True


def test_sequence_calls_check_indices_over_their_real_lengths():
    # pos[k]: every key position of the longest sequence, not the padded or total rows.
    variant = _variant("pos: fp32[40]; score = s + pos[k]", "fp32")
    module = build(variant)
    pos = torch.zeros(40)
    q, k = _qkv(None, 60, 71, varlen=True)
    fits = module.sequences(
        cu_seqlens_q=torch.tensor([0, 30, 60]), cu_seqlens_k=torch.tensor([0, 40, 71])
    ).bind(q, k)
    assert _accepts(module, q, k, {"pos": pos}, fits) is True
    past = module.sequences(
        cu_seqlens_q=torch.tensor([0, 30, 60]), cu_seqlens_k=torch.tensor([0, 30, 71])
    )
    with pytest.raises(ValueError) as e:
        module.attention(q, k, k, sequences=past, pos=pos)
    assert str(e.value) == message("pos", 0, 0, 40, 40)
    # Padded: rows of 50 keys, at most 40 real ones; a longer one is refused.
    q, k = _qkv(2, 50, 50)
    padded = module.sequences(seqlens_k=torch.tensor([40, 12])).bind(q, k)
    assert _accepts(module, q, k, {"pos": pos}, padded) is True
    with pytest.raises(ValueError, match="`pos`: index 0 may reach 0 .. 40"):
        module.attention(q, k, k, seqlens_k=torch.tensor([41, 12]), pos=pos)
    # Offsets apply to every sequence: keys 3 .. 42.
    with pytest.raises(ValueError, match="`pos`: index 0 may reach 3 .. 42"):
        module.attention(q, k, k, seqlens_k=torch.tensor([40, 12]), k_offset=3, pos=pos)


def test_bottom_right_sequences_check_each_sequences_own_alignment():
    # pos[q], bottom-right: a sequence's queries sit at nk - nq .. nk - 1.
    variant = _variant("pos: fp32[40]; mask = causal; score = s + pos[q]", "fp32")
    module = build(variant)
    pos = torch.zeros(40)
    q, k = _qkv(2, 45, 45)
    # Rows (10 queries, 40 keys) and (30, 35): queries at 30 .. 39 and 5 .. 34, inside 40,
    # where the padded call's own 45 x 45 would reach 44.
    seqs = module.sequences(seqlens_q=torch.tensor([10, 30]), seqlens_k=torch.tensor([40, 35]))
    assert _accepts(module, q, k, {"pos": pos}, seqs.bind(q, k)) is True
    assert _accepts(module, q, k, {"pos": pos}) == message("pos", 0, 0, 44, 40)
    # (10, 40) and (30, 41): queries at 30 .. 39 and 11 .. 40.
    seqs = module.sequences(seqlens_q=torch.tensor([10, 30]), seqlens_k=torch.tensor([40, 41]))
    assert _accepts(module, q, k, {"pos": pos}, seqs.bind(q, k)) == message("pos", 0, 11, 40, 40)
    # A sequence without keys reads nothing: (44 queries, 0 keys) adds no position.
    seqs = module.sequences(seqlens_q=torch.tensor([10, 44]), seqlens_k=torch.tensor([40, 0]))
    assert _accepts(module, q, k, {"pos": pos}, seqs.bind(q, k)) is True


def test_inputs_over_positions_take_the_padded_rows_or_the_longest_sequences():
    """Decision 090: an input over Nk in a padded call has the padded rows' Nk,
    in a varlen call max_seqlen_k (the longest sequence if not given); another
    shape is refused naming the input, and so is an index past it under
    offsets."""
    variant = _variant("doc: int32[B, Nk]; mask = causal & doc[b, q] == doc[b, k]", "fp32")
    module = build(variant)
    docs = lambda *shape: {"doc": torch.zeros(*shape, dtype=torch.int32)}  # noqa: E731
    q, k = _qkv(None, 10, 13, varlen=True)
    cu_q, cu_k = torch.tensor([0, 4, 10]), torch.tensor([0, 9, 13])
    seqs = module.sequences(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k).bind(q, k)
    assert _accepts(module, q, k, docs(2, 9), seqs) is True  # the longest: 9 keys
    assert _accepts(module, q, k, docs(2, 13), seqs) == "doc must have shape (2, 9), got (2, 13)"
    wide = module.sequences(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_k=16).bind(q, k)
    assert _accepts(module, q, k, docs(2, 16), wide) is True
    with pytest.raises(ValueError, match=r"doc must have shape \(2, 9\), got \(1, 13\)"):
        module.attention(q, k, k, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **docs(1, 13))
    q, k = _qkv(2, 10, 12)
    padded = module.sequences(seqlens_q=torch.tensor([4, 10]), padding_side="left").bind(q, k)
    assert _accepts(module, q, k, docs(2, 12), padded) is True
    assert _accepts(module, q, k, docs(2, 10), padded) == "doc must have shape (2, 12), got (2, 10)"
    # Offsets: the shifted key positions must stay inside Nk (k = j + 3 reaches 14 >= 12).
    assert _accepts(module, q, k, docs(2, 12), shifts=(2, 0)) is True
    with pytest.raises(ValueError, match="`doc`: index 1 may reach"):
        module.attention(q, k, k, q_offset=5, k_offset=3, **docs(2, 12))
