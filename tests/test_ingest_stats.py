"""The exact trim thresholds (bit histograms, mixed entries, refinement levels) against sorting."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mergepipe.catalog import stats
from mergepipe.catalog.stats import Scratch, TrimThresholds, scan_block, trim_ks
from mergepipe.core import delta_kernels
from tests.ingest_reference import reference_trims


def thresholds(a: torch.Tensor, n_blocks: int, *, collect: bool = True,
               sort_small: bool = False) -> tuple[TrimThresholds, int]:
    """Run the histogram passes over |a| cut into n_blocks blocks; (result, passes)."""
    a = a.reshape(-1).abs().contiguous()
    blocks = [b.contiguous() for b in a.chunk(n_blocks)] if a.numel() else [a]
    tt = TrimThresholds(a.numel())
    scratch = Scratch()
    for b in blocks:
        _, counts, mixed = scan_block(b.numpy(), scratch,
                                      collect_mixed=collect and tt.collecting_mixed)
        tt.add(counts)
        tt.add_mixed(mixed)
    if sort_small:
        tt.solve_sorted(a.numpy())
    tt.finish_level()
    passes = 1
    while tt.pending:
        for b in blocks:
            tt.add(tt.block_counts(b.view(torch.int32).numpy(), scratch))
        tt.finish_level()
        passes += 1
    return tt, passes


def assert_exact(tt: TrimThresholds, a: torch.Tensor) -> None:
    tau, above, tied = reference_trims(a.reshape(-1).abs())
    assert tt.tau == tau
    assert tt.above == above
    assert tt.tied == tied


def bf16_delta(n: int, seed: int, rel: float = 0.01) -> torch.Tensor:
    """expert - base of bf16 weights (a few ulps; some exactly zero, some with many bits)."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, generator=g) * 0.02).to(torch.bfloat16)
    e = (w.float() + torch.randn(n, generator=g) * 0.02 * rel).to(torch.bfloat16)
    return e.float() - w.float()


@pytest.mark.parametrize("n_blocks", [1, 3, 16])
@pytest.mark.parametrize("collect", [True, False])
def test_bf16_deltas(n_blocks: int, collect: bool) -> None:
    d = bf16_delta(50_000, seed=n_blocks)
    tt, passes = thresholds(d, n_blocks, collect=collect)
    assert_exact(tt, d)
    if collect:
        assert passes == 1  # the kept mixed entries make level 0 exact
    else:
        assert passes >= 2


def test_fp32_deltas_need_every_level() -> None:
    """Mixed entries are everywhere in fp32: past the cap, levels 1 and 2 make it exact."""
    d = torch.randn(100_000, generator=torch.Generator().manual_seed(1))
    tt, passes = thresholds(d, 7)
    assert passes == 3
    assert_exact(tt, d)
    small, passes = thresholds(d[:20_000], 3)  # under the cap: exact from the kept entries
    assert passes == 1
    assert_exact(small, d[:20_000])


def test_mixed_cap_falls_back_to_refinement(monkeypatch) -> None:
    monkeypatch.setattr(stats, "MIXED_CAP", 10)
    d = bf16_delta(30_000, seed=2)
    tt, passes = thresholds(d, 5)
    assert passes >= 2
    assert_exact(tt, d)


@pytest.mark.parametrize("values", [
    torch.zeros(1000),  # all tied at 0
    torch.full((1000,), 0.5),  # all tied, one value
    torch.tensor([1e-45, 3e-45, 0.0, 1e-40] * 50),  # denormals
    torch.tensor([3.4e38, -3.4e38, 1.0, -1.0] * 30),  # extremes
    torch.arange(1000, dtype=torch.float32) % 7,  # many ties
])
def test_edge_values(values: torch.Tensor) -> None:
    for n_blocks in (1, 4):
        tt, _ = thresholds(values, n_blocks)
        assert_exact(tt, values)


def test_small_tensors_by_sorting() -> None:
    d = bf16_delta(3000, seed=3)
    tt, passes = thresholds(d, 1, sort_small=True)
    assert passes == 1
    assert_exact(tt, d)


def test_k_has_mergekits_floor_of_one() -> None:
    a = torch.randn(50)
    tt, _ = thresholds(a, 2)  # int(0.01 * 50) = 0: mergekit keeps max(1, 0) = 1 entry
    assert trim_ks(50)[0] == 1 and tt.tau[0] == float(a.abs().max()) and tt.above[0] == 0
    assert tt.tied[0] == 1
    empty, _ = thresholds(torch.zeros(0), 1)  # an empty tensor keeps nothing
    assert empty.tau == [math.inf] * 100


def test_trim_ks_follow_the_contract() -> None:
    n = 12345
    assert trim_ks(n) == [int((j + 1) / 100 * n) for j in range(100)]
    assert trim_ks(30)[:4] == [1, 1, 1, 1]  # mergekit's floor
    assert trim_ks(100)[28] == int(0.29 * 100) == 28  # float rounding, as the planner computes


def test_scan_block_statistics() -> None:
    d = bf16_delta(20_000, seed=4)
    a = d.abs().numpy()
    s, counts, mixed = scan_block(a.copy(), collect_mixed=True)
    assert s.l2 == pytest.approx(float(d.double().norm()), rel=1e-12)
    assert s.l1 == pytest.approx(float(a.astype(np.float64).sum()), rel=1e-12)
    assert s.max_abs == float(a.max()) and s.nnz == int(torch.count_nonzero(d))
    assert isinstance(counts, np.ndarray) and int(counts.sum()) == d.numel()
    bits = a.view(np.int32)
    want = bits[(bits & 0xFFFF) != 0]
    assert mixed is not None and np.array_equal(mixed, want)
    with pytest.raises(stats.NonFiniteDelta, match="NaN"):
        scan_block(np.array([1.0, float("nan")], np.float32))
    with pytest.raises(stats.NonFiniteDelta, match="Inf"):
        scan_block(np.array([1.0, float("inf")], np.float32))


@pytest.mark.parametrize("c_pass", [True, False])
def test_block_sums_by_hand(c_pass: bool, monkeypatch) -> None:
    """Float64 lane sums: exact for these values, in C and in numpy alike."""
    if not c_pass:
        monkeypatch.setattr(delta_kernels, "_fused", None)
    elif not delta_kernels.available():
        pytest.skip("MERGEPIPE_NO_FUSED is set")
    s, _, _ = scan_block(np.array([1.0, 2.0, 3.5], np.float32))
    assert (s.l1, s.l2, s.max_abs, s.nnz) == (6.5, math.sqrt(17.25), 3.5, 3)
    # 2**-24 on its own lane survives next to 1.0 (a float32 sum would round it away); ten
    # entries: lanes 0 and 1 get two each, 2**-24 + 2**-24 on lane 1
    x = np.array([1.0, 2.0**-24] * 5, np.float32)
    s, _, _ = scan_block(x)
    assert s.l1 == 5.0 + 5 * 2.0**-24 and s.l2 == math.sqrt(5.0 + 5 * 2.0**-48)
    # the lanes' combination order (s0 + s1) + (s2 + s3): a sequential float64 sum gives 2**53
    s, _, _ = scan_block(np.array([2.0**53, 0.0, 1.0, 1.0], np.float32))
    assert s.l1 == 2.0**53 + 2.0


@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 20_000), seed=st.integers(0, 2**31), scale=st.integers(-40, 30))
def test_c_and_numpy_sums_are_bit_equal(n: int, seed: int, scale: int) -> None:
    if not delta_kernels.available():
        pytest.skip("MERGEPIPE_NO_FUSED is set")
    rng = np.random.default_rng(seed)
    a = np.abs(rng.standard_normal(n).astype(np.float32) * np.float32(2.0**scale))
    counts = np.zeros(1 << 16, np.int64)
    l1, sq, top, _ = delta_kernels.block_pass(a, counts)
    assert (l1, sq) == delta_kernels.lane_sums(a)
    assert top == (float(a.max()) if n else 0.0)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 3000), n_blocks=st.integers(1, 6), seed=st.integers(0, 2**31),
       kind=st.sampled_from(["bf16", "f32", "ties", "sparse"]), collect=st.booleans())
def test_random_tensors_are_exact(n: int, n_blocks: int, seed: int, kind: str,
                                  collect: bool) -> None:
    g = torch.Generator().manual_seed(seed)
    if kind == "bf16":
        d = bf16_delta(n, seed)
    elif kind == "f32":
        d = torch.randn(n, generator=g) * 10 ** float(torch.randint(-30, 30, (1,), generator=g))
    elif kind == "ties":
        d = torch.randint(-3, 4, (n,), generator=g).float() * 0.125
    else:
        d = torch.randn(n, generator=g) * (torch.rand(n, generator=g) < 0.1)
    tt, _ = thresholds(d, min(n_blocks, n), collect=collect)
    assert_exact(tt, d)
