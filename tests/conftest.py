"""Test-wide setup: the tiers, where kernels run and where generated modules are cached.

Two tiers (docs/DEVELOPING.md).  A bare `pytest` runs the quick one: pyproject.toml's
addopts deselect the tests marked `kernels` (kernels under the Triton interpreter, the
sm_90a compiles, the fuzzer's campaigns).  `pytest -m kernels` runs those alone, and
`pytest -m ""` runs everything.  When the default deselects tests, the summary says how
many and how to run them, so `pytest tests/test_kernels.py` does not pass silently on
nothing.

Without a CUDA GPU the Triton kernels run on the CPU interpreter.  `triton.jit`
decides between compiling and interpreting when a kernel is defined, that is
when a generated module is imported, so TRITON_INTERPRET is set here, before
any test module imports triton.  Tests marked `gpu` are skipped without CUDA.
Hypothesis runs derandomized unless a profile is chosen (see below).

Modules that `flashgen.load` builds go to a per-session temporary cache, never
to the user's ~/.cache/flashgen.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import settings

HAS_CUDA = torch.cuda.is_available()

# Property tests draw the same examples on every run, so a red CI is a real
# regression and not a new random draw.  To explore with fresh random
# examples, run with FLASHGEN_HYPOTHESIS=explore.
settings.register_profile("deterministic", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("FLASHGEN_HYPOTHESIS", "deterministic"))

if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    addopts = config.getini("addopts")
    default = addopts[addopts.index("-m") + 1] if "-m" in addopts else None
    deselected = len(terminalreporter.stats.get("deselected", ()))
    if deselected and default and config.getoption("markexpr") == default:
        terminalreporter.write_line(
            f"{deselected} deselected: a bare pytest runs the quick tier (-m {default!r}); "
            '`pytest -m kernels` runs the kernels tier, `pytest -m ""` every test'
        )


@pytest.fixture(scope="session", autouse=True)
def _flashgen_cache_dir(tmp_path_factory):
    old = os.environ.get("FLASHGEN_CACHE_DIR")
    os.environ["FLASHGEN_CACHE_DIR"] = str(tmp_path_factory.mktemp("flashgen-cache"))
    yield
    if old is None:
        os.environ.pop("FLASHGEN_CACHE_DIR", None)
    else:
        os.environ["FLASHGEN_CACHE_DIR"] = old
