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


@pytest.mark.parametrize("name", ["mistral_sliding", "bloom_alibi"])
def test_any_mask_gluon_forward_from_4096_keys(name):
    """A module with the Gluon forward for a general mask takes it, as on an
    sm90 GPU, from GLUON_MIN_KEYS keys on, and the Triton forward below, with
    Nq != Nk, or with a launch config given."""
    import host_stub
    import torch

    generated = os.path.join(os.path.dirname(__file__), "..", "generated")
    module = host_stub.load(os.path.join(generated, f"{name}.py"))
    assert module.GLUON_MIN_KEYS == 4096
    taken = []
    fn = module._gluon_forward
    module._gluon_forward = lambda q, *a: taken.append(q.shape[2]) or fn(q, *a)

    def run(n_queries, n_keys, **config):
        q = torch.randn(1, 2, n_queries, 128, dtype=module.DTYPE)
        k, v = (torch.randn(1, 2, n_keys, 128, dtype=module.DTYPE) for _ in range(2))
        module._forward(q, k, v, 0.1, **config)

    run(2048, 2048)
    run(3968, 3968)
    run(4096, 4096)
    run(4096, 4224)
    run(4224, 4224)
    run(4096, 4096, block_m=64)
    assert taken == [4096, 4224]
