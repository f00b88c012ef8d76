"""The torch side of merging: a block, or a whole tensor, where the fused C kernels do not."""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import torch

from mergepipe.core.errors import InvalidCheckpoint
from mergepipe.core.operators import BlockContext, ExpertBlock, Operator
from mergepipe.core.operators.base import ReadExpert
from mergepipe.core.torch_threads import pin_torch_threads
from mergepipe.executor.writer import encode
from mergepipe.storage.lora import lora_delta
from mergepipe.storage.safetensors_format import decode_into, to_float32

if TYPE_CHECKING:
    from mergepipe.core.request import MergeRequest
    from mergepipe.executor.prepare import ModelSource, Prepared
    from mergepipe.executor.schedule import Step

pin_torch_threads()  # before the first kernel: our compute threads give the parallelism


class ChunkMerger(Protocol):
    """What the torch path reads of executor.blocks.ChunkMerger (which imports this module)."""

    prep: Prepared
    req: MergeRequest
    op: Any  # the request's kernel
    mk_arith: bool
    lora_a: dict[tuple[int, str], torch.Tensor]

    def params_of(self, tensor: str) -> tuple[tuple[float, ...], list[float]]: ...

    def key(self, i: int, tensor: str) -> int: ...

    def context(self, st: Step, weights: tuple[float, ...]) -> BlockContext: ...


def merge_step(m: ChunkMerger, st: Step, data: Mapping[Hashable, memoryview], dtype: str,
               out_dtype: str) -> memoryview:
    """The output bytes of one step by the torch kernels (`dtype`: the base tensor's)."""
    b32 = decode(data[("b", st.tensor, st.block_index)], dtype, st.shape)
    if not st.experts and not m.mk_arith:
        return encode(b32, out_dtype)
    blocks, ctx = step_inputs(m, st, data, b32)
    return encode(m.op(b32, blocks, ctx), out_dtype)


def merge_tensors(m: ChunkMerger, chunk_steps: list[Step], data: Mapping[Hashable, memoryview]
                  ) -> list[tuple[str, int, memoryview | None]]:
    """Every block of a chunk of whole tensors, each tensor by one kernel call."""
    out: list[tuple[str, int, memoryview | None]] = []
    for steps in by_tensor(chunk_steps):
        t = m.prep.base.tensors[steps[0].tensor]
        inputs = []
        for st in steps:
            b32 = decode(data[("b", st.tensor, st.block_index)], t.dtype, st.shape)
            inputs.append((b32, *step_inputs(m, st, data, b32)))
        merged = merge_tensor(m.op, t.shape, inputs)
        out_dtype = m.prep.out_dtype or t.dtype
        out.extend((st.tensor, st.flat_start, encode(x, out_dtype))
                   for st, x in zip(steps, merged, strict=True))
    return out


def step_inputs(m: ChunkMerger, st: Step, data: Mapping[Hashable, memoryview],
                b32: torch.Tensor) -> tuple[list[ExpertBlock], BlockContext]:
    """The operator's view of every expert's block of a step, and the block's context."""
    blocks = []
    weights, densities = m.params_of(st.tensor)
    for i, spec in enumerate(m.req.experts):
        delta = value = None
        if i in st.experts:
            if m.mk_arith and m.prep.experts[i].kind == "full":
                value, delta = _value_and_delta(m.prep.experts[i], i, st, b32, data)
            else:
                delta = expert_delta(m.prep.experts[i], i, st, b32, data, m.lora_a)
        kind: type[ExpertBlock] = ExpertBlock if delta is None else ReadExpert  # no copy later
        blocks.append(kind(
            index=i, model=spec.model, delta=delta, weight=weights[i], density=densities[i],
            trim=m.prep.plan.trims.get((spec.model, st.tensor)), key=m.key(i, st.tensor),
            value=value))
    return blocks, m.context(st, weights)


def lora_delta_f32(m: ChunkMerger, i: int, st: Step, data: Mapping[Hashable, memoryview]
                   ) -> object:
    """A LoRA expert's float32 delta of a step as a flat numpy array (for the fused kernels)."""
    d = expert_delta(m.prep.experts[i], i, st, torch.empty(tuple(st.shape)), data, m.lora_a)
    return d.reshape(-1).numpy()


decode = to_float32  # raw bytes -> a float32 tensor of `shape` that owns its memory


class _Deltas(threading.local):
    """Each compute thread's float32 delta buffers, one per expert, reused block after block."""

    def __init__(self) -> None:
        self.bufs: dict[int, torch.Tensor] = {}

    def get(self, i: int, numel: int) -> torch.Tensor:
        buf = self.bufs.get(i)
        if buf is None or buf.numel() < numel:
            buf = self.bufs[i] = torch.empty(max(numel, 1), dtype=torch.float32)
        return buf[:numel]


_deltas = _Deltas()


def _value_and_delta(e: ModelSource, i: int, st: Step, b32: torch.Tensor,
                     data: Mapping[Hashable, memoryview]) -> tuple[torch.Tensor, torch.Tensor]:
    """A full expert's block widened to float32, and its float32 delta (new tensors)."""
    value = decode(data[("e", i, st.tensor, st.block_index)], e.tensors[st.tensor].dtype,
                   tuple(b32.shape))
    return value, value - b32


def expert_delta(e: ModelSource, i: int, st: Step, b32: torch.Tensor,
                 data: Mapping[Hashable, memoryview],
                 lora_a: Mapping[tuple[int, str], torch.Tensor]) -> torch.Tensor:
    """The float32 delta of expert `e` for this block, by the expert's storage kind."""
    info = e.tensors[st.tensor]
    raw = data[("e", i, st.tensor, st.block_index)]
    if e.kind == "full":
        if raw.nbytes == 0:
            return torch.zeros_like(b32)
        # the expert widened exactly to float32 (bf16: by a shift), then minus the base: the
        # values torch.sub(expert, base) gives, without its slow mixed-dtype path
        out = decode_into(raw, info.dtype, _deltas.get(i, b32.numel()))
        return out.view(b32.shape).sub_(b32)
    if e.kind == "delta":
        return decode(raw, info.dtype, tuple(b32.shape))
    if e.kind == "lora":
        a = lora_a[(i, st.tensor)]
        rows = st.row_end - st.row_start
        b_rows = decode(raw, info.dtype, (rows, info.shape[1]))
        scale = info.lora_scale if info.lora_scale is not None else e.lora_scale
        if scale is None:
            raise InvalidCheckpoint(f"LoRA model {e.name!r}: tensor {st.tensor!r} has no scale "
                                    "in the catalog; re-ingest the adapter")
        d = lora_delta(b_rows, a, scale)  # bit-identical to the delta ingestion saw
        if tuple(d.shape) != tuple(b32.shape):
            raise InvalidCheckpoint(f"LoRA model {e.name!r}: tensor {st.tensor!r}: lora_B @ "
                                    f"lora_A is {list(d.shape)} for a base block of "
                                    f"{list(b32.shape)}")
        return d
    raise InvalidCheckpoint(f"model {e.name!r} has unknown kind {e.kind!r}")


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
    """One expert's whole tensor, the base's blocks where none was read (None: none read)."""
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
