"""The module cache runs only the source flashgen generated: planted `.pyc`
files, tampered entries, symbolic links and directories others can write are
never used."""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import marshal
import os
import stat
import sys
from pathlib import Path

import pytest
import torch

import flashgen
from flashgen import api

TINY = """\
attention tiny {
    head_dim = 16
    dtype = fp32
    mask = causal
}
"""
# Executed by a planted file, it sets a flag the test can see.
PAYLOAD = "import builtins\nbuiltins.FLASHGEN_PWNED = True\n"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache directory, an empty in-process memo, no payload flag."""
    root = tmp_path / "cache"
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(root))
    monkeypatch.setattr(api, "_MODULES", {})
    import builtins

    monkeypatch.delattr(builtins, "FLASHGEN_PWNED", raising=False)
    yield root
    monkeypatch.delattr(builtins, "FLASHGEN_PWNED", raising=False)


def _entry(root: Path) -> Path:
    """Where load(TINY) keeps its module."""
    source = api.build_source(TINY)
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    return root / flashgen.__version__ / digest / "tiny.py"


def _pwned() -> bool:
    import builtins

    return getattr(builtins, "FLASHGEN_PWNED", False)


def _run_forward(module) -> None:
    q = torch.randn(1, 1, 7, 16, generator=torch.Generator().manual_seed(0))
    o = module.attention(q, q, q)
    assert o.shape == q.shape and torch.isfinite(o).all()


def test_a_planted_pyc_does_not_run(cache):
    genuine = flashgen.load(TINY)
    path = Path(genuine.__file__)
    # A .pyc that Python's own loader would accept for tiny.py: compiled from
    # other code, stamped with tiny.py's mtime and size.
    info = path.stat()
    code = compile(PAYLOAD, str(path), "exec")
    pyc = bytearray(importlib.util.MAGIC_NUMBER)
    pyc += (0).to_bytes(4, "little")  # flags: timestamp-based
    pyc += (int(info.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
    pyc += (info.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    pyc += marshal.dumps(code)
    planted = Path(importlib.util.cache_from_source(str(path)))
    planted.parent.mkdir(exist_ok=True)
    planted.write_bytes(bytes(pyc))

    api._MODULES.clear()  # as in a new process
    again = flashgen.load(TINY)
    assert not _pwned()
    assert again.attention is not None
    _run_forward(again)


def test_loading_writes_no_bytecode(cache, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # PYTHONDONTWRITEBYTECODE aside
    path = Path(flashgen.load(TINY).__file__)
    assert sorted(p.name for p in path.parent.iterdir()) == ["tiny.py"]


def test_a_tampered_entry_is_replaced_and_never_run(cache):
    path = Path(flashgen.load(TINY).__file__)
    genuine = path.read_text()
    path.write_text(PAYLOAD)
    api._MODULES.clear()
    module = flashgen.load(TINY)
    assert not _pwned()
    assert path.read_text() == genuine
    _run_forward(module)


def test_source_lookups_see_the_verified_text_not_the_disk(cache):
    # Triton and inspect read kernel source through linecache: after the file
    # changes on disk, they must still see what was compiled and run.
    module = flashgen.load(TINY)
    path = Path(module.__file__)
    expected = inspect.getsource(module.attention)
    path.write_text(PAYLOAD + "\n" * 2000)
    os.utime(path, ns=(0, 10**18))
    assert inspect.getsource(module.attention) == expected
    assert inspect.getsource(module) == api.build_source(TINY)


def test_a_symlinked_entry_directory_is_refused(cache, tmp_path):
    entry = _entry(cache)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    entry.parent.parent.mkdir(parents=True)
    entry.parent.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(api.CacheError, match="is a symbolic link") as info:
        flashgen.load(TINY)
    assert "FLASHGEN_CACHE_DIR" in str(info.value)
    assert list(elsewhere.iterdir()) == []  # nothing written through the link


def test_a_symlinked_entry_file_is_refused(cache, tmp_path):
    entry = _entry(cache)
    elsewhere = tmp_path / "elsewhere.py"
    elsewhere.write_text(api.build_source(TINY))  # even with the genuine text
    entry.parent.mkdir(parents=True)
    entry.symlink_to(elsewhere)
    with pytest.raises(api.CacheError, match=f"{entry} is a symbolic link"):
        flashgen.load(TINY)
    assert entry.is_symlink()
    assert elsewhere.read_text() == api.build_source(TINY)


def test_a_symlinked_cache_root_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(api, "_MODULES", {})
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(link))
    with pytest.raises(api.CacheError, match=f"{link} is a symbolic link"):
        flashgen.load(TINY)
    assert list(real.iterdir()) == []


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702], ids=oct)
def test_a_cache_root_others_can_write_is_refused(tmp_path, monkeypatch, mode):
    monkeypatch.setattr(api, "_MODULES", {})
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(mode)
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(root))
    with pytest.raises(api.CacheError, match="writable by group or others") as info:
        flashgen.load(TINY)
    assert "FLASHGEN_CACHE_DIR" in str(info.value)
    assert list(root.iterdir()) == []


def test_an_entry_directory_others_can_write_is_refused(cache):
    entry = _entry(cache)
    entry.parent.mkdir(parents=True, mode=0o700)
    entry.parent.chmod(0o777)
    with pytest.raises(api.CacheError, match=f"{entry.parent} is writable by group or others"):
        flashgen.load(TINY)
    assert list(entry.parent.iterdir()) == []


def test_a_cache_of_another_user_is_refused(cache, monkeypatch):
    cache.mkdir(mode=0o700)
    uid = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: uid + 1)
    with pytest.raises(api.CacheError, match=f"belongs to user id {uid}, not to you"):
        flashgen.load(TINY)
    assert list(cache.iterdir()) == []


def test_new_cache_directories_are_private(cache):
    path = Path(flashgen.load(TINY).__file__)
    for directory in (cache, path.parent.parent, path.parent):
        assert stat.S_IMODE(directory.stat().st_mode) & 0o077 == 0, directory


def test_a_loaded_module_is_registered_and_runs(cache):
    module = flashgen.load(TINY)
    assert sys.modules[module.__name__] is module
    assert module.__file__ == str(_entry(cache))
    _run_forward(module)


def test_a_cache_root_that_is_a_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(api, "_MODULES", {})
    root = tmp_path / "file"
    root.write_text("")
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(root))
    with pytest.raises(api.CacheError, match=f"{root} is a regular file, not a directory"):
        flashgen.load(TINY)
