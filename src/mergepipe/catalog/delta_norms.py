"""How far an expert lies from its claimed base: ||E - B|| / ||B|| from ingestion's statistics;
above MAX_RELATIVE_DELTA it is refused unless forced (docs/catalog.md)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from mergepipe.catalog.scan import TensorResult
from mergepipe.core.errors import InvalidRequest

MAX_RELATIVE_DELTA = 0.5  # fine-tunes: 1e-3..1e-1; another base: ~1 or more


def relative_norms(results: Sequence[TensorResult], base_l2: Mapping[str, float | None]
                   ) -> tuple[float | None, float | None]:
    """(||D|| / ||B|| over the expert's tensors, the largest ratio of one tensor) from the
    expert's block statistics and the base's tensor norms; (None, None) without statistics or
    when the base has no norms (ingested before migration 0009)."""
    delta_sq = base_sq = 0.0
    worst: float | None = None
    for r in results:
        b = base_l2.get(r.name)
        if r.stats is None or b is None:
            return None, None
        d_sq = sum(s.l2 * s.l2 for s in r.stats)
        delta_sq += d_sq
        base_sq += b * b
        if b > 0:
            worst = max(worst or 0.0, math.sqrt(d_sq) / b)
    if not results or base_sq == 0.0:
        return None, worst
    return math.sqrt(delta_sq / base_sq), worst


def check_relative_norm(path: str, base: str, ratio: float | None, worst: float | None,
                        force: bool) -> None:
    """InvalidRequest (field base) when the expert is too far from `base` to be a fine-tune of
    it, unless forced."""
    if force or ratio is None or ratio <= MAX_RELATIVE_DELTA:
        return
    raise InvalidRequest(
        f"{path}: its delta to base {base!r} has {ratio:.3g} times the base's norm "
        f"(||E - B|| / ||B||; largest tensor {worst or 0.0:.3g}), above {MAX_RELATIVE_DELTA:g}: "
        "a fine-tune stays near 0.001 to 0.1, a model of another base near 1. Check --base, "
        "or ingest with --force (API: \"force\": true)", field="base")
