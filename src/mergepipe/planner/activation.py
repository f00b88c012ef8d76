"""Block scores under a calibration of the base (params.utility = activation,
activation_relative). docs/catalog.md#calibrations.

For a linear weight W (out x in) and an expert block D_b (rows of the delta), the output change
on the calibration's inputs has energy sum_j ||D_b[:, j]||^2 * rms_j^2 per token (cross terms
between channels left out). Ingestion keeps ||D_b[:, j]||^2 summed over 16 channel groups
(block_stats.col_sq), the calibration the mean of rms_j^2 over the same groups (group_ms), so

    activation:           act_b = sqrt(col_sq . group_ms)          (output change, RMS per token)
    activation_relative:  act_b / sqrt(out_ms)                     (relative to the layer's output)

Tensors the calibration does not cover (embeddings, norms, tensors that are not 2-D) keep a
score on the same scale: activation: l2_b * fallback_rms (the calibration's RMS over all
channels: the output change if every channel had that RMS); activation_relative:
l2_b / ||B_t|| (the relative change of the weights, which is the relative output change when
inputs are isotropic)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from mergepipe.catalog.calibrations import CalibrationRow
from mergepipe.catalog.connection import Connection
from mergepipe.catalog.db import load_sql
from mergepipe.core.errors import InvalidRequest
from mergepipe.planner.validate import ModelInfo

UTILITIES = ("activation", "activation_relative")


@dataclass(frozen=True)
class Calibration:
    """The calibration a plan ranks with: its row and, per linear weight, the mean square of
    the channel RMS per channel group and the mean squared norm of its output."""

    row: CalibrationRow
    group_ms: dict[str, list[float]]
    out_ms: dict[str, float]


def activation_rows(conn: Connection, base: str, experts: list[ModelInfo],
                    calibration: Calibration, relative: bool) -> dict[str, list[Any]]:
    """Columns of planner_activation (position, tensor, block_index, act) for every expert
    block with a nonzero delta. Refuses an expert with statistics but no column norms
    (ingested before they existed), and a relative ranking of an uncovered tensor whose
    base has no tensor norm (ingested before migration 0009)."""
    out: dict[str, list[Any]] = {"position": [], "tensor": [], "block_index": [], "act": []}
    with_cols: set[int] = set()
    ms = {t: np.asarray(v, dtype=np.float64) for t, v in calibration.group_ms.items()}
    fallback = calibration.row.fallback_rms
    for position, tensor, block_index, l2, col_sq, value_l2 in conn.execute(
            load_sql("planner_activation_blocks"), {"base": base}).tuples():
        g = ms.get(tensor)
        if col_sq is not None:
            with_cols.add(int(position))
        out_ms = calibration.out_ms.get(tensor, 0.0)
        if col_sq is not None and g is not None and (out_ms > 0 or not relative):
            act = math.sqrt(max(0.0, float(np.dot(np.asarray(col_sq, np.float64), g))))
            if relative:
                act /= math.sqrt(out_ms)
        elif not relative:
            act = float(l2) * fallback
        elif value_l2 is None:
            raise InvalidRequest(f"utility=activation_relative needs the L2 norms of base "
                                 f"{base!r}'s tensors (tensor {tensor!r} has none): re-ingest "
                                 "the base", field="params.utility")
        else:
            act = float(l2) / float(value_l2) if value_l2 else float(l2)
        out["position"].append(int(position))
        out["tensor"].append(tensor)
        out["block_index"].append(int(block_index))
        out["act"].append(act)
    for i, m in enumerate(experts):
        if m.has_stats and i not in with_cols and i in set(out["position"]):
            raise InvalidRequest(f"expert {m.name!r} has no channel statistics "
                                 "(ingested before calibration-aware planning); re-ingest it",
                                 field="experts")
    return out
