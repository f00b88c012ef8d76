"""Whole-tensor kernels: the blocks of one tensor joined, one kernel call, the result cut back."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from mergepipe.core.operators import BlockContext, ExpertBlock, Operator

if TYPE_CHECKING:
    from mergepipe.executor.schedule import Step

# one step's inputs: the base block (float32), every expert's view of it, the block's context
StepInputs = tuple[torch.Tensor, list[ExpertBlock], BlockContext]


def by_tensor(steps: Sequence[Step]) -> Iterator[list[Step]]:
    """The steps of a chunk grouped by tensor, in order (each group a whole tensor)."""
    group: list[Step] = []
    for st in steps:
        if group and st.tensor != group[0].tensor:
            yield group
            group = []
        group.append(st)
    if group:
        yield group


def merge_tensor(op: Operator, shape: Sequence[int], inputs: list[StepInputs]
                 ) -> list[torch.Tensor]:
    """The kernel on the whole tensor joined from its blocks; the float32 output per block."""
    bases = [b for b, _, _ in inputs]
    base = _join(bases, shape)
    experts = [_join_expert([blocks[i] for _, blocks, _ in inputs], bases, shape)
               for i in range(len(inputs[0][1]))]
    ctx = replace(inputs[0][2], block_index=0, flat_offset=0, whole_tensor=True)
    shapes = [b.shape for b in bases]
    inputs.clear()
    del bases
    merged = op(base, experts, ctx).reshape(-1)
    out, start = [], 0
    for s in shapes:
        n = math.prod(s)
        out.append(merged[start:start + n].reshape(s))
        start += n
    return out


def _join(parts: list[torch.Tensor], shape: Sequence[int]) -> torch.Tensor:
    if len(parts) == 1:
        return parts[0].reshape(tuple(shape))
    return torch.cat([p.reshape(-1) for p in parts]).reshape(tuple(shape))


def _join_expert(blocks: list[ExpertBlock], bases: list[torch.Tensor], shape: Sequence[int]
                 ) -> ExpertBlock:
    """One expert's whole tensor: its blocks read, the base's where a block was not read (a
    zero delta). `delta` None: no block of the tensor was read."""
    first = blocks[0]
    if all(e.delta is None for e in blocks):
        return first
    deltas = [e.delta if e.delta is not None else torch.zeros_like(b)
              for e, b in zip(blocks, bases, strict=True)]
    value = None
    if any(e.value is not None for e in blocks):
        value = _join([e.value if e.value is not None else (b + d if e.delta is not None else b)
                       for e, b, d in zip(blocks, bases, deltas, strict=True)], shape)
    return replace(first, delta=_join(deltas, shape), value=value)
