"""Copy a base file's byte range into an output file by the kernel, then verify what was copied."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence

import xxhash

from mergepipe.core.errors import InvalidCheckpoint
from mergepipe.storage.storage import open_source as open_source  # (writer.py imports it here)

READ_BACK_BYTES = 4 << 20  # the buffer the copied bytes are read back and hashed through

_NO_KERNEL_COPY = {errno.ENOSYS, errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM,
                   errno.EBADF, errno.ETXTBSY}


def copy_range(src: int, src_offset: int, dst: int, dst_offset: int, nbytes: int,
               src_name: str) -> int:
    """Copy by the kernel as far as it goes, the rest through a buffer; the bytes it copied."""
    done = kernel_copy(src, src_offset, dst, dst_offset, nbytes)
    copied = done
    while done < nbytes:
        chunk = os.pread(src, min(nbytes - done, READ_BACK_BYTES), src_offset + done)
        if not chunk:
            raise InvalidCheckpoint(f"{src_name}: shorter than the catalog says (wanted "
                                    f"{nbytes} bytes at offset {src_offset}); re-ingest it")
        pwrite_all(dst, chunk, dst_offset + done)
        done += len(chunk)
    return copied


def hash_back(fd: int, offset: int, nbytes: int, hashers: Sequence[xxhash.xxh3_128]) -> None:
    """Feed the `nbytes` at `offset` of `fd` (what was just written) to every hasher."""
    buf = bytearray(min(nbytes, READ_BACK_BYTES))
    view = memoryview(buf)
    done = 0
    while done < nbytes:
        n = os.preadv(fd, [view[:min(nbytes - done, len(buf))]], offset + done)
        if n <= 0:
            raise OSError(errno.EIO, f"output ended {nbytes - done} bytes early at offset "
                                     f"{offset + done}")
        for h in hashers:
            h.update(view[:n])
        done += n


def kernel_copy(src: int, src_offset: int, dst: int, dst_offset: int, nbytes: int) -> int:
    """Copy with os.copy_file_range; the bytes copied (fewer where unsupported)."""
    copy = getattr(os, "copy_file_range", None)
    done = 0
    while copy is not None and done < nbytes:
        try:
            n = copy(src, dst, nbytes - done, src_offset + done, dst_offset + done)
        except OSError as e:
            if e.errno in _NO_KERNEL_COPY:
                break
            raise
        if n == 0:
            break
        done += n
    return done


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)
