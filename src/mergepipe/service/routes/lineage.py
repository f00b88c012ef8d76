"""GET /v1/lineage/{name}: ancestors and descendants, recursive over chained merges."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from mergepipe.catalog.lifecycle import model_lineage
from mergepipe.core.jsonable import jsonable
from mergepipe.service.schemas import LineageOut
from mergepipe.service.state import State

router = APIRouter(prefix="/v1", tags=["lineage"])


@router.get("/lineage/{name}", response_model=LineageOut,
            summary="Ancestors and descendants of a model with roles and weights")
def lineage(name: str, st: State) -> dict[str, Any]:
    # a name means its latest version; name~N that version (the Python API's lineage too)
    name, ancestors, descendants = model_lineage(st.cat, name)
    depth = max((e.depth or 0 for e in ancestors), default=0)
    return {"name": name, "ancestors": jsonable(ancestors), "descendants": jsonable(descendants),
            "depth": depth}
