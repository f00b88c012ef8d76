"""The one shape of progress reports, from ingestion and merges alike."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Progress:
    """`done` of `total` units of a job (bytes scanned by an ingestion, blocks of a merge)."""

    done: int
    total: int
    unit: str                    # "bytes" | "blocks"
    expert_bytes_read: int = 0   # merges: realized expert reads so far
    base_bytes_read: int = 0     # merges: base reads so far
    model: str | None = None     # ingestion: the model being ingested


ProgressFn = Callable[[Progress], None]
