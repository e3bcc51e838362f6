"""The host runtime of every generated module: argument checks, launch
configurations, TMA descriptors and kernel launches.

This is ordinary, tested Python.  `flashgen.emit` copies its sections, each
between a `# flashgen: section NAME` line and the next, verbatim into every
module that needs them, after the module's own constants and kernels:

    common          argument checks, scale, launch configuration, TMA
    sequences       padded and varlen calls (sequence tables, tensor views); sinks
    alibi           ALiBi slopes (modules whose score uses them)
    inputs          declared inputs: checks, kernel arguments, the index rule
    input_grads     the learnable inputs' gradient buffers and their sums
    direct_launch   `_launch`: the launch path, with the one use of Triton internals
    compile_ahead   the backward's kernels compiled beside the first forward
    gluon           descriptors and the support test of the Hopper Gluon kernels
    gluon_varlen    the Gluon kernels' tiles and support test for varlen calls (the
                    knobs gluon_varlen, gluon_varlen_backward and
                    gluon_varlen_captured, decisions 102-107)
    document_runs   packed documents whose ids form runs, as the sequences of the
                    Gluon kernels of the mask's positional part (decision 109)

Everything above the first section is not copied: it stands for the names a
generated module defines itself, so that this file imports, lints and is
tested on its own (tests/test_runtime.py sets those names as a module would).
"""

# flashgen: not copied (a generated module defines these itself)
import contextlib
import functools
import io
import math
import os
import re
import sys
import threading
from typing import NamedTuple

import torch
import triton
import triton.language as tl

try:  # Hopper's tensor memory accelerator (TMA), Triton >= 3.4
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover
    TensorDescriptor = None
try:  # Gluon, Triton >= 3.5
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor

    GLUON = True
except ImportError:  # pragma: no cover
    gl = GluonTensorDescriptor = None
    GLUON = False

DTYPE = torch.float16
HEAD_DIM = 64
HEAD_DIM_PAD = 64
V_DIM = 64
DEFAULT_SCALE = 0.125
MAX_SEQ_LEN = 2**24
MAX_HEADS = 2**16
GPU_CONFIG = (128, 64, 4, 3)
GPU_BWD_CONFIG = (64, 64, 4, 2)
INTERPRETER_CONFIG = (32, 32, 1, 1)
GPU_DECODE_CONFIGS = ((64, 64, 4, 3),)
BOTTOM_RIGHT = True
GLUON_VARLEN_CAPTURED = False
# The declared inputs (name, dtype, shape) and the indices a call checks
# (flashgen/index_ranges.py): a module with inputs defines its own.
_INPUTS: tuple = ()
_INDEX_RANGES: tuple = ()
# The learnable inputs (their numbers among the inputs) and the reads whose
# gradients the dQ programs sum: (input number, slot per batch, per head,
# per query tile), see flashgen/input_grads.py.
_LEARNABLE: tuple = ()
_LEARNABLE_READS: tuple = ()


def _layout_backward(q, k, v, o, lse, do, dlse, scale, seqs, shifts, inputs=()):
    """The module's backward on the caller's layout (templates/module.py.j2)."""
    raise NotImplementedError


# flashgen: section common
def _cdiv(a: int, b: int) -> int:
    """ceil(a / b) (triton.cdiv, a constexpr function, costs microseconds on the host)."""
    return -(-a // b)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.lru_cache(maxsize=None)
def _capability(device: torch.device) -> tuple[int, int]:
    """The GPU's compute capability, looked up once per device (each call's
    host time counts when the kernels are short)."""
    return torch.cuda.get_device_capability(device)


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs=None) -> None:
    """q, k and v as the kernels take them (B, H, N, D); with `seqs` (a varlen
    or padded call, `_sequences`) the longest sequences are what is bounded."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype != DTYPE:
            raise TypeError(
                f"{name} has dtype {x.dtype}, but this module was built for {DTYPE} "
                f"(the spec's dtype); cast it or build the spec for {x.dtype}"
            )
        if x.dim() != 4:
            raise ValueError(
                f"{name} must have 4 dimensions (batch, heads, seq_len, head_dim), "
                f"got shape {tuple(x.shape)}"
            )
        dim = V_DIM if name == "v" else HEAD_DIM
        if x.shape[3] != dim:
            raise ValueError(
                f"{name} has head_dim {x.shape[3]}, but this module was built for "
                f"{'v_' if dim != HEAD_DIM else ''}head_dim = {dim}"
            )
        if x.device != q.device:
            raise ValueError(f"{name} is on {x.device}, but q is on {q.device}")
        if x.device.type != "cuda" and not _interpreting():
            raise ValueError(
                f"{name} is on {x.device}: the kernels run on CUDA devices, or on the "
                "CPU when TRITON_INTERPRET=1 is set before triton is imported"
            )
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(
            f"k and v must have the same shape bar the last, got {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"k has batch size {k.shape[0]}, but q has {q.shape[0]}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] != 0:
        raise ValueError(
            f"k has {k.shape[1]} heads, which must divide q's {q.shape[1]} heads (GQA/MQA)"
        )
    lengths = (q.shape[2], k.shape[2]) if seqs is None else seqs[1:3]
    for name, length in zip("qk", lengths):
        if length > MAX_SEQ_LEN:
            raise ValueError(
                f"{name} has sequence length {length}, more than this module's "
                f"MAX_SEQ_LEN = {MAX_SEQ_LEN}"
            )
    if q.shape[1] > MAX_HEADS:
        raise ValueError(
            f"q has {q.shape[1]} heads, more than this module's MAX_HEADS = {MAX_HEADS}"
        )


def _rows_in_int32(name: str, x: torch.Tensor, rows: int | None = None) -> torch.Tensor:
    """x, or a contiguous copy of it, such that the Triton kernels' 32-bit
    offsets reach every row of a head (and the tile past its end): row
    strides of a (B, N, H, D) layout seen as (B, H, N, D) pass 2^31 at
    N * H * D >= 2^31.  Where even the copy would not fit (N * head_dim near
    2^31), a ValueError names the tensor.  `rows`: the longest sequence of a
    varlen call, whose rows the kernels address from the sequence's start."""
    rows = x.shape[2] if rows is None else rows

    def fits(t: torch.Tensor) -> bool:
        last = (rows + 256) * abs(t.stride(2)) + x.shape[3] * abs(t.stride(3))
        return last < 2**31

    if fits(x):
        return x
    longest = (2**31 - 1) // x.shape[3] - 257  # the longest that fits() contiguous
    if rows <= longest:
        y = x.contiguous()
        # A varlen view keeps batch stride 0: every sequence indexes from row 0.
        return y if x.stride(0) else y.as_strided(y.shape, (0, *y.stride()[1:]))
    raise ValueError(
        f"{name} has {rows} rows of head_dim {x.shape[3]}: the kernels address a head's "
        f"rows with 32-bit offsets, so sequences are limited to {longest} at this head_dim"
    )


def _on_other_gpu(x: torch.Tensor) -> bool:
    """Whether x is on a GPU other than the current one (kernels launch on the
    current device, so a call on another GPU's tensors switches to it)."""
    return x.device.type == "cuda" and x.device.index != torch.cuda.current_device()


def _resolve_scale(scale) -> float:
    if scale is None:
        return DEFAULT_SCALE
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be finite and positive, got {scale}")
    # The kernels multiply by scale * log2(e) in float32: it must be a normal
    # float32 number, neither infinite (NaN scores) nor flushed toward zero.
    log2_scale = float(scale) * 1.4426950408889634
    float32 = torch.finfo(torch.float32)
    if not float32.tiny <= log2_scale <= float32.max:
        raise ValueError(
            f"scale must lie in [{float32.tiny / 1.4426950408889634:.6g}, "
            f"{float32.max / 1.4426950408889634:.6g}] (scale * log2(e) a normal "
            f"float32 number), got {scale}"
        )
    return float(scale)


def _launch_config(device: torch.device, backward: bool = False) -> tuple[int, int, int, int]:
    if device.type != "cuda":
        return INTERPRETER_CONFIG
    return GPU_BWD_CONFIG if backward else GPU_CONFIG


def _tma_supported(*tensors: torch.Tensor) -> bool:
    """TMA needs sm90+, 16-byte aligned bases and strides, contiguous rows of <= 256."""
    if TensorDescriptor is None:
        return False
    device = tensors[0].device
    if device.type == "cuda":
        if _capability(device)[0] < 9:
            return False
    elif not _interpreting():
        return False
    for x in tensors:
        if x.stride(-1) != 1 or x.data_ptr() % 16 != 0 or x.shape[-1] > 256:
            return False
        if any(s <= 0 or s * x.element_size() % 16 != 0 for s in x.stride()[:-1]):
            return False
    return True


def _use_tma(tma: bool | None, default: bool, *tensors: torch.Tensor) -> bool:
    if tma is None:  # automatic: the measured default, where the GPU has TMA
        return default and tensors[0].device.type == "cuda" and _tma_supported(*tensors)
    if tma and not _tma_supported(*tensors):
        raise ValueError(
            "tma=True needs an sm90+ GPU (or the interpreter), a last dimension with "
            "stride 1, and 16-byte aligned data and strides"
        )
    return bool(tma)


def _descriptors(use_tma: bool, block: int, *tensors: torch.Tensor) -> list:
    """TMA descriptors for (1, 1, block, D) blocks, D the tensor's padded head dim (as the
    tiles'), or the tensors themselves when the kernel loads through pointers."""
    if not use_tma:
        return list(tensors)
    shapes = [[1, 1, block, triton.next_power_of_2(max(x.shape[3], 16))] for x in tensors]
    return [TensorDescriptor(x, [*x.shape], [*x.stride()], b) for x, b in zip(tensors, shapes)]


def _check_blocks(block_m: int, block_n: int) -> None:
    for name, block in (("block_m", block_m), ("block_n", block_n)):
        if block < 16 or block & (block - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {block}")


def _check_backward_inputs(q: torch.Tensor, o, lse, do, dlse) -> None:
    """backward()'s own arguments: o and do shaped and typed as q's output,
    lse and dlse as its log-sum-exp (the kernels index them by shape)."""
    rows = tuple(q.shape[:3])
    for name, x, shape, dtypes in (
        ("o", o, (*rows, V_DIM), (DTYPE,)),
        ("lse", lse, rows, (torch.float32,)),
        ("do", do, (*rows, V_DIM), (DTYPE,)),
        ("dlse", dlse, rows, (torch.float16, torch.bfloat16, torch.float32)),
    ):
        if x is None and name in ("do", "dlse"):
            continue
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if tuple(x.shape) != shape:
            raise ValueError(f"{name} must have shape {shape} (from q), got {tuple(x.shape)}")
        if x.dtype not in dtypes:
            raise TypeError(f"{name} has dtype {x.dtype}, expected {' or '.join(map(str, dtypes))}")
        if x.device != q.device:
            raise ValueError(f"{name} is on {x.device}, but q is on {q.device}")


def _capturing(x: torch.Tensor) -> bool:
    """Whether a CUDA graph is being captured on x's device's current stream."""
    return x.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


# flashgen: section sequences
class Sequences:
    """The sequences of a padded or varlen batch, checked: made by
    `sequences(...)` once per batch (reading the lengths on the host once)
    and passed to every layer's `attention(..., sequences=...)`."""

    def __init__(self, varlen: bool, tensors: tuple, side: str, longest, rows, lengths, most):
        # lengths: on the host ([None, None] when made while a CUDA graph is captured)
        self.varlen, self.side, self.lengths = varlen, side, lengths
        self.longest = longest  # the longest query and key sequences (None: the call's)
        self.most = most  # varlen: max_seqlen_q and max_seqlen_k as given (None: the longest)
        self.rows = rows  # varlen: the rows of q and k the sequences cover (None: unread)
        self.tensors = tensors  # varlen: cu_seqlens_q, cu_seqlens_k; padded: seqlens_q, seqlens_k
        self.device = next(x.device for x in tensors if x is not None)
        self.batch = next(x.shape[0] - varlen for x in tensors if x is not None)
        same = tensors[0] is tensors[1] or (lengths[0] is not None and lengths[0] == lengths[1])
        self._tables: dict = {"same sequences": varlen and same}  # and tables by rows of q, k

    def bind(self, q: torch.Tensor, k: torch.Tensor) -> tuple:
        """What the kernels take for a call on q and k: (table, longest query
        sequence, longest key sequence, varlen, lengths, sizes, cache), the table
        (S, 4) int32 holding each sequence's first row of q, its queries, its first
        row of k, its keys, made on the GPU with every length clamped to the rows
        (and to the longest), a no-op for lengths checked on the host, a bound for
        lengths made while capturing; `lengths` for the index check, `sizes` the
        inputs' Nq, Nk; `cache` a dict that lives as long as these sequences."""
        for name, x in (("q", q), ("k", k)):
            dims, layout = (3, "(tokens, heads, head_dim)") if self.varlen else (4, "(B, H, N, D)")
            if not isinstance(x, torch.Tensor) or x.dim() != dims:
                raise ValueError(f"{name} must be a {dims}-d tensor {layout} for these sequences")
            if x.device != self.device:
                raise ValueError(f"{name} is on {x.device}, but the sequences on {self.device}")
        if self.varlen:
            for name, rows, x in zip("qk", self.rows or (None, None), (q, k)):
                if rows is not None and rows > x.shape[0]:
                    raise ValueError(
                        f"cu_seqlens_{name} reaches row {rows}, past {name}'s {x.shape[0]}"
                    )
            table = self._tables.get((q.shape[0], k.shape[0]))
            if table is None:
                count = self.tensors[0].shape[0] - 1
                table = torch.empty((count, 4), dtype=torch.int32, device=self.device)
                most = [2**31 - 1 if m is None else min(m, 2**31 - 1) for m in self.longest]
                if count:
                    _launch(
                        _bind_varlen, (_cdiv(count, 128),),
                        *self.tensors, table, count, q.shape[0], k.shape[0], *most, 128,
                    )  # fmt: skip
                self._tables[(q.shape[0], k.shape[0])] = table
            sizes = tuple(n if m is None else m for m, n in zip(self.most, self.longest))
            return (table, *self.longest, True, self.lengths, sizes, self._tables)
        (batch, _, n_q, _), n_k = q.shape, k.shape[2]
        if batch != self.batch:
            raise ValueError(f"q has batch size {batch}, but the sequences {self.batch}")
        for name, most, n in (("q", self.longest[0], n_q), ("k", self.longest[1], n_k)):
            if most is not None and most > n:
                raise ValueError(f"seqlens_{name} has a length {most}, past {name}'s {n} rows")
        table = self._tables.get((n_q, n_k))
        if table is None:
            columns = []
            for x, n in zip(self.tensors, (n_q, n_k)):
                lengths = torch.full((batch,), n, device=q.device) if x is None else x.long()
                lengths = lengths.clamp(0, n)
                first = n - lengths if self.side == "left" else torch.zeros_like(lengths)
                columns += [first, lengths]
            table = self._tables[(n_q, n_k)] = torch.stack(columns, 1).to(torch.int32)
        longest = tuple(n if m is None else m for m, n in zip(self.longest, (n_q, n_k)))
        return (table, *longest, False, self.lengths, (n_q, n_k), self._tables)


@triton.jit
def _bind_varlen(cu_q, cu_k, table, count, rows_q, rows_k, most_q, most_k, BLOCK: tl.constexpr):
    """`Sequences.bind`'s table of a varlen call in one launch: each
    sequence's first row of q and its queries, then of k and its keys, every
    first row clamped to the tensor's rows and every length to them and to
    the longest (lengths made while capturing are unchecked)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = i < count
    for side in tl.static_range(2):
        cu = cu_q if side == 0 else cu_k
        rows = rows_q if side == 0 else rows_k
        most = most_q if side == 0 else most_k
        first = tl.load(cu + i, mask=inside, other=0).to(tl.int64)
        first = tl.minimum(tl.maximum(first, 0), rows)
        end = tl.load(cu + i + 1, mask=inside, other=0).to(tl.int64)
        end = tl.minimum(tl.maximum(end, 0), rows)
        length = tl.minimum(tl.maximum(end - first, 0), most)
        tl.store(table + i * 4 + 2 * side, first.to(tl.int32), mask=inside)
        tl.store(table + i * 4 + 2 * side + 1, length.to(tl.int32), mask=inside)


def _sequences(
    *, seqlens_q=None, seqlens_k=None, padding_side: str = "right",
    cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, documents=None,
) -> Sequences | None:  # fmt: skip
    """The sequences of a padded batch (seqlens_q and seqlens_k: int tensors
    (B,) of each row's real queries and keys, the first ones or with
    padding_side "left" the last; either may be None: all real) or of a
    varlen one (cu_seqlens_q and cu_seqlens_k: (S + 1,) cumulative lengths,
    FlashAttention's convention; max_seqlen_* are optional and checked), or
    of packed documents (`documents`: int ids (B, N), each run of one id
    along a row a sequence of its own, its queries its keys: a varlen batch
    of the B * N tokens, `_document_runs`).  Checked here, with one read of
    the lengths on the host; None when no lengths are given.  While a CUDA
    graph is captured nothing is read: a varlen call then needs max_seqlen_q
    and max_seqlen_k, a padded one takes its rows for the longest, and
    `Sequences.bind` clamps every length to them (the values are the
    caller's to keep right, as in FlashAttention)."""
    if documents is not None:
        others = (seqlens_q, seqlens_k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        if any(x is not None for x in others) or padding_side != "right":
            raise ValueError("pass documents= alone: its runs are the sequences")
        cu = _document_runs(documents)
        return _sequences(cu_seqlens_q=cu, cu_seqlens_k=cu)
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    lengths = (seqlens_q, seqlens_k, cu_seqlens_q, cu_seqlens_k)
    named = zip(("seqlens_q", "seqlens_k", "cu_seqlens_q", "cu_seqlens_k"), lengths)
    given = {name: x for name, x in named if x is not None}
    if padding_side not in ("right", "left"):
        raise ValueError(f'padding_side must be "right" or "left", got {padding_side!r}')
    if not varlen and (max_seqlen_q, max_seqlen_k) != (None, None):
        raise ValueError("max_seqlen_q and max_seqlen_k are for varlen calls (cu_seqlens_*)")
    if not given:
        return None
    if varlen and (seqlens_q is not None or seqlens_k is not None):
        raise ValueError("pass seqlens_q/seqlens_k (padded) or cu_seqlens_q/cu_seqlens_k, not both")
    if varlen and (cu_seqlens_q is None or cu_seqlens_k is None):
        raise ValueError("a varlen call needs both cu_seqlens_q and cu_seqlens_k")
    first = next(iter(given.values()))
    for name, x in given.items():
        if not isinstance(x, torch.Tensor) or x.dtype not in (torch.int32, torch.int64):
            raise TypeError(
                f"{name} must be an int32 or int64 tensor, got {getattr(x, 'dtype', x)!r}"
            )
        if x.dim() != 1 or x.shape[0] == 0 or x.shape[0] != first.shape[0]:
            raise ValueError(f"{name} must have shape ({first.shape[0]},), got {tuple(x.shape)}")
        if x.device != first.device:
            raise ValueError(f"{name} is on {x.device}, but {next(iter(given))} on {first.device}")
    if _capturing(first):
        most = (max_seqlen_q, max_seqlen_k)
        if varlen and not all(type(m) is int and m >= 0 for m in most):
            raise ValueError(
                "a varlen call captured in a CUDA graph needs max_seqlen_q and max_seqlen_k, "
                f"ints >= 0 (its lengths cannot be read while capturing): got {most}"
            )
        tensors = (cu_seqlens_q, cu_seqlens_k) if varlen else (seqlens_q, seqlens_k)
        longest = most if varlen else (None, None)
        return Sequences(varlen, tensors, padding_side, longest, None, [None, None], most)
    # One read on the host for all of them.
    values = torch.cat([x.long() for x in given.values()]).tolist()
    values = dict(
        zip(given, (values[i : i + first.shape[0]] for i in range(0, len(values), first.shape[0])))
    )
    for name, row in values.items():
        for i, n in enumerate(row):
            low = row[i - 1] if varlen and i else 0
            if not low <= n < 2**31 or (varlen and i == 0 and n != 0):
                rule = "from 0, non-decreasing" if varlen else "non-negative"
                raise ValueError(f"{name}[{i}] = {n}: {name} must be {rule}, below 2^31")
    if varlen:
        lengths = [[b - a for a, b in zip(row, row[1:])] for row in values.values()]
        longest = tuple(max(n, default=0) for n in lengths)
        tensors = (cu_seqlens_q, cu_seqlens_k)
        rows = (values["cu_seqlens_q"][-1], values["cu_seqlens_k"][-1])
    else:
        lengths = [values.get(f"seqlens_{s}") for s in "qk"]  # None: every row
        longest, tensors, rows = tuple(x and max(x) for x in lengths), (seqlens_q, seqlens_k), None
    for name, most, limit in (
        ("max_seqlen_q", longest[0], max_seqlen_q),
        ("max_seqlen_k", longest[1], max_seqlen_k),
    ):
        if limit is not None and (type(limit) is not int or limit < most):
            raise ValueError(
                f"{name} must be an int >= the longest sequence, {most}: got {limit!r}"
            )
    most = (max_seqlen_q, max_seqlen_k)
    return Sequences(varlen, tensors, padding_side, longest, rows, lengths, most)


def _document_runs(documents) -> torch.Tensor:
    """cu_seqlens (int32) of the runs of equal ids along each row of
    `documents` (B, N): a sequence starts at every row's first token and
    wherever the id changes, so an id that comes back later in a row starts
    another sequence (unlike the mask doc[b, q] == doc[b, k], which joins
    them).  Reads the runs' starts on the host, once."""
    if not isinstance(documents, torch.Tensor) or documents.dtype not in (torch.int32, torch.int64):
        got = getattr(documents, "dtype", documents)
        raise TypeError(f"documents must be an int32 or int64 tensor, got {got!r}")
    if documents.dim() != 2:
        raise ValueError(f"documents must have shape (B, N), got {tuple(documents.shape)}")
    if _capturing(documents):
        raise ValueError(
            "documents= reads where runs start on the host, which a CUDA graph's capture cannot: "
            "pass cu_seqlens_q, cu_seqlens_k, max_seqlen_q and max_seqlen_k"
        )
    starts = torch.ones(documents.shape, dtype=torch.bool, device=documents.device)
    starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
    first = starts.reshape(-1).nonzero().flatten()
    end = torch.tensor([documents.numel()], device=documents.device)
    return torch.cat([first, end]).to(torch.int32)


sequences = _sequences  # attention()'s argument `sequences` hides the name there


def _bound_sequences(q, k, given, **lengths) -> tuple | None:
    """attention()'s sequences, bound to its q and k (`Sequences.bind`):
    `given` (from sequences()) or made from the lengths, not both."""
    if given is None:
        for name, x in lengths.items():  # before _sequences reads them
            if isinstance(x, torch.Tensor) and x.device != getattr(q, "device", x.device):
                raise ValueError(f"{name} is on {x.device}, but q is on {q.device}")
        given = _sequences(**lengths)
        return given and given.bind(q, k)
    if not isinstance(given, Sequences):
        raise TypeError(f"sequences must come from sequences(...), got {type(given).__name__}")
    side = lengths.pop("padding_side")
    if side != "right" or any(x is not None for x in lengths.values()):
        raise ValueError("pass sequences= or the lengths it was made from, not both")
    return given.bind(q, k)


def _kernel_view(x: torch.Tensor, seqs) -> torch.Tensor:
    """A varlen tensor (T, H, D) as the kernels' (1, H, T, D) with batch
    stride 0 (every sequence's rows count from the tensor's start), a varlen
    lse (H, T) as (1, H, T); others as they are."""
    if seqs is None or not seqs[3]:
        return x
    if x.dim() == 2:
        return x.as_strided((1, *x.shape), (0, *x.stride()))
    return x.as_strided(
        (1, x.shape[1], x.shape[0], x.shape[2]), (0, x.stride(1), x.stride(0), x.stride(2))
    )


def _user_view(x: torch.Tensor, seqs) -> torch.Tensor:
    """The inverse of _kernel_view."""
    if seqs is None or not seqs[3]:
        return x
    return x[0].transpose(0, 1) if x.dim() == 4 else x[0]


def _seq_full(shape: tuple, seqs, like: torch.Tensor, fill: float = 0.0, dtype=None, keys=False):
    """A kernel-layout (B, H, N[, D]) tensor whose rows that no sequence covers
    (padding, or rows past a varlen call's last sequence) hold `fill`; the
    kernels write every row of every sequence.  A varlen call's rows of
    sequences are left unwritten here (a memset of a whole output cost ~8%
    of a varlen forward or backward): its rows past the last query sequence
    (or, with `keys`, key sequence) are filled on the host where its
    lengths were read, else on the GPU (`_fill_rows_past`)."""
    dtype = dtype or like.dtype
    if not seqs[3]:
        return torch.full(shape, fill, dtype=dtype, device=like.device)
    rows = shape[2]
    user = (rows, shape[1], shape[3]) if len(shape) == 4 else shape[1:]  # (T, H, D) or (H, T)
    x = torch.empty(user, dtype=dtype, device=like.device)
    table, lengths = seqs[0], seqs[4][keys] if len(seqs) > 4 else None  # none: a custom op's
    if lengths is not None or table.shape[0] == 0:
        end = sum(lengths or ())  # cu_seqlens run from 0 without gaps (checked)
        (x[end:] if len(shape) == 4 else x[:, end:]).fill_(fill)
    elif x.numel():
        inner = x.numel() // rows if len(shape) == 4 else 1
        outer, outer_stride, row_stride = (1, 0, inner) if len(shape) == 4 else (user[0], rows, 1)
        _launch(
            _fill_rows_past, (_cdiv(rows, 256),),
            x, table, table.shape[0], 2 * keys, rows, outer, inner, row_stride, outer_stride, fill,
            256, 16, 256,
        )  # fmt: skip
    return _kernel_view(x, seqs)


@triton.jit
def _fill_rows_past(
    x, table, sequences, column, rows, outer, inner, row_stride, outer_stride, fill,
    SPAN: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """`_seq_full` while a CUDA graph is captured: the rows of x (`outer`
    blocks of them: heads of an lse (H, T)) from the end of the last sequence
    of `table` (its first row and length at `column`, read on the GPU) to
    `rows` get `fill`.  A program per SPAN rows: one whose rows all lie
    before that end (most, where sequences fill the rows) writes nothing."""
    last = table + (sequences - 1) * 4 + column
    end = tl.minimum(tl.load(last) + tl.load(last + 1), rows)
    first = tl.program_id(0) * SPAN
    if first + SPAN > end:
        for block in range(0, outer):
            base = x + block * outer_stride  # H * T < 2^31: q of as many rows (x D) would not fit
            for start in range(first, first + SPAN, ROWS):
                row = start + tl.arange(0, ROWS)
                for column_start in range(0, inner, BLOCK):
                    column_in = column_start + tl.arange(0, BLOCK)
                    at = base + row[:, None].to(tl.int64) * row_stride + column_in[None, :]
                    inside = (row[:, None] >= end) & (row[:, None] < rows)
                    inside &= column_in[None, :] < inner
                    tl.store(at, tl.full([ROWS, BLOCK], fill, tl.float32), mask=inside)


def _check_sinks(sinks, q: torch.Tensor):
    """sinks as attention() takes them: None, or a real (H,) tensor on q's device."""
    if sinks is None:
        return None
    if not isinstance(sinks, torch.Tensor) or not sinks.is_floating_point():
        raise TypeError(f"sinks must be a real tensor, got {getattr(sinks, 'dtype', sinks)!r}")
    if tuple(sinks.shape) != (q.shape[1],):
        raise ValueError(
            f"sinks must have shape ({q.shape[1]},), one per head, got {tuple(sinks.shape)}"
        )
    if sinks.device != q.device:
        raise ValueError(f"sinks is on {sinks.device}, but q is on {q.device}")
    return sinks


def _check_shifts(q_offset, k_offset, q: torch.Tensor, k: torch.Tensor, seqs) -> tuple | None:
    """attention()'s offsets: None (the spec's alignment) or (q_offset, k_offset),
    ints >= 0 keeping every position below MAX_SEQ_LEN (the int32 proofs' bound)."""
    if q_offset is None and k_offset is None:
        return None
    lengths = (q.shape[2], k.shape[2]) if seqs is None else seqs[1:3]
    for name, offset, n in (("q_offset", q_offset, lengths[0]), ("k_offset", k_offset, lengths[1])):
        if offset is not None and type(offset) is not int:
            raise TypeError(f"{name} must be an int, got {type(offset).__name__}")
        if (offset or 0) < 0:
            raise ValueError(f"{name} must be >= 0, got {offset}")
        if (offset or 0) + n > MAX_SEQ_LEN:
            raise ValueError(f"{name} + {n} rows passes this module's MAX_SEQ_LEN = {MAX_SEQ_LEN}")
    return q_offset or 0, k_offset or 0


def _free_op_name(name: str) -> str:
    """`name`, or `name` with a count, that no operator of the namespace
    flashgen has yet (a module imported twice registers its ops twice)."""
    taken, count = name, 1
    while hasattr(torch.ops.flashgen, f"{taken}_fwd"):
        taken, count = f"{name}_{count}", count + 1
    return taken


def _op_args(table, call: list, sinks=None) -> tuple:
    """The custom ops' arguments back as (seqs, sinks, shifts): call is [longest q,
    longest k, varlen, q_offset, k_offset, shifted, q's sequences are k's]."""
    seqs = None if table is None else (table, call[0], call[1], bool(call[2]))
    if seqs and call[2] and call[6]:  # bound as in a capture: no lengths on the host
        seqs += ([None, None], tuple(call[:2]), {"same sequences": True})
    return seqs, sinks, (tuple(call[3:5]) if call[5] else None)


def _owned_user_view(x: torch.Tensor, seqs) -> torch.Tensor:
    """A kernel-layout output in the caller's layout, not a view (as custom ops return)."""
    x = _user_view(x, seqs)
    return x if x._base is None else x._base


def _sinks_grad(sinks, o, lse, do, dlse, seqs) -> torch.Tensor:
    """The gradient of the sinks, from o, lse, dO and dlse in the caller's
    layout: the sink's probability exp(sink - lse) times -(rowsum(dO * O) -
    dlse), summed over every row a sequence covers (a torch reduction: the
    same bits every call)."""
    o, lse = _kernel_view(o, seqs), _kernel_view(lse, seqs)
    if dlse is not None and seqs is not None and seqs[3]:
        dlse = dlse.unsqueeze(0)
    if do is None:
        delta = torch.zeros_like(lse)
    else:
        delta = (_kernel_view(do, seqs).float() * o.float()).sum(-1)
    if dlse is not None:
        delta = delta - dlse.float()
    p = torch.exp(sinks.float()[None, :, None] - lse)
    return -torch.where(torch.isfinite(lse), p * delta, 0.0).sum((0, 2)).to(sinks.dtype)


# flashgen: section decode
# Split-KV decoding (decision 052) takes a call whose query rows of one KV
# head's group (H / Hkv heads times Nq rows) fit one tile of this many rows.
DECODE_MAX_ROWS = 64
# Each split walks at least this many key tiles, so that its partial o (a
# workspace row per query row) costs less than the keys it reads.
DECODE_MIN_TILES = 4
DECODE_SPLIT_COST = 2  # key tiles' time: a split's prologue, partial o and merge
DECODE_ROW_PAGES = 16  # paged tiles of up to this many rows: a page per key row (decision 062)


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 2  # the interpreter: a few splits where the keys allow
    return torch.cuda.get_device_properties(device).multi_processor_count


def _decode_config(device: torch.device, block_m: int) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, num_stages) of `_attn_decode` for tiles of block_m rows."""
    interpreter = ((block_m, INTERPRETER_CONFIG[1], 1, 1),)
    configs = GPU_DECODE_CONFIGS if device.type == "cuda" else interpreter
    return next(c[1:] for c in configs if block_m <= c[0])


def _paged_stages(num_stages: int, block_m: int) -> int:
    """The stages of a paged cache's decode.  Tiles of up to DECODE_ROW_PAGES
    rows load each key row's page as a vector, so their K and V loads wait for a
    block-table load that Triton's pipeliner stages ahead of them: it keeps
    (stages - 1) // 2 K/V buffers for such loads against stages - 1 for the
    contiguous cache's (sm_90a, decision 062), and 2 * stages - 1 keeps the
    contiguous cache's buffers and shared memory.  Wider tiles load one page
    per key tile, as before: there the per-row pointers spilled (32 and 64
    rows) or passed the 227 KB of shared memory (d576 at 64 rows)."""
    return 2 * num_stages - 1 if block_m <= DECODE_ROW_PAGES else num_stages


def _page_block(page_size: int, block_n: int, block_m: int) -> int:
    """The key tile of a paged cache: the contiguous cache's where a tile
    loads a page per key row; for wider tiles the largest power of two up to
    block_n that divides page_size, so that no tile straddles two pages."""
    while block_m > DECODE_ROW_PAGES and page_size % block_n:
        block_n //= 2
    return block_n


def _decode_rows(q: torch.Tensor, k: torch.Tensor) -> int:
    """The query rows of one KV head's group: a decode tile's rows."""
    return q.shape[1] // k.shape[1] * q.shape[2]


@functools.lru_cache(maxsize=1024)  # a cache's capacity repeats call after call
def _decode_splits(programs: int, n_keys: int, block_n: int, sms: int) -> int:
    """Key splits per (batch, KV head), given `programs` of those: the fewest
    that minimise waves (two programs per SM) x (tiles per split + a split's
    fixed cost), each split DECODE_MIN_TILES key tiles or more (decision 052)."""
    tiles, most = _cdiv(n_keys, block_n), max(1, _cdiv(n_keys, block_n) // DECODE_MIN_TILES)
    fill = {min(most, max(1, w * 2 * sms // programs)) for w in range(1, 17)}  # full last waves
    return min(
        sorted({1, most} | fill),
        key=lambda s: _cdiv(programs * s, 2 * sms) * (_cdiv(tiles, s) + DECODE_SPLIT_COST),
    )


# KV caches (decision 056): `cache_seqlens` gives each batch row's keys, the
# first of a (B, Hkv, Nmax, D) cache or the pages of a (pages, page_size,
# Hkv, D) one that `block_table` lists.  Every decision on the host follows
# from shapes, never from the lengths' values, so a call can be captured in a
# CUDA graph and replayed with new lengths and tables.


def _check_cache_call(tensors: dict, options: dict) -> None:
    """A cache call is inference only and takes none of `options` (the other
    kinds of call: sequences, offsets, launch configurations)."""
    for name, x in tensors.items():
        if isinstance(x, torch.Tensor) and x.requires_grad and torch.is_grad_enabled():
            raise ValueError(
                f"{name} requires grad, but a KV-cache call (cache_seqlens=) is inference "
                f"only: call it under torch.no_grad() or pass {name}.detach()"
            )
    for name, value in options.items():
        if value is not None:
            raise ValueError(f"{name} cannot be combined with cache_seqlens (a KV-cache call)")


def _cache_view(k: torch.Tensor, block_table) -> tuple[torch.Tensor, int, int]:
    """A cache as `_attn_decode` reads it: (B or pages, Hkv, rows, D), its
    capacity (keys per batch row) and its page size (0: not paged)."""
    if block_table is None:
        return k, k.shape[2], 0
    return k.transpose(1, 2), block_table.shape[1] * k.shape[1], k.shape[1]


def _check_new_keys(q, k_view, k_new, v_new) -> int:
    """k_new, v_new (B, Hkv, Nnew, D and V_DIM) for a cache whose kernel view
    is k_view, checked like q, k and v; returns Nnew (0: none given)."""
    if k_new is None and v_new is None:
        return 0
    if k_new is None or v_new is None:
        raise ValueError("k_new and v_new come together (the new keys and their values)")
    n = k_new.shape[2] if isinstance(k_new, torch.Tensor) and k_new.dim() == 4 else "Nnew"
    for name, x, width in (("k_new", k_new, HEAD_DIM), ("v_new", v_new, V_DIM)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype != DTYPE:
            raise TypeError(f"{name} must have dtype {DTYPE}, got {x.dtype}")
        shape = (q.shape[0], k_view.shape[1], n, width)  # (B, Hkv, Nnew, D)
        if tuple(x.shape) != shape or x.device != q.device:
            raise ValueError(f"{name} must have shape {shape} on {q.device}, got {tuple(x.shape)} on {x.device}")  # fmt: skip
    return n


def _append_to_cache(k, v, k_new, v_new, cache_seqlens, block_table) -> None:
    """Row b's new keys and values into the cache, contiguous or paged, at
    positions cache_seqlens[b] .. + Nnew - 1; nothing read on the host."""
    pos = cache_seqlens.long()[:, None] + torch.arange(k_new.shape[2], device=k.device)
    if block_table is not None:  # (pages, page_size, Hkv, D)
        page, slot = block_table.long().gather(1, pos // k.shape[1]), pos % k.shape[1]
    for cache, new in ((k, k_new), (v, v_new)):
        if block_table is None:  # (B, Hkv, capacity, D)
            cache.scatter_(2, pos[:, None, :, None].expand(new.shape), new)
        else:
            cache[page, slot] = new.transpose(1, 2)


def _decode_plan(q: torch.Tensor, k: torch.Tensor, n_keys: int, page_size: int = 0) -> tuple:
    """(BLOCK_M, BLOCK_N, row tiles, splits) of `_attn_decode` for q and the
    kernels' view of k with n_keys keys (a cache's capacity) per batch row:
    shapes only.  More than DECODE_MAX_ROWS rows per group take several row
    tiles (a grid axis).  A paged cache's tiles of up to 16 rows are the
    contiguous cache's (`_page_block`)."""
    rows = _decode_rows(q, k)
    row_tiles = _cdiv(rows, DECODE_MAX_ROWS)
    block_m = max(16, triton.next_power_of_2(_cdiv(rows, row_tiles)))
    block_n = _decode_config(q.device, block_m)[0]
    if page_size:
        block_n = _page_block(page_size, block_n, block_m)
    splits = _decode_splits(
        q.shape[0] * k.shape[1] * row_tiles, n_keys, block_n, _sm_count(q.device)
    )
    return block_m, block_n, row_tiles, splits


def _split_workspace(workspace, splits: int, rows: int, device: torch.device) -> tuple:
    """The splits' o (splits, rows, V_DIM) and lse (splits, rows), float32,
    in `workspace` (a caller's, e.g. one allocated before capturing a CUDA
    graph) or in new memory."""
    size = splits * rows * (V_DIM + 1)
    if workspace is None:
        workspace = torch.empty(size, dtype=torch.float32, device=device)
    elif not (
        isinstance(workspace, torch.Tensor) and workspace.dtype == torch.float32
        and workspace.device == device and workspace.is_contiguous() and workspace.numel() >= size
    ):  # fmt: skip
        raise ValueError(
            f"workspace must be a contiguous float32 tensor on {device} of at least {size} "
            "elements (cache_workspace() makes one)"
        )
    o_part = workspace[: splits * rows * V_DIM].view(splits, rows, V_DIM)
    return o_part, workspace[splits * rows * V_DIM : size].view(splits, rows)


def cache_workspace(q: torch.Tensor, k_cache: torch.Tensor, block_table=None) -> torch.Tensor:
    """A float32 workspace for KV-cache calls with q's shape and this cache
    (and block table's shape): pass it as workspace= so that the call
    allocates nothing but its outputs, e.g. inside a captured CUDA graph."""
    k, n_keys, page_size = _cache_view(k_cache, block_table)
    splits = _decode_plan(q, k, n_keys, page_size)[3]
    rows = q.shape[0] * q.shape[1] * q.shape[2]
    return torch.empty(splits * rows * (V_DIM + 1), dtype=torch.float32, device=q.device)


def _check_cache(q, k, v, cache_seqlens, block_table, check_values=None, new=(None, None)) -> tuple:
    """q (B, H, Nq, D) and a KV cache as attention() takes them; returns the
    kernels' views of k and v, the capacity, the page size (`_cache_view`),
    and the lengths the call attends to: cache_seqlens, plus the keys of
    new = (k_new, v_new) where given (`_append_to_cache`).

    Shapes, dtypes and devices are checked always.  The values (every length
    in 0 .. capacity, every page a row reads within the cache) need the host
    to read them, a synchronization: checked when check_values is True, or
    None (the default) outside CUDA-graph capture; never while capturing."""
    _check_inputs(q, q, q[..., :1].expand(*q.shape[:3], V_DIM))  # q's own type, shape, device
    paged = block_table is not None
    for name, x, dtype in (
        ("cache_seqlens", cache_seqlens, torch.int32), ("block_table", block_table, torch.int32),
        ("k", k, DTYPE), ("v", v, DTYPE),
    ):  # fmt: skip
        if x is None and name == "block_table":
            continue
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype != dtype:
            raise TypeError(f"{name} must have dtype {dtype}, got {x.dtype}")
        if x.device != q.device:
            raise ValueError(f"{name} is on {x.device}, but q is on {q.device}")
        if dtype == torch.int32 and x.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    layout = "(pages, page_size, Hkv, D)" if paged else "(B, Hkv, capacity, D)"
    for name, x, width, what in (("k", k, HEAD_DIM, "head_dim"), ("v", v, V_DIM, "v_head_dim")):
        if x.dim() != 4 or x.shape[3] != width:
            raise ValueError(
                f"{name} must be a KV cache {layout} with {what} {width}, got shape "
                f"{tuple(x.shape)}"
            )
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(
            f"k and v must have the same shape but for their last dimension, got "
            f"{tuple(k.shape)} and {tuple(v.shape)}"
        )
    k_view, capacity, page_size = _cache_view(k, block_table)
    v_view = _cache_view(v, block_table)[0]
    batch = q.shape[0]
    if tuple(cache_seqlens.shape) != (batch,):
        raise ValueError(
            f"cache_seqlens must have shape ({batch},), got {tuple(cache_seqlens.shape)}"
        )
    if paged and (block_table.dim() != 2 or block_table.shape[0] != batch):
        raise ValueError(
            f"block_table must have shape ({batch}, max_blocks_per_seq), got "
            f"{tuple(block_table.shape)}"
        )
    if paged and page_size % 16:
        raise ValueError(f"k's page size (dim 1) must be a multiple of 16, got {page_size}")
    if not paged and k.shape[0] != batch:
        raise ValueError(f"k has batch size {k.shape[0]}, but q has {batch}")
    if q.shape[1] % k_view.shape[1]:
        raise ValueError(
            f"k has {k_view.shape[1]} heads, which must divide q's {q.shape[1]} heads (GQA/MQA)"
        )
    if capacity > MAX_SEQ_LEN:
        raise ValueError(f"the cache's capacity {capacity} passes MAX_SEQ_LEN = {MAX_SEQ_LEN}")
    for name, x in (("k", k_view), ("v", v_view)):
        # The kernels address a row's keys with 32-bit offsets from its first
        # page (or its base): capacity rows of the cache's row stride.
        if (capacity + 256) * abs(x.stride(2)) + x.shape[3] * abs(x.stride(3)) >= 2**31:
            raise ValueError(
                f"{name}: {capacity} keys per row at a row stride of {x.stride(2)} pass the "
                "kernels' 32-bit offsets"
            )
    appended = _check_new_keys(q, k_view, *new)
    lengths = cache_seqlens + appended if appended else cache_seqlens
    if check_values is None:
        check_values = not _capturing(q)
    if check_values:
        bad = [((cache_seqlens < 0) | (lengths > capacity)).any()]
        if paged:
            used = (
                torch.arange(block_table.shape[1], device=q.device) * page_size
                < lengths.clamp(0, capacity)[:, None]
            )
            bad.append((used & ((block_table < 0) | (block_table >= k.shape[0]))).any())
        bad = torch.stack(bad).tolist()  # one synchronization
        if bad[0] and appended:
            raise ValueError(
                f"cache_seqlens must lie in 0 .. {capacity - appended}: with the {appended} new "
                f"keys of k_new, each row must fit the cache's capacity {capacity}"
            )
        if bad[0]:
            raise ValueError(f"cache_seqlens must lie in 0 .. {capacity} (the cache's capacity)")
        if paged and bad[1]:
            raise ValueError(
                f"block_table lists a page outside 0 .. {k.shape[0] - 1} among those the "
                "rows' lengths use"
            )
    return k_view, v_view, capacity, page_size, lengths


# flashgen: section alibi
@functools.lru_cache(maxsize=None)
def _alibi_slopes(num_heads: int, device: torch.device) -> torch.Tensor:
    """ALiBi slopes, shape (num_heads,), float32.

    For H a power of two, slope_i = 2^(-8 (i + 1) / H).  Otherwise the ALiBi
    paper takes the slopes for n = 2^floor(log2 H) heads, then every other
    slope of the rule for 2n heads until there are H.
    """
    n = 1 << (num_heads.bit_length() - 1)
    slopes = [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    slopes += [2.0 ** (-8.0 * (i + 1) / (2 * n)) for i in range(0, 2 * (num_heads - n), 2)]
    return torch.tensor(slopes, dtype=torch.float32, device=device)


# flashgen: section inputs
def _check_runtime_inputs(
    q: torch.Tensor, k: torch.Tensor, inputs: tuple, seqs=None, shifts=None
) -> tuple:
    """The declared inputs, each checked like q, k and v (a tensor of its
    dtype and shape on q's device), and every index the kernels compute
    within its dimension at the call's sizes (`_index_problem`).  q and k
    as the kernels take them (`_kernel_view`); `seqs` and `shifts` as
    `_forward` takes them: then B is the number of sequences (b the
    sequence), Nq and Nk are the padded rows or varlen's max_seqlen_q and
    max_seqlen_k (the longest sequences if not given), and the indices are
    checked over the positions the call's sequences and offsets really have
    (`_positions`): index j of an Nk dimension is each sequence's position j."""
    sizes = {
        "B": q.shape[0] if seqs is None else seqs[0].shape[0],
        "H": q.shape[1],
        "Hkv": k.shape[1],
        "Nq": q.shape[2] if seqs is None else seqs[5][0],
        "Nk": k.shape[2] if seqs is None else seqs[5][1],
    }
    for (name, dtype, shape), x in zip(_INPUTS, inputs):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype != dtype:
            raise TypeError(f"{name} has dtype {x.dtype}, but the spec declares {dtype}")
        expected = tuple(sizes[d] if isinstance(d, str) else d for d in shape)
        if tuple(x.shape) != expected:
            raise ValueError(f"{name} must have shape {expected}, got {tuple(x.shape)}")
        if x.device != q.device:
            raise ValueError(f"{name} is on {x.device}, but q is on {q.device}")
    if seqs is None and shifts is None:
        problem = _index_problem(*sizes.values())
    else:
        lengths = (None, None) if seqs is None else (x and tuple(x) for x in seqs[4])
        positions = _positions(*lengths, sizes["Nq"], sizes["Nk"], shifts)
        if positions is None:
            return inputs  # no sequence has both queries and keys: nothing is read
        problem = _index_problem(*sizes.values(), positions)
    if problem is not None:
        raise ValueError(problem)
    return inputs


@functools.lru_cache(maxsize=256)
def _positions(queries: tuple | None, keys: tuple | None, n_q: int, n_k: int, shifts):
    """(first query, last query, first key, last key) over every sequence
    with queries and keys (the rule is monotone in them), or None: none has.
    queries, keys: each sequence's lengths (None: n_q or n_k each); shifts:
    the offsets, or None for each sequence's own alignment."""
    if queries is None and keys is None:  # one sequence, or rows of the call's lengths
        queries, keys = (n_q,), (n_k,)
    queries = (n_q,) * len(keys) if queries is None else queries
    keys = (n_k,) * len(queries) if keys is None else keys
    pairs = [(a, c) for a, c in zip(queries, keys) if a and c]
    if not pairs:
        return None
    most_q, most_k = max(a for a, _ in pairs), max(c for _, c in pairs)
    if shifts is not None:
        return (shifts[0], shifts[0] + most_q - 1, shifts[1], shifts[1] + most_k - 1)
    first = min(c - a for a, c in pairs) if BOTTOM_RIGHT else 0
    return (first, (most_k if BOTTOM_RIGHT else most_q) - 1, 0, most_k - 1)


def _input_args(inputs: tuple) -> list:
    """Each input's tensor, strides and sizes, as the kernels take them."""
    return [a for x in inputs for a in (x, *x.stride(), *x.shape)]


@functools.lru_cache(maxsize=1024)
def _index_problem(
    batch: int, heads: int, kv_heads: int, n_queries: int, n_keys: int, positions=None
):  # fmt: skip
    """Why a call of these sizes is refused, or None: an index whose interval
    over the positions, heads and batch where it is read leaves its
    dimension.  Every item of _INDEX_RANGES is (input, dimension, size,
    expression, guard); the guard bounds k - q, q and k where the read
    happens (None: unbounded).  `positions`: (first query, last query,
    first key, last key), for a call with sequences or offsets; None: those
    of the alignment."""
    if 0 in (batch, heads, n_queries, n_keys):
        return None  # nothing is read
    sizes = {"B": batch, "H": heads, "Hkv": kv_heads, "Nq": n_queries, "Nk": n_keys}
    if positions is None:
        offset = n_keys - n_queries if BOTTOM_RIGHT else 0
        positions = (offset, offset + n_queries - 1, 0, n_keys - 1)
    for name, dim, size, expr, guard in _INDEX_RANGES:
        d_lo, d_hi, gq_lo, gq_hi, gk_lo, gk_hi = guard
        q = _meet(positions[:2], gq_lo, gq_hi)
        k = _meet(positions[2:], gk_lo, gk_hi)
        d = _meet((k[0] - q[1], k[1] - q[0]), d_lo, d_hi)
        for _ in range(2):  # q and k through d = k - q, and back
            q = _meet(q, k[0] - d[1], k[1] - d[0])
            k = _meet(k, q[0] + d[0], q[1] + d[1])
            d = _meet(d, k[0] - q[1], k[1] - q[0])
        if q[0] > q[1] or k[0] > k[1] or d[0] > d[1]:
            continue  # never read
        env = {
            "q": q,
            "k": k,
            "d": d,
            "b": (0, batch - 1),
            "h": (0, heads - 1),
            "H": (heads, heads),
        }
        lo, hi = _index_interval(expr, env)
        size = sizes[size] if isinstance(size, str) else size
        if lo < 0 or hi >= size:
            return (
                f"`{name}`: index {dim} may reach {lo} .. {hi} in this call, outside its "
                f"dimension of size {size} (clamp the index with min and max, or pass a "
                f"larger `{name}`)"
            )
    return None


def _meet(a: tuple[int, int], lo, hi) -> tuple[int, int]:
    return (a[0] if lo is None else max(a[0], lo), a[1] if hi is None else min(a[1], hi))


def _index_interval(node: tuple, env: dict) -> tuple[int, int]:
    """The interval of an index expression: ("n", c), ("v", name), ("d",)
    (k - q), ("neg", a), ("abs", a),
    ("div", a, c), ("%", a, c), ("+", a, b), ("*", a, b), ("min", a, b),
    ("max", a, b)."""
    tag = node[0]
    if tag == "n":
        return node[1], node[1]
    if tag in ("v", "d"):
        return env[node[1] if tag == "v" else "d"]
    if tag in ("neg", "abs", "div", "%"):
        lo, hi = _index_interval(node[1], env)
        if tag == "neg" or (tag == "abs" and hi <= 0):
            return -hi, -lo
        if tag == "abs":
            return (lo, hi) if lo >= 0 else (0, max(-lo, hi))
        c = node[2]
        if tag == "div":
            return lo // c, hi // c
        return (lo % c, hi % c) if lo // c == hi // c else (0, c - 1)
    (alo, ahi), (blo, bhi) = _index_interval(node[1], env), _index_interval(node[2], env)
    if tag == "+":
        return alo + blo, ahi + bhi
    if tag == "*":
        corners = (alo * blo, alo * bhi, ahi * blo, ahi * bhi)
        return min(corners), max(corners)
    if tag == "min":
        return min(alo, blo), min(ahi, bhi)
    return max(alo, blo), max(ahi, bhi)


# flashgen: section input_grads
def _grad_buffers(inputs: tuple, batch: int, heads: int, query_tiles: int) -> list:
    """One zeroed float32 buffer (slots, *shape) per read of a learnable
    input (_LEARNABLE_READS: input, then whether the batch, the head and the
    dQ program's query tile get slots of their own); each dQ program writes
    its sums to its own slot."""
    buffers = []
    for number, per_batch, per_head, per_tile in _LEARNABLE_READS:
        slots = (batch if per_batch else 1) * (heads if per_head else 1)
        slots *= query_tiles if per_tile else 1
        x = inputs[number]
        buffers.append(torch.zeros((slots, *x.shape), dtype=torch.float32, device=x.device))
    return buffers


def _input_grads(inputs: tuple, buffers: list | None) -> list:
    """Each learnable input's gradient, in its dtype: its reads' buffers
    summed over their slots, always in the same order (deterministic).  No
    buffers: zeros (a call with nothing to attend)."""
    grads = []
    for number in _LEARNABLE:
        x, total = inputs[number], None
        for (read_of, *_), buffer in zip(_LEARNABLE_READS, buffers or ()):
            if read_of == number:
                total = buffer.sum(0) if total is None else total + buffer.sum(0)
        grads.append(torch.zeros_like(x) if total is None else total.to(x.dtype))
    return grads


# flashgen: section direct_launch
# --------------------------------------------------------------------------- #
# Direct launches: the one part of this module that uses Triton internals
# (the runtime driver, a compiled kernel's `function`, `packed_metadata` and
# `run`, and Triton's launch hooks).  It is on only where the running Triton
# is one this module was tested with; elsewhere, and whenever
# DIRECT_LAUNCH = False, every launch goes through kernel[grid](...).
# --------------------------------------------------------------------------- #

TESTED_TRITON = ("3.6.",)  # version prefixes
try:
    from triton import knobs as _knobs
    from triton.runtime.driver import driver as _driver
except ImportError:  # pragma: no cover
    _knobs = _driver = None
# Repeat launches call the compiled kernel directly (`_launch`).
DIRECT_LAUNCH = _driver is not None and triton.__version__.startswith(TESTED_TRITON)
# Compiled kernels by (kernel, device, specialization, launch options).
_COMPILED: dict = {}
try:
    from triton.runtime.errors import PTXASError as _PTXAS_ERROR
except ImportError:  # pragma: no cover
    _PTXAS_ERROR = ()  # catches nothing
# Launch options ptxas failed on -> the ones that compiled (`_through_triton`).
_FEWER_STAGES: dict = {}
# The devices whose CUDA context this thread has made current (`_bind_context`).
_THREAD = threading.local()


def _bind_context(device: int) -> None:
    """Makes the current device's CUDA context current in this thread: Triton
    encodes TMA descriptors before its launcher does, which failed ("invalid
    device context") in threads with no CUDA call yet (autograd's backward)."""
    torch.cuda.is_current_stream_capturing()  # a runtime call; legal while capturing
    _THREAD.devices = getattr(_THREAD, "devices", frozenset()) | {device}


def _specialization(args) -> tuple:
    """Everything of a launch's arguments that Triton may compile a kernel
    for: integers by value, tensors by dtype and alignment, TMA descriptors
    by their tensor, geometry and block (a superset of Triton's own key)."""
    key = []
    for a in args:
        kind = type(a)
        if kind is int or kind is bool:
            key.append(a)
        elif kind is float:
            key.append(None)  # a float argument is always fp32
        elif isinstance(a, torch.Tensor):
            key.append((a.dtype, a.data_ptr() % 16))
        else:  # a TMA descriptor (a Gluon one's layout follows from its block and dtype)
            base = a.base
            key.append(
                (base.dtype, base.data_ptr() % 16, *a.shape, *a.strides, *a.block_shape, a.padding)
            )
    return tuple(key)


# Argument types that stand in for Triton's own on direct launches (the
# Gluon section adds its descriptor stand-in) and are made real for a launch
# through Triton.
_STAND_INS: tuple = ()


def _triton_args(args) -> tuple:
    """A launch's arguments as Triton's own launch path takes them."""
    if not _STAND_INS:
        return args
    return tuple(a.descriptor() if isinstance(a, _STAND_INS) else a for a in args)


def _through_triton(kernel, grid, args: tuple, options: dict):
    """kernel[grid](*args, **options) through Triton (compiling on a first launch).
    Where ptxas fails on the kernel (Triton 3.6's crashed on the pipelined key loops
    of masks such as `k < 8`, decision 067), again with a stage fewer, down to 1:
    the same arithmetic, unpipelined loads; the options that compiled are kept.
    Triton prints the whole PTX to stdout when ptxas fails, so stdout is held
    while Triton runs (`_stdout_held`): the failures this recovers from print
    nothing, and the error of one it cannot says what failed."""
    key = (kernel, *options.items())
    options = _FEWER_STAGES.get(key, options)
    while True:
        try:
            with _stdout_held():
                return kernel[grid](*_triton_args(args), **options)
        except _PTXAS_ERROR:
            stages = options.get("num_stages", 3)
            if stages <= 1:
                raise
            options = _FEWER_STAGES[key] = dict(options, num_stages=stages - 1)


# What Triton 3.6 prints when ptxas fails: the error again, then the whole PTX.
_PTX_DUMP = re.compile(
    r"\n\n={64}\n.*?\n={64}\nplease share the reproducer above with Triton project\.\n\n?", re.S
)


class _HeldStdout:
    """sys.stdout while threads hold it (`_stdout_held`): what a holding
    thread writes goes to its own buffer, what the others write goes on.
    Modules share one (found by its `flashgen_held`)."""

    def __init__(self, stream) -> None:
        self.stream, self.flashgen_held = stream, {}

    def write(self, text: str) -> int:
        return self.flashgen_held.get(threading.get_ident(), self.stream).write(text)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


_STDOUT_LOCK = threading.Lock()


@contextlib.contextmanager
def _stdout_held():
    """What this thread prints meanwhile is held, then passed on less the PTX
    that Triton prints where ptxas fails.  Other threads' prints go on as
    they come; holds that overlap (the backward's kernels compile in threads
    of their own) share one stand-in stdout, put back by the last one out."""
    thread = threading.get_ident()
    with _STDOUT_LOCK:
        if not hasattr(sys.stdout, "flashgen_held"):
            sys.stdout = _HeldStdout(sys.stdout)
        stand_in, held = sys.stdout, io.StringIO()
        inner = stand_in.flashgen_held.setdefault(thread, held) is not held  # held further out
    try:
        yield
    finally:
        if not inner:
            with _STDOUT_LOCK:
                del stand_in.flashgen_held[thread]
                if not stand_in.flashgen_held and sys.stdout is stand_in:
                    sys.stdout = stand_in.stream
            stand_in.stream.write(_PTX_DUMP.sub("", held.getvalue()))


def _launch(kernel, grid, *args, **options) -> None:
    """kernel[grid](*args, **options), constexprs passed by position.

    Triton binds and specializes every argument on every launch: 20-26 us of
    host time for the backward kernel's 52 arguments on an H200, where short
    calls run at the host's pace.  With DIRECT_LAUNCH, the first launch of
    each specialization goes through Triton (compiling if need be) and later
    ones call the compiled kernel that it returned; otherwise, or while a
    tracer or a profiler's launch hook is watching, every launch goes through
    Triton.
    """
    if _interpreting() or torch.compiler.is_compiling():  # let a tracer see the kernel launch
        _through_triton(kernel, grid, args, options)
        return
    device = _driver.active.get_current_device() if _driver else torch.cuda.current_device()
    if device not in getattr(_THREAD, "devices", ()):
        _bind_context(device)
    compiles = getattr(_THREAD, "warmup", None)
    if compiles is not None:  # `_compile_ahead`: compile in a thread of its own, do not launch

        def compile_kernel() -> None:
            try:
                with torch.cuda.device(device):
                    _bind_context(device)
                    compiles_with = _FEWER_STAGES.get((kernel, *options.items()), options)
                    with _stdout_held():  # a ptxas failure's PTX is not printed
                        compiled = kernel.warmup(*_triton_args(args), grid=grid, **compiles_with)
                    compiled._init_handles()  # its launcher built and its binary loaded too
            except Exception:  # the kernel compiles at its launch instead
                pass

        compiles.append(threading.Thread(target=compile_kernel, name="flashgen-compile"))
        compiles[-1].start()
        return
    if (
        not DIRECT_LAUNCH
        or _knobs.runtime.launch_enter_hook.calls  # a profiler sees each launch
        or _knobs.runtime.launch_exit_hook.calls
    ):
        _through_triton(kernel, grid, args, options)
        return
    key = (kernel, device, _specialization(args), *options.items())
    compiled = _COMPILED.get(key)
    if compiled is None:
        if len(_COMPILED) >= 4096:  # e.g. a new sequence length on every call
            _COMPILED.clear()
        _COMPILED[key] = _through_triton(kernel, grid, args, options)
        return
    stream = _driver.active.get_current_stream(device)
    # JITFunction.run's own call; without hooks it needs no launch metadata.
    handles = (compiled.function, compiled.packed_metadata, None, None, None)
    compiled.run(*grid, *(1,) * (3 - len(grid)), stream, *handles, *args)


# flashgen: section compile_ahead
# The first forward with a gradient on a device starts compiling the backward's
# kernels in a worker thread (`_compile_ahead`, decision 062); off: each kernel
# compiles at its first launch.
COMPILE_AHEAD = True
_AHEAD: dict = {}  # device index -> the thread compiling ahead for it
_AHEAD_LOCK = threading.Lock()


def _compile_ahead(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> None:
    """With COMPILE_AHEAD, the first forward with a gradient on a device runs
    `_layout_backward` in a worker thread on q, k, v and stand-ins of o, lse
    and do, each launch only compiling its kernel, in a thread of its own
    (`_THREAD.warmup`): the first backward's kernels compile beside the
    forward's and each other, and a cold first call waits for the longest
    compile, not their sum (Triton's passes release the GIL).  That backward
    waits for the worker (`_await_ahead`).  Calls with sequences, offsets,
    sinks or inputs compile at their launches."""
    index = _ahead_device(q)
    if index is None or index in _AHEAD:
        return
    o = torch.empty((*q.shape[:3], V_DIM), dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)

    def compile_backward() -> None:
        _THREAD.warmup = compiles = []  # a thread per kernel (`_launch`)
        try:
            with torch.cuda.device(index):
                _layout_backward(q, k, v, o, lse, torch.empty_like(o), None, scale, None, None)
        except Exception:  # the backward compiles at its launches instead
            pass
        for thread in compiles:
            thread.join()

    with _AHEAD_LOCK:
        if index not in _AHEAD:
            _AHEAD[index] = threading.Thread(target=compile_backward, name="flashgen-compile")
            _AHEAD[index].start()


def _ahead_device(q: torch.Tensor) -> int | None:
    """q's CUDA device index where `_compile_ahead` may run, else None."""
    if not COMPILE_AHEAD or q.device.type != "cuda" or _interpreting() or not DIRECT_LAUNCH:
        return None
    if torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing():
        return None
    return q.device.index


def _await_ahead(q: torch.Tensor) -> None:
    """Waits for the compile-ahead of q's device, if one runs."""
    worker = _AHEAD.get(q.device.index) if q.device.type == "cuda" else None
    if worker is not None:
        worker.join()


# flashgen: section gluon
@functools.lru_cache(maxsize=None)
def _gluon_layout(rows: int, d: int, dtype: torch.dtype) -> "gl.NVMMASharedLayout":
    return gl.NVMMASharedLayout.get_default_for(
        [rows, d], gl.bfloat16 if dtype == torch.bfloat16 else gl.float16
    )


def _gluon_fits(
    block: int, q: torch.Tensor, k: torch.Tensor, *tensors: torch.Tensor, any_length: bool = False
) -> bool:
    """Whether the Gluon kernels can take these tensors: a Triton with Gluon,
    an sm90 GPU, Nq = Nk a multiple of `block` (`any_length`: at least
    `block`, for kernels that mask the last tile's rows and keys), q, k and
    `tensors` contiguous and 16-byte aligned, and fewer than 2^31 - `block`
    rows of q in all (the kernels address rows as (batch * heads + head) * N +
    row, and TMA coordinates, in int32, a tile past the last row included)."""
    if not GLUON or _interpreting() or q.device.type != "cuda" or _capability(q.device) != (9, 0):
        return False
    n = q.shape[2]
    uneven = n < block if any_length else n % block
    if k.shape[2] != n or uneven or q.shape[0] * q.shape[1] * n >= 2**31 - block:
        return False
    return all(x.is_contiguous() and x.data_ptr() % 16 == 0 for x in (q, k, *tensors))


class _GluonBlocks(NamedTuple):
    """A TMA descriptor of [rows, D] blocks over a contiguous tensor seen as
    (B * heads * N, D): what the launcher of Triton 3.6 reads of one (`base`,
    `shape`, `strides`, `padding`).  Triton's own descriptor views the tensor
    and checks every field when it is made, ~6 us of host time a descriptor
    (11 per forward + backward) where short calls run at the host's pace; it
    is made only for a launch through Triton (`_triton_args`)."""

    base: torch.Tensor
    shape: tuple[int, int]
    strides: tuple[int, int]
    block_shape: tuple[int, int]
    layout: "gl.NVMMASharedLayout"
    padding: str = "zero"

    def descriptor(self) -> "GluonTensorDescriptor":
        """Triton's descriptor of the same blocks."""
        return GluonTensorDescriptor(
            self.base.view(self.shape),
            [*self.shape],
            [*self.strides],
            [*self.block_shape],
            self.layout,
        )


def _gluon_descriptor(x: torch.Tensor, rows: int) -> _GluonBlocks:
    """A TMA descriptor of [rows, D] blocks over contiguous x seen as (B * heads * N, D),
    or for a varlen call's (tokens, heads, D) as (tokens, heads * D), a head's block at
    column head * D."""
    d = x.shape[-1]
    width = d * x.shape[1] if x.dim() == 3 else d
    return _GluonBlocks(
        x, (x.numel() // width, width), (width, 1), (rows, d), _gluon_layout(rows, d, x.dtype)
    )


_STAND_INS = (_GluonBlocks,)


# flashgen: section gluon_varlen
def _gluon_tiles(seqs, rows_q: int, rows_k: int) -> torch.Tensor | None:
    """The Gluon kernels' tiles for a varlen call (`seqs` bound, on q and k
    of rows_q and rows_k tokens) whose sequences have as many queries as
    keys, else None: int32 rows (first row of q, first row of k, the
    sequence's length, the tile's first row in it, the sequence's first row
    in the backward's statistics, where every sequence starts at a multiple
    of 128: `_gluon_stat_rows`), one for every 128 rows of every sequence.
    Sequence by sequence, the longest first, each one's tiles furthest into
    it first (under a causal mask the heaviest): on the grid (tiles, heads)
    the CTAs that run at once share the keys and values of a few sequences
    of one head in L2, as a dense call's do.  Made once per `sequences(...)`
    by a call outside a CUDA graph's capture, of the lengths it read.  A call
    that reads nothing on the host (captured) gets the table made on the GPU
    where GLUON_VARLEN_CAPTURED (`_gluon_device_tiles`; q and k of one
    cu_seqlens tensor), else None (the Triton kernels)."""
    if seqs is None or not seqs[3] or len(seqs) < 7:  # padded, or a custom op's (`_op_args`)
        return None
    cache = seqs[6]
    if "gluon tiles" in cache:
        return cache["gluon tiles"]
    lengths, keys = seqs[4]
    if lengths is None or _capturing(seqs[0]):  # no copy from the host into a CUDA graph
        same = cache.get("same sequences") and rows_q == rows_k and seqs[0].shape[0] > 0
        if not (GLUON_VARLEN_CAPTURED and same):
            return None
        if ("gluon device tiles", rows_q) not in cache:
            cache[("gluon device tiles", rows_q)] = _gluon_device_tiles(seqs[0], rows_q)
        return cache[("gluon device tiles", rows_q)]
    tiles = None
    if lengths == keys:  # cu_seqlens_q == cu_seqlens_k: one table
        firsts = [0] * len(lengths)
        for s in range(1, len(lengths)):
            firsts[s] = firsts[s - 1] + lengths[s - 1]
        tiles = _gluon_table(lengths, firsts, firsts).to(seqs[0].device)
    cache["gluon tiles"] = tiles
    return tiles


def _gluon_table(lengths: list, q_rows: list, k_rows: list) -> torch.Tensor:
    """`_gluon_tiles`' table (on the CPU) of sequences of these lengths whose
    position 0 lies at rows q_rows[s] of q's view and k_rows[s] of k's."""
    stats = [0] * len(lengths)
    for s in range(1, len(lengths)):
        stats[s] = stats[s - 1] + _cdiv(lengths[s - 1], 128) * 128
    longest_first = sorted(range(len(lengths)), key=lambda s: -lengths[s])
    table = [
        (q_rows[s], k_rows[s], lengths[s], start, stats[s])
        for s in longest_first
        for start in reversed(range(0, lengths[s], 128))
    ]
    return torch.tensor(table, dtype=torch.int32).reshape(-1, 5)


def _gluon_device_tiles(table: torch.Tensor, rows: int) -> torch.Tensor:
    """`_gluon_tiles`'s table made on the GPU from the sequences' bound table
    (`Sequences.bind`: first row and length of each sequence's queries, as of
    its keys; the tile's key row from the third column, the queries' length
    for both), reading nothing on the host, in one launch
    (`_gluon_tiles_kernel`): the same rows in the same order, then rows of
    length 0 (a CTA that reads but writes only its statistics' spare rows) up
    to cdiv(rows, 128) + S, the most tiles S sequences in `rows` rows can
    take.  Each sequence's statistics start at a multiple of 128 below 128
    times that many rows, the spare rows after them (`_gluon_stat_rows`); a
    sequence whose statistics would pass them (sequences that overlap, which
    a capture cannot check) is dropped, never run out of bounds."""
    count = table.shape[-2]
    size = _cdiv(rows, 128) + count
    tiles = torch.empty((*table.shape[:-2], size, 5), dtype=torch.int32, device=table.device)
    programs = max(1, _cdiv(count, _TILES_BLOCK))
    grid = (programs,) if table.dim() == 2 else (programs, table.shape[0])  # tables (T, S, 4): T
    _launch(_gluon_tiles_kernel, grid, table, tiles, count, size, _TILES_BLOCK)
    return tiles


_TILES_BLOCK = 64  # sequences per program of _gluon_tiles_kernel


@triton.jit
def _gluon_tiles_kernel(table, tiles, sequences, size, BLOCK: tl.constexpr):
    """`_gluon_device_tiles`: a program per BLOCK sequences of `table` (S, 4)
    writes their rows of `tiles` (size, 5); program 0 also the rows of length
    0 after the last tile.  Axis 1 of the grid: one table of several (T, S,
    4) to each of T tile tables.  A sequence's rows follow those of every sequence
    ahead of it in the order (longer, or as long and earlier in the table),
    counted over the whole table in blocks; its statistics follow those of
    every sequence earlier in the table."""
    table += tl.program_id(1) * sequences * 4
    tiles += tl.program_id(1) * size * 5
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    first = tl.load(table + i * 4, mask=i < sequences, other=0)
    length = tl.load(table + i * 4 + 1, mask=i < sequences, other=0)
    first_key = tl.load(table + i * 4 + 2, mask=i < sequences, other=0)
    count = (length + 127) // 128
    ahead_tiles = tl.zeros([BLOCK], tl.int32)  # of the sequences ahead in the order
    earlier_tiles = tl.zeros([BLOCK], tl.int32)  # of the sequences earlier in the table
    total = 0
    for start in range(0, sequences, BLOCK):
        j = start + tl.arange(0, BLOCK)
        other = tl.load(table + j * 4 + 1, mask=j < sequences, other=0)
        other_count = ((other + 127) // 128)[None, :]
        earlier = j[None, :] < i[:, None]
        longer = other[None, :] > length[:, None]
        ahead = longer | (other[None, :] == length[:, None]) & earlier
        ahead_tiles += tl.sum(tl.where(ahead, other_count, 0), 1)
        earlier_tiles += tl.sum(tl.where(earlier, other_count, 0), 1)
        total += tl.sum(other_count)
    spare = 128 * size
    kept = earlier_tiles + count <= size  # the statistics within the bound
    for t in range(0, tl.max(count, 0)):
        row = ahead_tiles + t
        at = tiles + row * 5
        written = (t < count) & (row < size)
        tl.store(at, tl.where(kept, first, 0), mask=written)
        tl.store(at + 1, tl.where(kept, first_key, 0), mask=written)
        tl.store(at + 2, tl.where(kept, length, 0), mask=written)
        tl.store(at + 3, tl.where(kept, (count - 1 - t) * 128, 0), mask=written)  # furthest first
        tl.store(at + 4, tl.where(kept, earlier_tiles * 128, spare), mask=written)
    if tl.program_id(0) == 0:
        for start in range(total, size, BLOCK):
            at = tiles + (start + tl.arange(0, BLOCK)) * 5
            written = start + tl.arange(0, BLOCK) < size
            for column in tl.static_range(4):
                tl.store(at + column, 0, mask=written)
            tl.store(at + 4, spare, mask=written)


def _gluon_stat_rows(seqs, tiles: torch.Tensor) -> int:
    """The rows of the Gluon backward's statistics (lse and delta) per head
    for a varlen call on `tiles`: every sequence's length rounded up to 128,
    or for a table made on the GPU its bound and 128 spare rows."""
    if seqs[6].get("gluon tiles") is not tiles:
        return 128 * (tiles.shape[0] + 1)
    return sum(_cdiv(n, 128) * 128 for n in seqs[4][0])


def _gluon_varlen_fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs, *more) -> bool:
    """Whether the Gluon kernels can take this varlen call (kernel views of q,
    k, v and `more`, the backward's o and dO; `seqs` bound): a Triton with
    Gluon, an sm90 GPU, sequences of as many queries as keys (`_gluon_tiles`),
    each tensor contiguous as (tokens, heads, D) and 16-byte aligned, and
    lse's (heads, tokens) offsets in int32."""
    if not GLUON or _interpreting() or q.device.type != "cuda" or _capability(q.device) != (9, 0):
        return False
    if _gluon_tiles(seqs, q.shape[2], k.shape[2]) is None:
        return False
    if q.shape[1] * q.shape[2] >= 2**31 - 128:
        return False
    users = [_user_view(x, seqs) for x in (q, k, v, *more)]
    return all(x.is_contiguous() and x.data_ptr() % 16 == 0 for x in users)


# flashgen: section document_runs
class _Runs:
    """A dense batch's packed documents as sequences (decision 109), found on
    the GPU (decision 110): the tables of `_gluon_tiles`' rows for the runs of
    one id, for tensors (B, H, N, D) contiguous, seen as (B * H * N, D) (a run
    at position p of batch row b starts at row (b * heads + head) * N + p: the
    table holds b * heads * N + p, the kernels add head * N), and for tensors
    whose rows are tokens ((B, N, H, D) in memory), seen as a varlen call's
    (B * N, heads * D) (the table holds b * N + p).  Each table's first `ctas`
    rows are the tiles, rows of length 0 follow.

    What the host needs (whether the ids form runs, how many, how many tiles)
    comes back in three integers copied when `tile_plan` ran and read at the
    first call that asks: `ctas`, `stat_rows` (the backward's statistics rows
    per head) and whether the runs are long enough on average for the Gluon
    forward and for its backward."""

    def __init__(
        self, tiles, token_tiles, found, copied, tokens: int, heads: int, forward_rows: int
    ):
        self.tiles, self.token_tiles = tiles, token_tiles
        self._found, self._copied = found, copied
        self._tokens, self._heads, self._forward_rows = tokens, heads, forward_rows
        self._known = None

    def _read(self) -> tuple:
        """(ctas, forward, backward), read once: waits for `_runs_of`'s kernels only
        if it has not run yet."""
        if self._known is None:
            if self._copied is not None:
                self._copied.synchronize()
            distinct, runs, ctas = self._found.tolist()
            fits = bool(distinct) and 0 < runs and self._heads * 128 * ctas < 2**31
            self._known = (
                ctas,
                fits and self._tokens >= self._forward_rows * runs,
                fits and self._tokens >= 128 * runs,
            )
        return self._known

    ctas = property(lambda self: self._read()[0])
    stat_rows = property(lambda self: 128 * self._read()[0])
    forward = property(lambda self: self._read()[1])
    backward = property(lambda self: self._read()[2])


def _documents_as_runs(doc: torch.Tensor, q, k, forward_rows: int) -> _Runs | None:
    """`tile_plan`'s runs for q, k (B, H, N, D) and the ids `doc` (B, N)
    where the Gluon kernels can take the call (sm90, `GLUON`), else None.
    `forward_rows`: the mean run length from which the Gluon forward runs."""
    if not GLUON or _interpreting() or q.device.type != "cuda" or _capability(q.device) != (9, 0):
        return None
    return _runs_of(doc, q, k, forward_rows)


def _runs_of(doc: torch.Tensor, q, k, forward_rows: int) -> _Runs | None:
    """`_documents_as_runs` on any device: None unless Nq = Nk = N and no CUDA
    graph is being captured.  Four launches and nothing read on the host
    (`_Runs` reads its three integers when a call first asks): the runs in
    blocks of tokens, counted (`_runs_count_kernel`), written
    (`_runs_write_kernel`) and measured (`_runs_finish_kernel`), for at most
    one run per 128 tokens (more would not take the Gluon kernels), then both
    layouts' tiles (`_gluon_device_tiles`, one launch)."""
    batch, num_heads, n, _ = q.shape
    if k.shape[2] != n or tuple(doc.shape) != (batch, n) or n == 0 or _capturing(doc):
        return None
    tokens = batch * n
    capacity = _cdiv(tokens, 128)
    tables = torch.empty((2, capacity, 4), dtype=torch.int32, device=doc.device)
    ids = torch.empty(capacity, dtype=torch.int64, device=doc.device)  # each run's id
    found = torch.empty(3, dtype=torch.int32, device=doc.device)
    blocks = _cdiv(tokens, _RUNS_BLOCK)
    counts = torch.empty(blocks, dtype=torch.int32, device=doc.device)
    where = (doc, doc.stride(0), doc.stride(1), batch, n)
    _launch(_runs_count_kernel, (blocks,), *where, counts, found, _RUNS_BLOCK)
    _launch(
        _runs_write_kernel, (blocks,), *where, counts, tables, ids, found,
        num_heads, k.shape[1], capacity, _RUNS_BLOCK,
    )  # fmt: skip
    _launch(
        _runs_finish_kernel, (_cdiv(capacity, _RUNS_PAIRS),), tables, ids, found, tokens, n,
        capacity, _RUNS_PAIRS,
    )  # fmt: skip
    token_tiles, tiles = _gluon_device_tiles(tables, tokens)  # one launch for both layouts
    copied = None
    if doc.device.type == "cuda":  # to the host without waiting: read at the first call
        found = found.to("cpu", non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(torch.cuda.current_stream(doc.device))
    return _Runs(tiles, token_tiles, found, copied, tokens, num_heads, forward_rows)


_RUNS_BLOCK = 1024  # tokens per program of _runs_count_kernel and _runs_write_kernel
_RUNS_PAIRS = 64  # runs per program of _runs_finish_kernel, and per side of its pairs


@triton.jit
def _run_starts(doc, stride_b, stride_n, batch, n, BLOCK: tl.constexpr):
    """The program's BLOCK tokens t = b * N + p: their ids, b, and whether a
    run starts there (a row's first token, or the id changed)."""
    t = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    b = t // n
    p = t - b * n
    inside = t < batch * n
    at = doc + b.to(tl.int64) * stride_b + p.to(tl.int64) * stride_n
    ids = tl.load(at, mask=inside)
    before = tl.load(at - stride_n, mask=inside & (p > 0))
    return t, b, ids, inside & ((p == 0) | (ids != before))


@triton.jit
def _runs_count_kernel(doc, stride_b, stride_n, batch, n, counts, found, BLOCK: tl.constexpr):
    """`_runs_of`, first: a program per BLOCK tokens counts the runs that start
    in them; program 0 sets found to [1, 0, 0] (the later kernels lower the
    first, write the second, add to the third)."""
    first = _run_starts(doc, stride_b, stride_n, batch, n, BLOCK)[3]
    tl.store(counts + tl.program_id(0), tl.sum(first.to(tl.int32), 0))
    if tl.program_id(0) == 0:
        tl.store(
            found + tl.arange(0, 4), (tl.arange(0, 4) == 0).to(tl.int32), mask=tl.arange(0, 4) < 3
        )


@triton.jit
def _runs_write_kernel(
    doc, stride_b, stride_n, batch, n, counts, tables, ids, found, heads, kv_heads, capacity,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """`_runs_of`, second: a program per BLOCK tokens writes the runs that
    start in them, numbered after those of every earlier block (`counts`):
    the r-th run (r < capacity) from token t = b * N + p writes t to
    tables[0, r] (as first query and key row, `Sequences.bind`'s columns),
    the rows of its dense views to tables[1, r] (t + b * (heads - 1) * N for
    q, t + b * (kv_heads - 1) * N for k), and its id to ids[r].  The last
    program writes the number of runs to found[1], and 0 to found[0] if they
    pass `capacity`."""
    program = tl.program_id(0)
    runs = 0
    for start in range(0, program, BLOCK):
        earlier = start + tl.arange(0, BLOCK)
        runs += tl.sum(tl.load(counts + earlier, mask=earlier < program, other=0), 0)
    t, b, run_id, first = _run_starts(doc, stride_b, stride_n, batch, n, BLOCK)
    r = runs + tl.cumsum(first.to(tl.int32), 0) - 1
    written = first & (r < capacity)
    at = tables + r * 4
    tl.store(at, t, mask=written)
    tl.store(at + 2, t, mask=written)
    tl.store(at + capacity * 4, t + b * (heads - 1) * n, mask=written)
    tl.store(at + capacity * 4 + 2, t + b * (kv_heads - 1) * n, mask=written)
    tl.store(ids + r, run_id.to(tl.int64), mask=written)
    if program == tl.num_programs(0) - 1:
        runs += tl.sum(first.to(tl.int32), 0)
        tl.store(found + 1, runs)
        if runs > capacity:
            tl.store(found, 0)


@triton.jit
def _runs_finish_kernel(tables, ids, found, tokens, n, capacity, PAIRS: tl.constexpr):
    """`_runs_of`, last: a program per PAIRS rows of the tables writes their
    runs' lengths (to the next run's first token; 0 past the last run, whose
    first rows are left unwritten) to both tables, adds their tiles of 128
    rows to found[2], and sets found[0] to 0 if one of its runs has the id of
    a later run of its batch row (an id that comes back)."""
    kept = tl.minimum(tl.load(found + 1), capacity)
    a = tl.program_id(0) * PAIRS + tl.arange(0, PAIRS)
    a_first = tl.load(tables + a * 4, mask=a < kept, other=tokens)
    after = tl.load(tables + (a + 1) * 4, mask=a + 1 < kept, other=tokens)
    length = tl.where(a < kept, after - a_first, 0)
    for table in tl.static_range(2):
        at = tables + table * capacity * 4 + a * 4
        tl.store(at + 1, length, mask=a < capacity)
        tl.store(at + 3, length, mask=a < capacity)
    tl.atomic_add(found + 2, tl.sum((length + 127) // 128, 0))
    a_id = tl.load(ids + a, mask=a < kept, other=0)
    repeated = 0
    for j in range(tl.program_id(0) * PAIRS, kept, PAIRS):
        c = j + tl.arange(0, PAIRS)
        c_first = tl.load(tables + c * 4, mask=c < kept, other=0)
        c_id = tl.load(ids + c, mask=c < kept, other=0)
        same = (a_first // n)[:, None] == (c_first // n)[None, :]
        same &= a_id[:, None] == c_id[None, :]
        same &= (a[:, None] < c[None, :]) & (a < kept)[:, None] & (c < kept)[None, :]
        repeated += tl.sum(tl.sum(same.to(tl.int32), 1), 0)
    if repeated > 0:
        tl.store(found, 0)


def _runs_layout(plan, *tensors: torch.Tensor) -> int:
    """How a call's tensors (B, H, N, D) lie for its plan's runs: 2 each
    contiguous, 1 each with rows of tokens ((B, N, H, D) in memory, as a
    varlen call's), 0 neither, or no runs (the module's own kernels)."""
    runs = None if plan is None else plan.runs
    if runs is None or not all(x.data_ptr() % 16 == 0 for x in tensors):
        return 0
    if all(x.is_contiguous() for x in tensors):
        return 2
    return 1 if all(x.transpose(1, 2).is_contiguous() for x in tensors) else 0


def _runs_output(q: torch.Tensor, v_dim: int, layout: int) -> torch.Tensor:
    """`_forward`'s o (B, H, N, v_dim) for a call of this `_runs_layout`: for
    rows of tokens in q's layout whichever kernels write it (the backward
    takes the runs only where o lies as q), else contiguous."""
    batch, heads, n, _ = q.shape
    if layout != 1:
        return torch.empty((batch, heads, n, v_dim), dtype=q.dtype, device=q.device)
    strides = (n * heads * v_dim, v_dim, heads * v_dim, 1)
    return torch.empty_strided((batch, heads, n, v_dim), strides, dtype=q.dtype, device=q.device)


def _runs_stats(x: torch.Tensor | None, layout: int) -> torch.Tensor | None:
    """lse or dlse (B, H, N) as the runs' kernels read it (`_runs_layout`):
    for rows of tokens (H, B, N) in memory, as a varlen call's (H, tokens),
    else contiguous."""
    if x is None:
        return None
    if layout != 1:
        return x.contiguous()
    return x.transpose(0, 1).contiguous().transpose(0, 1)  # no copy where it lies so
