"""Declared inputs (runtime data): the language, the checker, the float64
reference and the kernels that read them.  `check` refuses the reads of
learnable inputs whose gradient no kernel sums unless asked
(`learnable=True`, as here, for the reference); these tests pin down what
they mean (tests/test_learnable.py judges the kernels' gradients).

The reference is checked against independent computations: a packed batch
with a document mask must equal each document attended alone, a per-example
prefix must equal the positional `prefix(P)` of that example, a bias table
must equal the bias added by hand, and a learnable table's gradient must
equal the one autograd gives for that hand-built score."""

from __future__ import annotations

import pytest
import torch

from flashgen import ir
from flashgen.check import check
from flashgen.diagnostics import render_all
from flashgen.parse import parse
from flashgen.printer import print_variant
from flashgen.reference import attention_ref, check_inputs, mask_matrix


def _variants(text: str, learnable: bool = True):
    spec, diagnostics = parse(text, "<t>")
    assert not diagnostics, render_all(diagnostics, {"<t>": text})
    return check([spec], learnable=learnable)


def _variant(text: str) -> ir.Variant:
    (variant,), diagnostics = _variants(text)
    assert not diagnostics, render_all(diagnostics, {"<t>": text})
    return variant


def _messages(text: str, learnable: bool = True) -> list[str]:
    spec, diagnostics = parse(text, "<t>")
    if spec is not None:
        diagnostics = _variants(text, learnable)[1]
    return [d.message for d in diagnostics]


PACKED = """attention packed {
    head_dim = 16
    dtype = fp32
    doc: int32[B, Nk]
    mask = causal & doc[b, q] == doc[b, k]
}
"""


def _inputs(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_packed_documents_equal_each_document_alone():
    variant = _variant(PACKED)
    causal = _variant("attention c { head_dim = 16; dtype = fp32; mask = causal }")
    lengths = [[3, 1, 5, 2], [7, 4]]  # two packed sequences of 11 tokens
    doc = torch.tensor(
        [sum(([i] * n for i, n in enumerate(row)), []) for row in lengths], dtype=torch.int32
    )
    q, k, v = (_inputs(seed, 2, 2, 11, 16) for seed in (1, 2, 3))
    o, lse = attention_ref(variant, q, k, v, inputs={"doc": doc})
    for batch, row in enumerate(lengths):
        start = 0
        for n in row:
            part = slice(start, start + n)
            sub = [x[batch : batch + 1, :, part] for x in (q, k, v)]
            o_alone, lse_alone = attention_ref(causal, *sub)
            torch.testing.assert_close(o[batch : batch + 1, :, part], o_alone)
            torch.testing.assert_close(lse[batch : batch + 1, :, part], lse_alone)
            start += n
    assert mask_matrix(variant, 11, 11, 2, batch=2, inputs={"doc": doc}).shape == (2, 2, 11, 11)


def test_per_example_prefix_equals_each_examples_positional_prefix():
    variant = _variant(
        "attention p { head_dim = 16; dtype = fp32; prefix_len: int64[B]; "
        "mask = causal | k < prefix_len[b] }"
    )
    q, k, v = (_inputs(seed, 3, 2, 9, 16) for seed in (4, 5, 6))
    lengths = [0, 4, 9]
    o, _ = attention_ref(variant, q, k, v, inputs={"prefix_len": torch.tensor(lengths)})
    for batch, n in enumerate(lengths):
        alone = _variant(
            f"attention a {{ head_dim = 16; dtype = fp32; mask = causal | prefix({n}) }}"
        )
        o_alone, _ = attention_ref(alone, *(x[batch : batch + 1] for x in (q, k, v)))
        torch.testing.assert_close(o[batch : batch + 1], o_alone)


BUCKETS = """attention t5 {
    head_dim = 16
    dtype = fp32
    rel: learnable fp32[H, 8]
    mask = causal
    score = s + rel[h, min(q - k, 7)]
}
"""


def test_a_learnable_bias_table_is_added_and_gets_autograds_gradient():
    variant = _variant(BUCKETS)
    q, k, v = (_inputs(seed, 1, 2, 6, 16) for seed in (7, 8, 9))
    table = torch.randn(2, 8, generator=torch.Generator().manual_seed(10))
    do = _inputs(11, 1, 2, 6, 16)

    rel = table.clone().requires_grad_()
    o, _ = attention_ref(variant, q, k, v, inputs={"rel": rel})
    (o * do).sum().backward()

    by_hand = table.double().clone().requires_grad_()
    i = torch.arange(6)[:, None]
    j = torch.arange(6)[None, :]
    bucket = torch.clamp(i - j, max=7).clamp(min=0)  # masked pairs (j > i) never count
    bias = by_hand[:, bucket]  # (H, Nq, Nk)
    s = q @ k.transpose(-1, -2) / 4.0 + bias
    s = torch.where(j <= i, s, float("-inf"))
    o_hand = torch.softmax(s, dim=-1) @ v
    (o_hand * do).sum().backward()

    torch.testing.assert_close(o, o_hand)
    torch.testing.assert_close(rel.grad.double(), by_hand.grad, rtol=1e-6, atol=1e-6)
    # Buckets 6 and 7 (q - k >= 6) are never reached in 6 positions.
    assert rel.grad[:, 6:].abs().max() == 0 and rel.grad[:, :6].abs().min() > 0


def test_inputs_are_checked_by_name():
    variant = _variant(PACKED)
    q = k = torch.zeros(2, 1, 5, 16)
    good = torch.zeros(2, 5, dtype=torch.int32)
    assert check_inputs(variant, q, k, {"doc": good}).keys() == {"doc"}
    with pytest.raises(ValueError, match="missing input `doc`"):
        check_inputs(variant, q, k, {})
    with pytest.raises(ValueError, match="unknown input `docs`"):
        check_inputs(variant, q, k, {"doc": good, "docs": good})
    with pytest.raises(ValueError, match=r"input `doc` must have shape \(2, 5\), got \(5, 2\)"):
        check_inputs(variant, q, k, {"doc": good.T})
    with pytest.raises(TypeError, match="input `doc` must be torch.int32, got torch.int64"):
        check_inputs(variant, q, k, {"doc": good.long()})
    with pytest.raises(TypeError, match="input `doc` must be a torch.Tensor, got list"):
        check_inputs(variant, q, k, {"doc": [[0] * 5] * 2})


def test_a_score_index_needs_to_be_in_range_only_where_the_mask_keeps_the_pair():
    q, k, v = (_inputs(seed, 1, 1, 6, 16) for seed in (1, 2, 3))
    rel = {"rel": torch.zeros(4)}
    banded = _variant(
        "attention r { head_dim = 16; dtype = fp32; rel: fp32[4]; "
        "mask = causal & q - k < 4; score = s + rel[q - k] }"
    )
    attention_ref(banded, q, k, v, inputs=rel)  # q - k in 0..3 wherever visible
    full = _variant(
        "attention r { head_dim = 16; dtype = fp32; rel: fp32[4]; score = s + rel[q - k] }"
    )
    with pytest.raises(
        ValueError,
        match=r"`rel`: index 0 may reach -5 \.\. 5 in this call, outside its dimension of size 4",
    ):
        attention_ref(full, q, k, v, inputs=rel)


def test_a_mask_index_must_be_in_range_at_every_pair():
    variant = _variant(
        "attention r { head_dim = 16; dtype = fp32; d: int32[4]; mask = causal & d[k] == 0 }"
    )
    with pytest.raises(
        ValueError, match=r"`d`: index 0 may reach 0 \.\. 5 in this call, outside its dimension"
    ):
        mask_matrix(variant, 6, 6, 1, batch=1, inputs={"d": torch.zeros(4, dtype=torch.int32)})


def test_a_variant_with_inputs_prints_and_checks_back_the_same():
    for text in (PACKED, BUCKETS):
        variant = _variant(text)
        assert _variant(print_variant(variant)) == variant


def test_check_accepts_inputs_and_the_learnable_reads_the_kernels_sum():
    assert _messages(PACKED, learnable=False) == []
    assert _messages("attention x { head_dim = 16; dtype = fp32; mask = causal | b == 0 }") == []
    learnable = (
        "attention t { head_dim = 16; dtype = fp32; rel: learnable fp32[H, 32]; "
        "score = s + rel[h, min(max(q - k, 0), 31)] }"
    )
    assert _messages(learnable, learnable=True) == []
    # The reads the kernels sum are accepted, the others refused (but for the reference).
    assert _messages(learnable, learnable=False) == []
    reversed_key = (
        "attention t { head_dim = 16; dtype = fp32; w: learnable fp32[Nk]; score = s + w[k div 2] }"
    )
    assert _messages(reversed_key, learnable=True) == []
    assert _messages(reversed_key, learnable=False) == [
        "no kernel sums the gradient of this read of learnable `w`: index 1 moves with q or k, "
        "so it must be `q` or `k` itself or range over a constant dimension of at most 1024 "
        "(this one is Nk)"
    ]


@pytest.mark.parametrize(
    "body, message",
    [
        ("doc: int32[B, N]; mask = doc[b, q] == 0", "unknown size 'N'; did you mean 'Nq'?"),
        (
            "doc: int33[B]; mask = doc[b] == 0",
            "unknown element type 'int33'; did you mean 'int32'?",
        ),
        ("doc: long[B]; mask = doc[b] == 0", "unknown element type 'long'; did you mean 'int64'?"),
        (
            "q: int32[B]; mask = causal",
            "input name `q` is not allowed: `q` is a name of the language",
        ),
        ("Nk: int32[B]; mask = causal", "input name `Nk` is not allowed: `Nk` names a size"),
        (
            "scale: fp32[H]; mask = causal",
            "input name `scale` is not allowed: `scale` is an argument of the module's attention()",
        ),
        (
            "lambda: fp32[H]; score = s + lambda[h]",
            "input name `lambda` is not allowed: `lambda` cannot be a Python keyword argument",
        ),
        (
            "d: learnable int32[B]; mask = d[b] == 0",
            "an integer input cannot be learnable; `d` holds int32",
        ),
        ("d: int32[B]; d: int32[B]; mask = d[b] == 0", "duplicate input `d`"),
        (
            "torch: fp32[H]; score = s + torch[h]",
            "input name `torch` is not allowed: `torch` is a name the generated module uses",
        ),
        (
            "delta: fp32[H]; score = s + delta[h]",
            "input name `delta` is not allowed: `delta` is a name the generated module uses",
        ),
        (
            "len: int32[B]; mask = k < len[b]",
            "input name `len` is not allowed: `len` is a Python builtin, which the module's "
            "functions may call",
        ),
        ("d: int32[B, 0]; mask = d[b, 0] == 0", "a size must be between 1 and 2147483647, got 0"),
        ("d: int32[]; mask = causal", "`d` has no dimensions; an input has 1 to 4"),
        ("d: int32[B]; mask = d[b, q] == 0", "`d` has 1 dimension, indexed with 2 indices"),
        ("d: int32[B]; mask = d == 0", "`d` is an input; index it with 1 index: d[...]"),
        ("d: int32[B]; mask = e[b] == 0", "unknown input 'e'"),
        ("d: int32[B]; mask = q[b] == 0", "`q` is not an input; only declared inputs are indexed"),
        ("d: int32[B, Nk]; mask = d[b, d[b, k]] == 0", "an index may not read an input"),
        ("t: fp32[H]; score = t[s]", "an index must be an integer, got a real"),
        (
            "t: fp32[H]; mask = t[h] > 0",
            "the mask must be an integer/boolean expression; `t` holds fp32 reals",
        ),
        (
            "d: int32[B]; mask = causal",
            "input `d` is declared but neither the mask nor the score reads it",
        ),
        (
            "d: int64[B]; mask = d[b] + 1 > 0",
            "`d[b] + 1` can reach about 2^63.0; integer expressions that read inputs must stay within ±2^62",
        ),
    ],
)
def test_input_diagnostics(body, message):
    assert _messages(f"attention x {{ head_dim = 16; dtype = fp32; {body} }}") == [message]


def test_int32_inputs_compare_and_add_in_64_bits():
    """Comparing two int32 values (a difference up to 2^32) and adding to one
    are fine: expressions that read inputs are computed in 64 bits."""
    _variant(
        "attention x { head_dim = 16; dtype = fp32; d: int32[B, Nk]; "
        "mask = d[b, q] == d[b, k] & d[b, q] + q > 0 }"
    )


# --------------------------------------------------------------------------- #
# Kernels that read inputs, under the interpreter, against the reference
# --------------------------------------------------------------------------- #

KERNEL_SPECS = {
    "packed documents, T5-style bias table": (
        "doc: int32[B, Nk]; rel: fp32[H, 8]; "
        "mask = causal & doc[b, q] == doc[b, k]; score = s + rel[h, min(q - k, 7)]"
    ),
    "per-example prefix (int64), a window": (
        "prefix_len: int64[B]; mask = causal & window(20) | k < prefix_len[b]"
    ),
    "a per-head temperature, every pair": ("temp: fp32[H]; score = s * temp[h]"),
    "a per-key bias read twice, the batch index": (
        "bias: fp16[B, Nk]; mask = causal | b == 1; score = softcap(s + bias[b, k], 5.0) - bias[b, k]"
    ),
    "documents or a window, top-left": (
        "align = top_left; doc: int32[B, Nk]; mask = doc[b, q] == doc[b, k] | window(3)"
    ),
    "per-head reach, documents at most one apart": (
        "t: int32[H]; d: int32[B, Nk]; mask = causal & k <= q + t[h] & d[b, k] >= d[b, q] - 1"
    ),
}


@pytest.fixture
def _interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.mark.kernels
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("name", sorted(KERNEL_SPECS))
def test_kernels_that_read_inputs_match_the_reference(name, dtype, _interpreter):
    from flashgen.api import load_variant
    from flashgen.verify import (
        Shape,
        check_backward,
        check_forward,
        check_refusal,
        random_inputs,
        random_runtime_inputs,
    )

    variant = _variant(f"attention t {{ head_dim = 16; dtype = {dtype}; {KERNEL_SPECS[name]} }}")
    module = load_variant(variant)
    generator = torch.Generator().manual_seed(0)
    torch_dtype = {"fp32": torch.float32, "fp16": torch.float16}[dtype]
    for shape in (Shape(2, 2, 1, 45, 45), Shape(1, 2, 2, 33, 70), Shape(2, 1, 1, 70, 33)):
        q, k, v = random_inputs(shape, 16, torch_dtype, "cpu", generator=generator)
        data = random_runtime_inputs(variant, shape, "cpu", generator=generator)
        refused = check_refusal(variant, module, q, k, v, data)
        if refused is not None:  # a call the language refuses: the module must refuse it too
            assert refused.ok, (refused.refused, refused.module_refused)
            continue
        forward = check_forward(variant, module, q, k, v, inputs=data)
        backward = check_backward(variant, module, q, k, v, generator=generator, inputs=data)
        for result in (forward, backward):
            assert result.ok, [(c.what, c.error, c.bound) for c in result.checks]


@pytest.mark.kernels
def test_a_module_checks_its_inputs_like_q_k_v(_interpreter):
    from flashgen.api import load_variant

    module = load_variant(_variant(PACKED))
    q = k = v = torch.zeros(2, 1, 5, 16)
    doc = torch.zeros(2, 5, dtype=torch.int32)
    module.attention(q, k, v, doc=doc)
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'doc'"):
        module.attention(q, k, v)
    with pytest.raises(
        TypeError, match="doc has dtype torch.int64, but the spec declares torch.int32"
    ):
        module.attention(q, k, v, doc=doc.long())
    with pytest.raises(ValueError, match=r"doc must have shape \(2, 5\), got \(5, 2\)"):
        module.forward(q, k, v, doc=doc.T)
    with pytest.raises(TypeError, match="doc must be a torch.Tensor, got list"):
        module.backward(q, k, v, q, torch.zeros(2, 1, 5), q, doc=[[0] * 5] * 2)


def test_which_variants_that_read_inputs_take_the_gluon_kernels():
    """The Gluon backward at head dim 64 where the mask alone reads runtime
    data and the call's plan classifies its tiles (decision 078), not where
    the score reads it, nor where the plan cannot bound a read (an index over
    both q and k); at head dim 128 the Triton backward, which measured faster.
    The any-mask Gluon forward at head dim 128 where the plan classifies its
    tiles and documents do not bound the rows (decision 098); else the Triton
    forward."""
    from flashgen import kernel_choice, lower

    cases = {  # body: (Gluon backward, a plan, the Gluon forward at d128)
        "doc: int32[B, Nk]; mask = causal & doc[b, q] == doc[b, k]": (True, True, False),
        "mask = causal | b == 0": (True, True, True),
        "n: int32[B]; mask = causal | k < n[b]": (True, True, True),
        "rel: fp32[H, 8]; mask = causal; score = s + rel[h, min(q - k, 7)]": (False, False, False),
        "rel: fp32[B, H]; mask = causal; score = s * rel[b, h]": (False, False, False),
        "d: int32[16]; mask = d[(q + k) % 16] > 0": (False, False, False),
    }
    for body, (gluon, planned, gluon_forward) in cases.items():
        for head_dim in (64, 128):
            variant = _variant(f"attention t {{ head_dim = {head_dim}; dtype = bf16; {body} }}")
            # the module's own kernels (by default packed documents carry
            # those of the mask's positional part instead, decision 109)
            model = lower.lower(variant, document_runs=False)
            runs = lower.lower(variant, document_runs=True).runs
            assert (runs is not None) is body.startswith("doc"), body
            any_mask = lower.GluonForward.ANY if gluon_forward and head_dim == 128 else None
            assert model.gluon_forward is any_mask, body
            assert model.gluon_backward is (gluon and head_dim == 64), body
            assert (model.data_plan is not None) is planned, body
    # Without the rule, none does.
    kernel_choice.GLUON_DATA_MASKS = False
    try:
        (body,) = [b for b in cases if b.startswith("doc")]
        model = lower.lower(
            _variant(f"attention t {{ head_dim = 64; dtype = bf16; {body} }}"), document_runs=False
        )
        assert not model.gluon_backward
    finally:
        kernel_choice.GLUON_DATA_MASKS = True


# --------------------------------------------------------------------------- #
# FlexAttention's mods and `flashgen bench` with inputs
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("name", sorted(KERNEL_SPECS))
def test_flex_mods_with_captured_inputs_compute_the_reference(name):
    """The FlexAttention equivalent that `flashgen bench` cross-checks against
    reads the inputs as captured tensors (eager flex_attention on the CPU)."""
    import warnings

    from torch.nn.attention import flex_attention

    from flashgen.flex import flex_mods
    from flashgen.verify import Shape, random_runtime_inputs

    variant = _variant(f"attention t {{ head_dim = 16; dtype = fp32; {KERNEL_SPECS[name]} }}")
    shape = Shape(2, 2, 2, 40, 40)
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 40, 16, generator=generator, dtype=torch.float64) for _ in "qkv")
    data = random_runtime_inputs(variant, shape, "cpu", generator=generator)
    mods = flex_mods(variant, 40, 40, 2, device="cpu", inputs=data)
    block_mask = None
    if mods.mask_mod is not None:
        block_mask = flex_attention.create_block_mask(mods.mask_mod, 2, 2, 40, 40, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex_attention warns it is unfused
        o = flex_attention.flex_attention(
            q, k, v, score_mod=mods.score_mod, block_mask=block_mask, scale=0.25
        )
    ref, _ = attention_ref(variant, q, k, v, inputs=data)
    torch.testing.assert_close(o, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.kernels
def test_bench_runs_a_spec_with_inputs_on_the_cpu(_interpreter):
    """The same random inputs reach flashgen and FlexAttention, whose outputs
    agree; the density counts each example's documents."""
    import warnings

    from flashgen import bench

    variant = _variant(PACKED)

    def timer(fn):
        fn()
        return 2.0

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = bench.bench(
            [variant], seqlens=[40], batch=2, heads=2, device="cpu", timer=timer,
            compile_flex=False, systems=("flashgen", "flex"), progress=False, document_length=8,
        )  # fmt: skip
    ours, flex = results
    assert not ours.error and flex.max_diff is not None and flex.max_diff < 1e-4
    data = bench.random_runtime_inputs(
        variant, bench.Shape(2, 2, 2, 40, 40), "cpu",
        generator=torch.Generator().manual_seed(40), mean_run=8,
    )  # fmt: skip
    visible = mask_matrix(variant, 40, 40, 2, batch=2, inputs=data)
    assert ours.density == pytest.approx(visible.double().mean().item())


@pytest.mark.kernels
def test_tune_times_a_spec_with_inputs(_interpreter):
    """`flashgen tune` passes random inputs of the declared shapes to every
    candidate: all of them run (none is skipped as failing)."""
    from flashgen import tune
    from flashgen.launch import LaunchConfig

    variant = _variant(PACKED)
    calls = []

    def timer(fn):
        fn()
        calls.append(fn)
        return float(len(calls))

    forward = [LaunchConfig(16, 16, 1, 1), LaunchConfig(32, 16, 1, 1)]
    backward = [LaunchConfig(16, 32, 1, 1), LaunchConfig(32, 32, 1, 1)]
    _, times = tune.tune(
        variant, seqlens=[40], batch=2, heads=2, device="cpu", timer=timer,
        forward_candidates=forward, backward_candidates=backward, device_name="Test GPU",
    )  # fmt: skip
    assert all(t is not None for t in times["forward"].values())
    assert all(t is not None for t in times["backward"].values())
    assert set(times["forward"]) == set(forward) and set(times["backward"]) == set(backward)


def test_tune_draws_the_documents_the_bench_draws(monkeypatch):
    # Tuned on documents of a few tokens, a packed-document spec would keep
    # configurations for another workload than the one it is benched on.
    from flashgen import bench, tune, verify

    seen = []

    def draw(*args, mean_run=None, **kwargs):
        seen.append(mean_run)
        raise RuntimeError("stop")

    monkeypatch.setattr(verify, "random_runtime_inputs", draw)
    with pytest.raises(RuntimeError, match="stop"):
        tune.tune(_variant(PACKED), seqlens=[40], batch=1, heads=1, device="cpu")
    assert seen == [bench.DOCUMENT_LENGTH]


@pytest.mark.kernels
@pytest.mark.parametrize("align", ["bottom_right", "top_left"])
@pytest.mark.parametrize("programs", [1, 10**6])  # groups of up to 8 tiles a program, or 1
def test_the_plan_skips_exactly_the_tiles_that_cross_documents(
    align, programs, _interpreter, monkeypatch
):
    """Packed documents (ids non-decreasing): for every query tile, the plan's
    key range runs from the first to past the last key tile that holds a
    visible pair, and its whole tiles are the tiles whose every pair is visible
    (from the dense mask of the reference); likewise for key tiles.  Whether
    a program classifies one tile or a group of them (PLAN_PROGRAMS)."""
    from flashgen.api import load_variant

    variant = _variant(
        f"attention p {{ head_dim = 16; dtype = fp32; align = {align}; doc: int32[B, Nk]; "
        "mask = causal & doc[b, q] == doc[b, k] }"
    )
    module = load_variant(variant)
    monkeypatch.setattr(module, "PLAN_PROGRAMS", programs)
    lengths = [[40, 5, 1, 50, 32], [128, 0, 0, 0, 0]]
    doc = torch.tensor(
        [[d for d, n in enumerate(row) for _ in range(n)] for row in lengths], dtype=torch.int32
    )
    nq, nk = 100, 128
    q = torch.zeros(2, 2, nq, 16)
    k = torch.zeros(2, 1, nk, 16)
    visible = mask_matrix(variant, nq, nk, 1, batch=2, inputs={"doc": doc})[:, 0]
    offset = nk - nq if align == "bottom_right" else 0
    for outer, inner, keys_inner in ((32, 16, True), (16, 32, True), (32, 16, False)):
        plan = module._data_plans(q, k, outer, inner, (keys_inner,), (doc,))[0]
        for b in range(2):
            grid = visible[b] if keys_inner else visible[b].T
            n_inner = grid.shape[1]
            for tile in range(plan.shape[1]):
                block = grid[tile * outer : (tile + 1) * outer]
                tiles = [block[:, t : t + inner] for t in range(0, n_inner, inner)]
                seen = [i for i, t in enumerate(tiles) if t.any()]
                whole = [i for i, t in enumerate(tiles) if t.all()]  # a ragged last one too
                shift = 0 if keys_inner else offset
                lo, hi, full_lo, full_hi = plan[b, tile].tolist()
                if seen:
                    assert (lo - shift, hi - shift) == (
                        seen[0] * inner,
                        min((seen[-1] + 1) * inner, n_inner),
                    ), (b, tile)
                else:
                    assert lo >= hi
                run = whole[:1]
                while run and run[-1] + 1 in whole:
                    run.append(run[-1] + 1)
                if run:
                    assert (full_lo - shift, full_hi - shift) == (
                        run[0] * inner,
                        (run[-1] + 1) * inner - 1,
                    ), (b, tile)
                else:
                    assert full_lo > full_hi


# Masks whose plans read inputs of each side, of neither side, per head, and
# sequences with offsets.
PLANNED_MASKS = [
    ("doc: int32[B, Nk]", "causal & doc[b, q] == doc[b, k]"),
    ("prefix_len: int64[B]", "causal | k < prefix_len[b]"),
    ("t: int32[H]; d: int32[B, Nk]", "causal & k <= q + t[h] & d[b, k] >= d[b, q] - 1"),
    ("d: int32[B, Nk]", "!(d[b, k] > d[b, q] + 2) & (q - k) % 3 != 1"),
]


@pytest.mark.kernels
@pytest.mark.parametrize("declared, mask", PLANNED_MASKS)
def test_a_plan_is_the_same_whatever_tiles_a_program_groups(
    declared, mask, _interpreter, monkeypatch
):
    """`_attn_plan` classifies GROUP tiles a program against the other side's
    tiles, loaded once for the group: the plan has the same bits for groups of
    1, 2, 4 and 8 tiles (ragged groups at the end included), for the forward's
    and the backward's tile shapes, with and without position offsets, and
    whether one launch classifies one side or both (Nq != Nk)."""
    from flashgen.api import load_variant
    from flashgen.verify import Shape, random_runtime_inputs

    variant = _variant(
        f"attention p {{ head_dim = 16; dtype = fp32; align = top_left; {declared}; mask = {mask} }}"
    )
    module = load_variant(variant)
    nq, nk = 75, 130
    q, k = torch.zeros(2, 2, nq, 16), torch.zeros(2, 1, nk, 16)
    data = random_runtime_inputs(
        variant, Shape(2, 2, 1, nq, nk), "cpu", generator=torch.Generator().manual_seed(3),
        mean_run=9,
    )  # fmt: skip
    inputs = module._check_runtime_inputs(q, k, tuple(data.values()))
    for shifts in (None, (5, 0)):
        for outer, inner, keys_inner in ((16, 16, True), (32, 16, False), (16, 32, True)):
            plans = []
            for programs in (10**6, 4, 2, 1):  # groups of 1 tile, then of up to 8
                module.PLAN_PROGRAMS = programs
                plans.append(
                    module._data_plans(q, k, outer, inner, (keys_inner,), inputs, None, shifts)[0]
                )
            module.PLAN_PROGRAMS = 128
            for plan in plans[1:]:
                assert torch.equal(plan, plans[0]), (shifts, outer, inner, keys_inner)
            # Both sides in one launch: each the same bits as its side alone.
            for programs in (10**6, 2):
                module.PLAN_PROGRAMS = programs
                both = module._data_plans(q, k, outer, inner, (False, True), inputs, None, shifts)
                module.PLAN_PROGRAMS = 128
                alone = module._data_plans(
                    q, k, outer, inner, (not keys_inner,), inputs, None, shifts
                )
                assert torch.equal(both[int(keys_inner)], plans[0]), (shifts, outer, inner)
                assert torch.equal(both[int(not keys_inner)], alone[0]), (shifts, outer, inner)


# Masks over declared inputs for the plan's property test: atoms that read
# per-key values on either side (not sorted: the interval analysis is only
# conservative there), a per-example length and a per-head reach, combined
# with & | ! and positional masks.
_DATA_ATOMS = (
    "d[b, q] == d[b, k]",
    "d[b, k] <= d[b, q] + {c}",
    "d[b, k] > {c}",
    "abs(d[b, k] - d[b, q]) < {c}",
    "(d[b, q] + k) % 3 != 0",
    "k < p[b]",
    "k >= p[b] - {c}",
    "q - k <= t[h]",
)
_POSITION_ATOMS = ("causal", "window(9)", "prefix(5)", "(q - k) % 3 != 1", "k >= 4", "full")
_DATA_DECLARATIONS = {"d": "d: int32[B, Nk]", "p": "p: int32[B]", "t": "t: int32[H]"}


def _data_masks():
    from hypothesis import strategies as st

    atoms = st.one_of(
        st.tuples(st.sampled_from(_DATA_ATOMS), st.integers(0, 3)).map(
            lambda a: a[0].format(c=a[1])
        ),
        st.sampled_from(_POSITION_ATOMS),
    )
    return st.recursive(
        atoms,
        lambda inner: st.one_of(
            inner.map(lambda m: f"!({m})"),
            st.tuples(inner, st.sampled_from(["&", "|"]), inner).map(
                lambda t: f"({t[0]}) {t[1]} ({t[2]})"
            ),
        ),
        max_leaves=4,
    ).filter(lambda m: any(f"{name}[" in m for name in _DATA_DECLARATIONS))


@pytest.mark.kernels
def test_drawn_masks_over_inputs_plan_every_visible_pair_and_only_whole_tiles(_interpreter):
    """Property: for masks drawn over declared inputs (values in no order),
    the plan of each side, built in one launch, keeps every tile that holds a
    visible pair within [lo, hi) and calls whole only tiles whose every pair
    is visible (the dense mask of the reference), and the forward and the
    gradients match the float64 reference."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from flashgen.api import load_variant
    from flashgen.verify import Shape, check_backward, check_forward, random_inputs

    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
    @given(mask=_data_masks(), seed=st.integers(0, 2**16))
    def run(mask, seed):
        used = [name for name in _DATA_DECLARATIONS if f"{name}[" in mask]
        declared = "; ".join(_DATA_DECLARATIONS[name] for name in used)
        variants, diagnostics = _variants(
            f"attention t {{ head_dim = 16; dtype = fp32; {declared}; mask = {mask} }}"
        )
        assert all(d.severity == "warning" for d in diagnostics), [d.message for d in diagnostics]
        (variant,) = variants
        module = load_variant(variant)
        batch, heads, nq, nk = 2, 2, 37, 53
        g = torch.Generator().manual_seed(seed)
        values = {
            "d": lambda: torch.randint(0, 4, (batch, nk), generator=g, dtype=torch.int32),
            "p": lambda: torch.randint(0, nk + 1, (batch,), generator=g, dtype=torch.int32),
            "t": lambda: torch.randint(-3, 12, (heads,), generator=g, dtype=torch.int32),
        }
        data = {name: values[name]() for name in used}
        q, k, v = random_inputs(Shape(batch, heads, heads, nq, nk), 16, torch.float32, "cpu", generator=g)  # fmt: skip
        inputs = module._check_runtime_inputs(q, k, tuple(data.values()))
        visible = mask_matrix(variant, nq, nk, heads, batch=batch, inputs=data)
        offset = nk - nq  # bottom-right: query row i at position i + offset
        for outer, inner in ((16, 16), (32, 16)):
            plans = module._data_plans(q, k, outer, inner, (False, True), inputs)
            for keys_inner, plan in zip((False, True), plans):
                per_head = plan.shape[0] == batch * heads
                for row in range(plan.shape[0]):
                    b, h = divmod(row, heads) if per_head else (row, None)
                    grid = visible[b, h] if per_head else visible[b].any(0)
                    if not per_head:  # a plan shared by the heads: the mask reads no h
                        assert torch.equal(visible[b].all(0), grid)
                    grid = grid if keys_inner else grid.T
                    shift = 0 if keys_inner else offset
                    n_inner = grid.shape[1]
                    for tile in range(plan.shape[1]):
                        block = grid[tile * outer : (tile + 1) * outer]
                        lo, hi, full_lo, full_hi = (x - shift for x in plan[row, tile].tolist())
                        seen = block.any(0).nonzero().flatten().tolist()
                        if seen:
                            assert lo <= seen[0] and seen[-1] < hi, (mask, keys_inner, row, tile)
                            assert lo % inner == 0, (mask, keys_inner, row, tile)
                        if full_lo <= full_hi:
                            whole = block[:, full_lo : min(full_hi + 1, n_inner)]
                            assert whole.all(), (mask, keys_inner, row, tile)
        generator = torch.Generator().manual_seed(seed)
        forward = check_forward(variant, module, q, k, v, inputs=data)
        backward = check_backward(variant, module, q, k, v, generator=generator, inputs=data)
        for result in (forward, backward):
            assert result.ok, (mask, [(c.what, c.error, c.bound) for c in result.checks])

    run()


@pytest.mark.kernels
def test_a_document_mask_launches_heads_first_and_falls_back_past_the_grid_axis(
    _interpreter, monkeypatch
):
    """A document mask's forward takes one query tile of every head after
    another (decision 069), its backward one tile (decision 070); where the
    tiles would not fit the grid's second axis (HEADS_FIRST_MAX_TILES) each
    takes them as other modules do: the same bits either way, forward and
    gradients."""
    from flashgen.api import load_variant

    module = load_variant(_variant(PACKED))
    assert module.HEADS_FIRST_MAX_TILES == 2**16 - 1
    launched = []
    launch = module._launch

    def counted(kernel, grid, *args, **options):
        if kernel in (module._attn_fwd, module._attn_bwd):
            launched.append(grid)
        return launch(kernel, grid, *args, **options)

    monkeypatch.setattr(module, "_launch", counted)
    doc = torch.tensor([[0] * 30 + [1] * 41 + [2] * 29, [0] * 100], dtype=torch.int32)
    generator = torch.Generator().manual_seed(2)
    q, k, v, do = (torch.randn(2, 3, 100, 16, generator=generator) for _ in range(4))
    runs = []
    for limit in (2**16 - 1, 1):
        monkeypatch.setattr(module, "HEADS_FIRST_MAX_TILES", limit)
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        o = module.attention(*leaves, doc=doc)
        runs.append((o, *torch.autograd.grad(o, leaves, do)))
    tiles = -(-100 // module.INTERPRETER_CONFIG[0])
    bwd_tiles = 2 * -(-100 // module.INTERPRETER_CONFIG[1])  # key tiles + query tiles
    # (batch * heads, tiles), then the other
    assert launched == [(6, tiles), (6, bwd_tiles), (tiles, 6), (bwd_tiles, 6)]
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.kernels
def test_a_plan_built_once_serves_every_layer_with_the_same_bits(_interpreter, monkeypatch):
    """tile_plan(): the per-call plan of issue 21, built once per batch and
    passed to each layer's attention() as plan=: the same outputs and
    gradients, bit for bit, as calls that build their own, and no plan
    kernel launched by a call that is given one."""
    from flashgen.api import load_variant

    module = load_variant(_variant(PACKED.replace("fp32", "fp16")))
    lengths = [[3, 40, 1, 20, 33], [97, 0, 0, 0, 0]]
    doc = torch.tensor(
        [[d for d, n in enumerate(row) for _ in range(n)] for row in lengths], dtype=torch.int32
    )
    generator = torch.Generator().manual_seed(1)
    layers = [
        [torch.randn(2, 2, 97, 16, generator=generator).half() for _ in range(4)] for _ in range(2)
    ]
    plan = module.tile_plan(*layers[0][:3], doc=doc)
    launched = []
    launch = module._launch

    def counted(kernel, *args, **options):
        launched.append(kernel)
        return launch(kernel, *args, **options)

    monkeypatch.setattr(module, "_launch", counted)
    for q, k, v, do in layers:
        results = []
        for given in (None, plan):
            leaves = [x.clone().requires_grad_() for x in (q, k, v)]
            launched.clear()
            o, lse = module.attention(*leaves, doc=doc, plan=given, return_lse=True)
            grads = torch.autograd.grad((o, lse), leaves, (do, torch.ones_like(lse)))
            plans = sum(kernel is module._attn_plan for kernel in launched)
            assert plans == (2 if given is None else 0)  # the forward's, the backward's
            results.append((o, lse, *grads))
        for a, b in zip(*results):
            assert torch.equal(a, b)


@pytest.mark.kernels
def test_a_plan_serves_a_mask_of_the_batch_index_without_inputs(_interpreter):
    """A mask that reads the batch index and no declared input has a plan too:
    tile_plan() and attention(plan=) take no input tensors, and give the
    outputs and gradients of calls that build their own plans, bit for bit.
    (tile_plan() once checked inputs that such a module does not declare, and
    the kernels took the plan in the place of the call's offsets.)"""
    from flashgen.api import load_variant

    variant = _variant("attention t { head_dim = 16; dtype = fp32; mask = causal | b == 0 }")
    module = load_variant(variant)
    generator = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(2, 2, 70, 16, generator=generator) for _ in range(4))
    plan = module.tile_plan(q, k, v)
    results = []
    for given in (None, plan):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        o = module.attention(*leaves, plan=given)
        results.append((o, *torch.autograd.grad(o, leaves, do)))
    for a, b in zip(*results):
        assert torch.equal(a, b)
    ref, _ = attention_ref(variant, q.double(), k.double(), v.double())
    assert torch.allclose(results[1][0].double(), ref, atol=1e-5)


@pytest.mark.kernels
def test_a_plan_for_another_call_is_refused(_interpreter):
    from flashgen.api import load_variant

    module = load_variant(_variant(PACKED))
    q = k = v = torch.zeros(2, 1, 8, 16)
    doc = torch.zeros(2, 8, dtype=torch.int32)
    plan = module.tile_plan(q, k, v, doc=doc)
    module.attention(q, k, v, doc=doc, plan=plan)
    other = doc.clone()
    with pytest.raises(ValueError, match="plan was built for another call"):
        module.attention(q, k, v, doc=other, plan=plan)  # the same ids, another tensor
    longer = torch.zeros(2, 1, 9, 16)
    with pytest.raises(ValueError, match="plan was built for another call"):
        module.attention(
            longer, longer, longer, doc=torch.zeros(2, 9, dtype=torch.int32), plan=plan
        )
    doc[1, 4:] = 1  # written in place after the plan was built
    with pytest.raises(ValueError, match="plan was built for another call"):
        module.attention(q, k, v, doc=doc, plan=plan)
    with pytest.raises(TypeError, match="plan must come from tile_plan"):
        module.attention(q, k, v, doc=doc, plan=plan.tiles)


@pytest.mark.kernels
def test_a_plan_serves_padded_calls_of_the_same_sequences(_interpreter):
    from flashgen.api import load_variant

    # Padded calls take inputs without an Nq or Nk dimension: a per-row prefix.
    text = "attention p { head_dim = 16; dtype = fp16; prefix_len: int32[B]; mask = causal | k < prefix_len[b] }"
    module = load_variant(_variant(text))
    generator = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 40, 16, generator=generator).half() for _ in range(3))
    prefix_len = torch.tensor([12, 30], dtype=torch.int32)
    lengths = torch.tensor([40, 23])
    seqs = module.sequences(seqlens_q=lengths, seqlens_k=lengths)
    plan = module.tile_plan(q, k, v, sequences=seqs, prefix_len=prefix_len)
    fresh = module.attention(q, k, v, sequences=seqs, prefix_len=prefix_len)
    given = module.attention(q, k, v, sequences=seqs, prefix_len=prefix_len, plan=plan)
    assert torch.equal(given, fresh)
    again = module.sequences(seqlens_q=lengths, seqlens_k=lengths)  # equal, but not the same
    with pytest.raises(ValueError, match="plan was built for another call"):
        module.attention(q, k, v, sequences=again, prefix_len=prefix_len, plan=plan)
    with pytest.raises(ValueError, match="plan was built for another call"):
        module.attention(
            q, k, v, sequences=seqs, prefix_len=prefix_len, plan=plan, q_offset=1, k_offset=1
        )


def test_modules_of_specs_with_inputs_are_black_clean():
    """Emitted in final form, as the examples' modules are (tests/test_golden.py)."""
    import black

    from flashgen.api import build_source
    from flashgen.emit import LINE_LENGTH

    mode = black.Mode(line_length=LINE_LENGTH, magic_trailing_comma=False)
    for body in KERNEL_SPECS.values():
        source = build_source(f"attention t {{ head_dim = 16; dtype = fp32; {body} }}")
        assert black.format_str(source, mode=mode) == source, body


def test_t5_example_buckets_are_t5s():
    """examples/t5_relative_bias.attn spells T5's relative position buckets
    (32, max_distance 128, one direction) with min and max; at every distance
    from 0 to 999 its table index equals T5's float32 formula, written here
    as the T5 paper's code computes it."""
    import math
    from pathlib import Path

    from flashgen.reference import scores

    path = Path(__file__).parent.parent / "examples" / "t5_relative_bias.attn"
    spec, diagnostics = parse(path.read_text(), str(path))
    assert not diagnostics
    (variant,), diagnostics = check([spec])
    assert not diagnostics
    n = 1000
    # One query at position n - 1 (bottom-right) against keys 0 .. n - 1, s = 0 and
    # rel[0, j] = j: the score is the bucket of the distance n - 1 - k.
    q, k = torch.zeros(1, 1, 1, variant.head_dim), torch.zeros(1, 1, n, variant.head_dim)
    rel = torch.arange(32, dtype=torch.float32)[None]
    got = scores(variant, q, k, inputs={"rel": rel})[0, 0, 0].flip(0)
    distance = torch.arange(n)
    large = 16 + (torch.log(distance.float() / 16) / math.log(128 / 16) * 16).to(torch.long)
    want = torch.where(distance < 16, distance, torch.clamp(large, max=31))
    assert torch.equal(got, want.to(torch.float64))


def test_clamped_integer_terms_count_by_their_values_not_their_arguments():
    """`min(max(q - k - t, 0), 1)` is 0 or 1: sixteen of them summed stay far
    from the 32-bit limit, though each argument reaches 2^26 (the T5 example);
    an unclamped sum of as many differences is still refused."""
    clamped = " + ".join(f"min(max(q - k - {t}, 0), 1)" for t in range(16))
    assert _messages(f"attention c {{ head_dim = 16; dtype = fp32; mask = {clamped} > 3 }}") == []
    raw = " + ".join(f"(q - k - {t})" for t in range(16))
    (message,) = _messages(f"attention c {{ head_dim = 16; dtype = fp32; mask = {raw} > 3 }}")
    assert "integer expressions must stay within ±2^30" in message
