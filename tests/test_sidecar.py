"""Tuning sidecars as untrusted input: reading, the schema, and atomic writes
that never follow links (flashgen.sidecar)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from flashgen import sidecar
from flashgen.lower import LaunchConfig, Tuning
from flashgen.sidecar import (
    MAX_SIDECAR_BYTES,
    SidecarError,
    read_tuning,
    sidecar_path,
    write_tuning,
)

GOOD = {"device": "GPU", "forward": [64, 64, 4, 2], "backward": [64, 64, 4, 2]}
TUNING = Tuning("NVIDIA H200", LaunchConfig(128, 64, 8, 3), LaunchConfig(64, 128, 8, 2), 64, "bf16")
SPEC = "attention tiny { head_dim = 16; dtype = fp32; mask = causal }\n"


def _write(path: Path, document) -> Path:
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


def _entry(**changes):
    entry = {**GOOD, **changes}
    return {"blocks": {"x": [{k: v for k, v in entry.items() if v is not ...}]}}


def test_error_is_a_value_error_naming_the_path(tmp_path):
    path = _write(tmp_path / "x.tune.json", "[")
    with pytest.raises(SidecarError) as info:
        read_tuning(path)
    assert isinstance(info.value, ValueError)
    assert str(info.value).startswith(f"{path}: not a valid tuning file: not JSON")


def test_device_name_with_a_trailing_newline_is_rejected(tmp_path):
    """`^...$` matched "GPU\\n" (re's $ matches before a final newline); the
    name then broke the generated module's comment line."""
    path = _write(tmp_path / "x.tune.json", _entry(device="GPU\n"))
    with pytest.raises(SidecarError, match="device name 'GPU\\\\n'"):
        read_tuning(path)


def test_build_with_a_bad_device_name_is_a_clean_error(tmp_path, capsys):
    from flashgen.cli import main

    spec = tmp_path / "tiny.attn"
    spec.write_text(SPEC)
    entry = {**GOOD, "device": "GPU\n", "head_dim": 16, "dtype": "fp32"}
    _write(sidecar_path(spec), {"blocks": {"tiny": [entry]}})
    assert main(["build", str(spec), "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"flashgen: error: {sidecar_path(spec)}: not a valid tuning file")
    assert "Traceback" not in err and not (tmp_path / "out" / "tiny.py").exists()


def test_deep_nesting_is_rejected_before_json_recurses(tmp_path):
    path = _write(tmp_path / "x.tune.json", "[" * 100_000 + "]" * 100_000)
    with pytest.raises(SidecarError, match="nested deeper than 8"):
        read_tuning(path)


def test_brackets_inside_strings_do_not_count_as_nesting(tmp_path):
    path = _write(tmp_path / "x.tune.json", _entry(device="[" * 50))
    with pytest.raises(SidecarError, match="device name"):
        read_tuning(path)


def _in_thread(fn, timeout=20.0):
    """fn() in a daemon thread; fails the test if it has not returned in time
    (a hang must not hang the suite)."""
    outcome = {}

    def run():
        try:
            outcome["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "blocked"
    return outcome


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "x.tune.json"
    os.mkfifo(fifo)
    outcome = _in_thread(lambda: read_tuning(fifo))
    assert isinstance(outcome.get("error"), SidecarError)
    assert str(outcome["error"]) == f"{fifo}: not a regular file (a FIFO)"
    outcome = _in_thread(lambda: write_tuning(fifo, {"x": TUNING}))
    assert isinstance(outcome.get("error"), SidecarError)
    assert "not a regular file (a FIFO)" in str(outcome["error"])


def test_a_directory_is_reported_as_a_directory(tmp_path):
    path = tmp_path / "x.tune.json"
    path.mkdir()
    with pytest.raises(SidecarError, match=r"x\.tune\.json: is a directory, not a tuning file"):
        read_tuning(path)
    with pytest.raises(SidecarError, match="is a directory"):
        write_tuning(path, {"x": TUNING})
    assert path.is_dir() and not any(path.iterdir())


def test_an_oversized_file_is_refused(tmp_path):
    document = json.dumps(_entry())
    path = _write(
        tmp_path / "x.tune.json", " " * (MAX_SIDECAR_BYTES + 1 - len(document)) + document
    )
    with pytest.raises(SidecarError, match=f"larger than {MAX_SIDECAR_BYTES} bytes"):
        read_tuning(path)
    _write(path, " " * (MAX_SIDECAR_BYTES - len(document)) + document)  # at the limit: fine
    assert read_tuning(path)["x"][0].device == "GPU"


def test_non_utf8_is_refused(tmp_path):
    path = tmp_path / "x.tune.json"
    path.write_bytes(b'{"blocks": {"x": [{"device": "\xff"}]}}')
    with pytest.raises(SidecarError, match=r"not UTF-8 \(byte 30\)"):
        read_tuning(path)


@pytest.mark.parametrize(
    "document,problem",
    [
        ({"blocks": {"x": [GOOD]}, "extra": 1}, 'one key "blocks"'),
        ({"blocks": [GOOD]}, '"blocks" must be an object'),
        ({"blocks": {"x y": [GOOD]}}, "block name 'x y' is not an identifier"),
        ({"blocks": {"x": []}}, "does not hold a list"),
        ({"blocks": {"x": [[64, 64, 4, 2]]}}, "a tuning must be an object"),
        (_entry(backward=...), "a tuning lacks backward"),
        (_entry(comment="hi"), "unknown key 'comment'"),
        (_entry(device=7), "device name 7"),
        (_entry(device=""), "device name ''"),
        (_entry(device="x" * 65), "device name"),
        (_entry(device="GPU # \u00e9"), "device name"),
        (_entry(forward=[64, 64, 4]), "a config is"),
        (_entry(forward="64,64,4,2"), "a config is"),
        (_entry(forward=["64", 64, 4, 2]), "must be integers"),
        (_entry(forward=[64.0, 64, 4, 2]), "must be integers"),
        (_entry(forward=[64, 48, 4, 2]), "block size 48"),
        (_entry(forward=[8, 64, 4, 2]), "block size 8"),
        (_entry(forward=[512, 64, 4, 2]), "block size 512"),
        (_entry(forward=[64, 64, 3, 2]), "num_warps 3"),
        (_entry(forward=[64, 64, 32, 2]), "num_warps 32"),
        (_entry(forward=[64, 64, 4, 0]), "num_stages 0"),
        (_entry(forward=[64, 64, 4, 9]), "num_stages 9"),
        (_entry(head_dim=64), "head_dim and dtype must be given together"),
        (_entry(dtype="fp16"), "head_dim and dtype must be given together"),
        (_entry(head_dim="64", dtype="fp16"), "head_dim '64'"),
        (_entry(head_dim=12, dtype="fp16"), "head_dim 12"),
        (_entry(head_dim=1024, dtype="fp16"), "head_dim 1024"),
        (_entry(head_dim=64, dtype="fp8"), "dtype 'fp8'"),
        (_entry(forward_tma=1), "forward_tma and backward_tma"),
        (_entry(backward_tma="true"), "forward_tma and backward_tma"),
    ],
)
def test_schema_problems_are_named(tmp_path, document, problem):
    path = _write(tmp_path / "x.tune.json", document)
    with pytest.raises(SidecarError, match=f"{path}: not a valid tuning file: .*") as info:
        read_tuning(path)
    assert problem in str(info.value)


@pytest.mark.parametrize(
    "changes",
    [
        {"forward": [True, 64, 4, 2]},
        {"forward": [64, 64, 4, True]},  # True == 1 would pass a range check
        {"backward": [64, 64, True, 2]},
        {"head_dim": True, "dtype": "fp16"},
    ],
)
def test_a_boolean_is_not_an_integer(tmp_path, changes):
    path = _write(tmp_path / "x.tune.json", _entry(**changes))
    with pytest.raises(SidecarError, match="not a valid tuning file"):
        read_tuning(path)


@pytest.mark.parametrize(
    "text,problem",
    [
        ('{"blocks": {"x": [%s]}, "blocks": {}}', "key 'blocks' appears twice"),
        ('{"blocks": {"x": [{"device": "A", "device": "B"}]}}', "key 'device' appears twice"),
        ('{"blocks": {"x": [{"device": NaN}]}}', "NaN is not a JSON number"),
        ('{"blocks": {"x": [{"head_dim": 1%s}]}}' % ("0" * 5000), "digits"),
    ],
)
def test_json_that_python_would_accept_loosely_is_refused(tmp_path, text, problem):
    if "%s" in text:
        text = text % json.dumps(GOOD)
    path = _write(tmp_path / "x.tune.json", text)
    with pytest.raises(SidecarError, match="not a valid tuning file") as info:
        read_tuning(path)
    assert problem in str(info.value)


def test_missing_file_and_dangling_link_read_as_no_tuning(tmp_path):
    assert read_tuning(tmp_path / "none.tune.json") == {}
    link = tmp_path / "x.tune.json"
    link.symlink_to(tmp_path / "nowhere.json")
    assert read_tuning(link) == {}


def test_the_committed_example_sidecar_reads():
    root = Path(__file__).resolve().parents[1]
    tunings = read_tuning(root / "examples" / "encoder_band.tune.json")
    assert [t.head_dim for t in tunings["encoder_band"]] == [64, 128]


def test_write_round_trips_and_keeps_the_mode(tmp_path):
    path = tmp_path / "x.tune.json"
    write_tuning(path, {"x": TUNING})
    assert read_tuning(path) == {"x": (TUNING,)}
    path.chmod(0o600)
    other = Tuning("GPU", LaunchConfig(32, 32, 4, 1), LaunchConfig(32, 32, 4, 1), 128, "bf16")
    write_tuning(path, {"x": other})
    assert read_tuning(path) == {"x": (TUNING, other)}
    assert path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["x.tune.json"]  # no temporary left


def test_write_does_not_follow_a_dangling_symlink(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "planted.json"
    link = tmp_path / "x.tune.json"
    link.symlink_to(target)
    with pytest.raises(SidecarError, match=r"x\.tune\.json: is a symbolic link; not writing"):
        write_tuning(link, {"x": TUNING})
    assert not target.exists() and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outside", "x.tune.json"]


def test_write_does_not_follow_a_symlink_to_a_file(tmp_path):
    target = tmp_path / "real.json"
    target.write_text(json.dumps(_entry()))
    link = tmp_path / "x.tune.json"
    link.symlink_to(target)
    with pytest.raises(SidecarError, match="is a symbolic link"):
        write_tuning(link, {"x": TUNING})
    assert json.loads(target.read_text()) == _entry()


def test_the_temporary_file_is_never_a_planted_link(tmp_path, monkeypatch):
    """O_EXCL | O_NOFOLLOW: a link waiting under the temporary name is not
    written through (here the name is forced to collide)."""
    victim = tmp_path / "victim"
    victim.write_text("keep")
    monkeypatch.setattr(sidecar.secrets, "token_hex", lambda n: "fixed")
    (tmp_path / ".x.tune.json.fixed.tmp").symlink_to(victim)
    with pytest.raises(SidecarError, match="cannot write"):
        write_tuning(tmp_path / "x.tune.json", {"x": TUNING})
    assert victim.read_text() == "keep" and not (tmp_path / "x.tune.json").exists()


@pytest.mark.parametrize("fail", ["fsync", "replace"])
def test_a_failed_write_leaves_the_old_sidecar_intact(tmp_path, monkeypatch, fail):
    path = tmp_path / "x.tune.json"
    write_tuning(path, {"x": TUNING})
    before = path.read_bytes()

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sidecar.os, fail, broken)
    other = Tuning("GPU", LaunchConfig(32, 32, 4, 1), LaunchConfig(32, 32, 4, 1), 128, "bf16")
    with pytest.raises(SidecarError, match="cannot write: No space left on device"):
        write_tuning(path, {"x": other})
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["x.tune.json"]


def test_an_invalid_tuning_is_not_written(tmp_path):
    path = tmp_path / "x.tune.json"
    write_tuning(path, {"x": TUNING})
    before = path.read_bytes()
    bad = Tuning("GPU\nimport os", TUNING.forward, TUNING.backward)
    with pytest.raises(SidecarError, match="refusing to write an invalid tuning"):
        write_tuning(path, {"x": bad})
    with pytest.raises(SidecarError, match="block name"):
        write_tuning(path, {"not a name": TUNING})
    assert path.read_bytes() == before


def test_an_invalid_existing_sidecar_is_not_replaced(tmp_path):
    path = _write(tmp_path / "x.tune.json", "{ not json")
    with pytest.raises(SidecarError, match="not JSON"):
        write_tuning(path, {"x": TUNING})
    assert path.read_text() == "{ not json"


def test_sidecar_imports_neither_api_nor_tune():
    code = (
        "import sys, flashgen.sidecar\n"
        "bad = {'flashgen.api', 'flashgen.tune'} & set(sys.modules)\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
