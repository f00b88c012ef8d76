"""Utility variants on the fidelity family: other block scores than |alpha_i| * ||D_itb||_2 per
byte, each taken first-fit up to the utility plan's bytes and measured like the random plans,
plus the planner's own `params.utility = per_tensor` plan (docs/FIDELITY.md, "Utility variants").

    .venv/bin/python -m benchmarks.fidelity.utility_study [--dir bench-output/fidelity]
        [--finetune-lr 1e-4] [--only tensor-energy,...] [--out NAME.json] [--render]

Reuses a cached family (root/family-*, root/base-*) and root/results.json of `mergepipe
fidelity` for the random plans (seeded, deterministic: they are not re-executed; the utility
plan is, and its KL is checked against results.json). Writes root/utility-study.json.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.ingest import ingest_model
from mergepipe.planner.plan import Plan, make_plan
from mergepipe_bench.fidelity.evaluate import load_state
from mergepipe_bench.fidelity.family import build_family
from mergepipe_bench.fidelity.random_plan import Candidate, _first_fit, candidates
from mergepipe_bench.fidelity.run import Evaluator, FidelityConfig, OperatorRun
from mergepipe_bench.fidelity.tasks import eval_set

Score = Callable[[Candidate], float]


class Norms:
    """Per-block base L2 (from the base checkpoint and the catalog's block grid) and per-tensor
    delta L2 (tensor_stats) for the scores below."""

    def __init__(self, cat: Catalog, base_dir: Path) -> None:
        state: dict[str, torch.Tensor] = {}
        for f in sorted(base_dir.glob("*.safetensors")):
            state.update(load_file(f))
        with cat.reader() as conn:
            grid = conn.execute(SQL(
                "SELECT tensor, block_index, row_start, row_end FROM blocks "
                "WHERE model = 'base'")).all()
            tstats = conn.execute(SQL("SELECT model, tensor, l2 FROM tensor_stats")).all()
        self.base_block: dict[tuple[str, int], float] = {}
        self.base_tensor: dict[str, float] = {}
        for tensor, bi, r0, r1 in grid:
            t = state[tensor].double()
            rows = t.reshape(t.shape[0], -1) if t.dim() > 1 else t.reshape(-1, 1)
            self.base_block[(tensor, int(bi))] = float(rows[r0:r1].norm())
        for name, t in state.items():
            self.base_tensor[name] = float(t.double().norm())
        self.delta_tensor = {(m, t): float(v) for m, t, v in tstats}


def _totals(cands: list[Candidate], n: Norms, eps: float) -> tuple[
        dict[str, float], dict[str, float], dict[tuple[str, str], float],
        dict[tuple[str, str], int]]:
    """Per expert: utility and relative-change totals; per (expert, tensor): the block
    utilities' total in L2 (|alpha_i| * ||D_it||) and the bytes."""
    expert_tot: dict[str, float] = {}
    rel_tot: dict[str, float] = {}
    squares: dict[tuple[str, str], float] = {}
    tensor_bytes: dict[tuple[str, str], int] = {}
    for c in cands:
        key = (c.model, c.tensor)
        expert_tot[c.model] = expert_tot.get(c.model, 0.0) + c.utility
        rel = c.utility / max(n.base_block[(c.tensor, c.block_index)], eps)
        rel_tot[c.model] = rel_tot.get(c.model, 0.0) + rel
        squares[key] = squares.get(key, 0.0) + c.utility ** 2
        tensor_bytes[key] = tensor_bytes.get(key, 0) + c.nbytes
    alpha_tensor = {k: math.sqrt(v) for k, v in squares.items()}
    return expert_tot, rel_tot, alpha_tensor, tensor_bytes


def variants(cands: list[Candidate], n: Norms) -> dict[str, Score]:
    """Name -> per-byte score (higher first) of each variant."""
    eps = 1e-12
    expert_tot, rel_tot, alpha_tensor, tensor_bytes = _totals(cands, n, eps)

    def relative(c: Candidate) -> float:
        return c.utility / max(n.base_block[(c.tensor, c.block_index)], eps) / c.nbytes

    def relative_expert(c: Candidate) -> float:
        return relative(c) / (rel_tot[c.model] or 1.0)

    def tensor_normalized(c: Candidate) -> float:
        return c.utility / max(alpha_tensor[(c.model, c.tensor)], eps) / c.nbytes

    def expert_normalized(c: Candidate) -> float:
        return c.utility / (expert_tot[c.model] or 1.0) / c.nbytes

    def relative_tensor(c: Candidate) -> float:
        # whole tensors by the tensor's relative change (||alpha D_it|| / ||B_t||), blocks of a
        # tensor by utility per byte (a tiny term: keeps tensors contiguous in the order)
        t = alpha_tensor[(c.model, c.tensor)] / max(n.base_tensor[c.tensor], eps)
        return t + 1e-9 * c.utility / c.nbytes

    def tensor_energy(c: Candidate) -> float:
        # the block's share of its tensor's squared delta: every tensor has the same total
        return (c.utility / max(alpha_tensor[(c.model, c.tensor)], eps)) ** 2 / c.nbytes

    def tensor_density(c: Candidate) -> float:
        # squared delta per byte relative to its tensor's average: byte-neutral across tensors
        return tensor_energy(c) * tensor_bytes[(c.model, c.tensor)]

    return {"tensor-energy": tensor_energy, "tensor-density": tensor_density,
            "relative": relative, "relative-expert": relative_expert,
            "tensor-normalized": tensor_normalized, "expert-normalized": expert_normalized,
            "relative-tensor": relative_tensor}


def ordered_plan(plan: Plan, cands: list[Candidate], score: Score, name: str) -> Plan:
    order = sorted(cands, key=lambda c: -score(c))
    return _first_fit(plan, cands, order, {"order": name})


def study(cfg: FidelityConfig, root: Path, only: list[str] | None,
          out_name: str = "utility-study.json") -> dict[str, Any]:
    torch.set_num_threads(cfg.threads)
    prior = json.loads((root / "results.json").read_text())
    family = build_family(cfg.family, root)
    if family["key"] != prior["family"]["key"]:
        raise SystemExit("results.json was measured on another family")
    work = root / "utility-study"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    experts = list(family["experts"])
    ev = Evaluator(eval_set(list(cfg.family.tasks), cfg.eval_per_task, cfg.eval_seed))
    out: dict[str, Any] = {"family": family["key"], "operators": []}
    with Catalog(work / "catalog.duckdb") as cat:
        ingest_model(cat, family["base"]["path"], "base", block_bytes=cfg.block_bytes)
        for e in experts:
            ingest_model(cat, family["experts"][e]["path"], e, base="base",
                         block_bytes=cfg.block_bytes)
        norms = Norms(cat, Path(family["base"]["path"]))
        for op, prior_op in zip(cfg.operators, prior["operators"], strict=True):
            run = OperatorRun(cfg, cat, ev, work, "base", experts, op)
            full_plan = make_plan(cat, run.request(1.0))
            full_dir, _ = run.merge(full_plan, "full")
            full_lp, targets, _ = ev.measure(full_dir)
            full_state = load_state(full_dir)
            cands = candidates(cat, full_plan)
            scores = variants(cands, norms)
            if only:
                scores = {k: v for k, v in scores.items() if k in only}
            rows = []
            for f, prow in zip(cfg.budgets, prior_op["budgets"], strict=True):
                if f >= 1.0:
                    continue
                t0 = time.perf_counter()
                plan = make_plan(cat, run.request(f))
                assert plan.plan_hash == prow["utility"]["plan_hash"], "plan changed"
                row: dict[str, Any] = {
                    "fraction": f,
                    "utility": run._measure(plan, f"u{f}", full_lp, targets, full_state),
                    "random_answer_kl": [r["kl"]["answer"] for r in prow["random"]],
                    "prior_utility_answer_kl": prow["utility"]["kl"]["answer"], "variants": {}}
                req = run.request(f)
                req = replace(req, params={**req.params, "utility": "per_tensor"})
                row["planner_per_tensor"] = run._measure(make_plan(cat, req), f"pt{f}", full_lp,
                                                         targets, full_state)
                kl, prior_kl = row["utility"]["kl"]["answer"], row["prior_utility_answer_kl"]
                if abs(kl - prior_kl) > 1e-6 * max(1.0, abs(prior_kl)):
                    raise SystemExit(f"utility plan KL {kl} differs from results.json {prior_kl}")
                for name, score in scores.items():
                    vp = ordered_plan(plan, cands, score, name)
                    row["variants"][name] = run._measure(vp, f"{name}{f}", full_lp, targets,
                                                         full_state)
                rows.append(row)
                rnd = statistics.median(row["random_answer_kl"])
                msg = "  ".join(f"{k} {v['kl']['answer']:.3g}" for k, v in row["variants"].items())
                msg += f"  planner per_tensor {row['planner_per_tensor']['kl']['answer']:.3g}"
                print(f"  {op.name} {f:.2f}: utility {row['utility']['kl']['answer']:.3g} "
                      f"random median {rnd:.3g}  {msg}  ({time.perf_counter() - t0:.0f}s)",
                      flush=True)
            shutil.rmtree(full_dir, ignore_errors=True)
            out["operators"].append({"operator": op.name, "params": op.params, "budgets": rows})
    (root / out_name).write_text(json.dumps(out, indent=2) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return out


def _g(x: float) -> str:
    return f"{x:.3g}"


def render(root: Path, name: str = "utility-study.json") -> str:
    """Markdown tables of root/name (answer-token KL to the full merge)."""
    res = json.loads((root / name).read_text())
    prior = json.loads((root / "results.json").read_text())
    lines: list[str] = []
    for op, pop in zip(res["operators"], prior["operators"], strict=True):
        columns = list(op["budgets"][0]["variants"])
        lines += [f"{op['operator']} ({', '.join(f'{k}={v}' for k, v in op['params'].items())}),"
                  " answer-token KL; random = median [min, max] of the 8 random plans; **bold**:"
                  " below the random median", "",
                  "| budget | random plans | l2 (default) | per_tensor (planner) | "
                  + " | ".join(columns) + " |",
                  "|---:|---:|---:|---:|" + "---:|" * len(columns)]
        wins: dict[str, int] = {}
        for row in op["budgets"]:
            rnd = row["random_answer_kl"]
            med = statistics.median(rnd)
            cells = [("l2", row["utility"]), ("per_tensor", row["planner_per_tensor"])]
            cells += [(k, row["variants"][k]) for k in columns]
            out = []
            for k, m in cells:
                kl = m["kl"]["answer"]
                wins[k] = wins.get(k, 0) + (kl < med)
                out.append(f"**{_g(kl)}**" if kl < med else _g(kl))
            lines.append(f"| {row['fraction']:.1f} | {_g(med)} [{_g(min(rnd))}, {_g(max(rnd))}] | "
                         + " | ".join(out) + " |")
        n = len(op["budgets"])
        lines.append("| below median | - | " + " | ".join(
            f"{wins.get(k, 0)}/{n}" for k in ("l2", "per_tensor", *columns)) + " |")
        lines += ["", f"{op['operator']}: per_tensor plan vs l2 plan vs random median: relative "
                  "L2 deviation from the full merge, attention share of the bytes, exact match "
                  "(mean over tasks)", "",
                  "| budget | rel. L2 l2 / per_tensor / random | attn share l2 / per_tensor / "
                  "random | exact match l2 / per_tensor / random |", "|---:|---:|---:|---:|"]
        for row, prow in zip(op["budgets"], pop["budgets"], strict=False):
            u, pt = row["utility"], row["planner_per_tensor"]

            def attn(m: dict[str, Any]) -> float:
                by = m["bytes_by_kind"]
                return by.get("attn", 0) / max(sum(by.values()), 1)
            rl2 = statistics.median(r["l2"]["rel"] for r in prow["random"])
            ratt = statistics.median(attn(r) for r in prow["random"])
            racc = statistics.median(r["accuracy"]["mean"] for r in prow["random"])
            lines.append(f"| {row['fraction']:.1f} | {_g(u['l2']['rel'])} / {_g(pt['l2']['rel'])}"
                         f" / {_g(rl2)} | {attn(u):.0%} / {attn(pt):.0%} / {ratt:.0%} | "
                         f"{u['accuracy']['mean']:.1%} / {pt['accuracy']['mean']:.1%} / "
                         f"{racc:.1%} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", default="bench-output/fidelity")
    p.add_argument("--finetune-lr", type=float, default=None)
    p.add_argument("--only", default=None, help="comma-separated variant names")
    p.add_argument("--out", default="utility-study.json", help="results file name in DIR")
    p.add_argument("--render", action="store_true",
                   help="print Markdown tables of DIR/utility-study.json (no measuring)")
    args = p.parse_args()
    if args.render:
        print(render(Path(args.dir), args.out))
        return
    cfg = FidelityConfig()
    ft = cfg.family.finetune
    cfg = replace(cfg, family=replace(cfg.family, finetune=replace(
        ft, lr=args.finetune_lr or ft.lr)))
    root = Path(args.dir).absolute()
    prior = json.loads((root / "results.json").read_text())
    prior_budgets = tuple(b["fraction"] for b in prior["operators"][0]["budgets"])
    cfg = replace(cfg, budgets=prior_budgets)
    study(cfg, root, args.only.split(",") if args.only else None, args.out)


__all__ = ["main", "render", "study", "variants"]

if __name__ == "__main__":
    main()
