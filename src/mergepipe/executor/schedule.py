"""The block schedule: base blocks in checkpoint order, grouped in chunks with their byte ranges."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from mergepipe.catalog.models import BlockRow
from mergepipe.executor.prepare import Prepared
from mergepipe.executor.reads import Range
from mergepipe.storage.grid import is_element_grid, unit_numel
from mergepipe.storage.locations import is_url


@dataclass
class Step:
    """One base block and the expert positions whose block is read for it."""

    tensor: str
    block_index: int
    row_start: int  # grid units (rows, or elements of a tensor cut into element ranges)
    row_end: int
    experts: set[int]
    last_of_tensor: list[int]  # LoRA experts whose lora_A can be dropped after this block
    flat_start: int = 0  # flat index of the block's first element
    shape: tuple[int, ...] = ()  # the block's shape: (rows, *row shape), or (elements,)
    # a whole untouched one-block tensor, never read: the output is this base block's bytes,
    # copied by the kernel and verified against its catalogued hash (executor.kernel_copy)
    copy_from: BlockRow | None = None
    read_base: bool = True  # False exactly when copy_from is set


def schedule(prep: Prepared, chunk_bytes: int) -> tuple[list[list[Step]], list[list[Range]]]:
    """Steps in checkpoint order grouped into chunks, with the byte ranges each chunk needs."""
    base = prep.base
    sel_index: dict[tuple[int, str], dict[int, BlockRow]] = {
        k: {b.block_index: b for b in v} for k, v in prep.selected.items()}
    by_tensor: dict[str, list[int]] = {}
    for i, tensor in prep.selected:
        by_tensor.setdefault(tensor, []).append(i)
    steps: list[list[Step]] = []
    chunks: list[list[Range]] = []
    cur_steps: list[Step] = []
    cur_ranges: list[Range] = []
    cur_bytes = 0
    whole = prep.plan.request.whole_tensor
    for t in base.tensors.values():
        positions = sorted(by_tensor.get(t.name, []))
        last = {i: max(sel_index[(i, t.name)]) for i in positions}
        first = {i: min(sel_index[(i, t.name)]) for i in positions}
        blocks = base.tensor_blocks(t.name)
        # the output block is the base's bytes where no expert block is read (not so under
        # mergekit's arithmetic, which runs every block through the operator)
        same_dtype = (prep.out_dtype or t.dtype) == t.dtype and not prep.mergekit_arith
        units = blocks[-1].row_end
        per_unit = unit_numel(t.shape, units)
        flat = is_element_grid(t.shape, units) or len(t.shape) <= 1
        for bblk in blocks:
            bi = bblk.block_index
            path = base.file_path(bblk.file_index)
            untouched = same_dtype and not positions and len(blocks) == 1 and not is_url(path)
            ranges = [] if untouched else [Range(("b", t.name, bi), path, bblk.byte_offset,
                                                 bblk.nbytes, False,
                                                 partial(base.verify_block, bblk))]
            readers = set()
            for i in positions:
                eblk = sel_index[(i, t.name)].get(bi)
                if eblk is None:
                    continue
                e = prep.experts[i]
                readers.add(i)
                ranges.append(Range(("e", i, t.name, bi), e.file_path(eblk.file_index),
                                    eblk.byte_offset, eblk.nbytes, True,
                                    partial(e.verify_block, eblk)))
                lora_a = e.tensors[t.name].lora_a
                if e.kind == "lora" and lora_a is not None and bi == first[i]:
                    ranges.append(Range(("a", i, t.name), e.file_path(lora_a.file_index),
                                        lora_a.offset, lora_a.nbytes, True,
                                        partial(e.verify_lora_a, t.name, lora_a)))
            n = bblk.row_end - bblk.row_start
            step = Step(t.name, bi, bblk.row_start, bblk.row_end, readers,
                        [i for i in positions if last[i] == bi], bblk.row_start * per_unit,
                        ((n,) if flat else (n, *t.shape[1:])) if t.shape else (),
                        bblk if untouched else None, not untouched)
            cur_steps.append(step)
            cur_ranges.extend(ranges)
            cur_bytes += sum(r.nbytes for r in ranges)
            # a whole-tensor operator gets each tensor's blocks in one chunk (executor.torch_path)
            if cur_bytes >= chunk_bytes and (whole is None or bblk is blocks[-1]):
                steps.append(cur_steps)
                chunks.append(cur_ranges)
                cur_steps, cur_ranges, cur_bytes = [], [], 0
    if cur_steps:
        steps.append(cur_steps)
        chunks.append(cur_ranges)
    return steps, chunks
