"""The one-pass C kernels (core/operators/fused.py) give byte for byte what the torch kernels
and the writer's encode give, over operator x dtype x storage kind, special values included;
and the first pass's |delta| and histogram (core/delta_kernels.py) equal torch's and numpy's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mergepipe.catalog.stats import Scratch, scan_block
from mergepipe.core import delta_kernels
from mergepipe.core.operators import REGISTRY, BlockContext, ExpertBlock, fused
from mergepipe.core.operators.spec import FusedKernel
from mergepipe.executor.writer import encode
from mergepipe.storage.safetensors_format import to_float32, torch_dtype
from tests.operator_helpers import exact_trim

needs_kernels = pytest.mark.skipif(not fused.available(), reason="MERGEPIPE_NO_FUSED is set")


def test_the_extension_is_built() -> None:
    """setup.py compiles it at install; optional only so that installs without a compiler work."""
    import importlib

    assert importlib.import_module("mergepipe.core._fused").ties is not None

# the operators whose spec names a fused kernel, and their torch kernels
KERNELS = {s.name: s.kernel for s in REGISTRY.values() if s.fused is not None}


def test_the_fused_kernel_is_a_field_of_each_spec() -> None:
    """Which C kernel serves an operator is said by its spec (no table beside the registry)."""
    assert {s.name: s.fused for s in REGISTRY.values() if s.fused is not None} == {
        "linear": FusedKernel("linear"), "task_arithmetic": FusedKernel("linear"),
        "dare_linear": FusedKernel("linear", drop=True), "ties": FusedKernel("ties"),
        "dare_ties": FusedKernel("ties", drop=True)}
    assert not hasattr(fused, "FUSED_OPS") and not hasattr(fused, "op_name")
N = 1537  # three tiles and a ragged end


def special(n: int, seed: int, dtype: str = "F32") -> torch.Tensor:
    """float32 values with the cases encode and the float ops must get right: -0.0, subnormals
    of float32 and of float16, bf16 / fp16 rounding ties (exact halfway values), overflow."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * 0.05
    odd = torch.tensor([-0.0, 0.0, 1e-40, -3e-39, 6e-8, -6e-8, 3e-5,
                        1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, -(1.0 + 2.0**-8), 1.0 + 2.0**-11,
                        1.0 + 3 * 2.0**-11, 65504.0, 65520.0, -65536.0, 3.0e38, -3.3e38])
    x[:odd.numel()] = odd
    x[n // 2:n // 2 + odd.numel()] = odd.flip(0)
    return x.clamp(-65504, 65504) if dtype == "F16" else x  # F16 inputs: no infinities


def as_raw(t: torch.Tensor, dtype: str) -> bytes:
    return t.to(torch_dtype(dtype)).contiguous().view(torch.uint8).numpy().tobytes()


def inputs(base_dtype: str, exp_dtype: str, kind: str, k: int, seed: int):
    b = special(N, seed, base_dtype)
    braw = as_raw(b, base_dtype)
    b32 = to_float32(bytearray(braw), base_dtype)
    experts = []
    for i in range(k):
        step = special(N, seed + 10 + i, exp_dtype)[torch.randperm(N, generator=torch.Generator()
                                                         .manual_seed(seed + i))] * 0.1
        if kind == "full":
            raw = as_raw((b32 + step).clamp(-65504, 65504) if exp_dtype == "F16" else b32 + step,
                         exp_dtype)
            delta = to_float32(bytearray(raw), exp_dtype) - b32
        else:  # a delta checkpoint (or a LoRA delta, which reaches the kernel as float32)
            raw = as_raw(step, exp_dtype)
            delta = to_float32(bytearray(raw), exp_dtype)
        experts.append((raw, delta))
    return braw, b32, experts


CASES = [("linear", {}), ("linear", {"normalize": False, "lambda": 0.3}),
         ("linear", {"renormalize": "selected"}), ("task_arithmetic", {}),
         ("task_arithmetic", {"normalize": True, "lambda": 0.7}), ("ties", {}),
         ("ties", {"normalize": False, "lambda": 1.3}), ("dare_linear", {}),
         ("dare_linear", {"rescale": "none", "normalize": True}), ("dare_ties", {}),
         ("dare_ties", {"normalize": True, "lambda": 0.6, "rescale": "none"})]


@pytest.mark.parametrize("op,params", CASES)
@pytest.mark.parametrize("base_dtype,exp_dtype,out_dtype", [
    ("BF16", "BF16", "BF16"), ("F16", "F16", "F16"), ("F32", "F32", "F32"),
    ("BF16", "F32", "F16"), ("F16", "BF16", "BF16"), ("F32", "BF16", "BF16")])
@pytest.mark.parametrize("kind", ["full", "delta"])
@needs_kernels
def test_fused_block_equals_the_torch_kernel(op, params, base_dtype, exp_dtype, out_dtype, kind):
    k, weights, omitted = 3, (1.0, 0.3, 1.7), 1
    braw, b32, exps = inputs(base_dtype, exp_dtype, kind, k, seed=len(op) + len(params))
    compared = 0
    sparse = op in ("ties", "dare_linear", "dare_ties")
    for density in ((0.5, 0.2, 0.999, 1.0) if sparse else (1.0,)):
        ctx = BlockContext("t", 2, 4096, params=params, all_weights=weights)
        blocks, fe = [], []
        for i, (raw, delta) in enumerate(exps):
            trim = exact_trim(delta, density) if op == "ties" and density < 1 else None
            read = i != omitted
            blocks.append(ExpertBlock(i, f"e{i}", delta.clone() if read else None, weights[i],
                                      density, trim, 1000 + i))
            if read:
                fe.append(fused.FusedExpert(raw, exp_dtype, kind == "full", weights[i], trim,
                                            1000 + i, density))
        merged = KERNELS[op](b32.clone(), blocks, ctx)
        ref = encode(merged, out_dtype).tobytes()
        got = fused.merge_block(REGISTRY[op], braw, base_dtype, fe, ctx, out_dtype, N)
        assert (got is None) == bool(merged.isnan().any()), (op, params, density)
        assert got is None or got.tobytes() == ref, (op, params, density)
        compared += got is not None
    assert compared  # NaN-free cases were compared byte for byte


@pytest.mark.parametrize("op", sorted(KERNELS))
@pytest.mark.parametrize("out_dtype", ["BF16", "F16", "F32"])
@needs_kernels
def test_a_nan_in_the_output_hands_the_block_back(op, out_dtype):
    braw, b32, exps = inputs("F32", "F32", "full", 2, seed=3)
    b = np.frombuffer(bytearray(braw), dtype=np.float32).copy()
    b[7], b[900] = np.nan, np.inf
    fe = [fused.FusedExpert(raw, "F32", True, 1.0) for raw, _ in exps]
    ctx = BlockContext("t", 0, 0, all_weights=(1.0, 1.0))
    assert fused.merge_block(REGISTRY[op], b.tobytes(), "F32", fe, ctx, out_dtype, N) is None
    fe = [fused.FusedExpert(np.full(N, s * np.inf, dtype=np.float32).tobytes(), "F32", False, 1.0)
          for s in (1, -1)]
    assert fused.merge_block(REGISTRY[op], braw, "F32", fe, ctx, out_dtype, N) is None  # inf - inf


@pytest.mark.parametrize("dense", [True, False])
@pytest.mark.parametrize("weights", [(1.0,) * 4, (1.0, 0.3, 1.7, 1.0)])
@needs_kernels
def test_ties_tied_entries_follow_the_keyed_rule_at_any_offset(dense, weights):
    """bf16 deltas tie heavily at the threshold: the keyed draw decides, per flat index; the
    draws of every entry in a vector loop (x86-64-v4) or of the tied ones one by one."""
    from mergepipe.core import _fused  # type: ignore[attr-defined]

    was = _fused.dense_draws(dense)
    try:
        _check_tied_entries(weights)
    finally:
        _fused.dense_draws(was)


def _check_tied_entries(weights: tuple[float, ...]) -> None:
    g = torch.Generator().manual_seed(11)
    b32 = torch.randn(N, generator=g).to(torch.bfloat16).float()
    braw = as_raw(b32, "BF16")
    exps = []
    for _ in range(4):  # deltas a few bf16 ulps wide
        raw = as_raw(b32 + 0.01 * torch.randn(N, generator=g), "BF16")
        exps.append((raw, to_float32(bytearray(raw), "BF16") - b32))
    for offset in (0, 513, 2**40 + 7):
        ctx = BlockContext("t", 0, offset, all_weights=weights)
        trims = [exact_trim(d, 0.1) for _, d in exps]
        assert all(t.k < t.above + t.tied for t in trims)  # the keyed rule is exercised
        blocks = [ExpertBlock(i, "e", d.clone(), weights[i], 0.1, trims[i], 7 + i)
                  for i, (_, d) in enumerate(exps)]
        fe = [fused.FusedExpert(raw, "BF16", True, weights[i], trims[i], 7 + i)
              for i, (raw, _) in enumerate(exps)]
        ref = encode(KERNELS["ties"](b32.clone(), blocks, ctx), "BF16").tobytes()
        got = fused.merge_block(REGISTRY["ties"], braw, "BF16", fe, ctx, "BF16", N)
        assert got is not None and got.tobytes() == ref


@pytest.mark.parametrize("dtype,base_dtype", [("BF16", "BF16"), ("F16", "BF16"),
                                              ("F32", "F16"), ("BF16", None)])
@needs_kernels
def test_first_pass_abs_delta_and_histogram_equal_the_torch_passes(dtype, base_dtype):
    n = 3 * 8192 + 5
    own = as_raw(special(n, 1) + special(n, 2), dtype)
    x = to_float32(bytearray(own), dtype)
    base = None
    if base_dtype is not None:
        base = as_raw(special(n, 2), base_dtype)
        x = x - to_float32(bytearray(base), base_dtype)
    ref = x.abs()
    got = delta_kernels.abs_delta_into(np.empty(n, np.float32), own, dtype, base,
                                       base_dtype or "F32")
    assert np.array_equal(got.view(np.int32), ref.view(torch.int32).numpy())
    bits = ref.view(torch.int32)
    key = (bits >> 16) * 2 + (bits & 0xFFFF).clamp(max=1)
    counts = np.zeros(1 << 16, np.int64)
    buf = np.empty(n, np.int32)
    *_, k = delta_kernels.block_pass(ref.numpy(), counts, buf)
    assert np.array_equal(counts, torch.bincount(key, minlength=1 << 16).numpy())
    want = bits[(bits & 0xFFFF) != 0].numpy()
    assert np.array_equal(buf[:k], want)
    finite = torch.where(ref.isfinite(), ref, 0.0).numpy()  # the first pass refuses Inf
    saved, delta_kernels._fused = delta_kernels._fused, None  # scan_block's numpy passes
    try:
        ref_stats, ref_counts, ref_mixed = scan_block(finite, Scratch(), collect_mixed=True)
    finally:
        delta_kernels._fused = saved
    finite_bits = finite.view(np.int32)
    stats, hist, mixed = scan_block(finite, Scratch(), collect_mixed=True)
    wanted = finite_bits[(finite_bits & 0xFFFF) != 0]
    assert np.array_equal(mixed, wanted) if mixed is not None else wanted.size == 0
    assert stats.nnz == int((finite != 0).sum())
    assert stats == ref_stats and np.array_equal(hist, ref_counts)
    if mixed is None or ref_mixed is None:
        assert mixed is None and ref_mixed is None
    else:
        assert np.array_equal(mixed, ref_mixed)
