"""The GPU scripts' inputs, checked where they are cheap to check: on the CPU.

scripts/host_stub.py runs a module's host code as on an sm90 GPU with stub
kernels: here, that the paths it takes are the ones the module takes there.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))


def test_host_stub_runs_the_gluon_paths():
    """scripts/host_stub.py times a module's Python as on an sm90 GPU: the
    Gluon forward and backward are the paths it takes, through `_launch`."""
    import host_stub
    import torch

    path = os.path.join(os.path.dirname(__file__), "..", "generated", "full.py")
    module = host_stub.load(path)
    taken = []
    for name in ("_gluon_forward", "_gluon_backward", "_launch"):
        fn = getattr(module, name)
        setattr(module, name, lambda *a, fn=fn, name=name, **k: taken.append(name) or fn(*a, **k))
    q, k, v, do = (torch.randn(1, 2, 128, 128, dtype=module.DTYPE) for _ in range(4))
    o, lse = module._forward(q, k, v, 0.1)
    module._backward(q, k, v, o, lse, do, None, 0.1)
    assert taken == ["_gluon_forward", "_launch", "_gluon_backward", "_launch", "_launch"]


def test_host_stub_gluon_paths_at_lengths_of_no_multiple_of_128():
    """Decision 100: N = 200 takes the Gluon forward and backward, on grids of
    cdiv(N, 128) CTAs; N = 100 (shorter than a CTA's rows) the Triton kernels."""
    import host_stub
    import torch

    path = os.path.join(os.path.dirname(__file__), "..", "generated", "plain_causal.py")
    module = host_stub.load(path)
    taken = []
    for name in ("_gluon_forward", "_gluon_backward"):
        fn = getattr(module, name)
        setattr(module, name, lambda *a, fn=fn, name=name, **k: taken.append(name) or fn(*a, **k))
    launch = module._launch
    module._launch = lambda kernel, grid, *a, **k: taken.append(grid) or launch(
        kernel, grid, *a, **k
    )
    for n in (200, 100):
        taken.clear()
        q, k, v, do = (torch.randn(2, 4, n, 128, dtype=module.DTYPE) for _ in range(4))
        o, lse = module._forward(q, k, v, 0.1)
        module._backward(q, k, v, o, lse, do, None, 0.1)
        if n == 200:
            assert taken == ["_gluon_forward", (2, 8), "_gluon_backward", (2, 8), (2, 8)]
        else:
            assert "_gluon_forward" not in taken and "_gluon_backward" not in taken
            assert taken and all(isinstance(grid, tuple) for grid in taken)


def test_host_stub_varlen_calls_take_the_gluon_forward(tmp_path):
    """Under the knob gluon_varlen (decision 102), a varlen call whose
    sequences have as many queries as keys takes the Gluon forward on a grid
    of (the call's 128-row tiles, heads): sequence by sequence, the longest
    first, each one's tiles furthest into it first (decision 103); one whose sequences differ, or average fewer than 128
    tokens, takes the Triton forward, as every varlen call does without it."""
    import host_stub
    import torch

    from flashgen.api import _check_specs
    from flashgen.emit import render_module

    spec = os.path.join(os.path.dirname(__file__), "..", "examples", "plain_causal.attn")
    (variant,) = _check_specs(pathlib.Path(spec))
    path = tmp_path / "plain_causal.py"
    knobs = {"gluon_varlen": True, "gluon_varlen_captured": False}  # decision 107: the next test
    path.write_text(render_module(variant, None, knobs))
    module = host_stub.load(str(path))
    taken = []
    fn = module._gluon_forward
    module._gluon_forward = lambda *a, **k: taken.append("_gluon_forward") or fn(*a, **k)
    launch = module._launch
    module._launch = lambda kernel, grid, *a, **k: taken.append(grid) or launch(
        kernel, grid, *a, **k
    )
    lengths = [300, 0, 1, 129, 256]  # tiles 3 + 0 + 1 + 2 + 2
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    t = int(cu[-1])
    q, k, v = (torch.randn(t, 4, 128, dtype=module.DTYPE) for _ in range(3))
    k, v = k[:, :2].contiguous(), v[:, :2].contiguous()
    seqs = module.sequences(cu_seqlens_q=cu, cu_seqlens_k=cu)
    # The table is copied from the host: not while a CUDA graph is captured
    # (decision 106), and made by the first call outside one.
    capturing = module._capturing
    module._capturing = lambda x: True
    assert module._gluon_tiles(seqs.bind(q, k), t, t) is None
    module._capturing = capturing
    module.attention(q, k, v, sequences=seqs)
    assert taken == [(1,), "_gluon_forward", (8, 4)]  # the bound table (`_bind_varlen`), once
    # (first rows of q and k, length, tile's first row, first row of the statistics)
    tiles = [[0, 0, 300, 256, 0], [0, 0, 300, 128, 0], [0, 0, 300, 0, 0]]
    tiles += [[430, 430, 256, 128, 768], [430, 430, 256, 0, 768]]
    tiles += [[301, 301, 129, 128, 512], [301, 301, 129, 0, 512], [300, 300, 1, 0, 384]]
    assert module._gluon_tiles(seqs.bind(q, k), t, t).tolist() == tiles
    module._capturing = lambda x: True
    assert module._gluon_tiles(seqs.bind(q, k), t, t).tolist() == tiles  # made: captured too
    module._capturing = capturing
    built = host_stub.load(
        os.path.join(os.path.dirname(spec), "..", "generated", "plain_causal.py")
    )
    assert hasattr(built, "_gluon_varlen_supported")  # on by default (decision 106)
    short = torch.tensor([0, 100, 200], dtype=torch.int32)  # 100 tokens on average
    other = torch.tensor([0, 150, 301], dtype=torch.int32)  # 150 and 151 keys for 100 queries
    for cu_q, cu_k in ((short, short), (short, other)):
        taken.clear()
        module.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
        assert "_gluon_forward" not in taken and taken[0] == (1,) and len(taken) == 2  # the table


def test_host_stub_varlen_calls_take_the_gluon_backward(tmp_path):
    """Under the knob gluon_varlen_backward (decision 104), a varlen call
    whose sequences have as many queries as keys takes the Gluon backward:
    the dQ kernel on a grid of (the call's tiles, heads), the dK/dV kernel on
    (tiles, kv heads), with statistics of every sequence padded to 128 rows;
    sequences of 100 tokens on average take the Triton backward."""
    import host_stub
    import torch

    from flashgen.api import _check_specs
    from flashgen.emit import render_module

    spec = os.path.join(os.path.dirname(__file__), "..", "examples", "plain_causal.attn")
    (variant,) = _check_specs(pathlib.Path(spec))
    path = tmp_path / "plain_causal.py"
    path.write_text(render_module(variant, None, {"gluon_varlen": False}))
    module = host_stub.load(str(path))
    assert not hasattr(module, "_gluon_varlen_supported")  # the forward stays Triton's
    launched = []
    launch = module._launch
    module._launch = lambda kernel, grid, *a, **k: launched.append((kernel, grid)) or launch(
        kernel, grid, *a, **k
    )
    for lengths, gluon in (([300, 0, 1, 129, 256], True), ([100, 100], False)):
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        t = int(cu[-1])
        q = torch.randn(t, 4, 128, dtype=module.DTYPE, requires_grad=True)
        k, v = (torch.randn(t, 2, 128, dtype=module.DTYPE, requires_grad=True) for _ in "kv")
        seqs = module.sequences(cu_seqlens_q=cu, cu_seqlens_k=cu)
        o = module.attention(q, k, v, sequences=seqs)
        launched.clear()
        o.backward(torch.randn_like(o))
        gluon_kernels = (module._gluon_attn_bwd_dq, module._gluon_attn_bwd_dkdv)
        if gluon:
            assert launched == [(gluon_kernels[0], (8, 4)), (gluon_kernels[1], (8, 2))]
            bound = seqs.bind(q, k)
            tiles = module._gluon_tiles(bound, t, t)
            assert module._gluon_stat_rows(bound, tiles) == 384 + 128 + 256 + 256
        else:
            assert launched and not any(kernel in gluon_kernels for kernel, _ in launched)


def test_host_stub_captured_varlen_calls_take_the_gluon_kernels_under_the_knob(tmp_path):
    """Under the knob gluon_varlen_captured (decision 107), a varlen call made
    while a CUDA graph is captured (`_capturing` forced), given one
    cu_seqlens tensor for q and k, takes the Gluon forward and backward on a
    grid of cdiv(T, 128) + S tiles, its table made on the GPU in one launch,
    reading nothing on the host; two cu_seqlens tensors take the Triton kernels, as
    every captured call does without the knob.  So does a call of the custom
    operator that torch.compile records, told that q's sequences are k's."""
    import host_stub
    import torch

    from flashgen.api import _check_specs
    from flashgen.emit import render_module

    spec = os.path.join(os.path.dirname(__file__), "..", "examples", "plain_causal.attn")
    (variant,) = _check_specs(pathlib.Path(spec))
    lengths = [300, 0, 1, 129, 256]  # 8 tiles; 11 rows of the table made on the GPU
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    t = int(cu[-1])
    for knob in (True, False):
        path = tmp_path / f"plain_causal_{knob}.py"
        path.write_text(render_module(variant, None, {"gluon_varlen_captured": knob}))
        module = host_stub.load(str(path))
        launched = []
        launch = module._launch
        module._launch = lambda kernel, grid, *a, **k: launched.append((kernel, grid)) or launch(
            kernel, grid, *a, **k
        )
        gluon = (module._gluon_attn_fwd, module._gluon_attn_bwd_dq, module._gluon_attn_bwd_dkdv)
        q = torch.randn(t, 4, 128, dtype=module.DTYPE, requires_grad=True)
        k, v = (torch.randn(t, 2, 128, dtype=module.DTYPE, requires_grad=True) for _ in "kv")
        module._capturing = lambda x: True
        reads = {name: getattr(torch.Tensor, name) for name in ("tolist", "item", "__bool__")}

        def host_read(*args, **kwargs):
            raise AssertionError("a length was read on the host while capturing")

        try:
            for name in reads:
                setattr(torch.Tensor, name, host_read)
            for cu_k in (cu, cu.clone()):
                launched.clear()
                o = module.attention(
                    q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu_k, max_seqlen_q=300,
                    max_seqlen_k=300,
                )  # fmt: skip
                o.backward(torch.randn(o.shape, dtype=o.dtype))
                # rows past the last sequence: o, lse, then dq, dk, dv (3 programs of 256 rows)
                fills = [(module._fill_rows_past, (3,))] * 2
                back_fills = [(module._fill_rows_past, (3,))] * 3
                if knob and cu_k is cu:
                    assert launched == [
                        (module._bind_varlen, (1,)),  # the sequences' table, one launch
                        *fills,
                        (module._gluon_tiles_kernel, (1,)),  # the table, one launch
                        (gluon[0], (11, 4)),
                        *back_fills,
                        (gluon[1], (11, 4)),
                        (gluon[2], (11, 2)),
                    ]
                else:
                    assert launched[0] == (module._bind_varlen, (1,))
                    assert not any(kernel in gluon for kernel, _ in launched)
        finally:
            for name, read in reads.items():
                setattr(torch.Tensor, name, read)
        # torch.compile's operator binds no lengths either (its `call` says
        # whether q's sequences are k's): the same table made on the GPU.
        module._capturing = lambda x: False
        table = module.sequences(cu_seqlens_q=cu, cu_seqlens_k=cu).bind(q, k)[0]
        for same in (1, 0):
            launched.clear()
            q0, k0, v0 = (x.detach() for x in (q, k, v))
            module._op_forward(q0, k0, v0, 0.1, table, [300, 300, 1, 0, 0, 0, same], None, [])
            if knob and same:
                assert launched == [*fills, (module._gluon_tiles_kernel, (1,)), (gluon[0], (11, 4))]
            else:
                assert launched and not any(kernel in gluon for kernel, _ in launched)


@pytest.mark.parametrize("head_dim", [128, 64])
def test_host_stub_packed_documents_whose_ids_form_runs_take_the_gluon_kernels(tmp_path, head_dim):  # fmt: skip
    """Decision 109 on the host: a plan whose documents' ids form runs sends
    the forward and the backward to the Gluon kernels of the mask's
    positional part, over (B * H * N, D) views of contiguous tensors and
    (B * N, H * D) views of rows of tokens (VARLEN 2 and 1), at d64 as at
    d128 (runs of 128 tokens on average or more, decision 111).  A negative
    scale sends the forward to the module's Triton kernel, which writes o in
    q's layout so that the backward takes the runs.  Without a plan, with
    ids that come back in a row, or with tensors of neither layout the
    module's own Triton kernels run."""
    import host_stub
    import torch

    from flashgen.api import check_sources
    from flashgen.emit import render_module

    spec = f"attention docs {{ head_dim = {head_dim}; dtype = bf16; doc: int32[B, Nk]; "
    spec += "mask = causal & doc[b, q] == doc[b, k] }"
    path = tmp_path / "docs.py"
    (variant,), _ = check_sources({"docs.attn": spec})
    path.write_text(render_module(variant, None, {"document_runs": True}))
    module = host_stub.load(str(path))
    launched = []
    launch = module._launch

    def counted(kernel, grid, *args, **options):
        descriptors = [a for a in args if hasattr(a, "block_shape")]
        varlen = args[-1] if kernel in (module._gluon_attn_fwd, module._gluon_attn_bwd_dq) else None
        launched.append((kernel, grid, [d.shape for d in descriptors[:1]], varlen))
        return launch(kernel, grid, *args, **options)

    module._launch = counted
    batch, heads, n = 2, 4, 384
    doc = torch.repeat_interleave(torch.arange(6, dtype=torch.int32), torch.tensor([100, 200, 84, 300, 50, 34]))  # fmt: skip
    doc = doc.reshape(batch, n)
    contiguous = [torch.randn(batch, heads, n, head_dim, dtype=module.DTYPE) for _ in range(4)]
    tokens = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in contiguous]
    inputs = module._check_runtime_inputs(contiguous[0], contiguous[1], (doc,))
    plan = module.tile_plan(*contiguous[:3], doc=doc)
    assert plan.runs is not None and plan.runs.ctas == 1 + 2 + 1 + 3 + 1 + 1
    assert plan.tiles == {}  # the module's own kernels' tiles: made by a call that needs them
    for (q, k, v, do), view, varlen, scale in (
        (contiguous, (batch * heads * n, head_dim), 2, 0.1),
        (tokens, (batch * n, heads * head_dim), 1, 0.1),
        (tokens, (batch * n, heads * head_dim), 1, -0.1),
    ):
        launched.clear()
        o, lse = module._forward(q, k, v, scale, inputs=inputs, plan=plan)
        module._backward(q, k, v, o, lse, do, None, scale, inputs=inputs, plan=plan)
        if scale < 0:  # the module's Triton forward (its tiles made now), then the runs' backward
            assert [launched.pop(0)[0] for _ in range(2)] == [module._attn_plan, module._attn_fwd]
        else:
            assert launched.pop(0) == (module._gluon_attn_fwd, (plan.runs.ctas, heads), [view], varlen)  # fmt: skip
        kernels = [kernel for kernel, *_ in launched]
        assert kernels == [module._gluon_attn_bwd_dq, module._gluon_attn_bwd_dkdv]
        assert [grid for _, grid, *_ in launched] == [(plan.runs.ctas, heads)] * 2
        assert launched[0][2:] == ([view], varlen)
        assert o.stride() == q.stride() and lse.shape == (batch, heads, n)
        # attention() returns o and the gradients in the caller's shape
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        o = module.attention(*leaves, doc=doc, plan=plan)
        assert o.shape == q.shape and o.stride() == q.stride()
        o.backward(do)
        assert [x.grad.shape for x in leaves] == [q.shape] * 3
    # no plan, ids that come back, neither layout: the Triton kernels
    back = doc.clone()
    back[1, -10:] = 0
    others = (
        (contiguous, None),
        (contiguous, module.tile_plan(*contiguous[:3], doc=back)),
        ([x.transpose(2, 3).contiguous().transpose(2, 3) for x in contiguous], plan),
    )
    for (q, k, v, do), given in others:
        data = inputs if given is None or given.runs is not None else (back,)
        launched.clear()
        o, lse = module._forward(q, k, v, 0.1, inputs=data, plan=given)
        module._backward(q, k, v, o, lse, do, None, 0.1, inputs=data, plan=given)
        kernels = [kernel for kernel, *_ in launched]
        assert module._attn_fwd in kernels and module._attn_bwd in kernels
        assert module._gluon_attn_fwd not in kernels
    launched.clear()  # the runs' plan, neither layout again: its tiles were kept by the last call
    module._forward(q, k, v, 0.1, inputs=inputs, plan=plan)
    assert module._attn_plan not in [kernel for kernel, *_ in launched]
    # Under a CUDA graph's capture the tiles are made for the call and not kept
    # (its kernels write them only when the graph replays).
    fresh = module.tile_plan(*contiguous[:3], doc=doc)
    capturing = module._capturing
    module._capturing = lambda x: True
    try:
        module._forward(q, k, v, 0.1, inputs=inputs, plan=fresh)
    finally:
        module._capturing = capturing
    assert fresh.tiles == {}


def test_host_stub_a_plan_serves_the_gluon_backward_of_a_data_mask(tmp_path):
    """Packed documents at d64 take the Gluon backward (decision 078): a plan
    from tile_plan() holds its 64-row tiles, so a call given it launches no
    plan kernel; a call without one launches one for both kernels."""
    import host_stub
    import torch

    from flashgen.api import check_sources
    from flashgen.emit import render_module

    spec = "attention docs { head_dim = 64; dtype = bf16; doc: int32[B, Nk]; "
    spec += "mask = causal & doc[b, q] == doc[b, k] }"
    path = tmp_path / "docs.py"
    # its own kernels: not those of the mask's positional part (decision 109)
    (variant,), _ = check_sources({"docs.attn": spec})
    path.write_text(render_module(variant, None, {"document_runs": False}))
    module = host_stub.load(str(path))
    launched = []
    launch = module._launch

    def counted(kernel, *args, **options):
        launched.append(kernel)
        return launch(kernel, *args, **options)

    module._launch = counted
    q, k, v, do = (torch.randn(1, 2, 256, 64, dtype=module.DTYPE) for _ in range(4))
    doc = torch.zeros(1, 256, dtype=torch.int32)
    inputs = module._check_runtime_inputs(q, k, (doc,))
    plan = module.tile_plan(q, k, v, doc=doc)
    o, lse = module._forward(q, k, v, 0.1, inputs=inputs, plan=plan)
    for given, plans in ((plan, 0), (None, 1)):
        launched.clear()
        module._backward(q, k, v, o, lse, do, None, 0.1, inputs=inputs, plan=given)
        assert launched.count(module._attn_plan) == plans
        assert module._gluon_attn_bwd_dq in launched and module._gluon_attn_bwd_dkdv in launched
        assert module._attn_bwd not in launched


@pytest.mark.parametrize("name", ["mistral_sliding", "bloom_alibi"])
def test_any_mask_gluon_forward_from_4096_keys(name):
    """A module with the Gluon forward for a general mask takes it, as on an
    sm90 GPU, from GLUON_MIN_KEYS keys on, and the Triton forward below, with
    Nq != Nk, or with a launch config given."""
    import host_stub
    import torch

    generated = os.path.join(os.path.dirname(__file__), "..", "generated")
    module = host_stub.load(os.path.join(generated, f"{name}.py"))
    assert module.GLUON_MIN_KEYS == 4096
    taken = []
    fn = module._gluon_forward
    module._gluon_forward = lambda q, *a: taken.append(q.shape[2]) or fn(q, *a)

    def run(n_queries, n_keys, **config):
        q = torch.randn(1, 2, n_queries, 128, dtype=module.DTYPE)
        k, v = (torch.randn(1, 2, n_keys, 128, dtype=module.DTYPE) for _ in range(2))
        module._forward(q, k, v, 0.1, **config)

    run(2048, 2048)
    run(3968, 3968)
    run(4096, 4096)
    run(4096, 4224)
    run(4224, 4224)
    run(4096, 4096, block_m=64)
    assert taken == [4096, 4224]


@pytest.mark.parametrize("name", ["full", "plain_causal"])
def test_plain_gluon_forward_at_head_dim_64_from_4096_keys(name, tmp_path):
    """At head dim 64 the full and causal modules carry the Gluon forward and
    take it, as on an sm90 GPU, from GLUON_MIN_KEYS (4096) keys on, the
    Triton forward below (decision 068: it lost at N = 1024 there); at head
    dim 128 from any length; a window at d64 gets no Gluon forward."""
    import dataclasses

    import host_stub
    import torch
    from flashgen.emit import render_module
    from kernel_utils import example_variants, make_variant

    (variant,) = [v for v in example_variants() if v.name == name]
    for head_dim, fewest in ((64, 4096), (128, 0)):
        path = tmp_path / f"{name}_{head_dim}.py"
        path.write_text(render_module(dataclasses.replace(variant, head_dim=head_dim)))
        module = host_stub.load(str(path))
        assert getattr(module, "GLUON_MIN_KEYS", 0) == fewest
        taken = []
        fn = module._gluon_forward
        module._gluon_forward = lambda q, *a: taken.append(q.shape[2]) or fn(q, *a)
        for n in (1024, 3968, 4096, 8192):
            q, k, v = (torch.randn(1, 2, n, head_dim, dtype=module.DTYPE) for _ in range(3))
            module._forward(q, k, v, 0.1)
        assert taken == [n for n in (1024, 3968, 4096, 8192) if n >= fewest]
    window = make_variant("causal & window(4096)", None, dtype=variant.dtype, head_dim=64)
    assert "def _gluon_forward(" not in render_module(window)


def test_benchmarks_md_is_generated_from_the_results():
    """BENCHMARKS.md is scripts/benchmarks_md.py's output for the committed
    benchmarks/results.jsonl and docs/decisions/: the tables cannot drift from
    the data (after `flashgen bench --jsonl`, rerun the script)."""
    import benchmarks_md

    root = os.path.join(os.path.dirname(__file__), "..")
    with open(os.path.join(root, "BENCHMARKS.md"), encoding="utf-8") as f:
        assert f.read() == benchmarks_md.render(root)


def test_benchmarks_md_standing_is_the_latest_record(tmp_path):
    """The standing takes each point's latest do_bench record without error
    from a run that timed flashgen beside another system (3a, flashgen alone,
    is not one) and not of a drawn spec (4a), marks host-paced points and
    points behind Flex, and names its runs."""
    import json

    import benchmarks_md

    def record(run, system, fwd, bwd, **extra):
        base = dict(
            spec="full",
            D=64,
            Nq=1024,
            Nk=1024,
            system=system,
            timer="do_bench",
            error=None,
            run=run,
            date="2026-12-01",
            commit="abc1234",
            gpu="G",
            torch="t",
            triton="tr",
            command="python3 -m flashgen bench examples/full.attn",
        )
        base.update(extra)
        return [dict(base, direction="fwd", tflops=fwd),
                dict(base, direction="fwd+bwd", bwd_tflops=bwd, host_paced=extra.get("hp"))]  # fmt: skip

    rows = (
        record("1a", "flashgen", 100.0, 50.0)
        + record("1a", "flex", 80.0, 60.0)
        + record("2a", "flashgen", 120.0, 55.0, hp=True)
        + record("2a", "sdpa-cudnn", 100.0, 50.0)
        + record("2b", "flashgen", 999.0, 999.0, timer="cuda-graph")
        + record("2b", "flex", 999.0, 888.0, timer="cuda-graph")
        + record("2c", "flashgen", 999.0, 999.0, error="RuntimeError")
        + record("3a", "flashgen", 999.0, 999.0)
        + record("4a", "flashgen", 999.0, 999.0, spec="rand0_0", random={"seed": 0, "index": 0})
        + record("4a", "flex", 1.0, 1.0, spec="rand0_0", random={"seed": 0, "index": 0})
    )
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "results.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows)
    )
    (tmp_path / "docs" / "decisions").mkdir(parents=True)
    (tmp_path / "docs" / "decisions" / "007-a-thing.md").write_text("# 007. A thing\n")
    text = benchmarks_md.render(str(tmp_path))
    assert (
        "| full | 1024 | 120 / 55 h | 80 / 60 | 100 / 50 | 1.50 / 0.92 ✗ | 1.20 / 1.10 | 2a, 1a |"
        in text
    )
    # A point behind under do_bench says what a later CUDA-graph run of both found.
    assert (
        "behind at full d64 N=1024 (0.92×, host-paced; 1.12× from CUDA graphs, 2026-12-01)" in text
    )
    assert "- run 2a, 2026-12-01, commit abc1234" in text
    assert "run 2b" not in text and "run 3a" not in text
    assert "rand0_0" not in text and "run 4a" not in text  # drawn specs: data, no standing
    assert "[007. A thing](docs/decisions/007-a-thing.md)" in text


def test_benchmarks_md_sums_up_each_random_run():
    """The drawn-spec table: flashgen / Flex per pass over a run's specs
    (median, minimum, points below 1), from the forward's ms and the
    backward's bwd_ms; a run of flashgen alone (a plan knob's) has no row."""
    import benchmarks_md

    def record(run, spec, system, fwd, bwd):
        base = dict(run=run, commit="abc1234", spec=spec, system=system, D=128, Nq=4096,
                    random={"seed": 7, "index": 0, "text": ""}, error=None)  # fmt: skip
        return [dict(base, direction="fwd", ms=fwd), dict(base, direction="fwd+bwd", bwd_ms=bwd)]

    records = []
    for spec, (ours, flex) in {"a": ((1.0, 2.0), (2.0, 1.0)), "b": ((1.0, 1.0), (1.5, 3.0)),
                               "c": ((2.0, 1.0), (1.0, 2.5))}.items():  # fmt: skip
        records += record("r", spec, "flashgen", *ours) + record("r", spec, "flex", *flex)
    records += record("knob", "a", "flashgen", 1.0, 1.0)
    lines = benchmarks_md.random_table(records)
    # forward ratios 2.0, 1.5, 0.5; backward 0.5, 3.0, 2.5
    assert lines[2:] == [
        "| r | 7 | 128 | 4096 | 3 | 1.50× / 0.50× / 1 of 3 | 2.50× / 0.50× / 1 of 3 | abc1234 |"
    ]
    assert benchmarks_md.random_table(record("knob", "a", "flashgen", 1.0, 1.0)) == []


def test_benchmarks_md_decode_bench_table():
    """`bench --decode`'s table: per point, the latest TB/s of each system,
    flashgen's over cuDNN's and its paged cache's over its contiguous one;
    an errored system is a dash."""
    import benchmarks_md

    def record(system, tb, layout="contiguous", commit="abc1234", error=""):
        return dict(variant="full", batch=8, n_keys=32768, n_queries=1, system=system,
                    layout=layout, tb_per_s=tb, commit=commit, error=error)  # fmt: skip

    records = [
        record("flashgen", 1.0, commit="old"),
        record("flashgen", 4.0),
        record("flashgen", 3.6, layout="paged64"),
        record("flex", None, error="OutOfMemoryError"),
        record("sdpa-cudnn", 5.0),
        record("sdpa-flash", 2.0),
    ]
    lines = benchmarks_md.decode_bench_table(records)
    assert lines[0].startswith("| spec | B · Nk | Nq | flashgen | paged64 | flex | sdpa-cudnn |")
    assert lines[2:] == [
        "| full | 8 · 32k | 1 | 4.00 | 3.60 | — | 5.00 | 2.00 | 0.80× | 0.90 | abc1234 |"
    ]
    assert benchmarks_md.decode_bench_table([]) == []


def test_compare_bench_sets_host_paced_points_apart(tmp_path, capsys, monkeypatch):
    """scripts/compare_bench.py: head / base per point; a point where either
    run went at the host's pace counts apart from the kernels' points."""
    import compare_bench

    def point(n, fwd_tflops, bwd_tflops, host_ms):
        return dict(
            variant="v", system="flashgen", head_dim=64, seqlen=n, error="", fwd_ms=1.0,
            bwd_ms=1.0, host_ms=host_ms, fwd_tflops=fwd_tflops, bwd_tflops=bwd_tflops,
        )  # fmt: skip

    base = [point(1024, 100.0, 50.0, 1.9), point(2048, 200.0, 100.0, 0.1)]
    head = [point(1024, 100.0, 100.0, 0.1), point(2048, 220.0, 90.0, 0.1)]
    (tmp_path / "base.jsonl").write_text(json.dumps(base) + "\n")
    (tmp_path / "head.jsonl").write_text(json.dumps(head) + "\n")
    monkeypatch.setattr(
        sys, "argv", ["compare_bench", str(tmp_path / "base.jsonl"), str(tmp_path / "head.jsonl")]
    )
    assert compare_bench.main() == 0
    out = capsys.readouterr().out
    assert "(2.00)h" in out and "(0.90) " in out
    assert "d64 fwd+bwd (host-paced): geomean 2.000, min 2.000, max 2.000 over 1 points" in out
    assert "d64 fwd+bwd (kernels): geomean 0.900, min 0.900, max 0.900 over 1 points" in out
    assert "d64 fwd (kernels): geomean 1.049, min 1.000, max 1.100 over 2 points" in out


def test_normalized_ptx_keeps_the_code_and_drops_what_names_the_source():
    """scripts/same_ptx.sh compares kernels by their PTX: line numbers, file
    names, comments and debug sections must not count, instructions must."""
    sm90_resources = pytest.importorskip("sm90_resources")
    ptx = (
        '.version 8.7\n\t.file\t1 "/a/b/module.py"\n// a comment\n'
        "\t.loc\t1 42 7\n$L__tmp3:\n\tadd.s32 \t%r1, %r2, %r3;\n$L__BB0_2:\n\n"
        "\t.section\t.debug_info\n{ junk }\n"
    )
    # `$L__tmpN:` marks an inlined function for the debug sections; branch labels stay.
    want = ".version 8.7\n\tadd.s32 \t%r1, %r2, %r3;\n$L__BB0_2:\n"
    assert sm90_resources.normalized_ptx(ptx) == want


def test_gpu_tests_groups_select_every_gpu_test():
    """scripts/gpu_tests.sh runs tests/test_gpu.py in groups chosen by -k
    expressions; a test that no group selects never runs there.  Each test
    (one name, its parameters left out, as -k matches every parametrization
    by the function's name and the ids) must be selected by some group of
    PART 1, 2 or 3."""
    import re
    import subprocess

    from _pytest.mark.expression import Expression

    root = os.path.join(os.path.dirname(__file__), "..")
    script = open(os.path.join(root, "scripts", "gpu_tests.sh")).read()
    parts = script[script.index("part=${PART") :]
    selections = re.findall(r'^\s+group [\w-]+ "([^"]+)"', parts, flags=re.M)
    assert len(selections) >= 13
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        + ["-m", "", os.path.join(root, "tests", "test_gpu.py")],
        capture_output=True,
        text=True,
        cwd=root,
    ).stdout
    ids = [line.split("::", 1)[1] for line in collected.splitlines() if "::" in line]
    assert ids, collected

    def selected(node: str) -> bool:
        names = [node.lower(), "test_gpu.py", "tests", "gpu"]
        for sel in selections:
            expr = Expression.compile(sel)
            if expr.evaluate(lambda sub, **_: any(sub.lower() in n for n in names)):
                return True
        return False

    assert [i for i in ids if not selected(i)] == []


def test_config_sweep_lists_whole_specs_at_their_own_and_given_tiles(capsys, monkeypatch):
    """scripts/gpu_config_sweep.py --specs/--random --list: the cases of whole
    specs (their scores too, at the head dim asked), "built" for the module's
    own tiles, one pass only; without a GPU."""
    import gpu_config_sweep

    spec = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "specs", "t5_bias.attn")
    argv = ["sweep", "unused.jsonl", "--specs", spec, "--random", "3", "--seed", "1"]
    argv += ["--names", "rand1_2", "--head-dims", "128", "--passes", "backward"]
    argv += ["--backward-configs", "built", "32,64,4,3", "--list"]
    monkeypatch.setattr(sys, "argv", argv)
    gpu_config_sweep.main()
    assert capsys.readouterr().out.splitlines() == [
        "t5_bias 4096 128 backward None",
        "t5_bias 4096 128 backward (32, 64, 4, 3)",
        "rand1_2 4096 128 backward None",
        "rand1_2 4096 128 backward (32, 64, 4, 3)",
    ]
    ((name, text, n),) = gpu_config_sweep.whole_specs([spec])
    assert (name, n) == ("t5_bias", 4096) and "score = s + " in text
    assert "head_dim = 80\n" in gpu_config_sweep.spec_text(name, text, 80)


def test_compare_sass_tells_register_allocation_from_other_changes():
    """scripts/compare_sass.py's verdicts: the same instructions; the same
    operations on other registers; instructions added or reordered."""
    from compare_sass import compare

    a = ["MOV R1, c[param]", "IADD3 R2, R1, 0x1, RZ", "EXIT"]
    assert compare(a, list(a)) == "same"
    assert compare(a, ["MOV R3, c[param]", "IADD3 R2, R3, 0x1, RZ", "EXIT"]) == (
        "same opcodes, 2 of 3 with other operands (registers)"
    )
    assert compare(a, ["IADD3 R2, R1, 0x1, RZ", "MOV R1, c[param]", "EXIT"]) == "2 of 3 differ"
