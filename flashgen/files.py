"""Reading files that are untrusted input (specs, tuning sidecars, cache entries).

In: paths and open file descriptors.  Out: at most a stated number of bytes,
and words for what a path is when it is not a regular file.  Imports nothing of
flashgen's, so every stage that reads a file can use it.
"""

from __future__ import annotations

import os
import stat

__all__ = ["READ_FLAGS", "file_kind", "read_at_most"]

# O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for
# a writer, so fstat can refuse it.  It changes nothing for regular files.
READ_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


def read_at_most(fd: int, limit: int) -> bytes:
    """Up to `limit` bytes from `fd` (fewer at the end of the file); a file
    that grows while it is read is still cut at `limit`."""
    chunks = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def file_kind(mode: int) -> str:
    """What a file of `mode` (st_mode) is, in words: "a FIFO", "a directory", ..."""
    for test, kind in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISREG, "a regular file"),
    ):
        if test(mode):
            return kind
    return "not a plain file"
