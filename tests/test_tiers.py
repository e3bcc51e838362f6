"""The two test tiers (docs/DEVELOPING.md) split the suite: every test is in exactly one.

A bare `pytest` runs the quick tier (pyproject.toml's addopts: `-m "not kernels"`) and
`pytest -m kernels` the kernels tier.  Both are collected here as a person runs them, in
processes of their own, and each collection's summary ("N/M tests collected") gives the
size M of the whole suite.  So a change to addopts that leaves tests in neither tier (say,
one more marker deselected by default) fails here.  The kernels tier must hold what makes
the suite slow: the sm_90a compiles and the fuzzer's campaigns.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _collect(args: tuple[str, ...]) -> tuple[list[str], int]:
    """The test ids that `pytest ARGS` selects, and the number of tests in the suite."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    summary = re.search(r"^(\d+)/(\d+) tests collected", result.stdout, re.MULTILINE)
    assert summary, result.stdout[-2000:]
    tests = [line for line in result.stdout.splitlines() if "::" in line]
    assert len(tests) == int(summary[1])
    return tests, int(summary[2])


def test_every_test_is_in_exactly_one_tier():
    with ThreadPoolExecutor(2) as pool:
        (quick, total), (kernels, total_again) = pool.map(_collect, [(), ("-m", "kernels")])
    assert total == total_again
    assert quick and kernels
    assert not set(quick) & set(kernels), sorted(set(quick) & set(kernels))[:10]
    assert len(set(quick) | set(kernels)) == total, "tests in neither tier"
    assert "tests/test_tiers.py::test_every_test_is_in_exactly_one_tier" in quick
    assert any(test.startswith("tests/test_resources.py::") for test in kernels)
    assert not any(test.startswith("tests/test_resources.py::") for test in quick)
    assert "tests/test_fuzz.py::test_fuzz_grammar" in kernels
    assert "tests/test_fuzz.py::test_fuzz_mutation" in kernels
