"""Read-only summaries the console draws: per-tensor read shares, model statistics, output sameness."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from mergepipe.catalog.connection import as_dataclass
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.records import MAX_LINEAGE_DEPTH, TouchedBlock


@dataclass(frozen=True)
class TensorShare:
    """How much of one expert's stored tensor an access set reads (a heatmap cell)."""

    model: str
    tensor: str
    ordinal: int                # the base's checkpoint order
    tensor_bytes: int | None    # the expert's stored bytes of the tensor (None: stores none)
    blocks: int | None
    read_bytes: int
    read_blocks: int

    @property
    def share(self) -> float | None:
        """read_bytes / tensor_bytes (None where the expert stores no such tensor)."""
        return self.read_bytes / self.tensor_bytes if self.tensor_bytes else None

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "share": self.share}


@dataclass(frozen=True)
class ModelSummary:
    """A model's block count, delta statistics (experts with statistics) and lineage depth."""

    name: str
    n_blocks: int
    delta_l2: float | None     # ||D||_2 over all tensors
    delta_l1: float | None
    delta_max_abs: float | None
    delta_nnz: int | None      # nonzero delta entries
    numel: int | None          # entries covered by the statistics
    lineage_depth: int         # longest chain of merges above it (0: ingested)


def merge_tensor_shares(cat: Catalog, merge_id: str) -> list[TensorShare]:
    """Per base tensor and expert of a recorded merge: its bytes and what the merge read."""
    return [as_dataclass(TensorShare, r)
            for r in cat.query("merge_tensor_shares", {"merge_id": merge_id})]


def plan_tensor_shares(cat: Catalog, base: str, experts: Sequence[str],
                       blocks: Iterable[TouchedBlock]) -> list[TensorShare]:
    """The same cells for a dry plan's access set (not recorded): in base order, then expert."""
    read: dict[tuple[str, str], tuple[int, int]] = {}
    for b in blocks:
        nbytes, n = read.get((b.model, b.tensor), (0, 0))
        read[(b.model, b.tensor)] = (nbytes + b.nbytes, n + 1)
    cells = []
    for position, model in enumerate(experts):
        for r in cat.query("expert_tensor_grid", {"base": base, "model": model}):
            nbytes, n = read.get((model, str(r.tensor)), (0, 0))
            cells.append((r.ordinal, position, TensorShare(
                model, r.tensor, r.ordinal, r.tensor_bytes, r.blocks, nbytes, n)))
    cells.sort(key=lambda c: (c[0], c[1]))
    return [c[2] for c in cells]


def model_summaries(cat: Catalog) -> list[ModelSummary]:
    """Every registered model's summary, by name."""
    rows = cat.query("model_summaries", {"max_depth": MAX_LINEAGE_DEPTH})
    return [as_dataclass(ModelSummary, r) for r in rows]


def identical_tensors(cat: Catalog, merge_id: str, reference: str) -> tuple[int, int]:
    """(output tensors of merge_id, how many are bit-identical to reference's)."""
    r = cat.query("output_tensors_identical", {"merge_id": merge_id, "reference": reference})[0]
    return int(r.tensors), int(r.identical or 0)
