"""The `flashgen` command: exit codes, output, and what it writes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import flashgen
from flashgen import api, cli, ir, verify

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((REPO / "examples").glob("*.attn"))

TINY = """\
# a small spec
attention tiny {
    head_dim = 16
    dtype = fp32
    mask = causal
}
"""
BAD = """\
attention broken {
    head_dim = 16
    dtype = bf17
    mask = window(-3)
}
"""


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def specs(tmp_path):
    """tiny.attn and bad.attn in a temporary directory."""
    (tmp_path / "tiny.attn").write_text(TINY)
    (tmp_path / "bad.attn").write_text(BAD)
    return tmp_path


def _age(path: Path) -> int:
    stat = path.stat()
    old = stat.st_mtime_ns - 3600 * 10**9
    os.utime(path, ns=(stat.st_atime_ns, old))
    return old


# --------------------------------------------------------------------------- #
# check
# --------------------------------------------------------------------------- #


def test_check_examples_ok(capsys):
    assert len(EXAMPLES) >= 9
    code, out, err = run(capsys, "check", *EXAMPLES)
    assert (code, err) == (0, "")
    assert out == f"ok: {len(EXAMPLES)} attention blocks in {len(EXAMPLES)} files\n"


def test_check_singular(capsys, specs):
    assert run(capsys, "check", specs / "tiny.attn") == (
        0,
        "ok: 1 attention block in 1 file\n",
        "",
    )


def test_check_reports_every_problem_of_every_file(capsys, specs):
    (specs / "bad2.attn").write_text("attention x {\n    head_dim = 16\n}\n")
    code, out, err = run(capsys, "check", specs / "bad.attn", specs / "bad2.attn")
    assert (code, out) == (1, "")
    assert f"{specs / 'bad.attn'}:3:13: error: unknown dtype 'bf17'" in err
    assert f"{specs / 'bad.attn'}:4:19: error: window size" in err
    assert f"{specs / 'bad2.attn'}:" in err
    assert "    dtype = bf17\n" in err and "^^^^" in err


def test_unreadable_files_get_one_line_each(capsys, specs):
    code, out, err = run(capsys, "check", specs / "tiny.attn", "missing.attn", specs)
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "flashgen: error: cannot read 'missing.attn': No such file or directory",
        f"flashgen: error: cannot read '{specs}': Is a directory",
    ]


def test_not_utf8(capsys, specs):
    """Bytes that are not UTF-8 are the spec's problem: a diagnostic at the
    first bad byte (shown as U+FFFD), exit 1, like any other spec error."""
    (specs / "latin1.attn").write_bytes(b"attention t {}\n# caf\xe9\n")
    code, out, err = run(capsys, "check", specs / "latin1.attn")
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        f"{specs / 'latin1.attn'}:2:6: error: the spec is not UTF-8 text",
        "    # caf\ufffd",
        "         ^",
    ]


def test_a_fifo_spec_is_refused_without_blocking(capsys, specs):
    fifo = specs / "fifo.attn"
    os.mkfifo(fifo)
    result = {}
    thread = threading.Thread(target=lambda: result.update(code=cli.main(["check", str(fifo)])))
    thread.daemon = True
    thread.start()
    thread.join(20)
    if thread.is_alive():  # unblock the reader before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("flashgen check blocked on a FIFO")
    _, err = capsys.readouterr()
    assert result["code"] == 2
    assert err == f"flashgen: error: cannot read '{fifo}': not a regular file (a FIFO)\n"


def test_a_device_or_an_oversized_spec_is_refused(capsys, specs):
    big = specs / "big.attn"
    big.write_text(TINY + "#" * ir.MAX_SPEC_BYTES + "\n")
    code, out, err = run(capsys, "check", "/dev/null", specs / "tiny.attn")
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "flashgen: error: cannot read '/dev/null': not a regular file (a character device)",
    ]
    # Too large is the spec's own problem: a diagnostic where the limit is crossed.
    code, out, err = run(capsys, "check", big, specs / "tiny.attn")
    assert (code, out) == (1, "")
    last_line = 1 + TINY.count("\n")
    column = ir.MAX_SPEC_BYTES - len(TINY) + 1
    assert err.splitlines()[0] == (
        f"{big}:{last_line}:{column}: error: the spec is larger than {ir.MAX_SPEC_BYTES} "
        "bytes, the limit"
    )


@pytest.mark.parametrize(
    "argv",
    [[], ["frobnicate"], ["check"], ["verify", "x.attn", "--examples", "0"]],
)
def test_usage_errors_exit_2(capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert "usage: flashgen" in err


def test_an_unknown_option_is_named(capsys):
    code, _, err = run(capsys, "--bogus")
    assert code == 2
    assert err.splitlines()[-1] == "flashgen: error: unrecognized arguments: --bogus"
    code, _, err = run(capsys, "--bogus", "check", "x.attn")
    assert (code, err.splitlines()[-1]) == (2, "flashgen: error: unrecognized arguments: --bogus")
    code, _, err = run(capsys)
    assert err.splitlines()[-1].startswith("flashgen: error: a COMMAND is required: one of check")


def test_a_bad_number_says_what_is_expected(capsys):
    code, _, err = run(capsys, "verify", "x.attn", "--examples", "abc")
    assert code == 2
    assert "argument --examples: expected a positive integer, got 'abc'" in err
    assert "_positive" not in err


def test_an_empty_output_directory_is_refused(capsys, specs, monkeypatch):
    monkeypatch.chdir(specs)
    code, out, err = run(capsys, "build", "tiny.attn", "-o", "")
    assert (code, out) == (2, "")
    assert "argument -o/--out: expected a directory name, got an empty string" in err
    assert not (specs / "generated").exists()


def test_version_and_help(capsys):
    assert run(capsys, "--version") == (0, f"flashgen {flashgen.__version__}\n", "")
    code, out, _ = run(capsys, "build", "--help")
    assert code == 0 and "--check" in out


def test_no_traceback_for_a_bad_spec_in_a_real_process(specs):
    # Import the same flashgen as this test does, whether installed or not.
    env = dict(os.environ, PYTHONPATH=str(Path(flashgen.__file__).parent.parent))
    result = subprocess.run(
        [sys.executable, "-m", "flashgen", "check", "bad.attn"],
        cwd=specs,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "bad.attn:3:13: error:" in result.stderr
    assert result.stdout == ""


# --------------------------------------------------------------------------- #
# build
# --------------------------------------------------------------------------- #


@pytest.mark.kernels  # builds every example: 10-20 s each on 2 cores
def test_build_writes_one_module_per_block_and_is_idempotent(capsys, tmp_path):
    out_dir = tmp_path / "out"
    code, out, err = run(capsys, "build", *EXAMPLES, "-o", out_dir)
    assert (code, err) == (0, "")
    names = sorted(p.stem for p in EXAMPLES)
    assert sorted(p.stem for p in out_dir.glob("*.py")) == names
    assert out.splitlines() == [f"wrote {out_dir / n}.py" for n in names]
    assert (out_dir / "full.py").read_text() == flashgen.build_source(REPO / "examples/full.attn")

    mtimes = {p: _age(p) for p in out_dir.glob("*.py")}
    code, out, _ = run(capsys, "build", *EXAMPLES, "-o", out_dir)
    assert code == 0
    assert out.splitlines() == [f"unchanged {out_dir / n}.py" for n in names]
    assert {p: p.stat().st_mtime_ns for p in out_dir.glob("*.py")} == mtimes


def test_build_rewrites_only_what_changed(capsys, specs):
    (specs / "full.attn").write_text("attention full {\n head_dim = 16\n dtype = fp32\n}\n")
    out_dir = specs / "out"
    run(capsys, "build", specs / "tiny.attn", specs / "full.attn", "-o", out_dir)
    (specs / "tiny.attn").write_text(TINY.replace("causal", "window(4)"))
    code, out, _ = run(capsys, "build", specs / "tiny.attn", specs / "full.attn", "-o", out_dir)
    assert code == 0
    assert out.splitlines() == [f"wrote {out_dir / 'tiny.py'}", f"unchanged {out_dir / 'full.py'}"]
    assert "window(4)" in (out_dir / "tiny.py").read_text()


def test_build_writes_nothing_when_any_spec_is_bad(capsys, specs):
    out_dir = specs / "out"
    code, out, err = run(capsys, "build", specs / "tiny.attn", specs / "bad.attn", "-o", out_dir)
    assert (code, out) == (1, "")
    assert "error: unknown dtype 'bf17'" in err
    assert not out_dir.exists()


def test_build_with_specs_needs_an_output_directory(capsys, specs):
    code, _, err = run(capsys, "build", specs / "tiny.attn")
    assert code == 2
    assert err == "flashgen: error: build: -o DIR is required when SPECs are given\n"


def test_build_never_overwrites_a_file_it_did_not_generate(capsys, specs):
    # `attention setup` must not replace a hand-written setup.py; the run
    # writes nothing at all, not even the modules that would be safe.
    (specs / "two.attn").write_text(
        TINY.replace("tiny", "setup") + TINY.replace("# a small spec\n", "")
    )
    project = specs / "proj"
    project.mkdir()
    (project / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    code, out, err = run(capsys, "build", specs / "two.attn", "-o", project)
    assert (code, out) == (1, "")
    assert err == (
        f"flashgen: error: cannot write '{project / 'setup.py'}': exists and was not generated "
        "by flashgen (it does not begin with '# @generated by flashgen'); move it away or "
        "write elsewhere\n"
    )
    assert (project / "setup.py").read_text() == "from setuptools import setup\nsetup()\n"
    assert sorted(p.name for p in project.iterdir()) == ["setup.py"]


def test_build_checks_every_target_before_writing_any(capsys, specs):
    # Before, a.py was written and then the run failed on b.py.
    (specs / "ab.attn").write_text(
        TINY.replace("tiny", "a") + TINY.replace("tiny", "b").replace("# a small spec\n", "")
    )
    out_dir = specs / "out"
    (out_dir / "b.py").mkdir(parents=True)
    code, out, err = run(capsys, "build", specs / "ab.attn", "-o", out_dir)
    assert (code, out) == (1, "")
    assert f"cannot write '{out_dir / 'b.py'}': is a directory" in err
    assert not (out_dir / "a.py").exists()


def test_build_check_reports_a_foreign_file(capsys, specs):
    out_dir = specs / "out"
    out_dir.mkdir()
    (out_dir / "tiny.py").write_text("hand-written\n")
    code, out, _ = run(capsys, "build", specs / "tiny.attn", "-o", out_dir, "--check")
    assert code == 1
    assert out.startswith(f"foreign: {out_dir / 'tiny.py'} (exists and was not generated")


def test_a_bad_tuning_sidecar_is_one_error_line(capsys, specs, monkeypatch):
    def bad_sidecar(variant):
        raise ValueError(f"{specs / 'tiny.tune.json'}: not a valid tuning file")

    # Whatever ValueError flashgen.tune raises for a sidecar, no traceback.
    monkeypatch.setattr(cli, "tuning_for", bad_sidecar)
    code, out, err = run(capsys, "build", specs / "tiny.attn", "-o", specs / "out")
    assert (code, out) == (1, "")
    assert err == f"flashgen: error: {specs / 'tiny.tune.json'}: not a valid tuning file\n"
    assert not (specs / "out").exists()


def test_output_the_terminal_cannot_encode_is_escaped(specs):
    env = dict(
        os.environ,
        PYTHONPATH=str(Path(flashgen.__file__).parent.parent),
        PYTHONIOENCODING="ascii",
    )
    result = subprocess.run(
        [sys.executable, "-m", "flashgen", "build", "tiny.attn", "-o", "caf\u00e9"],
        cwd=specs,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == "wrote caf\\xe9/tiny.py\n"
    assert (specs / "caf\u00e9" / "tiny.py").is_file()


def test_build_reports_an_unwritable_output(capsys, specs):
    (specs / "file").write_text("")
    code, out, err = run(capsys, "build", specs / "tiny.attn", "-o", specs / "file")
    assert code == 1
    assert err.startswith("flashgen: error: cannot write")
    assert "Traceback" not in err


@pytest.fixture
def repo_copy(tmp_path, monkeypatch):
    """A copy of examples/ and generated/, with generated/ rebuilt, as cwd."""
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    if (REPO / "generated").is_dir():
        shutil.copytree(REPO / "generated", tmp_path / "generated")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["build"]) == 0
    return tmp_path


@pytest.mark.kernels  # builds every example: 10-20 s each on 2 cores
def test_build_check_passes_when_current(capsys, repo_copy):
    capsys.readouterr()
    code, out, err = run(capsys, "build", "--check")
    assert (code, err) == (0, "")
    assert out == f"ok: {len(EXAMPLES)} modules in generated/ up to date\n"


@pytest.mark.kernels  # builds every example: 10-20 s each on 2 cores
def test_build_check_lists_every_out_of_date_module(capsys, repo_copy):
    generated = repo_copy / "generated"
    (generated / "full.py").write_text((generated / "full.py").read_text() + "# edited\n")
    (generated / "custom.py").unlink()
    shutil.copy(generated / "prefix_lm.py", generated / "old_block.py")
    (generated / "__init__.py").write_text("")  # not @generated: not stale
    mtime = _age(generated / "full.py")
    capsys.readouterr()

    code, out, err = run(capsys, "build", "--check")
    assert code == 1
    assert out.splitlines() == [
        "missing: generated/custom.py",
        "different: generated/full.py",
        "stale: generated/old_block.py (no attention block 'old_block' in the specs)",
    ]
    assert "3 modules out of date" in err
    assert (generated / "full.py").stat().st_mtime_ns == mtime  # --check writes nothing
    assert not (generated / "custom.py").exists()


@pytest.mark.kernels  # builds every example: 10-20 s each on 2 cores
def test_build_check_sees_a_removed_spec(capsys, repo_copy):
    (repo_copy / "examples" / "full.attn").unlink()
    capsys.readouterr()
    code, out, _ = run(capsys, "build", "--check")
    assert code == 1
    assert out == "stale: generated/full.py (no attention block 'full' in the specs)\n"


def test_build_without_specs_needs_examples(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "build", "--check")
    assert code == 2
    assert "no SPEC given and no examples/*.attn here" in err


# --------------------------------------------------------------------------- #
# verify
# --------------------------------------------------------------------------- #


def test_verify_runs_the_kernels(capsys, specs):
    code, out, err = run(capsys, "verify", specs / "tiny.attn", "--examples", "2", "--seed", "3")
    assert code == 0, out + err
    assert out.startswith("verify tiny\n")
    # Two shapes, each checked forward (o, lse) and backward (dq, dk, dv).
    assert out.rstrip().endswith("ok: 4 of 4 cases within tolerance")
    assert " dq " in out and " lse " in out


def test_verify_exit_code_follows_the_reports(capsys, specs, monkeypatch):
    calls = []

    def fake_verify(variant, **options):
        calls.append((variant.name, options))
        ok = variant.name != "second"
        return verify.Report(variant.name, (_result(ok),))

    monkeypatch.setattr(verify, "verify", fake_verify)
    (specs / "two.attn").write_text(
        TINY + TINY.replace("tiny", "second").replace("# a small spec\n", "")
    )
    code, out, _ = run(capsys, "verify", specs / "two.attn", "--examples", "5")
    assert code == 1
    assert [name for name, _ in calls] == ["tiny", "second"]
    assert calls[0][1] == {"device": "cpu", "examples": 5}
    assert "FAIL" in out

    calls.clear()
    code, _, _ = run(capsys, "verify", specs / "two.attn", "--name", "tiny")
    assert code == 0
    assert calls == [("tiny", {"device": "cpu"})]

    code, _, err = run(capsys, "verify", specs / "two.attn", "--name", "third")
    assert code == 2
    assert "no attention block named 'third' (blocks: tiny, second)" in err


def test_verify_unreached_edges_fail_unless_partial_coverage_is_accepted(
    capsys, specs, monkeypatch
):
    calls = []

    def fake_verify(variant, **options):
        calls.append(options)
        return verify.Report(
            variant.name,
            (_result(True),),
            unchecked=("window(4095) left edge 4095 (needs Nk=4223; use --device cuda)",),
            accept_partial=options.get("accept_partial", False),
        )

    monkeypatch.setattr(verify, "verify", fake_verify)
    code, out, _ = run(capsys, "verify", specs / "tiny.attn")
    assert code == 1
    assert "not checked: window(4095) left edge 4095" in out
    assert calls == [{"device": "cpu"}]

    calls.clear()
    code, out, _ = run(capsys, "verify", specs / "tiny.attn", "--accept-partial")
    assert code == 0
    assert "not checked: window(4095) left edge 4095" in out
    assert calls == [{"device": "cpu", "accept_partial": True}]


def _result(ok: bool) -> verify.CaseResult:
    check = verify.Check("o", error=0.0 if ok else 1.0, ordinary_error=0.0, bound=0.5, finite=True)
    shape = verify.Shape(1, 1, 1, 1, 1)
    return verify.CaseResult(shape, torch.float32, (check,))


def test_verify_refuses_an_unsafe_module_cache(capsys, specs, monkeypatch):
    shared = specs / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(shared))
    monkeypatch.setattr(api, "_MODULES", {})
    code, out, err = run(capsys, "verify", specs / "tiny.attn", "--examples", "1")
    assert (code, out) == (1, "")
    assert err.startswith(f"flashgen: error: flashgen cache: {shared} is writable by group")
    assert "Traceback" not in err and list(shared.iterdir()) == []


# --------------------------------------------------------------------------- #
# python -m flashgen.demo
# --------------------------------------------------------------------------- #


def test_demo_runs_a_spec_file(capsys, specs, monkeypatch):
    from flashgen import demo

    monkeypatch.setattr(api, "_MODULES", {})
    code = demo.main([str(specs / "tiny.attn")])
    out, err = capsys.readouterr()
    assert (code, err) == (0, ""), out + err
    assert out.startswith(f"flashgen demo: tiny from {specs / 'tiny.attn'}\n")
    assert out.count(")  ok\n") == 2  # o and lse within the bound


def test_demo_refuses_what_is_not_a_spec_file(capsys, specs):
    from flashgen import demo

    assert demo.main(["/dev/null"]) == 2
    assert capsys.readouterr().err == (
        "demo: error: cannot read '/dev/null': not a regular file (a character device)\n"
    )
    assert demo.main([str(specs / "bad.attn")]) == 1
    assert "error: unknown dtype 'bf17'" in capsys.readouterr().err


def test_build_triton_only_writes_a_module_without_the_hopper_kernels(capsys, tmp_path):
    """`--triton-only` leaves the Gluon kernels out of bloom_alibi (which has
    both Gluon families by default); the module still computes the variant
    (run on the CPU here, forward and backward, against the float64 reference)."""
    import importlib.util

    spec = REPO / "examples/bloom_alibi.attn"
    code, out, err = run(capsys, "build", spec, "-o", tmp_path, "--triton-only")
    assert (code, err) == (0, "")
    path = tmp_path / "bloom_alibi.py"
    text = path.read_text()
    assert "_gluon" not in text and "_gluon" in flashgen.build_source(spec)
    assert text == flashgen.build_source(spec, triton_only=True)

    loader = importlib.util.spec_from_file_location("bloom_alibi_triton_only", path)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    (variant,) = api._check_specs([spec])
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 128, dtype=torch.float16) for _ in range(3))
    assert verify.check_forward(variant, module, q, k, v).ok
    assert verify.check_backward(variant, module, q, k, v).ok
