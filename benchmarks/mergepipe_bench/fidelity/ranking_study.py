"""The ranking study (docs/FIDELITY.md, "Default rankings"): per family, operator and budget,
the plan of each ranking (first-fit in rank order up to the budget, which is what the planner's
prefix and fill passes compute for (expert, block) units) and the planner's own default plan,
against 8 random plans of at least as many bytes (the largest planned bytes of the rankings).

    python -m mergepipe_bench.fidelity.ranking_study --family toy --dir DIR
        [--operators linear,ties] [--budgets 0.1,0.3] [--rankings l2,coverage]
        [--planner per_tensor:group,...] [--random N] [--seed0 S] [--weights]
    python -m mergepipe_bench.fidelity.ranking_study --dir DIR --render  # the tables
    python -m mergepipe_bench.fidelity.ranking_study --dir DIR --render --verdict OPS --weights
        # how well the plans' weight-space distances to the full merge order them by KL

Families are trained once and cached under DIR (family-*, base-*); the catalog too
(DIR/ranking-<family>/catalog.duckdb). Writes DIR/ranking-<family>.json.
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.ingest import ingest_model
from mergepipe.catalog.models import list_models
from mergepipe.core.operators.registry import REGISTRY
from mergepipe.planner import knapsack
from mergepipe.planner.plan import Plan, auto_ranking, make_plan
from mergepipe_bench.fidelity.evaluate import load_state, weight_errors
from mergepipe_bench.fidelity.family import FamilySpec, build_family
from mergepipe_bench.fidelity.model import ModelSize, TrainSpec
from mergepipe_bench.fidelity.random_plan import Candidate, _first_fit, candidates, random_plan
from mergepipe_bench.fidelity.ranking_verdict import add_auto, load, summary, weights_summary
from mergepipe_bench.fidelity.run import Evaluator, OperatorRun, OperatorSpec, machine
from mergepipe_bench.fidelity.tasks import eval_set
from mergepipe_bench.fidelity.units import UnitsConfig, realistic_family, toy_family

OPERATORS = (OperatorSpec("linear"), OperatorSpec("ties", {"density": 0.5}),
             OperatorSpec("dare_ties", {"density": 0.5}), OperatorSpec("della", {"density": 0.5}),
             OperatorSpec("task_arithmetic", {"lambda": 0.5}),
             OperatorSpec("breadcrumbs_ties", {"density": 0.5}))
BUDGETS = (0.1, 0.2, 0.3, 0.5, 0.7)
PLANNER_RANKINGS = ("l2", "per_tensor", "coverage", "stratified", "tensor_energy",
                    "region_energy")  # params.utility values


def small_deltas_family() -> FamilySpec:
    """The toy family's base and 4 tasks, experts fine-tuned at lr 1e-4 (small deltas)."""
    return FamilySpec(finetune=TrainSpec(steps=100, batch=16, lr=1e-4, warmup=10))


def neox_family() -> FamilySpec:
    """The sixth family: another architecture (GPT-NeoX: fused query_key_value, LayerNorm and
    linear biases, GELU MLP, parallel residual), another shape (6 layers, hidden 192) and seed,
    the same 4 tasks with 4 near-copies each (16 experts, other samples and seeds) fine-tuned
    briefly at a low learning rate (small deltas, float32 as the realistic family)."""
    return FamilySpec(size=ModelSize(hidden=192, intermediate=768, layers=6, heads=6,
                                     arch="gpt_neox"),
                      pretrain=TrainSpec(steps=300, batch=32, lr=2e-3),
                      finetune=TrainSpec(steps=15, batch=16, lr=1e-5, warmup=3),
                      experts_per_task=4, dtype="f32", seed=6)


def neox_llama_family() -> FamilySpec:
    """The neox family's control: the same shape, recipe and seed in the Llama class (RMSNorm,
    SwiGLU MLP, separate q/k/v, no biases), to tell the class from the recipe."""
    return replace(neox_family(), size=replace(neox_family().size, arch="llama"))


def _reseeded(make: Callable[[], FamilySpec], seed: int) -> Callable[[], FamilySpec]:
    """The same family trained from another seed (base and experts)."""
    return lambda: replace(make(), seed=seed)


def brief_family() -> FamilySpec:
    """Held out from the regime rule's seven families: the realistic family's brief recipe
    (15 steps at lr 1e-5, float32) with the toy family's 4 distinct experts, no near-copies."""
    return replace(realistic_family(), experts_per_task=1)


def copies_family() -> FamilySpec:
    """Held out too: the toy family's recipe (100 steps at lr 5e-4, bf16) with 3 near-copies
    per task (12 experts), seed 2."""
    return replace(toy_family(), experts_per_task=3, seed=2)


def neox_brisk_family() -> FamilySpec:
    """Held out from the shipped rule: the neox family's base and shape, experts trained as the
    toy family's (100 steps at lr 5e-4, bf16), one per task."""
    return replace(neox_family(), finetune=toy_family().finetune, experts_per_task=1,
                   dtype="bf16")


def mid_family() -> FamilySpec:
    """Held out too: the toy base, experts at the small family's rate (100 steps at lr 1e-4) in
    float32, 2 near-copies per task (8 experts)."""
    return replace(small_deltas_family(), experts_per_task=2, dtype="f32")


FAMILIES: dict[str, Callable[[], FamilySpec]] = {
    "toy": toy_family, "small": small_deltas_family, "realistic": realistic_family,
    "toy-s1": _reseeded(toy_family, 1), "small-s1": _reseeded(small_deltas_family, 1),
    "neox": neox_family, "neox-llama": neox_llama_family,
    "brief": brief_family, "copies": copies_family, "neox-brisk": neox_brisk_family,
    "mid": mid_family}

Order = Callable[[list[Candidate]], list[Candidate]]


def _by(cands: list[Candidate], score: dict[int, float]) -> list[Candidate]:
    """Candidates by score per byte, descending; ties in candidate (planner) order."""
    return [cands[i] for i in sorted(range(len(cands)), key=lambda i: (-score[i] / cands[i].nbytes, i))]


def _marginal_sqrt(cands: list[Candidate], key: Callable[[Candidate], Any],
                   weight: Callable[[Any, float], float]) -> dict[int, float]:
    """Greedy gains of sum over groups g of weight(g, E_g) * sqrt(retained energy share of g):
    within a group, units by utility descending; unit k gains weight * (sqrt(S_k) - sqrt(S_k-1))
    / sqrt(E_g) (S: running sum of squared utilities). Concave: the gains fall along the order."""
    groups: dict[Any, list[int]] = {}
    for i, c in enumerate(cands):
        groups.setdefault(key(c), []).append(i)
    out: dict[int, float] = {}
    for g, idx in groups.items():
        idx.sort(key=lambda i: (-cands[i].utility, i))
        total = math.fsum(cands[i].utility ** 2 for i in idx)
        w = weight(g, total)
        s = 0.0
        for i in idx:
            prev, s = s, s + cands[i].utility ** 2
            out[i] = w * (math.sqrt(s) - math.sqrt(prev)) / math.sqrt(total) if total else 0.0
    return out


def _et_energy(cs: list[Candidate]) -> dict[tuple[str, str], float]:
    """Sum of squared utilities per (expert, tensor): |alpha_i|^2 ||D_it||^2."""
    e: dict[tuple[str, str], float] = {}
    for c in cs:
        e[(c.model, c.tensor)] = e.get((c.model, c.tensor), 0.0) + c.utility ** 2
    return e


def _l2(cs: list[Candidate]) -> list[Candidate]:
    return _by(cs, {i: c.utility for i, c in enumerate(cs)})


def _per_tensor(cs: list[Candidate]) -> list[Candidate]:
    e = _et_energy(cs)
    return _by(cs, {i: c.utility / math.sqrt(e[(c.model, c.tensor)]) for i, c in enumerate(cs)})


def _energy(cs: list[Candidate]) -> list[Candidate]:
    e = _et_energy(cs)
    return _by(cs, {i: c.utility ** 2 / e[(c.model, c.tensor)] for i, c in enumerate(cs)})


def _tensor_energy(cs: list[Candidate]) -> list[Candidate]:
    """a_u^2 / E_t per byte, E_t the summed a^2 of the tensor over every expert: the greedy of
    sum over tensors of (omitted energy / total energy), a quadratic (KL-like) model of the
    output change in which each tensor's whole update counts the same."""
    e: dict[str, float] = {}
    for c in cs:
        e[c.tensor] = e.get(c.tensor, 0.0) + c.utility ** 2
    return _by(cs, {i: c.utility ** 2 / e[c.tensor] if e[c.tensor] else 0.0
                    for i, c in enumerate(cs)})


def _region_energy(cs: list[Candidate]) -> list[Candidate]:
    """a^2 over the tensor's summed a^2 (every expert) times sqrt(k) - sqrt(k - 1), k the rank
    by a among the experts of the region (ties: the l2 order), as
    planner/sql/planner_rank_region_energy.sql."""
    e: dict[str, float] = {}
    for c in cs:
        e[c.tensor] = e.get(c.tensor, 0.0) + c.utility ** 2
    prior = {id(c): r for r, c in enumerate(_l2(cs))}
    groups: dict[tuple[str, int], list[int]] = {}
    for i, c in enumerate(cs):
        groups.setdefault((c.tensor, c.block_index), []).append(i)
    score: dict[int, float] = {}
    for idx in groups.values():
        for k, i in enumerate(sorted(idx, key=lambda i: (-cs[i].utility, prior[id(cs[i])])), 1):
            c = cs[i]
            share = c.utility ** 2 / e[c.tensor] if e[c.tensor] else 0.0
            score[i] = share * (math.sqrt(k) - math.sqrt(k - 1))
    return [cs[i] for i in sorted(range(len(cs)), key=lambda i: (
        -score[i] / cs[i].nbytes, prior[id(cs[i])]))]


def _dim(cs: list[Candidate], key: Callable[[Candidate], Any]) -> list[Candidate]:
    """per_tensor share times sqrt(k) - sqrt(k - 1), k the rank by share in key's group (ties:
    the per_tensor order), as planner/sql/planner_rank_diminish.sql."""
    e = _et_energy(cs)
    share = {i: c.utility / math.sqrt(e[(c.model, c.tensor)]) for i, c in enumerate(cs)}
    prior = {id(c): r for r, c in enumerate(_per_tensor(cs))}
    groups: dict[Any, list[int]] = {}
    for i, c in enumerate(cs):
        groups.setdefault(key(c), []).append(i)
    score: dict[int, float] = {}
    for idx in groups.values():
        for k, i in enumerate(sorted(idx, key=lambda i: (-share[i], prior[id(cs[i])])), 1):
            score[i] = share[i] * (math.sqrt(k) - math.sqrt(k - 1))
    return [cs[i] for i in sorted(range(len(cs)), key=lambda i: (
        -score[i] / cs[i].nbytes, prior[id(cs[i])]))]


def rankings() -> dict[str, Order]:
    """Name -> ordering of the candidates (first-fit in this order gives the plan).
    coverage: sum over (expert, tensor) of ||kept|| / ||D_it|| (blocks of equal share);
    stratified: per region (tensor, block), experts with diminishing returns;
    coverage_exact: coverage with the exact running energy instead of the rank."""
    return {"l2": _l2, "per_tensor": _per_tensor, "energy": _energy,
            "tensor_energy": _tensor_energy, "region_energy": _region_energy,
            "coverage": lambda cs: _dim(cs, lambda c: (c.model, c.tensor)),
            "stratified": lambda cs: _dim(cs, lambda c: (c.tensor, c.block_index)),
            "coverage_exact": lambda cs: _by(cs, _marginal_sqrt(
                cs, lambda c: (c.model, c.tensor), lambda g, e: 1.0))}


def _keys(plan: Plan) -> str:
    """Digest of a plan's block set (to spot a ranking's plan equal to the planner's)."""
    import hashlib
    return hashlib.sha256(repr(sorted((b.model, b.tensor, b.block_index)
                                      for b in plan.blocks)).encode()).hexdigest()[:16]


def _cap(plan: Plan, nbytes: int) -> Plan:
    return replace(plan, planned_expert_bytes=nbytes)


class Study:
    def __init__(self, family: str, root: Path, eval_per_task: int, threads: int = 1) -> None:
        self.name, self.root = family, root
        self.spec = FAMILIES[family]()
        self.cfg = replace(UnitsConfig(family=self.spec), eval_per_task=eval_per_task,
                           threads=threads)
        self.work = root / f"ranking-{family}"

    def catalog(self) -> tuple[Catalog, dict[str, Any]]:
        info = build_family(self.spec, self.root)
        self.work.mkdir(parents=True, exist_ok=True)
        path = self.work / "catalog.duckdb"
        done = self.work / "catalog.done"
        if not done.exists():
            path.unlink(missing_ok=True)
        cat = Catalog(path)
        if not done.exists():
            ingest_model(cat, info["base"]["path"], "base", block_bytes=self.cfg.block_bytes)
            for e, v in info["experts"].items():
                ingest_model(cat, v["path"], e, base="base", block_bytes=self.cfg.block_bytes)
            done.write_text("ok\n")
        return cat, info

    def run(self, operators: list[OperatorSpec], budgets: list[float], names: list[str],
            n_random: int, out: dict[str, Any],
            planner_variants: tuple[str, ...] = (), seed0: int = 1000,
            weights: bool = False) -> dict[str, Any]:
        """weights: record each plan's weight-space distance to the full merge too
        (evaluate.weight_errors)."""
        torch.set_num_threads(self.cfg.threads)
        cat, info = self.catalog()
        experts = list(info["experts"])
        ev = Evaluator(eval_set(list(self.spec.tasks), self.cfg.eval_per_task, self.cfg.eval_seed))
        fidelity_cfg: Any = replace(self.cfg, budgets=tuple(budgets))
        orders = {k: v for k, v in rankings().items() if k in names}
        base_lp, targets, _ = ev.measure(Path(info["base"]["path"]))
        base_state = load_state(Path(info["base"]["path"])) if weights else {}
        with cat:
            for op in operators:
                run = OperatorRun(fidelity_cfg, cat, ev, self.work / "merges", "base", experts, op)
                full = make_plan(cat, run.request(1.0))
                full_dir, _ = run.merge(full, "full")
                full_lp, targets, _ = ev.measure(full_dir)
                full_state = load_state(full_dir) if weights else {}
                shutil.rmtree(full_dir, ignore_errors=True)
                base_kl = ev.kl(full_lp, base_lp, targets)["answer"]
                cands = candidates(cat, full)
                ordered = {k: o(cands) for k, o in orders.items()}
                rec = out.setdefault("operators", {}).setdefault(op.name, {
                    "params": op.params, "base_kl": base_kl, "default_utility": None,
                    "default_unit": full.unit, "budgets": {}})
                rec["base_kl"] = base_kl
                for f in budgets:
                    t0 = time.perf_counter()
                    plan = make_plan(cat, run.request(f))
                    rec["default_utility"] = plan.request.params.get(
                        "utility", plan.request.spec.default_utility)
                    row = rec["budgets"].setdefault(str(f), {"rankings": {}})
                    row["budget_bytes"] = plan.budget_bytes

                    def kl(p: Plan, tag: str, run: OperatorRun = run, full_lp: Any = full_lp,
                           targets: Any = targets, full_state: Any = full_state
                           ) -> dict[str, Any]:
                        d, _ = run.merge(p, tag)
                        lp, _, _ = ev.measure(d)
                        w = weight_errors(load_state(d), full_state, base_state) if weights else {}
                        shutil.rmtree(d, ignore_errors=True)
                        k = ev.kl(full_lp, lp, targets)
                        return {"kl": k["answer"], "kl_all": k["all"],
                                "bytes": p.planned_expert_bytes, "plan_hash": p.plan_hash,
                                "omission_bound": p.omission_bound, "blocks": _keys(p), **w}
                    cap = _cap(plan, plan.budget_bytes)
                    for k, order in ordered.items():
                        fp = _first_fit(cap, cands, order, {"order": k})
                        if k in PLANNER_RANKINGS:  # what the planner plans is measured
                            fp = _planners(cat, run, f, k, fp)
                        row["rankings"][k] = kl(fp, k)
                    # "utility:unit": the planner's own plan (operators planned in groups)
                    for pv in (planner_variants if full.unit != "expert_block" else ()):
                        u, unit = pv.split(":")
                        req = run.request(f)
                        req = replace(req, params={**req.params, "utility": u, "unit": unit})
                        row["rankings"][pv] = kl(make_plan(cat, req), pv)
                    same = [k for k, v in row["rankings"].items()
                            if v["blocks"] == _keys(plan)]
                    row["default"] = (dict(row["rankings"][same[0]], same_as=same[0]) if same
                                      else kl(plan, "default"))
                    top = max([r["bytes"] for r in row["rankings"].values()]
                              + [row["default"]["bytes"]])
                    row["random_seeds"] = [seed0, seed0 + n_random - 1]
                    row["random"] = [kl(random_plan(_cap(plan, top), cands, seed0 + s), f"r{s}")
                                     for s in range(n_random)]
                    # --random 0: the rankings only (random plans pooled from other runs)
                    med = statistics.median([r["kl"] for r in row["random"]] or [math.nan])
                    msg = "  ".join(f"{k} {v['kl']:.3g}" for k, v in row["rankings"].items())
                    print(f"  {self.name} {op.name} {f}: random {med:.3g}  default "
                          f"{row['default']['kl']:.3g}  {msg}  ({time.perf_counter() - t0:.0f}s)",
                          flush=True)
                    self._save(out)
        return out

    def _save(self, out: dict[str, Any]) -> None:
        (self.root / f"ranking-{self.name}.json").write_text(json.dumps(out, indent=2) + "\n")


def _planners(cat: Catalog, run: OperatorRun, budget: float, utility: str, study: Plan) -> Plan:
    """`study` (the study's first-fit order of `utility` at `budget`) when the planner plans
    the same blocks, else the planner's own plan ((expert, block) units). They differ when some
    blocks of a tensor are not candidates (ties' trim, rows the fine-tunes left alone): the
    study's shares are over the candidates, the planner's over the whole (expert, tensor)
    delta."""
    req = run.request(budget)
    plan = make_plan(cat, replace(req, params={**req.params, "utility": utility,
                                               "unit": "expert_block"}))
    if _keys(plan) == _keys(study):
        return study
    print(f"  {run.op.name} {budget} {utility}: the planner's plan differs from the study's "
          "order; measuring the planner's", flush=True)
    return plan


def family_spreads(roots: list[Path], families: list[str]) -> dict[str, float | None]:
    """Each family's delta spread (utility=auto's statistic over its experts), from the first
    of `roots` that holds its catalog (ranking-<family>/catalog.duckdb)."""
    out: dict[str, float | None] = {}
    for fam in families:
        path = next((p for r in roots if (p := r / f"ranking-{fam}" / "catalog.duckdb").exists()),
                    None)
        if path is None:
            continue
        with Catalog(path) as cat, cat.reader() as conn:
            experts = [m.name for m in list_models(conn) if m.base is not None and m.has_stats]
            out[fam] = knapsack.delta_spread(conn, experts)
    return out


def _g(x: float) -> str:
    return f"{x:.3g}"


def render(roots: list[Path], families: list[str]) -> str:
    """One Markdown table per operator, rows (family, budget): answer-token KL to the full merge
    as a ratio of the base's; **bold**: below the median of the random plans."""
    res = load(roots, families)  # later roots add random plans (other seeds) and rankings
    ops = list(dict.fromkeys(op for r in res.values() for op in r.get("operators", {})))
    lines: list[str] = []
    for op in ops:
        recs = {f: r["operators"][op] for f, r in res.items() if op in r.get("operators", {})}
        # pooled runs had other defaults: then only the named rankings
        names = ["default"] * (len(roots) == 1) + list(dict.fromkeys(
            k for rec in recs.values() for row in rec["budgets"].values() for k in row["rankings"]))
        first = next(iter(recs.values()))
        during = (f"; default during the run: {first['default_utility']}, unit "
                  f"{first['default_unit']}" if len(roots) == 1 else "")
        lines += [f"**{op}** ({', '.join(f'{k}={v}' for k, v in first['params'].items()) or '-'}"
                  f"{during}): KL ratio (answer tokens, to "
                  "the full merge, over the base's); **bold**: below the random median", "",
                  "| family | budget | random, median [min, max] (plans) | " + " | ".join(names)
                  + " |", "|---|---:|---:|" + "---:|" * len(names)]
        wins = dict.fromkeys(names, 0)
        n = 0
        for fam, rec in recs.items():
            b = rec["base_kl"]
            for f, row in sorted(rec["budgets"].items(), key=lambda kv: float(kv[0])):
                if "random" not in row:
                    continue
                n += 1
                rnd = [r["kl"] / b for r in row["random"]]
                med = statistics.median(rnd)
                txt = []
                for k in names:
                    c = row["default"] if k == "default" else row["rankings"].get(k)
                    if c is None:
                        txt.append("-")
                        continue
                    v = c["kl"] / b
                    wins[k] += v < med
                    txt.append(f"**{_g(v)}**" if v < med else _g(v))
                lines.append(f"| {fam} | {f} | {_g(med)} [{_g(min(rnd))}, {_g(max(rnd))}] "
                             f"({len(rnd)}) | "
                             + " | ".join(txt) + " |")
        lines.append("| below the median | | | " + " | ".join(f"{wins[k]}/{n}" for k in names)
                     + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--family", choices=sorted(FAMILIES), default="toy")
    p.add_argument("--dir", default=str(Path.home() / ".cache/mergepipe/fidelity"))
    p.add_argument("--operators", default=",".join(o.name for o in OPERATORS))
    p.add_argument("--budgets", default=",".join(map(str, BUDGETS)))
    p.add_argument("--rankings", default=",".join(rankings()))
    p.add_argument("--random", type=int, default=8,
                   help="random plans per cell (0: the rankings only, the random plans pooled "
                        "from other runs at --render)")
    p.add_argument("--seed0", type=int, default=1000, help="first random plan's seed")
    p.add_argument("--planner", default="", help="comma-separated utility:unit planner plans")
    p.add_argument("--eval-per-task", type=int, default=64)
    p.add_argument("--render", action="store_true",
                   help="tables of DIR's results (DIR: comma-separated directories, pooled)")
    p.add_argument("--verdict", default="",
                   help="with --render: the done-when summary of these operators instead")
    p.add_argument("--weights", action="store_true",
                   help="record each plan's weight-space distance to the full merge; with "
                        "--render --verdict: how well it orders the plans of a cell by KL")
    p.add_argument("--auto", action="store_true",
                   help="with --verdict: add utility=auto's plans (\"auto\"), chosen by each "
                        "family's delta spread from DIR's catalogs")
    a = p.parse_args()
    if a.render:
        roots = [Path(d).absolute() for d in a.dir.split(",")]
        results = load(roots, list(FAMILIES))
        ops = a.verdict.split(",")
        if a.auto:
            spreads = family_spreads(roots, list(results))
            for op in ops:
                def choose(spread: float, pair: tuple[str, str] = REGISTRY[op].auto_utility
                           ) -> str:
                    return auto_ranking(pair, spread)[0]
                add_auto(results, op, choose, spreads)
        print(weights_summary(results, ops) if a.verdict and a.weights
              else summary(results, ops) if a.verdict else render(roots, list(FAMILIES)))
        return
    root = Path(a.dir).absolute()
    ops = [o for o in OPERATORS if o.name in a.operators.split(",")]
    ops.sort(key=lambda o: a.operators.split(",").index(o.name))
    path = root / f"ranking-{a.family}.json"
    out = json.loads(path.read_text()) if path.exists() else {}
    out.update({"family": a.family, "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                "machine": machine(), "eval_per_task": a.eval_per_task})
    Study(a.family, root, a.eval_per_task).run(
        ops, [float(x) for x in a.budgets.split(",")], a.rankings.split(","), a.random, out,
        tuple(x for x in a.planner.split(",") if x), a.seed0, a.weights)


if __name__ == "__main__":
    main()
