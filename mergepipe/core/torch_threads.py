"""Pin torch to one intra-op thread, once per process: our own workers give the parallelism."""

from __future__ import annotations

import threading

import torch

_lock = threading.Lock()
_pinned = False


def pin_torch_threads() -> None:
    """torch's intra-op threads on top of our read, scan and merge threads oversubscribe the
    cores (block-sized ops run ~10x slower here); set one thread for the rest of the process.
    Never restored: two jobs in one process would otherwise undo each other's setting."""
    global _pinned
    with _lock:
        if not _pinned:
            torch.set_num_threads(1)
            _pinned = True
