"""`mergepipe worker`: runs the jobs of a shared PostgreSQL catalog, serves no HTTP."""

from __future__ import annotations

import argparse
import signal
import threading

from mergepipe.cli.job_options import add_job_arguments, job_settings
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.settings import Settings


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg,unused-ignore]
    p = sub.add_parser(
        "worker", help="run queued ingestions and merges of a shared PostgreSQL catalog",
        description="Take jobs queued through any `mergepipe serve` on the same PostgreSQL "
        "catalog and run them (no HTTP). A job whose worker dies is taken over by another "
        "after its lease ($MERGEPIPE_LEASE_S, 30s) expires. SIGTERM / Ctrl-C stop it: running "
        "jobs get $MERGEPIPE_SHUTDOWN_GRACE_S to finish.")
    add_job_arguments(p, data_root_help="a directory ingestion may read; repeatable "
                      "($MERGEPIPE_DATA_ROOTS; default: the current directory); the same as "
                      "the servers'", output_root_help="merge outputs' root "
                      "($MERGEPIPE_OUTPUT_ROOT), as the servers'")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mergepipe.api import Catalog
    from mergepipe.jobs.shared_runner import SharedJobRunner

    check_catalog(args.settings)
    s = job_settings(args)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signum, _frame: stop.set())
    with Catalog(settings=s) as cat:
        runner = SharedJobRunner(cat.db, s)
        runner.start()
        print(f"worker {runner.worker} ready", flush=True)
        stop.wait()
        runner.stop()
    return 0


def check_catalog(s: Settings) -> None:
    """A worker's start-up rule: its catalog is a shared (PostgreSQL) one."""
    if not isinstance(s.catalog, str):
        raise InvalidRequest("a worker needs a shared catalog: set MERGEPIPE_CATALOG (or "
                             "--catalog) to a postgresql:// URL (a DuckDB file has one user)",
                             field="catalog")
