"""Registered models: look one up, list them, read a model's files, tensors and blocks."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from mergepipe.catalog.db import Catalog, load_sql

from mergepipe.core.errors import NotFound

KINDS = ("full", "delta", "lora")  # how a model stores its weights

Connectable = Catalog | sa.Connection


def get_model(cat: Connectable, name: str) -> dict[str, Any]:
    """The models row of `name` as a dict (created_at as ISO 8601 text); NotFound if absent."""
    rows = _query(cat, "model_get", {"name": name})
    if not rows:
        raise NotFound(f"model {name!r} is not in the catalog", field="model")
    return _model(rows[0])


def find_model(cat: Connectable, name: str) -> dict[str, Any] | None:
    """The models row of `name`, or None."""
    rows = _query(cat, "model_get", {"name": name})
    return _model(rows[0]) if rows else None


def list_models(cat: Connectable) -> list[dict[str, Any]]:
    """Every model row: each base followed by its experts, by name."""
    return [_model(r) for r in _query(cat, "model_list", {})]


def model_files(cat: Connectable, name: str) -> list[dict[str, Any]]:
    """The files rows of a model in checkpoint order."""
    return [dict(r._mapping) for r in _query(cat, "model_files", {"model": name})]


def model_tensors(cat: Connectable, name: str) -> list[dict[str, Any]]:
    """The tensors rows of a model in checkpoint order (shape as a tuple)."""
    out = []
    for r in _query(cat, "model_tensors", {"model": name}):
        row = dict(r._mapping)
        row["shape"] = tuple(int(d) for d in row["shape"])
        if row.get("lora_a_shape") is not None:
            row["lora_a_shape"] = tuple(int(d) for d in row["lora_a_shape"])
        out.append(row)
    return out


def model_blocks(cat: Connectable, name: str) -> list[dict[str, Any]]:
    """The blocks rows of a model, tensor by tensor in checkpoint order."""
    return [dict(r._mapping) for r in _query(cat, "model_blocks", {"model": name})]


def _query(cat: Connectable, name: str, params: dict[str, Any]) -> list[sa.Row[Any]]:
    if isinstance(cat, Catalog):
        return cat.query(name, params)
    return list(cat.execute(load_sql(name), params))


def _model(row: sa.Row[Any]) -> dict[str, Any]:
    out = dict(row._mapping)
    if isinstance(out.get("created_at"), datetime):
        out["created_at"] = out["created_at"].isoformat()
    return out
