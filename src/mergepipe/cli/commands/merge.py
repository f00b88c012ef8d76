"""`mergepipe merge`: plan, execute and publish a budgeted merge, then print its summary."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mergepipe.cli import preload
from mergepipe.cli.job_options import add_engine_arguments, with_engine
from mergepipe.cli.main import print_json, progress_bars
from mergepipe.cli.mergekit_cli import config_options
from mergepipe.cli.table import human_bytes
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.operators import REGISTRY
from mergepipe.core.request import DEFAULT_STRATEGY, STRATEGIES, MergeRequest

if TYPE_CHECKING:
    from mergepipe.jobs.report import MergeSummary


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "merge", help="merge experts into their base under an I/O budget",
        description="Merge experts into their base reading at most --budget expert bytes. The "
                    "output (safetensors laid out like the base, plus manifest.json) appears "
                    "atomically in --out and is registered as a model.")
    p.add_argument("config", nargs="?", type=Path, metavar="CONFIG.yml",
                   help="a mergekit YAML config saying what to merge (instead of --base, "
                        "--experts, --op, --param); local paths in it are registered on the fly")
    add_request_arguments(p)
    p.add_argument("--out", help="output directory (must not exist or be empty), or an "
                                 "s3://bucket/prefix to upload it to (multipart, published "
                                 "when complete)")
    p.add_argument("--name", help="model name of the output in the catalog (default: the "
                                  "--out directory name)")
    p.add_argument("--threads", type=int, help="read threads (default: 2 x cores, 2..8)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a non-empty --out directory")
    add_engine_arguments(p, job="merge", ray_help="local: this process's threads; ray: Ray "
                         "tasks, one per output region")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run, beside_server=True, local_paths=("config", "out"))


def add_request_arguments(p: argparse.ArgumentParser) -> None:
    """The options of a merge request (shared with `plan`-like commands)."""
    p.add_argument("--base", help="base model name")
    p.add_argument("--experts", help="NAME[:WEIGHT[:DENSITY]],... in order")
    p.add_argument("--op", "--operator", dest="op", help=operators_help())
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help=params_help())
    p.add_argument("--budget", help="fraction of the full read (0.3) or bytes (2GiB); "
                                    "default 1 = the full merge")
    p.add_argument("--target-deviation", metavar="X",
                   help="instead of --budget: the smallest budget (a fraction of the full read, "
                        "in steps of 0.01) whose plan's predicted deviation is at most X, in "
                        "[0, 1] (additive operators; docs/deviation.md#predicted-deviation)")
    p.add_argument("--seed", type=int, default=0, help="seed of the keyed random generator")
    p.add_argument("--dtype", help="output dtype: bf16 | fp16 | fp32 (default: the base's)")
    p.add_argument("--strategy", choices=STRATEGIES, default=DEFAULT_STRATEGY,
                   help="scratch (default): the standard merge, whatever merges the catalog "
                        "holds; incremental: extend a stored merge of the same base and "
                        "operator, reading it and the changed experts only (equal to scratch "
                        "within a stated rounding bound); auto: incremental only when its plan "
                        "is complete and reads fewer bytes (docs/incremental.md)")


def operators_help() -> str:
    """--op's help: every registered operator, with its aliases."""
    names = [s.name + (f" ({', '.join(s.aliases)})" if s.aliases else "")
             for s in REGISTRY.values()]
    return f"one of {len(names)} operators (docs/operators.md): {' | '.join(names)}"


def params_help() -> str:
    """--param's help: each operator parameter, the operators that take it, its values and
    default (per group of operators where they differ)."""
    groups: dict[str, dict[tuple[tuple[str, ...], object], list[str]]] = {}
    helps: dict[str, str] = {}
    for spec in REGISTRY.values():
        for q in spec.params:
            groups.setdefault(q.name, {}).setdefault((q.choices, q.default), []).append(spec.name)
            helps.setdefault(q.name, q.help)
    sparse = [s.name for s in REGISTRY.values() if s.density]
    parts = ["lambda (scale of the merged delta, default 1) and normalize (divide by the sum "
             "of the weights) for the additive operators",
             f"density (fraction of each delta kept, default 1) for {', '.join(sparse)}"]
    for name, by in groups.items():
        where = "; ".join(f"{', '.join(ops)}: {'|'.join(choices) + ', ' if choices else ''}"
                          f"default {str(default).lower() if isinstance(default, bool) else default}"
                          for (choices, default), ops in by.items())
        parts.append(f"{name} ({where})" + (f": {helps[name]}" if len(by) == 1 else ""))
    auto = dict.fromkeys(s.name for s in REGISTRY.values() if s.default_utility == "auto")
    parts.append("utility=l2|per_tensor|coverage|stratified|tensor_energy|region_energy|"
                 "activation|fisher|auto: the planner's block ranking (activation, fisher: "
                 "after mergepipe calibrate BASE; auto: by the spread of the updates, the "
                 f"default of {', '.join(auto)})")
    return "operator parameter, repeatable: " + "; ".join(parts)


def parse_params(items: list[str]) -> dict[str, Any]:
    """['density=0.5', 'normalize=false'] -> {'density': 0.5, 'normalize': False}."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InvalidRequest(f"--param {item!r}: use KEY=VALUE", field="params")
        v = value.strip()
        parsed: Any = v
        if v.lower() in ("true", "false"):
            parsed = v.lower() == "true"
        else:
            try:
                parsed = float(v)
            except ValueError:
                parsed = v
        out[key.strip()] = parsed
    return out


def request_from_args(args: argparse.Namespace) -> MergeRequest:
    """The merge request given by --base/--experts/--op/... options."""
    from mergepipe.api import Catalog

    for opt in ("base", "experts", "op"):
        if not getattr(args, opt):
            raise InvalidRequest(f"--{opt} is required", field=opt)
    return Catalog.request(base=args.base, experts=args.experts, operator=args.op,
                           params=parse_params(args.param), budget=args.budget,
                           seed=args.seed, dtype=args.dtype, strategy=args.strategy)


def target_of(args: argparse.Namespace) -> float | None:
    """--target-deviation checked (InvalidRequest: not a number in [0, 1], or beside
    --budget)."""
    from mergepipe.core.schema import check_target_deviation  # pydantic: not on --help's path

    return check_target_deviation(args.target_deviation, budget_given=args.budget is not None)


def print_search(search: dict[str, Any]) -> None:
    """How --target-deviation chose the budget."""
    below = ("" if search["below"] is None else
             f"; {search['below']:g} predicts "
             + ("no expert byte read" if search["below_deviation"] is None
                else f"{search['below_deviation']:.4g}"))
    print(f"  target          deviation <= {search['target_deviation']:g}: budget "
          f"{search['fraction']:g} of the full read predicts {search['predicted_deviation']:.4g}"
          f"{below} (grid {search['resolution']:g}, {search['plans']} plans)")


def run(args: argparse.Namespace) -> int:
    request = None if args.config else request_from_args(args)
    if args.out is None:
        raise InvalidRequest("--out is required", field="output")
    target = target_of(args)
    if request is None or needs_torch(request):
        preload.start("torch")  # while the catalog opens
    from mergepipe.cli.beside import in_server, open_catalog

    with_engine(args)
    output = {"out": args.out, "name": args.name, "overwrite": args.overwrite,
              "threads": args.threads, "progress": progress_bars(args)}
    with open_catalog(args) as cat:
        from mergepipe.jobs.recovery import recover_interrupted

        if not in_server(args):  # (a server recovers its own at start-up)
            recover_interrupted(cat.db)  # merges of a killed `mergepipe merge`: we hold the file
        search = None
        if request is None and target is None:  # any config: passthrough included
            result = cat.merge(args.config, strategy=args.strategy, **output,
                               **config_options(args))
        else:
            if request is None:
                request = dataclasses.replace(
                    cat.config(args.config, progress=output["progress"],
                               **config_options(args)), strategy=args.strategy)
            if target is not None:  # the budget is chosen first, as POST /v1/merges does
                request, chosen = cat.for_deviation(request, target)
                search = chosen.budget_search
            result = cat.merge(request, **output)
    if args.json:
        print_json(result if search is None else {**result.to_dict(), "budget_search": search})
    else:
        print_summary(result)
        if search is not None:
            print_search(search)
    return 0


def needs_torch(request: MergeRequest) -> bool:
    """Whether the merge runs torch kernels (not only the fused C ones), as far as the request
    tells: experts stored as LoRA adapters load torch when their first block is merged."""
    from mergepipe.core.operators import fused

    return not fused.covers(request.spec, request.params) or request.whole_tensor is not None


def print_summary(r: MergeSummary) -> None:
    """A readable summary of a merge result."""
    budget, full = r.budget_bytes, r.full_read_bytes
    share = (f" = {budget / full:.0%} of the full read {human_bytes(full)} (scratch's)"
             if full else "")
    if r.operator == "passthrough":
        print(f"merge {r.merge_id} succeeded: passthrough, {r.blocks_total} tensors copied "
              f"-> {r.output} (model {r.output_name!r})")
        print(f"  plan hash       {r.plan_hash}")
        print(f"  bytes read      {human_bytes(r.base_bytes_read)} (the layers taken)")
        print(f"  wall time       {r.wall_seconds:.2f} s")
        return
    print(f"merge {r.merge_id} succeeded: {r.operator} of {len(r.experts)} expert(s) "
          f"-> {r.output} (model {r.output_name!r})")
    print(f"  plan hash       {r.plan_hash}")
    if r.strategy == "incremental":
        print(f"  strategy        incremental from merge {r.previous_merge}")
    print(f"  budget          {human_bytes(budget)}{share}")
    print(f"  expert bytes    {human_bytes(r.expert_bytes_read)} read "
          f"({human_bytes(r.planned_expert_bytes)} planned)")
    print(f"  base bytes      {human_bytes(r.base_bytes_read)}")
    if r.omission_bound is not None:
        print(f"  omission bound  {r.omission_bound:.6g} (L2 of the omitted update, at most)")
    if r.omission_bound_l2 is not None:
        print(f"  omission L2     {r.omission_bound_l2:.6g} (tighter bound: blocks summed in "
              "quadrature)")
    if r.predicted_deviation is not None:
        print(f"  predicted dev.  {r.predicted_deviation:.4g} (omission L2 over the full "
              "merge's update bound)")
    print(f"  blocks          {r.expert_blocks_read} expert blocks read over "
          f"{r.blocks_total} output blocks")
    print(f"  wall time       {r.wall_seconds:.2f} s (plan {r.plan_seconds or 0:.2f} s, "
          f"execute {r.exec_seconds:.2f} s)")
