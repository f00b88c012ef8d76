"""Merge a chunk's blocks: by the fused C kernels where they cover them, else by torch."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING

from mergepipe.catalog.scan import BlockScan, TensorPlan, scan_full_block, untouched_scan
from mergepipe.catalog.stats import NonFiniteDelta
from mergepipe.core.operators import BlockContext, fused
from mergepipe.core.operators.keyed_hash import expert_key
from mergepipe.core.tensor_params import SHARED_PARAMS
from mergepipe.core.vocab import DTYPE_SIZES, HF_DTYPE_NAMES
from mergepipe.executor.prepare import Prepared
from mergepipe.executor.schedule import Step
from mergepipe.storage.safetensors_format import TensorEntry

if TYPE_CHECKING:
    import torch

# One merged block: (tensor, flat index of its first element, output bytes (None: a base block
# never read, see Step.read_base), the first scan pass over it or None).
MergedBlock = tuple[str, int, memoryview | None, BlockScan | None]


class ChunkMerger:
    """Turns the base and expert pieces of a chunk into output bytes (thread-safe per chunk)."""

    def __init__(self, prep: Prepared, *, first_pass: bool = False) -> None:
        self.prep = prep
        self.output_plans = output_plans(prep) if first_pass else None
        self.req = prep.plan.request
        self.op = self.req.spec.kernel
        self.weights = tuple(self.req.weights())
        self.densities = self.req.densities()
        # per-tensor parameters: tensor -> (weights, densities) where some expert's differ
        self.per_tensor: dict[str, tuple[tuple[float, ...], list[float]]] = {}
        # shared per-tensor parameters (slerp's t): tensor -> the global params it overrides
        self.shared: dict[str, dict[str, float]] = {}
        for (model, tensor), v in prep.plan.tensor_params.items():
            over = {k: v[k] for k in SHARED_PARAMS if k in v}
            if over:
                self.shared.setdefault(tensor, {}).update(over)
            w, d = self.per_tensor.setdefault(tensor, (self.weights, list(self.densities)))
            i = next(i for i, e in enumerate(self.req.experts) if e.model == model)
            self.per_tensor[tensor] = (w[:i] + (v.get("weight", w[i]),) + w[i + 1:], d)
            d[i] = v.get("density", d[i])
        self.lora_a: dict[tuple[int, str], torch.Tensor] = {}  # LoRA only: torch loaded
        self.keys: dict[tuple[int, str], int] = {}
        self.expert_blocks = 0
        # mergekit arithmetic: the kernels see the experts' own values and every block runs
        self.mk_arith = prep.mergekit_arith
        self.whole = self.req.whole_tensor is not None  # one kernel call per tensor
        # the one-pass C kernels (core/operators/fused.py) where they cover the operator
        self.fused = (None if self.mk_arith or self.whole or not fused.available()
                      or self.req.spec.fused is None else self.req.spec)

    def input_dtype(self, tensor: str) -> str:
        """The promoted dtype of the base's and full experts' tensor, as a torch name: the
        base's where every full expert's is the same, else F32 (F32 with anything, and F16
        with BF16)."""
        dt = "F32" if tensor in self.prep.promoted else self.prep.base.tensors[tensor].dtype
        return HF_DTYPE_NAMES[dt]

    def load_lora_a(self, data: Mapping[Hashable, memoryview]) -> None:
        """Decode the lora_A matrices read with this chunk (in the reading order)."""
        for key, raw in data.items():
            if isinstance(key, tuple) and key[0] == "a":
                _, i, tensor = key
                spec = self.prep.experts[i].tensors[tensor].lora_a
                assert spec is not None
                from mergepipe.executor import torch_path

                self.lora_a[(i, tensor)] = torch_path.decode(raw, spec.dtype, spec.shape)

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
            from mergepipe.executor import torch_path

            return [self.scan_step(st, data, m) for st, m in
                    zip(chunk_steps, torch_path.merge_tensors(self, chunk_steps, data),
                        strict=True)]
        return [self.scan_step(st, data, self.merge_step(st, data)) for st in chunk_steps]

    def scan_step(self, st: Step, data: Mapping[Hashable, memoryview],
                  out: tuple[str, int, memoryview | None]) -> MergedBlock:
        """The output block with its first scan pass (None: not wanted, or a non-finite delta)."""
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
        from mergepipe.executor import torch_path

        return st.tensor, st.flat_start, torch_path.merge_step(self, st, data, t.dtype, out_dtype)

    def fused_step(self, st: Step, data: Mapping[Hashable, memoryview], base_dtype: str,
                   out_dtype: str) -> memoryview | None:
        """The output bytes of a step by the fused kernel, or None (the torch kernels then)."""
        weights, densities = self.params_of(st.tensor)
        experts = []
        for i, spec in enumerate(self.req.experts):
            if i not in st.experts:
                continue
            e = self.prep.experts[i]
            raw: object = data[("e", i, st.tensor, st.block_index)]
            dtype = e.tensors[st.tensor].dtype
            if e.kind == "lora":  # the delta by torch (the same matmul), then the kernel
                from mergepipe.executor import torch_path

                raw, dtype = torch_path.lora_delta_f32(self, i, st, data), "F32"
            elif e.kind not in ("full", "delta"):
                return None
            experts.append(fused.FusedExpert(
                raw, dtype, e.kind == "full", weights[i],
                self.prep.plan.trims.get((spec.model, st.tensor)), self.key(i, st.tensor),
                densities[i]))
        assert self.fused is not None
        return fused.merge_block(self.fused, data[("b", st.tensor, st.block_index)],
                                 base_dtype, experts, self.context(st, weights), out_dtype,
                                 math.prod(st.shape))

    def params_of(self, tensor: str) -> tuple[tuple[float, ...], list[float]]:
        return self.per_tensor.get(tensor, (self.weights, self.densities))

    def context(self, st: Step, weights: tuple[float, ...]) -> BlockContext:
        over = self.shared.get(st.tensor)
        return BlockContext(tensor=st.tensor, block_index=st.block_index,
                            flat_offset=st.flat_start,
                            params={**self.req.params, **over} if over else self.req.params,
                            all_weights=weights, input_dtype=self.input_dtype(st.tensor))

    def key(self, i: int, tensor: str) -> int:
        key = self.keys.get((i, tensor))
        if key is None:
            key = self.keys[(i, tensor)] = expert_key(self.req.seed, self.req.experts[i].model,
                                                      tensor)
        return key


def output_plans(prep: Prepared) -> dict[str, TensorPlan]:
    """Each output tensor's scan plan as registering the output makes it (full, base's grid)."""
    plans = {}
    for t in prep.base.tensors.values():
        dtype = prep.out_dtype or t.dtype
        blocks = prep.base.tensor_blocks(t.name)
        numel = math.prod(t.shape)
        plans[t.name] = TensorPlan(
            t.name, "full", TensorEntry(t.name, dtype, t.shape, "", 0, numel * DTYPE_SIZES[dtype]),
            [(b.row_start, b.row_end) for b in blocks],
            base=TensorEntry(t.name, t.dtype, t.shape, prep.base.file_path(t.file_index),
                             t.data_offset, t.nbytes),
            base_hashes=[b.content_hash for b in blocks])
    return plans
