"""Confinement of the paths and URLs a request names, and of merge outputs."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path

from mergepipe.core.errors import Conflict, Forbidden, InvalidRequest
from mergepipe.core.vocab import check_name as check_name  # re-exported
from mergepipe.storage.locations import is_url, parse_url, short


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def confine_input(raw: str, data_roots: Sequence[Path], field: str = "path") -> Path:
    """The real path of `raw` if it lies inside a data root (symlinks resolved) and exists."""
    if not data_roots:
        raise Forbidden("no data roots are configured (MERGEPIPE_DATA_ROOTS); the server may "
                        "not read any path", field=field)
    if "\x00" in raw or not raw.strip():
        raise InvalidRequest(f"{field} {raw!r} is not a valid path", field=field)
    roots = [Path(os.path.realpath(r)) for r in data_roots]
    p = Path(raw)
    if not p.is_absolute():
        p = roots[0] / p
    try:
        real = Path(os.path.realpath(p))
        if not any(_inside(real, r) for r in roots):
            raise Forbidden(f"{field} {short(raw)} is outside the allowed data roots",
                            field=field)
        if not real.exists():
            raise InvalidRequest(f"{field} {short(raw)} {_missing_why(real)}", field=field)
        if real.is_dir():
            _confine_entries(real, roots, raw, field)
    except OSError as e:  # a name too long, a directory we may not list, ...
        raise InvalidRequest(f"{field} {short(raw)} is not a usable path ({e.strerror})",
                             field=field) from None
    return real


def confine_url(raw: str, remote_roots: Sequence[str], field: str = "path") -> str:
    """The canonical URL `raw` if it lies under a remote root (whole path segments)."""
    if not remote_roots:
        raise Forbidden("no remote roots are configured (MERGEPIPE_REMOTE_ROOTS); the server "
                        "may not read any URL", field=field)
    url = parse_url(raw, field)
    roots = [parse_url(r, "MERGEPIPE_REMOTE_ROOTS") for r in remote_roots]
    if not any(url.within(r) for r in roots):
        raise Forbidden(f"{field} {str(url)!r} is outside the allowed remote roots",
                        field=field)
    return str(url)


def confine_source(raw: str, data_roots: Sequence[Path], remote_roots: Sequence[str],
                   field: str = "path") -> str:
    """A URL under a remote root, or the real path of a local path inside a data root."""
    if is_url(raw):
        return confine_url(raw, remote_roots, field)
    return str(confine_input(raw, data_roots, field))


def _missing_why(real: Path) -> str:
    """Why a path inside a root cannot be found: a loop of symbolic links, or nothing there."""
    try:
        os.stat(real)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "is a loop of symbolic links: fix or remove the link"
    return "does not exist"


def _confine_entries(real: Path, roots: Sequence[Path], raw: str, field: str) -> None:
    """Refuse a directory entry that is a symbolic link out of the roots."""
    for entry in sorted(real.iterdir()):
        if entry.is_symlink() and not any(_inside(Path(os.path.realpath(entry)), r)
                                          for r in roots):
            raise Forbidden(f"{field} {short(raw)}: {entry.name} is a symbolic link to a file "
                            "outside the allowed data roots", field=field)


def recheck_input(path: str, data_roots: Sequence[Path], field: str = "path") -> None:
    """Confine again, when a job starts, a path that lies inside a data root: its directory may
    have changed (a symbolic link put in) since it was accepted. Paths outside every root (a
    merge output, a model the CLI registered) are left as the catalog has them. Whether a path
    is inside is decided by the path the catalog holds (the real path when it was accepted),
    not by where it leads now: a directory swapped for a link out of the root is refused."""
    held = Path(os.path.normpath(os.path.abspath(path)))
    roots = [Path(os.path.realpath(r)) for r in data_roots]
    if any(_inside(held, r) for r in roots):
        confine_input(str(held), roots, field=field)


def output_dir(output_root: Path, name: str, field: str = "output.name") -> Path:
    """OUTPUT_ROOT/<name> for a valid name that is not taken on disk."""
    check_name(name, field)
    root = Path(os.path.realpath(output_root))
    out = root / name
    if os.path.lexists(out):
        raise Conflict(f"output {name!r} already exists in the output root", field=field)
    return out


def temp_dirs(output_root: Path) -> list[Path]:
    """Leftover temporary outputs (`.NAME.tmp-*`) of runs that died before publishing."""
    root = Path(output_root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith(".") and ".tmp-" in p.name)
