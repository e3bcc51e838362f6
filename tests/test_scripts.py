"""The GPU scripts' inputs, checked where they are cheap to check: on the CPU.

Device time is rationed; an ablation whose literal edit no longer matches the
generated module (the template moved on) fails only there, after the call
has started.  Here every queued experiment is rendered and edited.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
import gpu_ablate  # noqa: E402


@pytest.mark.parametrize("name", list(gpu_ablate.EXPERIMENTS))
def test_ablation_edits_apply(name):
    variant, source = gpu_ablate.experiment_source(name)
    _, edits, _ = gpu_ablate.EXPERIMENTS[name]
    for _, new in edits:
        assert new in source
    compile(source, f"<{name}>", "exec")
