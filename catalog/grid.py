"""The block grid: contiguous row ranges of about `block_bytes` per tensor, taken from the base."""

from __future__ import annotations

DEFAULT_BLOCK_BYTES = 1 << 20


def block_rows(shape: tuple[int, ...], itemsize: int, block_bytes: int) -> list[tuple[int, int]]:
    """Row ranges [start, end) of each block; a 0-D/1-D tensor or a small one is one block."""
    if len(shape) <= 1:
        return [(0, shape[0] if shape else 1)]
    rows = shape[0]
    row_bytes = itemsize
    for d in shape[1:]:
        row_bytes *= d
    if rows == 0 or rows * row_bytes <= block_bytes:
        return [(0, rows)]
    per_block = max(1, block_bytes // max(row_bytes, 1))
    n_blocks = -(-rows // per_block)
    # Balance the rows so that blocks are of (nearly) equal size: greedy by utility per byte is
    # then optimal, and no tiny tail block is left.
    bounds = [rows * i // n_blocks for i in range(n_blocks + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))
