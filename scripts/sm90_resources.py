"""Registers, spills and shared memory of the generated kernels on sm_90a,
without a GPU.

Triton compiles for a target named in the call, and its wheel ships ptxas:
this script compiles a spec's forward and backward kernels for Hopper with the
specializations a launch at B=4, H=16, N=4096 would get (16-byte aligned
pointers, integers divisible by 16, unit strides and kv_group = 1 as
constants), then asks ptxas for the resource use.  Spills in the inner loops
cost the kernels several percent (docs/decisions/012-register-spills-without-gpu.md), and this finds
them on a machine without a GPU.

    python3 scripts/sm90_resources.py examples/*.attn [--head-dim 64 128]
        [--forward-config M N W S] [--backward-config M N W S] [--no-tma] [--json]

One line per kernel: registers per thread, spill stores / loads (bytes),
shared memory (bytes).  The default configs are each module's own.  With
--ptx DIR, each kernel's PTX (debug information left out) is written there
too: two trees whose files are equal compiled the same kernels.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.errors import PTXASError

# The flashgen to compile: this checkout's, or FLASHGEN_TREE's (scripts/same_ptx.sh).
sys.path.insert(0, os.environ.get("FLASHGEN_TREE") or os.path.join(os.path.dirname(__file__), ".."))
from flashgen import api, experiments, kernel_choice, lower  # noqa: E402

_DTYPES = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32"}
_TENSORS = ("q", "k", "v", "o", "do", "dq", "dk", "dv")
_POINTER = {
    "torch.int32": "*i32",
    "torch.int64": "*i64",
    "torch.float32": "*fp32",
    "torch.float16": "*fp16",
    "torch.bfloat16": "*bf16",
}


V_IN_K = False  # --v-in-k
# --ones: integer parameters compiled as the constant 1, as Triton specializes
# a launch's argument of value 1 (Nq = 1, one head, Nk = 1): code that
# reassigns such a parameter in a loop fails to compile only then ("Loop
# carried variable ... changed type"), on the GPU and never on the interpreter.
ONES: frozenset = frozenset()
# (kernel, config, stages it compiled at) of each kernel that ptxas failed to
# compile at its config's stages, compiled again with fewer as a module's
# launch does (`_through_triton` in flashgen/runtime.py).
FEWER_STAGES: list = []


def compile_kernel(
    fn,
    config,
    *,
    dtype: str,
    head_dim: int,
    head_dim_pad: int,
    tma: bool,
    rows,
    pointers=None,
    seqs: bool = False,
    v_dim: int | None = None,
    v_in_k: bool = False,
    cache: int | None = None,
):
    """ptxas's report for `fn` compiled at `config` = (BLOCK_M, BLOCK_N, warps, stages);
    `v_dim`: v's head dim where it differs from q's (a module's V_DIM, MLA), and
    `v_in_k` compiles the forward's read-once path for v a view of k (V_IN_K);
    `pointers` gives the type of pointer parameters other than the tensors' and fp32 ones
    (a module's inputs and plans); `seqs` compiles the kernels of padded and varlen calls
    with sinks and position offsets (SEQS, HAS_SINKS and SHIFTED); `cache`: the
    decode kernel of a KV-cache call with pages of that size (0: contiguous)."""
    pointers = dict(pointers or {}, seq_ptr="*i32", seqlens_ptr="*i32", table_ptr="*i32")
    block_m, block_n, warps, stages = config
    v_dim = v_dim or head_dim
    v_dim_pad = lower.head_dim_pad(v_dim)
    constants = dict(
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=head_dim_pad,
        V_DIM=v_dim,
        V_DIM_PAD=v_dim_pad,
        K_REST_PAD=lower.head_dim_pad(head_dim - v_dim) if head_dim > v_dim else 0,
        V_IN_K=v_in_k,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        USE_TMA=tma,
        SEQS=seqs,
        HAS_SINKS=seqs,
        SHIFTED=seqs,
        CACHE=cache is not None,
        PAGE_SIZE=cache or 0,
        HEADS_FIRST=True,  # a document mask's forward grid (decision 069)
    )
    signature, attrs = {}, {}
    names = [p.name for p in fn.params]
    for i, p in enumerate(fn.params):
        name = p.name
        if p.is_constexpr:
            continue
        if name in pointers:
            signature[name] = pointers[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name.endswith("_ptr") or (name.endswith("_desc") and not tma):
            signature[name] = f"*{dtype}" if name.rsplit("_", 1)[0] in _TENSORS else "*fp32"
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name.endswith("_desc"):
            width = v_dim_pad if name in ("v_desc", "do_desc") else head_dim_pad
            signature[name] = f"tensordesc<{dtype}[1, 1, {rows}, {width}]>"
        elif name == "sm_scale":
            signature[name] = "fp32"
        elif (name.startswith("stride") and name.endswith("d")) or name in ("kv_group", *ONES):
            constants[name] = 1
        else:
            signature[name] = "i32"
            attrs[(i,)] = [["tt.divisibility", 16]]
    constants = {k: v for k, v in constants.items() if k in names}
    signature.update({k: "constexpr" for k in constants})
    try:
        kernel = triton.compile(
            ASTSource(fn, signature, constants, attrs),
            target=GPUTarget("cuda", 90, 32),
            options=dict(num_warps=warps, num_stages=stages),
        )
    except PTXASError:
        if stages <= 1:
            raise
        # As a module's launch does (`_through_triton`): one stage fewer.
        FEWER_STAGES.append((fn.__name__, tuple(config), stages - 1))
        config = (block_m, block_n, warps, stages - 1)
        return compile_kernel(
            fn, config, dtype=dtype, head_dim=head_dim, head_dim_pad=head_dim_pad, tma=tma,
            rows=rows, pointers=pointers, seqs=seqs, v_dim=v_dim, v_in_k=v_in_k, cache=cache,
        )  # fmt: skip
    return (*ptxas_report(kernel.asm["ptx"]), kernel.metadata.shared, kernel.asm["ptx"])


def compile_gluon(module, fn, descriptors, scalars, constants, options):
    """The same for a module's warp-specialized Gluon kernel `fn`:
    `descriptors` maps each descriptor parameter to its block's rows,
    `scalars` each other parameter to its type ("*fp32", "fp32", "i32";
    pointers and n_ctx taken as divisible by 16)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    dtype = {"torch.float16": gl.float16, "torch.bfloat16": gl.bfloat16}[str(module.DTYPE)]
    flat = torch.empty(4 * 16 * 4096, module.HEAD_DIM, dtype=module.DTYPE)
    kinds = dict(scalars)
    for name, rows in descriptors.items():
        layout = gl.NVMMASharedLayout.get_default_for([rows, module.HEAD_DIM], dtype)
        desc = module.GluonTensorDescriptor(
            flat, list(flat.shape), list(flat.stride()), [rows, module.HEAD_DIM], layout
        )
        kinds[name] = mangle_type(desc)
    kinds.update({name: "constexpr" for name in constants})
    # A mask's runtime data (decision 078): the call's plan, each declared
    # input's pointer in its own dtype, and its strides and sizes.
    inputs = {
        f"{name}_ptr": _POINTER[str(dtype_)] for name, dtype_, _ in getattr(module, "_INPUTS", ())
    }
    for p in fn.params:
        if p.name not in kinds and not p.is_constexpr:
            kinds[p.name] = "*i32" if p.name == "plan_ptr" else inputs.get(p.name, "i32")
    # In the kernel's parameter order; "*DTYPE" is a pointer to the module's dtype.
    element = {"torch.float16": "*fp16", "torch.bfloat16": "*bf16"}[str(module.DTYPE)]
    signature = {p.name: element if kinds[p.name] == "*DTYPE" else kinds[p.name] for p in fn.params}
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, (name, kind) in enumerate(signature.items())
        if kind.startswith("*") or name in ("n_ctx", "n_pad")
    }
    kernel = triton.compile(
        GluonASTSource(fn, signature, constants, attrs),
        target=GPUTarget("cuda", 90, 32),
        options=options,
    )
    return (*ptxas_report(kernel.asm["ptx"]), kernel.metadata.shared, kernel.asm["ptx"])


def gluon_resources(module, seqs: bool = False) -> list:
    """Resources of a module's Gluon kernels, launched as the module launches them;
    none where the module has none (no `GLUON`) or leaves them off (`GLUON` False: a
    Triton other than the one they were tested with, whose Gluon API differs; Triton
    3.9's does not compile them).  `seqs`: the kernels of varlen calls (VARLEN), where
    the module takes them (`_gluon_varlen_supported`, `_gluon_varlen_backward_supported`)."""
    found = []
    if not getattr(module, "GLUON", False):
        return found
    if hasattr(module, "_gluon_attn_fwd"):
        config = (64, 128, 4, module.GLUON_STAGES)  # rows per consumer, BLOCK_N, warps, buffers
        scalars = dict(o_ptr="*DTYPE", lse_ptr="*fp32", alibi_slopes_ptr="*fp32", qk_scale="fp32")
        scalars.update(n_ctx="i32", num_heads="i32", group="i32")
        varlen = seqs and hasattr(module, "_gluon_varlen_supported")
        table = "*i32" if varlen else "*fp32"  # a dense call passes lse for the varlen table
        scalars.update(tiles_ptr=table, lse_stride="i32")
        params = {p.name for p in module._gluon_attn_fwd.params}
        resources = compile_gluon(
            module,
            module._gluon_attn_fwd,
            dict(q_desc=64, k_desc=128, v_desc=128, o_desc=64),
            {name: kind for name, kind in scalars.items() if name in params},
            {
                name: v
                for name, v in dict(STAGES=module.GLUON_STAGES, VARLEN=varlen).items()
                if name in params
            },
            dict(num_warps=4, maxnreg=168),
        )
        label = "_gluon_attn_fwd[varlen]" if varlen else "_gluon_attn_fwd"
        found.append(Resources(label, config, True, *resources))
    if hasattr(module, "_gluon_attn_bwd_dkdv"):
        varlen = seqs and hasattr(module, "_gluon_varlen_backward_supported")
        tile = module.GLUON_BWD_TILE
        scalars = dict(
            dk_ptr="*DTYPE",
            dv_ptr="*DTYPE",
            lse_ptr="*fp32",
            delta_ptr="*fp32",
            alibi_slopes_ptr="*fp32",
            sm_scale="fp32",
            n_ctx="i32",
            num_heads="i32",
            kv_group="i32",
            n_pad="i32",
            tiles_ptr="*i32" if varlen else "*fp32",  # a dense call passes lse for the table
            lse_stride="i32",
        )
        dq_scalars = dict(
            scalars, dq_ptr="*DTYPE", o_ptr="*DTYPE", dlse_ptr="*fp32", lse_pad_ptr="*fp32"
        )
        # The streamed tiles' rows: Q and dO in the dK/dV kernel, K and V in the dQ kernel.
        rows, cols = getattr(module, "GLUON_BWD_STREAMS", (tile, tile))
        dkdv = dict(q=rows, k=tile, v=tile, do=rows, dk=tile, dv=tile)
        dq = dict(q=tile, k=cols, v=cols, do=tile, dq=tile)
        for kernel, blocks, more, constants in (
            ("_gluon_attn_bwd_dkdv", dkdv, scalars, {}),
            ("_gluon_attn_bwd_dq", dq, dq_scalars, dict(HAS_DLSE=False)),
        ):
            fn = getattr(module, kernel)
            params = {p.name for p in fn.params}
            stages = module.GLUON_BWD_STAGES[kernel.endswith("_dq")]
            resources = compile_gluon(
                module,
                fn,
                {f"{name}_desc": r for name, r in blocks.items()},
                {name: kind for name, kind in more.items() if name in params},
                {
                    name: v
                    for name, v in dict(constants, STAGES=stages, VARLEN=varlen).items()
                    if name in params
                },
                dict(num_warps=4),
            )
            streamed = rows if kernel.endswith("_dkdv") else cols
            label = f"{kernel}[varlen]" if varlen else kernel
            found.append(Resources(label, (tile, streamed, 4, stages), True, *resources))
    return found


def normalized_ptx(ptx: str) -> str:
    """PTX without what names the source rather than the code: `.loc` and
    `.file` lines, comments, the debug sections at the end, and the labels
    `$L__tmpN:` that only those sections read (they mark where an inlined
    function's code starts and ends, so moving code into a function adds
    them and renumbers the rest)."""
    ptx = ptx.split("\t.section\t.debug", 1)[0]
    kept = []
    for line in ptx.splitlines():
        stripped = line.strip()
        if stripped.startswith((".loc", ".file", "//")) or not stripped:
            continue
        if re.fullmatch(r"\$L__tmp\d+:", stripped):
            continue
        kept.append(line)
    return "\n".join(kept) + "\n"


def _ptxas() -> str:
    """The ptxas that Triton itself assembles sm_90 code with: from 3.9 on that
    is the newer one its wheel ships as ptxas-blackwell, whose PTX version the
    older `bin/ptxas` (CUDA 12.9) refuses."""
    from triton.backends.nvidia import compiler

    try:
        return compiler.get_ptxas(90).path
    except TypeError:  # Triton 3.5: one ptxas, and get_ptxas() takes no arch
        return compiler.get_ptxas().path


def ptxas_report(ptx: str) -> tuple[int, int, int]:
    """Registers per thread and spill stores / loads (bytes) that the ptxas
    shipped with Triton reports for `ptx` on sm_90a."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        out = subprocess.run(
            [_ptxas(), "-arch=sm_90a", "-v", path, "-o", os.path.join(tmp, "k.cubin")],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
    regs = int(re.search(r"Used (\d+) registers", out).group(1))
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
    return regs, int(spills.group(1)), int(spills.group(2))


@dataclasses.dataclass(frozen=True)
class Resources:
    kernel: str
    config: tuple[int, ...]  # block_m, block_n, warps, stages
    tma: bool
    registers: int
    spill_stores: int
    spill_loads: int
    shared: int
    ptx: str = dataclasses.field(default="", repr=False)  # as compiled (see `normalized_ptx`)


_POINTER_TYPES = {
    torch.int32: "*i32", torch.int64: "*i64", torch.float32: "*fp32",
    torch.float16: "*fp16", torch.bfloat16: "*bf16",
}  # fmt: skip


def plan_resources(module, seqs: bool = False) -> list:
    """Resources of the plan kernel of a data-reading mask (`_attn_plan`, which
    classifies query tiles and key tiles in one launch) at the forward's tile
    shape and at the backward's widest; `seqs`: the plan of padded and varlen
    calls with offsets (SEQS, SHIFTED)."""
    if not hasattr(module, "_attn_plan"):
        return []
    fn = module._attn_plan
    inputs = getattr(module, "_INPUTS", ())
    pointers = {f"{name}_ptr": _POINTER_TYPES[dtype] for name, dtype, _ in inputs}
    found = []
    # A group of 2 tiles a program (N = 16384, B = 1 at 64-row tiles), and of the most.
    shapes = [(*module.GPU_CONFIG[:2], 2), (128, 64, module.PLAN_GROUP_MAX)]
    for outer, inner, group in shapes:
        constants = dict(
            OUTER=outer, INNER=inner, CHUNK=max(1, 4096 // inner), GROUP=group,
            SEQS=seqs, SHIFTED=seqs,
        )  # fmt: skip
        signature = {}
        for p in fn.params:
            if p.name in constants:
                signature[p.name] = "constexpr"
            elif p.name in ("q_plan_ptr", "k_plan_ptr", "seq_ptr"):
                signature[p.name] = "*i32"
            else:
                signature[p.name] = pointers.get(p.name, "i32")
        kernel = triton.compile(
            ASTSource(fn, signature, constants, {}),
            target=GPUTarget("cuda", 90, 32),
            options=dict(num_warps=4, num_stages=1),
        )
        report = (*ptxas_report(kernel.asm["ptx"]), kernel.metadata.shared, kernel.asm["ptx"])
        found.append(Resources("_attn_plan", (outer, inner, 4, 1), False, *report))
    return found


def runs_resources(module) -> list:
    """Resources of the kernels with which a tile plan finds a packed batch's
    runs (decision 111: `_runs_count_kernel`, `_runs_write_kernel`,
    `_runs_finish_kernel`, then `_gluon_tiles_kernel`), for the module's
    ids, as launched on any shape and on contiguous ids of one batch row
    and one head (those parameters the constant 1)."""
    if not hasattr(module, "_runs_write_kernel"):
        return []
    doc = _POINTER_TYPES[module._INPUTS[0][1]]
    kernels = (
        (module._runs_count_kernel, dict(BLOCK=module._RUNS_BLOCK)),
        (module._runs_write_kernel, dict(BLOCK=module._RUNS_BLOCK)),
        (module._runs_finish_kernel, dict(PAIRS=module._RUNS_PAIRS)),
        (module._gluon_tiles_kernel, dict(BLOCK=module._TILES_BLOCK)),
    )
    found = []
    for ones in ((), ("stride_n", "batch", "heads", "kv_heads")):
        for fn, constants in kernels:
            constants = dict(constants, **{name: 1 for name in ones if name in fn.arg_names})
            signature = {}
            for p in fn.params:
                if p.name in constants:
                    signature[p.name] = "constexpr"
                elif p.name in ("doc", "ids"):
                    signature[p.name] = doc if p.name == "doc" else "*i64"
                elif p.name in ("counts", "tables", "found", "table", "tiles"):
                    signature[p.name] = "*i32"
                else:
                    signature[p.name] = "i32"
            kernel = triton.compile(
                ASTSource(fn, signature, constants, {}),
                target=GPUTarget("cuda", 90, 32),
                options=dict(num_warps=4, num_stages=1),
            )
            report = (*ptxas_report(kernel.asm["ptx"]), kernel.metadata.shared, kernel.asm["ptx"])
            found.append(Resources(fn.__name__, (len(ones), 0, 4, 1), False, *report))
    return found


def decode_resources(module, seqs: bool = False) -> list:
    """Resources of split-KV decoding (decision 052): `_attn_decode` at its
    largest and smallest tiles of query rows (64 and 16) and the module's
    GPU_DECODE_CONFIGS for them, the same on paged KV caches (decisions 056, 062;
    pointer loads, `_paged_stages`) at 64 rows with pages of 64 (a page per
    key tile) and at 16 rows with pages of 16 (a page per key row, tiles
    spanning pages), and the merge (`_attn_decode_merge`, 64 splits)."""
    if not hasattr(module, "_attn_decode"):
        return []
    dtype = _DTYPES[str(module.DTYPE)]
    pad = lower.head_dim_pad(module.HEAD_DIM)
    found = []
    gpu = torch.device("cuda")  # the GPU's launch (`_decode_config`); nothing runs on it
    for rows in (module.DECODE_MAX_ROWS, 16):
        block_n, warps, stages = module._decode_config(gpu, rows)
        config = (rows, block_n, warps, stages)
        tma = module.GPU_TMA and not seqs
        resources = compile_kernel(
            module._attn_decode,
            config,
            dtype=dtype,
            head_dim=module.HEAD_DIM,
            head_dim_pad=pad,
            tma=tma,
            rows=block_n,
            pointers=dict(o_ptr="*fp32"),
            seqs=seqs,
            v_dim=module.V_DIM,
            v_in_k=V_IN_K,
        )
        found.append(Resources("_attn_decode", config, tma, *resources))
    for rows, page_size in ((module.DECODE_MAX_ROWS, 64), (16, 16)):
        block_n, warps, stages = module._decode_config(gpu, rows)
        config = (rows, block_n, warps, module._paged_stages(stages, rows))
        resources = compile_kernel(
            module._attn_decode, config, dtype=dtype, head_dim=module.HEAD_DIM, head_dim_pad=pad,
            tma=False, rows=block_n, pointers=dict(o_ptr="*fp32"), seqs=seqs, cache=page_size,
            v_dim=module.V_DIM, v_in_k=V_IN_K,
        )  # fmt: skip
        found.append(Resources(f"_attn_decode_paged{page_size}", config, False, *resources))
    fn = module._attn_decode_merge
    # The merge handles o only: its HEAD_DIM is o's, V_DIM.
    v_pad = lower.head_dim_pad(module.V_DIM)
    constants = dict(HEAD_DIM=module.V_DIM, HEAD_DIM_PAD=v_pad, BLOCK_S=64, HAS_SINKS=seqs)
    signature = {
        p.name: (
            "constexpr"
            if p.name in constants
            else ("i32" if not p.name.endswith("_ptr") else "*fp32")
        )
        for p in fn.params
    }
    signature["o_ptr"] = f"*{dtype}"
    kernel = triton.compile(
        ASTSource(fn, signature, constants, {}),
        target=GPUTarget("cuda", 90, 32),
        options=dict(num_warps=1, num_stages=1),
    )
    report = (*ptxas_report(kernel.asm["ptx"]), kernel.metadata.shared, kernel.asm["ptx"])
    found.append(Resources("_attn_decode_merge", (1, 64, 1, 1), False, *report))
    return found


def module_resources(
    module, forward_config=None, backward_config=None, tma: bool = True, seqs: bool = False
):
    """Resources of a generated module's forward and backward kernels, at its
    own configs unless given; tma=False forces pointer loads; seqs=True
    compiles the kernels of padded and varlen calls (which load through
    pointers, but for the backward of a module built with `seqs_tma`,
    decision 072) instead."""
    seqs_tma = hasattr(module, "_tma_views")
    dtype = _DTYPES[str(module.DTYPE)]
    pad = lower.head_dim_pad(module.HEAD_DIM)
    passes = [
        (
            "_attn_fwd",
            tuple(forward_config or module.GPU_CONFIG),
            module.GPU_TMA and tma and not seqs,
        ),
        (
            "_attn_bwd",
            tuple(backward_config or module.GPU_BWD_CONFIG),
            module.GPU_BWD_TMA and tma and (not seqs or seqs_tma),
        ),
    ]
    pointers = {f"{name}_ptr": _POINTER_TYPES[t] for name, t, _ in getattr(module, "_INPUTS", ())}
    pointers.update(plan_ptr="*i32", dkdv_plan_ptr="*i32", dq_plan_ptr="*i32")
    found = []
    for kernel, config, use_tma in passes:
        # The forward streams K/V tiles of BLOCK_N rows through descriptors;
        # the backward streams all of its tiles BLOCK_M rows at a time.
        rows = config[1] if kernel == "_attn_fwd" else config[0]
        resources = compile_kernel(
            getattr(module, kernel),
            config,
            dtype=dtype,
            head_dim=module.HEAD_DIM,
            head_dim_pad=pad,
            tma=use_tma,
            rows=rows,
            pointers=pointers,
            seqs=seqs,
            v_dim=module.V_DIM,
            v_in_k=V_IN_K,
        )
        found.append(Resources(kernel, config, use_tma, *resources))
    return (
        found
        + decode_resources(module, seqs)
        + plan_resources(module, seqs)
        + gluon_resources(module, seqs)
        + ([] if seqs else runs_resources(module))
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("specs", nargs="+")
    parser.add_argument(
        "--head-dim", type=int, nargs="+", default=[None], help="default: each spec's own"
    )
    parser.add_argument("--forward-config", type=int, nargs=4, metavar=("M", "N", "W", "S"))
    parser.add_argument("--backward-config", type=int, nargs=4, metavar=("M", "N", "W", "S"))
    parser.add_argument("--no-tma", action="store_true", help="pointer loads in both passes")
    parser.add_argument("--json", action="store_true", help="one JSON object per kernel")
    parser.add_argument(
        "--plan",
        nargs="+",
        action="extend",
        default=[],
        metavar="KNOB=VALUE",
        help="plan knobs, as flashgen bench's (repeatable)",
    )
    parser.add_argument(
        "--seqs",
        action="store_true",
        help="the kernels of padded and varlen calls, with sinks and offsets (SEQS, HAS_SINKS, "
        "SHIFTED)",
    )
    parser.add_argument(
        "--ptx",
        metavar="DIR",
        help="also write each kernel's PTX, without debug information, to DIR "
        "(scripts/same_ptx.sh compares two trees' kernels this way)",
    )
    parser.add_argument(
        "--gluon-forward-any",
        action="store_true",
        help="the Gluon forward for any mask and score at every band width and score cost"
        " (kernel_choice.GLUON_ANY_MIN_KEYS = 0, GLUON_ANY_MAX_SPECIAL_OPS unbounded)",
    )
    parser.add_argument(
        "--gluon-forward-head-dims",
        type=int,
        nargs="+",
        metavar="D",
        help="the head dims that get the Gluon forward, for any mask and score as for full and "
        "causal (kernel_choice.GLUON_FORWARD_HEAD_DIMS and GLUON_FORWARD_ANY_HEAD_DIMS; "
        "default: the module's own choice)",
    )
    parser.add_argument(
        "--v-in-k",
        action="store_true",
        help="the forward and decode kernels' path for v a view of k's first columns (V_IN_K)",
    )
    parser.add_argument(
        "--ones",
        nargs="+",
        default=[],
        metavar="NAME",
        help="integer parameters (n_queries, n_keys, num_heads, ...) compiled as the constant 1, "
        "as Triton specializes a launch's value 1",
    )
    args = parser.parse_args()
    global V_IN_K, ONES
    V_IN_K = args.v_in_k
    ONES = frozenset(args.ones)
    if args.gluon_forward_any:
        kernel_choice.GLUON_ANY_MIN_KEYS = 0
        kernel_choice.GLUON_ANY_MAX_SPECIAL_OPS = 1 << 30
    if args.gluon_forward_head_dims:
        dims = tuple(args.gluon_forward_head_dims)
        kernel_choice.GLUON_FORWARD_HEAD_DIMS = kernel_choice.GLUON_FORWARD_ANY_HEAD_DIMS = dims
    if os.environ.get("TRITON_INTERPRET") == "1":
        parser.error("unset TRITON_INTERPRET: the kernels must be compiled, not interpreted")
    for path in args.specs:
        for variant in api.check_sources({path: open(path).read()})[0]:
            for head_dim in args.head_dim:
                if head_dim:
                    variant = dataclasses.replace(variant, head_dim=head_dim)
                report(variant, args)


def report(variant, args) -> None:
    module = api.load_variant(variant, experiments.parse_settings(args.plan))
    try:
        found = module_resources(
            module, args.forward_config, args.backward_config, not args.no_tma, args.seqs
        )
    except Exception as e:  # noqa: BLE001 - a report, keep going
        print(
            f"{variant.name:<16} failed: {type(e).__name__}: {str(e)[-1500:] if os.environ.get('FULL_ERRORS') else str(e)[:200]}"
        )
        return
    for r in found:
        if args.ptx:
            name = f"{variant.name}-d{module.HEAD_DIM}-{r.kernel}.ptx"
            with open(os.path.join(args.ptx, name), "w", encoding="utf-8") as f:
                f.write(normalized_ptx(r.ptx))
        if args.json:
            record = dict(dataclasses.asdict(r), name=variant.name, head_dim=module.HEAD_DIM)
            record["v_head_dim"] = module.V_DIM
            del record["ptx"]
            print(json.dumps(record))
            continue
        print(
            f"{variant.name:<16} d{module.HEAD_DIM:<4} {r.kernel:<10} "
            f"{str(r.config):<18} tma={str(r.tma):<5}  regs {r.registers:3d}  "
            f"spills {r.spill_stores:5d} / {r.spill_loads:5d} B  smem {r.shared:6d} B",
            flush=True,
        )


if __name__ == "__main__":
    main()
