"""Import a command's heavy modules (torch) in a background thread while it opens the catalog.

`import torch` is the largest fixed cost of a merge or an ingestion (about 1 s of CPU). Started
first, it overlaps the catalog's open, its migration check and the ingest job's row, whose
waits (DuckDB, file system) leave the interpreter free: 0.1-0.7 s less wall time per command in
paired runs on a busy 2-core machine. The command's own import of the module then finds it
loaded, or waits for the import under way (Python's per-module import locks).
"""

from __future__ import annotations

import importlib
import threading


def start(*modules: str) -> threading.Thread:
    """Import `modules` in a daemon thread; the thread, started."""
    t = threading.Thread(target=_load, args=(modules,), name="mergepipe-preload", daemon=True)
    t.start()
    return t


def _load(modules: tuple[str, ...]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the command's own import raises it where it is seen
            return
