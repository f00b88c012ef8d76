"""`mergepipe replay MERGE_ID`: re-execute a merge's stored access set and verify its hashes."""

from __future__ import annotations

import argparse
from pathlib import Path

from mergepipe.cli.main import print_json
from mergepipe.cli.table import human_bytes

EXIT_MISMATCH = 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay", help="re-run a stored merge plan and verify the output hashes",
        description="Re-execute the access set a merge recorded (its touched blocks, not a new "
                    "plan) and compare every output tensor's hash with the stored one. Exits "
                    f"{EXIT_MISMATCH} if any tensor differs.")
    p.add_argument("merge_id", help="the merge to replay (m-...)")
    p.add_argument("--out", type=Path, help="keep the replayed output in this directory "
                                            "(default: a temporary directory, removed)")
    p.add_argument("--threads", type=int, help="read threads")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run, beside_server=True, local_paths=("out",))


def run(args: argparse.Namespace) -> int:
    from mergepipe.cli.beside import open_catalog

    with open_catalog(args) as cat:
        result = cat.replay(args.merge_id, args.out, threads=args.threads)
    if args.json:
        print_json(result)
    else:
        verdict = "match" if result.match else "MISMATCH"
        print(f"replay {result.merge_id}: {verdict}: {result.n_tensors} tensors, "
              f"{len(result.mismatched_tensors)} differ; "
              f"{human_bytes(result.expert_bytes_read)} expert bytes read "
              f"(budget {human_bytes(result.budget_bytes)}), {result.wall_seconds:.2f} s")
        for name in result.mismatched_tensors:
            print(f"  differs: {name}")
        if result.output:
            print(f"  output kept in {result.output}")
    return 0 if result.match else EXIT_MISMATCH
