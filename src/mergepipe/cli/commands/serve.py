"""`mergepipe serve`: the HTTP API under uvicorn (settings from the environment and options)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mergepipe.cli.job_options import add_job_arguments, job_settings
from mergepipe.core.errors import InvalidRequest, MergePipeError
from mergepipe.core.settings import LOOPBACK_HOSTS, Settings


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg,unused-ignore]
    p = sub.add_parser("serve", help="serve the HTTP API (OpenAPI docs at /docs)",
                       description="Serve the HTTP API. Options override the MERGEPIPE_* "
                       "environment variables. SIGTERM / Ctrl-C stop it cleanly (exit 0).")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    add_job_arguments(p, data_root_help="a directory ingestion may read; repeatable "
                      "($MERGEPIPE_DATA_ROOTS, ':'-separated; default: the current directory)",
                      output_root_help="merge outputs go to DIR/<output name> "
                      "($MERGEPIPE_OUTPUT_ROOT, ./outputs)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from mergepipe.service.app import create_app

    s = start_settings(args.host, job_settings(args), os.environ)
    s.output_root.mkdir(parents=True, exist_ok=True)
    from mergepipe.api import Catalog

    sock = listen(args.host, args.port)  # before the catalog: a port in use changes nothing
    try:
        cat = Catalog(settings=s).db  # one it cannot use: a one-line error, not a traceback
    except BaseException:
        sock.close()
        raise
    app: Any = create_app(s, cat)
    relay = None
    if isinstance(s.catalog, Path):  # DuckDB: the CLI beside it runs through this server
        from mergepipe.cli.beside import CliRelay
        from mergepipe.cli.main import build_parser, run_command

        relay = app = CliRelay(app, (build_parser, run_command), catalog=s.catalog,
                               host=args.host, port=sock.getsockname()[1])
    config = uvicorn.Config(app, host=args.host, port=args.port,
                            log_level=args.log_level, log_config=None,  # our handler (logs.py)
                            timeout_graceful_shutdown=5,
                            proxy_headers=False, server_header=False)
    server = uvicorn.Server(config)
    # uvicorn shuts down gracefully on SIGTERM / SIGINT, then re-raises the signal to the
    # handler that was installed before it: make that one a no-op so a requested stop exits 0.
    stopped_by: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stopped_by.append(signum))
    try:
        server.run(sockets=[sock])
    finally:
        if relay is not None:
            relay.withdraw()
        cat.close()  # (closed already at a clean shutdown)
    if not server.started:
        raise ServerFailed(f"the server did not start on {args.host}:{args.port} (see the log)")
    return 0


def start_settings(host: str, s: Settings, env: Mapping[str, str]) -> Settings:
    """serve's address rule: off loopback, an API token or MERGEPIPE_LOOPBACK_ONLY=1; any Host."""
    exposed = host not in LOOPBACK_HOSTS
    if exposed and not s.api_token and env.get("MERGEPIPE_LOOPBACK_ONLY") != "1":
        raise InvalidRequest(
            f"refusing to serve on {host} without MERGEPIPE_API_TOKEN: set a token, or "
            "MERGEPIPE_LOOPBACK_ONLY=1 if only this machine can reach the port (a container "
            "published on 127.0.0.1)", field="MERGEPIPE_API_TOKEN")
    if exposed and not env.get("MERGEPIPE_ALLOWED_HOSTS"):
        # Reached by names we cannot know (a container's, a load balancer's): the Host
        # allow-list guards loopback servers against DNS rebinding; the token guards this one.
        s = dataclasses.replace(s, allowed_hosts=("*",))
    return s


def listen(host: str, port: int) -> socket.socket:
    """The listening socket (port 0: any free port, which the advertisement names)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as e:
        raise ServerFailed(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


class ServerFailed(MergePipeError):
    """uvicorn could not start (port taken, lifespan failure)."""

    status = 500
    code = "server_failed"
