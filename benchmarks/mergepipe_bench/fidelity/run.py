"""The benchmark: ingest the family, merge under budgets (planner vs random plans), measure."""

from __future__ import annotations

import json
import platform
import shutil
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.ingest import ingest_model
from mergepipe.core.request import build_request
from mergepipe.jobs.merge import execute_plan
from mergepipe.planner.plan import Plan, make_plan
from mergepipe_bench.fidelity.evaluate import (
    additive_reference,
    exact_match,
    kl_summary,
    l2_deviation,
    load_state,
    log_probs,
    max_abs_diff,
)
from mergepipe_bench.fidelity.family import FamilySpec, build_family
from mergepipe_bench.fidelity.model import ModelSize, TrainSpec, load_model
from mergepipe_bench.fidelity.random_plan import (
    candidates,
    expert_normalized_plan,
    random_plan,
    retained_utility,
)
from mergepipe_bench.fidelity.tasks import Example, eval_set


@dataclass(frozen=True)
class OperatorSpec:
    """One merge operator of the benchmark with its global parameters."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FidelityConfig:
    """Everything one benchmark run does (seeds included)."""

    family: FamilySpec = field(default_factory=FamilySpec)
    block_bytes: int = 64 << 10
    budgets: tuple[float, ...] = (0.1, 0.2, 0.3, 0.5, 0.7, 1.0)
    operators: tuple[OperatorSpec, ...] = (
        OperatorSpec("task_arithmetic", {"lambda": 0.5}),
        OperatorSpec("ties", {"density": 0.5}),
    )
    random_plans: int = 8
    random_seed: int = 1000  # random plan r uses seed random_seed + r
    eval_per_task: int = 128
    eval_seed: int = 0
    out_dtype: str = "F32"  # merges written in float32: KL measures the plan, not rounding
    threads: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def quick_config() -> FidelityConfig:
    """A tiny family and a few plans: the whole pipeline in well under a minute."""
    return FidelityConfig(
        family=FamilySpec(size=ModelSize(hidden=64, intermediate=128, layers=2, heads=2),
                          pretrain=TrainSpec(steps=30, batch=16, lr=3e-3, warmup=5),
                          finetune=TrainSpec(steps=15, batch=16, lr=3e-3, warmup=3)),
        block_bytes=4 << 10, budgets=(0.2, 0.5, 1.0), random_plans=2, eval_per_task=16)


class Evaluator:
    """Log-probs of merged checkpoints on the fixed eval set, and comparisons with a reference."""

    def __init__(self, examples: list[Example]) -> None:
        self.examples = examples

    def measure(self, path: Path) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """(log-probs, targets, greedy exact match) of the checkpoint at path."""
        lp, targets = log_probs(load_model(path), self.examples)
        return lp, targets, exact_match(lp, self.examples, targets)

    def kl(self, ref: torch.Tensor, other: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        return kl_summary(ref, other, self.examples, targets)


def _execute(cat: Catalog, plan: Plan, out: Path, threads: int) -> dict[str, Any]:
    summary = execute_plan(cat, plan, out, threads=threads, overwrite=True)
    assert summary.expert_bytes_read <= plan.budget_bytes, "budget soundness violated"
    return summary.to_dict()


class OperatorRun:
    """All merges of one operator: the full merge, utility plans and random plans per budget."""

    def __init__(self, cfg: FidelityConfig, cat: Catalog, ev: Evaluator, work: Path,
                 base: str, experts: list[str], op: OperatorSpec) -> None:
        self.cfg, self.cat, self.ev, self.work = cfg, cat, ev, work
        self.base, self.experts, self.op = base, experts, op

    def request(self, budget: float, out_dtype: str | None = None) -> Any:
        return build_request(base=self.base, experts=[{"model": e} for e in self.experts],
                             operator=self.op.name, params=dict(self.op.params), budget=budget,
                             seed=0, output_dtype=out_dtype or self.cfg.out_dtype)

    def merge(self, plan: Plan, tag: str) -> tuple[Path, dict[str, Any]]:
        out = self.work / self.op.name / tag
        return out, _execute(self.cat, plan, out, self.cfg.threads)

    def run(self, base_path: Path, expert_paths: list[Path]) -> dict[str, Any]:
        print(f"  {self.op.name}: full merge", flush=True)
        full_plan = make_plan(self.cat, self.request(1.0))
        full_dir, full_sum = self.merge(full_plan, "full")
        full_lp, targets, full_acc = self.ev.measure(full_dir)
        full_state = load_state(full_dir)
        base_lp, _, _ = self.ev.measure(base_path)
        res: dict[str, Any] = {
            "operator": self.op.name, "params": self.op.params,
            "full": {"plan_hash": full_plan.plan_hash, "full_read_bytes": full_plan.full_read_bytes,
                     "expert_bytes_read": full_sum["expert_bytes_read"], "accuracy": full_acc,
                     "candidate_blocks": full_plan.candidate_blocks},
            "base": {"kl": self.ev.kl(full_lp, base_lp, targets),
                     "l2": l2_deviation(full_state, load_state(base_path))},
            "rounding_floor": self._rounding_floor(full_lp, targets),
            "reference": self._reference(full_plan, full_state, base_path, expert_paths),
            "budgets": [],
        }
        cands = candidates(self.cat, full_plan)
        res["full"]["total_utility"] = sum(c.utility for c in cands)
        for f in self.cfg.budgets:
            t0 = time.perf_counter()
            plan = make_plan(self.cat, self.request(f))
            row: dict[str, Any] = {"fraction": f, "budget_bytes": plan.budget_bytes,
                   "utility": self._measure(plan, f"u{f}", full_lp, targets, full_state)}
            row["normalized"] = self._measure(expert_normalized_plan(plan, cands), f"n{f}",
                                              full_lp, targets, full_state)
            row["random"] = [
                self._measure(random_plan(plan, cands, self.cfg.random_seed + r),
                              f"r{f}-{r}", full_lp, targets, full_state)
                for r in range(self.cfg.random_plans)]
            res["budgets"].append(row)
            u = row["utility"]
            rnd = statistics.median(r["kl"]["all"] for r in row["random"]) if row["random"] else 0
            print(f"    budget {f:.2f}: KL utility {u['kl']['all']:.4g}  random (median) "
                  f"{rnd:.4g}  base {res['base']['kl']['all']:.4g}  "
                  f"({time.perf_counter() - t0:.0f}s)", flush=True)
        shutil.rmtree(full_dir, ignore_errors=True)
        return res

    def _measure(self, plan: Plan, tag: str, full_lp: torch.Tensor, targets: torch.Tensor,
                 full_state: dict[str, torch.Tensor]) -> dict[str, Any]:
        out, summary = self.merge(plan, tag)
        lp, _, acc = self.ev.measure(out)
        l2 = l2_deviation(full_state, load_state(out))
        shutil.rmtree(out, ignore_errors=True)
        return {"plan_hash": plan.plan_hash, "planned_expert_bytes": plan.planned_expert_bytes,
                "expert_bytes_read": summary["expert_bytes_read"], "blocks": len(plan.blocks),
                "omission_bound": plan.omission_bound,
                "omission_bound_l2": plan.omission_bound_l2,
                "retained_utility": retained_utility(plan),
                "bytes_by_model": _bytes_by(plan, lambda b: b.model),
                "bytes_by_kind": _bytes_by(plan, lambda b: tensor_kind(b.tensor)),
                "kl": self.ev.kl(full_lp, lp, targets), "l2": l2, "accuracy": acc}

    def _reference(self, plan: Plan, full_state: dict[str, torch.Tensor], base_path: Path,
                   expert_paths: list[Path]) -> dict[str, Any] | None:
        """Engine full merge vs the same merge computed directly in torch (additive only)."""
        if not plan.request.spec.additive:
            return None
        ref = additive_reference(load_state(base_path), [load_state(p) for p in expert_paths],
                                 plan.request.coefficients())
        return {"max_abs_diff": max_abs_diff(full_state, ref),
                "l2": l2_deviation(ref, full_state)}

    def _rounding_floor(self, full_lp: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        """KL of the same full merge written in the base's dtype (bf16) instead of float32."""
        plan = make_plan(self.cat, self.request(1.0, out_dtype="BF16"))
        out, _ = self.merge(plan, "full-bf16")
        lp, _, _ = self.ev.measure(out)
        shutil.rmtree(out, ignore_errors=True)
        return self.ev.kl(full_lp, lp, targets)


def tensor_kind(name: str) -> str:
    """Coarse role of a Llama tensor: embed, attn, mlp, norm or lm_head."""
    for key, kind in (("embed_tokens", "embed"), ("lm_head", "lm_head"), ("self_attn", "attn"),
                      ("mlp", "mlp"), ("norm", "norm")):
        if key in name:
            return kind
    return "other"


def _bytes_by(plan: Plan, key: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for b in plan.blocks:
        out[key(b)] = out.get(key(b), 0) + b.nbytes
    return dict(sorted(out.items()))


ENGINE_DIRS = ("catalog", "storage", "planner", "executor", "core", "jobs", "migrations")


def engine_version() -> dict[str, Any]:
    """The git commit measured and the engine files that differed from it (uncommitted work)."""
    import subprocess
    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                                  timeout=30).stdout.rstrip()
        except (OSError, subprocess.SubprocessError):
            return ""
    dirty = git("status", "--porcelain", "--", *ENGINE_DIRS)
    return {"commit": git("rev-parse", "--short", "HEAD") or None,
            "uncommitted": [line[3:] for line in dirty.splitlines()]}


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    import os
    return {"platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "engine": engine_version()}


@contextmanager
def ingested_family(cfg: Any, root: Path, work_name: str, retrain: bool
                    ) -> Iterator[tuple[dict[str, Any], Evaluator, Path, Catalog, dict[str, Any]]]:
    """Build (or reuse) the family of `cfg` under root, ingest it into a new catalog in
    root/`work_name`: (family, evaluator, work folder, catalog, results started)."""
    torch.set_num_threads(cfg.threads)
    root.mkdir(parents=True, exist_ok=True)
    family = build_family(cfg.family, root, rebuild=retrain)
    work = root / work_name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    ev = Evaluator(eval_set(list(cfg.family.tasks), cfg.eval_per_task, cfg.eval_seed))
    results: dict[str, Any] = {
        "config": cfg.to_dict(), "family": family, "machine": machine(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "operators": [],
    }
    with Catalog(work / "catalog.duckdb") as cat:
        ingest_model(cat, family["base"]["path"], "base", block_bytes=cfg.block_bytes)
        for e in family["experts"]:
            ingest_model(cat, family["experts"][e]["path"], e, base="base",
                         block_bytes=cfg.block_bytes)
        yield family, ev, work, cat, results


def run_fidelity(cfg: FidelityConfig, root: Path, *, retrain: bool = False) -> dict[str, Any]:
    """Build (or reuse) the family under root, run every merge, return the results dict."""
    t0 = time.perf_counter()
    with ingested_family(cfg, root, "run", retrain) as (family, ev, work, cat, results):
        experts = list(family["experts"])
        for op in cfg.operators:
            run = OperatorRun(cfg, cat, ev, work, "base", experts, op)
            results["operators"].append(run.run(
                Path(family["base"]["path"]),
                [Path(family["experts"][e]["path"]) for e in experts]))
    results["seconds"] = time.perf_counter() - t0
    (root / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return results
