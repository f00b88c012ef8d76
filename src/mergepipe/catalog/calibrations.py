"""Calibrations of a base model: per linear weight, the RMS of each input channel over a
calibration text (written by mergepipe.evaluation.calibration, read by the planner's
utility=activation). docs/catalog.md#calibrations."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from mergepipe.catalog.connection import Connection, IntegrityError, Row
from mergepipe.catalog.db import Connectable, load_sql, run
from mergepipe.core.errors import Conflict


@dataclass(frozen=True)
class CalibrationRow:
    """One row of `calibrations`."""

    calibration_id: str
    model: str
    text_sha256: str
    tokens: int
    fallback_rms: float
    fallback_fisher: float
    created_at: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The plan's and the API's form."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ChannelRms:
    """One linear weight's input-channel RMS and its channel-group mean squares."""

    tensor: str
    rms: list[float]
    group_ms: list[float]


@dataclass(frozen=True)
class FisherBlock:
    """The mean Fisher diagonal of one block of the base's grid: per channel group (a 2-D
    tensor cut into rows) or over the block (one value)."""

    tensor: str
    block_index: int
    fisher: list[float]


def calibration_id(model: str, text_sha256: str, tokens: int, rms: list[ChannelRms],
                   fisher: list[FisherBlock]) -> str:
    """sha256 (first 16 hex digits) of the base, the text, the token count and the values: the
    same run on the same model gives the same id."""
    doc = [model, text_sha256, tokens, [[r.tensor, r.rms] for r in rms],
           [[f.tensor, f.block_index, f.fisher] for f in fisher]]
    return hashlib.sha256(json.dumps(doc, separators=(",", ":")).encode()).hexdigest()[:16]


def write_calibration(conn: Connection, row: CalibrationRow, rms: list[ChannelRms],
                      fisher: list[FisherBlock]) -> None:
    """Insert a calibration and its vectors (in the caller's transaction)."""
    try:
        conn.execute(load_sql("calibration_insert"), {
            "calibration_id": row.calibration_id, "model": row.model,
            "text_sha256": row.text_sha256, "tokens": row.tokens,
            "fallback_rms": row.fallback_rms, "fallback_fisher": row.fallback_fisher})
    except IntegrityError:
        raise Conflict(f"calibration {row.calibration_id!r} already exists",
                       field="calibration_id") from None
    conn.execute(load_sql("calibration_rms_insert"), {
        "calibration_id": row.calibration_id, "tensor": [r.tensor for r in rms],
        "rms": [r.rms for r in rms], "group_ms": [r.group_ms for r in rms]})
    conn.execute(load_sql("calibration_blocks_insert"), {
        "calibration_id": row.calibration_id, "tensor": [f.tensor for f in fisher],
        "block_index": [f.block_index for f in fisher], "fisher": [f.fisher for f in fisher]})


def _row(r: Row) -> CalibrationRow:
    created = r[6]
    return CalibrationRow(str(r[0]), str(r[1]), str(r[2]), int(r[3]), float(r[4]), float(r[5]),
                          None if created is None else str(created))


def get_calibration(cat: Connectable, cid: str) -> CalibrationRow | None:
    row = run(cat, "calibration_get", {"calibration_id": cid}).first()
    return None if row is None else _row(row)


def latest_calibration(cat: Connectable, model: str) -> CalibrationRow | None:
    """The newest calibration of `model` (a model key), or None."""
    row = run(cat, "calibration_latest", {"model": model}).first()
    return None if row is None else _row(row)


def calibration_vectors(cat: Connectable, cid: str) -> dict[str, ChannelRms]:
    """The channel RMS vectors of a calibration, by tensor."""
    return {str(r[0]): ChannelRms(str(r[0]), [float(v) for v in r[1]],
                                  [float(v) for v in r[2]])
            for r in run(cat, "calibration_rms_get", {"calibration_id": cid})}


def calibration_fisher(cat: Connectable, cid: str) -> dict[tuple[str, int], list[float]]:
    """The Fisher diagonal of a calibration, by (tensor, block index)."""
    return {(str(r[0]), int(r[1])): [float(v) for v in r[2]]
            for r in run(cat, "calibration_blocks_get", {"calibration_id": cid})}
