"""KV caches (decision 056): attention(q, k_cache, v_cache, cache_seqlens=...,
block_table=...) over a contiguous (B, Hkv, Nmax, D) cache or a paged
(pages, page_size, Hkv, D) one, each row's length read on the GPU.

Judged by the project's one rule (`flashgen.verify.tolerance`) against the
float64 reference on each row's valid keys, its queries at the last Nq of
them; paged and contiguous caches of one capacity give the same bits; the
host path is checked to never synchronize, and on a GPU a captured CUDA
graph replays with new lengths and tables."""

from __future__ import annotations

import pytest
import torch

from flashgen import ir, runtime
from flashgen.reference import attention_ref
from flashgen.verify import max_visible_score, tolerance

from kernel_utils import DEVICE, build, make_variant

HEAD_DIM = 16
# (mask, score, settings): bounds and tile classes, a softcap, alibi (a
# slope per row), a mask and a score that read h (no bounds), top-left
# alignment (a cache's queries still sit at its end).
SPECS = [
    ("full", None, {}),
    ("causal", None, {}),
    ("causal & window(20)", "softcap(s, 5.0)", {}),
    ("causal", "s + alibi", {}),
    ("q - k <= 2 * h + 3", "s * (h + 1) * 0.5", {}),
    ("causal", None, {"align": "top_left"}),
    ("causal & (q - k) % 2 == 1", None, {}),  # residue classes in the forward (decision 085)
]


def _tensors(batch, heads, kv_heads, nq, capacity, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, nq, HEAD_DIM, generator=g)
    k, v = (torch.randn(batch, kv_heads, capacity, HEAD_DIM, generator=g) for _ in range(2))
    return tuple(x.to(device=DEVICE, dtype=dtype) for x in (q, k, v))


def _paged(k, v, page_size, seed=0):
    """The contiguous cache (B, Hkv, Nmax, D) as pages (pages, page_size,
    Hkv, D) in a random order, with the block table that lists them, and
    two spare pages of NaN that no row uses."""
    batch, kv_heads, capacity, _ = k.shape
    per_row = capacity // page_size
    order = torch.randperm(batch * per_row + 2, generator=torch.Generator().manual_seed(seed))
    table = order[: batch * per_row].view(batch, per_row).to(torch.int32)
    caches = []
    for x in (k, v):
        d = x.shape[3]  # v may have its own head dim (v_head_dim)
        pages = torch.full(
            (batch * per_row + 2, page_size, kv_heads, d), float("nan"), dtype=x.dtype
        )
        pages = pages.to(x.device)
        blocks = x.view(batch, kv_heads, per_row, page_size, d).permute(0, 2, 3, 1, 4)
        pages[table.flatten().long().to(x.device)] = blocks.reshape(-1, page_size, kv_heads, d)
        caches.append(pages)
    return caches[0], caches[1], table.to(k.device)


def _judge_rows(variant, q, k, v, lengths, o, lse, sinks=None):
    """Each batch row against the float64 reference on its valid keys, its
    queries at positions length - Nq + i."""
    for b, n in enumerate(lengths):
        qb, kb, vb = q[b : b + 1], k[b : b + 1, :, :n], v[b : b + 1, :, :n]
        offsets = (n - q.shape[2], 0)
        ref = dict(offsets=offsets, sinks=sinks)
        ref_o, ref_lse = attention_ref(
            variant, qb.double(), kb.double(), vb.double(), **dict(ref, sinks=None if sinks is None else sinks.double())
        )  # fmt: skip
        ordinary = attention_ref(variant, qb, kb, vb, dtype=q.dtype, **ref)
        s_max = max_visible_score(variant, qb, kb, None) if n else 0.0
        v_max = vb.abs().max().item() if n else 0.0
        for got, want, side, what, noise in (
            (o[b : b + 1], ref_o, ordinary[0], "o", s_max * v_max),
            (lse[b : b + 1], ref_lse, ordinary[1], "lse", s_max),
        ):
            check = tolerance(
                got.cpu(), want.cpu(), side.cpu(), q.dtype, what=what, score_noise=noise
            )  # fmt: skip
            assert check.ok, (b, n, what, check)
        empty = torch.isinf(ref_lse[0])
        assert torch.equal(torch.isinf(lse[b].cpu()), empty.cpu()), (b, n)
        assert not o[b][empty].any() and not torch.isnan(o[b]).any(), (b, n)


@pytest.mark.kernels
@pytest.mark.parametrize("dtype", [ir.DType.FP32, ir.DType.FP16], ids=lambda d: d.value)
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: " ".join([s[0], s[1] or "", *s[2].values()]))
def test_cache_calls_match_the_reference_on_each_rows_keys(spec, dtype):
    mask, score, settings = spec
    variant = make_variant(mask, score, dtype=dtype, head_dim=HEAD_DIM, **settings)
    module = build(variant)
    # Lengths 0, 1, below Nq, inside a tile, across tiles and splits, full.
    lengths = [0, 1, 2, 31, 70, 128]
    q, k, v = _tensors(len(lengths), 4, 2, 3, 128, module.DTYPE)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    for b, n in enumerate(lengths):  # what lies past a row's length is never read
        k[b, :, n:], v[b, :, n:] = float("nan"), float("nan")
    o, lse = module.attention(q, k, v, cache_seqlens=seqlens, return_lse=True)
    _judge_rows(variant, q, k, v, lengths, o, lse)
    # Pages of the contiguous cache's key tile (32 on the interpreter, 64 for
    # 16-bit heads on a GPU): the same tiles and splits, the same bits (any
    # page size gives them: test_paged_caches_of_any_page_size_and_order).
    k_pages, v_pages, table = _paged(k, v, module._decode_plan(q, k, 128)[1])
    paged = module.attention(
        q, k_pages, v_pages, cache_seqlens=seqlens, block_table=table, return_lse=True
    )
    assert all(torch.equal(a, b) for a, b in zip((o, lse), paged))


@pytest.mark.kernels
@pytest.mark.parametrize("page_size", [16, 32, 64])
def test_paged_caches_of_any_page_size_and_order(page_size):
    variant = make_variant("causal & window(40)", dtype=ir.DType.FP16, head_dim=HEAD_DIM)
    module = build(variant)
    lengths = [129, 0, 64, 17]
    q, k, v = _tensors(4, 2, 1, 2, 192, torch.float16, seed=page_size)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    k_pages, v_pages, table = _paged(k, v, page_size, seed=page_size)
    o, lse = module.attention(
        q, k_pages, v_pages, cache_seqlens=seqlens, block_table=table, return_lse=True
    )  # fmt: skip
    _judge_rows(variant, q, k, v, lengths, o, lse)
    # Each key row reads its own page, so a tile (32 keys on the interpreter)
    # spans pages of 16 and the plan is the contiguous cache's: the same bits.
    contiguous = module.attention(q, k, v, cache_seqlens=seqlens, return_lse=True)
    assert all(torch.equal(a, b) for a, b in zip((o, lse), contiguous))
    # forward() takes the same call; a table longer than the lengths need is fine.
    wide = torch.cat([table, table[:, :1]], dim=1)
    o2, lse2 = module.forward(q, k_pages, v_pages, cache_seqlens=seqlens, block_table=wide)
    _judge_rows(variant, q, k, v, lengths, o2, lse2)


@pytest.mark.kernels
def test_paged_caches_under_wide_row_tiles():
    """Tiles of more than 16 rows load one page per key tile: pages of 16
    narrow the interpreter's 32-key tile to 16 (`_page_block`)."""
    variant = make_variant("causal & window(40)", dtype=ir.DType.FP16, head_dim=HEAD_DIM)
    module = build(variant)
    lengths = [129, 0, 64, 17]
    q, k, v = _tensors(4, 8, 1, 3, 192, torch.float16, seed=7)  # 24 rows: a 32-row tile
    assert module._decode_plan(q, k, 192, 16)[:2] == (32, 16)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    k_pages, v_pages, table = _paged(k, v, 16, seed=7)
    o, lse = module.attention(
        q, k_pages, v_pages, cache_seqlens=seqlens, block_table=table, return_lse=True
    )  # fmt: skip
    _judge_rows(variant, q, k, v, lengths, o, lse)


@pytest.mark.kernels
def test_sinks_and_groups_of_more_than_one_tile_of_rows():
    # 8 query heads per KV head x 9 rows = 72 rows: two row tiles of 36.
    variant = make_variant("causal", dtype=ir.DType.FP32, head_dim=HEAD_DIM)
    module = build(variant)
    lengths = [40, 5]
    q, k, v = _tensors(2, 8, 1, 9, 64, torch.float32, seed=3)
    sinks = torch.randn(8, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    assert module._decode_plan(q, k, 64)[:3] == (64, 32, 2)
    o, lse = module.attention(q, k, v, cache_seqlens=seqlens, sinks=sinks, return_lse=True)
    _judge_rows(variant, q, k, v, lengths, o, lse, sinks=sinks)


@pytest.mark.kernels
def test_a_caller_workspace_gives_the_same_bits():
    variant = make_variant("causal", dtype=ir.DType.FP16, head_dim=HEAD_DIM)
    module = build(variant)
    capacity = 256 if DEVICE == "cpu" else 8192  # several splits on 2 or 132 SMs
    q, k, v = _tensors(1, 4, 1, 1, capacity, torch.float16, seed=5)
    k_pages, v_pages, table = _paged(k, v, 64)
    seqlens = torch.tensor([capacity - 56], dtype=torch.int32, device=DEVICE)
    call = dict(cache_seqlens=seqlens, block_table=table, return_lse=True)
    workspace = module.cache_workspace(q, k_pages, table)
    splits = module._decode_plan(q, k_pages.transpose(1, 2), capacity)[3]
    assert splits > 1 and workspace.numel() == splits * 4 * (HEAD_DIM + 1)
    results = [
        module.attention(q, k_pages, v_pages, **call, workspace=w) for w in (None, workspace)
    ]
    assert all(torch.equal(a, b) for a, b in zip(*results))
    with pytest.raises(ValueError, match="workspace"):
        module.attention(q, k_pages, v_pages, **call, workspace=workspace[:-1])


def _bad_calls(module, q, k, v, seqlens, table, k_pages, v_pages):
    """(what is wrong, call, exception, the message's words)."""
    int64 = seqlens.long()
    return [
        ("lengths int64", lambda: module.attention(q, k, v, cache_seqlens=int64), TypeError, "cache_seqlens"),
        ("lengths (1,)", lambda: module.attention(q, k, v, cache_seqlens=seqlens[:1]), ValueError, "cache_seqlens"),
        ("length > capacity", lambda: module.attention(q, k, v, cache_seqlens=seqlens + 100), ValueError, "cache_seqlens"),
        ("length < 0", lambda: module.attention(q, k, v, cache_seqlens=seqlens - 100), ValueError, "cache_seqlens"),
        ("table int64", lambda: module.attention(q, k_pages, v_pages, cache_seqlens=seqlens, block_table=table.long()), TypeError, "block_table"),
        ("table strides", lambda: module.attention(q, k_pages, v_pages, cache_seqlens=seqlens, block_table=table.t().contiguous().t()), ValueError, "block_table"),
        ("table rows", lambda: module.attention(q, k_pages, v_pages, cache_seqlens=seqlens, block_table=table[:1]), ValueError, "block_table"),
        ("page out of range", lambda: module.attention(q, k_pages, v_pages, cache_seqlens=seqlens, block_table=table + 100), ValueError, "block_table"),
        ("negative page", lambda: module.attention(q, k_pages, v_pages, cache_seqlens=seqlens, block_table=table - 100), ValueError, "block_table"),
        ("table alone", lambda: module.attention(q, k_pages, v_pages, block_table=table), TypeError, "cache_seqlens"),
        ("k dtype", lambda: module.attention(q, k.half(), v, cache_seqlens=seqlens), TypeError, "k "),
        ("k head_dim", lambda: module.attention(q, k[..., :8], v[..., :8], cache_seqlens=seqlens), ValueError, "k "),
        ("k batch", lambda: module.attention(q, k[:1], v[:1], cache_seqlens=seqlens), ValueError, "batch"),
        ("k, v shapes", lambda: module.attention(q, k, v[:, :, :32], cache_seqlens=seqlens), ValueError, "same shape"),
        ("page size 8", lambda: module.attention(q, k_pages[:, :8], v_pages[:, :8], cache_seqlens=seqlens, block_table=table), ValueError, "page size"),
        ("heads", lambda: module.attention(q[:, :3], k, v, cache_seqlens=seqlens), ValueError, "heads"),
        ("offsets", lambda: module.attention(q, k, v, cache_seqlens=seqlens, q_offset=1), ValueError, "q_offset"),
        ("padding", lambda: module.attention(q, k, v, cache_seqlens=seqlens, seqlens_k=seqlens), ValueError, "seqlens_k"),
        ("launch config", lambda: module.forward(q, k, v, cache_seqlens=seqlens, block_n=32), ValueError, "block_n"),
        ("grad", lambda: module.attention(q.clone().requires_grad_(), k, v, cache_seqlens=seqlens), ValueError, "q requires grad"),
    ]  # fmt: skip


@pytest.mark.kernels
def test_bad_cache_calls_name_the_argument():
    module = build(make_variant("causal", dtype=ir.DType.FP32, head_dim=HEAD_DIM))
    q, k, v = _tensors(2, 4, 2, 1, 64, torch.float32)
    seqlens = torch.tensor([64, 10], dtype=torch.int32, device=DEVICE)
    k_pages, v_pages, table = _paged(k, v, 16)
    for what, call, error, words in _bad_calls(module, q, k, v, seqlens, table, k_pages, v_pages):
        with pytest.raises(error, match=words):
            call()
    # Unused entries of the table may hold anything; under no_grad tensors
    # that require grad are fine.
    table[1, 1:] = -1
    module.attention(q, k_pages, v_pages, cache_seqlens=seqlens, block_table=table)
    with torch.no_grad():
        module.attention(q.requires_grad_(), k, v, cache_seqlens=seqlens)
    # The value checks are off when asked (the caller vouches for the values).
    module.attention(q.detach(), k, v, cache_seqlens=seqlens - 100, check_values=False)


def test_specs_that_read_inputs_take_no_cache_calls():
    from flashgen.check import check
    from flashgen.parse import parse

    text = "attention t { head_dim = 16; dtype = fp32; bias: fp32[H, 16]; mask = causal; "
    spec, _ = parse(text + "score = s + bias[h, min(q - k, 15)] }")
    (variant,), diagnostics = check([spec])
    assert not diagnostics
    module = build(variant)
    q = torch.zeros(1, 2, 1, HEAD_DIM)
    seqlens = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="declared inputs"):
        module.attention(q, q, q, cache_seqlens=seqlens, bias=torch.zeros(2, 16))


class _Synchronized(Exception):
    pass


def test_the_cache_path_never_synchronizes_the_host(monkeypatch):
    """With check_values=False, or while a CUDA graph is being captured, the
    host path reads no tensor's value: every Tensor method that would copy
    one to the host raises, and the launches are recorded, not run."""
    module = build(make_variant("causal & window(20)", "s + alibi", head_dim=HEAD_DIM))
    q, k, v = _tensors(2, 4, 2, 2, 64, torch.float32)
    k_pages, v_pages, table = _paged(k, v, 16)
    seqlens = torch.tensor([64, 10], dtype=torch.int32, device=DEVICE)
    sinks = torch.zeros(4, device=DEVICE)
    module.attention(q, k, v, cache_seqlens=seqlens, sinks=sinks)  # alibi slopes cached
    launches = []
    monkeypatch.setattr(module, "_launch", lambda kernel, grid, *a, **kw: launches.append(grid))

    def refuse(*args, **kwargs):
        raise _Synchronized

    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    for capturing, check_values in ((False, False), (True, None)):
        monkeypatch.setattr(module, "_capturing", lambda x, c=capturing: c)
        module.attention(q, k, v, cache_seqlens=seqlens, sinks=sinks, check_values=check_values)
        module.forward(
            q, k_pages, v_pages, cache_seqlens=seqlens, block_table=table, check_values=check_values
        )  # fmt: skip
    assert len(launches) == 8  # each call: the split kernel and the merge
    monkeypatch.setattr(module, "_capturing", lambda x: False)
    with pytest.raises(_Synchronized):  # the guard is real: the value checks read the host
        module.attention(q, k, v, cache_seqlens=seqlens)


def test_decode_plans_follow_shapes():
    device = torch.device("cpu")
    q, k = torch.empty(2, 32, 4, 8), torch.empty(2, 8, 100, 8)
    # Tiles of up to 16 rows keep their key tile whatever the page size (a page
    # per key row); wider ones narrow it to a power of two that divides the page.
    assert runtime._page_block(16, 64, 16) == 64 and runtime._page_block(48, 32, 16) == 32
    assert runtime._page_block(16, 64, 32) == 16 and runtime._page_block(48, 64, 64) == 16
    assert runtime._page_block(256, 64, 64) == 64
    assert runtime._paged_stages(4, 16) == 7 and runtime._paged_stages(2, 64) == 2
    pages = torch.empty(10, 16, 8, 8)
    view, capacity, page_size = runtime._cache_view(pages, torch.zeros(2, 5, dtype=torch.int32))
    assert view.shape == (10, 8, 16, 8) and (capacity, page_size) == (80, 16)
    assert runtime._capturing(q) is False and device.type == "cpu"
    assert runtime._cdiv(runtime._decode_rows(q, k), runtime.DECODE_MAX_ROWS) == 1
    assert runtime._decode_rows(torch.empty(1, 64, 3, 8), torch.empty(1, 1, 5, 8)) == 192


@pytest.mark.gpu
def test_a_captured_decode_step_replays_with_new_lengths_and_pages():
    """One decode step captured in a CUDA graph, replayed with new lengths
    and a new block table copied into its inputs, equals an eager call; the
    captured call synchronizes nothing (sync debug mode "error")."""
    variant = make_variant("causal", dtype=ir.DType.FP16, head_dim=64)
    module = build(variant)
    batch, heads, kv_heads, capacity, page_size = 4, 8, 2, 1024, 64
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch, heads, 1, 64, generator=g).cuda().half()
    k, v = (torch.randn(batch, kv_heads, capacity, 64, generator=g).cuda().half() for _ in range(2))
    k_pages, v_pages, table = _paged(k, v, page_size)
    seqlens = torch.tensor([1024, 1, 500, 0], dtype=torch.int32, device="cuda")
    call = dict(cache_seqlens=seqlens, block_table=table, check_values=False)
    workspace = module.cache_workspace(q, k_pages, table)
    module.attention(q, k, v, cache_seqlens=seqlens)  # compiles the contiguous case
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # eager calls, the values unchecked: no sync
    try:
        module.attention(q, k, v, cache_seqlens=seqlens, check_values=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        module.attention(q, k_pages, v_pages, **call, workspace=workspace)  # warm up: compile
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.cuda.set_sync_debug_mode("error")  # inside: the capture's own set-up synchronizes
        try:
            o, lse = module.attention(
                q, k_pages, v_pages, **call, workspace=workspace, return_lse=True
            )
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for new_lengths, seed in (([3, 1024, 0, 700], 1), ([64, 65, 1, 1000], 2)):
        seqlens.copy_(torch.tensor(new_lengths, dtype=torch.int32))
        order = torch.randperm(table.numel(), generator=torch.Generator().manual_seed(seed))
        new_table = table.flatten()[order.cuda()].view_as(table)
        k_new, v_new = k_pages.clone(), v_pages.clone()
        k_new[new_table.flatten().long()] = k_pages[table.flatten().long()]
        v_new[new_table.flatten().long()] = v_pages[table.flatten().long()]
        k_pages.copy_(k_new)
        v_pages.copy_(v_new)
        table.copy_(new_table)
        graph.replay()
        torch.cuda.synchronize()
        eager = module.attention(
            q, k_pages, v_pages, cache_seqlens=seqlens, block_table=table, return_lse=True
        )
        assert torch.equal(o, eager[0]) and torch.equal(lse, eager[1]), new_lengths
        _judge_rows(variant, q, k, v, new_lengths, o, lse)


@pytest.mark.kernels
@pytest.mark.parametrize("v_dim", [32, 16])
def test_caches_whose_values_have_their_own_head_dim(v_dim):
    # v_head_dim (decision 055): a v cache narrower or wider than k's, and a v
    # cache that is a view of k's first columns (MLA's latent, read once).
    variant = make_variant("causal", dtype=ir.DType.FP32, head_dim=24, v_head_dim=v_dim)
    module = build(variant)
    lengths = [70, 0, 33]
    g = torch.Generator().manual_seed(v_dim)
    q = torch.randn(3, 4, 2, 24, generator=g).to(DEVICE)
    k = torch.randn(3, 2, 96, 24, generator=g).to(DEVICE)
    v = torch.randn(3, 2, 96, v_dim, generator=g).to(DEVICE)
    if v_dim < 24:
        v = k[..., :v_dim]
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    o, lse = module.attention(q, k, v, cache_seqlens=seqlens, return_lse=True)
    assert o.shape == (3, 4, 2, v_dim)
    _judge_rows(variant, q, k, v, lengths, o, lse)
    k_pages, v_pages, table = _paged(k.contiguous(), v.contiguous(), 32)
    paged = module.attention(
        q, k_pages, v_pages, cache_seqlens=seqlens, block_table=table, return_lse=True
    )
    _judge_rows(variant, q, k, v, lengths, *paged)
    with pytest.raises(ValueError, match="v_head_dim"):  # v with k's head dim
        module.attention(q, k, k, cache_seqlens=seqlens)


@pytest.mark.kernels
@pytest.mark.parametrize("page_size", [0, 16])
def test_new_keys_are_appended_and_attended_in_the_same_call(page_size):
    """k_new and v_new (flash_attn_with_kvcache's k= and v=): written at each
    row's cache_seqlens, then attended with the rest, as if the cache had
    held them: the same bits as the call on that cache, and the cache holds
    them after (contiguous and paged); cache_seqlens is left unchanged."""
    variant = make_variant("causal & window(40)", dtype=ir.DType.FP16, head_dim=HEAD_DIM)
    module = build(variant)
    lengths, new = [0, 61, 30, 5], 3
    q, k, v = _tensors(4, 4, 2, new, 128, torch.float16, seed=3)
    k_new, v_new = (
        x[:, :, :new].clone() for x in _tensors(4, 2, 2, new, 128, torch.float16, 4)[1:]
    )
    full_k, full_v = k.clone(), v.clone()
    for b, n in enumerate(lengths):  # the cache as it should be after the append
        full_k[b, :, n : n + new], full_v[b, :, n : n + new] = k_new[b], v_new[b]
    after = torch.tensor([n + new for n in lengths], dtype=torch.int32, device=DEVICE)
    want = module.attention(q, full_k, full_v, cache_seqlens=after, return_lse=True)
    _judge_rows(variant, q, full_k, full_v, [n + new for n in lengths], *want)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    if page_size:
        k_cache, v_cache, table = _paged(k, v, page_size, seed=5)
        full = _paged(full_k, full_v, page_size, seed=5)[:2]
        paging = dict(block_table=table)
    else:
        k_cache, v_cache, full, paging = k, v, (full_k, full_v), {}
    got = module.attention(
        q, k_cache, v_cache, cache_seqlens=seqlens, k_new=k_new, v_new=v_new, return_lse=True,
        **paging,
    )  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    for cache, expected in zip((k_cache, v_cache), full):
        assert torch.equal(cache.nan_to_num(7.0), expected.nan_to_num(7.0))
    assert seqlens.tolist() == lengths


def test_bad_new_keys_name_the_argument():
    module = build(make_variant("causal", dtype=ir.DType.FP32, head_dim=HEAD_DIM))
    q, k, v = _tensors(2, 4, 2, 1, 64, torch.float32)
    seqlens = torch.tensor([63, 10], dtype=torch.int32, device=DEVICE)
    good = torch.zeros(2, 2, 1, HEAD_DIM, device=DEVICE)
    calls = [
        (dict(k_new=good), ValueError, "k_new and v_new come together"),
        (dict(k_new=good, v_new=good.half()), TypeError, "v_new must have dtype torch.float32"),
        (dict(k_new=good[:, :1], v_new=good), ValueError, r"k_new must have shape \(2, 2, 1, 16\) on .*, got \(2, 1, 1, 16\)"),
        (dict(k_new=good, v_new=good[..., :8]), ValueError, r"v_new must have shape \(2, 2, 1, 16\)"),
        (dict(k_new=good, v_new=torch.zeros(2, 2, 2, HEAD_DIM, device=DEVICE)), ValueError,
         r"v_new must have shape \(2, 2, 1, 16\) on .*, got \(2, 2, 2, 16\)"),
        (dict(k_new=good.tolist(), v_new=good), TypeError, "k_new must be a torch.Tensor"),
        (dict(k_new=torch.zeros(2, 2, 2, HEAD_DIM, device=DEVICE), v_new=torch.zeros(2, 2, 2, HEAD_DIM, device=DEVICE)), ValueError,
         r"cache_seqlens must lie in 0 .. 62: with the 2 new keys"),
    ]  # fmt: skip
    for kwargs, error, words in calls:
        with pytest.raises(error, match=words):
            module.attention(q, k, v, cache_seqlens=seqlens, **kwargs)
    with pytest.raises(ValueError, match="k_new and v_new append to a KV cache"):
        module.attention(q, k, v, k_new=good, v_new=good)
    with pytest.raises(ValueError, match="k_new requires grad"):
        module.attention(q, k, v, cache_seqlens=seqlens, k_new=good.requires_grad_(), v_new=good)


@pytest.mark.gpu
@pytest.mark.parametrize("paged", [False, True])
def test_a_captured_step_appends_its_new_keys_on_each_replay(paged):
    """A decode step that appends k_new and v_new, captured in a CUDA graph
    (nothing synchronizes: sync debug mode "error"), replayed step after step
    with the lengths advanced in place: each replay writes its token where
    the lengths say and gives the bits of an eager call on the cache so far."""
    variant = make_variant("causal", dtype=ir.DType.FP16, head_dim=64)
    module = build(variant)
    batch, heads, kv_heads, capacity, page_size = 3, 8, 2, 512, 64
    g = torch.Generator().manual_seed(1)
    q = torch.randn(batch, heads, 1, 64, generator=g).cuda().half()
    k, v = (torch.randn(batch, kv_heads, capacity, 64, generator=g).cuda().half() for _ in range(2))
    if paged:
        k, v, table = _paged(k, v, page_size)
        paging = dict(block_table=table)
    else:
        paging = {}
    k_new, v_new = (torch.zeros(batch, kv_heads, 1, 64, device="cuda").half() for _ in range(2))
    seqlens = torch.tensor([0, 300, 511], dtype=torch.int32, device="cuda")
    call = dict(cache_seqlens=seqlens, k_new=k_new, v_new=v_new, check_values=False, **paging)
    workspace = module.cache_workspace(q, k, paging.get("block_table"))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        module.attention(q, k.clone(), v.clone(), **call, workspace=workspace)  # compile
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.cuda.set_sync_debug_mode("error")
        try:
            o = module.attention(q, k, v, **call, workspace=workspace)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for step in range(2):
        k_new.copy_(torch.randn(k_new.shape, generator=g).half())
        v_new.copy_(torch.randn(v_new.shape, generator=g).half())
        before_k, before_v = k.clone(), v.clone()
        graph.replay()
        torch.cuda.synchronize()
        eager = module.attention(
            q, before_k, before_v, cache_seqlens=seqlens, k_new=k_new, v_new=v_new, **paging
        )
        # The paged pool's spare pages hold NaN: bitwise equality takes NaN as equal to NaN.
        for ours, theirs in ((o, eager), (k, before_k), (v, before_v)):
            torch.testing.assert_close(ours, theirs, rtol=0, atol=0, equal_nan=True)
        seqlens[:2] += 1  # the last row's cache is full: it stays (and its token lands again)
