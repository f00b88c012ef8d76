"""Cold page cache for timed runs: flush dirty pages, evict inputs, and check residency."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from mergepipe.storage.storage import drop_page_cache

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_MAP_FAILED = ctypes.c_void_p(-1).value


def files_under(paths: Iterable[str | os.PathLike[str]]) -> list[str]:
    """Every regular file of the given files and directories (recursively), sorted."""
    out: list[str] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(str(f) for f in p.rglob("*") if f.is_file())
        elif p.is_file():
            out.append(str(p))
    return out


def make_cold(paths: Iterable[str | os.PathLike[str]]) -> list[str]:
    """sync(), then posix_fadvise(DONTNEED) every file under `paths`; returns the files."""
    files = files_under(paths)
    os.sync()  # dirty pages cannot be evicted: write them back first
    drop_page_cache(files)
    return files


def resident_bytes(path: str) -> int:
    """Bytes of `path` now in the page cache (mincore on a shared read-only mapping)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        try:
            page = mmap.PAGESIZE
            vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
            resident = int((np.frombuffer(bytes(vec), dtype=np.uint8) & 1).sum())
            return min(size, resident * page)
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def resident_fraction(files: Iterable[str]) -> float:
    """Share of the files' bytes that is in the page cache (0.0 = cold)."""
    files = list(files)
    total = sum(os.path.getsize(f) for f in files)
    return sum(resident_bytes(f) for f in files) / total if total else 0.0
