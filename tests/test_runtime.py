"""flashgen/runtime.py, the host runtime copied into every generated module,
tested as the ordinary module it is: its functions read the module constants
that a generated module defines (here set as one would), and a module built
on a Triton without Gluon still imports and runs its Triton kernels."""

from __future__ import annotations

import builtins
import importlib.util
import itertools
import math
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flashgen import ir, runtime
from flashgen.api import build_source
from flashgen.emit import runtime_sections
from flashgen.verify import check_forward

from kernel_utils import make_variant


@pytest.fixture
def rt(monkeypatch):
    """runtime with the constants of a float16, head_dim 64 module."""
    for name, value in dict(
        DTYPE=torch.float16, HEAD_DIM=64, HEAD_DIM_PAD=64, DEFAULT_SCALE=0.125,
        MAX_SEQ_LEN=1000, MAX_HEADS=32,
    ).items():  # fmt: skip
        monkeypatch.setattr(runtime, name, value)
    return runtime


def _qkv(b=1, h=4, hkv=2, nq=5, nk=7, d=64, dtype=torch.float16):
    return (
        torch.zeros(b, h, nq, d, dtype=dtype),
        torch.zeros(b, hkv, nk, d, dtype=dtype),
        torch.zeros(b, hkv, nk, d, dtype=dtype),
    )


def test_sections_are_the_documented_ones():
    assert list(runtime_sections()) == [
        "common", "sequences", "decode", "alibi", "inputs", "input_grads", "direct_launch",
        "compile_ahead", "gluon", "gluon_varlen", "document_runs",
    ]  # fmt: skip
    for text in runtime_sections().values():
        assert "# flashgen: section" not in text and text == text.strip("\n")


def test_learnable_gradients_are_each_inputs_reads_summed_over_their_slots(rt, monkeypatch):
    # Input 1 (rel, fp16) has two reads: one with a slot per batch row and query tile, one
    # with a slot per head; input 0 is not learnable.
    monkeypatch.setattr(rt, "_LEARNABLE", (1,))
    monkeypatch.setattr(rt, "_LEARNABLE_READS", ((1, True, False, True), (1, False, True, False)))
    inputs = (torch.zeros(3), torch.zeros(4, 8, dtype=torch.float16))
    buffers = rt._grad_buffers(inputs, 2, 4, 5)
    assert [tuple(b.shape) for b in buffers] == [(10, 4, 8), (4, 4, 8)]
    assert all(b.dtype == torch.float32 and not b.any() for b in buffers)
    buffers[0][3, 1, 2] = 1.5
    buffers[0][7, 1, 2] = 2.0
    buffers[1][2, 1, 2] = 0.25
    (grad,) = rt._input_grads(inputs, buffers)
    assert grad.dtype == torch.float16 and grad[1, 2] == 3.75 and grad.count_nonzero() == 1
    (empty,) = rt._input_grads(inputs, None)
    assert empty.shape == (4, 8) and not empty.any()


def test_cdiv():
    assert [runtime._cdiv(a, 4) for a in (0, 1, 4, 5, 8)] == [0, 1, 1, 2, 2]


def test_resolve_scale(rt):
    assert rt._resolve_scale(None) == 0.125
    assert rt._resolve_scale(2) == 2.0 and type(rt._resolve_scale(2)) is float
    with pytest.raises(TypeError, match="scale"):
        rt._resolve_scale(True)
    with pytest.raises(TypeError, match="scale"):
        rt._resolve_scale("0.5")
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="finite and positive"):
            rt._resolve_scale(bad)
    # scale * log2(e) must be a normal float32: 1e300 gave NaN scores once.
    for bad in (1e300, 1e-40):
        with pytest.raises(ValueError, match="normal float32"):
            rt._resolve_scale(bad)
    largest = torch.finfo(torch.float32).max / math.log2(math.e) * (1 - 1e-7)
    assert rt._resolve_scale(largest) == largest


def test_check_inputs_accepts_gqa(rt):
    rt._check_inputs(*_qkv())


@pytest.mark.parametrize(
    "change, error, words",
    [
        (lambda q, k, v: (q.float(), k, v), TypeError, "q has dtype torch.float32"),
        (lambda q, k, v: (q, k.float(), v), TypeError, "k has dtype"),
        (lambda q, k, v: (q[0], k, v), ValueError, "q must have 4 dimensions"),
        (lambda q, k, v: (q, k, v[..., :32]), ValueError, "v has head_dim 32"),
        (lambda q, k, v: (q, k, v[:, :, :3]), ValueError, "k and v must have the same shape"),
        (lambda q, k, v: (q, k[:, :1].expand(1, 3, 7, 64), v[:, :1].expand(1, 3, 7, 64)),
         ValueError, "must divide q's 4 heads"),
        (lambda q, k, v: (q, torch.zeros(2, 2, 7, 64, dtype=torch.float16),
                          torch.zeros(2, 2, 7, 64, dtype=torch.float16)),
         ValueError, "batch size 2"),
        (lambda q, k, v: (q, [k], v), TypeError, "k must be a torch.Tensor"),
    ],
)  # fmt: skip
def test_check_inputs_names_the_argument(rt, change, error, words):
    with pytest.raises(error, match=words):
        rt._check_inputs(*change(*_qkv()))


def test_check_inputs_enforces_the_modules_limits(rt):
    with pytest.raises(ValueError, match="k has sequence length 1001, more than .* MAX_SEQ_LEN"):
        rt._check_inputs(*_qkv(nk=1001))
    with pytest.raises(ValueError, match="q has 64 heads, more than .* MAX_HEADS = 32"):
        rt._check_inputs(*_qkv(h=64))
    rt._check_inputs(*_qkv(nq=1000, nk=1000, h=32))


def test_check_inputs_wants_a_gpu_unless_interpreting(rt, monkeypatch):
    monkeypatch.setattr(rt, "_interpreting", lambda: False)
    with pytest.raises(ValueError, match="q is on cpu: the kernels run on CUDA devices"):
        rt._check_inputs(*_qkv())


def test_check_backward_inputs(rt):
    q, _, _ = _qkv()
    o, lse = torch.zeros_like(q), torch.zeros(1, 4, 5)
    rt._check_backward_inputs(q, o, lse, torch.zeros_like(q), None)
    rt._check_backward_inputs(q, o, lse, None, torch.zeros(1, 4, 5, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"lse must have shape \(1, 4, 5\)"):
        rt._check_backward_inputs(q, o, lse[..., :4], None, None)
    with pytest.raises(TypeError, match="lse has dtype torch.float16, expected torch.float32"):
        rt._check_backward_inputs(q, o, lse.half(), None, None)
    with pytest.raises(TypeError, match="do must be a torch.Tensor"):
        rt._check_backward_inputs(q, o, lse, "do", None)


def test_rows_in_int32(rt, monkeypatch):
    """A (B, N, H, D) buffer seen as (B, H, N, D): its row stride H * D puts
    row 2^19 past 2^31 elements at H * D = 4096.  Meta tensors carry the
    geometry without the memory."""
    monkeypatch.setattr(rt, "HEAD_DIM", 256)
    small = torch.empty(1, 64, 16, 256, device="meta").transpose(1, 2)
    assert rt._rows_in_int32("k", small) is small
    wide = torch.empty(1, 2**19, 16, 256, device="meta").transpose(1, 2)
    copied = rt._rows_in_int32("k", wide)
    assert copied.is_contiguous() and copied.shape == wide.shape
    longest = (2**31 - 1) // 256 - 257
    assert (
        rt._rows_in_int32("k", torch.empty(1, 1, longest, 256, device="meta")).shape[2] == longest
    )
    with pytest.raises(ValueError, match=f"k has {longest + 1} rows of head_dim 256"):
        rt._rows_in_int32("k", torch.empty(1, 1, longest + 1, 256, device="meta"))


def test_check_blocks(rt):
    rt._check_blocks(16, 128)
    for bad in (8, 48, 0):
        with pytest.raises(ValueError, match="block_n must be a power of two >= 16"):
            rt._check_blocks(16, bad)


def test_alibi_slopes_follow_the_papers_rule():
    # 8 heads: 2^-1 ... 2^-8.  6 heads: the 4-head rule (2^-2, 2^-4, 2^-6,
    # 2^-8), then every other slope of the 8-head rule (2^-1, 2^-3).
    assert runtime._alibi_slopes(8, torch.device("cpu")).tolist() == [2.0**-i for i in range(1, 9)]
    expected = [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]
    assert runtime._alibi_slopes(6, torch.device("cpu")).tolist() == expected


def test_specialization_keys_what_triton_compiles_for():
    x = torch.zeros(8, dtype=torch.float16)
    key = runtime._specialization((x, 16, True, 0.5))
    assert key == ((torch.float16, x.data_ptr() % 16), 16, True, None)
    assert runtime._specialization((x[1:],))[0][1] == (x.data_ptr() + 2) % 16


def test_stand_ins_are_made_real_for_triton(monkeypatch):
    class StandIn:
        def descriptor(self):
            return "real"

    args = (1, StandIn(), "x")
    monkeypatch.setattr(runtime, "_STAND_INS", ())
    assert runtime._triton_args(args) is args
    monkeypatch.setattr(runtime, "_STAND_INS", (StandIn,))
    assert runtime._triton_args(args) == (1, "real", "x")


def test_direct_launch_only_on_a_tested_triton():
    import triton

    tested = triton.__version__.startswith(runtime.TESTED_TRITON)
    assert runtime.DIRECT_LAUNCH == (tested and runtime._driver is not None)


def test_gluon_needs_gluon_and_a_hopper_gpu(rt, monkeypatch):
    q, k, v = _qkv(h=2, hkv=2, nq=128, nk=128)
    assert not rt._gluon_fits(128, q, k, v)  # the interpreter (or a CPU tensor)
    monkeypatch.setattr(rt, "GLUON", False)
    monkeypatch.setattr(rt, "_interpreting", lambda: False)
    assert not rt._gluon_fits(128, q, k, v)


def test_a_module_imports_and_runs_on_a_triton_without_gluon(monkeypatch):
    """Every Gluon import of the module fails (as on Triton < 3.5): the module still
    imports, says GLUON = False, and its Triton kernels compute attention."""
    variant = make_variant("causal", dtype=ir.DType.FP16, head_dim=64)
    source = build_source("attention t { head_dim = 64; dtype = fp16; mask = causal }")
    assert "from triton.experimental import gluon" in source
    real_import = builtins.__import__

    def without_gluon(name, *args, **kwargs):  # the module's own imports only
        if name.startswith("triton.experimental"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    module = type(sys)("flashgen_test_no_gluon")
    module.__builtins__ = {**vars(builtins), "__import__": without_gluon}
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(source, "<no gluon>", "exec"), module.__dict__)
    assert module.GLUON is False
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 64, generator=gen).half() for n in (19, 23, 23))
    result = check_forward(variant, module, q, k, v)
    assert result.ok, result


@pytest.mark.parametrize("version", ["3.5.1", "3.9.0"])
def test_the_hopper_kernels_run_only_on_the_triton_they_were_tested_with(
    monkeypatch, tmp_path, version
):
    """Gluon's API changes between releases: a module imported under another
    Triton (that has Gluon) keeps its Gluon kernels off, and its direct
    launches too, and runs its Triton kernels."""
    import triton

    from flashgen import emit

    assert runtime.TESTED_TRITON == emit.TESTED_TRITON
    source = build_source("attention t { head_dim = 128; dtype = fp16; mask = causal }")
    assert "_gluon_attn_fwd" in source
    monkeypatch.setattr(triton, "__version__", version)
    name = f"flashgen_test_triton_{version.replace('.', '_')}"
    path = tmp_path / f"{name}.py"  # Triton reads the kernels' source from their file
    path.write_text(source)
    loader = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(loader)
    monkeypatch.setitem(sys.modules, name, module)
    loader.loader.exec_module(module)
    assert module.GLUON is False
    assert module.DIRECT_LAUNCH is False
    assert not module._gluon_fits(128, *(torch.zeros(1, 1, 128, 128).half(),) * 3)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.lists(st.integers(1, 300), min_size=1, max_size=6), min_size=1, max_size=3),
    heads=st.sampled_from([(1, 1), (4, 2), (3, 3)]),
    shuffle=st.booleans(),
)
def test_packed_documents_become_runs_at_their_rows_of_the_dense_views(rows, heads, shuffle):
    """`_runs_of` (decisions 109-110): a tile of the runs' table addresses, for
    every head, the very rows of the dense (B, H, N, D) q and k that hold its
    run's tokens (the kernels add head * N to the table's rows), one tile per
    128 tokens of every run, and the statistics as `_gluon_tiles` pads them.
    The ids need not increase, only be distinct along a row."""
    n = max(sum(r) for r in rows)
    rows = [r[:-1] + [r[-1] + n - sum(r)] for r in rows]  # every row n tokens
    num_heads, kv_heads = heads
    generator = torch.Generator().manual_seed(len(rows) * n)
    doc = torch.empty(len(rows), n, dtype=torch.int32)
    for b, lengths in enumerate(rows):
        ids = torch.randperm(64, generator=generator)[: len(lengths)] if shuffle else range(len(lengths))  # fmt: skip
        doc[b] = torch.cat([torch.full((m,), int(i)) for m, i in zip(lengths, ids)])
    q = torch.arange(len(rows) * num_heads * n).reshape(len(rows), num_heads, n, 1)
    k = torch.arange(len(rows) * kv_heads * n).reshape(len(rows), kv_heads, n, 1)
    runs = runtime._runs_of(doc, q, k, 128)
    assert runs is not None
    count = sum(len(r) for r in rows)
    assert runs.backward == (len(rows) * n >= 128 * count)
    if count > -(-len(rows) * n // 128):  # more runs than the tables hold: not taken
        return
    seen = []
    assert runs.tiles[runs.ctas :, 2].eq(0).all()  # rows of length 0 after the tiles
    # rows of tokens: the same tiles in the same order, at row b * N + p of (B * N, H * D)
    for token, dense in zip(runs.token_tiles.tolist(), runs.tiles.tolist()):
        b = dense[0] // (num_heads * n)
        assert token[2:] == dense[2:] and token[0] == token[1] == dense[0] - b * (num_heads - 1) * n
    for q_row, k_row, length, start, stat in runs.tiles[: runs.ctas].tolist():
        assert start % 128 == 0 and 0 <= start < length and stat % 128 == 0
        for h in range(num_heads):
            rows_q = q.flatten()[q_row + h * n + start : q_row + h * n + min(start + 128, length)]
            rows_k = k.flatten()[k_row + h // (num_heads // kv_heads) * n + start :][: len(rows_q)]
            b, p = divmod(int(rows_q[0]), num_heads * n)
            first = p % n
            assert rows_q.tolist() == q[b, h, first : first + len(rows_q), 0].tolist()
            assert rows_k.tolist() == k[b, h // (num_heads // kv_heads), first : first + len(rows_q), 0].tolist()  # fmt: skip
            assert (doc[b, first : first + len(rows_q)] == doc[b, first]).all()
            if h == 0:
                seen.append((b, first - start, length))
    runs_found = sorted(set(seen))
    assert [m for _, _, m in runs_found] == [m for b in range(len(rows)) for m in rows[b]]
    assert runs.stat_rows == sum(-(-m // 128) * 128 for r in rows for m in r)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.lists(st.tuples(st.integers(1, 400), st.integers(0, 5)), min_size=1, max_size=8),
        min_size=1,
        max_size=3,
    ),
    forward_rows=st.sampled_from([1, 128, 300]),
)
def test_runs_are_taken_exactly_where_each_id_forms_one_run(rows, forward_rows):
    """`_runs_of`'s answer (decision 110) against a count made here: the runs
    are taken where no id comes back within a batch row (ids from a small
    range, so that they do), there are at most one run per 128 tokens, and
    the runs average 128 tokens (the backward) or `forward_rows` (the
    forward); `ctas` is then one tile per 128 tokens of every run."""
    n = max(sum(m for m, _ in r) for r in rows)
    doc = torch.full((len(rows), n), -1, dtype=torch.int32)
    runs, distinct = [], True
    for b, pieces in enumerate(rows):
        p = 0
        for m, i in pieces + [(n - sum(m for m, _ in pieces), 6)]:
            doc[b, p : p + m] = i
            p += m
        row = [i for i, _ in itertools.groupby(doc[b].tolist())]
        lengths = [len(list(g)) for _, g in itertools.groupby(doc[b].tolist())]
        distinct &= len(set(row)) == len(row)
        runs += lengths
    q = torch.zeros(len(rows), 2, n, 1)
    found = runtime._runs_of(doc, q, q, forward_rows)
    tokens = len(rows) * n
    taken = distinct and len(runs) <= -(-tokens // 128)
    assert found.backward == (taken and tokens >= 128 * len(runs))
    assert found.forward == (taken and tokens >= forward_rows * len(runs))
    if taken:
        assert found.ctas == sum(-(-m // 128) for m in runs)


def test_ids_that_come_back_in_a_row_are_not_runs():
    """An id that comes back later in a row joins two runs under the mask
    doc[b, q] == doc[b, k]: the runs are not taken (the module's own kernels
    run), nor where there are more runs than one per 128 tokens; no runs for
    shapes they cannot take (Nq != Nk, ids of another length)."""
    q = torch.zeros(2, 2, 512, 1)
    ids = torch.tensor([[0, 1, 2, 3], [5, 6, 5, 7]], dtype=torch.int32)
    doc = ids.repeat_interleave(128, dim=1)
    assert not runtime._runs_of(doc, q, q, 128).backward
    taken = runtime._runs_of(doc[:1], q[:1], q[:1], 128)
    assert taken.backward and taken.forward and taken.ctas == 4
    for ids in (doc[:1].long(), doc.t().contiguous().t()[:1]):  # int64, strided
        other = runtime._runs_of(ids, q[:1], q[:1], 128)
        assert other.backward and torch.equal(other.tiles, taken.tiles)
    assert not runtime._runs_of(doc[:1], q[:1], q[:1], 129).forward  # runs shorter than asked
    assert runtime._runs_of(doc[1:], q[:1], q[:1], 128).ctas == 4  # the tiles are there, not taken
    short = doc[:1].clone()
    short[0, 0] = 9  # five runs in 512 tokens: more than the tables hold
    assert not runtime._runs_of(short, q[:1], q[:1], 1).backward
    # many runs: blocks of tokens and of pairs of runs past the first
    many = torch.randperm(1000, generator=torch.Generator().manual_seed(0))[:150].int()
    doc = many.repeat_interleave(128).reshape(2, 75 * 128)
    q = torch.zeros(2, 1, 75 * 128, 1)
    assert runtime._runs_of(doc, q, q, 128).backward
    doc[1, -128:] = doc[1, 128]  # the second row's last id is its second's
    runs = runtime._runs_of(doc, q, q, 128)
    assert not runs.backward and runs.ctas == 150
    assert runtime._runs_of(doc[:1], q[:1], q[:1, :, :4], 128) is None
    assert runtime._runs_of(doc[:1, :4], q[:1], q[:1], 128) is None
    # not on the CPU: the Gluon kernels run on sm90 only
    assert runtime._documents_as_runs(doc[:1], q[:1], q[:1], 128) is None


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 600), min_size=1, max_size=12))
def test_varlen_tiles_cover_every_row_once_and_pad_the_statistics_apart(lengths):
    """`_gluon_tiles` (decisions 103-104): one tile per 128 rows of every
    sequence, each sequence's tiles together, the longest sequences first and
    each one's tiles furthest in first; first rows of q and k where
    cu_seqlens puts them; and statistics rows that give each sequence a
    range of its own, from a multiple of 128, as long as its tiles cover
    (`_gluon_stat_rows` in all)."""
    rt = runtime
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
    q = torch.zeros(int(cu[-1]), 4, 64, dtype=torch.float16)
    seqs = rt.sequences(cu_seqlens_q=cu, cu_seqlens_k=cu).bind(q, q[:, :2])
    tiles = rt._gluon_tiles(seqs, q.shape[0], q.shape[0]).tolist()
    stats = {}
    for q_row, k_row, n, start, stat in tiles:
        assert q_row == k_row and start % 128 == 0 and 0 <= start < n and stat % 128 == 0
        stats.setdefault((q_row, n), []).append((start, stat))
    # every non-empty sequence, once, with its tiles
    assert sorted(n for _, n in stats) == sorted(n for n in lengths if n)
    for (q_row, n), found in stats.items():
        assert [start for start, _ in found] == list(range((n - 1) // 128 * 128, -1, -128))
        assert len({stat for _, stat in found}) == 1
    assert [n for _, _, n, _, _ in tiles] == sorted((n for _, _, n, _, _ in tiles), reverse=True)
    # statistics: disjoint ranges of 128-row blocks, within _gluon_stat_rows
    ranges = sorted((found[0][1], -(-n // 128) * 128) for (_, n), found in stats.items())
    for (a, size), (b, _) in zip(ranges, ranges[1:]):
        assert a + size <= b
    made = rt._gluon_tiles(seqs, q.shape[0], q.shape[0])
    assert not ranges or ranges[-1][0] + ranges[-1][1] <= rt._gluon_stat_rows(seqs, made)
    assert rt._gluon_stat_rows(seqs, made) == sum(-(-n // 128) * 128 for n in lengths)
    # Made on the GPU (decision 107): the same rows, then rows of length 0
    # whose statistics are the spare rows past every sequence's.
    device = rt._gluon_device_tiles(seqs[0], q.shape[0])
    size = -(-q.shape[0] // 128) + len(lengths)
    assert device.tolist() == tiles + [[0, 0, 0, 0, 128 * size]] * (size - len(tiles))
    assert rt._gluon_stat_rows(seqs, device) == 128 * (size + 1)


@settings(max_examples=40, deadline=None)
@given(
    cu=st.lists(st.integers(-50, 500), min_size=1, max_size=300),
    rows=st.integers(0, 400),
    most=st.integers(0, 300),
    wide=st.booleans(),
)
def test_the_bound_varlen_table_clamps_any_lengths_a_capture_may_hold(cu, rows, most, wide):
    """`_bind_varlen` (one launch for `Sequences.bind`'s table): for
    cu_seqlens made while capturing (nothing checked: negative, decreasing,
    past the rows; int32 or int64; more sequences than a program's 128) each
    first row is clamped to [0, rows] and each length to [0, most], the
    end clamped to the rows first."""
    cu_q = torch.tensor(cu, dtype=torch.int64 if wide else torch.int32)
    cu_k = cu_q.flip(0)
    table = torch.empty((len(cu) - 1, 4), dtype=torch.int32)
    if len(cu) > 1:
        runtime._launch(
            runtime._bind_varlen, (-(-(len(cu) - 1) // 128),),
            cu_q, cu_k, table, len(cu) - 1, rows, rows + 7, most, most + 3, 128,
        )  # fmt: skip
    expected = []
    for i in range(len(cu) - 1):
        row = []
        for c, n, m in ((cu_q.tolist(), rows, most), (cu_k.tolist(), rows + 7, most + 3)):
            first, end = (min(max(x, 0), n) for x in (c[i], c[i + 1]))
            row += [first, min(max(end - first, 0), m)]
        expected.append(row)
    assert table.tolist() == expected


def test_varlen_tiles_made_on_the_gpu_over_many_sequences_match_the_host_table():
    """`_gluon_tiles_kernel` counts the sequences ahead of each one over the
    whole table in blocks of `_TILES_BLOCK`, in programs of that many: 150
    sequences (lengths 0-300, ties among them) give the host's table row for
    row, then the spare rows."""
    rng = torch.Generator().manual_seed(0)
    lengths = torch.randint(0, 300, (150,), generator=rng).tolist()
    lengths[7] = lengths[100] = lengths[149] = 256  # ties keep the table's order
    assert len(lengths) > 2 * runtime._TILES_BLOCK
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
    q = torch.zeros(int(cu[-1]), 1, 64, dtype=torch.float16)
    seqs = runtime.sequences(cu_seqlens_q=cu, cu_seqlens_k=cu).bind(q, q)
    tiles = runtime._gluon_tiles(seqs, q.shape[0], q.shape[0]).tolist()
    device = runtime._gluon_device_tiles(seqs[0], q.shape[0]).tolist()
    size = -(-q.shape[0] // 128) + len(lengths)
    assert device == tiles + [[0, 0, 0, 0, 128 * size]] * (size - len(tiles))


@settings(max_examples=100, deadline=None)
@given(
    rows=st.integers(1, 700),
    spans=st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=10),
)
def test_varlen_tiles_made_on_the_gpu_stay_in_bounds_for_any_lengths(rows, spans):
    """`_gluon_device_tiles` (decision 107) on any table a capture can bind
    (sequences that overlap or reach past the rows: a capture checks no
    lengths): every row reads q and k rows inside `rows`, and its
    sequence's statistics (which its dQ CTA writes and its dK/dV CTA reads)
    lie inside the bound (128 times its rows); a row of length 0 writes the
    128 spare rows after it.  Five overlapping sequences of 400 rows: two
    fit, the third's tile is dropped."""
    table = []
    for a, b in spans:
        first = int(a * rows)
        length = int(b * (rows - first))
        table.append([first, length, first, length])
    device = runtime._gluon_device_tiles(torch.tensor(table, dtype=torch.int32), rows)
    size = device.shape[0]
    assert size == -(-rows // 128) + len(table)
    for q_row, k_row, n, start, stat in device.tolist():
        if n == 0:
            assert [q_row, k_row, start, stat] == [0, 0, 0, 128 * size]
            continue
        assert q_row == k_row and q_row + n <= rows and 0 <= start < n and start % 128 == 0
        assert 0 <= stat and stat + -(-n // 128) * 128 <= 128 * size  # the dK/dV kernel's reads
    overlapping = torch.tensor([[0, 400, 0, 400]] * 5, dtype=torch.int32)
    device = runtime._gluon_device_tiles(overlapping, 400).tolist()
    assert [n for _, _, n, _, _ in device] == [400] * 8 + [0]
    assert [stat for *_, stat in device] == [0] * 4 + [512] * 4 + [128 * 9]
