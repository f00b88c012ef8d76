"""The `mergepipe` command line: one entry point, one module per command in `commands/`."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import importlib
import json
import os
import sys
import threading
from typing import Any, NoReturn

from mergepipe.core import checkpoint_limits
from mergepipe.core.errors import MergePipeError
from mergepipe.core.jsonable import jsonable
from mergepipe.core.settings import Settings

# Each module defines register(subparsers) which adds its parser(s) with set_defaults(func=...).
COMMAND_MODULES = [
    "mergepipe.cli.commands.ingest",
    "mergepipe.cli.commands.models",
    "mergepipe.cli.commands.rm",
    "mergepipe.cli.commands.plan",
    "mergepipe.cli.commands.merge",
    "mergepipe.cli.commands.sql",
    "mergepipe.cli.commands.replay",
    "mergepipe.cli.commands.lineage",
    "mergepipe.cli.commands.compare",
    "mergepipe.cli.commands.serve",
    "mergepipe.cli.commands.worker",
    "mergepipe.cli.commands.demo",
    "mergepipe.cli.commands.calibrate",
    # `bench` and `fidelity`, from the benchmark suite: a distribution of its own (benchmarks/),
    # listed when installed (never imported by the product otherwise)
    "mergepipe_bench.commands",
]

DESCRIPTION = """\
Budgeted merging of LLM checkpoint families.

Checkpoints are ingested once into a catalog of tensor blocks with statistics of each
expert's delta against the base. A merge then reads only the expert blocks its plan selects
under an I/O budget: --budget 0.3 reads at most 30% of the bytes the operator would read in
full (its full-read cost), --budget 2GiB at most that many bytes. --budget 1 gives exactly
the standard merge; lower budgets drop the blocks with the least delta per byte first and
report a bound on the error (additive operators) before anything is read. `plan` shows the
bytes, the bound and the plan hash of a budget without reading any weight.

examples:
  mergepipe ingest ./base --name base
  mergepipe ingest ./math --name math --base base          (or --kind lora for a PEFT adapter)
  mergepipe plan  --base base --experts math,code:0.5 --op ties --param density=0.5 --budget 0.3
  mergepipe merge --base base --experts math,code --op ties --budget 0.3 --out ./merged
  mergepipe merge mergekit.yml --out ./merged --budget 2GiB   (a mergekit config, as is)
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mergepipe", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--catalog", help="catalog file or postgresql:// URL (default: "
                        "$MERGEPIPE_CATALOG or "
                        "./mergepipe.duckdb)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is not None and (name + ".").startswith(e.name + "."):  # its package is absent
                continue
            raise
        module.register(sub)
    return parser


def print_json(obj: Any) -> None:
    json.dump(jsonable(obj), sys.stdout, indent=2)
    sys.stdout.write("\n")


def progress_bars(args: argparse.Namespace) -> bool:
    return not getattr(args, "json", False) and sys.stderr.isatty()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    if getattr(args, "beside_server", False):
        # a command on a DuckDB catalog that a running `serve` holds: through its API
        from mergepipe.cli import beside

        try:
            server = beside.find_server(Settings.from_env(catalog=args.catalog).catalog)
            rc = None if server is None else beside.relay(server, argv, args.command)
        except MergePipeError as e:
            return report_error(args, e)
        except KeyboardInterrupt:
            print(f"mergepipe {args.command}: interrupted here; the command goes on in the "
                  "server", file=sys.stderr)
            return 130
        if rc is not None:
            return rc
    return run_command(args)


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed command (also a relayed one): its exit status, errors one line on stderr."""
    try:
        if not hasattr(args, "settings"):  # (a relayed command comes with the caller's)
            args.settings = Settings.from_env(catalog=args.catalog)
            checkpoint_limits.install(args.settings.checkpoint_limits())
        rc = args.func(args)
    except MergePipeError as e:
        return report_error(args, e)
    except ModuleNotFoundError as e:
        from mergepipe.cli.requires import missing_module

        missing = missing_module(e)
        if missing is None:
            raise
        return report_error(args, missing)
    except KeyboardInterrupt:
        print(f"mergepipe {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`mergepipe sql ... | head`): stop quietly, as Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    return int(rc or 0)


def report_error(args: argparse.Namespace, e: MergePipeError) -> int:
    one_line = " ".join(e.message.split("\n"))  # a message never spans lines
    print(f"mergepipe {args.command}: error: {one_line}", file=sys.stderr)
    return 2


def entry() -> NoReturn:
    """The `mergepipe` console script: `main()`, then a quick exit."""
    # Start-up makes hundreds of thousands of long-lived objects: at the default threshold the
    # collector ran 130 times over them while they imported (0.2 s of 1.2 s).
    gc.set_threshold(50_000, 10, 10)
    rc = main()
    # Tearing down an interpreter that ran a merge takes 0.3-2 s of collection and clean-up:
    # with no other thread, profiler or tracer, run the exit handlers, flush, and end there.
    if threading.active_count() > 1 or sys.getprofile() or sys.gettrace():
        sys.exit(rc)  # threads to join, or a profiler or coverage tool to write its results
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader gone away, a closed stream
            stream.flush()
    os._exit(rc)


if __name__ == "__main__":
    entry()
