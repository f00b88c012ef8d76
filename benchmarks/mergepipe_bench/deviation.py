"""Relative L2 deviation between two checkpoints with the same tensors, streamed tensor by tensor."""

from __future__ import annotations

import math
import os

from mergepipe.storage.checkpoint import open_checkpoint
from mergepipe.storage.safetensors_format import to_float32
from mergepipe.storage.storage import open_reader


def relative_l2(candidate: str | os.PathLike[str], reference: str | os.PathLike[str]) -> float:
    """||candidate - reference||_2 / ||reference||_2 over all tensors (float32 math)."""
    num, den = l2_distance(candidate, reference)
    return num / den if den else 0.0


def l2_distance(candidate: str | os.PathLike[str], reference: str | os.PathLike[str]
                ) -> tuple[float, float]:
    """(||candidate - reference||_2, ||reference||_2) over all tensors."""
    a, b = open_checkpoint(candidate).by_name(), open_checkpoint(reference).by_name()
    if a.keys() != b.keys():
        missing = sorted(a.keys() ^ b.keys())[:3]
        raise ValueError(f"{candidate} and {reference} differ in tensors, e.g. {missing}")
    num = den = 0.0
    with open_reader() as reader:
        for name, tb in b.items():
            ta = a[name]
            if ta.shape != tb.shape:
                raise ValueError(f"{name}: shape {ta.shape} != {tb.shape}")
            xb = to_float32(reader.read(tb.file, tb.data_offset, tb.nbytes), tb.dtype)
            xa = to_float32(reader.read(ta.file, ta.data_offset, ta.nbytes), ta.dtype)
            num += float(xa.sub_(xb).double().square().sum())
            den += float(xb.double().square().sum())
    return math.sqrt(num), math.sqrt(den)
