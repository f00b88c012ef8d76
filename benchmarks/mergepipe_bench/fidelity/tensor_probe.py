"""Which tensors a ranking leaves unread, and what leaving one tensor out costs (docs/FIDELITY.md,
"A sixth family"). Runs on a family the ranking study already trained and ingested under DIR.

    python -m mergepipe_bench.fidelity.tensor_probe --family neox --dir DIR coverage \
        --operator dare_ties --budget 0.7 --rankings l2,per_tensor
    python -m mergepipe_bench.fidelity.tensor_probe --family neox --dir DIR omit \
        --operators task_arithmetic,dare_ties --tensors embed_in,embed_out
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from mergepipe.planner.plan import Plan, make_plan
from mergepipe_bench.fidelity.random_plan import Candidate, _first_fit
from mergepipe_bench.fidelity.ranking_study import OPERATORS, Study, _cap, rankings

Share = tuple[float, float]  # (share of the tensor's candidate bytes, of its squared utility)


def coverage(plan: Plan, cands: list[Candidate]) -> dict[str, Share]:
    """Per tensor: the share of its candidate bytes and of its summed squared utility
    (|alpha_i|^2 ||D_itb||^2 over experts and blocks) that plan reads."""
    read = {(b.model, b.tensor, b.block_index) for b in plan.blocks}
    tot: dict[str, list[float]] = {}
    for c in cands:
        t = tot.setdefault(c.tensor, [0.0, 0.0, 0.0, 0.0])
        t[0] += c.nbytes
        t[1] += c.utility ** 2
        if (c.model, c.tensor, c.block_index) in read:
            t[2] += c.nbytes
            t[3] += c.utility ** 2
    return {k: (v[2] / v[0] if v[0] else 1.0, v[3] / v[1] if v[1] else 1.0)
            for k, v in tot.items()}


def omit_plan(full: Plan, cands: list[Candidate], part: str) -> Plan:
    """The full plan less every candidate of the tensors whose name contains part."""
    keep = [c for c in cands if part not in c.tensor]
    return _first_fit(_cap(full, sum(c.nbytes for c in keep)), cands, keep, {"omit": part})


def _cfg(study: Study) -> Any:
    """The study's config for OperatorRun, which reads only its out_dtype and threads (as the
    ranking study does)."""
    return study.cfg


def _coverage(study: Study, op_name: str, budget: float, names: list[str], below: float) -> None:
    from mergepipe_bench.fidelity.random_plan import candidates
    from mergepipe_bench.fidelity.run import Evaluator, OperatorRun
    cat, info = study.catalog()
    op = next(o for o in OPERATORS if o.name == op_name)
    with cat:
        run = OperatorRun(_cfg(study), cat, Evaluator([]), study.work / "merges", "base",
                          list(info["experts"]), op)
        cands = candidates(cat, make_plan(cat, run.request(1.0)))
        plan = make_plan(cat, run.request(budget))
        cover = {k: coverage(_first_fit(_cap(plan, plan.budget_bytes), cands, o(cands), {}), cands)
                 for k, o in rankings().items() if k in names}
    for t in sorted(next(iter(cover.values()))):
        if any(c[t][1] < below for c in cover.values()):
            print(t, "  ".join(f"{k}: bytes {c[t][0]:.2f} energy {c[t][1]:.2f}"
                               for k, c in cover.items()))


def _omit(study: Study, ops: list[str], parts: list[str]) -> None:
    from mergepipe_bench.fidelity.random_plan import candidates
    from mergepipe_bench.fidelity.run import Evaluator, OperatorRun
    from mergepipe_bench.fidelity.tasks import eval_set
    cat, info = study.catalog()
    ev = Evaluator(eval_set(list(study.spec.tasks), study.cfg.eval_per_task, study.cfg.eval_seed))
    base_lp, _, _ = ev.measure(Path(info["base"]["path"]))
    work = study.work / "probe"
    with cat:
        for name in ops:
            op = next(o for o in OPERATORS if o.name == name)
            run = OperatorRun(_cfg(study), cat, ev, work, "base", list(info["experts"]), op)
            full = make_plan(cat, run.request(1.0))
            d, _ = run.merge(full, "full")
            full_lp, targets, _ = ev.measure(d)
            base_kl = ev.kl(full_lp, base_lp, targets)["answer"]
            cands = candidates(cat, full)
            for part in parts:
                p = omit_plan(full, cands, part)
                d, _ = run.merge(p, "omit")
                lp, _, _ = ev.measure(d)
                ratio = ev.kl(full_lp, lp, targets)["answer"] / base_kl
                share = 1 - p.planned_expert_bytes / full.planned_expert_bytes
                print(f"{name} omit {part}: {share:.3f} of the bytes, KL ratio {ratio:.3g}",
                      flush=True)
    shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    from mergepipe_bench.fidelity.ranking_study import FAMILIES
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--family", choices=sorted(FAMILIES), required=True)
    p.add_argument("--dir", required=True, help="the ranking study's directory")
    p.add_argument("--eval-per-task", type=int, default=64)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("coverage", help="share of each tensor a ranking's plan reads")
    c.add_argument("--operator", required=True)
    c.add_argument("--budget", type=float, required=True)
    c.add_argument("--rankings", default="l2,per_tensor")
    c.add_argument("--below", type=float, default=0.9,
                   help="print the tensors some ranking reads less of (energy share)")
    o = sub.add_parser("omit", help="KL ratio of the full merge less one tensor")
    o.add_argument("--operators", required=True)
    o.add_argument("--tensors", required=True, help="comma-separated name substrings")
    a = p.parse_args()
    study = Study(a.family, Path(a.dir).absolute(), a.eval_per_task)
    if a.cmd == "coverage":
        _coverage(study, a.operator, a.budget, a.rankings.split(","), a.below)
    else:
        _omit(study, a.operators.split(","), a.tensors.split(","))


if __name__ == "__main__":
    main()
