"""`flashgen bench --random`: specs drawn from the language by seed (CPU parts).

The drawing is checked for what a recorded run needs to be reproduced (the
same seed gives the same specs, in this process and in a fresh one), the drawn
specs for what the bench needs (they check, round-trip through the printer and
have visible pairs); the command runs its whole pipeline on the CPU, kernels
under the Triton interpreter on tiny shapes and FlexAttention in eager mode,
with a stand-in timer, as tests/test_bench.py runs `flashgen bench`.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import warnings

import pytest
from hypothesis import strategies as st

from flashgen import bench, cli, ir
from flashgen.check import check
from flashgen.parse import parse
from flashgen.printer import print_variant
from flashgen.strategies import seeded_example, variants


def _texts(drawn: list[bench.Drawn]) -> list[str]:
    return [print_variant(d.variant) for d in drawn]


def _unnamed(drawn: list[bench.Drawn]) -> set[str]:
    """The specs' texts without their names (rand<seed>_<index>)."""
    return {print_variant(dataclasses.replace(d.variant, name="x")) for d in drawn}


def test_a_seed_draws_the_same_specs_whatever_their_number():
    first = bench.draw_variants(6, 0, 64)
    assert _texts(bench.draw_variants(6, 0, 64)) == _texts(first)
    assert _texts(bench.draw_variants(3, 0, 64)) == _texts(first)[:3]  # spec i of a seed is fixed
    assert [d.variant.name for d in first] == [f"rand0_{i}" for i in range(6)]
    assert [(d.seed, d.index) for d in first] == [(0, i) for i in range(6)]
    other = bench.draw_variants(6, 1, 64)
    assert len(_unnamed(other)) == 6 and not _unnamed(other) & _unnamed(first)
    # The head dim and the dtype change nothing else.
    again = bench.draw_variants(6, 0, 128, ir.DType.FP16)
    assert [dataclasses.replace(d.variant, head_dim=64, dtype=ir.DType.BF16) for d in again] == [
        d.variant for d in first
    ]


def test_a_key_draws_the_same_value_in_a_fresh_process(tmp_path):
    """`seeded_example` depends on its key alone: not on what the process
    imported (Hypothesis's own provider mixes in constants of the loaded
    modules), nor on this run's Hypothesis settings or earlier draws."""
    keys = [f"k:{i}" for i in range(8)]
    program = (
        "from hypothesis import strategies as st\n"
        "from flashgen import ir\n"
        "from flashgen.printer import print_variant\n"
        "from flashgen.strategies import seeded_example, variants\n"
        "strategy = variants((ir.DType.BF16,), (64,), names=st.just('r'))\n"
        f"for key in {keys!r}:\n"
        "    print(repr(print_variant(seeded_example(strategy, key))))\n"
    )
    fresh = subprocess.run(
        [sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    strategy = variants((ir.DType.BF16,), (64,), names=st.just("r"))
    here = [repr(print_variant(seeded_example(strategy, key))) for key in keys]
    assert here == fresh
    assert len(set(here)) == len(keys)


def test_drawn_specs_check_round_trip_and_span_the_language():
    drawn = bench.draw_variants(30, 7, 64)
    for d in drawn:
        v = d.variant
        assert not v.inputs and v.dtype is ir.DType.BF16 and v.head_dim == 64
        spec, diagnostics = parse(print_variant(v))
        assert not diagnostics
        assert check([spec]) == ((v,), [])
        assert bench.unbenchable(v) is None
    masks = " ".join(print_variant(d.variant).split("mask = ")[1].split("\n")[0] for d in drawn)
    scores = " ".join(print_variant(d.variant).split("score = ")[1].split("\n")[0] for d in drawn)
    for form in ("&", "|", "!", "causal", "window(", "chunk(", "prefix(", " % ", " div "):
        assert form in masks, form
    for form in ("alibi", "softcap(", "tanh(", "exp(", "log(", "sqrt(", "abs(", "min(", "max("):
        assert form in scores, form
    assert {d.variant.align for d in drawn} == set(ir.Align)


def _variant(text: str) -> ir.Variant:
    spec, diagnostics = parse(text)
    assert not diagnostics
    (variant,), diagnostics = check([spec])
    assert all(d.severity == "warning" for d in diagnostics), diagnostics  # `!full` is warned
    return variant


def test_unbenchable_specs_are_redrawn_and_the_output_says_so(monkeypatch):
    empty = _variant("attention e { head_dim = 64; dtype = bf16; mask = !full }")
    assert bench.unbenchable(empty) == "its mask hides every pair at N=512, H=16"
    reads = _variant(
        "attention d { doc: int32[B, Nk]; head_dim = 64; dtype = bf16; "
        "mask = doc[b, q] == doc[b, k] }"
    )
    assert bench.unbenchable(reads) == "it reads runtime inputs"
    assert bench.unbenchable(dataclasses.replace(empty, mask=ir.Name("causal"))) is None

    # Each index's first draw is refused: the second is taken, and said so.
    real = bench.unbenchable
    seen: list[str] = []

    def first_refused(variant):
        seen.append(variant.name)
        return "refused" if seen.count(variant.name) == 1 else real(variant)

    monkeypatch.setattr(bench, "unbenchable", first_refused)
    redrawn = bench.draw_variants(2, 0, 64)
    assert [d.redrawn for d in redrawn] == [("refused",), ("refused",)]
    monkeypatch.undo()
    kept = bench.draw_variants(2, 0, 64)
    assert _unnamed(redrawn).isdisjoint(_unnamed(kept))  # another draw, not the first again
    text = bench.describe_drawn(redrawn)
    assert text.startswith(
        "# rand0_0: seed 0, index 0\n# draw 0 redrawn: refused\nattention rand0_0 {"
    )
    # The description is an .attn file of the drawn blocks.
    spec, diagnostics = parse(text)
    assert not diagnostics and check([spec])[0] == tuple(d.variant for d in redrawn)


def _measurement(name, system, n, fwd_ms, bwd_ms, error="", host_ms=None):
    return bench.Measurement(
        name, system, batch=1, heads=2, seqlen=n, head_dim=64, density=0.5,
        fwd_ms=fwd_ms, bwd_ms=bwd_ms, error=error, host_ms=host_ms,
    )  # fmt: skip


def test_flex_ratios_per_point_with_median_and_minimum():
    results = [
        _measurement("rand0_0", "flashgen", 1024, 1.0, 2.0),
        _measurement("rand0_0", "flex", 1024, 2.0, 2.0),
        _measurement("rand0_0", "flashgen", 2048, 1.0, 2.0, host_ms=2.9),  # host-paced
        _measurement("rand0_0", "flex", 2048, 1.0, 4.0),
        _measurement("rand0_1", "flashgen", 1024, 1.0, 1.0),
        _measurement("rand0_1", "flex", 1024, 0.8, None, error="RuntimeError: no backward"),
        _measurement("rand0_1", "sdpa-cudnn", 1024, 1.0, 1.0),
    ]
    lines = bench.flex_ratios(results).splitlines()
    assert lines[0].startswith("flashgen / FlexAttention, TFLOP/s (target: every point >= 1.00")
    assert lines[3].split() == ["rand0_0", "64", "1024", "2.00", "1.00"]
    assert lines[4].split() == ["rand0_0", "64", "2048", "1.00h", "2.00h"]
    assert lines[5].split() == ["rand0_1", "64", "1024", "-", "-"]  # Flex failed there
    assert lines[6].split() == ["median", "1.50", "1.50"]
    assert lines[7].split() == ["minimum", "1.00", "1.00"]
    assert lines[8] == (
        "2 forward and 2 backward ratios over 3 points; "
        "lowest: forward rand0_0 d64 N=2048, backward rand0_0 d64 N=1024"
    )
    assert lines[9].startswith("- no ratio") and lines[10].startswith("h forward + backward")
    nothing = bench.flex_ratios(results[-1:]).splitlines()
    assert nothing[-3].split() == ["minimum", "-", "-"]
    assert nothing[-2] == "0 forward and 0 backward ratios over 1 points"


def test_bench_random_runs_on_the_cpu_and_records_each_drawn_spec(tmp_path, capsys, monkeypatch):
    """The command's whole path, kernels under the Triton interpreter and
    FlexAttention in eager mode: the drawn specs are printed as .attn text
    before the table, the ratios after it, and every record (--json, --jsonl)
    says which drawn spec it is, with the spec's text as benched."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(cli, "_require_gpu", lambda command: None)
    real_bench = bench.bench

    def on_the_cpu(variants, **kwargs):
        def timer(fn):  # a stand-in: the calls run, the time is a constant
            fn()
            return 2.0

        options = dict(kwargs, device="cpu", compile_flex=False, timer=timer, progress=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eager flex_attention warns it is unfused
            return real_bench(variants, **options)

    monkeypatch.setattr(bench, "bench", on_the_cpu)
    jsonl, json_path = tmp_path / "results.jsonl", tmp_path / "b.json"
    argv = [
        "bench", "--random", "2", "--seed", "3", "--name", "rand3_1", "--dtype", "fp16",
        "--head-dim", "16", "--seqlens", "32", "--heads", "2", "--batch", "1",
        "--systems", "flashgen", "flex", "--jsonl", str(jsonl), "--json", str(json_path),
    ]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    (drawn,) = bench.draw_variants(2, 3, 16, ir.DType.FP16)[1:]
    header = "# flashgen bench --random 2 --seed 3: specs drawn from the whole language, "
    assert out.startswith(header + "benched at head_dim 16\n" + bench.describe_drawn([drawn]))
    assert "rand3_0" not in out  # --name picks one drawn spec
    table, ratios = out.split("TFLOP/s forward / backward")[1].split("\n\n")
    assert "rand3_1" in table and "vs flex" in table
    assert ratios.startswith("flashgen / FlexAttention, TFLOP/s")
    assert [line.split()[:3] for line in ratios.splitlines() if "rand3_1" in line] == [
        ["rand3_1", "16", "32"]
    ]

    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert {(r["system"], r["direction"]) for r in records} == {
        (s, d) for s in ("flashgen", "flex") for d in ("fwd", "fwd+bwd")
    }
    text = print_variant(drawn.variant)
    for record in records:
        assert record["random"] == {"seed": 3, "index": 1, "text": text}
        assert list(record)[-1] == "random"
        assert (record["spec"], record["D"], record["dtype"]) == ("rand3_1", 16, "fp16")
        assert record["spec_hash"] == bench.spec_hash(_variant(record["random"]["text"]))
    assert records[0]["command"] == "python3 -m flashgen " + " ".join(argv)
    rows = json.loads(json_path.read_text())
    assert [row["random"] for row in rows] == [records[0]["random"]] * 2


def test_bench_random_needs_hypothesis(capsys, monkeypatch):
    """Without hypothesis (a test extra) --random is refused in one line,
    before anything runs, with no traceback."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "hypothesis" else find_spec(name, *a),
    )
    assert cli.main(["bench", "--random", "2"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "flashgen: error: bench --random needs hypothesis (pip install 'flashgen[test]')\n"
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench"], "bench: give SPEC files, or --random N to draw specs"),
        (["bench", "a.attn", "--random", "2"], "bench: give SPEC files or --random N, not both"),
        (["bench", "a.attn", "--seed", "1"], "bench: --seed goes with --random"),
        (["bench", "a.attn", "--dtype", "fp16"], "bench: --dtype goes with --random"),
    ],
)
def test_bench_random_usage_errors(capsys, argv, message):
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == f"flashgen: error: {message}\n"


def test_bench_random_options_are_checked_by_the_parser(capsys):
    for argv in (
        ["--random", "0"],
        ["--random", "2", "--seed", "-1"],
        ["--random", "2", "--dtype", "fp32"],
    ):
        assert cli.main(["bench", *argv]) == 2
        assert "usage: flashgen bench" in capsys.readouterr().err
