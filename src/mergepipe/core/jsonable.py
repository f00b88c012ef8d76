"""The one conversion of our values to plain JSON (API bodies, manifests, catalog JSON columns)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any


def jsonable(v: Any) -> Any:
    """Plain JSON values: non-finite floats become null (JSON has no NaN), timestamps ISO 8601,
    decimals floats, paths strings, tuples and sets lists, dataclasses objects."""
    if isinstance(v, bool) or v is None or isinstance(v, int | str):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, Decimal):
        return jsonable(float(v))
    if isinstance(v, dt.datetime | dt.date):
        return v.isoformat()
    if isinstance(v, Mapping):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple | set | frozenset):
        return [jsonable(x) for x in v]
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return jsonable({f.name: getattr(v, f.name) for f in dataclasses.fields(v)})
    if isinstance(v, Path):
        return str(v)
    return str(v)


def dumps(v: Any) -> str:
    """Compact JSON text of `jsonable(v)`."""
    return json.dumps(jsonable(v), separators=(",", ":"), allow_nan=False)
