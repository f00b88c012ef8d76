"""The done-when of the ranking study (docs/FIDELITY.md, "Default rankings"), as pure functions
of the study's JSON results, so the comparison itself is tested:

* a cell (family, operator, budget) passes when the default's KL is strictly below the median
  KL of the random plans of equal bytes (KLs are compared as ratios of the base's KL, which
  does not change the order within a cell);
* on average: the geometric mean over the families and the budgets 0.3 and 0.5 of the
  default's KL ratio is at or below that of every other ranking measured in all those cells.

Random plans of several runs of one cell are pooled when the result files are given together:
`load` adds a later run's random plans of seeds the earlier runs lack (a ranking's plan is the
same in every run; a random plan of one seed nearly so, its byte cap being the run's largest
ranking plan) and the rankings the earlier runs lack.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MID_BUDGETS = ("0.3", "0.5")


@dataclass(frozen=True)
class Cell:
    family: str
    budget: str
    default: float  # KL ratio of the default ranking's plan
    random: tuple[float, ...]  # KL ratios of the random plans

    @property
    def median(self) -> float:
        return float(statistics.median(self.random))

    @property
    def passed(self) -> bool:
        return self.default < self.median


@dataclass(frozen=True)
class Verdict:
    operator: str
    default: str
    cells: tuple[Cell, ...]
    mid_mean: dict[str, float]  # ranking -> geometric mean KL ratio at MID_BUDGETS

    @property
    def failed(self) -> tuple[Cell, ...]:
        return tuple(c for c in self.cells if not c.passed)

    @property
    def best_other(self) -> tuple[str, float] | None:
        others = [(k, v) for k, v in self.mid_mean.items() if k != self.default]
        return min(others, key=lambda kv: kv[1]) if others else None

    @property
    def mid_ok(self) -> bool:
        best = self.best_other
        return best is None or self.mid_mean[self.default] <= best[1]

    @property
    def passed(self) -> bool:
        return not self.failed and self.mid_ok


def _plan(row: dict[str, Any], name: str) -> dict[str, Any] | None:
    """A ranking's measured plan in a budget row: `default` is the default during the run."""
    return row["default"] if name == "default" else row["rankings"].get(name)


def verdict(results: dict[str, dict[str, Any]], operator: str, default: str) -> Verdict:
    """results: family -> the study's JSON (ranking-<family>.json); default: the ranking
    (a key of the rows' `rankings`, or `default`) whose plans are judged."""
    cells: list[Cell] = []
    logs: dict[str, list[float]] = {}
    n_mid = 0
    for fam, res in results.items():
        rec = res.get("operators", {}).get(operator)
        if rec is None:
            continue
        base = rec["base_kl"]
        for f, row in sorted(rec["budgets"].items(), key=lambda kv: float(kv[0])):
            if not row.get("random"):
                continue
            plan = _plan(row, default)
            if plan is None:
                raise KeyError(f"{fam} {operator} {f}: ranking {default!r} was not measured")
            cells.append(Cell(fam, f, plan["kl"] / base,
                              tuple(r["kl"] / base for r in row["random"])))
            if f in MID_BUDGETS:
                n_mid += 1
                for k in ["default", *row["rankings"]]:
                    p = _plan(row, k)
                    if p is not None:
                        logs.setdefault(k, []).append(math.log(max(p["kl"] / base, 1e-300)))
    # a ranking enters the average only when measured in every mid-budget cell
    mean = {k: math.exp(math.fsum(v) / len(v)) for k, v in logs.items() if len(v) == n_mid}
    if default != "default":  # the run's default is one of the rankings or another plan
        mean.pop("default", None)
    return Verdict(operator, default, tuple(cells), mean)


def _seeds(row: dict[str, Any]) -> list[int]:
    """The seeds of a row's random plans (runs before `random_seeds` was kept: 1000, 1001...)."""
    if "random_seeds_list" in row:
        return list(row["random_seeds_list"])
    first = row.get("random_seeds", [1000])[0]
    return list(range(first, first + len(row.get("random", []))))


def load(dirs: list[Path], families: list[str]) -> dict[str, dict[str, Any]]:
    """ranking-<family>.json of each directory, merged: rows of the later directories add
    their random plans (other seeds) and the rankings the earlier ones lack."""
    out: dict[str, dict[str, Any]] = {}
    for d in dirs:
        for fam in families:
            p = d / f"ranking-{fam}.json"
            if not p.exists():
                continue
            res = json.loads(p.read_text())
            if fam not in out:
                out[fam] = res
                continue
            ops = out[fam].setdefault("operators", {})
            for op, rec in res.get("operators", {}).items():
                if op not in ops:
                    ops[op] = rec
                    continue
                for f, row in rec["budgets"].items():
                    have = ops[op]["budgets"].setdefault(f, row)
                    if have is row:
                        continue
                    seen = _seeds(have)
                    extra = [(s, r) for s, r in zip(_seeds(row), row.get("random", []),
                                                    strict=True) if s not in seen]
                    have["random"] = have.get("random", []) + [r for _, r in extra]
                    have["random_seeds_list"] = seen + [s for s, _ in extra]
                    for k, v in row["rankings"].items():
                        have["rankings"].setdefault(k, v)
    return out


def add_auto(results: dict[str, dict[str, Any]], operator: str,
             choose: Callable[[float], str], spreads: dict[str, float | None]) -> None:
    """Give every row of `operator` the plan utility=auto makes there, as the ranking "auto":
    the row's plan of the ranking `choose` (the planner's choice) gives for the family's delta
    spread; a family without a spread, or a row without that ranking, gets none (the verdict
    then refuses "auto" as not measured everywhere)."""
    for fam, res in results.items():
        spread = spreads.get(fam)
        rec = res.get("operators", {}).get(operator)
        if rec is None or spread is None:
            continue
        chosen = choose(spread)
        for row in rec["budgets"].values():
            if chosen in row["rankings"]:
                row["rankings"]["auto"] = row["rankings"][chosen]


def names(results: dict[str, dict[str, Any]], operator: str) -> list[str]:
    """Every plan measured for the operator in some cell: `default` and the rankings."""
    out = ["default"]
    for res in results.values():
        for row in res.get("operators", {}).get(operator, {}).get("budgets", {}).values():
            out += [k for k in row["rankings"] if k not in out]
    return out


def summary(results: dict[str, dict[str, Any]], operators: list[str]) -> str:
    """Markdown: per operator and ranking measured in every cell, the cells below the random
    median (failed cells named), the geometric mean at 0.3 and 0.5 and whether it is the best."""
    lines = ["| operator | ranking | cells below the random median | failed cells (ranking / "
             "random median, KL ratio) | mean at 0.3, 0.5 | best other at 0.3, 0.5 |",
             "|---|---|---:|---|---:|---|"]
    for op in operators:
        for k in names(results, op)[1:]:  # `default`: whatever the run's default was
            try:
                v = verdict(results, op, k)
            except KeyError:  # not measured in every cell
                continue
            if not v.cells:
                continue
            best = v.best_other
            failed = ", ".join(f"{c.family} {c.budget} ({c.default:.3g} / {c.median:.3g})"
                               for c in v.failed) or "-"
            mean = v.mid_mean.get(k)
            lines.append(f"| {op} | {k} | {len(v.cells) - len(v.failed)}/{len(v.cells)} | "
                         f"{failed} | {'-' if mean is None else f'{mean:.3g}'} | "
                         + (f"{best[0]} {best[1]:.3g}" if best else "-") + " |")
    return "\n".join(lines)


def spearman(a: dict[Any, float], b: dict[Any, float]) -> float:
    """Spearman rank correlation of two scores over their common keys (ties by key order)."""
    keys = sorted(set(a) & set(b))
    if len(keys) < 2:
        return 0.0
    ra = {k: i for i, k in enumerate(sorted(keys, key=lambda k: (a[k], k)))}
    rb = {k: i for i, k in enumerate(sorted(keys, key=lambda k: (b[k], k)))}
    n = len(keys)
    return 1 - 6 * sum((ra[k] - rb[k]) ** 2 for k in keys) / (n * (n * n - 1))


WEIGHTS = ("rel_l2", "tensor_rel")  # evaluate.weight_errors, recorded by the study's --weights


@dataclass(frozen=True)
class WeightAgreement:
    """How well a weight-space distance to the full merge orders one family's plans by KL."""

    family: str
    operator: str
    spearman: dict[str, tuple[float, ...]]  # metric -> per cell, over its rankings and randoms
    closer_farther: int  # ranking plans below the random median in tensor_rel, above it in KL
    rankings: int        # ranking plans measured (cells x rankings)


def weight_agreement(results: dict[str, dict[str, Any]], operator: str
                     ) -> list[WeightAgreement]:
    """Per family, over the cells whose plans all carry the weight-space distances."""
    out = []
    for fam, res in results.items():
        rec = res.get("operators", {}).get(operator)
        if rec is None:
            continue
        rho: dict[str, list[float]] = {m: [] for m in WEIGHTS}
        odd = total = 0
        for row in rec["budgets"].values():
            randoms = row.get("random", [])
            plans = {**row["rankings"], **{f"random {i}": r for i, r in enumerate(randoms)}}
            if not randoms or not all(m in p for p in plans.values() for m in WEIGHTS):
                continue
            kl = {k: p["kl"] for k, p in plans.items()}
            for m in WEIGHTS:
                rho[m].append(spearman(kl, {k: p[m] for k, p in plans.items()}))
            kl_med = statistics.median(r["kl"] for r in randoms)
            w_med = statistics.median(r["tensor_rel"] for r in randoms)
            for p in row["rankings"].values():
                total += 1
                odd += p["tensor_rel"] < w_med and p["kl"] > kl_med
        if total:
            out.append(WeightAgreement(fam, operator, {m: tuple(v) for m, v in rho.items()},
                                       odd, total))
    return out


def weights_summary(results: dict[str, dict[str, Any]], operators: list[str]) -> str:
    """Markdown: per family and operator, the Spearman correlation within a cell between KL and
    each weight-space distance (mean over the cells [min, max]), and the ranking plans closer
    to the full merge than the random median in tensor_rel but farther from it in KL."""
    lines = ["| family | operator | cells | Spearman(KL, rel_l2) | Spearman(KL, tensor_rel) | "
             "closer in weights, farther in KL |", "|---|---|---:|---:|---:|---:|"]
    for op in operators:
        for w in weight_agreement(results, op):
            cols = [f"{statistics.mean(v):+.2f} [{min(v):+.2f}, {max(v):+.2f}]"
                    for v in (w.spearman[m] for m in WEIGHTS)]
            lines.append(f"| {w.family} | {op} | {len(w.spearman[WEIGHTS[0]])} | "
                         f"{' | '.join(cols)} | {w.closer_farther}/{w.rankings} |")
    return "\n".join(lines)

