"""The block grid: contiguous ranges of about `block_bytes` per tensor, taken from the base."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import overload

DEFAULT_BLOCK_BYTES = 1 << 20


class BlockGrid(Sequence[tuple[int, int]]):
    """Block i is [units * i // n, units * (i + 1) // n): nothing is stored per block."""

    __slots__ = ("n", "units")

    def __init__(self, units: int, n: int) -> None:
        self.units, self.n = units, n

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, i: int) -> tuple[int, int]: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[tuple[int, int]]: ...

    def __getitem__(self, i: int | slice) -> tuple[int, int] | Sequence[tuple[int, int]]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self.n))]
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(f"block {i} of a grid of {self.n}")
        return self.units * i // self.n, self.units * (i + 1) // self.n

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return (self[i] for i in range(self.n))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BlockGrid):
            return (self.units, self.n) == (other.units, other.n)
        if isinstance(other, Sequence):
            return len(other) == self.n and all(a == tuple(b) for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.units, self.n))

    def __repr__(self) -> str:
        return f"BlockGrid(units={self.units}, blocks={self.n})"


def block_rows(shape: tuple[int, ...], itemsize: int, block_bytes: int) -> BlockGrid:
    """Unit ranges [start, end) of each block; a small tensor is one block."""
    numel = math.prod(shape)
    rows = shape[0] if len(shape) >= 2 else numel
    row_bytes = itemsize * (numel // rows if rows else 1)
    if row_bytes > block_bytes:  # rows larger than a block: cut into element ranges
        rows, row_bytes = numel, itemsize
    if rows == 0 or rows * row_bytes <= block_bytes:
        return BlockGrid(rows, 1)
    per_block = max(1, block_bytes // max(row_bytes, 1))
    # Balance the rows so that blocks are of (nearly) equal size: greedy by utility per byte is
    # then optimal, and no tiny tail block is left.
    return BlockGrid(rows, -(-rows // per_block))


def unit_numel(shape: tuple[int, ...], grid_units: int) -> int:
    return math.prod(shape) // grid_units if grid_units else 1


def is_element_grid(shape: tuple[int, ...], grid_units: int) -> bool:
    """Whether a tensor of 2 or more dimensions is cut into element ranges, not rows."""
    return len(shape) >= 2 and grid_units != shape[0]
