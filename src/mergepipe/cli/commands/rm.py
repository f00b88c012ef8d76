"""`mergepipe rm NAME` / `mergepipe rm --merge ID`: retire a model; cancel or retire a merge."""

from __future__ import annotations

import argparse

from mergepipe.cli.main import print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rm", help="remove a model (retire it) or a merge (cancel it, or retire it if finished)",
        description="Remove a model: its name leaves the listings, its rows and lineage stay "
        "(visible in SQL: models.retired_at). Refused while merge outputs, experts or jobs "
        "depend on it, unless --force. NAME removes every version of the name, NAME~N one "
        "version. Files are never deleted, except with --delete-files the directory of a "
        "merge output under the output root (MERGEPIPE_OUTPUT_ROOT). With --merge ID: cancel "
        "a queued or running merge (it stops between blocks and publishes nothing), or retire "
        "a finished one.")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("name", nargs="?", help="model name (or NAME~N for one version)")
    what.add_argument("--merge", metavar="ID", help="a merge id (m-...) instead of a model")
    p.add_argument("--force", action="store_true",
                   help="retire the model even though others depend on it")
    p.add_argument("--delete-files", action="store_true",
                   help="also delete the model's directory if it is a merge output under the "
                   "output root")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")
    p.set_defaults(func=run, beside_server=True)


def run(args: argparse.Namespace) -> int:
    from mergepipe.cli.beside import open_catalog
    from mergepipe.core.errors import InvalidRequest

    if args.merge is not None and (args.force or args.delete_files):
        raise InvalidRequest("--force and --delete-files apply to models, not to --merge",
                             field="merge")
    with open_catalog(args) as cat:
        if args.merge is not None:
            row = cat.remove_merge(args.merge)
            if args.json:
                print_json(row)
            else:
                what = "retired" if row.retired_at else row.status
                print(f"merge {row.merge_id}: {what}")
            return 0
        removal = cat.remove(args.name, force=args.force, delete_files=args.delete_files)
    if args.json:
        print_json(removal.to_dict())
        return 0
    print(f"removed {args.name!r}: retired {', '.join(repr(k) for k in removal.retired)}")
    for d in removal.deleted:
        print(f"deleted {d}")
    for k in removal.kept:
        print(f"kept {k}")
    return 0
