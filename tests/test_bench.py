"""`flashgen bench` and the FlexAttention mods derived from the IR (CPU parts).

The timings need a GPU; here the whole pipeline runs on tiny shapes with
FlexAttention in eager mode and a stand-in timer, and the Flex translation of
random specs is checked against the dense reference in float64.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flashgen import bench, ir
from flashgen.cli import _parser, main
from flashgen.flex import flex_mods
from flashgen.parse import parse
from flashgen.check import check
from flashgen.reference import attention_ref, mask_matrix
from strategies import variants

flex_attention = pytest.importorskip("torch.nn.attention.flex_attention")


def _variant(text: str) -> ir.Variant:
    spec, diags = parse(text)
    assert not diags
    (v,), diags = check([spec])
    assert not diags
    return v


@pytest.mark.kernels  # 60 attentions through FlexAttention and the reference
@settings(max_examples=60, deadline=None)
@given(variant=variants(), n_queries=st.integers(1, 40), n_keys=st.integers(1, 40))
def test_flex_mods_compute_the_reference_attention(variant, n_queries, n_keys):
    heads = 3
    gen = torch.Generator().manual_seed(n_queries * 64 + n_keys)
    q = torch.randn(1, heads, n_queries, variant.head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(1, heads, n_keys, variant.head_dim, generator=gen, dtype=torch.float64)
    v = torch.randn(1, heads, n_keys, variant.head_dim, generator=gen, dtype=torch.float64)
    mods = flex_mods(variant, n_queries, n_keys, heads, device="cpu")
    block_mask = None
    if mods.mask_mod is not None:
        block_mask = flex_attention.create_block_mask(
            mods.mask_mod, None, heads, n_queries, n_keys, device="cpu"
        )
    scale = variant.scale if variant.scale is not None else variant.head_dim**-0.5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex_attention warns it is unfused
        o = flex_attention.flex_attention(
            q, k, v, score_mod=mods.score_mod, block_mask=block_mask, scale=scale
        )
    ref, _ = attention_ref(variant, q, k, v)
    torch.testing.assert_close(o, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "mask", ["full", "causal", "causal & window(7)", "causal | prefix(5)", "h % 2 == 0"]
)
def test_density_counts_visible_pairs(mask):
    variant = _variant(f"attention t {{ head_dim = 16; dtype = fp16; mask = {mask} }}")
    expected = mask_matrix(variant, 50, 50, 4).double().mean().item()
    assert bench.density(variant, 50, 4, "cpu") == pytest.approx(expected, abs=1e-12)


def test_bench_pipeline_on_cpu(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    variant = _variant(
        "attention tiny { head_dim = 16; dtype = fp32; mask = causal; score = s + alibi }"
    )

    def timer(fn):
        fn()
        return 2.0

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = bench.bench(
            [variant],
            seqlens=[32, 48],
            batch=1,
            heads=2,
            device="cpu",
            timer=timer,
            compile_flex=False,
            systems=("flashgen", "flex", "sdpa-cudnn"),
            progress=False,
        )
    assert [(r.system, r.seqlen) for r in results] == [
        ("flashgen", 32),
        ("flex", 32),
        ("flashgen", 48),
        ("flex", 48),
    ]  # SDPA cannot express ALiBi
    ours, flex32 = results[0], results[1]
    assert not ours.error and ours.fwd_ms == 2.0
    # Outputs agree; FlexAttention has no CPU backward, which is reported.
    assert flex32.max_diff is not None and flex32.max_diff < 1e-4
    assert "backward" in flex32.error
    ours = dataclasses.replace(ours, bwd_ms=1.0)
    flex32 = dataclasses.replace(flex32, fwd_ms=2.0, bwd_ms=1.0, error="")
    density = (32 * 33 / 2) / 32**2
    assert flex32.density == pytest.approx(density)
    assert flex32.tflops() == pytest.approx(4 * 2 * 32**2 * 16 * density / 2e-3 / 1e12)
    assert flex32.tflops(backward=True) == pytest.approx(flex32.tflops() * 2.5 * 2)
    text = bench.table([ours, flex32])
    assert "tiny" in text and "vs flex" in text and "1.00/ 1.00" in text
    rows = json.loads(bench.to_json([ours, flex32]))
    assert rows[0]["system"] == "flashgen" and rows[0]["fwd_tflops"] > 0
    assert rows[0]["timer"] == "timer"  # a timer function is recorded by its name


def test_bench_progress_off_a_terminal_is_a_plain_line_per_case(monkeypatch, capsys):
    """Where stderr is not a terminal (here: captured), each case is one
    plain line as it starts, and a case SDPA cannot express one line too; the
    table on stdout is untouched."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    variant = _variant(
        "attention tiny { head_dim = 16; dtype = fp32; mask = causal; score = s + alibi }"
    )
    results = bench.bench(
        [variant], seqlens=[32], batch=1, heads=2, device="cpu", timer=lambda fn: fn() or 1.0,
        systems=("sdpa-cudnn", "flashgen"),
    )  # fmt: skip
    assert [r.system for r in results] == ["flashgen"]
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        "[1/2] tiny N=32 sdpa-cudnn: not expressible",
        "[2/2] tiny N=32 flashgen: compiling and timing",
    ]


def test_bench_timers(monkeypatch):
    """`timer` names how calls are timed; the name goes into each measurement
    and the table, and an unknown one is refused before anything runs."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    variant = _variant("attention tiny { head_dim = 16; dtype = fp32; mask = causal }")
    with pytest.raises(ValueError, match="timer must be one of do_bench, cuda-graph"):
        bench.bench([variant], seqlens=[32], device="cpu", timer="wall", progress=False)
    calls = []
    monkeypatch.setitem(bench.TIMERS, "cuda-graph", lambda fn: calls.append(fn()) or 3.0)
    results = bench.bench(
        [variant],
        seqlens=[32],
        batch=1,
        heads=2,
        device="cpu",
        timer="cuda-graph",
        systems=("flashgen",),
        progress=False,
    )
    assert len(calls) == 2  # the forward, and forward + backward
    assert [(r.timer, r.fwd_ms, r.bwd_ms) for r in results] == [("cuda-graph", 3.0, 0.0)]
    text = bench.table(results).splitlines()
    assert "cuda-graph" in text[0]
    assert "/    -" in text[3]  # a backward time of 0 has no TFLOP/s: shown as "-"
    for name in bench.TIMERS:  # the CLI offers every timer
        assert _parser().parse_args(["bench", "a.attn", "--timer", name]).timer == name
    assert results[0].host_ms is None  # host time is do_bench's question only


def test_host_paced_points_are_measured_and_marked(monkeypatch):
    """With do_bench, each system's host time per forward + backward call is
    measured; a point whose host time reaches the time measured is marked
    "h" in the table, with a footnote, and the JSON keeps the host time."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    variant = _variant("attention tiny { head_dim = 16; dtype = fp32; mask = causal }")
    monkeypatch.setitem(bench.TIMERS, "do_bench", lambda fn: (fn(), 2.0)[1])
    (measured,) = bench.bench(
        [variant], seqlens=[32], batch=1, heads=2, device="cpu", systems=("flashgen",),
        progress=False,
    )  # fmt: skip
    assert not measured.error, measured.error
    assert measured.timer == "do_bench" and measured.host_ms > 0
    fast_host = dataclasses.replace(measured, fwd_ms=1.0, bwd_ms=1.0, host_ms=0.5)
    slow_host = dataclasses.replace(fast_host, system="flex", host_ms=1.9)
    assert not fast_host.host_paced() and slow_host.host_paced()
    lines = bench.table([fast_host, slow_host]).splitlines()
    row = lines[3]
    assert row.count("h") == 1 and "h " in row.split("tiny")[1]  # flex's cell, not ours
    assert lines[-1].startswith("h forward + backward ran at the host's pace")
    assert "host's pace" not in bench.table([fast_host])
    rows = json.loads(bench.to_json([fast_host, slow_host]))
    assert [r["host_ms"] for r in rows] == [0.5, 1.9]


def test_every_kernel_is_compiled_before_any_timing(monkeypatch):
    """A forward + backward runs untimed before the first timed call, so that
    neither compiles nor a module's compile ahead (worker threads started by
    the first forward with a gradient, decision 062) fall into the timings."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    variant = _variant("attention tiny { head_dim = 16; dtype = fp32; mask = causal }")
    grads, seen = [], []
    real_grad = torch.autograd.grad
    monkeypatch.setattr(
        torch.autograd, "grad", lambda *a, **kw: grads.append(1) or real_grad(*a, **kw)
    )
    monkeypatch.setitem(bench.TIMERS, "cuda-graph", lambda fn: seen.append(len(grads)) or 1.0)
    bench.bench(
        [variant], seqlens=[32], batch=1, heads=2, device="cpu", timer="cuda-graph",
        systems=("flashgen",), progress=False,
    )  # fmt: skip
    assert seen == [1, 1]  # both timings after one untimed forward + backward


@pytest.mark.parametrize("tile_plan", bench.TILE_PLANS)
def test_a_data_masks_tile_plan_is_built_once_per_case_or_in_every_call(monkeypatch, tile_plan):
    """For a mask that reads runtime data, the default builds flashgen's tile
    plan once per case, outside the timed calls (as FlexAttention's block
    mask), and times it apart: the timed calls launch no plan kernel.
    per-call times calls that build their own: one plan in a forward, three in
    a forward + backward (decision 058)."""
    import flashgen.api

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    variant = _variant(
        "attention docs { head_dim = 16; dtype = fp32; doc: int32[B, Nk]\n"
        "mask = causal & doc[b, q] == doc[b, k] }"
    )
    modules, plans_per_timing = [], []
    load = flashgen.api.load_variant

    def loaded(*args, **kwargs):
        module = load(*args, **kwargs)
        launch = module._launch

        def counted(kernel, *a, **kw):
            plans[0] += kernel is module._attn_plan
            return launch(kernel, *a, **kw)

        monkeypatch.setattr(module, "_launch", counted)
        modules.append(module)
        return module

    plans = [0]

    def timer(fn):
        plans[0] = 0
        fn()
        plans_per_timing.append(plans[0])
        return 2.0

    monkeypatch.setattr(flashgen.api, "load_variant", loaded)
    (measured,) = bench.bench(
        [variant], seqlens=[32], batch=1, heads=2, device="cpu", timer=timer,
        systems=("flashgen",), progress=False, tile_plan=tile_plan,
    )  # fmt: skip
    assert not measured.error, measured.error
    if tile_plan == "per-batch":
        # tile_plan() timed alone (one launch where the forward's tile shape is
        # the backward's, both sides in it), then forward and forward + backward.
        assert plans_per_timing[0] > 0 and plans_per_timing[1:] == [0, 0]
        assert measured.tile_plan == "per batch" and measured.plan_ms == 2.0
        assert "tile plan built once per batch" in bench.table([measured])
    else:
        assert plans_per_timing == [1, 2]  # the forward's; it and the backward's two sides
        assert measured.tile_plan == "per call" and measured.plan_ms is None
        assert "tile plan" not in bench.table([measured])
    context = dict(commit="c", date="d", run="r", gpu="g", triton="t", torch="t", command="x")
    for record in bench.records([measured], [variant], dict(context, note=None)):
        assert record["tile_plan"] == measured.tile_plan
        assert record["plan_ms"] == measured.plan_ms


def test_a_module_without_a_tile_plan_records_none(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    variant = _variant("attention tiny { head_dim = 16; dtype = fp32; mask = causal }")
    (measured,) = bench.bench(
        [variant], seqlens=[32], batch=1, heads=2, device="cpu", timer=lambda fn: fn() or 1.0,
        systems=("flashgen",), progress=False,
    )  # fmt: skip
    assert measured.tile_plan is None and measured.plan_ms is None
    context = dict(commit="c", date="d", run="r", gpu="g", triton="t", torch="t", command="x")
    assert all(
        "tile_plan" not in r for r in bench.records([measured], [variant], dict(context, note=None))
    )


def test_bench_refuses_an_unknown_tile_plan():
    variant = _variant("attention tiny { head_dim = 16; dtype = fp32; mask = causal }")
    with pytest.raises(ValueError, match="tile_plan must be one of per-batch, per-call"):
        bench.bench([variant], seqlens=[32], device="cpu", tile_plan="never", progress=False)


def test_bench_cli_needs_a_gpu(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    spec = tmp_path / "a.attn"
    spec.write_text("attention a { head_dim = 16; dtype = fp16 }\n")
    assert main(["bench", str(spec)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_bench_plot_needs_matplotlib_before_it_runs(tmp_path, capsys, monkeypatch):
    """Without matplotlib, --plot is refused before anything runs (the plot
    is drawn after the whole bench), in one line and with no traceback."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else find_spec(name, *a),
    )
    spec = tmp_path / "a.attn"
    spec.write_text("attention a { head_dim = 16; dtype = fp16 }\n")
    assert main(["bench", str(spec), "--plot", str(tmp_path / "b.png")]) == 2
    err = capsys.readouterr().err
    assert "--plot needs matplotlib" in err and "Traceback" not in err
    assert not (tmp_path / "b.png").exists()


def test_flex_is_compiled_afresh_for_each_case(monkeypatch):
    """Past torch._dynamo's recompile limit FlexAttention would run uncompiled
    (8 TFLOP/s on the H200, docs/decisions/016): each (spec, N) case gets
    a reset and its own compilation.  torch.compile is replaced by a recorder
    (compiling flex on the CPU is slow and beside the point)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    events = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: events.append("reset"))

    def compile(fn, **kwargs):  # eager flex_attention compiles pieces of its own
        if sys._getframe(1).f_globals["__name__"] == "flashgen.bench":
            events.append("compile")
        return fn

    monkeypatch.setattr(torch, "compile", compile)
    variant = _variant("attention tiny { head_dim = 16; dtype = fp32; mask = causal }")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = bench.bench(
            [variant, dataclasses.replace(variant, name="tiny2")],
            seqlens=[32, 48],
            batch=1,
            heads=2,
            device="cpu",
            timer=lambda fn: fn() or 1.0,
            systems=("flex",),
            progress=False,
        )
    assert len(results) == 4
    assert events == ["reset", "compile"] * 4


def test_bench_jsonl_appends_one_record_per_system_shape_and_direction(
    tmp_path, monkeypatch, capsys
):
    """`flashgen bench --jsonl PATH` appends the records of
    benchmarks/results.jsonl: the run's context, the shape as benched (after
    --head-dim), the spec's dtype and hash, and per direction the times and
    TFLOP/s measured; the printed table is unchanged."""
    from pathlib import Path

    from flashgen import cli

    spec = tmp_path / "a.attn"
    spec.write_text("attention tiny { head_dim = 16; dtype = fp16; mask = causal }\n")
    ours = bench.Measurement(
        "tiny", "flashgen", batch=2, heads=4, seqlen=64, head_dim=32, density=0.5,
        fwd_ms=0.5, bwd_ms=1.0, host_ms=1.4,
    )  # fmt: skip
    flex = bench.Measurement(
        "tiny", "flex", batch=2, heads=4, seqlen=64, head_dim=32, density=0.5,
        fwd_ms=None, bwd_ms=None, error="RuntimeError: no backward",
    )  # fmt: skip
    benched = []

    def fake_bench(variants, **kwargs):
        benched.append(kwargs["head_dim"])
        kwargs["on_result"](ours)  # as bench.bench: each measurement as it is taken,
        assert len(out.read_text().splitlines()) == 3  # on the file before the next
        kwargs["on_result"](flex)
        return [ours, flex]

    monkeypatch.setattr(cli, "_gpu_variants", lambda args, command: cli._check_sources(
        cli._read(args.specs))[0])  # fmt: skip
    monkeypatch.setattr(bench, "bench", fake_bench)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "results.jsonl"
    out.write_text('{"earlier": 1}\n')
    argv = ["bench", str(spec), "--head-dim", "32", "--seqlens", "64", "--jsonl", str(out)]
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == bench.table([ours, flex])
    assert benched == [32]
    lines = out.read_text().splitlines()
    assert lines[0] == '{"earlier": 1}'  # appended, not overwritten
    fwd, both, flex_fwd, flex_both = map(json.loads, lines[1:])
    assert len(lines) == 5
    shape = dict(spec="tiny", B=2, H=4, Hkv=4, Nq=64, Nk=64, D=32, dtype="fp16")
    for record in (fwd, both, flex_fwd, flex_both):
        assert {k: record[k] for k in shape} == shape
        assert record["command"] == "python3 -m flashgen " + " ".join(argv)
        assert record["gpu"] is None  # torch saw no GPU
        assert record["triton"] and record["torch"] == torch.__version__
        assert len(record["date"]) == 10 and record["timer"] == "do_bench"
    assert (fwd["system"], fwd["direction"], fwd["ms"], fwd["error"]) == (
        "flashgen", "fwd", 0.5, None
    )  # fmt: skip
    # 4·B·H·N²·D·density FLOPs in 0.5 ms; the backward 2.5 times that in 1 ms.
    assert fwd["tflops"] == pytest.approx(4 * 2 * 4 * 64**2 * 32 * 0.5 / 0.5e-3 / 1e12)
    assert (both["direction"], both["ms"], both["bwd_ms"]) == ("fwd+bwd", 1.5, 1.0)
    assert both["bwd_tflops"] == pytest.approx(fwd["tflops"] * 2.5 / 2)
    assert both["host_ms"] == 1.4 and both["host_paced"] is True  # 1.4 >= 0.9 * 1.5
    assert flex_fwd["system"] == "flex" and flex_fwd["tflops"] is None
    assert flex_both["error"] == "RuntimeError: no backward" and flex_both["host_paced"] is None
    # The spec's hash is that of its normal form: the same for the same block
    # however written, and another for another dtype or head dim.
    same = _variant("attention tiny {\n  mask = causal ;dtype=fp16; head_dim = 32 }")
    assert fwd["spec_hash"] == bench.spec_hash(same)
    other = _variant("attention tiny { head_dim = 32; dtype = bf16; mask = causal }")
    assert bench.spec_hash(other) != fwd["spec_hash"]
    assert bench.spec_hash(dataclasses.replace(same, head_dim=16)) != fwd["spec_hash"]
    # The same fields, in the same order, as the committed results file.
    committed = Path(__file__).resolve().parent.parent / "benchmarks" / "results.jsonl"
    keys = {}
    for line in committed.read_text().splitlines():
        record = json.loads(line)
        keys.setdefault(record["direction"], list(record))
    assert keys == {"fwd": list(fwd), "fwd+bwd": list(both)}


# FlexAttention's error on an H200 (torch 2.11, Triton 3.6) for the T5 bias
# table's spec at head dim 64, as the bench recorded it.
_OUT_OF_SHARED_MEMORY = (
    "RuntimeError: No valid triton configs. OutOfMemoryError: out of resource: "
    "triton_tem_fused_flex_attention_0 Required: 245760 Hardware limit:232448 "
    "Reducing block sizes or `num_stages` may help."
)


class InductorError(RuntimeError):  # stands in for torch._inductor's, as raised
    pass


def _bench_fake_flex(monkeypatch, fails, compile_flex=False):
    """Bench one tiny causal spec at N=32 on FlexAttention alone, through a
    fake flex_attention that records (kernel_options, backward) per call and
    raises `fails(kernel_options, backward)` where that is an exception (SDPA
    computes the attention otherwise)."""
    calls = []

    def flex(q, k, v, score_mod=None, block_mask=None, scale=None, kernel_options=None):
        backward = torch.is_grad_enabled() and q.requires_grad
        calls.append((kernel_options, backward))
        error = fails(kernel_options, backward)
        if error is not None:
            raise error
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)

    monkeypatch.setattr(flex_attention, "flex_attention", flex)
    variant = _variant(
        "attention t5 { head_dim = 16; dtype = fp32; rel: fp32[H, 32]; mask = causal;"
        " score = s + rel[h, min(q - k, 31)] }"
    )
    (measured,) = bench.bench(
        [variant], seqlens=[32], batch=1, heads=2, device="cpu", timer=lambda fn: (fn(), 1.0)[1],
        systems=("flex",), progress=False, compile_flex=compile_flex,
    )  # fmt: skip
    return measured, calls


def test_flex_out_of_resources_retries_with_fewer_stages(monkeypatch):
    """Where FlexAttention's default kernels do not fit (the forward, as on the
    H200), it is compiled afresh and measured again with one pipeline stage
    fewer, in both directions; the note says so, in the table's footnotes and
    the records, after the run's own note."""
    events = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: events.append("reset"))

    def compile(fn, **kwargs):
        if sys._getframe(1).f_globals["__name__"] == "flashgen.bench":
            events.append("compile")
        return fn

    monkeypatch.setattr(torch, "compile", compile)

    def fails(options, backward):
        return InductorError(_OUT_OF_SHARED_MEMORY) if options is None else None

    measured, calls = _bench_fake_flex(monkeypatch, fails, compile_flex=True)
    assert events == ["reset", "compile"] * 2  # the default, then the retry
    assert calls[0] == (None, False)
    assert {options == {"num_stages": 2} for options, _ in calls[1:]} == {True}
    assert {backward for _, backward in calls[1:]} == {False, True}
    assert not measured.error and measured.fwd_ms == 1.0 and measured.bwd_ms == 0.0
    assert measured.note == (
        'the default kernel options ran out of resources; ran with kernel_options={"num_stages": 2}'
    )
    lines = bench.table([measured]).splitlines()
    assert lines[-1] == "note: t5 N=32 flex: " + measured.note
    variant = _variant(
        "attention t5 { head_dim = 16; dtype = fp32; rel: fp32[H, 32]; mask = causal;"
        " score = s + rel[h, min(q - k, 31)] }"
    )
    context = dict(
        commit="abc", date="2026-12-02", run=None, gpu=None, triton="3.6.0", torch="2.11",
        command="bench", note=None,
    )  # fmt: skip
    notes = [r["note"] for r in bench.records([measured], [variant], context)]
    assert notes == [measured.note, measured.note]
    context["note"] = "working tree differs from the commit"
    notes = {r["note"] for r in bench.records([measured], [variant], context)}
    assert notes == {"working tree differs from the commit; " + measured.note}
    ratios = bench.flex_ratios([measured])
    assert "FlexAttention ran with smaller kernel_options than its defaults at 1 point" in ratios
    # A measurement with FlexAttention's defaults has no note anywhere.
    plain = dataclasses.replace(measured, note="")
    assert "note:" not in bench.table([plain]) and "kernel_options" not in bench.flex_ratios(
        [plain]
    )
    notes = {r["note"] for r in bench.records([plain], [variant], context)}
    assert notes == {"working tree differs from the commit"}


def test_flex_out_of_resources_in_the_backward_remeasures_both_directions(monkeypatch):
    """A backward that does not fit (as on the H200, where the forward did)
    retries the whole measurement, the forward too, with the same options;
    blocks come down to 64 x 64 when fewer stages are not enough."""

    def fails(options, backward):
        if backward and (options is None or "fwd_BLOCK_M" not in options):
            return InductorError(_OUT_OF_SHARED_MEMORY.replace("_0", "_backward_2"))
        return None

    measured, calls = _bench_fake_flex(monkeypatch, fails)
    tried = []
    for options, _ in calls:
        if options not in tried:
            tried.append(options)
    assert tried == [
        None,
        {"num_stages": 2},
        {
            "num_stages": 2, "fwd_BLOCK_M": 64, "fwd_BLOCK_N": 64, "bwd_BLOCK_M1": 64,
            "bwd_BLOCK_N1": 64, "bwd_BLOCK_M2": 64, "bwd_BLOCK_N2": 64,
        },
    ]  # fmt: skip
    last = [(o, b) for o, b in calls if o == tried[-1]]
    assert {b for _, b in last} == {False, True}  # forward and backward with the same options
    assert calls[-len(last) :] == last  # and nothing else after them
    assert not measured.error
    assert measured.note.startswith(
        "the default kernel options and 1 smaller set ran out of resources; ran with "
        'kernel_options={"num_stages": 2, "fwd_BLOCK_M": 64,'
    )


def test_flex_other_errors_are_not_retried(monkeypatch):
    """An error that is not about resources (here a CUDA out-of-memory, which
    smaller tiles would not cure, and a plain one) is reported at once, with
    FlexAttention's defaults and no note."""
    for error in (
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        ValueError("score_mod captured an unsupported tensor"),
    ):
        measured, calls = _bench_fake_flex(monkeypatch, lambda options, backward: error)
        assert calls == [(None, False)]
        assert measured.error == f"{type(error).__name__}: {error}"
        assert measured.note == "" and measured.fwd_ms is None


def test_flex_out_of_resources_on_every_try_reports_the_last(monkeypatch):
    """Where even the smallest options do not fit, the error is the last
    try's, and the note names those options; four tries in all."""

    def fails(options, backward):
        return InductorError(_OUT_OF_SHARED_MEMORY)

    measured, calls = _bench_fake_flex(monkeypatch, fails)
    assert [options for options, _ in calls] == [
        None,
        {"num_stages": 2},
        {
            "num_stages": 2, "fwd_BLOCK_M": 64, "fwd_BLOCK_N": 64, "bwd_BLOCK_M1": 64,
            "bwd_BLOCK_N1": 64, "bwd_BLOCK_M2": 64, "bwd_BLOCK_N2": 64,
        },
        {
            "num_stages": 1, "fwd_BLOCK_M": 32, "fwd_BLOCK_N": 64, "bwd_BLOCK_M1": 32,
            "bwd_BLOCK_N1": 64, "bwd_BLOCK_M2": 64, "bwd_BLOCK_N2": 32,
        },
    ]  # fmt: skip
    assert measured.error.startswith("InductorError: RuntimeError: No valid triton configs.")
    assert measured.note.startswith(
        "the default kernel options and 2 smaller sets ran out of resources; ran with "
        'kernel_options={"num_stages": 1, "fwd_BLOCK_M": 32,'
    )
    lines = bench.table([measured]).splitlines()
    assert lines[-2:] == [
        "note: t5 N=32 flex: " + measured.note,
        "error: t5 N=32 flex: " + measured.error,
    ]


def test_out_of_resources_reads_the_whole_chain():
    """Triton's OutOfResources counts wherever it is in the chain of causes
    (Inductor and Dynamo wrap it), and so do its words; other errors do not."""
    from triton.runtime.errors import OutOfResources

    try:
        try:
            raise OutOfResources(245760, 232448, "shared memory")
        except OutOfResources as exc:
            raise RuntimeError("backend='inductor' raised: compilation failed") from exc
    except RuntimeError as exc:
        wrapped = exc
    assert bench.out_of_resources(wrapped)
    assert bench.out_of_resources(InductorError(_OUT_OF_SHARED_MEMORY))
    assert bench.out_of_resources(RuntimeError("No valid triton configs"))
    assert not bench.out_of_resources(RuntimeError("backend='inductor' raised: compilation failed"))
    assert not bench.out_of_resources(torch.OutOfMemoryError("CUDA out of memory"))
    assert not bench.out_of_resources(ValueError("resource busy"))


def test_flops_count_v_by_its_own_head_dim():
    # MLA (d192, v 128): q.k at 192, p.v at 128; the backward's dQ, dK and q.k
    # at 192, dP and dV at 128.  At Dv = D the usual 4 B H N^2 D and 2.5 times it.
    m = bench.Measurement("m", "flashgen", 2, 4, 100, 192, 0.5, 1.0, 2.0, v_head_dim=128)
    assert bench.flop_count(m) == 2 * 2 * 4 * 100**2 * (192 + 128) * 0.5
    assert bench.flop_count(m, backward=True) == 2 * 2 * 4 * 100**2 * (3 * 192 + 2 * 128) * 0.5
    same = dataclasses.replace(m, v_head_dim=None)
    assert bench.flop_count(same) == 4 * 2 * 4 * 100**2 * 192 * 0.5
    assert bench.flop_count(same, True) == bench.BACKWARD_FLOP_FACTOR * bench.flop_count(same)
    assert m.tflops() == pytest.approx(bench.flop_count(m) / 1e-3 / 1e12)
