"""GET /v1/lineage/{name}: ancestors and descendants, recursive over chained merges."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from mergepipe.catalog import records
from mergepipe.catalog.lifecycle import resolve_key
from mergepipe.catalog.models import find_model
from mergepipe.core.errors import NotFound
from mergepipe.core.jsonable import jsonable
from mergepipe.service.schemas import LineageOut
from mergepipe.service.state import State

router = APIRouter(prefix="/v1", tags=["lineage"])


@router.get("/lineage/{name}", response_model=LineageOut,
            summary="Ancestors and descendants of a model with roles and weights")
def lineage(name: str, st: State) -> dict[str, Any]:
    name = resolve_key(st.cat, name)  # a name means its latest version; name~N that version
    ancestors, descendants = records.lineage(st.cat, name)
    if not ancestors and not descendants and find_model(st.cat, name) is None:
        raise NotFound(f"model {name!r} not found", field="name")
    depth = max((e.depth or 0 for e in ancestors), default=0)
    return {"name": name, "ancestors": jsonable(ancestors), "descendants": jsonable(descendants),
            "depth": depth}
