"""The planning-unit study: per operator and budget, the plan of each unit vs random plans of
equal bytes (random (expert, block) subsets and random whole-tensor groups), as KL ratio to the
base, exact match and L2 deviation."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from mergepipe.catalog.db import Catalog
from mergepipe.core.request import build_request
from mergepipe.planner.plan import Plan, make_plan
from mergepipe_bench.fidelity.family import FamilySpec
from mergepipe_bench.fidelity.model import ModelSize, TrainSpec
from mergepipe_bench.fidelity.random_plan import candidates, random_group_plan, random_plan
from mergepipe_bench.fidelity.run import Evaluator, OperatorSpec, _execute, ingested_family

UNIT_OPERATORS = (OperatorSpec("linear"), OperatorSpec("ties", {"density": 0.5}),
                  OperatorSpec("dare_ties", {"density": 0.5}))


@dataclass(frozen=True)
class UnitsConfig:
    """One unit study (seeds included)."""

    family: FamilySpec = field(default_factory=lambda: toy_family())
    block_bytes: int = 64 << 10
    budgets: tuple[float, ...] = (0.3, 0.5)
    operators: tuple[OperatorSpec, ...] = UNIT_OPERATORS
    units: tuple[str, ...] = ("expert_block", "group", "group_block")
    random_plans: int = 4   # random (expert, block) plans, seeds random_seed + r
    random_group_plans: int = 2  # random whole-tensor plans, seeds random_seed + r
    random_seed: int = 1000
    eval_per_task: int = 64
    eval_seed: int = 0
    out_dtype: str = "F32"
    threads: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def toy_family() -> FamilySpec:
    """The first family: FIDELITY.md's base and tasks, experts fine-tuned for 100 steps of 16
    lines (half the tables' 200 x 32: the study must fit a few minutes on shared cores); deltas
    are a large fraction of the weights."""
    return FamilySpec(finetune=TrainSpec(steps=100, batch=16, lr=5e-4, warmup=10))


def realistic_family() -> FamilySpec:
    """The second family: the same base, 12 experts (3 per task, other samples and seeds)
    fine-tuned briefly at a low learning rate, so each moves the weights by about 1e-3 of their
    norm as real fine-tunes of a pretrained LLM do; float32 keeps such deltas."""
    return FamilySpec(finetune=TrainSpec(steps=15, batch=16, lr=1e-5, warmup=3),
                      experts_per_task=3, dtype="f32")


def quick_units_config() -> UnitsConfig:
    """Tiny family (4 float32 experts of 2 tasks), budgets 0.5 and 1, one random plan per kind: the
    pipeline in well under a minute."""
    return UnitsConfig(
        family=FamilySpec(size=ModelSize(hidden=64, intermediate=128, layers=2, heads=2),
                          pretrain=TrainSpec(steps=20, batch=8, lr=3e-3, warmup=5),
                          finetune=TrainSpec(steps=6, batch=8, lr=3e-3, warmup=2),
                          tasks=("shift", "modadd"), experts_per_task=2, dtype="f32"),
        block_bytes=4 << 10, budgets=(0.5, 1.0), random_plans=1, random_group_plans=1,
        eval_per_task=8,
        operators=(OperatorSpec("dare_ties", {"density": 0.5}),))


class UnitRun:
    """All merges of one operator: the full merge, each unit's plan and the random plans."""

    def __init__(self, cfg: UnitsConfig, cat: Catalog, ev: Evaluator, work: Path,
                 experts: list[str], op: OperatorSpec) -> None:
        self.cfg, self.cat, self.ev, self.work, self.experts, self.op = (
            cfg, cat, ev, work, experts, op)

    def plan(self, budget: float, unit: str | None = None) -> Plan:
        params = dict(self.op.params, **({"unit": unit} if unit else {}))
        return make_plan(self.cat, build_request(
            base="base", experts=[{"model": e} for e in self.experts], operator=self.op.name,
            params=params, budget=budget, seed=0, output_dtype=self.cfg.out_dtype))

    def run(self, base_path: Path) -> dict[str, Any]:
        full = self.plan(1.0)
        full_dir = self.work / self.op.name / "full"
        _execute(self.cat, full, full_dir, self.cfg.threads)
        self.full_lp, self.targets, full_acc = self.ev.measure(full_dir)
        from mergepipe_bench.fidelity.evaluate import load_state
        self.full_state = load_state(full_dir)
        self.base = self._score_dir(base_path, keep=True)
        res: dict[str, Any] = {"operator": self.op.name, "params": self.op.params,
                               "default_unit": full.unit, "full_accuracy": full_acc,
                               "full_read_bytes": full.full_read_bytes, "base": self.base,
                               "budgets": []}
        cands = candidates(self.cat, full)
        for f in self.cfg.budgets:
            t0 = time.perf_counter()
            plans = {u: self.plan(f, u) for u in self.cfg.units}
            target = min(p.planned_expert_bytes for p in plans.values())
            row: dict[str, Any] = {"fraction": f, "random_bytes": target, "units": {}}
            for u, p in plans.items():
                row["units"][u] = self._measure(p, f"{u}-{f}")
            cap = replace(full, planned_expert_bytes=target)
            seed = self.cfg.random_seed
            row["random_block"] = [self._measure(random_plan(cap, cands, s), f"rb{f}-{s}")
                                   for s in range(seed, seed + self.cfg.random_plans)]
            row["random_group"] = [self._measure(random_group_plan(cap, cands, s), f"rg{f}-{s}")
                                   for s in range(seed, seed + self.cfg.random_group_plans)]
            res["budgets"].append(row)
            print(f"    {self.op.name} {f:.2f}: " + "  ".join(
                f"{u} {m['kl_ratio']:.3g}" for u, m in row["units"].items())
                + f"  random {[round(m['kl_ratio'], 3) for m in row['random_block']]} "
                f"({time.perf_counter() - t0:.0f}s)", flush=True)
        shutil.rmtree(full_dir, ignore_errors=True)
        return res

    def _measure(self, plan: Plan, tag: str) -> dict[str, Any]:
        out = self.work / self.op.name / tag
        summary = _execute(self.cat, plan, out, self.cfg.threads)
        m = self._score_dir(out)
        shutil.rmtree(out, ignore_errors=True)
        return {**m, "planned_expert_bytes": plan.planned_expert_bytes,
                "expert_bytes_read": summary["expert_bytes_read"], "plan_hash": plan.plan_hash}

    def _score_dir(self, path: Path, keep: bool = False) -> dict[str, Any]:
        from mergepipe_bench.fidelity.evaluate import l2_deviation, load_state
        lp, _, acc = self.ev.measure(path)
        kl = self.ev.kl(self.full_lp, lp, self.targets)
        l2 = l2_deviation(self.full_state, load_state(path))
        out = {"kl": {"answer": kl["answer"], "all": kl["all"]}, "exact_match": acc["mean"],
               "l2": l2}
        if not keep:
            base = self.base
            out["kl_ratio"] = kl["answer"] / base["kl"]["answer"]
            out["kl_ratio_all"] = kl["all"] / base["kl"]["all"]
            out["l2_ratio"] = l2["abs"] / base["l2"]["abs"]
        return out


def run_units(cfg: UnitsConfig, root: Path, *, retrain: bool = False,
              name: str = "units") -> dict[str, Any]:
    """Build (or reuse) the family under root, run every merge, write root/<name>.json."""
    t0 = time.perf_counter()
    with ingested_family(cfg, root, f"{name}-run", retrain) as (family, ev, work, cat, res):
        for op in cfg.operators:
            print(f"  {op.name}", flush=True)
            res["operators"].append(UnitRun(cfg, cat, ev, work, list(family["experts"]), op).run(
                Path(family["base"]["path"])))
    shutil.rmtree(work, ignore_errors=True)
    res["seconds"] = time.perf_counter() - t0
    (root / f"{name}.json").write_text(json.dumps(res, indent=2) + "\n")
    return res
