"""`mergepipe plan`: dry run of a merge: which expert blocks it would read under the budget."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mergepipe.cli.commands.merge import (
    add_request_arguments,
    print_search,
    request_from_args,
    target_of,
)
from mergepipe.cli.main import print_json, progress_bars
from mergepipe.cli.mergekit_cli import config_options
from mergepipe.cli.table import human_bytes, print_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan", help="dry run: the access set of a merge under an I/O budget",
        description="Plan a merge without reading any weights: rank the experts' blocks by "
                    "utility per byte (|alpha| x L2 of the block's delta, from the catalog), "
                    "keep those that fit in --budget, and report bytes, the touched ratio and "
                    "the bound on the omitted update (linear, task_arithmetic).")
    p.add_argument("config", nargs="?", type=Path, metavar="CONFIG.yml",
                   help="a mergekit YAML config saying what to merge (instead of --base, "
                        "--experts, --op, --param)")
    add_request_arguments(p)
    p.add_argument("--blocks", type=int, default=0, metavar="N",
                   help="also list the first N blocks of the access set in rank order "
                        "(-1: all); with --json, adds them as \"blocks\"")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run, beside_server=True, local_paths=("config",))


def run(args: argparse.Namespace) -> int:
    from mergepipe.cli.beside import open_catalog

    request = None if args.config else request_from_args(args)
    target = target_of(args)
    with open_catalog(args) as cat:
        if request is None:
            plan = cat.plan(args.config, target_deviation=target, progress=progress_bars(args),
                            strategy=args.strategy, **config_options(args))
        else:
            plan = cat.plan(request, target_deviation=target)
    shown = plan.blocks if args.blocks < 0 else plan.blocks[:args.blocks]
    if args.json:
        out = plan.summary()
        if args.blocks:
            out["blocks"] = [b._asdict() for b in shown]
        print_json(out)
    else:
        print_plan(plan.summary())
        if args.blocks:
            print()
            print_table(["rank", "model", "tensor", "block", "bytes", "utility"],
                        [[b.rank, b.model, b.tensor, b.block_index, b.nbytes, b.utility]
                         for b in shown])
    return 0


def print_plan(s: dict[str, Any]) -> None:
    """A readable plan summary with a per-expert table."""
    full, budget = s["full_read_bytes"], s["budget_bytes"]
    st = s.get("strategy") or {}
    asked = st.get("request") if st.get("chosen") == "incremental" else None
    spec = (asked or s)["budget"]  # the user's, not the executed request's bytes
    given = (f"fraction {spec['fraction']:g} of the full read" if "fraction" in spec
             else f"{spec['bytes']} bytes")
    n_experts = len(asked["experts"]) if asked else len(s["experts"])  # the user's, not M_old's
    print(f"plan {s['plan_hash']}")
    print(f"  operator        {s['operator']} of {n_experts} expert(s) on base {s['base']!r}")
    print(f"  budget          {human_bytes(budget)} ({given})")
    print(f"  full read       {human_bytes(full)} (the scratch merge's expert bytes: the "
          "budget's unit, whatever the strategy)")
    print(f"  planned         {human_bytes(s['planned_expert_bytes'])} = "
          f"{s['touched_ratio']:.1%} of the full read ({s['selected_blocks']} of "
          f"{s['candidate_blocks']} candidate blocks)")
    if not full:
        print("  note            no expert block differs from the base: the merge is the base")
    region = s.get("unit_region")
    print(f"  unit            {s.get('unit', 'expert_block')}"
          + (f" (all experts' blocks of one output {region} together)" if region else
             " ((expert, block) pairs one by one)"))
    if s["omission_bound"] is not None:
        print(f"  omission bound  {s['omission_bound']:.6g} (L2 norm of the omitted update, "
              "at most)")
        if s.get("omission_bound_l2") is not None:
            print(f"  omission L2     {s['omission_bound_l2']:.6g} (tighter bound: blocks "
                  "summed in quadrature)")
        if s.get("predicted_deviation") is not None:
            print(f"  predicted dev.  {s['predicted_deviation']:.4g} (omission L2 over the full "
                  f"merge's update bound {s['update_bound_l2']:.6g})")
    else:
        print(f"  omission bound  none ({s['omission_bound_note'].removeprefix('no bound: ')})")
    if s.get("budget_search"):
        print_search(s["budget_search"])
    if s["fallback_experts"]:
        print(f"  fallback        {', '.join(s['fallback_experts'])}: no statistics, planned as "
              f"{s['fallback_order']}")
    print_ranking(s.get("ranking"))
    print(f"  planning        {s['planning_seconds'] * 1000:.1f} ms")
    if s.get("strategy"):
        print_strategy(s["strategy"])
    print()
    rows = []
    for e in s["experts"]:
        ratio = e["planned_bytes"] / e["full_read_bytes"] if e["full_read_bytes"] else 0.0
        rows.append([e["model"], e["kind"], e["weight"], e["density"], e["coefficient"],
                     f"{e['selected_blocks']}/{e['candidate_blocks']}",
                     human_bytes(e["planned_bytes"]), human_bytes(e["full_read_bytes"]),
                     f"{ratio:.1%}", "yes" if e["fallback"] else ""])
    if asked:
        print("executed terms: the stored merge times c and the changed experts")
    print_table(["expert", "kind", "weight", "density", "alpha", "blocks", "planned",
                 "full read", "ratio", "fallback"], rows)


def print_ranking(rk: dict[str, Any] | None) -> None:
    """The ranking utility=auto chose, and the spread it chose by (docs/catalog.md#rankings);
    nothing for a plan with an explicit (or a fixed default) ranking."""
    if rk is None:
        return
    why = ("" if rk["regime"] is None else f": {rk['regime']} updates, delta spread "
           f"{rk['delta_spread']:.3g}, flat below {rk['flat_below']:g}")
    print(f"  ranking         {rk['utility']} (utility=auto{why})")


def print_strategy(st: dict[str, Any]) -> None:
    """Both strategies' expert bytes and the chosen one (docs/incremental.md)."""
    sc, inc = st["scratch"], st["incremental"]
    print(f"  strategy        {st['chosen']} (asked: {st['requested']})")
    print(f"    scratch       {human_bytes(sc['planned_expert_bytes'])} expert bytes planned")
    if not inc["available"]:
        print(f"    incremental   unavailable: {inc['reason']}")
        return
    changes = ", ".join(f"{c['change']} {c['model']}" for c in inc["changes"]) or "reweighted"
    print(f"    incremental   {human_bytes(inc['planned_expert_bytes'])} of "
          f"{human_bytes(inc['full_read_bytes'])} expert bytes planned"
          f"{'' if inc.get('complete') else ' (incomplete: blocks left out)'}: "
          f"merge {inc['previous_merge']} ({inc['previous_model']}, c={inc['c']:.6g}) + "
          f"{changes}")
