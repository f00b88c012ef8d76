"""The commands this distribution adds to `mergepipe` (its command line lists this module):
`bench`, the benchmark suite (ours vs mergekit vs cat on a cold page cache), and `fidelity`,
the downstream KL study on a self-trained tiny Llama family."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    register_bench(sub)
    register_fidelity(sub)


def register_bench(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "bench", help="run the benchmark suite and write BENCHMARKS.md with plots",
        description="Generate a checkpoint family, ingest it, and time merges against mergekit "
        "and against cat/dd of the same bytes, each on a cold page cache (medians of several "
        "runs). Needs mergekit (pip install mergekit) and matplotlib for the plots.")
    from mergepipe_bench.cli_args import add_arguments
    add_arguments(p)
    p.set_defaults(func=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    from mergepipe.cli.requires import require

    if not args.large:  # the large-family row times mergepipe alone
        require({"mergekit": "pip install 'mergekit==0.1.5' (or pip install ./benchmarks)"},
                "the suite times mergekit beside mergepipe")
    from mergepipe_bench.run import run_from_args
    return run_from_args(args)


def register_fidelity(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "fidelity", help="downstream fidelity: KL of utility vs random plans vs the base",
        description="Train (once, cached) a tiny byte-level Llama base and task experts on CPU, "
        "merge them under budgets with the planner's plan and with random plans of equal bytes, "
        "and report the teacher-forced KL to the full merge, L2 deviation and exact match.")
    p.add_argument("--quick", action="store_true",
                   help="tiny model, few steps: the whole pipeline in well under a minute")
    p.add_argument("--dir", default=None, help="working folder (family cache, results.json); "
                   "default bench-output/fidelity[-quick]")
    p.add_argument("--report", default=None, help="Markdown report path (PNG plot beside it); "
                   "default docs/FIDELITY.md, or DIR/FIDELITY.md with --quick")
    p.add_argument("--random-plans", type=int, default=None,
                   help="random plans per budget (default 8; 2 with --quick)")
    p.add_argument("--finetune-lr", type=float, default=None,
                   help="experts' peak learning rate (default 5e-4; 3e-3 gives deltas as large "
                   "as the weights)")
    p.add_argument("--finetune-steps", type=int, default=None,
                   help="experts' training steps (default 200)")
    p.add_argument("--retrain", action="store_true", help="retrain the family even if cached")
    p.add_argument("--render-only", action="store_true",
                   help="rewrite the report from DIR/results.json without measuring again")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--units", action="store_true",
                   help="the planning-unit study instead: linear, ties and dare_ties planned "
                   "by (expert, block), whole-tensor groups and block groups vs random plans of "
                   "equal bytes at budgets 0.3 and 0.5; writes DIR/units-FAMILY.json and .md")
    p.add_argument("--calibration", action="store_true",
                   help="the calibration study instead: the base calibrated on task text "
                   "(mergepipe calibrate), linear and ties planned with utility l2, per_tensor, "
                   "stratified, activation and fisher at budgets 0.1, 0.3 and 0.5, plus the "
                   "activation order from exact channel RMS and (toy, linear) a leave-one-out "
                   "KL oracle; writes DIR/calibration-FAMILY.json and .md")
    p.add_argument("--family", choices=("toy", "realistic"), default="toy",
                   help="with --units or --calibration: toy (4 experts, large deltas) or realistic (12 experts, "
                   "deltas of about 1e-3 of the weights, float32)")
    # core.schema.UTILITY's choices (not imported: `--help` imports no third-party package)
    p.add_argument("--utility", choices=("l2", "per_tensor", "coverage", "stratified"),
                   default="l2",
                   help="with --units: the planner's block ranking for every operator; "
                   "another than l2 writes DIR/units-FAMILY-UTILITY.*, without random plans")
    p.set_defaults(func=run_fidelity_command)


def run_units_study(args: argparse.Namespace, root: Path, command: str) -> int:
    """`--units`: the planning-unit study of one family; tables in DIR/units-FAMILY.md."""
    from dataclasses import replace

    from mergepipe_bench.fidelity.units import (
        UnitsConfig,
        quick_units_config,
        realistic_family,
        run_units,
    )
    from mergepipe_bench.fidelity.units_report import render
    cfg = quick_units_config() if args.quick else UnitsConfig()
    if args.family == "realistic" and not args.quick:
        cfg = UnitsConfig(family=realistic_family())
    if args.random_plans is not None:
        cfg = replace(cfg, random_plans=args.random_plans)
    name = f"units-{args.family}"  # both families can share one folder (and base)
    # the ranking is always explicit: operators differ in their default (docs/operators.md)
    cfg = replace(cfg, operators=tuple(replace(o, params={**o.params, "utility": args.utility})
                                       for o in cfg.operators))
    if args.utility != "l2":  # the ranking variant: its plans only (the random plans are equal)
        name += f"-{args.utility}"
        cfg = replace(cfg, random_plans=0, random_group_plans=0, units=cfg.units[:2])
    res = (json.loads((root / f"{name}.json").read_text()) if args.render_only
           else run_units(cfg, root, retrain=args.retrain, name=name))
    (root / f"{name}.md").write_text(render([(args.family, res)], command) + "\n")
    print(f"report: {root / f'{name}.md'}  results: {root / f'{name}.json'}")
    return 0


def run_calibration(args: argparse.Namespace, root: Path, command: str) -> int:
    """`--calibration`: the calibration study of one family; tables in DIR/calibration-FAMILY.md."""
    from mergepipe_bench.fidelity.calibration_study import (
        CalibrationConfig,
        render,
        run_calibration_study,
    )
    from mergepipe_bench.fidelity.units import realistic_family, toy_family

    name = f"calibration-{args.family}"
    family = realistic_family() if args.family == "realistic" else toy_family()
    res = (json.loads((root / f"{name}.json").read_text()) if args.render_only
           else run_calibration_study(CalibrationConfig(
               family=family, oracle=args.family != "realistic"), root, name))
    (root / f"{name}.md").write_text(render([(args.family, res)], command) + "\n")
    print(f"report: {root / f'{name}.md'}  results: {root / f'{name}.json'}")
    return 0


def run_fidelity_command(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from mergepipe.cli.requires import require

    if not args.render_only:  # (rewriting the report measures nothing)
        require({"transformers": "pip install 'transformers>=5,<6' (or pip install ./benchmarks)"},
                "the study trains and evaluates a tiny Llama family")

    from mergepipe.cli.main import print_json
    from mergepipe_bench.fidelity.report import write_report
    from mergepipe_bench.fidelity.run import FidelityConfig, quick_config, run_fidelity

    cfg = quick_config() if args.quick else FidelityConfig()
    ft = cfg.family.finetune
    ft = replace(ft, lr=args.finetune_lr or ft.lr, steps=args.finetune_steps or ft.steps)
    cfg = replace(cfg, family=replace(cfg.family, finetune=ft))
    if args.random_plans is not None:
        cfg = replace(cfg, random_plans=args.random_plans)
    root = Path(args.dir or ("bench-output/fidelity-quick" if args.quick
                             else "bench-output/fidelity")).absolute()
    if args.calibration:
        return run_calibration(args, root, "mergepipe " + " ".join(
            shlex.quote(a) for a in sys.argv[1:]))
    if args.units:
        return run_units_study(args, root, "mergepipe " + " ".join(
            shlex.quote(a) for a in sys.argv[1:]))
    md = Path(args.report) if args.report else (root / "FIDELITY.md" if args.quick
                                                else Path("docs/FIDELITY.md"))
    if args.render_only:
        res = json.loads((root / "results.json").read_text())
    else:
        res = run_fidelity(cfg, root, retrain=args.retrain)
    command = "mergepipe " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    write_report(res, md, md.with_name(f"{md.stem.lower()}-kl.png"), command)
    if args.json:
        print_json(res)
    else:
        print(f"report: {md}  results: {root / 'results.json'}")
    return 0
