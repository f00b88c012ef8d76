"""Pin torch to one intra-op thread, once per process: our own workers give the parallelism."""

from __future__ import annotations

import importlib
import sys
import threading

_lock = threading.Lock()
_pinned = False


def pin_torch_threads(*, load: bool = False) -> None:
    """torch's intra-op threads on top of our read, scan and merge threads oversubscribe the
    cores (block-sized ops run ~10x slower here); set one thread for the rest of the process.
    Never restored: two jobs in one process would otherwise undo each other's setting.

    Only where torch is imported already (a scan of full or delta checkpoints never imports
    it), or with `load`, which imports it first (a LoRA scan, whose product is torch's)."""
    global _pinned
    if _pinned or not (load or "torch" in sys.modules):
        return
    torch = importlib.import_module("torch")  # waits for an import under way in another thread
    with _lock:
        if not _pinned:
            torch.set_num_threads(1)
            _pinned = True
