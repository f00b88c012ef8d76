"""Check a merge request against the catalog: models exist, are ready and share the base."""

from __future__ import annotations

from dataclasses import dataclass

from mergepipe.catalog.connection import Connection
from mergepipe.catalog.db import Catalog, load_sql
from mergepipe.catalog.models import ModelRow, model_row
from mergepipe.core.errors import Conflict, InvalidRequest, NotFound
from mergepipe.core.request import MergeRequest


@dataclass(frozen=True)
class ModelInfo:
    """The catalog facts the planner needs about one model of the request."""

    name: str
    kind: str
    base: str | None
    has_stats: bool
    lora_scale: float | None
    created_at: str | None = None  # the row's creation time: with the name, one row for good


def _ready(row: ModelRow, role: str, field: str) -> ModelInfo:
    if row.status != "ready":
        why = f": {row.error}" if row.error else ""
        raise Conflict(f"{role} model {row.name!r} is {row.status}, not ready{why}", field=field)
    return ModelInfo(row.name, row.kind, row.base, row.has_stats, row.lora_scale,
                     row.created_at)


def load_models(conn: Connection, request: MergeRequest) -> tuple[ModelInfo, list[ModelInfo]]:
    """The base and the experts of `request` as catalog facts; NotFound / Conflict / InvalidRequest
    naming the model when one is missing, not ready, or not an expert of the request's base."""
    names = [request.base] + [e.model for e in request.experts]
    rows = {r.name: r for r in map(model_row, conn.execute(load_sql("planner_models"),
                                                               {"names": names}))}
    row = rows.get(request.base)
    if row is None:
        raise NotFound(f"base model {request.base!r} is not in the catalog", field="base")
    base = _ready(row, "base", "base")
    if base.kind != "full":
        raise InvalidRequest(f"base model {base.name!r} is a {base.kind} checkpoint; a base must "
                             "be a full checkpoint", field="base")
    experts = []
    for i, spec in enumerate(request.experts):
        field = f"experts[{i}].model"
        row = rows.get(spec.model)
        if row is None:
            raise NotFound(f"expert model {spec.model!r} is not in the catalog", field=field)
        info = _ready(row, "expert", field)
        if info.base is None:
            raise InvalidRequest(f"expert {info.name!r} is registered as a base model (no base), "
                                 f"not as an expert of {request.base!r}", field=field)
        if info.base != request.base:
            raise InvalidRequest(f"expert {info.name!r} was derived from base {info.base!r}, "
                                 f"not from the request's base {request.base!r}", field=field)
        experts.append(info)
    _check_ndim(conn, request)
    return base, experts


def _check_ndim(conn: Connection, request: MergeRequest) -> None:
    """The operator's fewest tensor dimensions (della ranks each row's entries; a 0-D tensor
    has no row), checked against the base's tensors."""
    need = request.spec.min_ndim
    if not need:
        return
    for tensor, shape in conn.execute(load_sql("planner_base_tensors"), {"model": request.base}):
        if len(shape) < need:
            raise InvalidRequest(f"{request.operator} needs tensors of at least {need} "
                                 f"dimension(s); base tensor {tensor!r} of {request.base!r} has "
                                 f"shape {list(shape)}", field="operator")


def check_request(cat: Catalog, request: MergeRequest) -> None:
    """`load_models` on a reader of its own: the request's models exist, are ready and fit."""
    with cat.reader() as conn:
        load_models(conn, request)
