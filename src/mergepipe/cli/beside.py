"""The CLI beside a running server: DuckDB lets one process open a catalog file, so while
`mergepipe serve` holds one, the commands that use the catalog run in that server, through its
HTTP API, with the same output, `--json` and exit status as a direct run.

The server advertises itself in `CATALOG.server.json` next to the catalog file (mode 0600:
its address, its process id and a secret made at each start), written once the catalog is open
and removed when the server stops. A command finds it, checks that it belongs to this user and
that the process lives, and posts its arguments, working directory and MERGEPIPE_* settings to
the relay (cli/relay.py); the output comes back as it is printed. A stale advertisement (the
process is gone, or nothing answers at its address) is ignored: the command runs directly.
A PostgreSQL catalog needs none of it: every process connects to the database itself.

A command takes part by `set_defaults(beside_server=True)` on its parser, opening its catalog
with `open_catalog(args)` (the Python API's `Catalog`) and naming its local path options in `local_paths` (made absolute
against the caller's working directory in the server)."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mergepipe.core.errors import MergePipeError

if TYPE_CHECKING:
    import argparse

    from mergepipe.api import Catalog
    from mergepipe.catalog.db import Catalog as CatalogDatabase

ADVERT_SUFFIX = ".server.json"
RELAY_PATH = "/v1/cli"
SECRET_HEADER = "x-mergepipe-relay-secret"
ENV_PREFIX = "MERGEPIPE_"


class RelayFailed(MergePipeError):
    """The server beside which the command ran broke the relay off (it stopped mid-way)."""

    status = 502
    code = "relay_failed"


@dataclass(frozen=True)
class Advert:
    """What a running server says about itself next to its catalog."""

    pid: int
    host: str
    port: int
    secret: str
    catalog: str
    path: Path  # the advertisement file

    def to_json(self) -> str:
        return json.dumps({"pid": self.pid, "host": self.host, "port": self.port,
                           "secret": self.secret, "catalog": self.catalog})


def advert_path(catalog: Path) -> Path:
    """CATALOG.server.json, next to the (absolute) catalog file."""
    c = catalog.expanduser().absolute()
    return c.with_name(c.name + ADVERT_SUFFIX)


def write_advert(advert: Advert) -> None:
    """Write the file atomically, readable and writable by this user only."""
    tmp = advert.path.with_name(f".{advert.path.name}.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(advert.to_json())
    os.replace(tmp, advert.path)


def remove_advert(advert: Advert) -> None:
    """Remove the file if it is still this server's."""
    current = read_advert(advert.path)
    if current is not None and current.pid == advert.pid and current.secret == advert.secret:
        with contextlib.suppress(FileNotFoundError):
            advert.path.unlink()


def read_advert(path: Path) -> Advert | None:
    """The advertisement in `path`, if there is one written by this user for this user only."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            return None  # another user's, or readable by others: not trusted
        try:
            doc = json.loads(f.read(65536))
            return Advert(int(doc["pid"]), str(doc["host"]), int(doc["port"]),
                          str(doc["secret"]), str(doc["catalog"]), path)
        except (ValueError, KeyError, TypeError):
            return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def find_server(catalog: Path | str) -> Advert | None:
    """The live server advertised next to a DuckDB catalog file; None on PostgreSQL, when there
    is none, or when its process is gone (then the stale file is removed)."""
    if isinstance(catalog, str):
        return None  # a PostgreSQL URL: every process connects itself
    advert = read_advert(advert_path(catalog))
    if advert is None or advert.pid == os.getpid():
        return None
    if not alive(advert.pid):
        with contextlib.suppress(OSError):
            advert.path.unlink()
        return None
    return advert


def relay(advert: Advert, argv: list[str], command: str) -> int | None:
    """Run `argv` in the advertised server, copying its output here as it comes; its exit
    status, or None when nothing answers at the address (a stale advertisement: run directly)."""
    import http.client

    body = json.dumps({"argv": argv, "cwd": os.getcwd(),
                       "env": {k: v for k, v in os.environ.items()
                               if k.startswith(ENV_PREFIX)}}).encode()
    conn = http.client.HTTPConnection(advert.host, advert.port, timeout=10)
    try:
        conn.request("POST", RELAY_PATH, body, {
            "Content-Type": "application/json", SECRET_HEADER: advert.secret,
            "Host": f"{'localhost' if ':' not in advert.host else '[::1]'}:{advert.port}"})
        if conn.sock is not None:
            conn.sock.settimeout(None)  # a merge runs as long as it runs
        resp = conn.getresponse()
    except (ConnectionRefusedError, TimeoutError, OSError):
        conn.close()
        return None
    try:
        if resp.status != 200:
            raise RelayFailed(f"the server (PID {advert.pid}) refused to run the command: "
                              f"{_error_message(resp.read())}")
        rc = None
        for line in resp:
            msg = json.loads(line)
            if "out" in msg:
                sys.stdout.write(msg["out"])
                sys.stdout.flush()
            elif "err" in msg:
                sys.stderr.write(msg["err"])
                sys.stderr.flush()
            elif "rc" in msg:
                rc = int(msg["rc"])
        if rc is None:
            raise RelayFailed(f"the server (PID {advert.pid}) stopped before `{command}` "
                              "finished; see its log")
        return rc
    except (OSError, http.client.HTTPException, ValueError):
        raise RelayFailed(f"the server (PID {advert.pid}) broke off `{command}`; see its "
                          "log") from None
    finally:
        conn.close()


def _error_message(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode(errors="replace")


# -- what a command uses ----------------------------------------------------------------------
@contextlib.contextmanager
def open_catalog(args: argparse.Namespace) -> Iterator[Catalog]:
    """The command's catalog, as the Python API (`mergepipe.Catalog`) with the command's
    settings: over the server's own database when it runs beside a server (left open), or the
    one the settings name, opened for the command and closed after it."""
    from mergepipe.api import Catalog  # start-up: imported only when it runs

    shared: CatalogDatabase | None = getattr(args, "server_catalog", None)
    with (Catalog(settings=args.settings) if shared is None
          else Catalog.over(shared, args.settings)) as cat:
        yield cat


def in_server(args: argparse.Namespace) -> bool:
    """Whether the command runs in a server, beside its job runner."""
    return getattr(args, "server_catalog", None) is not None


def absolute_paths(args: argparse.Namespace, cwd: str) -> None:
    """The command's local path options, made absolute against the caller's directory."""
    for dest in getattr(args, "local_paths", ()):
        value: Any = getattr(args, dest, None)
        if value is None or "://" in str(value):
            continue
        full = Path(cwd) / Path(str(value)).expanduser()
        setattr(args, dest, type(value)(full) if isinstance(value, Path) else str(full))
