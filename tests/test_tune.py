"""`flashgen tune`: candidate search, the sidecar file, and freezing into modules.

The search runs here on tiny shapes under the interpreter with a stand-in timer
(GPU timings are what the real command measures); the sidecar is validated as
untrusted input.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from flashgen import ir, sidecar, tune
from flashgen.api import check_sources
from flashgen.emit import render_module
from flashgen.lower import LaunchConfig, Tuning
from flashgen.sidecar import SidecarError, read_tuning, sidecar_path, tuning_for, write_tuning

SPEC = "attention tiny { head_dim = 16; dtype = fp32; mask = causal }\n"


@pytest.fixture
def spec_file(tmp_path):
    path = tmp_path / "tiny.attn"
    path.write_text(SPEC)
    return path


def _variant(path):
    variants, _ = check_sources({str(path): path.read_text()})
    return variants[0]


@pytest.mark.parametrize("later_is_faster", [True, False])
def test_search_picks_the_fastest_candidate(spec_file, monkeypatch, later_is_faster):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    variant = _variant(spec_file)
    forward = [LaunchConfig(16, 16, 1, 1), LaunchConfig(32, 16, 1, 1)]
    backward = [LaunchConfig(16, 32, 1, 1), LaunchConfig(32, 32, 1, 1)]
    calls = []

    def timer(fn):
        fn()  # runs the kernels with the candidate's config
        calls.append(fn)
        # Each candidate looks faster (or slower) than the one before.
        return 1.0 / len(calls) if later_is_faster else float(len(calls))

    best, times = tune.tune(
        variant,
        seqlens=[40],
        batch=1,
        heads=2,
        device="cpu",
        timer=timer,
        forward_candidates=forward,
        backward_candidates=backward,
        device_name="Test GPU",
    )
    # 2 + 2 candidates, then TMA on and off (in that order) for each pass.
    assert len(calls) == 8
    pick = 1 if later_is_faster else 0
    tma = not later_is_faster
    assert best == Tuning(
        "Test GPU", forward[pick], backward[pick], variant.head_dim, variant.dtype.value, tma, tma
    )
    assert set(times["forward"]) == set(forward) and set(times["backward"]) == set(backward)
    source = render_module(variant, best)
    assert f"GPU_TMA = {tma}" in source and f"GPU_BWD_TMA = {tma}" in source


def test_candidates_that_fail_are_skipped(spec_file, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    variant = _variant(spec_file)
    good, bad = LaunchConfig(16, 16, 1, 1), LaunchConfig(24, 16, 1, 1)  # 24: not a power of 2
    best, times = tune.tune(
        variant,
        seqlens=[20],
        batch=1,
        heads=1,
        device="cpu",
        timer=lambda fn: (fn(), 1.0)[1],
        forward_candidates=[bad, good],
        backward_candidates=[good, bad],
        device_name="Test GPU",
    )
    assert best.forward == good and best.backward == good
    assert bad not in times["forward"]


def test_sidecar_round_trip_and_freeze(spec_file):
    variant = _variant(spec_file)
    tuning = Tuning("NVIDIA H200", LaunchConfig(128, 64, 8, 4), LaunchConfig(64, 128, 8, 2))
    write_tuning(sidecar_path(spec_file), {"tiny": tuning})
    assert sidecar_path(spec_file).name == "tiny.tune.json"
    assert read_tuning(sidecar_path(spec_file)) == {"tiny": (tuning,)}
    assert tuning_for(variant) == tuning
    source = render_module(variant, tuning_for(variant))
    assert "GPU_CONFIG = (128, 64, 8, 4)" in source
    assert "GPU_BWD_CONFIG = (64, 128, 8, 2)" in source
    assert "measured on NVIDIA H200 by `flashgen tune`" in source
    assert tuning_for(_variant(spec_file)) is not None
    assert render_module(variant) != source  # without the sidecar: defaults


GOOD_ENTRY = {"device": "GPU", "forward": [64, 64, 4, 2], "backward": [64, 64, 4, 2]}


@pytest.mark.parametrize(
    "entry",
    [
        {"device": "x\nimport os", "forward": [64, 64, 4, 2], "backward": [64, 64, 4, 2]},
        {"device": "GPU", "forward": [64, 64, 4], "backward": [64, 64, 4, 2]},
        {"device": "GPU", "forward": [64, 48, 4, 2], "backward": [64, 64, 4, 2]},
        {"device": "GPU", "forward": ["64", 64, 4, 2], "backward": [64, 64, 4, 2]},
        {"device": "GPU", "forward": [64, 64, 3, 2], "backward": [64, 64, 4, 2]},
        {"device": "GPU", "forward": [64, 64, 4, 2]},
        {"device": "GPU", "forward": [64, 64, 4, 2], "backward": [64, 64, 4, 2], "head_dim": "64"},
        {"device": "GPU", "forward": [64, 64, 4, 2], "backward": [64, 64, 4, 2], "dtype": "fp8"},
        {"device": "GPU", "forward": [64, 64, 4, 2], "backward": [64, 64, 4, 2], "forward_tma": 1},
    ],
)
def test_bad_sidecars_are_rejected(tmp_path, entry):
    path = tmp_path / "x.tune.json"
    for entries in (entry, [GOOD_ENTRY, entry]):  # the old single entry, and in a list
        path.write_text(json.dumps({"blocks": {"x": entries}}))
        with pytest.raises(SidecarError, match="not a valid tuning file"):
            read_tuning(path)


@pytest.mark.parametrize(
    "data",
    [
        {"blocks": []},
        {"blocks": {"x": []}},
        {"blocks": {"x": "GPU"}},
        {"blocks": {"x": [[64, 64, 4, 2]]}},
        {"blocks": {"x": [{**GOOD_ENTRY, "head_dim": True}]}},
    ],
)
def test_bad_sidecar_shapes_are_rejected(tmp_path, data):
    path = tmp_path / "x.tune.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SidecarError, match=f"{path}: not a valid tuning file"):
        read_tuning(path)


def test_two_tunings_of_one_head_dim_and_dtype_are_rejected(tmp_path):
    path = tmp_path / "x.tune.json"
    entry = {**GOOD_ENTRY, "head_dim": 64, "dtype": "bf16"}
    other = {**GOOD_ENTRY, "head_dim": 128, "dtype": "bf16"}
    path.write_text(json.dumps({"blocks": {"x": [entry, other]}}))
    assert len(read_tuning(path)["x"]) == 2
    path.write_text(json.dumps({"blocks": {"x": [entry, other, {**entry, "device": "B"}]}}))
    with pytest.raises(SidecarError, match="two tunings for head_dim 64, dtype bf16"):
        read_tuning(path)


def test_cli_build_uses_the_sidecar(spec_file, tmp_path, capsys):
    from flashgen.cli import main

    tuning = Tuning("GPU", LaunchConfig(32, 32, 4, 2), LaunchConfig(32, 32, 4, 1))
    write_tuning(sidecar_path(spec_file), {"tiny": tuning})
    out = tmp_path / "out"
    assert main(["build", str(spec_file), "-o", str(out)]) == 0
    assert "GPU_CONFIG = (32, 32, 4, 2)" in (out / "tiny.py").read_text()
    sidecar_path(spec_file).write_text("{ not json")
    assert main(["build", str(spec_file), "-o", str(out)]) == 1
    assert "not a valid tuning file" in capsys.readouterr().err


def test_tuning_applies_only_to_its_head_dim_and_dtype(spec_file):
    """`flashgen bench --head-dim` rebuilds a spec at other head dims: the
    configs measured for the spec's own head dim must not follow it there."""
    variant = _variant(spec_file)
    tuning = Tuning(
        "GPU",
        LaunchConfig(128, 64, 8, 4),
        LaunchConfig(64, 128, 8, 2),
        variant.head_dim,
        variant.dtype.value,
    )
    write_tuning(sidecar_path(spec_file), {"tiny": tuning})
    assert tuning_for(variant) == tuning
    assert tuning_for(dataclasses.replace(variant, head_dim=variant.head_dim * 2)) is None
    other = ir.DType.FP16 if variant.dtype is not ir.DType.FP16 else ir.DType.BF16
    assert tuning_for(dataclasses.replace(variant, dtype=other)) is None


def _tuning_at(variant, head_dim, block_m):
    config = LaunchConfig(block_m, 32, 4, 2)
    return Tuning("GPU", config, config, head_dim, variant.dtype.value)


def test_sidecar_holds_one_tuning_per_head_dim(spec_file):
    """`flashgen bench --head-dim 32` of a d16 spec finds the d32 tuning; a
    head dim never tuned gets none, and writing one head dim keeps the others."""
    variant = _variant(spec_file)
    at = {d: dataclasses.replace(variant, head_dim=d) for d in (16, 32, 64)}
    d32, d16 = _tuning_at(variant, 32, 64), _tuning_at(variant, 16, 16)
    path = sidecar_path(spec_file)
    write_tuning(path, {"tiny": d32})
    write_tuning(path, {"tiny": d16, "other": d32})
    assert read_tuning(path) == {"tiny": (d16, d32), "other": (d32,)}  # by head dim
    assert [e["head_dim"] for e in json.loads(path.read_text())["blocks"]["tiny"]] == [16, 32]
    assert tuning_for(at[16]) == d16 and tuning_for(at[32]) == d32
    assert tuning_for(at[64]) is None
    assert "GPU_CONFIG = (64, 32, 4, 2)" in render_module(at[32], tuning_for(at[32]))
    # Tuning d32 again replaces only that entry.
    new_d32 = _tuning_at(variant, 32, 128)
    write_tuning(path, {"tiny": new_d32})
    assert read_tuning(path)["tiny"] == (d16, new_d32)


def test_a_legacy_sidecar_still_reads(spec_file):
    """A sidecar from before one entry per head dim: a single entry per block,
    which applies to any head dim if it names none."""
    variant = _variant(spec_file)
    legacy = {**GOOD_ENTRY, "forward_tma": True}
    sidecar_path(spec_file).write_text(json.dumps({"blocks": {"tiny": legacy}}))
    tuning = Tuning("GPU", LaunchConfig(64, 64, 4, 2), LaunchConfig(64, 64, 4, 2), None, None, True)
    assert read_tuning(sidecar_path(spec_file)) == {"tiny": (tuning,)}
    assert tuning_for(dataclasses.replace(variant, head_dim=128)) == tuning
    # A tuning of the variant's own head dim wins over the legacy one.
    own = _tuning_at(variant, variant.head_dim, 32)
    write_tuning(sidecar_path(spec_file), {"tiny": own})
    assert read_tuning(sidecar_path(spec_file))["tiny"] == (tuning, own)
    assert tuning_for(variant) == own
    assert tuning_for(dataclasses.replace(variant, head_dim=128)) == tuning


def test_cli_tunes_each_head_dim(spec_file, monkeypatch, capsys):
    """`flashgen tune --head-dim 16 32` tunes the d16 block rebuilt at each
    head dim (on the CPU here, with a stand-in timer) and saves one entry each;
    without --head-dim it tunes the spec's own."""
    import torch

    from flashgen.cli import main

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real_tune, seen = tune.tune, []

    def on_cpu(variant, **kwargs):
        seen.append((variant.head_dim, variant.path))
        config = LaunchConfig(16, 16, 1, 1)
        kwargs.update(device="cpu", seqlens=[20], batch=1, heads=1, device_name="Test GPU")
        kwargs.update(forward_candidates=[config], backward_candidates=[config])
        return real_tune(variant, timer=lambda fn: (fn(), 1.0)[1], **kwargs)

    monkeypatch.setattr(tune, "tune", on_cpu)
    assert main(["tune", str(spec_file), "--head-dim", "32", "16"]) == 0
    assert seen == [(32, str(spec_file)), (16, str(spec_file))]
    out = capsys.readouterr().out
    assert "tiny d32: forward [16, 16, 1, 1]" in out and "tiny d16: forward" in out
    tunings = read_tuning(sidecar_path(spec_file))["tiny"]
    assert [t.head_dim for t in tunings] == [16, 32]
    assert main(["tune", str(spec_file), "--passes", "backward"]) == 0
    assert seen[2:] == [(16, str(spec_file))]
    assert [t.head_dim for t in read_tuning(sidecar_path(spec_file))["tiny"]] == [16, 32]


def test_a_pass_left_out_keeps_the_module_config(spec_file, monkeypatch):
    """`flashgen tune --passes backward`: the forward config and TMA choice
    stay those of the module (from its sidecar here), and only the backward
    candidates (and its TMA on/off) are timed."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    variant = _variant(spec_file)
    kept = LaunchConfig(32, 16, 2, 2)
    write_tuning(
        sidecar_path(spec_file),
        {"tiny": Tuning("Old GPU", kept, kept, variant.head_dim, variant.dtype.value, True, True)},
    )
    backward = [LaunchConfig(16, 32, 1, 1), LaunchConfig(32, 32, 1, 1)]
    calls = []
    best, times = tune.tune(
        variant,
        seqlens=[20],
        batch=1,
        heads=1,
        device="cpu",
        timer=lambda fn: (fn(), calls.append(fn), 1.0 / len(calls))[2],
        forward_candidates=[LaunchConfig(16, 16, 1, 1)],
        backward_candidates=backward,
        device_name="Test GPU",
        passes=["backward"],
    )
    assert len(calls) == 4 and times["forward"] == {}
    assert (best.forward, best.forward_tma) == (kept, True)
    assert (best.backward, best.backward_tma) == (backward[1], False)
    with pytest.raises(ValueError, match="passes"):
        tune.tune(variant, device="cpu", passes=["sideways"])


def test_quick_candidates_are_valid_configs():
    for config in tune.QUICK_FORWARD_CANDIDATES + tune.QUICK_BACKWARD_CANDIDATES:
        assert sidecar.parse_config(sidecar.as_list(config)) == config
    assert set(tune.QUICK_FORWARD_CANDIDATES) <= set(tune.FORWARD_CANDIDATES)
    assert set(tune.QUICK_BACKWARD_CANDIDATES) <= set(tune.BACKWARD_CANDIDATES)


def _tiny_tune(variant, **kwargs):
    """tune.tune on the CPU at one tiny shape, every candidate timed alike (a
    tie: the candidate listed first is tried first)."""
    settings = dict(
        seqlens=[20], batch=1, heads=1, device="cpu", timer=lambda fn: (fn(), 1.0)[1],
        device_name="Test GPU",
    )  # fmt: skip
    return tune.tune(variant, **{**settings, **kwargs})


class _WrongAt:
    """A generated module whose forward (or backward) is off wherever it runs
    at block_m = `block_m`: a stand-in for a launch configuration that a
    compiler assembles wrong (decision 086)."""

    def __init__(self, module, which: str, block_m: int):
        self._module, self._which, self._block_m = module, which, block_m

    def __getattr__(self, name):
        return getattr(self._module, name)

    def forward(self, *args, **kwargs):
        o, lse = self._module.forward(*args, **kwargs)
        if self._which == "forward" and kwargs.get("block_m") == self._block_m:
            o = o + 0.5
        return o, lse

    def backward(self, *args, **kwargs):
        dq, dk, dv, *rest = self._module.backward(*args, **kwargs)
        if self._which == "backward" and kwargs.get("block_m") == self._block_m:
            dk = dk * 1.5
        return (dq, dk, dv, *rest)


@pytest.mark.parametrize("which", ["forward", "backward"])
def test_a_fast_candidate_that_computes_wrong_is_passed_over(spec_file, monkeypatch, which):
    """The fastest config is taken only once the float64 reference agrees
    with it; a wrong one is named, and the next fastest is taken."""
    from flashgen import api

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    load = api.load_variant
    monkeypatch.setattr(api, "load_variant", lambda v, *a: _WrongAt(load(v, *a), which, 32))
    variant = _variant(spec_file)
    right, wrong = LaunchConfig(16, 16, 1, 1), LaunchConfig(32, 16, 1, 1)
    said = []
    best, times = _tiny_tune(
        variant,
        forward_candidates=[wrong, right] if which == "forward" else [right],
        backward_candidates=[wrong, right] if which == "backward" else [right],
        warn=said.append,
    )
    assert best.forward == right and best.backward == right
    assert wrong in times[which]  # it ran, and was timed
    (message,) = said
    assert message.startswith(f"tiny: {which} (32, 16, 1, 1) passed over: wrong at B=1 H=2/1")
    assert ("o off by" if which == "forward" else "dk off by") in message


def test_no_right_candidate_is_an_error(spec_file, monkeypatch):
    from flashgen import api

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    load = api.load_variant
    monkeypatch.setattr(api, "load_variant", lambda v, *a: _WrongAt(load(v, *a), "backward", 16))
    with pytest.raises(
        RuntimeError, match="tiny: no backward candidate that ran computed the right"
    ):
        _tiny_tune(
            _variant(spec_file),
            forward_candidates=[LaunchConfig(16, 16, 1, 1)],
            backward_candidates=[LaunchConfig(16, 16, 1, 1), LaunchConfig(16, 32, 1, 1)],
        )


def test_a_candidate_that_loses_the_device_ends_the_search(spec_file, monkeypatch):
    """After a fault that loses the CUDA context every later launch fails
    too, so the search stops and names the candidate instead of timing
    the rest as failures (stood in for here by a config that cannot
    compile and a context that reads as lost)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(tune, "_context_alive", lambda device: False)
    with pytest.raises(RuntimeError, match=r"tiny: the forward candidate \(24, 16, 1, 1\) faulted"):
        _tiny_tune(
            _variant(spec_file),
            forward_candidates=[LaunchConfig(16, 16, 1, 1), LaunchConfig(24, 16, 1, 1)],
            backward_candidates=[LaunchConfig(16, 16, 1, 1)],
        )


@pytest.mark.parametrize("alive", [True, False])
def test_a_check_that_raises_passes_the_candidate_over_or_ends_the_search(
    spec_file, monkeypatch, alive
):
    """The check runs the candidate at shapes of its own: an error there
    passes it over (named), unless the GPU was lost with it."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    first, second = LaunchConfig(16, 16, 1, 1), LaunchConfig(32, 16, 1, 1)
    checked = []

    def check(variant, module, name, config, tma, device):
        checked.append((name, config))
        if (name, config) == ("backward", first):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return None

    monkeypatch.setattr(tune, "check_config", check)
    monkeypatch.setattr(tune, "_context_alive", lambda device: alive)
    said = []
    run = lambda: _tiny_tune(  # noqa: E731
        _variant(spec_file),
        forward_candidates=[first],
        backward_candidates=[first, second],
        warn=said.append,
    )
    if not alive:
        with pytest.raises(RuntimeError, match=r"backward candidate \(16, 16, 1, 1\) faulted"):
            run()
        return
    best, _ = run()
    assert best.backward == second
    assert checked == [("forward", first), ("backward", first), ("backward", second)]
    assert said == [
        "tiny: backward (16, 16, 1, 1) passed over: RuntimeError: CUDA error: an illegal "
        "memory access was encountered"
    ]
