"""Split-KV decoding (decision 052): a call with few query rows per KV head's
group and no gradient runs `_attn_decode` over (key splits, batch * KV heads)
and merges the splits by their log-sum-exp (`_attn_decode_merge`).

Judged by the project's one rule (`flashgen.verify.tolerance`) against the
float64 reference, and against the ordinary forward kernel of the same
module; the merge is checked exactly where a split sees no key."""

from __future__ import annotations

import math

import pytest
import torch

from flashgen import ir, runtime
from flashgen.lower import lower
from flashgen.reference import attention_ref
from flashgen.verify import max_visible_score, tolerance

from kernel_utils import DEVICE, build, make_variant

CPU = DEVICE == "cpu"
HEAD_DIM = 16


def test_splits_fill_the_gpu_with_a_few_key_tiles_each():
    # B = 1, Hkv = 8 at 128k keys on 132 SMs: 33 splits, 264 programs.
    assert runtime._decode_splits(8, 131072, 64, 132) == 33
    assert runtime._decode_splits(1, 131072, 64, 132) == 264  # MQA: one program per split
    assert runtime._decode_splits(264, 131072, 64, 132) == 1  # the batch fills the GPU
    assert runtime._decode_splits(1, 1000, 64, 132) == 4  # 16 tiles, 4 per split
    assert runtime._decode_splits(1, 0, 64, 132) == runtime._decode_splits(3, 5, 64, 132) == 1
    q, k = torch.empty(2, 32, 3, 8), torch.empty(2, 8, 100, 8)
    assert runtime._decode_rows(q, k) == 12  # 4 heads per KV head, 3 rows each
    # One wave, not two: 64 groups at 32k keys take 4 splits (256 of 264 slots), not 5.
    assert runtime._decode_splits(64, 32768, 64, 132) == 4
    assert runtime._decode_splits(256, 8192, 64, 132) == 1


def _split_cost(programs, tiles, splits, slots=264):
    return math.ceil(programs * splits / slots) * (
        math.ceil(tiles / splits) + runtime.DECODE_SPLIT_COST
    )


@pytest.mark.parametrize("programs", [1, 3, 8, 24, 64, 100, 200, 300])
def test_splits_are_the_cheapest_of_the_wave_model(programs):
    # The candidates (splits that fill a last wave) find the cheapest of every
    # split count the key tiles allow, checked exhaustively.
    for n_keys in (1, 63, 64, 1000, 4096, 8192, 32768, 131072):
        tiles = math.ceil(n_keys / 64)
        splits = runtime._decode_splits(programs, n_keys, 64, 132)
        assert splits == 1 or tiles >= splits * runtime.DECODE_MIN_TILES
        allowed = range(1, max(1, tiles // runtime.DECODE_MIN_TILES) + 1)
        cheapest = min(_split_cost(programs, tiles, s) for s in allowed)
        assert _split_cost(programs, tiles, splits) <= 1.02 * cheapest


def test_each_tile_of_rows_takes_the_first_launch_that_holds_it(monkeypatch):
    # Every module's table ends at DECODE_MAX_ROWS, so every tile finds a launch;
    # the latent's 16-row tiles take their own (decision 064).
    for dtype, head_dim in ((ir.DType.BF16, 128), (ir.DType.FP32, 64), (ir.DType.BF16, 576)):
        configs = lower(make_variant("full", dtype=dtype, head_dim=head_dim)).gpu_decode_configs
        assert [c.block_m for c in configs] == sorted({c.block_m for c in configs})
        assert configs[-1].block_m == runtime.DECODE_MAX_ROWS
    monkeypatch.setattr(runtime, "GPU_DECODE_CONFIGS", ((16, 32, 4, 3), (64, 16, 8, 2)))
    gpu = torch.device("cuda")  # a device name: nothing runs on it
    assert runtime._decode_config(gpu, 16) == (32, 4, 3)
    assert runtime._decode_config(gpu, 32) == runtime._decode_config(gpu, 64) == (16, 8, 2)
    assert runtime._decode_config(torch.device("cpu"), 16) == (runtime.INTERPRETER_CONFIG[1], 1, 1)


# (mask, score, settings): the masks' bounds and tile classes, the score's
# element code with a head per row (alibi, h), a mask that reads h (no bounds),
# top-left alignment, conditional rescaling.
SPECS = [
    ("full", None, {}),
    ("causal", None, {}),
    ("causal & window(20)", "softcap(s, 5.0)", {"rescale_threshold": "8.0"}),
    ("causal & (q - k) % 2 == 0", "s - 0.05 * abs(q - k)", {}),
    ("causal", "s + alibi", {}),
    ("causal", None, {"align": "top_left"}),
    ("q - k <= 2 * h + 3", "s * (h + 1) * 0.5", {}),
    ("chunk(24)", None, {}),
]
# (B, H, Hkv, Nq, Nk): GQA, MQA and MHA; Nk across the interpreter's 32-key
# tiles and the splits, and below Nq (rows that see no key).
SHAPES = [(1, 4, 2, 1, 70), (2, 4, 1, 3, 45), (1, 2, 2, 2, 129), (1, 4, 2, 3, 2), (1, 2, 1, 2, 1)]


def _inputs(shape, dtype, seed=0):
    batch, heads, kv_heads, nq, nk = shape
    g = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(batch, h, n, HEAD_DIM, generator=g).to(device=DEVICE, dtype=dtype)
        for h, n in ((heads, nq), (kv_heads, nk), (kv_heads, nk))
    )


def _judge(variant, q, k, v, o, lse, ordinary=None, **ref):
    """The rule's checks of (o, lse) against the float64 reference, the
    ordinary side being the dense reference in q's dtype or `ordinary`."""
    double = {name: x.double() if name == "sinks" else x for name, x in ref.items()}
    ref_o, ref_lse = attention_ref(variant, q.double(), k.double(), v.double(), **double)
    if ordinary is None:
        ordinary = attention_ref(variant, q, k, v, dtype=q.dtype, **ref)
    s_max = max_visible_score(variant, q, k, None)
    v_max = v.abs().max().item() if v.numel() else 0.0
    return [
        tolerance(o.cpu(), ref_o.cpu(), ordinary[0].cpu(), q.dtype, score_noise=s_max * v_max),
        tolerance(lse.cpu(), ref_lse.cpu(), ordinary[1].cpu(), q.dtype, what="lse", score_noise=s_max),
    ]  # fmt: skip


@pytest.mark.kernels
@pytest.mark.parametrize("dtype", [ir.DType.FP32, ir.DType.FP16], ids=lambda d: d.value)
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: " ".join([s[0], s[1] or "", *s[2].values()]))
def test_decode_matches_the_reference_and_the_ordinary_kernel(spec, dtype):
    mask, score, settings = spec
    variant = make_variant(mask, score, dtype=dtype, head_dim=HEAD_DIM, **settings)
    module = build(variant)
    cpu_blocks = dict(block_m=32, block_n=32)
    for shape in SHAPES:
        q, k, v = _inputs(shape, module.DTYPE)
        ordinary = module.forward(q, k, v, **cpu_blocks)  # a launch config: the ordinary path
        for splits in (None, 3):
            o = torch.empty_like(q)
            lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
            module._decode(q, k, v, o, lse, module.DEFAULT_SCALE, splits=splits)
            for check in _judge(variant, q, k, v, o, lse):
                assert check.ok, (shape, splits, check)
            for check in _judge(variant, q, k, v, o, lse, ordinary=ordinary):
                assert check.ok, ("vs ordinary", shape, splits, check)
            # Rows that see no key: exactly o = 0 and lse = -inf, as the ordinary kernel's.
            empty = torch.isinf(ordinary[1])
            assert torch.equal(torch.isinf(lse), empty), (shape, splits)
            assert not o[empty].any() and not torch.isnan(o).any()


@pytest.mark.kernels
def test_decode_with_sinks_offsets_and_rows_that_see_no_key():
    variant = make_variant("causal & window(9)", dtype=ir.DType.FP32, head_dim=HEAD_DIM)
    module = build(variant)
    q, k, v = _inputs((2, 4, 2, 3, 100), torch.float32, seed=1)
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    for offsets in (None, (40, 0), (3, 50)):  # (3, 50): every query before every key
        o, lse = module.attention(
            q, k, v, sinks=sinks, return_lse=True, q_offset=offsets and offsets[0],
            k_offset=offsets and offsets[1],
        )  # fmt: skip
        for check in _judge(variant, q, k, v, o, lse, sinks=sinks, offsets=offsets):
            assert check.ok, (offsets, check)
    # With (3, 50) no row sees a key: o = 0 and the lse is the sink alone
    # (through log2 units and back: a rounding apart).
    assert not o.any()
    torch.testing.assert_close(lse, sinks[None, :, None].expand_as(lse), rtol=1e-6, atol=1e-6)


@pytest.mark.kernels
def test_decode_is_taken_for_small_query_tiles_without_a_gradient(monkeypatch):
    variant = make_variant("causal", dtype=ir.DType.FP32, head_dim=HEAD_DIM)
    module = build(variant)
    calls = []
    real = module._decode
    monkeypatch.setattr(module, "_decode", lambda *a, **kw: calls.append(1) or real(*a, **kw))

    def taken(fn) -> bool:
        calls.clear()
        fn()
        return bool(calls)

    q, k, v = _inputs((1, 8, 2, 3, 40), torch.float32)  # 4 heads x 3 rows per group
    assert taken(lambda: module.attention(q, k, v))
    assert taken(lambda: module.forward(q, k, v))
    with torch.no_grad():
        assert taken(lambda: module.attention(*(x.requires_grad_() for x in (q, k, v))))
    assert not taken(lambda: module.attention(q, k, v).sum().backward())  # a gradient is wanted
    q, k, v = (x.detach() for x in (q, k, v))
    assert not taken(lambda: module.forward(q, k, v, block_m=32))  # a launch config
    lengths = torch.tensor([3], device=DEVICE)
    assert not taken(lambda: module.attention(q, k, v, seqlens_q=lengths))  # a padded call
    big_q = _inputs((1, 8, 2, 17, 40), torch.float32)[0]  # 68 rows per group
    assert not taken(lambda: module.attention(big_q, k, v))


@pytest.mark.kernels
def test_the_merge_is_exact_where_a_split_sees_no_key():
    variant = make_variant("causal & window(3)", dtype=ir.DType.FP32, head_dim=HEAD_DIM)
    module = build(variant)
    # Hand-made splits: row 0 has one real split among masked ones, row 1 none.
    o_part = torch.zeros(3, 2, HEAD_DIM, device=DEVICE)
    o_part[1, 0] = torch.randn(HEAD_DIM, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    lse_part = torch.full((3, 2), float("-inf"), device=DEVICE)
    lse_part[1, 0] = 2.5  # log2 units
    o = torch.empty(1, 2, 1, HEAD_DIM, device=DEVICE)
    lse = torch.empty(1, 2, 1, device=DEVICE)
    module._launch(
        module._attn_decode_merge, (2, 1), o_part, lse_part, o, lse, lse, 2, 1, 3,
        HEAD_DIM, HEAD_DIM, 4, False, num_warps=1,
    )  # fmt: skip
    assert torch.equal(o[0, 0, 0], o_part[1, 0]) and lse[0, 0, 0] == 2.5 * math.log(2)
    assert not o[0, 1].any() and lse[0, 1, 0] == float("-inf")
    # In a module: 7 splits of 200 keys of which one sees the window, the same
    # bits as one split.
    q, k, v = _inputs((1, 2, 1, 2, 200), torch.float32)
    results = []
    for splits in (1, 7):
        o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device=DEVICE)
        results.append(module._decode(q, k, v, o, lse, module.DEFAULT_SCALE, splits=splits))
    assert all(torch.equal(a, b) for a, b in zip(*results))


@pytest.mark.kernels
def test_decode_through_tma_descriptors_matches_pointer_loads():
    variant = make_variant("causal & window(40)", dtype=ir.DType.FP16, head_dim=HEAD_DIM)
    module = build(variant)
    q, k, v = _inputs((1, 4, 2, 2, 100), torch.float16)
    results = []
    for tma in (False, True):
        o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device=DEVICE)
        results.append(module._decode(q, k, v, o, lse, module.DEFAULT_SCALE, tma=tma, splits=2))
    assert all(torch.equal(a, b) for a, b in zip(*results))
