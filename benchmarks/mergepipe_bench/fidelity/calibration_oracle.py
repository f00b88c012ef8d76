"""The oracle ranking of the calibration study (linear merges): every candidate (expert, block)
scored by the KL its omission alone causes, measured on the study's own eval set, then taken
greedily by that KL per byte. No calibration can know more about a block's effect on the
output than this, so if the oracle's plan is not 25% below the best uncalibrated default, no
per-block calibrated score can be. docs/FIDELITY.md, "Calibration-aware planning"."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.models import model_blocks
from mergepipe.planner.plan import Plan
from mergepipe_bench.fidelity.evaluate import load_state, log_probs, masks, token_kl
from mergepipe_bench.fidelity.model import load_model
from mergepipe_bench.fidelity.random_plan import Candidate, _first_fit, candidates


def _rows(t: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """The view of rows [start, end) of a tensor (elements for a 1-D one)."""
    return (t.reshape(t.shape[0], -1) if t.dim() >= 2 else t)[start:end]


class LeaveOneOut:
    """Answer-token KL(full merge || full merge without one expert block), per candidate."""

    def __init__(self, cat: Catalog, full_plan: Plan, full_dir: Path, base_dir: Path,
                 expert_dirs: dict[str, Path], examples: list[Any]) -> None:
        self.examples = examples
        self.model = load_model(full_dir)
        self.params = dict(self.model.named_parameters())
        self.base = load_state(base_dir)
        self.experts = {e: load_state(p) for e, p in expert_dirs.items()}
        coef = full_plan.request.coefficients()
        self.alpha = {e.model: float(a) for e, a in zip(full_plan.request.experts, coef,
                                                        strict=True)}
        self.rows = {(e, b.tensor, b.block_index): (b.row_start, b.row_end)
                     for e in expert_dirs for b in model_blocks(cat, e)}
        with torch.inference_mode():
            self.ref, targets = log_probs(self.model, examples)
        self.answer = masks(examples, targets)["answer"]

    def delta(self, c: Candidate) -> torch.Tensor:
        """alpha_i * D_ib: what the full merge holds of this expert block."""
        rs, re = self.rows[(c.model, c.tensor, c.block_index)]
        d = _rows(self.experts[c.model][c.tensor], rs, re) - _rows(self.base[c.tensor], rs, re)
        return self.alpha[c.model] * d

    def kl(self, c: Candidate) -> float:
        rs, re = self.rows[(c.model, c.tensor, c.block_index)]
        view = _rows(self.params[c.tensor].data, rs, re)
        saved = view.clone()
        view -= self.delta(c).to(view.dtype)
        try:
            with torch.inference_mode():
                lp, _ = log_probs(self.model, self.examples)
            return float(token_kl(self.ref, lp)[self.answer].mean())
        finally:
            view.copy_(saved)


def oracle_scores(loo: LeaveOneOut, cands: list[Candidate]) -> tuple[list[float], float]:
    """Each candidate's leave-one-out KL, and the seconds they took."""
    t0 = time.perf_counter()
    scores = [loo.kl(c) for c in cands]
    return scores, time.perf_counter() - t0


def oracle_plan(plan: Plan, cands: list[Candidate], scores: list[float]) -> Plan:
    """`plan`'s bytes filled greedily by leave-one-out KL per byte (first-fit)."""
    order = [c for _, c in sorted(zip(scores, cands, strict=True),
                                  key=lambda sc: -sc[0] / sc[1].nbytes)]
    return _first_fit(plan, cands, order, {"order": "leave-one-out KL per byte"})


__all__ = ["LeaveOneOut", "candidates", "oracle_plan", "oracle_scores"]


def grouping_error(cat: Catalog, calibration_id: str, base_dir: Path,
                   expert_dirs: dict[str, Path]) -> dict[str, Any]:
    """How far the catalog's 16-group estimate of each linear block's output energy,
    col_sq . group_ms, is from the exact sum_j ||D_b[:, j]||^2 rms_j^2 (per channel): relative
    error quantiles, and the share of (expert, tensor) pairs whose block order differs."""
    from mergepipe.catalog.calibrations import calibration_vectors
    from mergepipe.catalog.connection import SQL

    vec = calibration_vectors(cat, calibration_id)
    base = load_state(base_dir)
    errs: list[float] = []
    pairs = reordered = 0
    for e, path in expert_dirs.items():
        state = load_state(path)
        stats = {(str(r[0]), int(r[1])): [float(x) for x in r[2]] for r in cat.query(SQL(
            "SELECT tensor, block_index, col_sq FROM block_stats WHERE model = :m "
            "AND col_sq IS NOT NULL"), {"m": e})}
        by_tensor: dict[str, list[tuple[float, float]]] = {}
        for b in model_blocks(cat, e):
            v = vec.get(b.tensor)
            if v is None or (b.tensor, b.block_index) not in stats:
                continue
            d = (state[b.tensor] - base[b.tensor])[b.row_start:b.row_end].double()
            r2 = torch.tensor(v.rms, dtype=torch.float64).square()
            exact = float((d.square().sum(0) * r2).sum())
            grouped = sum(c * g for c, g in zip(stats[(b.tensor, b.block_index)], v.group_ms,
                                                 strict=True))
            if exact > 0:
                errs.append(abs(grouped / exact - 1))
            by_tensor.setdefault(b.tensor, []).append((exact, grouped))
        for vals in by_tensor.values():
            if len(vals) > 1:
                pairs += 1
                reordered += sorted(range(len(vals)), key=lambda k: -vals[k][0]) != sorted(
                    range(len(vals)), key=lambda k: -vals[k][1])
    errs.sort()
    q = (lambda p: errs[min(len(errs) - 1, int(p * len(errs)))]) if errs else (lambda p: 0.0)
    return {"blocks": len(errs), "median_rel_err": q(0.5), "p90_rel_err": q(0.9),
            "max_rel_err": errs[-1] if errs else 0.0, "tensor_pairs": pairs,
            "pairs_reordered": reordered}


def exact_activation_order(cat: Catalog, calibration_id: str, plan: Plan,
                           cands: list[Candidate], base_dir: Path,
                           expert_dirs: dict[str, Path]) -> list[Candidate]:
    """`cands` ranked by the activation score computed from every input channel's RMS instead
    of the catalog's 16 channel groups: |alpha_i| y_b / Y_it per byte, y_b^2 =
    sum_j ||D_b[:, j]||^2 rms_j^2 (||D_b||^2 for tensors without RMS)."""
    from mergepipe.catalog.calibrations import calibration_vectors

    vec = calibration_vectors(cat, calibration_id)
    base = load_state(base_dir)
    alpha = {e.model: abs(float(a)) for e, a in zip(plan.request.experts,
                                                     plan.request.coefficients(), strict=True)}
    rows = {(e, b.tensor, b.block_index): (b.row_start, b.row_end)
            for e in expert_dirs for b in model_blocks(cat, e)}
    y: dict[tuple[str, str, int], float] = {}
    for e, path in expert_dirs.items():
        state = load_state(path)
        for c in cands:
            if c.model != e:
                continue
            rs, re = rows[(e, c.tensor, c.block_index)]
            d = (_rows(state[c.tensor], rs, re) - _rows(base[c.tensor], rs, re)).double()
            v = vec.get(c.tensor)
            y[(e, c.tensor, c.block_index)] = float(
                (d.square().sum(0) * torch.tensor(v.rms, dtype=torch.float64).square()).sum()
                if v is not None and d.dim() == 2 else d.square().sum())
    total: dict[tuple[str, str], float] = {}
    for (e, t, _), energy in y.items():
        total[(e, t)] = total.get((e, t), 0.0) + energy

    def score(c: Candidate) -> float:
        tot = total[(c.model, c.tensor)]
        return alpha[c.model] * (y[(c.model, c.tensor, c.block_index)] / tot) ** 0.5 \
            if tot > 0 else 0.0

    return sorted(cands, key=lambda c: -score(c) / c.nbytes)
