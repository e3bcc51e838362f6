"""The Python API: specs as text (str) or files (os.PathLike), reading spec
files, the on-disk module cache, SpecError.  The cache's defences against
planted files are in test_cache.py, writing modules in test_files.py."""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from pathlib import Path

import platformdirs
import pytest
import torch

import flashgen
from flashgen import api, diagnostics, ir
from flashgen.reference import attention_ref
from flashgen.verify import check_forward

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

TINY = """\
attention tiny {
    head_dim = 16
    dtype = fp32
    mask = causal
}
"""
TWO_BLOCKS = """\
attention first {
    head_dim = 16
    dtype = fp32
}
attention second {
    head_dim = 32
    dtype = fp16
    mask = causal
}
"""
BAD = """\
attention broken {
    head_dim = 100
    dtype = fp32
}
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache directory and an empty in-process memo."""
    root = tmp_path / "cache"
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(root))
    monkeypatch.setattr(api, "_MODULES", {})
    return root


def _age(path: Path) -> int:
    """Move `path`'s mtime an hour back and return it (ns)."""
    stat = path.stat()
    old = stat.st_mtime_ns - 3600 * 10**9
    os.utime(path, ns=(stat.st_atime_ns, old))
    return old


# --------------------------------------------------------------------------- #
# Building sources
# --------------------------------------------------------------------------- #


def test_build_sources_from_text_and_pathlike(tmp_path):
    spec = tmp_path / "tiny.attn"
    spec.write_text(TINY)
    from_text = api.build_sources([TINY])
    assert list(from_text) == ["tiny"]
    assert from_text["tiny"].startswith(api.GENERATED_HEADER)
    assert api.build_sources([spec]) == from_text
    assert api.build_sources(spec) == from_text  # a lone spec, not in a list
    assert flashgen.build_source(TINY) == from_text["tiny"]


def test_a_str_is_always_spec_text_never_a_file_name(tmp_path):
    # Untrusted text must not become a file read: before, a str naming an
    # existing file (or ending in .attn) was opened and its first line quoted.
    secret = tmp_path / "secret.attn"
    secret.write_text("SECRET-LINE in a file the caller never meant to share\n")
    for text in (str(secret), str(tmp_path / "missing.attn"), "/etc/passwd"):
        with pytest.raises(flashgen.SpecError) as info:
            api.build_source(text)
        message = str(info.value)
        assert message.startswith("<string>:1:1: error:")
        assert "SECRET-LINE" not in message
        assert "root:" not in message
    # A file name passed as a str gets a hint at pathlib.Path.
    with pytest.raises(flashgen.SpecError, match=r"pass pathlib\.Path"):
        api.build_source(str(secret))


def test_spec_text_ending_in_a_comment_naming_a_file_builds():
    text = TINY + "# the same mask as examples/gemma2.attn"  # no final newline
    assert list(api.build_sources(text)) == ["tiny"]


def test_build_sources_keeps_block_order():
    assert list(api.build_sources([TWO_BLOCKS])) == ["first", "second"]
    assert list(api.build_sources([EXAMPLES / "full.attn", TINY])) == ["full", "tiny"]


def test_build_source_picks_a_block_by_name():
    assert "`second`" in api.build_source(TWO_BLOCKS, "second")
    with pytest.raises(ValueError, match="2 attention blocks"):
        api.build_source(TWO_BLOCKS)
    with pytest.raises(ValueError, match="no attention block named 'third'"):
        api.build_source(TWO_BLOCKS, "third")


def test_bad_spec_raises_spec_error_with_every_diagnostic():
    with pytest.raises(flashgen.SpecError) as info:
        api.build_sources([BAD])
    error = info.value
    assert isinstance(error, diagnostics.SpecError)
    assert [d.span.line for d in error.diagnostics] == [2]
    assert str(error).startswith("<string>:2:16: error:")
    assert "head_dim = 100" in str(error)


def test_spec_error_shows_in_a_notebook_as_its_diagnostics():
    """IPython and Jupyter display an exception with `_render_traceback_` as the
    lines it returns, joined by newlines, and no traceback: here the diagnostics,
    every one of them, with their source lines and carets."""
    text = "attention broken {\n    head_dim = 100\n    dtype = fp32\n    mask = window(-3)\n}\n"
    with pytest.raises(flashgen.SpecError) as info:
        flashgen.load(text)
    lines = info.value._render_traceback_()
    assert all(isinstance(line, str) and "\n" not in line for line in lines)
    assert lines == [
        "<string>:2:16: error: `head_dim` must be a multiple of 8 between 16 and 576, got 100",
        "    head_dim = 100",
        "               ^^^",
        "    = note: nearest valid: 96 or 104",
        "<string>:4:19: error: window size must be non-negative, got -3",
        "    mask = window(-3)",
        "                  ^^",
    ]
    assert "\n".join(lines) == str(info.value)


def test_several_texts_are_told_apart_in_diagnostics():
    with pytest.raises(flashgen.SpecError) as info:
        api.build_sources([TINY, BAD])
    assert str(info.value).startswith("<string 2>:2:16: error:")


def test_duplicate_block_names_across_specs_are_an_error(tmp_path):
    spec = tmp_path / "tiny.attn"
    spec.write_text(TINY)
    with pytest.raises(flashgen.SpecError, match="tiny"):
        api.build_sources([spec, TINY])


def test_missing_spec_file_raises_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        api.build_sources([tmp_path / "missing.attn"])
    with pytest.raises(IsADirectoryError):
        api.build_sources([tmp_path])


def test_specs_of_the_wrong_type_raise_type_error():
    with pytest.raises(TypeError, match="spec"):
        api.build_sources(TINY.encode())
    with pytest.raises(TypeError, match="got int"):
        api.build_sources([TINY, 42])


# --------------------------------------------------------------------------- #
# Reading spec files
# --------------------------------------------------------------------------- #


def _in_thread(fn, seconds: float = 20.0):
    """fn()'s result or exception, or a test failure if it is still blocked
    after `seconds` (opening a FIFO without O_NONBLOCK waits for a writer)."""
    result: dict = {}

    def run():
        try:
            result["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            result["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    return thread.is_alive(), result


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "spec.attn"
    os.mkfifo(fifo)
    try:
        blocked, result = _in_thread(lambda: api.read_spec_file(fifo))
    finally:
        # Unblock a reader stuck in open(), should there be one.
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK) if blocked else None
        if fd is not None:
            os.close(fd)
    assert not blocked, "reading a FIFO blocked"
    error = result.get("error")
    assert isinstance(error, api.SpecFileError) and isinstance(error, ValueError)
    assert str(error) == f"{fifo}: not a regular file (a FIFO)"
    with pytest.raises(api.SpecFileError, match="a FIFO"):
        _raise(_in_thread(lambda: api.build_sources(fifo))[1])


def _raise(result: dict):
    if "error" in result:
        raise result["error"]
    return result["value"]


def test_a_device_is_refused():
    # /dev/null, not /dev/zero: a regression here must fail, not fill memory.
    with pytest.raises(api.SpecFileError, match=r"^/dev/null: not a regular file \(a character"):
        api.build_sources(Path("/dev/null"))


def test_spec_files_larger_than_the_limit_are_refused(tmp_path):
    at_limit = tmp_path / "at_limit.attn"
    padding = "#" * (ir.MAX_SPEC_BYTES - len(TINY) - 1) + "\n"
    at_limit.write_text(TINY + padding)
    assert at_limit.stat().st_size == ir.MAX_SPEC_BYTES
    assert list(api.build_sources(at_limit)) == ["tiny"]

    over = tmp_path / "over.attn"
    over.write_text(TINY + "#" + padding)
    with pytest.raises(
        flashgen.SpecError, match=f"larger than {ir.MAX_SPEC_BYTES} bytes, the limit"
    ):
        api.build_sources(over)
    with pytest.raises(flashgen.SpecError, match=r"<string>:.*larger than 1048576 bytes"):
        api.build_sources(TINY + "#" + padding)


def test_spec_text_with_a_lone_surrogate_is_not_text():
    """A str is held to what a file is: a lone surrogate (which no UTF-8 file
    can hold) is a diagnostic at its place, the same one the file gets."""
    with pytest.raises(flashgen.SpecError) as info:
        api.build_sources("# a comment\nat\ud800tention t {}\n")
    (diagnostic,) = info.value.diagnostics
    assert (diagnostic.span.line, diagnostic.span.column) == (2, 3)
    assert diagnostic.message == "the spec is not UTF-8 text"


def test_spec_files_must_be_utf8(tmp_path):
    latin1 = tmp_path / "latin1.attn"
    latin1.write_bytes(b"# caf\xe9\n")
    with pytest.raises(flashgen.SpecError) as info:
        api.build_sources(latin1)
    assert str(info.value).splitlines()[0] == f"{latin1}:1:6: error: the spec is not UTF-8 text"
    assert [d.path for d in info.value.diagnostics] == [str(latin1)]


# --------------------------------------------------------------------------- #
# Loading modules
# --------------------------------------------------------------------------- #


def test_load_writes_the_module_into_the_cache_layout(cache):
    module = flashgen.load(TINY)
    source = api.build_source(TINY)
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    path = cache / flashgen.__version__ / digest / "tiny.py"
    assert Path(module.__file__) == path
    assert path.read_text() == source
    assert module.__name__ == f"flashgen_generated.tiny_{digest}"
    assert sys.modules[module.__name__] is module
    assert [p.name for p in path.parent.iterdir()] == ["tiny.py"]  # no temp files


def test_second_load_hits_the_cache(cache):
    first = flashgen.load(TINY)
    assert flashgen.load(TINY) is first  # in-process memo

    path = Path(first.__file__)
    old = _age(path)
    api._MODULES.clear()  # as in a new process: only the disk cache is left
    again = flashgen.load(TINY)
    assert again is not first
    assert again.__file__ == first.__file__
    assert path.stat().st_mtime_ns == old  # found on disk, not rewritten


def test_different_specs_give_different_modules(cache):
    causal = flashgen.load(TINY)
    full = flashgen.load(TINY.replace("mask = causal", "mask = full"))
    assert full is not causal
    assert full.__name__ != causal.__name__
    assert Path(full.__file__).parent != Path(causal.__file__).parent
    assert "mask = full" in full.SPEC and "mask = causal" in causal.SPEC


def test_cache_dir_honours_the_environment(tmp_path, monkeypatch):
    """FLASHGEN_CACHE_DIR first; else platformdirs' user cache directory for
    flashgen, which on Linux is $XDG_CACHE_HOME/flashgen, else
    ~/.cache/flashgen.  Finding it creates nothing."""
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(tmp_path / "a"))
    assert api.cache_dir() == tmp_path / "a"
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", "")  # empty: as if unset
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert api.cache_dir() == platformdirs.user_cache_path("flashgen", appauthor=False)
    if sys.platform.startswith("linux"):
        assert api.cache_dir() == tmp_path / "xdg" / "flashgen"
        monkeypatch.delenv("XDG_CACHE_HOME")
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        assert api.cache_dir() == tmp_path / "home" / ".cache" / "flashgen"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="XDG_CACHE_HOME is Linux's")
def test_load_caches_under_xdg_cache_home_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv("FLASHGEN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(api, "_MODULES", {})
    module = flashgen.load(TINY)
    root = tmp_path / "xdg" / "flashgen"
    assert Path(module.__file__).relative_to(root).parts[0] == flashgen.__version__
    assert root.stat().st_mode & 0o777 == 0o700


def test_load_all_and_load_by_name(cache):
    modules = flashgen.load_all(TWO_BLOCKS)
    assert list(modules) == ["first", "second"]
    assert flashgen.load(TWO_BLOCKS, "second") is modules["second"]
    assert modules["second"].HEAD_DIM == 32
    with pytest.raises(ValueError, match="pass name="):
        flashgen.load(TWO_BLOCKS)


def test_load_from_a_path(cache):
    module = flashgen.load(EXAMPLES / "bloom_alibi.attn")
    assert module is flashgen.load(EXAMPLES / "bloom_alibi.attn")
    assert module.HEAD_DIM == 128
    with pytest.raises(flashgen.SpecError, match="pass pathlib.Path"):
        flashgen.load(str(EXAMPLES / "bloom_alibi.attn"))


def test_loaded_kernel_runs_and_matches_the_reference(cache):
    # Triton reads kernel source from the module's file: this fails if the
    # module was not imported from a real file.
    module = flashgen.load(TINY)
    (variant,), _ = api.check_sources({"<string>": TINY})
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 19, 16, generator=gen) for _ in range(3))
    o, lse = module.attention(q, k, v, return_lse=True)
    ref_o, ref_lse = attention_ref(variant, q, k, v)
    torch.testing.assert_close(o.double(), ref_o, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)
    assert check_forward(variant, module, q, k, v).ok  # and by the usual rule


def test_load_variant_shares_the_cache_with_load(cache):
    (variant,), _ = api.check_sources({"<string>": TINY})
    assert api.load_variant(variant) is flashgen.load(TINY)


def test_write_if_changed(tmp_path):
    path = tmp_path / "sub" / "m.py"
    one = api.GENERATED_HEADER + "0.1.0\nx = 1\n"
    assert api.write_if_changed(path, one)
    old = _age(path)
    assert not api.write_if_changed(path, one)
    assert path.stat().st_mtime_ns == old
    assert api.write_if_changed(path, one.replace("1", "2"))
    assert path.read_text() == one.replace("1", "2")
    assert [p.name for p in path.parent.iterdir()] == ["m.py"]


def test_public_names():
    assert flashgen.__version__ == "0.1.0"
    assert flashgen.load is api.load
    assert flashgen.load_all is api.load_all
    assert flashgen.build_sources is api.build_sources
    assert flashgen.SpecError is diagnostics.SpecError
    with pytest.raises(AttributeError):
        flashgen.no_such_name  # noqa: B018
