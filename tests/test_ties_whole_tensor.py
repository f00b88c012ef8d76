"""mergekit ties with `rescale: true` or densities off the 1% grid (scalar or gradient): the
merge runs through the whole-tensor path (each expert's threshold and L1 norms from its whole
tensor, as mergekit computes them). Conformance: mergekit-yaml (one subprocess) and MergePipe give
the same bytes off the entries tied at an expert's threshold in the compute dtype.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from tests import mergekit_parity as mp

pytest.importorskip("mergekit", reason="mergekit (test extra) is the conformance reference")

from mergepipe.core.errors import InvalidRequest  # noqa: E402
from mergepipe.core.request import build_request  # noqa: E402
from mergepipe.core.tensor_params import layer_counts, layer_t, resolve  # noqa: E402

LAYERS = 5  # a gradient [0.3, 0.8] gives 0.425 and 0.675 at layers 1 and 3 (off the grid)
COMPUTE = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
           None: torch.bfloat16}
OFF_GRID = (0.333, 0.25, 0.555)
GRADIENT = [0.3, 0.8]
FAST = {"rescale-bfloat16": ("rescale", "bfloat16"), "offgrid-float32": ("offgrid", "float32"),
        "gradient-bfloat16": ("gradient", "bfloat16")}
SLOW = {f"{k}-{d or 'none'}": (k, d) for k in ("rescale", "offgrid", "gradient")
        for d in ("bfloat16", "float16", "float32", None)}


def _config(kind: str, fam: dict[str, Path], dtype: str | None) -> dict[str, Any]:
    if kind == "rescale":  # grid densities, mergekit's L1 rescale
        return mp.config("ties", fam, dtype, params={"rescale": True})
    if kind == "offgrid":
        return mp.config("ties", fam, dtype, densities=OFF_GRID)
    cfg = mp.config("ties", fam, dtype, params={"density": GRADIENT, "rescale": True})
    for m in cfg["models"]:
        del m["parameters"]["density"]
    return cfg


def _densities(kind: str) -> tuple[Any, ...]:
    if kind == "rescale":
        return mp.DENSITIES
    if kind == "offgrid":
        return OFF_GRID
    counts = layer_counts(mp.llama_shapes(LAYERS))

    def at(tensor: str) -> float:
        v = resolve([GRADIENT], tensor, layer_t(tensor, counts))
        assert v is not None
        return v
    return (at, at, at)


@pytest.fixture(scope="module")
def fam(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return mp.make_family(tmp_path_factory.mktemp("family5"), layers=LAYERS)


def _check(name: str, cases: dict, fam, cat, theirs, out: Path) -> tuple[int, int, int, int]:
    kind, dtype = cases[name]
    summary, ours = mp.run_ours(cat, _config(kind, fam, dtype), out)
    assert summary["expert_bytes_read"] == summary["full_read_bytes"]
    keep = mp.untied(fam, COMPUTE[dtype], _densities(kind))
    differ, compared, rel = mp.differences(ours, theirs, keep)
    assert differ == 0, f"{name}: {differ} of {compared} entries differ (rel L2 {rel:.2e})"
    total = sum(t.numel() for t in theirs.values())
    assert compared > 0.95 * total  # the tie exclusion stays small
    at_ties, _, _ = mp.differences(ours, theirs)
    return differ, compared, at_ties, total


@pytest.fixture(scope="module")
def reference(fam, tmp_path_factory):
    root = tmp_path_factory.mktemp("mk")
    return mp.run_mergekit({n: _config(k, fam, d) for n, (k, d) in FAST.items()}, root)


@pytest.mark.slow  # a mergekit subprocess (~30 s); make test keeps tests/test_mergekit_parity.py's
@pytest.mark.parametrize("name", list(FAST))
def test_rescale_and_off_grid_densities_give_mergekits_bytes(name, fam, cat, reference,
                                                             tmp_path):
    _check(name, FAST, fam, cat, reference[name], tmp_path / name)


@pytest.mark.slow
def test_every_dtype_gives_mergekits_bytes(fam, cat, tmp_path_factory):
    root = tmp_path_factory.mktemp("mk-slow")
    theirs = mp.run_mergekit({n: _config(k, fam, d) for n, (k, d) in SLOW.items()}, root)
    for name in SLOW:
        differ, compared, at_ties, total = _check(name, SLOW, fam, cat, theirs[name],
                                                  root / f"ours-{name}")
        print(f"| {name} | {compared} of {total} | {differ} | {at_ties} |")


def test_the_request_decides_the_path_and_the_plan_needs_no_grid_thresholds(fam, cat, tmp_path):
    from mergepipe.jobs.config import load_config
    from mergepipe.planner.plan import make_plan
    mp.run_ours(cat, _config("rescale", fam, "bfloat16"), tmp_path / "register")
    plans = {}
    for kind in ("rescale", "offgrid", "gradient", "grid"):
        cfg = mp.config("ties", fam, "bfloat16") if kind == "grid" else _config(
            kind, fam, "bfloat16")
        request, _ = load_config(cat, yaml.safe_dump(cfg))
        plans[kind] = make_plan(cat, request)
    assert plans["grid"].request.whole_tensor is None and plans["grid"].trims
    for kind in ("rescale", "offgrid", "gradient"):
        assert plans[kind].request.whole_tensor is not None and not plans[kind].trims, kind
    assert plans["rescale"].request.params["rescale"] == "l1"
    assert "rescale" not in plans["grid"].request.params  # plan hashes of the others stay
    from mergepipe.executor.model_card import mergekit_config
    card = yaml.safe_load(mergekit_config(plans["rescale"].request) or "")
    assert card["parameters"]["rescale"] is True  # the card's config is mergekit's again


def test_under_a_budget_the_merge_is_sound_and_deterministic(fam, cat, tmp_path):
    cfg = _config("gradient", fam, "bfloat16")
    mp.budgeted_and_full(cat, cfg, tmp_path)


@pytest.mark.parametrize("params, experts, match", [
    ({"rescale": "l1"}, [{"model": "e", "density": 0.5}], r"rescale: l1 for ties .* mergekit"),
    ({}, [{"model": "e", "density": 0.333}], r"not on the 1% grid"),
])
def test_native_requests_keep_the_grid_and_no_rescale(params, experts, match):
    with pytest.raises(InvalidRequest, match=match):
        build_request(base="b", experts=experts, operator="ties", params=params)


def test_a_whole_tensor_kernel_sees_unread_blocks_as_zero_deltas():
    """The budgeted meaning: the threshold and L1 norms are over the entries read (an unread
    block is the base there), and the kernel's output does not depend on the block grid."""
    from dataclasses import replace

    from mergepipe.core.operators import BlockContext, ExpertBlock
    from mergepipe.core.operators.ties import ties
    from mergepipe.executor.torch_path import merge_tensor

    g = torch.Generator().manual_seed(3)
    base = torch.randn(8, 16, generator=g)
    deltas = [torch.randn(8, 16, generator=g) * 0.01 for _ in range(2)]
    params = {"semantics": "mergekit", "compute_dtype": "bfloat16", "rescale": "l1",
              "normalize": True, "lambda": 1.0}
    ctx = BlockContext(tensor="t", block_index=0, flat_offset=0, params=params,
                       all_weights=(1.0, 0.5))

    def blocks(rows: slice, omit: bool) -> list[ExpertBlock]:
        return [ExpertBlock(index=i, model=f"e{i}", weight=(1.0, 0.5)[i], density=0.333,
                            trim=None, key=11 + i,
                            delta=None if omit and i == 1 else d[rows].clone(),
                            value=None if omit and i == 1 else (base[rows] + d[rows]))
                for i, d in enumerate(deltas)]

    def run(cut: int, omit_second: bool) -> torch.Tensor:
        parts = [(slice(0, cut), False), (slice(cut, 8), omit_second)]
        inputs = [(base[r].clone(), blocks(r, o), replace(ctx, flat_offset=r.start * 16))
                  for r, o in parts]
        return torch.cat(merge_tensor(ties, (8, 16), inputs))

    assert torch.equal(run(2, False), run(5, False))  # the grid does not matter
    omitted = run(4, True)
    zeroed = [deltas[0], torch.cat([deltas[1][:4], torch.zeros(4, 16)])]
    whole = [ExpertBlock(index=i, model=f"e{i}", weight=(1.0, 0.5)[i], density=0.333, trim=None,
                         key=11 + i, delta=d, value=base + d) for i, d in enumerate(zeroed)]
    assert torch.equal(omitted, ties(base, whole, replace(ctx, whole_tensor=True)))
    assert not torch.equal(omitted, run(4, False))
