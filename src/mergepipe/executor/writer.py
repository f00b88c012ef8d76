"""Write a safetensors checkpoint block by block: header first, each block pwritten at its offset."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import xxhash

from mergepipe.core.dtypes import DTYPE_SIZES
from mergepipe.core.errors import InvalidCheckpoint
from mergepipe.executor.writeback import Writeback
from mergepipe.storage.checkpoint import INDEX_FILE
from mergepipe.storage.fsconfine import current_roots, open_confined
from mergepipe.storage.local_store import read_fd
from mergepipe.storage.locations import basename, is_url
from mergepipe.storage.safetensors_format import encode_header, torch_dtype
from mergepipe.storage.store import store_for
from mergepipe.storage.store_types import FILE

if TYPE_CHECKING:
    import torch

# Output files are new names in a fresh staging directory: never written through a planted link.
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


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
    known_hash: str | None = None  # the whole tensor was copied from bytes of this hash


def encode(t: torch.Tensor, dtype: str) -> memoryview:
    """A float32 tensor as raw little-endian bytes of `dtype` (no extra copy)."""
    import torch  # loaded by the caller's tensor already

    out = t.to(torch_dtype(dtype)).contiguous()
    return out.reshape(-1).view(torch.uint8).numpy().data


class CheckpointWriter:
    """An output checkpoint laid out like the base: same files, tensor order and names."""

    def __init__(self, out_dir: Path,
                 files: list[tuple[str, list[tuple[str, str, tuple[int, ...]]]]], *,
                 metadata: dict[str, dict[str, str]] | None = None,
                 write_index: bool = False) -> None:
        """`files`: (file name, [(tensor, dtype, shape), ...]) in output order."""
        self.out_dir = Path(out_dir)
        self.write_index = write_index
        self._slots: dict[str, _Slot] = {}
        self._order: list[str] = []
        self._fds: list[int] = []
        self._sources: dict[str, int] = {}  # read-only fds of the files ranges are copied from
        self.total_bytes = 0
        self.kernel_copied = 0  # bytes copied file to file by the kernel (copy_file_range)
        self.writeback = Writeback()  # the disk writes while the merge runs, not all at fsync
        try:
            for fname, tensors in files:
                header, spans = encode_header(tensors, (metadata or {}).get(fname))
                fd = os.open(self.out_dir / fname, _NEW_FILE, 0o644)
                self._fds.append(fd)
                _pwrite_all(fd, header, 0)
                data_len = spans[-1][1] if spans else 0
                os.ftruncate(fd, len(header) + data_len)
                self.total_bytes += data_len
                for (name, dtype, shape), (begin, _end) in zip(tensors, spans, strict=True):
                    numel = 1
                    for d in shape:
                        numel *= d
                    self._slots[name] = _Slot(fname, fd, len(header) + begin, dtype, shape,
                                              numel, 0, xxhash.xxh3_128())
                    self._order.append(name)
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
        _pwrite_all(s.fd, data, s.offset + start * size)
        self.writeback.wrote(s.fd, n)
        s.hasher.update(data)
        s.next_elem = start + n // size

    def copy(self, tensor: str, start: int, src: str, src_offset: int, nbytes: int,
             data: memoryview | None, whole_hash: str | None = None) -> None:
        """Write `nbytes` of file `src` at `src_offset` from flat index `start` on, copied by
        the kernel (os.copy_file_range: no pass through user space; shared extents where the
        file system has reflinks), else by a read and a write. `data`: the same bytes, already
        in memory, for the tensor's hash; None when they are the whole tensor and `whole_hash`
        is their known xxh3-128."""
        s = self._slots[tensor]
        size = DTYPE_SIZES[s.dtype]
        if start != s.next_elem or nbytes % size or start + nbytes // size > s.numel:
            raise RuntimeError(f"output tensor {tensor!r}: {nbytes} bytes at element {start} "
                               f"do not fit its shape {list(s.shape)} in order")
        if data is None and (start != 0 or nbytes // size != s.numel or whole_hash is None):
            raise RuntimeError(f"output tensor {tensor!r}: a copy without its bytes must be "
                               "the whole tensor, with its hash")
        dst = s.offset + start * size
        copied = _kernel_copy(self._source(src), src_offset, s.fd, dst, nbytes)
        self.kernel_copied += copied
        if copied < nbytes:  # not supported here: the rest through user space
            rest = data[copied:] if data is not None else os.pread(
                self._source(src), nbytes - copied, src_offset + copied)
            if len(rest) != nbytes - copied:
                raise InvalidCheckpoint(f"{src}: shorter than the catalog says; re-ingest it")
            _pwrite_all(s.fd, rest, dst + copied)
        self.writeback.wrote(s.fd, nbytes)
        if data is not None:
            s.hasher.update(data)
        else:
            s.known_hash = whole_hash
        s.next_elem = start + nbytes // size

    def _source(self, path: str) -> int:
        fd = self._sources.get(path)
        if fd is None:
            fd = self._sources[path] = os.open(path, os.O_RDONLY)
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
                                    s.known_hash or s.hasher.hexdigest()))
        for fd in self._fds:
            os.fsync(fd)
        self.abort()
        if self.write_index:
            index = {"metadata": {"total_size": self.total_bytes},
                     "weight_map": {t.name: t.file for t in out}}
            write_json(self.out_dir / INDEX_FILE, index)
        return out

    def abort(self) -> None:
        """Close the files without checks (the caller discards the directory)."""
        for fd in [*self._fds, *self._sources.values()]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        self._sources.clear()


def write_json(path: Path, obj: object) -> None:
    """Write JSON and fsync it."""
    _write_all(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def _kernel_copy(src: int, src_offset: int, dst: int, dst_offset: int, nbytes: int) -> int:
    """Copy with os.copy_file_range; the bytes copied (fewer when the kernel, the file
    systems or the platform do not support it: the caller copies the rest)."""
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


_NO_KERNEL_COPY = {errno.ENOSYS, errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM,
                   errno.EBADF, errno.ETXTBSY}


def _pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)


# Weight files in other formats would be stale next to the merged safetensors: never copied.
STALE_WEIGHT_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf")
CONFIG_FILE = "config.json"
HF_DTYPE_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
MAX_SIDE_FILE_BYTES = 256 << 20  # a config or tokenizer file larger than this is not copied


def copy_extra_files(paths: list[str], out_dir: Path, dtype: str | None) -> list[str]:
    """Copy the base's non-weight files (config, tokenizer; local or remote); config.json gets
    the output dtype. A local file is opened once (beneath its root in a confined job) and
    copied from that descriptor: what is checked is what is copied."""
    copied = []
    for p in paths:
        name = basename(p)
        if name.endswith(STALE_WEIGHT_SUFFIXES):
            continue
        try:
            data = _side_file(p)
        except OSError as e:
            raise InvalidCheckpoint(f"{p}: cannot copy it ({e.strerror or e})") from None
        if data is None:
            continue
        dst = out_dir / name
        if not (name == CONFIG_FILE and dtype is not None and _write_config(data, dst, dtype)):
            _write_all(dst, data)
        copied.append(name)
    return copied


def _side_file(p: str) -> bytes | None:
    """The bytes of a side file; None if it is not a regular file (a directory, a FIFO)."""
    store = store_for(p)
    if is_url(p):
        return store.read_bytes(p, MAX_SIDE_FILE_BYTES) if store.kind(p) == FILE else None
    fd = open_confined(p, os.O_RDONLY | os.O_NONBLOCK, current_roots())
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return read_fd(fd, MAX_SIDE_FILE_BYTES)
    finally:
        os.close(fd)


def _write_config(data: bytes, dst: Path, dtype: str) -> bool:
    """config.json with the output dtype; False if it is not a JSON object (copied as is)."""
    try:
        cfg = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return False
    if not isinstance(cfg, dict):
        return False
    cfg["torch_dtype"] = HF_DTYPE_NAMES[dtype]
    if "dtype" in cfg:
        cfg["dtype"] = HF_DTYPE_NAMES[dtype]
    write_json(dst, cfg)
    return True


def _write_all(path: Path, data: bytes) -> None:
    # O_EXCL | O_NOFOLLOW: a name planted in the staging directory is never written through
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644)
    try:
        _pwrite_all(fd, data, 0)
        os.fsync(fd)
    finally:
        os.close(fd)


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

    def copy(self, tensor: str, start: int, src: str, src_offset: int, nbytes: int,
             data: memoryview | None, whole_hash: str | None = None) -> None:
        """Queue a kernel copy (CheckpointWriter.copy)."""
        self._queue(self._pool.submit(self._writer.copy, tensor, start, src, src_offset, nbytes,
                                      data, whole_hash))

    def _queue(self, fut: Future[None]) -> None:
        self._pending.append(fut)
        while len(self._pending) > self._depth:
            self._pending.popleft().result()

    def drain(self) -> None:
        """Wait for every queued write."""
        while self._pending:
            self._pending.popleft().result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()
