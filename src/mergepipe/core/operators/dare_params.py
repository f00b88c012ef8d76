"""What the two DARE operators share beyond the kernels: the `rescale` parameter and its mergekit form."""

from __future__ import annotations

from typing import Any

from mergepipe.core.errors import InvalidRequest
from mergepipe.core.operators.spec import Param

RESCALES = ("density", "l1", "none")
RESCALE = Param("rescale", str, "density", RESCALES,
                "density: divide kept entries by density (the DARE paper); l1: match each "
                "block's L1 norm (mergekit); none: leave them")
MERGEKIT_PARAMS = {"normalize": "normalize", "lambda": "lambda", "rescale": "rescale"}


def rescale_from_mergekit(params: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """mergekit's boolean `rescale` (default true: L1 rescaling) -> our rescale choice."""
    key = "parameters.rescale"
    value = params.get("rescale")
    if value is None or value is True:
        notes.append("parameters.rescale: true (mergekit's default for DARE) -> rescale: l1, "
                     "kept entries rescaled to the dropped block's L1 norm")
        return {**params, "rescale": "l1"}
    if value is False:
        return {**params, "rescale": "none"}
    if value in RESCALES:
        return {**params, "rescale": str(value)}
    raise InvalidRequest(f"{key}: must be true, false, or one of {', '.join(RESCALES)}; got "
                         f"{value!r}", field=key)
