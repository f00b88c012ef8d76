"""Import a command's heavy modules (torch) in a background thread while it opens the catalog."""

from __future__ import annotations

import importlib
import threading


def start(*modules: str) -> threading.Thread:
    t = threading.Thread(target=_load, args=(modules,), name="mergepipe-preload", daemon=True)
    t.start()
    return t


def _load(modules: tuple[str, ...]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the command's own import raises it where it is seen
            return
