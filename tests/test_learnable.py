"""Learnable inputs: `attention()` returns their gradients (flashgen/input_grads.py,
docs/decisions/048-learnable-inputs.md).

Every form of read the backward sums (a scalar per program, a query row, a
constant table, a pair, a key) is judged against float64 autograd through the
reference by the 3x rule (`verify.check_backward`, which compares the
learnable inputs' gradients beside dq, dk and dv), on shapes with GQA,
Nq != Nk, rows that see no key and tile edges; repeated backward calls must
give the same bits; reads no form covers are refused by `check` with a
diagnostic."""

from __future__ import annotations

import pytest
import torch

from flashgen import ir, verify
from flashgen.check import check
from flashgen.diagnostics import render_all
from flashgen.parse import parse

from kernel_utils import DEVICE, build

CPU = DEVICE == "cpu"
# The interpreter has no bf16 dot product: fp32 and fp16 there, bf16 on the GPU.
DTYPES = ("fp32", "fp16") if CPU else ("bf16", "fp16")
HEAD_DIM = 16 if CPU else 64


def _variant(body: str, dtype: str = DTYPES[0], head_dim: int = HEAD_DIM) -> ir.Variant:
    text = f"attention v {{ head_dim = {head_dim}; dtype = {dtype}; {body} }}"
    spec, diagnostics = parse(text, "<t>")
    assert not diagnostics, render_all(diagnostics, {"<t>": text})
    (variant,), diagnostics = check([spec], learnable=True)
    assert not diagnostics, render_all(diagnostics, {"<t>": text})
    return variant


def _messages(body: str) -> list[str]:
    text = f"attention v {{ head_dim = 16; dtype = fp32; {body} }}"
    spec, diagnostics = parse(text, "<t>")
    assert not diagnostics
    return [render_all([d], {"<t>": text}) for d in check([spec])[1]]


SPECS = {
    # TABLE: T5's bias per head and distance bucket.
    "t5": "rel: learnable fp32[H, 32]; mask = causal; score = s + rel[h, min(q - k, 31)]",
    # TABLE, both directions and a scale on the read.
    "relative": "rel: learnable fp32[33]; score = s + 0.5 * rel[min(max(q - k + 16, 0), 32)]",
    # TABLE whose element is one per tile where tiles sit in 32-position blocks
    # (the interpreter's): the dQ programs' row sums change element tile by tile.
    "blocks": "rel: learnable fp32[H, 5]; score = s + rel[h, min(max(q div 32 - k div 32 + 2, 0), 4)]",
    # SCALAR: ALiBi with learnable slopes, and a temperature under a softcap.
    "alibi": "slope: learnable fp32[H]; mask = causal; score = s - slope[h] * abs(q - k)",
    "temperature": "t: learnable fp32[H]; score = softcap(s * t[h], 20.0)",
    # ROWS: a per-query temperature (its gradient does not vanish as a bias's does).
    "rows": "t: learnable fp32[B, H, Nk]; mask = causal & window(24); score = s * t[b, h, q]",
    # PAIRS: a full bias in fp16, read beside a constant per-key bias.
    "pairs": (
        "w: learnable fp16[B, H, Nk, Nk]; kb: fp32[B, Nk]; mask = causal & window(20); "
        "score = s + w[b, h, q, k] + kb[b, k]"
    ),
    # COLS (summed per key by the dK/dV programs): Forgetting Transformer's decay, read by
    # query and by key (ROWS and COLS of one input; each query head its own element); a
    # per-key temperature the kv head's query heads share (the derivative is s); a per-key
    # bias whose element moves with h without being h (each query head its own slot).
    "fox": "c: learnable fp32[B, H, Nk]; mask = causal; score = s + c[b, h, q] - c[b, h, k]",
    "key_temperature": "t: learnable fp32[B, Nk]; mask = window(30); score = s * t[b, k]",
    "key_bias": "w: learnable fp32[2, 2048]; mask = causal; score = s + w[h % 2, k]",
    # ROWS that shift each row's scores by a constant times the read (decision 091): the dQ
    # programs take dlse (and rowsum(P)) instead of per-tile sums; heads share an element.
    "query_shift": "u: learnable fp32[B, Nk]; mask = causal & window(40); score = s * 0.5 - 0.75 * u[b, q]",
    # Two reads of one input, and a learnable bias under a runtime document mask (the plan).
    "two_reads": "w: learnable fp32[H]; score = s * w[h] + w[0]",
    "documents": (
        "doc: int32[B, Nk]; rel: learnable fp32[H, 16]; mask = causal & doc[b, q] == doc[b, k]; "
        "score = s + rel[h, min(q - k, 15)]"
    ),
}
# (B, H, Hkv, Nq, Nk): GQA with Nq < Nk, tile edges, rows that see no key (bottom-right
# causal with Nq > Nk), one query row.
SHAPES = ((2, 4, 2, 37, 45), (1, 2, 1, 50, 20), (1, 2, 2, 1, 70), (1, 2, 1, 64, 64))
if not CPU:
    SHAPES += ((2, 4, 2, 300, 517), (1, 4, 4, 1024, 1024))


def _data(variant, shape, generator):
    data = verify.random_runtime_inputs(variant, shape, DEVICE, generator=generator)
    if "doc" in data:  # documents of a few tokens, as packed batches hold
        b, n = data["doc"].shape
        lengths = torch.randint(1, 12, (b, n), generator=generator)
        data["doc"] = (lengths.cumsum(1) // 12).to(device=DEVICE, dtype=torch.int32)
    return data


@pytest.mark.kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(SPECS))
def test_learnable_gradients_follow_the_reference(name, dtype):
    variant = _variant(SPECS[name], dtype)
    module = build(variant)
    generator = torch.Generator().manual_seed(7)
    for shape in SHAPES:
        shape = verify.Shape(*shape)
        q, k, v = verify.random_inputs(
            shape, variant.head_dim, verify.torch_dtype(variant.dtype), DEVICE, generator=generator
        )  # fmt: skip
        data = _data(variant, shape, generator)
        result = verify.check_backward(variant, module, q, k, v, generator=generator, inputs=data)
        learned = [c for c in result.checks if c.what not in ("dq", "dk", "dv")]
        assert learned, "the learnable inputs' gradients were not compared"
        assert result.ok, (shape, [c for c in result.checks if not c.ok])


# Backward tiles at head dims that pad to 128 (decisions 086 and 096): the rule's
# 64 x 128 x 8 x 2, which spills (0.5 KB for fox, 2.7 KB for the T5 table at d128, 104-512 B
# at d80, sm_90a) and ran the learnable backward 1.9-2.7x faster on an H100 (forgetting at
# d128 83 -> 221 TFLOP/s), and the spill-free 32 x 64 x 8 x 2, at d128 and at d80 (padded).
WIDE_TILES = ((128, None), (128, "32,64,8,2"), (80, None), (80, "32,64,8,2"))


@pytest.mark.parametrize(
    "head_dim, learned, fixed",
    [
        (64, (32, 64, 4, 3), (64, 64, 4, 3)),
        (80, (64, 128, 8, 2), (64, 128, 8, 3)),
        (112, (64, 128, 8, 2), (64, 128, 8, 3)),
        (128, (64, 128, 8, 2), (64, 128, 8, 3)),
    ],
)
def test_learnable_backward_tiles_by_head_dim(head_dim, learned, fixed):
    """The 16-bit learnable backward's tiles (`launch.gpu_bwd_config`): up to
    d64 the spill-free 32 x 64 x 4 x 3 (the spilling tiles there are what CUDA
    12.8's ptxas assembled wrong); at d128 and the head dims padded to it the
    spilling 64 x 128 x 8 x 2, which the GPU ran right for every form of
    learnable read at d128 and d80 and for the T5 table at d96 and d112; the
    same table not learnable, the module's own."""
    from dataclasses import astuple

    from flashgen.lower import lower

    model = lower(_variant(SPECS["t5"], "bf16", head_dim=head_dim))
    assert astuple(model.gpu_bwd_config) == learned
    model = lower(_variant(SPECS["t5"].replace("learnable ", ""), "bf16", head_dim=head_dim))
    assert astuple(model.gpu_bwd_config) == fixed


@pytest.mark.kernels
@pytest.mark.skipif(CPU, reason="head dim 128 and its Hopper tiles: the GPU's (the CPU runs d16)")
@pytest.mark.parametrize("head_dim, tiles", WIDE_TILES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["t5", "fox", "key_bias", "rows", "pairs"])
def test_learnable_gradients_at_head_dim_128(name, dtype, head_dim, tiles):
    """Every form of learnable read at d128 and at d80 (padded to 128) on the
    GPU, at the backward tiles of the rule and at the others of WIDE_TILES,
    one of which spills (CUDA 12.8's ptxas once miscompiled such a kernel:
    decision 086), judged as above at lengths that cross the tiles."""
    from flashgen.experiments import KNOBS

    variant = _variant(SPECS[name], dtype, head_dim=head_dim)
    module = build(variant, tiles and {"gpu_bwd_config": KNOBS["gpu_bwd_config"](tiles)})
    generator = torch.Generator().manual_seed(11)
    for shape in ((2, 4, 2, 37, 45), (1, 2, 1, 64, 64), (2, 4, 2, 300, 517), (1, 4, 4, 1024, 1024)):
        shape = verify.Shape(*shape)
        q, k, v = verify.random_inputs(
            shape, head_dim, verify.torch_dtype(variant.dtype), DEVICE, generator=generator
        )  # fmt: skip
        data = _data(variant, shape, generator)
        result = verify.check_backward(variant, module, q, k, v, generator=generator, inputs=data)
        assert result.ok, (shape, [c for c in result.checks if not c.ok])


@pytest.mark.kernels
@pytest.mark.parametrize("name", ["fox", "query_shift"])
def test_shift_reads_with_sinks_follow_the_reference(name):
    """Decision 091 with attention sinks: a row's probabilities then sum to
    less than 1, and the shift's gradient keeps the rowsum(P dP) term; judged
    against float64 autograd of the reference with the same sinks, rows that
    see no key included."""
    from flashgen.reference import attention_ref
    from flashgen.verify import GRADIENT_FACTOR, tolerance

    variant = _variant(SPECS[name])
    module = build(variant)
    generator = torch.Generator().manual_seed(13)
    shape = verify.Shape(*SHAPES[1])  # Nq > Nk: bottom-right rows that see no key
    dtype = verify.torch_dtype(variant.dtype)
    q, k, v = verify.random_inputs(shape, variant.head_dim, dtype, DEVICE, generator=generator)
    data = _data(variant, shape, generator)
    sinks = (2 * torch.randn(shape.heads, generator=generator)).to(DEVICE)
    do = torch.randn(q.shape, generator=generator).to(DEVICE)
    dlse = torch.randn(q.shape[:3], generator=generator).to(DEVICE)
    learnable = [i.name for i in variant.inputs if i.learnable]

    def run(fn, cast):
        leaves = [x.detach().to(cast).requires_grad_() for x in (q, k, v)]
        own = {**data, **{n: data[n].detach().clone().requires_grad_() for n in learnable}}
        o, lse = fn(*leaves, own)
        loss = (o * do.to(o.dtype)).sum() + (lse * dlse.to(lse.dtype)).sum()
        return torch.autograd.grad(loss, leaves + [own[n] for n in learnable])

    kernel = run(
        lambda a, b, c, d: module.attention(a, b, c, sinks=sinks, return_lse=True, **d), dtype
    )
    ref = run(
        lambda a, b, c, d: attention_ref(variant, a, b, c, sinks=sinks, inputs=d), torch.float64
    )
    ordinary = run(
        lambda a, b, c, d: attention_ref(variant, a, b, c, sinks=sinks, inputs=d, dtype=dtype),
        dtype,
    )
    names = ("dq", "dk", "dv", *(f"d{n}" for n in learnable))
    for what, x, r, y in zip(names, kernel, ref, ordinary):
        c = tolerance(x.cpu(), r.cpu(), y.cpu(), dtype, what=what, factor=GRADIENT_FACTOR)
        assert c.ok, (what, c)
    assert kernel[3].abs().max() > 0


def _loss(module, q, k, v, data, do):
    return (module.attention(q, k, v, **data).float() * do).sum()


@pytest.mark.kernels
@pytest.mark.parametrize("name", ["t5", "pairs", "temperature", "rows", "fox"])
def test_repeated_backward_calls_give_the_same_bits(name):
    variant = _variant(SPECS[name])
    module = build(variant)
    generator = torch.Generator().manual_seed(3)
    shape = verify.Shape(*SHAPES[0]) if CPU else verify.Shape(2, 8, 2, 1000, 1000)
    dtype = verify.torch_dtype(variant.dtype)
    q, k, v = verify.random_inputs(shape, variant.head_dim, dtype, DEVICE, generator=generator)
    data = _data(variant, shape, generator)
    learnable = [i.name for i in variant.inputs if i.learnable]
    do = torch.randn(q.shape, generator=generator).to(DEVICE)
    runs = []
    for _ in range(2):
        leaves = {n: data[n].detach().clone().requires_grad_() for n in learnable}
        loss = _loss(module, q, k, v, {**data, **leaves}, do)
        runs.append(torch.autograd.grad(loss, list(leaves.values())))
    for first, second in zip(*runs):
        assert torch.equal(first, second)
        assert first.abs().max() > 0


@pytest.mark.kernels
def test_backward_returns_the_learnable_gradients_autograd_gets():
    variant = _variant(
        "rel: learnable fp32[H, 32]; rel2: learnable fp32[H]; mask = causal; "
        "score = s * rel2[h] + rel[h, min(q - k, 31)]"
    )
    module = build(variant)
    generator = torch.Generator().manual_seed(5)
    shape = verify.Shape(1, 2, 2, 30, 40)
    dtype = verify.torch_dtype(variant.dtype)
    q, k, v = verify.random_inputs(shape, variant.head_dim, dtype, DEVICE, generator=generator)
    data = {n: x.requires_grad_() for n, x in _data(variant, shape, generator).items()}
    o, lse = module.attention(q, k, v, return_lse=True, **data)
    do = torch.randn(o.shape, generator=generator).to(o)
    expected = torch.autograd.grad((o * do).sum(), [data["rel"], data["rel2"]])
    grads = module.backward(q, k, v, o.detach(), lse.detach(), do, **data)
    assert len(grads) == 5
    for got, want in zip(grads[3:], expected):
        assert torch.equal(got, want)
    empty = module.backward(q, k, v, o.detach(), lse.detach(), None, **data)
    assert all(not g.any() for g in empty[3:]) and empty[3].shape == (2, 32)


def test_check_accepts_every_form_and_the_model_says_how_each_read_is_summed():
    from flashgen.lower import lower

    forms = {
        "t5": ["table"],
        "relative": ["table"],
        "blocks": ["table"],
        "alibi": ["scalar"],
        "temperature": ["scalar"],
        "rows": ["rows"],
        "pairs": ["pairs"],
        "two_reads": ["scalar", "scalar"],
        "documents": ["table"],
        "fox": ["rows", "cols"],
        "query_shift": ["rows"],
        "key_temperature": ["cols"],
        "key_bias": ["cols"],
    }
    for name, body in SPECS.items():
        model = lower(_variant(body))
        assert [g.form for g in model.input_grads] == forms[name], name
    t5 = lower(_variant(SPECS["t5"])).input_grads[0]
    # `h` indexes the table: heads never share an element, so they share slots.
    assert (t5.slot_batch, t5.slot_head, t5.slot_tile) == (True, False, True)
    pairs = lower(_variant(SPECS["pairs"])).input_grads[0]
    assert (pairs.slot_batch, pairs.slot_head, pairs.slot_tile) == (False, False, False)
    # COLS: no slot per tile; stored per query head where an index mentions h, into the
    # kv head's slot where none does.
    fox = lower(_variant(SPECS["fox"]))
    assert fox.dkdv_grads == fox.input_grads[1:] and fox.dq_grads == fox.input_grads[:1]
    cols = fox.input_grads[1]
    assert (cols.slot_batch, cols.slot_head, cols.slot_tile, cols.per_query_head) == (
        False, False, False, True
    )  # fmt: skip
    key_temperature = lower(_variant(SPECS["key_temperature"])).input_grads[0]
    assert not key_temperature.per_query_head and key_temperature.slot_code == "kv_head"
    key_bias = lower(_variant(SPECS["key_bias"])).input_grads[0]
    assert key_bias.per_query_head and key_bias.slot_code == "(batch * num_heads + head)"
    # A table read hoisted per tile sums the rows of tiles that read one element.
    model = lower(_variant(SPECS["t5"]))
    assert model.rows_of_one_element(t5) and t5.tile_read == "read0"
    assert model.grad_accumulators == ("grad0", "grad0_rows", "grad0_at")


def test_reads_the_kernels_sum_are_accepted():
    assert _messages("w: learnable fp32[H]; score = s * w[h]") == []


def test_reads_no_kernel_sums_are_refused_with_a_caret():
    (message,) = _messages("w: learnable fp32[Nk]; score = s + w[k div 2]")
    assert "no kernel sums the gradient of this read of learnable `w`" in message
    assert "must be `q` or `k` itself or range over a constant dimension of at most" in message
    assert "<t>:1:" in message and "^" in message
    (message,) = _messages("w: learnable fp32[16, 16]; score = s + w[q % 16, k % 16]")
    assert "2 of its indices move with q or k" in message
    # The same reads of a constant input are fine, and so is a table over a constant size.
    assert _messages("w: fp32[Nk]; score = s + w[k div 2]") == []
    assert _messages("w: learnable fp32[Nk]; score = s + w[k]") == []  # COLS
    assert _messages("w: learnable fp32[1024]; score = s + w[min(abs(q - k), 1023)]") == []
    assert len(_messages("w: learnable fp32[1025]; score = s + w[min(abs(q - k), 1024)]")) == 1
