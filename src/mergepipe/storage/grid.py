"""The block grid: contiguous ranges of about `block_bytes` per tensor, taken from the base.

A grid's units are the tensor's rows, or, for a 0-D/1-D tensor and for a tensor whose rows are
larger than a block, its elements (flat index): each block is one contiguous byte range either
way, and memory stays about a block whatever the shape. The catalog stores each block's
[row_start, row_end) in units; `unit_numel` recovers the unit from the shape and the grid.
"""

from __future__ import annotations

DEFAULT_BLOCK_BYTES = 1 << 20


def block_rows(shape: tuple[int, ...], itemsize: int, block_bytes: int) -> list[tuple[int, int]]:
    """Unit ranges [start, end) of each block; a small tensor is one block."""
    numel = 1
    for d in shape:
        numel *= d
    rows = shape[0] if len(shape) >= 2 else numel
    row_bytes = itemsize * (numel // rows if rows else 1)
    if row_bytes > block_bytes:  # rows larger than a block: cut into element ranges
        rows, row_bytes = numel, itemsize
    if rows == 0 or rows * row_bytes <= block_bytes:
        return [(0, rows)]
    per_block = max(1, block_bytes // max(row_bytes, 1))
    n_blocks = -(-rows // per_block)
    # Balance the rows so that blocks are of (nearly) equal size: greedy by utility per byte is
    # then optimal, and no tiny tail block is left.
    bounds = [rows * i // n_blocks for i in range(n_blocks + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def unit_numel(shape: tuple[int, ...], grid_units: int) -> int:
    """Elements per grid unit of a tensor whose grid ends at `grid_units` (its last row_end):
    a row's elements on a row grid, 1 on an element grid."""
    numel = 1
    for d in shape:
        numel *= d
    return numel // grid_units if grid_units else 1


def is_element_grid(shape: tuple[int, ...], grid_units: int) -> bool:
    """Whether a tensor of 2 or more dimensions is cut into element ranges, not rows."""
    return len(shape) >= 2 and grid_units != shape[0]
