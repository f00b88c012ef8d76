"""`mergepipe serve`: the HTTP API under uvicorn (settings from the environment and options)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
from pathlib import Path

from mergepipe.core.errors import InvalidRequest, MergePipeError
from mergepipe.core.settings import LOOPBACK_HOSTS


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg,unused-ignore]
    p = sub.add_parser("serve", help="serve the HTTP API (OpenAPI docs at /docs)",
                       description="Serve the HTTP API. Options override the MERGEPIPE_* "
                       "environment variables. SIGTERM / Ctrl-C stop it cleanly (exit 0).")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--workers", type=int, help="job worker threads ($MERGEPIPE_WORKERS, 2)")
    p.add_argument("--data-root", action="append", metavar="DIR",
                   help="a directory ingestion may read; repeatable ($MERGEPIPE_DATA_ROOTS, "
                   "':'-separated; default: the current directory)")
    p.add_argument("--output-root", metavar="DIR",
                   help="merge outputs go to DIR/<output name> ($MERGEPIPE_OUTPUT_ROOT, ./outputs)")
    p.add_argument("--log-level", default="info",
                   choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from mergepipe.service.app import create_app

    s = args.settings
    if args.workers is not None:
        if args.workers < 1:
            raise InvalidRequest("--workers must be >= 1", field="workers")
        s = dataclasses.replace(s, workers=args.workers)
    if args.data_root:
        s = dataclasses.replace(s, data_roots=tuple(Path(d).resolve() for d in args.data_root))
    elif not s.data_roots:
        s = dataclasses.replace(s, data_roots=(Path.cwd().resolve(),))
    if args.output_root:
        s = dataclasses.replace(s, output_root=Path(args.output_root))
    for root in s.data_roots:
        if not root.is_dir():
            raise InvalidRequest(f"data root {root} is not a directory", field="data_root")
    s = dataclasses.replace(s, output_root=s.output_root.resolve(),
                            catalog=s.catalog if isinstance(s.catalog, str)
                            else s.catalog.resolve())
    exposed = args.host not in LOOPBACK_HOSTS
    if exposed and not s.api_token and os.environ.get("MERGEPIPE_LOOPBACK_ONLY") != "1":
        raise InvalidRequest(
            f"refusing to serve on {args.host} without MERGEPIPE_API_TOKEN: set a token, or "
            "MERGEPIPE_LOOPBACK_ONLY=1 if only this machine can reach the port (a container "
            "published on 127.0.0.1)", field="MERGEPIPE_API_TOKEN")
    if exposed and not os.environ.get("MERGEPIPE_ALLOWED_HOSTS"):
        # Reached by names we cannot know (a container's, a load balancer's): the Host
        # allow-list guards loopback servers against DNS rebinding; the token guards this one.
        s = dataclasses.replace(s, allowed_hosts=("*",))
    s.output_root.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = uvicorn.Config(create_app(s), host=args.host, port=args.port,
                            log_level=args.log_level, timeout_graceful_shutdown=5,
                            proxy_headers=False, server_header=False)
    server = uvicorn.Server(config)
    # uvicorn shuts down gracefully on SIGTERM / SIGINT, then re-raises the signal to the
    # handler that was installed before it: make that one a no-op so a requested stop exits 0.
    stopped_by: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stopped_by.append(signum))
    server.run()
    if not server.started:
        raise ServerFailed(f"the server did not start on {args.host}:{args.port} (see the log)")
    return 0


class ServerFailed(MergePipeError):
    """uvicorn could not start (port taken, lifespan failure)."""

    status = 500
    code = "server_failed"
