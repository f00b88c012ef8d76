"""Start the kernel's write-back of an output file while it is being written, so that its final fsync finds little left to write."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable

# Dirty bytes of one file between two starts of write-back: large enough that each start is a
# few big sequential writes, small enough that the disk writes while the merge still reads.
WRITEBACK_EVERY = 16 << 20
SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start write-out of dirty pages not yet submitted

_Fn = Callable[[int, int, int, int], int]
_sync_file_range: _Fn | None = None
_looked_up = False


def _lookup() -> _Fn | None:
    global _sync_file_range, _looked_up
    if not _looked_up:
        _looked_up = True
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
                fn = libc.sync_file_range
                fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
                fn.restype = ctypes.c_int
                _sync_file_range = fn
            except (OSError, AttributeError):
                _sync_file_range = None
    return _sync_file_range


def start_writeback(fd: int) -> bool:
    """Ask the kernel to start writing the file's dirty pages (asynchronously: the data is
    durable only after fsync). False where sync_file_range is not available (a no-op)."""
    fn = _lookup()
    if fn is None:
        return False
    return fn(fd, 0, 0, SYNC_FILE_RANGE_WRITE) == 0  # errors: the final fsync reports them


class Writeback:
    """Counts the bytes written to each file; every `every` bytes, starts its write-back."""

    def __init__(self, every: int = WRITEBACK_EVERY) -> None:
        self.every = every
        self._dirty: dict[int, int] = {}
        self.started = 0  # write-backs started (for tests)

    def wrote(self, fd: int, nbytes: int) -> None:
        n = self._dirty.get(fd, 0) + nbytes
        if n >= self.every:
            self.started += start_writeback(fd)
            n = 0
        self._dirty[fd] = n
