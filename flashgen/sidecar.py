"""Tuning sidecars: the `SPEC.tune.json` file next to a spec.

In: a spec's path (or a sidecar's), or a checked `Variant`.  Out: the
`Tuning`s the sidecar holds (`read_tuning`, `tuning_for`), or a sidecar
written with new ones merged in (`write_tuning`).  The format, one list of
tunings per attention block, one tuning per (head_dim, dtype):

    {"blocks": {"NAME": [{"device": "NVIDIA H200",
                          "forward": [BLOCK_M, BLOCK_N, num_warps, num_stages],
                          "backward": [...],
                          "head_dim": 64, "dtype": "bf16",
                          "forward_tma": true, "backward_tma": null}, ...]}}

A sidecar from before one tuning per head dim holds a single object per block
and no head_dim or dtype (it then applies to every head dim and dtype).

A sidecar is untrusted input, treated like a spec: it is read only from a
regular file of at most MAX_SIDECAR_BYTES (a FIFO or a device would block or
never end), decoded as UTF-8, parsed with a nesting limit, and checked against
a strict schema: exactly the keys above, JSON integers that are not booleans,
block sizes, warps and stages in the ranges the kernels take, a device name of
plain characters on one line.  Only those integers, booleans and that name
reach a generated module.  Every problem raises `SidecarError`, whose message
names the file.  Writes go to a temporary file in the same directory, created
without following links, then renamed over the sidecar; a sidecar path that
is a symlink or not a regular file is never written.

This module imports neither `flashgen.api` nor `flashgen.tune`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import stat
from pathlib import Path

from flashgen import ir
from flashgen.files import READ_FLAGS, file_kind, read_at_most
from flashgen.lower import LaunchConfig, Tuning

__all__ = [
    "MAX_SIDECAR_BYTES",
    "SIDECAR_SUFFIX",
    "SidecarError",
    "as_list",
    "parse_config",
    "read_tuning",
    "sidecar_path",
    "tuning_for",
    "write_tuning",
]

SIDECAR_SUFFIX = ".tune.json"
# A sidecar of every head dim and dtype for a few dozen blocks is a few tens
# of kilobytes; anything near this is not a sidecar.
MAX_SIDECAR_BYTES = 1 << 20
# The format nests 5 deep ({blocks: {NAME: [{forward: [...]}]}}).
MAX_SIDECAR_DEPTH = 8
# The device name is written into a comment of the generated module: one line
# of plain characters, nothing a Python tokenizer or a reader could misread.
DEVICE_NAME = re.compile(r"\A[A-Za-z0-9 _.()+-]{1,64}\Z")
# Block names are spec identifiers (grammars/attn.lark, NAME).
_BLOCK_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
# What the kernels take: tiles are powers of two from 16 (tl.dot's smallest)
# to 256 (one Hopper MMA's widest N; the generated module's own check allows
# any power of two >= 16, but no config above 256 fits shared memory), warps
# a power of two up to 16 (512 threads), stages up to 8 software-pipeline
# buffers (more never fits shared memory at 16-wide tiles).
BLOCK_SIZES = (16, 32, 64, 128, 256)
NUM_WARPS = (1, 2, 4, 8, 16)
NUM_STAGES = range(1, 9)

_REQUIRED_KEYS = frozenset({"device", "forward", "backward"})
_OPTIONAL_KEYS = frozenset({"head_dim", "dtype", "forward_tma", "backward_tma"})


class SidecarError(ValueError):
    """A tuning sidecar that cannot be read, is not valid, or cannot be written."""


class _Invalid(Exception):
    """One schema problem; `read_tuning` adds the path."""


def sidecar_path(spec_path: str | os.PathLike[str]) -> Path:
    """SPEC.tune.json next to SPEC.attn."""
    path = Path(spec_path)
    return path.with_name(path.stem + SIDECAR_SUFFIX)


# --------------------------------------------------------------------------- #
# Reading
# --------------------------------------------------------------------------- #


def read_tuning(path: str | os.PathLike[str]) -> dict[str, tuple[Tuning, ...]]:
    """Block name -> its Tunings, one per (head_dim, dtype), from a sidecar;
    {} if there is none (no file, or a dangling symlink)."""
    data = _read_bytes(Path(path))
    if data is None:
        return {}
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SidecarError(f"{path}: not a valid tuning file: not UTF-8 (byte {e.start})") from None
    try:
        _check_depth(text)
        document = json.loads(
            text, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constant
        )
        return _document(document)
    except RecursionError:  # _check_depth should have caught it first
        problem = f"nested deeper than {MAX_SIDECAR_DEPTH}"
    except json.JSONDecodeError as e:
        problem = f"not JSON ({e.msg} at line {e.lineno}, column {e.colno})"
    except (_Invalid, ValueError) as e:  # ValueError: an integer of too many digits
        problem = str(e)
    raise SidecarError(f"{path}: not a valid tuning file: {problem}")


def _read_bytes(path: Path) -> bytes | None:
    """The file's bytes, None if it does not exist; only a regular file of at
    most MAX_SIDECAR_BYTES is read.  O_NONBLOCK makes opening a FIFO return at
    once (it is then refused by fstat) instead of waiting for a writer."""
    try:
        fd = os.open(path, READ_FLAGS)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise SidecarError(f"{path}: is a directory, not a tuning file") from None
    except OSError as e:
        raise SidecarError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise SidecarError(f"{path}: is a directory, not a tuning file")
        if not stat.S_ISREG(info.st_mode):
            raise SidecarError(f"{path}: not a regular file ({file_kind(info.st_mode)})")
        if info.st_size > MAX_SIDECAR_BYTES:
            raise SidecarError(f"{path}: larger than {MAX_SIDECAR_BYTES} bytes, not a tuning file")
        data = read_at_most(fd, MAX_SIDECAR_BYTES + 1)  # the file may grow after fstat
        if len(data) > MAX_SIDECAR_BYTES:
            raise SidecarError(f"{path}: larger than {MAX_SIDECAR_BYTES} bytes, not a tuning file")
        return data
    except OSError as e:
        raise SidecarError(f"{path}: cannot read: {e.strerror or e}") from None
    finally:
        os.close(fd)


def _check_depth(text: str) -> None:
    """Refuse nesting deeper than MAX_SIDECAR_DEPTH before json.loads, which
    recurses once per level (100000 nested lists raise RecursionError)."""
    depth = 0
    for m in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', text, re.DOTALL):
        bracket = m.group()
        if bracket in "[{":
            depth += 1
            if depth > MAX_SIDECAR_DEPTH:
                raise _Invalid(f"nested deeper than {MAX_SIDECAR_DEPTH}")
        elif bracket in "]}":
            depth -= 1


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    keys = [key for key, _ in pairs]
    for key in keys:
        if keys.count(key) > 1:
            raise _Invalid(f"key {_show(key)} appears twice in one object")
    return dict(pairs)


def _no_constant(name: str) -> None:
    raise _Invalid(f"{name} is not a JSON number")


def _show(value: object) -> str:
    """A value for an error message, cut short (the file is untrusted)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _document(document: object) -> dict[str, tuple[Tuning, ...]]:
    if not isinstance(document, dict) or set(document) != {"blocks"}:
        raise _Invalid('the top level must be an object with the one key "blocks"')
    blocks = document["blocks"]
    if not isinstance(blocks, dict):
        raise _Invalid('"blocks" must be an object (block name -> tunings)')
    return {_block_name(name): _tunings(name, entries) for name, entries in blocks.items()}


def _block_name(name: str) -> str:
    if not _BLOCK_NAME.match(name):
        raise _Invalid(f"block name {_show(name)} is not an identifier")
    return name


def _tunings(name: str, entries: object) -> tuple[Tuning, ...]:
    if isinstance(entries, dict):  # a sidecar from before one entry per head dim
        entries = [entries]
    if not isinstance(entries, list) or not entries:
        raise _Invalid(f"block {name!r} does not hold a list of tunings")
    tunings = tuple(_tuning(name, entry) for entry in entries)
    seen = set()
    for tuning in tunings:
        key = _key(tuning)
        if key in seen:
            raise _Invalid(f"block {name!r} has two tunings for head_dim {key[0]}, dtype {key[1]}")
        seen.add(key)
    return tunings


def _tuning(name: str, entry: object) -> Tuning:
    if not isinstance(entry, dict):
        raise _Invalid(f"block {name!r}: a tuning must be an object, not {_show(entry)}")
    keys = set(entry)
    if missing := sorted(_REQUIRED_KEYS - keys):
        raise _Invalid(f"block {name!r}: a tuning lacks {', '.join(missing)}")
    if unknown := sorted(keys - _REQUIRED_KEYS - _OPTIONAL_KEYS):
        raise _Invalid(f"block {name!r}: unknown key {_show(unknown[0])}")
    device = entry["device"]
    if not isinstance(device, str) or not DEVICE_NAME.match(device):
        raise _Invalid(
            f"block {name!r}: device name {_show(device)} is not 1-64 letters, digits, "
            "spaces or _.()+- on one line"
        )
    head_dim, dtype = entry.get("head_dim"), entry.get("dtype")
    if head_dim is not None and not (
        _is_int(head_dim)
        and ir.HEAD_DIM_MIN <= head_dim <= ir.HEAD_DIM_MAX
        and head_dim % ir.HEAD_DIM_MULTIPLE == 0
    ):
        raise _Invalid(
            f"block {name!r}: head_dim {_show(head_dim)} is not a multiple of "
            f"{ir.HEAD_DIM_MULTIPLE} in {ir.HEAD_DIM_MIN}..{ir.HEAD_DIM_MAX}"
        )
    dtypes = [d.value for d in ir.DType]
    if dtype is not None and dtype not in dtypes:
        raise _Invalid(f"block {name!r}: dtype {_show(dtype)} is not one of {', '.join(dtypes)}")
    if (head_dim is None) != (dtype is None):
        # tuning_for looks up (head_dim, dtype) or (None, None): half a key
        # would never apply.
        raise _Invalid(f"block {name!r}: head_dim and dtype must be given together")
    tma = [entry.get("forward_tma"), entry.get("backward_tma")]
    if any(x is not None and not isinstance(x, bool) for x in tma):
        raise _Invalid(
            f"block {name!r}: forward_tma and backward_tma must be true, false or null, "
            f"got {_show(tma)}"
        )
    try:
        forward, backward = parse_config(entry["forward"]), parse_config(entry["backward"])
    except ValueError as e:
        raise _Invalid(f"block {name!r}: {e}") from None
    return Tuning(device, forward, backward, head_dim, dtype, *tma)


def parse_config(values: object) -> LaunchConfig:
    """[BLOCK_M, BLOCK_N, num_warps, num_stages] as a LaunchConfig; ValueError
    for anything the kernels do not take."""
    if not (isinstance(values, list) and len(values) == 4):
        raise ValueError(
            f"a config is [BLOCK_M, BLOCK_N, num_warps, num_stages], not {_show(values)}"
        )
    if not all(_is_int(x) for x in values):
        raise ValueError(f"config entries must be integers (not booleans), got {_show(values)}")
    block_m, block_n, warps, stages = values
    for block in (block_m, block_n):
        if block not in BLOCK_SIZES:
            raise ValueError(f"block size {block} is not one of {BLOCK_SIZES}")
    if warps not in NUM_WARPS:
        raise ValueError(f"num_warps {warps} is not one of {NUM_WARPS}")
    if stages not in NUM_STAGES:
        raise ValueError(f"num_stages {stages} is not in 1..{NUM_STAGES[-1]}")
    return LaunchConfig(block_m, block_n, warps, stages)


def as_list(config: LaunchConfig) -> list[int]:
    return [config.block_m, config.block_n, config.num_warps, config.num_stages]


def _key(tuning: Tuning) -> tuple[int | None, str | None]:
    return tuning.head_dim, tuning.dtype


def _order(tuning: Tuning) -> tuple[bool, int, str]:
    """Sidecar order: by head dim then dtype, (None, None) first."""
    return tuning.head_dim is not None, tuning.head_dim or 0, tuning.dtype or ""


def tuning_for(variant: ir.Variant) -> Tuning | None:
    """The sidecar's tuning of a variant read from a file, if any.

    The one measured at the variant's head dim and dtype (`flashgen bench
    --head-dim` rebuilds a spec at other head dims, whose best configs
    differ), else one that names neither (an older sidecar's, for any).
    """
    if variant.path.startswith("<"):
        return None
    tunings = read_tuning(sidecar_path(variant.path)).get(variant.name, ())
    by_key = {_key(t): t for t in tunings}
    return by_key.get((variant.head_dim, variant.dtype.value), by_key.get((None, None)))


# --------------------------------------------------------------------------- #
# Writing
# --------------------------------------------------------------------------- #


def write_tuning(path: str | os.PathLike[str], tunings: dict[str, Tuning]) -> None:
    """Merge `tunings` into the sidecar at `path`: each replaces its block's
    entry of the same head dim and dtype; every other entry stays.

    Refuses (SidecarError) a path that is a symlink, dangling or not, or not
    a regular file, and an existing sidecar that is not valid (it is not
    silently replaced).  The new file appears whole or not at all.
    """
    path = Path(path)
    _check_target(path)
    for name, tuning in tunings.items():
        _validate_tuning(path, name, tuning)
    merged = {name: {_key(t): t for t in ts} for name, ts in read_tuning(path).items()}
    for name, tuning in tunings.items():
        merged.setdefault(name, {})[_key(tuning)] = tuning
    blocks = {
        name: [_entry(t) for t in sorted(by_key.values(), key=_order)]
        for name, by_key in sorted(merged.items())
    }
    _write_atomic(path, json.dumps({"blocks": blocks}, indent=2) + "\n")


def _check_target(path: Path) -> os.stat_result | None:
    """The existing sidecar's lstat, None if there is none; SidecarError if
    it is anything but a regular file."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise SidecarError(f"{path}: cannot write: {e.strerror or e}") from None
    if stat.S_ISLNK(info.st_mode):
        raise SidecarError(f"{path}: is a symbolic link; not writing through it")
    if stat.S_ISDIR(info.st_mode):
        raise SidecarError(f"{path}: is a directory, not a tuning file")
    if not stat.S_ISREG(info.st_mode):
        raise SidecarError(f"{path}: not a regular file ({file_kind(info.st_mode)})")
    return info


def _validate_tuning(path: Path, name: str, tuning: Tuning) -> None:
    """What is written must read back: the same schema as `read_tuning`."""
    try:
        _tuning(_block_name(name), _entry(tuning))
    except _Invalid as e:
        raise SidecarError(f"{path}: refusing to write an invalid tuning: {e}") from None


def _entry(tuning: Tuning) -> dict:
    return {
        "device": tuning.device,
        "forward": as_list(tuning.forward),
        "backward": as_list(tuning.backward),
        "head_dim": tuning.head_dim,
        "dtype": tuning.dtype,
        "forward_tma": tuning.forward_tma,
        "backward_tma": tuning.backward_tma,
    }


def _write_atomic(path: Path, text: str) -> None:
    """Write `text` to a new file beside `path` (O_EXCL | O_NOFOLLOW: never
    an existing file or a link planted under the temporary name), fsync it,
    and rename it over `path` (rename replaces a link, never writes through
    one).  On any failure the old sidecar stays as it was."""
    old = _check_target(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, 0o644)
    except OSError as e:
        raise SidecarError(f"{path}: cannot write: {e.strerror or e}") from None
    try:
        try:
            if old is not None:  # keep the permissions the user gave the sidecar
                os.fchmod(fd, stat.S_IMODE(old.st_mode))
            data = text.encode("utf-8")
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise SidecarError(f"{path}: cannot write: {e.strerror or e}") from None
        raise
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable; not every file system allows it."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
