"""flashgen: standalone Triton FlashAttention modules from small `.attn` specs.

The public Python API, imported on first use so that `import flashgen` (and
`import flashgen.ir`) stay cheap:

    load(spec, name=None) -> module      build, cache on disk, import
    load_all(spec) -> {name: module}
    build_source(spec, name=None) -> str the generated module's source
    build_sources(specs) -> {name: str}
    SpecError                            raised with every diagnostic of bad specs
    SpecWarning                          warned for a spec that checks but may not mean
                                         what it says (a mask that hides every pair)

A `str` spec is always the spec text itself; a `.attn` file is given as a
`pathlib.Path` (any `os.PathLike`), never as a str.  See flashgen.api.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["SpecError", "SpecWarning", "build_source", "build_sources", "load", "load_all"]

_API = {"build_source", "build_sources", "load", "load_all"}


def __getattr__(name: str):
    if name in _API:
        from flashgen import api

        return getattr(api, name)
    if name in ("SpecError", "SpecWarning"):
        from flashgen import diagnostics

        return getattr(diagnostics, name)
    raise AttributeError(f"module 'flashgen' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
