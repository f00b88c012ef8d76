"""Merge the blocks of a chunk: decode, form each expert's delta by storage kind, apply the operator, encode."""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable, Mapping

import torch

from mergepipe.catalog.lora import lora_delta
from mergepipe.catalog.safetensors_format import TensorEntry, decode_into, to_float32
from mergepipe.catalog.scan import BlockScan, TensorPlan, scan_full_block, untouched_scan
from mergepipe.catalog.stats import NonFiniteDelta
from mergepipe.core.dtypes import DTYPE_SIZES
from mergepipe.core.errors import InvalidCheckpoint
from mergepipe.core.operators import BlockContext, ExpertBlock, fused
from mergepipe.core.operators.keyed_hash import expert_key
from mergepipe.executor import tensors
from mergepipe.executor.prepare import Prepared
from mergepipe.executor.schedule import Step
from mergepipe.executor.sources import ModelSource
from mergepipe.executor.writer import TORCH_DTYPES, encode

# One merged block: (tensor, flat index of its first element, output bytes (None: a base block
# never read, see Step.read_base), the first scan pass over it or None).
MergedBlock = tuple[str, int, memoryview | None, BlockScan | None]


class ChunkMerger:
    """Turns the base and expert pieces of a chunk into output bytes (thread-safe per chunk).

    With `first_pass`, each output block also gets ingestion's first scan pass (content hash,
    delta statistics against the base, threshold histogram), computed from the same bytes
    the scan of the written file would read (see `output_plans`).
    """

    def __init__(self, prep: Prepared, *, first_pass: bool = False) -> None:
        self.prep = prep
        self.output_plans = output_plans(prep) if first_pass else None
        self.req = prep.plan.request
        self.op = self.req.spec.kernel
        self.weights = tuple(self.req.weights())
        self.densities = self.req.densities()
        # per-tensor parameters: tensor -> (weights, densities) where some expert's differ
        self.per_tensor: dict[str, tuple[tuple[float, ...], list[float]]] = {}
        for (model, tensor), v in prep.plan.tensor_params.items():
            w, d = self.per_tensor.setdefault(tensor, (self.weights, list(self.densities)))
            i = next(i for i, e in enumerate(self.req.experts) if e.model == model)
            self.per_tensor[tensor] = (w[:i] + (v.get("weight", w[i]),) + w[i + 1:], d)
            d[i] = v.get("density", d[i])
        self.lora_a: dict[tuple[int, str], torch.Tensor] = {}
        self.keys: dict[tuple[int, str], int] = {}
        self.expert_blocks = 0
        # mergekit arithmetic: the kernels see the experts' own values and every block runs
        self.mk_arith = prep.mergekit_arith
        self.whole = self.req.whole_tensor is not None  # one kernel call per tensor
        # the one-pass C kernels (core/operators/fused.py) where they cover the operator
        self.fused = None if self.mk_arith or self.whole else fused.op_name(self.op)

    def input_dtype(self, tensor: str) -> str:
        """The promoted dtype of the base's and the full experts' tensor (mergekit's compute
        dtype when a config gives none), as a torch name."""
        dt = TORCH_DTYPES[self.prep.base.tensors[tensor].dtype]
        for e in self.prep.experts:
            if e.kind == "full":
                dt = torch.promote_types(dt, TORCH_DTYPES[e.tensors[tensor].dtype])
        return str(dt).removeprefix("torch.")

    def load_lora_a(self, data: Mapping[Hashable, memoryview]) -> None:
        """Decode the lora_A matrices read with this chunk (in the reading order)."""
        for key, raw in data.items():
            if isinstance(key, tuple) and key[0] == "a":
                _, i, tensor = key
                spec = self.prep.experts[i].tensors[tensor].lora_a
                assert spec is not None
                self.lora_a[(i, tensor)] = _decode(raw, spec.dtype, spec.shape)

    def release(self, chunk_steps: list[Step]) -> None:
        """Drop what the finished chunk was the last to need; count its expert blocks."""
        for st in chunk_steps:
            self.expert_blocks += len(st.experts)
            for i in st.last_of_tensor:
                self.lora_a.pop((i, st.tensor), None)

    def merge_chunk(self, chunk_steps: list[Step], data: Mapping[Hashable, memoryview]
                    ) -> list[MergedBlock]:
        """The merged block of every step of the chunk, in order."""
        if self.whole:
            return [self.scan_step(st, data, m)
                    for st, m in zip(chunk_steps, self.merge_tensors(chunk_steps, data),
                                     strict=True)]
        return [self.scan_step(st, data, self.merge_step(st, data)) for st in chunk_steps]

    def scan_step(self, st: Step, data: Mapping[Hashable, memoryview],
                  out: tuple[str, int, memoryview | None]) -> MergedBlock:
        """The output block with its first scan pass (None: not wanted, or a non-finite delta
        that the scan of the file reports)."""
        if self.output_plans is None:
            return (*out, None)
        if out[2] is None:  # the base's bytes, not read: their statistics are the base's
            blk = self.prep.base.blocks[(st.tensor, st.block_index)]
            return (*out, untouched_scan(self.output_plans[st.tensor], st.block_index,
                                         blk.content_hash))
        base_raw = data[("b", st.tensor, st.block_index)]
        # the base's own bytes: their content hash is the catalog's (checked when read)
        digest = (self.prep.base.blocks[(st.tensor, st.block_index)].content_hash
                  if out[2] is base_raw else None)
        try:
            scan = scan_full_block(self.output_plans[st.tensor], st.block_index, out[2],
                                   base_raw, digest)
        except NonFiniteDelta:
            scan = None
        return (*out, scan)

    def merge_step(self, st: Step, data: Mapping[Hashable, memoryview]
                   ) -> tuple[str, int, memoryview | None]:
        if not st.read_base:
            return st.tensor, st.flat_start, None
        t = self.prep.base.tensors[st.tensor]
        out_dtype = self.prep.out_dtype or t.dtype
        base_raw = data[("b", st.tensor, st.block_index)]
        if not st.experts and out_dtype == t.dtype and not self.mk_arith:
            return st.tensor, st.flat_start, base_raw  # nothing to add: the base's bytes
        if self.fused and st.experts:
            out = self.fused_step(st, data, t.dtype, out_dtype)
            if out is not None:
                return st.tensor, st.flat_start, out
        b32 = _decode(base_raw, t.dtype, st.shape)
        if not st.experts and not self.mk_arith:
            return st.tensor, st.flat_start, encode(b32, out_dtype)
        blocks, ctx = self.step_inputs(st, data, b32)
        return st.tensor, st.flat_start, encode(self.op(b32, blocks, ctx), out_dtype)

    def merge_tensors(self, chunk_steps: list[Step], data: Mapping[Hashable, memoryview]
                      ) -> list[tuple[str, int, memoryview | None]]:
        """Every block of a chunk of whole tensors, each tensor by one kernel call."""
        out: list[tuple[str, int, memoryview | None]] = []
        for steps in tensors.by_tensor(chunk_steps):
            t = self.prep.base.tensors[steps[0].tensor]
            inputs = []
            for st in steps:
                b32 = _decode(data[("b", st.tensor, st.block_index)], t.dtype, st.shape)
                inputs.append((b32, *self.step_inputs(st, data, b32)))
            merged = tensors.merge_tensor(self.op, t.shape, inputs)
            out_dtype = self.prep.out_dtype or t.dtype
            out.extend((st.tensor, st.flat_start, encode(m, out_dtype))
                       for st, m in zip(steps, merged, strict=True))
        return out

    def fused_step(self, st: Step, data: Mapping[Hashable, memoryview], base_dtype: str,
                   out_dtype: str) -> memoryview | None:
        """The output bytes of a step by the fused kernel, or None (the torch kernels then)."""
        weights, densities = self.per_tensor.get(st.tensor, (self.weights, self.densities))
        experts = []
        for i, spec in enumerate(self.req.experts):
            if i not in st.experts:
                continue
            e = self.prep.experts[i]
            raw: object = data[("e", i, st.tensor, st.block_index)]
            dtype = e.tensors[st.tensor].dtype
            if e.kind == "lora":  # the delta by torch (the same matmul), then the kernel
                b_shape = tuple(st.shape)
                d = _delta(e, i, st, torch.empty(b_shape), data, self.lora_a)
                raw, dtype = d.reshape(-1).numpy(), "F32"
            elif e.kind not in ("full", "delta"):
                return None
            experts.append(fused.FusedExpert(
                raw, dtype, e.kind == "full", weights[i],
                self.prep.plan.trims.get((spec.model, st.tensor)), self._key(i, st.tensor),
                densities[i]))
        ctx = BlockContext(tensor=st.tensor, block_index=st.block_index,
                           flat_offset=st.flat_start, params=self.req.params,
                           all_weights=weights, input_dtype=self.input_dtype(st.tensor))
        numel = math.prod(st.shape)
        assert self.fused is not None
        return fused.merge_block(self.fused, data[("b", st.tensor, st.block_index)],
                                 base_dtype, experts, ctx, out_dtype, numel)

    def _key(self, i: int, tensor: str) -> int:
        key = self.keys.get((i, tensor))
        if key is None:
            key = self.keys[(i, tensor)] = expert_key(self.req.seed, self.req.experts[i].model,
                                                      tensor)
        return key

    def step_inputs(self, st: Step, data: Mapping[Hashable, memoryview], b32: torch.Tensor
                    ) -> tuple[list[ExpertBlock], BlockContext]:
        """The operator's view of every expert's block of a step, and the block's context."""
        blocks = []
        weights, densities = self.per_tensor.get(st.tensor, (self.weights, self.densities))
        for i, spec in enumerate(self.req.experts):
            delta = value = None
            if i in st.experts:
                if self.mk_arith and self.prep.experts[i].kind == "full":
                    value, delta = _value_and_delta(self.prep.experts[i], i, st, b32, data)
                else:
                    delta = _delta(self.prep.experts[i], i, st, b32, data, self.lora_a)
            key = self._key(i, st.tensor)
            blocks.append(ExpertBlock(
                index=i, model=spec.model, delta=delta, weight=weights[i],
                density=densities[i],
                trim=self.prep.plan.trims.get((spec.model, st.tensor)), key=key, value=value))
        ctx = BlockContext(tensor=st.tensor, block_index=st.block_index,
                           flat_offset=st.flat_start, params=self.req.params,
                           all_weights=weights, input_dtype=self.input_dtype(st.tensor))
        return blocks, ctx


def output_plans(prep: Prepared) -> dict[str, TensorPlan]:
    """The scan plan of each output tensor as registering the output makes it: kind full, on
    the base's grid, against the base (the output file's location is filled in then)."""
    plans = {}
    for t in prep.base.tensors.values():
        dtype = prep.out_dtype or t.dtype
        blocks = prep.base.tensor_blocks(t.name)
        numel = 1
        for d in t.shape:
            numel *= d
        plans[t.name] = TensorPlan(
            t.name, "full", TensorEntry(t.name, dtype, t.shape, "", 0, numel * DTYPE_SIZES[dtype]),
            [(b.row_start, b.row_end) for b in blocks],
            base=TensorEntry(t.name, t.dtype, t.shape, prep.base.file_path(t.file_index),
                             t.data_offset, t.nbytes),
            base_hashes=[b.content_hash for b in blocks])
    return plans


def _decode(raw: memoryview, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Raw bytes -> a float32 tensor of `shape` that owns its memory."""
    if raw.nbytes == 0:
        return torch.zeros(shape, dtype=torch.float32)
    return to_float32(raw, dtype, shape)  # bf16 widened by a shift: exact, several times faster


class _Deltas(threading.local):
    """Each compute thread's float32 delta buffers, one per expert position, reused block after
    block (the operators never return or keep them)."""

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
    """A full expert's block widened exactly to float32, and its float32 delta (new tensors:
    mergekit arithmetic needs both)."""
    raw = data[("e", i, st.tensor, st.block_index)]
    if raw.nbytes == 0:
        return b32.clone(), torch.zeros_like(b32)
    value = decode_into(raw, e.tensors[st.tensor].dtype,
                        torch.empty(b32.numel(), dtype=torch.float32)).view(b32.shape)
    return value, value - b32


def _delta(e: ModelSource, i: int, st: Step, b32: torch.Tensor,
           data: Mapping[Hashable, memoryview], lora_a: dict[tuple[int, str], torch.Tensor]
           ) -> torch.Tensor:
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
        return _decode(raw, info.dtype, tuple(b32.shape))
    if e.kind == "lora":
        a = lora_a[(i, st.tensor)]
        rows = st.row_end - st.row_start
        b_rows = _decode(raw, info.dtype, (rows, info.shape[1]))
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
