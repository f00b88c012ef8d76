"""Write a safetensors checkpoint block by block, every byte hashed as it goes (a base tensor
never read: copied by the kernel, read back and hashed)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import functools
import json
import math
import os
import sys
from collections import deque
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from mergepipe.core.errors import InvalidCheckpoint, InvalidRequest, SourceChanged
from mergepipe.core.vocab import DTYPE_SIZES, HF_DTYPE_NAMES
from mergepipe.storage.checkpoint import INDEX_FILE
from mergepipe.storage.fsconfine import current_roots
from mergepipe.storage.safetensors_format import encode as encode  # re-exported
from mergepipe.storage.safetensors_format import encode_header
from mergepipe.storage.storage import open_source

# Output files are new names in a fresh staging directory: never written through a planted link;
# read-write, as kernel copies are read back to verify them.
_NEW_FILE = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


# Dirty bytes of one file between two starts of write-back: large enough that each start is a
# few big sequential writes, small enough that the disk writes while the merge still reads.
WRITEBACK_EVERY = 16 << 20
SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start write-out of dirty pages not yet submitted

# per dtype: the integer view of its bits and the exponent mask (all ones: Inf or NaN)
_EXPONENT = {"BF16": (np.int16, 0x7F80), "F16": (np.int16, 0x7C00), "F32": (np.int32, 0x7F800000)}
_Fn = Callable[[int, int, int, int], int]


@functools.cache
def _sync_file_range() -> _Fn | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


class Writeback:
    """Counts the bytes written to each file; every `every` bytes, starts its write-back."""

    def __init__(self, every: int = WRITEBACK_EVERY) -> None:
        self.every = every
        self._dirty: dict[int, int] = {}
        self.started = 0  # write-backs started (for tests)

    def wrote(self, fd: int, nbytes: int) -> None:
        n = self._dirty.get(fd, 0) + nbytes
        if n >= self.every:  # errors of sync_file_range: the final fsync reports them
            fn = _sync_file_range()
            self.started += fn is not None and fn(fd, 0, 0, SYNC_FILE_RANGE_WRITE) == 0
            n = 0
        self._dirty[fd] = n


# -- kernel copies: an untouched one-block tensor copied from a base file (confined descriptor) by
# the kernel, then read back and checked against the catalog's hash
READ_BACK_BYTES = 4 << 20  # the buffer the copied bytes are read back and hashed through

_NO_KERNEL_COPY = {errno.ENOSYS, errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM,
                   errno.EBADF, errno.ETXTBSY}


def copy_range(src: int, src_offset: int, dst: int, dst_offset: int, nbytes: int,
               src_name: str) -> int:
    """Copy by the kernel (os.copy_file_range) as far as it goes, the rest through a buffer;
    the bytes the kernel copied."""
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


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)


@dataclass(frozen=True)
class OutputTensor:
    """One written tensor and the xxh3-128 of its bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str  # file name inside the output directory
    content_hash: str


@dataclass
class _Slot:
    file: str
    fd: int
    offset: int  # absolute offset of the tensor's data in the file
    dtype: str
    shape: tuple[int, ...]
    numel: int
    next_elem: int  # flat index of the next element to write
    hasher: xxhash.xxh3_128


class CheckpointWriter:
    """An output checkpoint laid out like the base: same files, tensor order and names."""

    def __init__(self, out_dir: Path,
                 files: list[tuple[str, list[tuple[str, str, tuple[int, ...]]]]], *,
                 metadata: dict[str, dict[str, str]] | None = None,
                 write_index: bool = False, region: tuple[str, Collection[str]] | None = None
                 ) -> None:
        """`files`: (file name, [(tensor, dtype, shape), ...]) in output order. `region` (file,
        tensors): write only those, into a file made and sized already (executor.ray_engine)."""
        self.out_dir = Path(out_dir)
        self.write_index = write_index
        self._slots: dict[str, _Slot] = {}
        self._order: list[str] = []
        self._fds: list[int] = []
        self._sources: dict[str, int] = {}  # read-only fds of the files tensors are copied from
        self._roots = current_roots()  # the job's roots, captured for the writing thread
        self.total_bytes = 0
        self.kernel_copied = 0  # bytes copied file to file by the kernel (copy_file_range)
        self.writeback = Writeback()  # the disk writes while the merge runs, not all at fsync
        try:
            for fname, tensors in files:
                if region is not None and fname != region[0]:
                    continue
                header, spans = encode_header(tensors, (metadata or {}).get(fname))
                size = len(header) + (spans[-1][1] if spans else 0)
                fd = os.open(self.out_dir / fname, _NEW_FILE if region is None
                             else os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
                self._fds.append(fd)
                if region is None:
                    pwrite_all(fd, header, 0)
                    os.ftruncate(fd, size)
                elif os.fstat(fd).st_size != size:
                    raise InvalidCheckpoint(f"output file {fname} is {os.fstat(fd).st_size} "
                                            f"bytes, not the {size} its layout needs")
                for (name, dtype, shape), (begin, end) in zip(tensors, spans, strict=True):
                    if region is None or name in region[1]:
                        self._slots[name] = _Slot(fname, fd, len(header) + begin, dtype, shape,
                                                  math.prod(shape), 0, xxhash.xxh3_128())
                        self._order.append(name)
                        self.total_bytes += end - begin
        except BaseException:
            self.abort()
            raise

    def write(self, tensor: str, start: int, data: bytes | bytearray | memoryview) -> None:
        """Write elements from flat index `start` on (a tensor's pieces must come in order)."""
        s = self._slots[tensor]
        if start != s.next_elem:
            raise RuntimeError(f"output tensor {tensor!r}: written out of order "
                               f"(expected element {s.next_elem}, got {start})")
        n = len(data) if not isinstance(data, memoryview) else data.nbytes
        size = DTYPE_SIZES[s.dtype]
        if n % size or start + n // size > s.numel:
            raise RuntimeError(f"output tensor {tensor!r}: {n} bytes at element {start} do not "
                               f"fit its shape {list(s.shape)}")
        if _nonfinite(data, s.dtype):
            raise nonfinite_output(tensor, HF_DTYPE_NAMES[s.dtype])
        pwrite_all(s.fd, data, s.offset + start * size)
        self.writeback.wrote(s.fd, n)
        s.hasher.update(data)
        s.next_elem = start + n // size

    def copy_tensor(self, tensor: str, src: str, src_offset: int, expected_hash: str,
                    model: str) -> None:
        """A whole tensor copied by the kernel, read back and checked against `expected_hash`."""
        s = self._slots[tensor]
        nbytes = s.numel * DTYPE_SIZES[s.dtype]
        if s.next_elem != 0:
            raise RuntimeError(f"output tensor {tensor!r}: a copy must be the whole tensor")
        self.kernel_copied += copy_range(self._source(src), src_offset, s.fd, s.offset, nbytes,
                                         src)
        hash_back(s.fd, s.offset, nbytes, (s.hasher,))
        if s.hasher.hexdigest() != expected_hash:
            raise SourceChanged(
                f"model {model!r}: tensor {tensor!r} in {src} (bytes {src_offset}.."
                f"{src_offset + nbytes}) does not match the catalog's content hash: the file "
                f"changed after ingestion; nothing was published; re-ingest {model!r}")
        self.writeback.wrote(s.fd, nbytes)
        s.next_elem = s.numel

    def _source(self, path: str) -> int:
        fd = self._sources.get(path)
        if fd is None:
            fd = self._sources[path] = open_source(path, self._roots)
        return fd

    def finish(self) -> list[OutputTensor]:
        """Check every element was written, fsync and close the files; the tensors with hashes."""
        out = []
        for name in self._order:
            s = self._slots[name]
            if s.next_elem != s.numel:
                raise RuntimeError(f"output tensor {name!r}: only {s.next_elem} of {s.numel} "
                                   "elements were written")
            out.append(OutputTensor(name, s.dtype, s.shape, s.file,
                                    s.hasher.hexdigest()))
        for fd in self._fds:
            os.fsync(fd)
        self.abort()
        if self.write_index:
            write_index(self.out_dir, self.total_bytes, out)
        return out

    def abort(self) -> None:
        """Close the files without checks (the caller discards the directory)."""
        for fd in [*self._fds, *self._sources.values()]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        self._sources.clear()


def write_index(out_dir: Path, total_bytes: int, tensors: list[OutputTensor]) -> None:
    """model.safetensors.index.json of a sharded output."""
    write_json(out_dir / INDEX_FILE, {"metadata": {"total_size": total_bytes},
                                      "weight_map": {t.name: t.file for t in tensors}})


def write_json(path: Path, obj: object) -> None:
    write_new(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def write_new(path: Path, data: bytes) -> None:
    """Write a new staging file (O_EXCL | O_NOFOLLOW: never through a planted name) and fsync it."""
    fd = os.open(path, _NEW_FILE, 0o644)
    try:
        pwrite_all(fd, data, 0)
        os.fsync(fd)
    finally:
        os.close(fd)


def nonfinite_output(tensor: str, dtype: str) -> InvalidRequest:
    """The error of an output tensor holding Inf or NaN in `dtype` (its torch name)."""
    return InvalidRequest(
        f"output tensor {tensor!r}: the merged values include Inf or NaN in {dtype} (a value "
        "past the range of the compute or output dtype: float16 holds magnitudes up to "
        "65504); nothing was published; merge it in bfloat16 or float32 (dtype, out_dtype)")


def _nonfinite(data: bytes | bytearray | memoryview, dtype: str, step: int = 1 << 18) -> bool:
    """Whether raw little-endian floats of `dtype` hold an Inf or a NaN (checked `step`
    entries at a time: a scratch that stays in cache, twice as fast as one pass)."""
    int_dtype, mask = _EXPONENT[dtype]
    bits = np.frombuffer(data, dtype=int_dtype)
    scratch = np.empty(min(step, bits.size), dtype=int_dtype)
    for i in range(0, bits.size, step):
        part = scratch[:min(step, bits.size - i)]
        np.bitwise_and(bits[i:i + step], mask, out=part)
        if int(part.max()) == mask:
            return True
    return False


class BackgroundWrites:
    """Runs a writer's writes in one thread, in submission order, at most `depth` pending."""

    def __init__(self, writer: CheckpointWriter, depth: int = 8) -> None:
        self._writer = writer
        self._depth = depth
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mergepipe-write")
        self._pending: deque[Future[None]] = deque()

    def write(self, tensor: str, start: int, data: bytes | bytearray | memoryview) -> None:
        """Queue a write (`data` must stay unchanged); re-raises an earlier write's error."""
        self._queue(self._pool.submit(self._writer.write, tensor, start, data))

    def copy_tensor(self, tensor: str, src: str, src_offset: int, expected_hash: str,
                    model: str) -> None:
        """Queue a verified kernel copy of a whole tensor (CheckpointWriter.copy_tensor)."""
        self._queue(self._pool.submit(self._writer.copy_tensor, tensor, src, src_offset,
                                      expected_hash, model))

    def _queue(self, fut: Future[None]) -> None:
        self._pending.append(fut)
        while len(self._pending) > self._depth:
            self._pending.popleft().result()

    def drain(self) -> None:
        while self._pending:
            self._pending.popleft().result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()
