"""The Python (notebook) API: `.attn` specs in, generated modules out.

In: specs, each given as a path (an `os.PathLike`, an existing file, or a
string ending in `.attn`) or as the spec text itself.  Out: the source of the
generated module of every attention block (`build_sources`, `build_source`),
or those modules imported (`load`, `load_all`, `load_variant`).  Bad specs
raise `SpecError` carrying every diagnostic.

Triton reads a kernel's source from the file it was defined in, so a module is
never exec'd from a string: it is written to an on-disk cache and imported
from there.  The cache is `$FLASHGEN_CACHE_DIR`, else `$XDG_CACHE_HOME/flashgen`,
else `~/.cache/flashgen`, laid out as

    <cache>/<flashgen version>/<sha256 of the module source, 16 hex>/<name>.py

Entries are named by their content, so they never go stale and need no
locking: a writer writes a temporary file and renames it into place.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import sys
import types
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Union

from flashgen import __version__, ir
from flashgen.check import check
from flashgen.diagnostics import Diagnostic, SpecError
from flashgen.emit import render_module
from flashgen.tune import tuning_for
from flashgen.parse import parse

__all__ = [
    "Spec",
    "build_source",
    "build_sources",
    "cache_dir",
    "check_sources",
    "load",
    "load_all",
    "load_variant",
    "read_spec",
    "write_if_changed",
]

Spec = Union[str, os.PathLike]

# Parent package name of imported modules: flashgen_generated.<name>_<hash>.
GENERATED_PACKAGE = "flashgen_generated"

# Imported modules by the file they came from.
_MODULES: dict[Path, types.ModuleType] = {}


# --------------------------------------------------------------------------- #
# Specs to sources
# --------------------------------------------------------------------------- #


def read_spec(spec: Spec) -> tuple[str, str]:
    """(path, text) of one spec; spec text gets the path "<string>"."""
    if isinstance(spec, os.PathLike) or (isinstance(spec, str) and _is_path(spec)):
        path = os.fspath(spec)
        return path, Path(path).read_text(encoding="utf-8")
    if isinstance(spec, str):
        return "<string>", spec
    raise TypeError(f"a spec is a path or spec text, not {type(spec).__name__}")


def _is_path(spec: str) -> bool:
    return spec.endswith(".attn") or ("\n" not in spec and os.path.isfile(spec))


def _read_specs(specs: Spec | Sequence[Spec]) -> dict[str, str]:
    """path -> text; several spec texts are told apart as "<string 1>", ..."""
    if isinstance(specs, (str, os.PathLike)):
        specs = [specs]
    pairs = [read_spec(spec) for spec in specs]
    texts = sum(path == "<string>" for path, _ in pairs)
    sources: dict[str, str] = {}
    n = 0
    for path, text in pairs:
        if path == "<string>" and texts > 1:
            n += 1
            path = f"<string {n}>"
        sources[path] = text
    return sources


def check_sources(
    sources: Mapping[str, str],
) -> tuple[tuple[ir.Variant, ...], list[Diagnostic]]:
    """Parse and check files given as path -> text.

    Returns the variants of all blocks and the diagnostics that are not errors
    (warnings); raises `SpecError` with every diagnostic if any is an error.
    A file that does not parse is left out of `check`, but the others are
    still checked, so one run reports the problems of all files.
    """
    diagnostics: list[Diagnostic] = []
    files: list[ir.SpecFile] = []
    for path, text in sources.items():
        spec_file, parse_diagnostics = parse(text, path)
        diagnostics += parse_diagnostics
        if spec_file is not None:
            files.append(spec_file)
    variants, check_diagnostics = check(files)
    diagnostics += check_diagnostics
    if any(d.severity == "error" for d in diagnostics):
        raise SpecError(diagnostics, sources)
    return variants, diagnostics


def build_sources(specs: Spec | Sequence[Spec]) -> dict[str, str]:
    """Block name -> source of its generated module, for all blocks of `specs`."""
    variants, _ = check_sources(_read_specs(specs))
    return {v.name: render_module(v, tuning_for(v)) for v in variants}


def build_source(spec: Spec, name: str | None = None) -> str:
    """Source of the generated module of block `name` (or of the only block)."""
    sources = build_sources([spec])
    return sources[_pick(sources, name)]


def _pick(names: Mapping[str, object], name: str | None) -> str:
    if name is None:
        if len(names) == 1:
            return next(iter(names))
        if not names:
            raise ValueError("the spec defines no attention block")
        raise ValueError(
            f"the spec defines {len(names)} attention blocks "
            f"({', '.join(names)}); pass name= to pick one"
        )
    if name not in names:
        raise ValueError(
            f"no attention block named {name!r}; the spec defines: " + (", ".join(names) or "none")
        )
    return name


# --------------------------------------------------------------------------- #
# Sources to modules
# --------------------------------------------------------------------------- #


def load(spec: Spec, name: str | None = None) -> types.ModuleType:
    """The generated module of block `name` of `spec` (or of its only block)."""
    sources = build_sources([spec])
    name = _pick(sources, name)
    return _import(name, sources[name])


def load_all(spec: Spec) -> dict[str, types.ModuleType]:
    """Block name -> generated module, for every block of `spec`."""
    return {name: _import(name, text) for name, text in build_sources([spec]).items()}


def load_variant(variant: ir.Variant) -> types.ModuleType:
    """The generated module of an already checked variant."""
    return _import(variant.name, render_module(variant, tuning_for(variant)))


def cache_dir() -> Path:
    """Root of the on-disk module cache (see the module docstring)."""
    if root := os.environ.get("FLASHGEN_CACHE_DIR"):
        return Path(root).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "flashgen"


def _import(name: str, source: str) -> types.ModuleType:
    digest = hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]
    path = cache_dir() / __version__ / digest / f"{name}.py"
    if (module := _MODULES.get(path)) is not None:
        return module
    write_if_changed(path, source)

    if GENERATED_PACKAGE not in sys.modules:
        parent = types.ModuleType(GENERATED_PACKAGE, "Modules built by flashgen.load.")
        parent.__path__ = []
        sys.modules[GENERATED_PACKAGE] = parent
    module_name = f"{GENERATED_PACKAGE}.{name}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    setattr(sys.modules[GENERATED_PACKAGE], f"{name}_{digest}", module)
    _MODULES[path] = module
    return module


def write_if_changed(path: str | os.PathLike[str], text: str) -> bool:
    """Write `text` to `path` atomically unless it already holds exactly that.

    Returns whether the file was written.  An unchanged file keeps its mtime,
    so build systems watching it do not rebuild.
    """
    path = Path(path)
    with contextlib.suppress(FileNotFoundError, UnicodeDecodeError):
        if path.read_text(encoding="utf-8") == text:
            return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return True
