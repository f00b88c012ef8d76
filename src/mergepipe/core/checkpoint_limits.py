"""Caps on what a checkpoint may claim: file size, tensors per file, elements per tensor, blocks.

A header or a size answer is a claim, checked against these before anything is built from it,
so that a lie (one tensor of 2**60 elements in a sparse file, a HEAD answering 2**62 bytes)
costs a 4xx and constant memory. The defaults are far above any real checkpoint; the settings
set them (MERGEPIPE_MAX_FILE_BYTES, MERGEPIPE_MAX_TENSORS_PER_FILE,
MERGEPIPE_MAX_TENSOR_ELEMENTS, MERGEPIPE_MAX_BLOCKS) and `install` makes them the process's
at start-up, for every store (local, S3, HTTP).
"""

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
