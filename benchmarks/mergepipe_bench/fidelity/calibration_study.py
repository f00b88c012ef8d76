"""The calibration study: on a trained fidelity family, KL to the full merge of plans ranked
with utility=activation (the base calibrated on task text) against the uncalibrated rankings
(l2, per_tensor) at equal budgets; and the catalog's size against the checkpoints'.
docs/FIDELITY.md, "Calibration-aware planning"."""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.ingest import ingest_model
from mergepipe.core.request import build_request
from mergepipe.evaluation.calibration import calibrate
from mergepipe.planner.plan import make_plan
from mergepipe_bench.fidelity.byte_tokenizer import save_byte_tokenizer
from mergepipe_bench.fidelity.family import FamilySpec, build_family
from mergepipe_bench.fidelity.ranking_verdict import spearman
from mergepipe_bench.fidelity.run import Evaluator, OperatorSpec, _execute, machine
from mergepipe_bench.fidelity.tasks import eval_set, task_examples

UTILITIES = ("l2", "per_tensor", "stratified", "activation", "fisher")
CALIBRATED = ("activation", "fisher")
EXTRA = ("activation_exact", "oracle")  # first-fit plans of the study's own orders
STUDY_OPERATORS = (OperatorSpec("linear"), OperatorSpec("ties", {"density": 0.5}))


@dataclass(frozen=True)
class CalibrationConfig:
    family: FamilySpec
    block_bytes: int = 64 << 10
    budgets: tuple[float, ...] = (0.1, 0.3, 0.5)
    operators: tuple[OperatorSpec, ...] = STUDY_OPERATORS
    calibration_lines: int = 40   # task lines per task in the calibration text
    calibration_seed: int = 4242  # other lines than the eval set's (which is excluded)
    tokens: int = 4096
    eval_per_task: int = 64
    eval_seed: int = 0
    out_dtype: str = "F32"
    threads: int = 1
    utilities: tuple[str, ...] = field(default=UTILITIES)
    # linear: the leave-one-out KL ranking (calibration_oracle): one evaluation per candidate
    # block (379 on the toy family; the realistic one's 2,100 did not fit the shared cores)
    oracle: bool = True
    oracle_stride: int = 1  # the oracle scores on every k-th eval line (its cost: one eval per block)


def calibration_text(cfg: CalibrationConfig) -> str:
    """Task lines of every task (none of the eval set's), shuffled: what the merge is for."""
    held = {e.text for e in eval_set(list(cfg.family.tasks), cfg.eval_per_task, cfg.eval_seed)}
    lines = [e.text for t in cfg.family.tasks
             for e in task_examples(t, cfg.calibration_lines, cfg.calibration_seed, exclude=held)]
    random.Random(cfg.calibration_seed).shuffle(lines)
    return "\n".join(lines) + "\n"


def catalog_bytes(cat: Catalog, path: Path) -> dict[str, int]:
    """The catalog file's size after a checkpoint, and the column-norm statistics' raw size."""
    cat.query(SQL("CHECKPOINT"))
    n = cat.query(SQL("SELECT count(*), COALESCE(sum(len(col_sq)), 0) FROM block_stats "
                      "WHERE col_sq IS NOT NULL"))[0]
    return {"file": path.stat().st_size, "col_sq_blocks": int(n[0]), "col_sq_bytes": 8 * int(n[1])}


def run_calibration_study(cfg: CalibrationConfig, root: Path, name: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    torch.set_num_threads(cfg.threads)
    family = build_family(cfg.family, root)
    work = root / f"{name}-run"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    base_dir = work / "base"  # the base with tokenizer files (the cached family is left as is)
    shutil.copytree(family["base"]["path"], base_dir)
    save_byte_tokenizer(base_dir)
    experts = list(family["experts"])
    ev = Evaluator(eval_set(list(cfg.family.tasks), cfg.eval_per_task, cfg.eval_seed))
    text = calibration_text(cfg)
    res: dict[str, Any] = {"config": asdict(cfg), "family_key": family["key"],
                           "machine": machine(),
                           "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                           "operators": []}
    checkpoint_bytes = sum(p.stat().st_size for d in [base_dir, *(
        Path(family["experts"][e]["path"]) for e in experts)] for p in d.glob("*.safetensors"))
    db = work / "catalog.duckdb"
    with Catalog(db) as cat:
        ingest_model(cat, base_dir, "base", block_bytes=cfg.block_bytes)
        for e in experts:
            ingest_model(cat, family["experts"][e]["path"], e, base="base",
                         block_bytes=cfg.block_bytes)
        t1 = time.perf_counter()
        cal = calibrate(cat, "base", text, cfg.tokens)
        res["calibration"] = {**cal.to_dict(), "seconds": time.perf_counter() - t1,
                              "text_chars": len(text)}
        res["catalog"] = {**catalog_bytes(cat, db), "checkpoint_bytes": checkpoint_bytes}
        from mergepipe_bench.fidelity.calibration_oracle import grouping_error
        res["grouping"] = grouping_error(cat, cal.calibration_id, base_dir, {
            e: Path(family["experts"][e]["path"]) for e in experts})
        print(f"    column groups vs exact channel RMS: {res['grouping']}", flush=True)
        for op in cfg.operators:
            res["operators"].append(_operator(
                cfg, cat, ev, work, experts, op, base_dir,
                {e: family["experts"][e]["path"] for e in experts}, cal.calibration_id))
    shutil.rmtree(work, ignore_errors=True)
    res["seconds"] = time.perf_counter() - t0
    (root / f"{name}.json").write_text(json.dumps(res, indent=2) + "\n")
    return res


def _operator(cfg: CalibrationConfig, cat: Catalog, ev: Evaluator, work: Path,
              experts: list[str], op: OperatorSpec, base_dir: Path,
              family_paths: dict[str, str], calibration_id: str) -> dict[str, Any]:
    from mergepipe_bench.fidelity.evaluate import l2_deviation, load_state

    def plan(budget: float, utility: str) -> Any:
        return make_plan(cat, build_request(
            base="base", experts=[{"model": e} for e in experts], operator=op.name,
            params={**op.params, "utility": utility}, budget=budget, seed=0,
            output_dtype=cfg.out_dtype))

    full_dir = work / op.name / "full"
    full_plan = plan(1.0, "l2")
    _execute(cat, full_plan, full_dir, cfg.threads)
    full_lp, targets, _ = ev.measure(full_dir)
    full_state = load_state(full_dir)
    base_lp, _, _ = ev.measure(base_dir)
    base_kl = ev.kl(full_lp, base_lp, targets)["answer"]
    out: dict[str, Any] = {"operator": op.name, "params": op.params, "base_kl": base_kl,
                           "budgets": []}
    from mergepipe_bench.fidelity.calibration_oracle import exact_activation_order
    from mergepipe_bench.fidelity.random_plan import _first_fit, candidates
    op_cands = candidates(cat, full_plan)
    exact = exact_activation_order(cat, calibration_id, full_plan, op_cands, base_dir,
                                   {e: Path(family_paths[e]) for e in experts})
    oracle = None
    if cfg.oracle and op.name == "linear":
        oracle = (op_cands, _oracle(cfg, cat, ev, op_cands, full_plan, full_dir, base_dir,
                                    {e: Path(family_paths[e]) for e in experts}, plan, out))

    def measure(p: Any, tag: str) -> dict[str, Any]:
        d = work / op.name / tag
        _execute(cat, p, d, cfg.threads)
        lp, _, acc = ev.measure(d)
        kl = ev.kl(full_lp, lp, targets)
        r = {"kl": kl["answer"], "kl_all": kl["all"], "kl_ratio": kl["answer"] / base_kl,
             "l2": l2_deviation(full_state, load_state(d))["abs"],
             "exact_match": acc["mean"], "planned_expert_bytes": p.planned_expert_bytes,
             "plan_hash": p.plan_hash}
        shutil.rmtree(d, ignore_errors=True)
        return r

    for f in cfg.budgets:
        row: dict[str, Any] = {"fraction": f}
        biggest = None
        plans = {}
        for u in cfg.utilities:
            p = plans[u] = plan(f, u)
            if biggest is None or p.planned_expert_bytes > biggest.planned_expert_bytes:
                biggest = p
            row[u] = measure(p, f"{u}-{f}")
        assert biggest is not None
        row["activation_exact"] = measure(_first_fit(biggest, op_cands, exact, {
            "order": "activation, exact channel RMS"}), f"exact-{f}")
        if oracle is not None:  # the cell's largest bytes
            from mergepipe_bench.fidelity.calibration_oracle import oracle_plan
            o = oracle_plan(biggest, *oracle)
            row["oracle"] = measure(o, f"oracle-{f}")
            kept = {(b.model, b.tensor, b.block_index): b.nbytes for b in o.blocks}
            for u, p in plans.items():  # bytes of the oracle's blocks this plan reads too
                row[u]["oracle_overlap"] = sum(kept.get((b.model, b.tensor, b.block_index), 0)
                                               for b in p.blocks) / max(1, sum(kept.values()))
        out["budgets"].append(row)
        print(f"    {op.name} {f:.2f}: " + "  ".join(
            f"{u} {row[u]['kl_ratio']:.3g}" for u in (*cfg.utilities, *EXTRA) if u in row),
            flush=True)
    shutil.rmtree(full_dir, ignore_errors=True)
    return out


def _oracle(cfg: CalibrationConfig, cat: Catalog, ev: Evaluator, cands: list[Any],
            full_plan: Any, full_dir: Path, base_dir: Path, expert_dirs: dict[str, Path],
            plan: Any, out: dict[str, Any]) -> list[float]:
    """The leave-one-out KL of every candidate (out["oracle"]: them, their cost, and each
    ranking's rank correlation with the oracle's order)."""
    from mergepipe_bench.fidelity.calibration_oracle import LeaveOneOut, oracle_scores

    lines = ev.examples[::cfg.oracle_stride]
    loo = LeaveOneOut(cat, full_plan, full_dir, base_dir, expert_dirs, lines)
    scores, secs = oracle_scores(loo, cands)
    del loo
    out["oracle"] = {"candidates": len(cands), "seconds": secs, "eval_lines": len(lines),
                     "scores": [[c.model, c.tensor, c.block_index, c.nbytes, c.utility, k]
                                for c, k in zip(cands, scores, strict=True)]}
    print(f"    linear: leave-one-out KL of {len(cands)} blocks, {secs:.0f} s", flush=True)
    loo_order = {(c.model, c.tensor, c.block_index): -k / c.nbytes
                 for c, k in zip(cands, scores, strict=True)}
    out["oracle"]["spearman"] = {u: spearman(loo_order, {
        (b.model, b.tensor, b.block_index): b.rank for b in plan(1.0, u).blocks})
        for u in cfg.utilities}
    print(f"    rank correlation with the leave-one-out KL per byte: "
          f"{out['oracle']['spearman']}", flush=True)
    return scores


def render(results: list[tuple[str, dict[str, Any]]], command: str) -> str:
    """Markdown tables: per family and operator, answer-token KL ratio (to the base's KL) of
    each ranking per budget, and the calibrated plan's gain over the best uncalibrated one."""
    lines = [f"Command: `{command}`", ""]
    for fam, res in results:
        c = res["catalog"]
        lines += [f"### {fam} family ({res['date']}, {res['seconds']:.0f} s)", "",
                  f"Calibration: {res['calibration']['tokens']} tokens of task text, "
                  f"{res['calibration']['seconds']:.1f} s. Catalog: {c['file']:,} B file for "
                  f"{c['checkpoint_bytes']:,} B of checkpoints "
                  f"({100 * c['file'] / c['checkpoint_bytes']:.2f}%); the column-norm "
                  f"statistics {c['col_sq_bytes']:,} B over {c['col_sq_blocks']} blocks "
                  f"({100 * c['col_sq_bytes'] / c['checkpoint_bytes']:.3f}%).", ""]
        for op in res["operators"]:
            us = [u for u in (*UTILITIES, *EXTRA) if u in op["budgets"][0]]
            head = "| budget | " + " | ".join(us) + " | best calibrated vs best uncalibrated |"
            if "oracle" in us:
                head += " oracle vs best uncalibrated |"
            lines += [f"{op['operator']} (KL(full merge || plan) on answer tokens, as a ratio "
                      f"to the base's {op['base_kl']:.3g}):", "", head,
                      "|---:|" + "---:|" * (len(us) + 1 + ("oracle" in us))]
            for row in op["budgets"]:
                best = min(row[u]["kl"] for u in us if u not in (*CALIBRATED, *EXTRA))
                cells = [f"{row[u]['kl_ratio']:.3g}" for u in us]
                cal = min(row[u]["kl"] for u in us if u in CALIBRATED)
                cells.append(f"{100 * (cal / best - 1):+.0f}%" if best else "-")
                if "oracle" in us:
                    cells.append(f"{100 * (row['oracle']['kl'] / best - 1):+.0f}%" if best else "-")
                lines.append(f"| {row['fraction']:.1f} | " + " | ".join(cells) + " |")
            lines.append("")
    return "\n".join(lines)
