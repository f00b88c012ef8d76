"""MergePipe: budgeted, catalog-planned merging of LLM checkpoint families.

The Python API (docs/python.md): `mergepipe.Catalog`, the request type `MergeRequest` and the
errors, all subclasses of `MergePipeError` that carry their HTTP status. They load on first use,
so that `import mergepipe` (and the CLI's start-up) stays light."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "Catalog": "mergepipe.api", "Lineage": "mergepipe.api", "SqlResult": "mergepipe.api",
    "MergeRequest": "mergepipe.core.request",
    "MergePipeError": "mergepipe.core.errors", "InvalidRequest": "mergepipe.core.errors",
    "InvalidCheckpoint": "mergepipe.core.errors", "NotFound": "mergepipe.core.errors",
    "Conflict": "mergepipe.core.errors", "Forbidden": "mergepipe.core.errors",
    "Busy": "mergepipe.core.errors", "SourceChanged": "mergepipe.core.errors",
    "RemoteUnavailable": "mergepipe.core.errors", "CatalogReadOnly": "mergepipe.core.errors",
    "InsufficientStorage": "mergepipe.core.errors",
}
__all__ = [
    "Busy", "Catalog", "CatalogReadOnly", "Conflict", "Forbidden", "InsufficientStorage",
    "InvalidCheckpoint", "InvalidRequest", "Lineage", "MergePipeError", "MergeRequest", "NotFound",
    "RemoteUnavailable", "SourceChanged", "SqlResult", "__version__",
]

if TYPE_CHECKING:
    from mergepipe.api import Catalog, Lineage, SqlResult
    from mergepipe.core.errors import (
        Busy,
        CatalogReadOnly,
        Conflict,
        Forbidden,
        InsufficientStorage,
        InvalidCheckpoint,
        InvalidRequest,
        MergePipeError,
        NotFound,
        RemoteUnavailable,
        SourceChanged,
    )
    from mergepipe.core.request import MergeRequest


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mergepipe' has no attribute {name!r}")
