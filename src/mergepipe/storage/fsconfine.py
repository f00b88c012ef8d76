"""Confinement at the moment of every open: files inside a root are opened beneath the root's fd."""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import errno
import os
import stat
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from mergepipe.core.errors import Forbidden, InvalidRequest

# A path inside a root is resolved relative to the root's fd, never by its name from `/`:
# openat2(RESOLVE_BENEATH) where the kernel has it, else a walk of O_NOFOLLOW opens (links read
# with readlinkat and resolved the same way). A link swapped in out of the root is refused.
_ROOTS: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "mergepipe_confinement_roots", default=None)

_SYS_OPENAT2 = 437  # the same number on every architecture (5.6+)
_RESOLVE_NO_MAGICLINKS, _RESOLVE_BENEATH = 0x02, 0x08
_MAX_LINKS = 40
_O_PATH = getattr(os, "O_PATH", 0)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


_libc: ctypes.CDLL | None = None
_openat2_ok: bool | None = None  # None: not probed yet
_probe_lock = threading.Lock()
FORCE_WALK = False  # tests: exercise the O_NOFOLLOW walk where the kernel has openat2


@contextlib.contextmanager
def confined(roots: Sequence[Path | str]) -> Iterator[None]:
    token = _ROOTS.set(tuple(os.path.realpath(r) for r in roots))
    try:
        yield
    finally:
        _ROOTS.reset(token)


def current_roots() -> tuple[str, ...] | None:
    return _ROOTS.get()


def root_of(path: str, roots: Sequence[str]) -> tuple[str, str] | None:
    """(root, path relative to it) for the innermost root that lexically holds `path`."""
    p = os.path.normpath(os.path.abspath(path))
    best: tuple[str, str] | None = None
    for r in roots:
        if p == r or p.startswith(r.rstrip("/") + "/"):
            rel = os.path.relpath(p, r)
            if best is None or len(r) > len(best[0]):
                best = (r, rel)
    return best


def open_confined(path: str, flags: int, roots: Sequence[str] | None, mode: int = 0o644) -> int:
    """os.open(path, flags), but beneath its root when `path` lies inside one of `roots`."""
    if not roots:
        return os.open(path, flags | os.O_CLOEXEC, mode)
    found = root_of(path, roots)
    if found is None:
        return os.open(path, flags | os.O_CLOEXEC, mode)
    root, rel = found
    try:
        return open_beneath(root, rel, flags, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:  # beneath a root, only a loop (escapes are EXDEV)
            raise InvalidRequest(f"{path}: a loop of symbolic links (more than {_MAX_LINKS} "
                                 "levels to follow): fix or remove the link", field="path"
                                 ) from None
        if e.errno != errno.EXDEV:
            raise
        # A link into another root is allowed (confine_input accepts it): open it beneath that
        # root, so that a swap between the two resolutions still cannot leave the roots.
        other = root_of(os.path.realpath(path), roots)
        if other is not None and other[0] != root:
            try:
                return open_beneath(other[0], other[1], flags, mode)
            except OSError:
                pass
        raise Forbidden(f"{path}: resolves outside the data root {root} (a symbolic link out of "
                        "it, or one put in after the path was accepted): refused") from None


def open_beneath(root: str, rel: str, flags: int, mode: int = 0o644) -> int:
    """An fd for `rel` resolved beneath the directory `root`; OSError(EXDEV) if it escapes."""
    rfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if not FORCE_WALK and _have_openat2(rfd):
            return _openat2(rfd, rel, flags | os.O_CLOEXEC, mode)
        return _walk(rfd, rel, flags | os.O_CLOEXEC, mode)
    finally:
        os.close(rfd)


def _openat2(dirfd: int, rel: str, flags: int, mode: int) -> int:
    assert _libc is not None
    how = _OpenHow(flags, mode if flags & os.O_CREAT else 0,
                   _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dirfd),
                       ctypes.c_char_p(os.fsencode(rel)), ctypes.byref(how),
                       ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), rel)
    return int(fd)


def _have_openat2(dirfd: int) -> bool:
    """Whether openat2 works here (a kernel before 5.6 or a seccomp filter: ENOSYS / EPERM)."""
    global _libc, _openat2_ok
    if _openat2_ok is None:
        with _probe_lock:
            if _openat2_ok is None:
                try:
                    _libc = ctypes.CDLL(None, use_errno=True)
                    _libc.syscall.restype = ctypes.c_long
                    os.close(_openat2(dirfd, ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC,
                                      0))
                    _openat2_ok = True
                except (OSError, AttributeError):
                    _openat2_ok = False
    return _openat2_ok


def _walk(rfd: int, rel: str, flags: int, mode: int) -> int:
    """openat2(RESOLVE_BENEATH) by hand: O_NOFOLLOW opens, links expanded with readlinkat."""
    stack = [os.dup(rfd)]  # fds of the directories from the root down to the current one
    parts = [c for c in rel.split("/") if c not in ("", ".")]
    links = 0
    try:
        while parts:
            name = parts.pop(0)
            if name == "..":
                if len(stack) == 1:
                    raise OSError(errno.EXDEV, "escapes the root", rel)
                os.close(stack.pop())
                continue
            last = not parts
            want = flags if last else os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
            try:
                fd = _open_nofollow(name, want, mode, stack[-1], rel)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EEXIST):
                    raise
                links += 1
                parts[:0] = _link_parts(name, stack[-1], rel, e, links)
                continue
            if last:
                return fd
            stack.append(fd)
        # rel ended in a directory reached by '..' or a link: that directory itself
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EISDIR, os.strerror(errno.EISDIR), rel)
        return os.dup(stack[-1])
    finally:
        for fd in stack:
            os.close(fd)


def _open_nofollow(name: str, want: int, mode: int, dirfd: int, rel: str) -> int:
    """Open one component under `dirfd` without following a link (ELOOP for one)."""
    fd = os.open(name, want | os.O_NOFOLLOW, mode, dir_fd=dirfd)
    if want & _O_PATH and stat.S_ISLNK(os.fstat(fd).st_mode):
        os.close(fd)  # O_PATH | O_NOFOLLOW opens the link itself: resolve it
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), rel)
    return fd


def _link_parts(name: str, dirfd: int, rel: str, error: OSError, links: int) -> list[str]:
    """The components of the link `name`; `error` (the open's own) when it is not a link."""
    try:
        target = os.readlink(name, dir_fd=dirfd)
    except OSError:
        raise error from None  # not a link: the open's own error
    if links > _MAX_LINKS:
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), rel) from None
    if target.startswith("/"):
        raise OSError(errno.EXDEV, "a link leaves the root", rel) from None
    return [c for c in target.split("/") if c not in ("", ".")]
