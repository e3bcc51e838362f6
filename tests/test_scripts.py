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


def _persistent_module(name: str):
    """The example module of `name` with the persistent Gluon forward (off in
    the generated modules until measured), loaded with stub kernels."""
    import host_stub

    from flashgen import lower
    from flashgen.api import load_variant
    from flashgen.cli import _check_sources, _read

    up_to, lower.GLUON_PERSISTENT_UP_TO = lower.GLUON_PERSISTENT_UP_TO, 2048
    try:
        examples = os.path.join(os.path.dirname(__file__), "..", "examples")
        (variant,), _ = _check_sources(_read([os.path.join(examples, f"{name}.attn")]))
        path = load_variant(variant).__file__
    finally:
        lower.GLUON_PERSISTENT_UP_TO = up_to
    module = host_stub.load(path)
    module._gluon_sm_count = lambda device: 132
    return module


@pytest.mark.parametrize("name", ["full", "plain_causal"])
def test_persistent_forward_dispatch(name, tmp_path, monkeypatch):
    """Calls of up to GLUON_PERSISTENT_UP_TO keys take the persistent kernel,
    on min(items, SMs) CTAs and the schedule made for their shape; longer
    ones the other Gluon forward."""
    import torch

    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(tmp_path))
    module = _persistent_module(name)
    assert module.GLUON_PERSISTENT_UP_TO == 2048
    launches = []
    launch = module._launch
    module._launch = lambda kernel, grid, *a, **k: launches.append((kernel, grid, a)) or launch(
        kernel, grid, *a, **k
    )
    for n, batch, heads in ((1024, 2, 16), (256, 1, 2), (2048, 1, 4), (2176, 1, 2)):
        q = torch.randn(batch, heads, n, 128, dtype=module.DTYPE)
        k, v = (torch.randn(batch, 2, n, 128, dtype=module.DTYPE) for _ in range(2))
        module._forward(q, k, v, 0.1)
    kernels = [(kernel is module._gluon_attn_fwd_persistent, grid) for kernel, grid, _ in launches]
    assert kernels == [(True, (132, 1)), (True, (4, 1)), (True, (64, 1)), (False, (17, 2))]
    schedule = launches[0][2][5]  # after the four descriptors and lse
    assert schedule.dtype == torch.int32 and schedule[:133].tolist()[-1] == 2 * 16 * 8


@pytest.mark.parametrize("name", ["full", "plain_causal"])
@pytest.mark.parametrize("n, batch_heads", [(1024, 256), (4096, 64), (16384, 16), (384, 3)])
def test_persistent_forward_schedule(name, n, batch_heads, tmp_path, monkeypatch):
    """The module's schedule gives every work item to exactly one CTA, in the
    offsets-then-items layout its kernel reads, and evens the CTAs' work
    out: none above the mean by more than the largest item; under a causal
    mask each CTA takes its items heaviest first within a group of heads."""
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(tmp_path))
    module = _persistent_module(name)
    causal = name == "plain_causal"
    grid = min(132, n // 128 * batch_heads)
    group_heads = module._gluon_group_heads(batch_heads, n, 128, 2)
    flat = module._gluon_schedule(n, batch_heads, group_heads, grid, "cpu").tolist()
    offsets, items = flat[: grid + 1], flat[grid + 1 :]
    assert offsets[0] == 0 and offsets == sorted(offsets) and offsets[-1] == len(items)
    q_tiles = n // 128
    assert sorted(items) == list(range(q_tiles * batch_heads))

    def cost(code):
        return (code % q_tiles + 1 if causal else q_tiles) + module.GLUON_ITEM_COST

    loads = [sum(cost(c) for c in items[lo:hi]) for lo, hi in zip(offsets, offsets[1:])]
    assert max(loads) - sum(loads) / grid <= q_tiles + module.GLUON_ITEM_COST
    if causal:
        for lo, hi in zip(offsets, offsets[1:]):
            mine = items[lo:hi]
            groups = [c // q_tiles // group_heads for c in mine]
            assert groups == sorted(groups)
            for g in set(groups):
                tiles = [c % q_tiles for c, h in zip(mine, groups) if h == g]
                assert tiles == sorted(tiles, reverse=True)
