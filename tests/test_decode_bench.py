"""`flashgen bench --decode` (flashgen/decode_bench.py): the grid, the systems
that can run each point, bandwidth from time, the comparison with flashgen's
output, and the command line with its records."""

from __future__ import annotations

import json

import pytest
import torch

from flashgen import decode_bench
from flashgen.check import check
from flashgen.cli import main
from flashgen.parse import parse
from flashgen.reference import attention_ref


def _variant(text: str):
    spec, diags = parse(text)
    assert not diags
    (variant,), diags = check([spec])
    assert not diags
    return variant


def test_points_skip_caches_beyond_the_limit():
    grid = decode_bench.points((1, 128), (1024, 131072), (1, 4))
    assert (128, 131072, 1) not in grid  # 2^24 tokens
    assert (1, 131072, 4) in grid and (128, 1024, 1) in grid
    assert all(b * nk <= decode_bench.MAX_CACHED_TOKENS for b, nk, _ in grid)


def test_sdpa_runs_only_what_it_computes():
    full = _variant("attention a { head_dim = 16; dtype = fp32; mask = full }")
    causal = _variant("attention a { head_dim = 16; dtype = fp32; mask = causal }")
    soft = _variant("attention a { head_dim = 16; dtype = fp32; score = softcap(s, 5.0) }")
    assert decode_bench.sdpa_expressible(full, 4)
    assert decode_bench.sdpa_expressible(causal, 1)  # one row sees every key
    assert not decode_bench.sdpa_expressible(causal, 4)  # SDPA's causal is top-left
    assert not decode_bench.sdpa_expressible(soft, 1)


@pytest.mark.kernels  # the module's decode path on the interpreter
def test_bench_decode_times_every_point_and_compares_the_outputs():
    variant = _variant("attention w { head_dim = 16; dtype = fp32; mask = causal & window(20) }")
    full = _variant("attention f { head_dim = 16; dtype = fp32; mask = full }")
    seen = []
    results = decode_bench.bench_decode(
        [variant, full], batches=(1, 2), n_keys=(45,), n_queries=(1, 3), heads=4, kv_heads=2,
        systems=("flashgen", "sdpa-flash"), timer=lambda fn: 0.5, device="cpu", progress=False,
        on_result=seen.append,
    )  # fmt: skip
    assert seen == results
    ours = [r for r in results if r.system == "flashgen"]
    assert len(ours) == 2 * 2 * 2 and not any(r.error for r in ours)
    # SDPA only for the full mask (the window is no SDPA mask).
    sdpa = [r for r in results if r.system == "sdpa-flash"]
    assert {r.variant for r in sdpa} == {"f"} and len(sdpa) == 4
    for r in ours:
        assert r.cache_bytes == 2 * r.batch * 2 * 45 * 16 * 4  # K and V, fp32
        assert r.tb_per_s == pytest.approx(r.cache_bytes / 0.5 / 1e9)
    for r in sdpa:  # flashgen's output agrees with SDPA's (torch's CPU flash kernel)
        assert not r.error and r.max_diff < 1e-5
    # flashgen's outputs are the spec's: a point rerun against the reference.
    module = __import__("flashgen").load(
        "attention w { head_dim = 16; dtype = fp32; mask = causal & window(20) }"
    )
    gen = torch.Generator(device="cpu").manual_seed(45 + 2)
    q = torch.randn(2, 4, 3, 16, generator=gen)
    k, v = (torch.randn(2, 2, 45, 16, generator=gen) for _ in "kv")
    with torch.no_grad():
        o = module.attention(q, k, v)
    ref = attention_ref(variant, q.double(), k.double(), v.double())[0]
    assert (o.double() - ref).abs().max() < 1e-5


@pytest.mark.kernels  # the module's cache path on the interpreter
def test_bench_decode_times_paged_caches_against_the_contiguous_output():
    variant = _variant("attention c { head_dim = 16; dtype = fp32; mask = causal }")
    results = decode_bench.bench_decode(
        [variant], batches=(2,), n_keys=(64,), n_queries=(1, 3), heads=4, kv_heads=2,
        systems=("flashgen",), timer=lambda fn: 0.5, device="cpu", progress=False,
        page_sizes=(16, 32, 48),
    )  # fmt: skip
    layouts = [(r.n_queries, r.layout) for r in results]
    assert layouts == [
        (nq, layout) for nq in (1, 3) for layout in ("contiguous", "paged16", "paged32", "paged48")
    ]
    for r in results:
        if r.layout == "paged48":  # 64 keys are no whole number of pages
            assert "multiple of the page size" in r.error
        elif r.layout != "contiguous":  # the same keys in shuffled pages: the same output
            assert not r.error and r.max_diff < 1e-6


def test_pages_hold_the_cache_in_the_order_given():
    k = torch.arange(2 * 3 * 8 * 2, dtype=torch.float32).view(2, 3, 8, 2)
    order = torch.tensor([3, 0, 2, 1])
    pages = decode_bench.paged(k, 4, order)
    assert pages.shape == (4, 4, 3, 2)
    for b in range(2):
        for j in range(2):  # page j of row b holds keys 4j .. 4j + 3, heads in dim 2
            page = pages[order[b * 2 + j]]
            assert torch.equal(page, k[b, :, 4 * j : 4 * j + 4].transpose(0, 1))


def test_bench_decode_command_line_writes_records_as_taken(tmp_path, monkeypatch, capsys):
    spec = tmp_path / "a.attn"
    spec.write_text("attention tiny { head_dim = 16; dtype = bf16; mask = causal }\n")
    out = tmp_path / "decode.jsonl"
    calls = []

    def fake(variants, **kwargs):
        calls.append(kwargs)
        m = decode_bench.DecodeMeasurement(
            "tiny", "flashgen", "contiguous", batch=1, n_keys=1024, n_queries=1, heads=32,
            kv_heads=8, head_dim=128, ms=0.01, cache_bytes=4 * 10**9,
        )  # fmt: skip
        kwargs["on_result"](m)
        assert len(out.read_text().splitlines()) == 1  # on the file before the run ends
        return [m]

    monkeypatch.setattr(decode_bench, "bench_decode", fake)
    monkeypatch.setattr("flashgen.cli._require_gpu", lambda command: None)
    argv = ["bench", str(spec), "--decode", "--batches", "1", "--seqlens", "1024",
            "--queries", "1", "--head-dim", "128", "--jsonl", str(out)]  # fmt: skip
    assert main(argv) == 0
    (kwargs,) = calls
    assert (kwargs["batches"], kwargs["n_keys"], kwargs["n_queries"]) == ([1], [1024], [1])
    assert (kwargs["heads"], kwargs["kv_heads"], kwargs["head_dim"]) == (32, 8, 128)
    (record,) = map(json.loads, out.read_text().splitlines())
    assert record["direction"] == "decode" and record["system"] == "flashgen"
    assert record["tb_per_s"] == pytest.approx(400.0) and record["dtype"] == "bf16"
    assert record["command"].endswith("--jsonl " + str(out))
    assert "400.00" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["--batches", "1"],  # decode options without --decode
        ["--decode", "--random", "3"],
        ["--decode", "--batch", "4"],
    ],
)
def test_bench_decode_usage_errors(tmp_path, argv, capsys):
    spec = tmp_path / "a.attn"
    spec.write_text("attention tiny { head_dim = 16; dtype = bf16; mask = causal }\n")
    assert main(["bench", str(spec), *argv]) == 2
    assert "bench" in capsys.readouterr().err
