"""Markdown tables of the planning-unit study (units.json)."""

from __future__ import annotations

import statistics
from typing import Any

from mergepipe_bench.fidelity.report import _fmt

RANDOM = (("random_block", "random (expert, block) subsets"),
          ("random_group", "random whole-tensor groups"))


def _spread(ms: list[dict[str, Any]], key: str, scale: float = 1.0) -> str:
    vals = [m[key] * scale for m in ms]
    if not vals:
        return "-"
    return f"{_fmt(statistics.median(vals))} [{_fmt(min(vals))}, {_fmt(max(vals))}]"


def operator_table(op: dict[str, Any]) -> list[str]:
    """Per budget: each unit's plan and the random plans (median [min, max])."""
    lines = ["| budget | plan | expert bytes | KL ratio, answer | KL ratio, all | exact match "
             "| rel. L2 | L2 ratio |", "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for row in op["budgets"]:
        f = f"{row['fraction']:.1f}"
        for unit, m in row["units"].items():
            name = f"**{unit}** (default)" if unit == op["default_unit"] else unit
            lines.append(f"| {f} | {name} | {m['expert_bytes_read']:,} | {_fmt(m['kl_ratio'])} "
                         f"| {_fmt(m['kl_ratio_all'])} | {m['exact_match']:.1%} | "
                         f"{_fmt(m['l2']['rel'])} | {_fmt(m['l2_ratio'])} |")
        for key, label in RANDOM:
            ms = row[key]
            lines.append(f"| {f} | {label} (median [min, max]) | "
                         f"<= {row['random_bytes']:,} | {_spread(ms, 'kl_ratio')} | "
                         f"{_spread(ms, 'kl_ratio_all')} | "
                         f"{_spread(ms, 'exact_match', 100)}% | "
                         f"{_spread([m['l2'] for m in ms], 'rel')} | {_spread(ms, 'l2_ratio')} |")
    return lines


def summary_table(results: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Per family, operator and budget: KL ratio of each unit vs the random medians."""
    lines = ["| family | operator | budget | expert_block | group | group_block | random blocks, "
             "median | random groups, median | default beats both medians |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for fam, res in results:
        for op in res["operators"]:
            for row in op["budgets"]:
                u = row["units"]
                med = {k: statistics.median(m["kl_ratio"] for m in row[k]) if row[k] else None
                       for k, _ in RANDOM}
                d = u[op["default_unit"]]["kl_ratio"]
                known = [v for v in med.values() if v is not None]
                win = ("yes" if d < min(known) else "no") if known else "-"
                cells = [_fmt(u[k]["kl_ratio"]) if k in u else "-"
                         for k in ("expert_block", "group", "group_block")]
                lines.append(f"| {fam} | {op['operator']} | {row['fraction']:.1f} | "
                             + " | ".join(cells)
                             + f" | {_fmt(med['random_block'])} | {_fmt(med['random_group'])} "
                             f"| {win} |")
    return lines


def render(results: list[tuple[str, dict[str, Any]]], command: str) -> str:
    """The study's tables (one summary, then one table per family and operator)."""
    out = ["Command: `" + command + "`", "", "KL ratio = KL(full merge || budgeted merge) / "
           "KL(full merge || base), teacher-forced, per token (answer tokens unless *all*); "
           "L2 ratio the same for ||M_full - M||_2; rel. L2 = ||M_full - M||_2 / ||M_full||_2; "
           "exact match (teacher-forced, mean over tasks) of the budgeted merge.", ""]
    out += summary_table(results) + [""]
    for fam, res in results:
        for op in res["operators"]:
            params = ", ".join(f"{k}={v}" for k, v in op["params"].items()) or "defaults"
            out += [f"**{fam}, {op['operator']} ({params})**: base KL "
                    f"{_fmt(op['base']['kl']['answer'])} (answer), rel. L2 "
                    f"{_fmt(op['base']['l2']['rel'])}; full merge exact match "
                    f"{op['full_accuracy']['mean']:.1%}", ""] + operator_table(op) + [""]
    return "\n".join(out)
