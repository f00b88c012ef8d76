"""Caps on what a checkpoint may claim (file size, tensors per file, elements per tensor, blocks),
checked before anything is built from a header or a size answer, so that a lie costs a 4xx and
constant memory. The settings set them (MERGEPIPE_MAX_*) and `install` makes them the process's."""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class CheckpointLimits:
    # one safetensors file (shards of real checkpoints are 2-10 GB; the largest single files
    # a few hundred GB)
    max_file_bytes: int = 1 << 40
    # tensors in one file (real shards: a few thousand at most)
    max_tensors_per_file: int = 65_536
    # elements of one tensor (the largest real ones, fused MoE experts: about 2**34)
    max_tensor_elements: int = 1 << 38
    # blocks of one model, all tensors together (each becomes a catalog row; at the default
    # 1 MiB block, 4 TiB of weights)
    max_blocks: int = 1 << 22


_lock = threading.Lock()
_current = CheckpointLimits()


def install(limits: CheckpointLimits) -> CheckpointLimits:
    """Make `limits` the process's (start-up); the ones they replace."""
    global _current
    with _lock:
        old, _current = _current, limits
    return old


def current() -> CheckpointLimits:
    """The process's caps (the defaults until `install`)."""
    return _current
