"""The generated modules' `_launch`: repeat launches call the compiled kernel
directly, and only when everything Triton specializes on is unchanged.

On the CPU the kernel, its compiled form and Triton's driver are stand-ins
that record what they are asked to do; tests/test_gpu.py runs the real ones.
"""

from __future__ import annotations

import threading
import types

import pytest
import torch
import triton

from kernel_utils import build, example_variants


class _Compiled:
    function, packed_metadata = "function", "metadata"

    def __init__(self, log):
        self.log = log

    def run(self, *args):
        self.log.append(("direct", args))


class _Kernel:
    """kernel[grid](*args, **options) as Triton's JITFunction takes it."""

    def __init__(self):
        self.log = []

    def __getitem__(self, grid):
        def launch(*args, **options):
            self.log.append(("triton", grid, args, options))
            return _Compiled(self.log)

        return launch


@pytest.fixture
def module(monkeypatch):
    (variant,) = [v for v in example_variants() if v.name == "full"]
    module = build(variant)
    driver = types.SimpleNamespace(
        active=types.SimpleNamespace(
            get_current_device=lambda: 0, get_current_stream=lambda device: 1234
        )
    )
    monkeypatch.setattr(module, "_driver", driver)
    monkeypatch.setattr(module, "_interpreting", lambda: False)
    monkeypatch.setattr(module, "DIRECT_LAUNCH", True)
    monkeypatch.setattr(module, "_COMPILED", {})
    monkeypatch.setattr(module, "_THREAD", threading.local())
    binds, real_bind = [], module._bind_context
    module.binds = binds
    monkeypatch.setattr(
        module, "_bind_context", lambda device: (binds.append(device), real_bind(device))
    )
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    return module


def _args(x):
    return (x, x, 64, 1, 0.5, True)


def test_repeat_launch_is_direct(module):
    kernel, x = _Kernel(), torch.zeros(64)
    module._launch(kernel, (3, 4), *_args(x), num_warps=4)
    module._launch(kernel, (5, 6), *_args(x), num_warps=4)
    assert [entry[0] for entry in kernel.log] == ["triton", "direct"]
    assert kernel.log[0][1:] == ((3, 4), _args(x), {"num_warps": 4})
    grid_and_handles = (5, 6, 1, 1234, "function", "metadata", None, None, None)
    assert kernel.log[1][1] == grid_and_handles + _args(x)


def test_each_thread_binds_the_device_context_before_its_first_launch(module, monkeypatch):
    """Triton encodes TMA descriptors before its launcher makes the device's
    context current, so `_launch` binds it first, once per thread and device
    (tests/test_gpu.py runs the real first launch in a new thread)."""
    kernel, x = _Kernel(), torch.zeros(64)
    module._launch(kernel, (3, 4), *_args(x))
    module._launch(kernel, (3, 4), *_args(x))
    assert module.binds == [0]
    monkeypatch.setattr(module._driver.active, "get_current_device", lambda: 1)
    module._launch(kernel, (3, 4), *_args(x))
    assert module.binds == [0, 1]
    thread = threading.Thread(target=module._launch, args=(kernel, (3, 4), *_args(x)))
    thread.start()
    thread.join()
    assert module.binds == [0, 1, 1]
    monkeypatch.setattr(module, "DIRECT_LAUNCH", False)  # launches through Triton bind too
    thread = threading.Thread(target=module._launch, args=(kernel, (3, 4), *_args(x)))
    thread.start()
    thread.join()
    assert module.binds == [0, 1, 1, 1]


@pytest.mark.parametrize(
    "change",
    [
        "integer",  # a size or stride: Triton specializes on 1 and multiples of 16
        "alignment",  # a pointer not 16-byte aligned
        "dtype",
        "options",
        "device",
        "hook",  # a profiler's launch hook must see every launch
        "compiling",  # torch.compile traces the launch itself
        "disabled",
    ],
)
def test_launch_goes_through_triton_when_anything_changes(module, monkeypatch, change):
    kernel, buffer = _Kernel(), torch.zeros(80)
    x = buffer[:64]
    module._launch(kernel, (1, 1), *_args(x), num_warps=4)
    args, options = _args(x), {"num_warps": 4}
    if change == "integer":
        args = (x, x, 65, 1, 0.5, True)
    elif change == "alignment":
        args = (x, buffer[1:65], 64, 1, 0.5, True)
    elif change == "dtype":
        args = (x, x.half(), 64, 1, 0.5, True)
    elif change == "options":
        options = {"num_warps": 8}
    elif change == "device":
        monkeypatch.setattr(module._driver.active, "get_current_device", lambda: 1)
    elif change == "hook":
        hooks = module._knobs.runtime.launch_enter_hook
        monkeypatch.setattr(hooks, "calls", [lambda metadata: None])
    elif change == "compiling":
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    elif change == "disabled":
        monkeypatch.setattr(module, "DIRECT_LAUNCH", False)
    module._launch(kernel, (1, 1), *args, **options)
    assert [entry[0] for entry in kernel.log] == ["triton", "triton"]


def test_float_arguments_do_not_split_the_cache(module):
    """A float argument is an fp32 in every compiled kernel (the scale)."""
    kernel, x = _Kernel(), torch.zeros(64)
    module._launch(kernel, (1, 1), x, 0.5)
    module._launch(kernel, (1, 1), x, 0.25)
    assert [entry[0] for entry in kernel.log] == ["triton", "direct"]
    assert kernel.log[1][1][-1] == 0.25


def test_gluon_descriptors_reach_triton_as_its_own(module):
    """`_GluonBlocks` stands in for Triton's Gluon descriptor on direct
    launches, and is made into one for a launch through Triton: the same
    pointer, shape, strides, block and layout as a descriptor made directly
    over the tensor seen as (B * heads * N, D)."""
    from triton.backends.nvidia.driver import make_tensordesc_arg

    x = torch.zeros(2, 3, 128, 64, dtype=torch.float16)
    blocks = module._gluon_descriptor(x, 64)
    flat = x.view(-1, 64)
    layout = module.gl.NVMMASharedLayout.get_default_for([64, 64], module.gl.float16)
    want = module.GluonTensorDescriptor(flat, [768, 64], [64, 1], [64, 64], layout)
    got = blocks.descriptor()
    assert type(got) is module.GluonTensorDescriptor
    assert (got.base.data_ptr(), got.base.shape) == (x.data_ptr(), flat.shape)
    assert (got.shape, got.strides, got.block_shape) == (want.shape, want.strides, want.block_shape)
    assert (got.layout, got.padding) == (want.layout, want.padding)
    if triton.__version__.startswith(module.TESTED_TRITON):
        # What this Triton's launcher reads of each (`make_tensordesc_arg`).
        as_launched = make_tensordesc_arg(blocks, None)
        assert as_launched[0].data_ptr() == x.data_ptr()
        assert as_launched[1:] == make_tensordesc_arg(want, None)[1:]
    else:
        # Another Triton's launcher may read descriptors otherwise: the module
        # never hands it the stand-in (direct launches are off there).
        assert not (
            module._driver is not None and triton.__version__.startswith(module.TESTED_TRITON)
        )

    kernel = _Kernel()
    module._launch(kernel, (1, 1), blocks, 7)
    module._launch(kernel, (1, 1), module._gluon_descriptor(x, 64), 7)
    (_, _, (through_triton, _), _), (_, direct) = kernel.log
    assert type(through_triton) is module.GluonTensorDescriptor
    assert type(direct[-2]) is module._GluonBlocks  # the stand-in, read by the launcher
    assert direct[-2].base is x and direct[-2][1:] == blocks[1:]
