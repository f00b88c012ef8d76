"""A mergekit config means what it means to mergekit 0.1.5: `dtype` is the compute dtype (the
files' dtype when absent), operation by operation. Each case runs the config through mergekit-yaml
(a subprocess) and through MergePipe's config path, at full budget, and compares the bytes.

Expected: task_arithmetic and linear bit-identical; TIES bit-identical off the entries tied at
an expert's trim threshold in the compute dtype (where mergekit's argsort keeps an arbitrary
subset); DARE within mergekit's own seed-to-seed spread (both draw at random).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.models import list_models
from tests import catalogs
from tests import mergekit_parity as mp

pytest.importorskip("mergekit", reason="mergekit (test extra) is the conformance reference")


COMPUTE = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
           None: torch.bfloat16}  # None: the files' dtype (bf16 checkpoints)
# one mergekit subprocess for the fast cases (its start-up is most of their cost)
FAST = {"ta-bfloat16": ("task_arithmetic", "bfloat16"), "ties-none": ("ties", None),
        "ties-floor": ("ties", "bfloat16")}
FLOOR = (0.01, 0.01, 0.02)  # 64-entry norms: int(d * n) = 0 or 1, mergekit keeps max(1, .)
SLOW = {f"{m}-{d or 'none'}": (m, d) for m in ("task_arithmetic", "ties", "linear")
        for d in ("bfloat16", "float16", None, "float32")}


def _config(method: str, fam: dict[str, Path], dtype: str | None, name: str = "") -> dict:
    if name == "ties-floor":
        return mp.config(method, fam, dtype, densities=FLOOR)
    if method == "linear":  # the base listed with weight 0: mergekit's average of the experts
        return mp.config(method, fam, dtype, base_entry={"parameters": {"weight": 0.0}})
    params = {"lambda": 0.6} if method == "task_arithmetic" else None
    return mp.config(method, fam, dtype, params=params)


@pytest.fixture(scope="module")
def fam(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return mp.make_family(tmp_path_factory.mktemp("family"))


def _check(name: str, method: str, dtype: str | None, fam, cat, theirs, out: Path,
           stats: bool = True) -> None:
    summary, ours = mp.run_ours(cat, _config(method, fam, dtype, name), out, stats=stats)
    assert summary["expert_bytes_read"] <= summary["full_read_bytes"]
    densities = FLOOR if name == "ties-floor" else mp.DENSITIES
    keep = mp.untied(fam, COMPUTE[dtype], densities) if method == "ties" else None
    differ, compared, rel = mp.differences(ours, theirs, keep)
    assert differ == 0, f"{name}: {differ} of {compared} entries differ (rel L2 {rel:.2e})"
    total = sum(t.numel() for t in theirs.values())
    assert compared > 0.95 * total  # the tie exclusion stays small


@pytest.fixture(scope="module")
def fast_reference(fam, tmp_path_factory):
    root = tmp_path_factory.mktemp("mk")
    return mp.run_mergekit({n: _config(m, fam, d, n) for n, (m, d) in FAST.items()}, root)


@pytest.mark.parametrize("name", list(FAST))
def test_bf16_fp16_and_files_dtype_configs_give_mergekits_bytes(name, fam, cat, fast_reference,
                                                                 tmp_path):
    method, dtype = FAST[name]
    _check(name, method, dtype, fam, cat, fast_reference[name], tmp_path / name)


def test_ties_of_experts_without_statistics_gives_mergekits_bytes(fam, fast_reference, tmp_path):
    """Experts ingested without statistics (`--no-stats`): the planner computes their exact
    trim thresholds from the files, so the full-budget TIES merge is mergekit's (it kept
    every entry before: no catalog threshold meant no trim)."""
    bare = Catalog(catalogs.new_catalog(tmp_path, "nostats"))
    try:
        _check("ties-none", "ties", None, fam, bare, fast_reference["ties-none"],
               tmp_path / "ties-none", stats=False)
        experts = [m for m in list_models(bare) if m.name in mp.EXPERTS]
        assert len(experts) == 3 and not any(m.has_stats for m in experts)
    finally:
        bare.close()


def test_native_float32_arithmetic_differs_from_a_bf16_config(fam, cat, fast_reference, tmp_path):
    """What the compute dtype changes: the same merge computed in float32 (a native request)
    is not mergekit's bf16 result (so the comparison above can fail)."""
    from mergepipe.core.request import build_request
    from mergepipe.jobs.merge import merge
    mp.run_ours(cat, _config("task_arithmetic", fam, "bfloat16"), tmp_path / "register")
    req = build_request(base="base", operator="task_arithmetic", params={"lambda": 0.6},
                        experts=[{"model": n, "weight": w}
                                 for n, w in zip(mp.EXPERTS, mp.WEIGHTS, strict=True)])
    merge(cat, req, tmp_path / "native", output_name="native-f32")
    differ, compared, rel = mp.differences(mp.load_raw(tmp_path / "native"),
                                           fast_reference["ta-bfloat16"])
    assert 0.05 * compared < differ and 0 < rel < 1e-2


def test_mergekit_arithmetic_under_a_budget_is_sound_and_deterministic(fam, cat, tmp_path):
    cfg = _config("ties", fam, "bfloat16")
    s0, full = mp.budgeted_and_full(cat, cfg, tmp_path)
    assert s0["plan_hash"] != full["plan_hash"]


def test_compute_dtype_is_in_the_plan_hash_and_the_manifest(fam, cat, tmp_path):
    import json
    hashes = set()
    for dtype in ("bfloat16", "float16"):
        summary, _ = mp.run_ours(cat, _config("task_arithmetic", fam, dtype), tmp_path / dtype)
        hashes.add(summary["plan_hash"])
        manifest = json.loads((tmp_path / dtype / "manifest.json").read_text())
        assert manifest["request"]["params"]["compute_dtype"] == dtype
        assert manifest["request"]["params"]["semantics"] == "mergekit"
    assert len(hashes) == 2


@pytest.mark.slow
def test_every_dtype_and_method_gives_mergekits_bytes(fam, cat, tmp_path_factory):
    root = tmp_path_factory.mktemp("mk-all")
    theirs = mp.run_mergekit({n: _config(m, fam, d) for n, (m, d) in SLOW.items()}, root)
    for name, (method, dtype) in SLOW.items():
        _check(name, method, dtype, fam, cat, theirs[name], root / "ours" / name)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["dare_linear", "dare_ties"])
def test_dare_is_within_mergekits_seed_to_seed_spread(method, fam, cat, tmp_path):
    cfg = mp.config(method, fam, "bfloat16")
    theirs = [mp.run_mergekit({"r": cfg}, _mkdir(tmp_path / f"mk{s}"), seed=s)["r"]
              for s in (1, 2)]
    _, ours = mp.run_ours(cat, cfg, tmp_path / f"ours-{method}")
    _, _, spread = mp.differences(theirs[0], theirs[1])
    _, _, ours_vs = mp.differences(ours, theirs[0])
    assert 0 < ours_vs < 1.5 * spread, (ours_vs, spread)


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p
