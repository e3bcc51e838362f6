"""The generated modules' `_launch`: repeat launches call the compiled kernel
directly, and only when everything Triton specializes on is unchanged.

On the CPU the kernel, its compiled form and Triton's driver are stand-ins
that record what they are asked to do; tests/test_gpu.py runs the real ones.
"""

from __future__ import annotations

import dataclasses
import threading
import types

import pytest
import torch
import triton

from flashgen import ir
from kernel_utils import build, example_variants


class _Compiled:
    function, packed_metadata = "function", "metadata"

    def __init__(self, log):
        self.log = log

    def run(self, *args):
        self.log.append(("direct", args))

    def _init_handles(self):  # Triton's: builds the launcher, loads the binary
        self.log.append(("loaded", threading.current_thread().name))


class _Kernel:
    """kernel[grid](*args, **options) and kernel.warmup(*args, grid=grid,
    **options) as Triton's JITFunction takes them."""

    def __init__(self):
        self.log = []

    def __getitem__(self, grid):
        def launch(*args, **options):
            self.log.append(("triton", grid, args, options))
            return _Compiled(self.log)

        return launch

    def warmup(self, *args, grid, **options):
        self.log.append(("warmup", threading.current_thread().name, grid, args, options))
        return _Compiled(self.log)


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


_BACKWARD_KERNELS = (
    "_attn_bwd_preprocess",
    "_attn_bwd",
    "_gluon_attn_bwd_dkdv",
    "_gluon_attn_bwd_dq",
)


def test_compile_ahead_compiles_the_backward_in_a_worker(module, monkeypatch):
    """The first forward with a gradient on a device starts a worker that
    runs the backward with launches that only compile (Triton's warmup) and
    load the kernels, once per device; the backward then goes through Triton
    at its first launch as before (the compiled kernel is Triton's to find in
    its cache), and directly after.  tests/test_gpu.py runs the real kernels."""
    import contextlib

    kernels = {name: _Kernel() for name in _BACKWARD_KERNELS if hasattr(module, name)}
    for name, kernel in kernels.items():
        monkeypatch.setattr(module, name, kernel)
    monkeypatch.setattr(module, "COMPILE_AHEAD", True)
    monkeypatch.setattr(module, "_AHEAD", {})
    monkeypatch.setattr(module, "_ahead_device", lambda q: 0)  # q on the CPU stands in
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    q, k, v, do = (torch.randn(1, 2, 64, module.HEAD_DIM, dtype=module.DTYPE) for _ in range(4))
    module._compile_ahead(q, k, v, 0.125)
    worker = module._AHEAD[0]
    worker.join()
    module._compile_ahead(q, k, v, 0.125)  # once per device
    assert module._AHEAD[0] is worker
    launched = {name: [entry[:2] for entry in k.log] for name, k in kernels.items() if k.log}
    compiled = [("warmup", "flashgen-compile"), ("loaded", "flashgen-compile")]
    assert launched and all(log == compiled for log in launched.values())
    o, lse = torch.randn_like(q), torch.randn(q.shape[:3])
    for _ in range(2):
        module._layout_backward(q, k, v, o, lse, do, None, 0.125, None, None)
    after = {name: [entry[0] for entry in kernels[name].log[2:]] for name in launched}
    assert all(log == ["triton", "direct"] for log in after.values()), after


def test_compile_ahead_is_on_by_default_but_not_on_the_cpu(module):
    x = torch.zeros(1, 2, 64, module.HEAD_DIM, dtype=module.DTYPE)
    assert module.COMPILE_AHEAD is True and module._ahead_device(x) is None


@pytest.mark.parametrize("call", ["plain", "sinks", "offsets", "no grad"])
def test_forward_with_a_gradient_compiles_ahead(call, monkeypatch):
    """attention() asks for a compile-ahead on plain calls with a gradient,
    before the forward runs, and the backward waits for it."""
    (variant,) = [v for v in example_variants() if v.name == "full"]
    module = build(dataclasses.replace(variant, dtype=ir.DType.FP32))  # the CPU has no bf16 dot
    calls = []
    monkeypatch.setattr(module, "_compile_ahead", lambda *args: calls.append("ahead"))
    monkeypatch.setattr(module, "_await_ahead", lambda q: calls.append("await"))
    q, k, v = (
        torch.randn(1, 2, 32, module.HEAD_DIM, dtype=module.DTYPE).requires_grad_(call != "no grad")
        for _ in range(3)
    )
    options = {"sinks": torch.zeros(2)} if call == "sinks" else {}
    options.update({"q_offset": 3, "k_offset": 3} if call == "offsets" else {})
    o = module.attention(q, k, v, **options)
    if call != "no grad":
        o.sum().backward()
    expected = {"plain": ["ahead", "await"], "no grad": []}.get(call, ["await"])
    assert calls == expected


def test_compile_ahead_takes_the_gluon_backward(monkeypatch):
    """As on an sm90 GPU (scripts/host_stub.py: the module's Python with stub
    kernels), the worker compiles the Gluon backward's two kernels, their
    descriptors made into Triton's own for its warmup, each in a thread of
    its own at the same time (each waits for the other at a barrier)."""
    import contextlib
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
    import host_stub

    module = host_stub.load(os.path.join(os.path.dirname(__file__), "..", "generated", "full.py"))
    both = threading.Barrier(2, timeout=30)

    class Concurrent(_Kernel):
        def warmup(self, *args, grid, **options):
            both.wait()  # one compile after the other: broken after 30 s, nothing logged
            return super().warmup(*args, grid=grid, **options)

    kernels = {name: Concurrent() for name in _BACKWARD_KERNELS if hasattr(module, name)}
    for name, kernel in kernels.items():
        monkeypatch.setattr(module, name, kernel)
    monkeypatch.setattr(module, "COMPILE_AHEAD", True)
    monkeypatch.setattr(module, "_ahead_device", lambda q: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    q, k, v = (torch.randn(1, 2, 128, module.HEAD_DIM, dtype=module.DTYPE) for _ in range(3))
    module._compile_ahead(q, k, v, 0.125)
    module._AHEAD[0].join()
    warmed = {name for name, k in kernels.items() for entry in k.log if entry[0] == "warmup"}
    assert warmed == {"_gluon_attn_bwd_dkdv", "_gluon_attn_bwd_dq"}
    args = [a for k in kernels.values() for e in k.log if e[0] == "warmup" for a in e[3]]
    assert any(hasattr(a, "layout") for a in args)  # descriptors, Triton's own
    assert not any(isinstance(a, module._GluonBlocks) for a in args)


# What Triton 3.6's make_cubin prints before raising PTXASError.
_TRITON_PTX_DUMP = """

================================================================
`ptxas` failed with error code -11
`ptxas` stderr:


Repro command: ptxas -lineinfo -v --gpu-name=sm_90a /tmp/x.ptx -o /tmp/x.ptx.o


//
// Generated by LLVM NVPTX Back-End
//

.version 8.7
.target sm_90a
================================================================
please share the reproducer above with Triton project.
"""


class _PtxasCrashes(_Kernel):
    """A kernel that ptxas fails to compile with more than `most` stages."""

    def __init__(self, module, most: int):
        super().__init__()
        self.error, self.most = module._PTXAS_ERROR, most

    def __getitem__(self, grid):
        def launch(*args, **options):
            self.log.append(("triton", grid, args, options))
            if options.get("num_stages", 3) > self.most:
                print(_TRITON_PTX_DUMP)
                raise self.error("ptxas failed with error code -11")
            print("a print of a launch that compiled")
            return _Compiled(self.log)

        return launch


@pytest.mark.parametrize("direct", [True, False])
def test_a_kernel_ptxas_fails_on_compiles_with_fewer_stages(module, monkeypatch, capsys, direct):
    """Triton 3.6's ptxas crashed on the pipelined key loops of a few masks
    (`k < 8` at d64, decision 067): the launch compiles the kernel again with
    one stage fewer until it compiles, and keeps those options for its later
    launches (also where every launch goes through Triton).  What Triton
    prints on the failures it recovers from (the whole PTX) does not reach
    stdout; what it prints otherwise does."""
    monkeypatch.setattr(module, "_FEWER_STAGES", {})
    monkeypatch.setattr(module, "DIRECT_LAUNCH", direct)
    kernel, x = _PtxasCrashes(module, most=1), torch.zeros(64)
    module._launch(kernel, (3, 4), *_args(x), num_warps=4, num_stages=3)
    assert [entry[3]["num_stages"] for entry in kernel.log] == [3, 2, 1]
    assert capsys.readouterr().out == "a print of a launch that compiled\n"
    kernel.log.clear()
    module._launch(kernel, (3, 4), *_args(x), num_warps=4, num_stages=3)
    assert [entry[0] for entry in kernel.log] == ["direct" if direct else "triton"]
    if not direct:
        assert kernel.log[0][3] == {"num_warps": 4, "num_stages": 1}


def test_the_ptx_the_installed_triton_prints_is_what_is_left_out(module):
    """The banner of the installed Triton's make_cubin, filled in, goes; the
    lines around it stay.  (A Triton that prints none leaves text as it is.)"""
    import inspect

    from triton.backends.nvidia.compiler import CUDABackend

    source = inspect.getsource(CUDABackend.make_cubin)
    start = source.find('print(f"""')
    text = "before\nafter\n"
    if start >= 0:
        banner = source[start + len('print(f"""') : source.index('""")', start)]
        dump = banner.replace("{error}", "`ptxas` raised SIGSEGV").replace("{src}", ".version 8.7")
        text = "before\n" + dump + "\n" + "after\n"  # as print() writes it
        assert ".version 8.7" in text
    assert module._PTX_DUMP.sub("", text) == "before\nafter\n"


def test_stdout_held_by_a_launch_within_another(module, monkeypatch, capsys):
    """A launch through Triton in another thread while one holds stdout holds
    it too (a buffer of its own in the same stand-in), and stdout is the
    process's own again once both are done: overlapping redirections would
    restore each other's streams."""
    import sys
    import threading

    monkeypatch.setattr(module, "DIRECT_LAUNCH", False)
    monkeypatch.setattr(module, "_FEWER_STAGES", {})
    stdout, x = sys.stdout, torch.zeros(64)
    inner = _PtxasCrashes(module, most=3)

    class _Outer(_PtxasCrashes):
        def __getitem__(self, grid):
            launch = super().__getitem__(grid)

            def outer(*args, **options):
                thread = threading.Thread(
                    target=module._launch, args=(inner, (1,), *_args(x)), kwargs=options
                )  # fmt: skip
                thread.start()
                thread.join()
                return launch(*args, **options)

            return outer

    module._launch(_Outer(module, most=1), (3, 4), *_args(x), num_stages=2)
    assert sys.stdout is stdout
    # The other thread's prints (one in each attempt, both held) and the launch's own
    # went out; the PTX did not.
    out = capsys.readouterr().out
    assert out.count("a print of a launch that compiled") == 3 and "=====" not in out


def test_holds_that_overlap_in_time_share_one_buffer(module, capsys):
    """Compiles in threads of their own (COMPILE_AHEAD) hold stdout at once,
    each leaving at its own time: every line they print comes out, no PTX,
    and stdout is the process's own again once the last is out."""
    import sys
    import threading

    stdout, entered, first_left = sys.stdout, threading.Barrier(2), threading.Event()

    def compile_kernel(name: str, leave_first: bool) -> None:
        with module._stdout_held():
            entered.wait()
            if not leave_first:  # prints once the other has left
                first_left.wait()
            print(_TRITON_PTX_DUMP)
            print(f"{name} compiled")
        if leave_first:
            first_left.set()

    threads = [
        threading.Thread(target=compile_kernel, args=("dkdv", True)),
        threading.Thread(target=compile_kernel, args=("dq", False)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sys.stdout is stdout
    out = capsys.readouterr().out
    assert out.splitlines() == ["dkdv compiled", "dq compiled"]


def test_only_the_holding_thread_is_held(module, capsys):
    """Another thread's prints go on as they come; a hold within a hold of
    the same thread is the outer one; stdout is the process's own after."""
    import sys
    import threading

    stdout = sys.stdout
    with module._stdout_held():
        with module._stdout_held():
            print(_TRITON_PTX_DUMP)
            print("held")
            other = threading.Thread(target=print, args=("from another thread",))
            other.start()
            other.join()
            assert capsys.readouterr().out == "from another thread\n"
        assert capsys.readouterr().out == ""  # still held by the outer one
    assert capsys.readouterr().out == "held\n"
    assert sys.stdout is stdout


def test_a_kernel_ptxas_fails_on_at_one_stage_raises(module, monkeypatch):
    monkeypatch.setattr(module, "_FEWER_STAGES", {})
    kernel, x = _PtxasCrashes(module, most=0), torch.zeros(64)
    with pytest.raises(module._PTXAS_ERROR, match="error code -11"):
        module._launch(kernel, (3, 4), *_args(x), num_stages=2)
    assert [entry[3]["num_stages"] for entry in kernel.log] == [2, 1]
