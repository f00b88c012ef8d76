"""GET /v1/operators: the registered merge operators and their parameters (from their specs)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fastapi import APIRouter

from mergepipe.core.operators import REGISTRY, OperatorSpec, Param
from mergepipe.core.schema import LAMBDA, NORMALIZE, UNIT, UTILITY
from mergepipe.service.schemas import OperatorList

router = APIRouter(prefix="/v1", tags=["operators"])


def _param(p: Param) -> dict[str, Any]:
    return {"name": p.name, "type": p.type.__name__, "default": p.default,
            "choices": list(p.choices), "help": p.help}


def operator_out(spec: OperatorSpec) -> dict[str, Any]:
    """An operator's spec as JSON: the parameters every operator takes, then its own."""
    normalize = replace(NORMALIZE, default=spec.normalize_default)
    return {"name": spec.name, "aliases": list(spec.aliases), "title": spec.title,
            "formula": spec.formula, "additive": spec.additive, "density": spec.density,
            "normalize_default": spec.normalize_default,
            "params": [_param(p) for p in (normalize, LAMBDA,
                                           replace(UTILITY, default=spec.default_utility),
                                           replace(UNIT, default=spec.planning_unit),
                                           *spec.params)]}


@router.get("/operators", response_model=OperatorList,
            summary="Merge operators: parameters, defaults, whether the omission bound applies")
def operators() -> dict[str, Any]:
    return {"operators": [operator_out(s) for s in REGISTRY.values()]}
