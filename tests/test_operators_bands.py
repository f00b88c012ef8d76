"""breadcrumbs' band thresholds from the catalog's trim grid (planner.bands), the native
breadcrumbs kernel against a hand computation, and request checks of the new sparsifiers."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.stats import trim_ks
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.operators.breadcrumbs import cuts
from mergepipe.core.request import MergeRequest, build_request
from mergepipe.jobs.merge import merge
from mergepipe.planner.bands import cut_at
from mergepipe.planner.plan import TrimThreshold
from tests import factory
from tests import mergekit_parity as mp
from tests.catalogs import new_catalog


def _grid(d: torch.Tensor) -> tuple[list[float], list[int], list[int]]:
    s = torch.sort(d, descending=True).values
    taus, aboves, tieds = [], [], []
    for k in trim_ks(d.numel()):
        tau = s[k - 1]
        taus.append(float(tau))
        aboves.append(int((d > tau).sum()))
        tieds.append(int((d == tau).sum()))
    return taus, aboves, tieds


@pytest.mark.parametrize("levels", [7, 40, 100000])  # many ties .. almost none
def test_cut_at_is_exact_where_the_grid_determines_it(levels):
    g = torch.Generator().manual_seed(levels)
    n = 1237
    d = torch.randint(0, levels, (n,), generator=g).float() / levels
    s = torch.sort(d, descending=True).values
    grid = _grid(d)
    exact = 0
    for k in range(n + 1):
        (tau, above, tied, kk), ok = cut_at(k, n, *grid)
        if ok:
            exact += 1
            assert kk == k
            if 0 < k < n and above == k:  # |d| > tau: exactly the k largest
                assert int((d > tau).sum()) == k
            elif 0 < k < n:  # tau is the k-th largest; the keyed rule picks among the tied
                assert tau == float(s[k - 1]) and above == int((d > tau).sum())
                assert tied == int((d == tau).sum()) and above < k <= above + tied
        else:  # the nearer grid point: kept count within 1% of the entries
            assert abs(kk - k) <= n // 100 + 1
    for gamma in (0.0, 0.01, 0.05, 0.1):  # mergekit's cuts with gamma, density on the grid
        for dens in (0.1, 0.3, 0.5, 0.7, 0.9):
            if gamma + dens <= 1:
                for c in cuts(n, dens, {"gamma": gamma}) or ():
                    assert cut_at(c, n, *grid)[1], (gamma, dens, c)
    assert exact > (0.02 if levels > 1000 else 0.5) * n


def test_band_threshold_round_trips_through_the_plan_document():
    t = TrimThreshold(0.5, 3, 2, 4, upper=TrimThreshold(float("inf"), 0, 0, 0))
    assert TrimThreshold.from_doc(t.doc()) == t
    assert TrimThreshold(0.5, 3, 2, 4).hashed() == [0.5, 3, 2, 4]  # ties' plan hashes unchanged


def test_cuts_follow_mergekits_magnitude_outliers():
    assert cuts(100, 0.9, {"gamma": 0.01}) == (1, 91)
    assert cuts(64, 0.5, {"gamma": 0.01}) == (0, 32)  # int(0.64) = 0 outliers
    assert cuts(100, 0.9, {"gamma": 0.2}) == (10, 100)  # mergekit trims the outliers to fit
    assert cuts(100, 1.0, {"gamma": 0.2}) is None


def test_bad_parameters_are_refused_naming_the_field():
    ex = [{"model": "a", "weight": 1.0, "density": 0.1}]
    with pytest.raises(InvalidRequest) as e:
        build_request(base="b", experts=ex, operator="della", params={"epsilon": 0.15})
    assert e.value.field == "params.epsilon"
    with pytest.raises(InvalidRequest) as e:
        build_request(base="b", experts=ex, operator="breadcrumbs", params={"gamma": 1.5})
    assert e.value.field == "params.gamma"
    with pytest.raises(InvalidRequest):
        build_request(base="b", experts=ex, operator="ties", params={"gamma": 0.1})


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    root = tmp_path_factory.mktemp("fam")
    fam = mp.make_family(root, dtype="F32")
    cat = Catalog(new_catalog(root))
    mp.run_ours(cat, mp.config("task_arithmetic", fam, None), root / "register")
    yield fam, cat
    cat.close()


def _native(operator: str, **kw: Any) -> MergeRequest:
    return build_request(base="base", operator=operator, params=kw.pop("params", {}),
                         experts=[{"model": n, "weight": w, "density": d} for n, w, d in
                                  zip(mp.EXPERTS, mp.WEIGHTS, mp.DENSITIES, strict=True)], **kw)


def test_native_breadcrumbs_is_the_hand_computed_band_sum(registered, tmp_path):
    fam, cat = registered
    merge(cat, _native("breadcrumbs", params={"gamma": 0.05}), tmp_path / "o", output_name="bc")
    ours = mp.load_raw(tmp_path / "o")
    base = factory.load(fam["base"])
    checked = 0
    for name, b in base.items():
        acc = None
        tied = torch.zeros(b.numel(), dtype=torch.bool)
        for e, w, dens in zip(mp.EXPERTS, mp.WEIGHTS, mp.DENSITIES, strict=True):
            d = (factory.load(fam[e])[name] - b).reshape(-1)
            a = d.abs()
            s = torch.sort(a, descending=True).values
            band = torch.ones_like(d, dtype=torch.bool)
            hi, lo = cuts(d.numel(), dens, {"gamma": 0.05}) or (0, d.numel())
            band &= (a >= s[lo - 1]) if lo else torch.zeros_like(band)
            if hi:
                band &= a < s[hi - 1]
            for c in (hi, lo):
                if 0 < c < d.numel() and s[c - 1] > 0 and int((a >= s[c - 1]).sum()) > c:
                    tied |= a == s[c - 1]
            term = (d * band) * torch.tensor(w, dtype=torch.float32)
            acc = term if acc is None else acc + term
        assert acc is not None
        want = (b.reshape(-1) + acc)[~tied]
        assert torch.equal(ours[name].reshape(-1)[~tied], want), name
        checked += int((~tied).sum())
    assert checked > 0.9 * sum(b.numel() for b in base.values())


@pytest.mark.parametrize("operator", [
    "breadcrumbs_ties", "della_linear", pytest.param("breadcrumbs", marks=pytest.mark.slow),
    pytest.param("della", marks=pytest.mark.slow)])
def test_native_requests_below_full_budget_are_sound_and_deterministic(operator, registered,
                                                                        tmp_path):
    _, cat = registered
    outs = []
    for i in range(2):
        s = merge(cat, _native(operator, budget=0.5), tmp_path / f"r{i}",
                  output_name=f"{operator}-{i}").to_dict()
        assert 0 < s["expert_bytes_read"] <= s["budget_bytes"] < s["full_read_bytes"]
        outs.append((s["plan_hash"], mp.load_raw(tmp_path / f"r{i}")))
    (h0, a), (h1, b) = outs
    assert h0 == h1 and all(torch.equal(a[k], b[k]) for k in a)




def test_per_model_gamma_and_epsilon_of_a_mergekit_config():
    from mergepipe.core.mergekit_config import parse_config

    def cfg(method: str, key: str, values: list[float]) -> str:
        models = "".join(f"  - model: e{i}\n    parameters: {{weight: 1, density: 0.5, {key}: {v}}}\n"
                         for i, v in enumerate(values))
        return f"merge_method: {method}\nbase_model: base\nmodels:\n{models}"

    assert parse_config(cfg("breadcrumbs", "gamma", [0.02, 0.02])).params["gamma"] == 0.02
    assert parse_config(cfg("della", "epsilon", [0.1, 0.1])).params["epsilon"] == 0.1
    with pytest.raises(InvalidRequest) as e:
        parse_config(cfg("breadcrumbs_ties", "gamma", [0.02, 0.03]))
    assert e.value.field == "models[1].parameters.gamma"


# -- kernels ---------------------------------------------------------------------------------------

def _cut(a: torch.Tensor, k: int) -> TrimThreshold:
    s = torch.sort(a.reshape(-1), descending=True).values
    tau = float(s[k - 1])
    return TrimThreshold(tau, int((a > tau).sum()), int((a == tau).sum()), k)


def _band(d: torch.Tensor, dens: float, gamma: float) -> TrimThreshold:
    hi, lo = cuts(d.numel(), dens, {"gamma": gamma}) or (0, d.numel())
    upper = _cut(d.abs(), hi) if hi else None
    return dataclasses.replace(_cut(d.abs(), lo), upper=upper)


def _family(k: int = 3, shape: tuple[int, int] = (24, 16)):
    g = torch.Generator().manual_seed(5)
    base = torch.randn(shape, generator=g)
    deltas = [((torch.randn(shape, generator=g) * 0.01) * 2**9).round() * 2.0**-9
              for _ in range(k)]  # bf16-like: ties at the cuts
    return base, deltas


@pytest.mark.parametrize("op", ["breadcrumbs", "breadcrumbs_ties", "della", "della_linear"])
def test_kernels_are_block_split_invariant_and_keep_their_inputs(op):
    from tests.operator_helpers import merge_tensor, row_blocks

    base, deltas = _family()
    dens, w = [0.5, 0.3, 0.7], [1.0, 0.5, 2.0]
    params: dict[str, float | str] = {"gamma": 0.05, "lambda": 0.9}
    if op.startswith("della"):
        params = {"epsilon": 0.1, "rescale": "none"}  # the L1 rescale is per block
    trims = [_band(d, p, 0.05) for d, p in zip(deltas, dens, strict=True)]
    kept = [d.clone() for d in deltas]
    whole = merge_tensor(op, base, deltas, w, densities=dens, params=params, trims=trims)
    split = merge_tensor(op, base, deltas, w, densities=dens, params=params, trims=trims,
                         blocks=row_blocks(24, [5, 7, 3]))
    assert torch.equal(whole, split)
    assert all(torch.equal(a, b) for a, b in zip(deltas, kept, strict=True))
    other = merge_tensor(op, base, deltas, w, densities=dens, params=params, trims=trims,
                         omit={1: {0}}, blocks=row_blocks(24, [5, 19]))
    zero = merge_tensor(op, base, [deltas[0], torch.cat([torch.zeros(5, 16), deltas[1][5:]]),
                                   deltas[2]], w, densities=dens, params=params, trims=trims,
                        blocks=row_blocks(24, [5, 19]))
    assert torch.equal(other, zero)  # an unread block is a zero delta


def test_band_keeps_the_gamma_density_band():
    from mergepipe.core.operators import BlockContext
    from mergepipe.core.operators.base import ReadExpert
    from mergepipe.core.operators.breadcrumbs import band_native

    d = torch.arange(1.0, 101.0)  # no ties: the band is exact
    e = ReadExpert(0, "e", d, 1.0, 0.5, _band(d, 0.5, 0.1), 7)
    out = band_native(e, d, BlockContext("t", 0, 0), 0)
    assert torch.equal(out != 0, (d > 40) & (d <= 90))  # drop the 10 largest, keep the next 50


def test_della_keep_probability_follows_the_rank():
    from mergepipe.core.operators import BlockContext
    from mergepipe.core.operators.base import ReadExpert
    from mergepipe.core.operators.della import magprune

    d = torch.arange(1.0, 20001.0)  # one row: rank = value
    e = ReadExpert(0, "e", d, 1.0, 0.5, None, 3)
    out = magprune(e, d, BlockContext("t", 0, 0, {"epsilon": 0.2, "rescale": "none"}))
    kept = (out != 0).double()
    low, high = float(kept[:2000].mean()), float(kept[-2000:].mean())
    assert abs(low - 0.32) < 0.04 and abs(high - 0.68) < 0.04  # 0.3 + 0.4 * rank_norm
    assert abs(float(kept.mean()) - 0.5) < 0.02
