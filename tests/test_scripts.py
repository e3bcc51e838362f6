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


def test_host_stub_runs_the_gluon_paths():
    """scripts/host_stub.py times a module's Python as on an sm90 GPU: the
    Gluon forward and backward are the paths it takes, through `_launch`."""
    import host_stub
    import torch

    path = os.path.join(os.path.dirname(__file__), "..", "generated", "full.py")
    module = host_stub.load(path)
    taken = []
    for name in ("_gluon_forward", "_gluon_backward", "_launch"):
        fn = getattr(module, name)
        setattr(module, name, lambda *a, fn=fn, name=name, **k: taken.append(name) or fn(*a, **k))
    q, k, v, do = (torch.randn(1, 2, 128, 128, dtype=module.DTYPE) for _ in range(4))
    o, lse = module._forward(q, k, v, 0.1)
    module._backward(q, k, v, o, lse, do, None, 0.1)
    assert taken == ["_gluon_forward", "_launch", "_gluon_backward", "_launch", "_launch"]


def test_persistent_forward_prototype_compiles_for_sm90():
    """scripts/gluon_fwd_persistent.py (BENCHMARKS.md entry 32) compiles for
    sm_90a with its double-buffered Q in shared memory and next to no spills,
    so its first GPU run measures it rather than fails to build."""
    import gluon_fwd_persistent

    for causal, regs, stores, loads, smem in gluon_fwd_persistent.compile_only(128, 2):
        assert smem <= 227 * 1024
        assert stores <= 16 and loads <= 32, (causal, stores, loads)
