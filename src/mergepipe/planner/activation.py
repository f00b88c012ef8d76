"""Block scores under a calibration of the base (params.utility = activation, fisher).
docs/catalog.md#calibrations.

activation: for a linear weight W (out x in) and an expert block D_b (rows of the delta), the
output change on the calibration's inputs has energy sum_j ||D_b[:, j]||^2 * rms_j^2 per token
(cross terms between channels left out). Ingestion keeps ||D_b[:, j]||^2 summed over 16
channel groups (block_stats.col_sq), the calibration the mean of rms_j^2 over the same groups
(group_ms): y_b = sqrt(col_sq . group_ms). The blocks of a weight are disjoint row ranges, so
the energies add up to the whole (expert, tensor) delta's output change Y_it^2 = sum_b y_b^2,
and the score is the block's share of it, act_b = y_b / Y_it: the objective is per_tensor's
(the summed kept share of every (expert, tensor) update), measured on the layer's output under
the calibration instead of in weight space. Tensors the calibration has no RMS for
(embeddings, norms, other shapes) use l2_b in place of y_b, so their score is per_tensor's
share l2_b / ||D_it||. A tensor whose update changes nothing under the calibration (its
inputs are zero) scores 0.

fisher: the KL a small change d of the weights causes is about (1/2) sum_i F_i d_i^2, with F the
diagonal of the Fisher information; the calibration keeps F's mean per block of the base's
grid and channel group (calibration_blocks), so act_b = sqrt(col_sq . F_b) for a 2-D tensor
cut into rows and l2_b * sqrt(F_b) for any other block; a tensor without Fisher values scores
l2_b * sqrt(fallback_fisher) (the mean over all parameters)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from mergepipe.catalog.calibrations import CalibrationRow
from mergepipe.catalog.connection import Connection
from mergepipe.catalog.db import load_sql
from mergepipe.core.errors import InvalidRequest
from mergepipe.planner.validate import ModelInfo

UTILITIES = ("activation", "fisher")


@dataclass(frozen=True)
class Calibration:
    """The calibration a plan ranks with: its row, per linear weight the mean square of the
    channel RMS per channel group, and (fisher) per (tensor, block) the Fisher means."""

    row: CalibrationRow
    group_ms: dict[str, list[float]]
    fisher: dict[tuple[str, int], list[float]] = field(default_factory=dict)


def activation_rows(conn: Connection, experts: list[ModelInfo], calibration: Calibration,
                    utility: str) -> dict[str, list[Any]]:
    """Columns of planner_activation (position, tensor, block_index, act) for every expert
    block with a nonzero delta. Refuses an expert with statistics but no column norms
    (ingested before they existed)."""
    out: dict[str, list[Any]] = {"position": [], "tensor": [], "block_index": [], "act": []}
    with_cols: set[int] = set()
    ms, fisher, row = calibration.group_ms, calibration.fisher, calibration.row
    for position, tensor, block_index, l2, col_sq in conn.execute(
            load_sql("planner_activation_blocks")).tuples():
        if col_sq is not None:
            with_cols.add(int(position))
        cols = None if col_sq is None else [float(c) for c in col_sq]
        if utility == "fisher":
            f = fisher.get((tensor, int(block_index)))
            if f is None:
                act = float(l2) * math.sqrt(row.fallback_fisher)
            elif len(f) > 1 and cols is not None and len(cols) == len(f):
                act = math.sqrt(max(0.0, _dot(cols, f)))
            else:
                act = float(l2) * math.sqrt(max(0.0, math.fsum(f) / len(f)))
        else:
            g = ms.get(tensor)
            if g is not None and cols is not None:
                act = math.sqrt(max(0.0, _dot(cols, g)))
            else:
                act = float(l2)
        out["position"].append(int(position))
        out["tensor"].append(tensor)
        out["block_index"].append(int(block_index))
        out["act"].append(act)
    if utility == "activation":
        out["act"] = _shares(out["position"], out["tensor"], out["act"])
    scored = set(out["position"])
    for i, m in enumerate(experts):
        if m.has_stats and i in scored and i not in with_cols:
            raise InvalidRequest(f"expert {m.name!r} has no channel statistics "
                                 "(ingested before calibration-aware planning); re-ingest it",
                                 field="experts")
    return out


def _shares(position: list[int], tensor: list[str], y: list[float]) -> list[float]:
    """Each block's y over the root sum of squares of its (expert, tensor)'s (0 when that is
    0)."""
    total: dict[tuple[int, str], float] = {}
    for p, t, v in zip(position, tensor, y, strict=True):
        total[(p, t)] = total.get((p, t), 0.0) + v * v
    norm = {k: math.sqrt(v) for k, v in total.items()}
    return [v / norm[(p, t)] if norm[(p, t)] > 0 else 0.0
            for p, t, v in zip(position, tensor, y, strict=True)]


def _dot(a: list[float], b: list[float]) -> float:
    return math.fsum(x * y for x, y in zip(a, b, strict=True))
