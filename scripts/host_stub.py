"""A generated module's own host time, on the CPU, with stub kernels.

The module's Python runs as on an sm90 GPU (Gluon paths taken, repeat
launches direct), but each kernel is a stub whose launcher only reads its
arguments the way Triton 3.6's launcher does (a TMA descriptor's base,
shape, strides).  What remains is the module's own Python: input checks,
allocations, descriptors, launch keys, and autograd's hand-off.  No GPU is
needed; the absolute numbers belong to this CPU (the H200 machine's host is
about twice as slow), the differences between two builds carry over.

    python3 scripts/host_stub.py MODULE.py [MODULE.py ...] [--profile] [--decode]

--decode times a decode step instead (`measure_decode`): issue 22's B = 1,
Nk = 1024 point, without a cache and as KV-cache calls.
"""

from __future__ import annotations

import cProfile
import importlib.util
import pstats
import sys
import timeit
import types

import torch

KERNELS = (
    "_attn_fwd",
    "_attn_plan",
    "_attn_bwd_preprocess",
    "_attn_bwd",
    "_attn_decode",
    "_attn_decode_merge",
    "_gluon_attn_fwd",
    "_gluon_attn_bwd_dkdv",
    "_gluon_attn_bwd_dq",
)


class _Compiled:
    function, packed_metadata = 1, 2

    def run(self, *args):
        for a in args:
            if hasattr(a, "base") and hasattr(a, "strides"):  # a TMA descriptor
                assert a.strides[-1] == 1
                [a.base.data_ptr(), *a.shape, *a.strides]


class _Kernel:
    def __getitem__(self, grid):
        return lambda *args, **options: _Compiled()


def load(path: str):
    spec = importlib.util.spec_from_file_location(f"stub_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in KERNELS:
        if hasattr(module, name):
            setattr(module, name, _Kernel())
    active = types.SimpleNamespace(
        get_current_device=lambda: 0, get_current_stream=lambda device: 0
    )
    module._driver = types.SimpleNamespace(active=active)
    module._bind_context = lambda device: None  # a CUDA runtime call, once per thread
    module.DIRECT_LAUNCH = True
    no, yes = (lambda: False), (lambda: True)
    module._interpreting = no
    check = module._check_inputs

    def check_inputs(*args):  # CPU tensors pass the device check as under the interpreter
        module._interpreting = yes
        try:
            check(*args)
        finally:
            module._interpreting = no

    module._check_inputs = check_inputs
    if hasattr(module, "_gluon_fits"):  # the same checks, less the device's
        module._capability = lambda device: (9, 0)

        def fits(block, q, k, *tensors, any_length=False):
            n = q.shape[2]
            if k.shape[2] != n or (n < block if any_length else n % block):
                return False
            return all(x.is_contiguous() and x.data_ptr() % 16 == 0 for x in (q, k, *tensors))

        module._gluon_fits = fits

    if hasattr(module, "_documents_as_runs"):  # the runs of packed documents, on any device
        module._documents_as_runs = module._runs_of

    if hasattr(module, "_gluon_varlen_fits"):

        def varlen_fits(q, k, v, seqs, *more):
            tiles = module._gluon_tiles(seqs, q.shape[2], k.shape[2])
            if tiles is None or q.shape[1] * q.shape[2] >= 2**31 - 128:
                return False
            users = [module._user_view(x, seqs) for x in (q, k, v, *more)]
            return all(x.is_contiguous() and x.data_ptr() % 16 == 0 for x in users)

        module._gluon_varlen_fits = varlen_fits
    return module


def measure(path: str, profile: bool) -> None:
    module = load(path)
    shape = (4, 16, 1024, module.HEAD_DIM)
    q, k, v, do = (torch.randn(shape, dtype=module.DTYPE) for _ in range(4))
    # Declared inputs (document ids, tables): zeros of their shapes and dtypes.
    sizes = dict(B=shape[0], H=shape[1], Hkv=shape[1], Nq=shape[2], Nk=shape[2])
    data = {
        name: torch.zeros([sizes.get(d, d) for d in dims], dtype=dtype)
        for name, dtype, dims in getattr(module, "_INPUTS", ())
    }
    given = {"inputs": module._check_runtime_inputs(q, k, tuple(data.values()))} if data else {}
    o, lse = module._forward(q, k, v, 0.1, **given)
    inputs = [x.detach().requires_grad_() for x in (q, k, v)]
    calls = {
        "forward": lambda: module._forward(q, k, v, 0.1, **given),
        "backward": lambda: module._backward(q, k, v, o, lse, do, None, 0.1, **given),
        "autograd forward + backward": lambda: torch.autograd.grad(
            module.attention(*inputs, **data), inputs, do
        ),
    }
    if hasattr(module, "tile_plan"):
        calls["tile_plan"] = lambda: module.tile_plan(q, k, v, **data)
    _report(path, calls, "autograd forward + backward" if profile else None)


def _report(path: str, calls: dict, profiled: str | None) -> None:
    """Each call's time (best of five runs of 2000), then cProfile's top
    entries for calls[profiled] where given."""
    for name, fn in calls.items():
        fn()
        us = min(timeit.repeat(fn, number=2000, repeat=5)) / 2000 * 1e6
        print(f"{path}: {name}: {us:.1f} us")
    if profiled is not None:
        stats = cProfile.Profile()
        stats.runcall(lambda: [calls[profiled]() for _ in range(2000)])
        pstats.Stats(stats).sort_stats("tottime").print_stats(25)


def measure_decode(path: str, profile: bool) -> None:
    """One decode step as issue 22 times it: B = 1, H = 32, Hkv = 8, Nq = 1,
    1024 cached keys, through attention() under no_grad: without a cache, and
    as KV-cache calls (contiguous, and in pages of 16 in a shuffled order)."""
    module = load(path)
    d, n = module.HEAD_DIM, 1024
    q = torch.randn(1, 32, 1, d, dtype=module.DTYPE)
    k, v = (torch.randn(1, 8, n, d, dtype=module.DTYPE) for _ in "kv")
    lengths = torch.tensor([n], dtype=torch.int32)
    k_pages, v_pages = (torch.randn(n // 16, 16, 8, d, dtype=module.DTYPE) for _ in "kv")
    table = torch.randperm(n // 16, dtype=torch.int32)[None]
    workspace = module.cache_workspace(q, k)
    paged_workspace = module.cache_workspace(q, k_pages, table)
    calls = {
        "decode": lambda: module.attention(q, k, v),
        "cache": lambda: module.attention(
            q, k, v, cache_seqlens=lengths, workspace=workspace, check_values=False
        ),
        "cache, values checked": lambda: module.attention(
            q, k, v, cache_seqlens=lengths, workspace=workspace, check_values=True
        ),
        "paged cache (16)": lambda: module.attention(
            q, k_pages, v_pages, cache_seqlens=lengths, block_table=table,
            workspace=paged_workspace, check_values=False,
        ),
    }  # fmt: skip
    with torch.no_grad():
        _report(path, calls, "cache" if profile else None)


if __name__ == "__main__":
    run = measure_decode if "--decode" in sys.argv else measure
    for path in [a for a in sys.argv[1:] if not a.startswith("--")]:
        run(path, "--profile" in sys.argv)
