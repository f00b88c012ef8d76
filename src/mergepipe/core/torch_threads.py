"""Pin torch to one intra-op thread, once per process: our own workers give the parallelism."""

from __future__ import annotations

import importlib
import sys
import threading

_lock = threading.Lock()
_pinned = False


def pin_torch_threads(*, load: bool = False) -> None:
    """One intra-op thread for the rest of the process (torch's threads on top of ours run
    block-sized ops ~10x slower; never restored, or two jobs would undo each other's setting).
    Only where torch is imported already, or with `load`, which imports it (a LoRA scan)."""
    global _pinned
    if _pinned or not (load or "torch" in sys.modules):
        return
    torch = importlib.import_module("torch")  # waits for an import under way in another thread
    with _lock:
        if not _pinned:
            torch.set_num_threads(1)
            _pinned = True
