"""`mergepipe worker`: runs the jobs of a shared PostgreSQL catalog, serves no HTTP."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import threading
from pathlib import Path

from mergepipe.core.errors import InvalidRequest


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg,unused-ignore]
    p = sub.add_parser(
        "worker", help="run queued ingestions and merges of a shared PostgreSQL catalog",
        description="Take jobs queued through any `mergepipe serve` on the same PostgreSQL "
        "catalog and run them (no HTTP). A job whose worker dies is taken over by another "
        "after its lease ($MERGEPIPE_LEASE_S, 30s) expires. SIGTERM / Ctrl-C stop it: running "
        "jobs get $MERGEPIPE_SHUTDOWN_GRACE_S to finish.")
    p.add_argument("--workers", type=int, help="job threads ($MERGEPIPE_WORKERS, 2)")
    p.add_argument("--data-root", action="append", metavar="DIR",
                   help="a directory ingestion may read; repeatable ($MERGEPIPE_DATA_ROOTS; "
                   "default: the current directory); the same as the servers'")
    p.add_argument("--output-root", metavar="DIR",
                   help="merge outputs' root ($MERGEPIPE_OUTPUT_ROOT), as the servers'")
    p.add_argument("--log-level", default="info",
                   choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mergepipe.catalog.db import Catalog
    from mergepipe.jobs.shared_runner import SharedJobRunner

    s = args.settings
    if not isinstance(s.catalog, str):
        raise InvalidRequest("a worker needs a shared catalog: set MERGEPIPE_CATALOG (or "
                             "--catalog) to a postgresql:// URL (a DuckDB file has one user)",
                             field="catalog")
    if args.workers is not None:
        if args.workers < 1:
            raise InvalidRequest("--workers must be >= 1", field="workers")
        s = dataclasses.replace(s, workers=args.workers)
    if args.data_root:
        s = dataclasses.replace(s, data_roots=tuple(Path(d).resolve() for d in args.data_root))
    elif not s.data_roots:
        s = dataclasses.replace(s, data_roots=(Path.cwd().resolve(),))
    s = dataclasses.replace(s, output_root=Path(args.output_root or s.output_root).resolve())
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signum, _frame: stop.set())
    with Catalog(s.catalog) as cat:
        runner = SharedJobRunner(cat, s)
        runner.start()
        print(f"worker {runner.worker} ready", flush=True)
        stop.wait()
        runner.stop()
    return 0
