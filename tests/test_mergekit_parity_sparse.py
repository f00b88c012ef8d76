"""breadcrumbs, breadcrumbs_ties, della and della_linear against mergekit 0.1.5 (mergekit-yaml in a
subprocess) on the tiny Llama family of tests/mergekit_parity.py, at full budget.

Expected: breadcrumbs(_ties) bit-identical off the entries tied at one of an expert's two cuts in
the compute dtype (mergekit's sort order keeps an arbitrary subset of them; ours is the keyed
rule); della(_linear) within mergekit's own seed-to-seed spread (both draw at random, ours from a
keyed hash). Below full budget: the budget holds, and the same request gives the same bytes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from mergepipe.catalog.db import Catalog
from tests import catalogs, factory
from tests import mergekit_parity as mp

pytest.importorskip("mergekit", reason="mergekit (test extra) is the conformance reference")

from mergepipe.core.operators.breadcrumbs import cuts  # noqa: E402

COMPUTE = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
           None: torch.bfloat16}  # None: the files' dtype (bf16 checkpoints)
GAMMA = 0.05  # 48 x 32 matrices: 76 outliers dropped; gamma 0.01 drops 15
DELLA = {"epsilon": 0.1}
# breadcrumbs cases: name -> (method, dtype, gamma); one mergekit subprocess for all fast ones
BAND_FAST = {"bc-bfloat16": ("breadcrumbs", "bfloat16", GAMMA),
             "bct-none": ("breadcrumbs_ties", None, 0.01)}
BAND_SLOW = {f"{m}-{d or 'none'}-{g}": (m, d, g) for m in ("breadcrumbs", "breadcrumbs_ties")
             for d in ("bfloat16", "float16", None, "float32") for g in (0.01, GAMMA)}
DELLA_FAST = {"della-bfloat16": ("della", "bfloat16")}
DELLA_SLOW = {f"{m}-{d or 'none'}": (m, d) for m in ("della", "della_linear")
              for d in ("bfloat16", "float16", None, "float32")}


def _config(method: str, fam: dict[str, Path], dtype: str | None, gamma: float | None = None
            ) -> dict:
    params = {"gamma": gamma} if gamma is not None else dict(DELLA)
    return mp.config(method, fam, dtype, params=params)


@pytest.fixture(scope="module")
def fam(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return mp.make_family(tmp_path_factory.mktemp("family"))


def band_untied(fam: dict[str, Path], dtype: torch.dtype, gamma: float
                ) -> dict[str, torch.Tensor]:
    """Entries no expert has tied across one of its two cuts in the compute dtype."""
    base = {k: v.to(dtype) for k, v in factory.load(fam["base"]).items()}
    keep = {k: torch.ones(v.shape, dtype=torch.bool) for k, v in base.items()}
    for name, dens in zip(mp.EXPERTS, mp.DENSITIES, strict=True):
        for k, v in factory.load(fam[name]).items():
            d = (v.to(dtype) - base[k]).abs().float().reshape(-1)
            ranks = cuts(d.numel(), dens, {"gamma": gamma})
            s = torch.sort(d, descending=True).values
            for c in ranks or ():
                if 0 < c < d.numel() and s[c - 1] > 0 and int((d >= s[c - 1]).sum()) > c:
                    keep[k] &= ~(d == s[c - 1]).reshape(keep[k].shape)
    return keep


def _check_band(name: str, method: str, dtype: str | None, gamma: float, fam, cat, theirs,
                out: Path, stats: bool = True) -> tuple[int, int]:
    summary, ours = mp.run_ours(cat, _config(method, fam, dtype, gamma), out, stats=stats)
    assert summary["expert_bytes_read"] == summary["full_read_bytes"]
    keep = band_untied(fam, COMPUTE[dtype], gamma)
    differ, compared, rel = mp.differences(ours, theirs, keep)
    assert differ == 0, f"{name}: {differ} of {compared} entries differ (rel L2 {rel:.2e})"
    total = sum(t.numel() for t in theirs.values())
    assert compared > 0.9 * total  # the tie exclusion stays small
    all_differ, _, _ = mp.differences(ours, theirs)
    return all_differ, total - compared


# mergekit-yaml's entry point for configs each with its own --random-seed, in one subprocess
_RUN_SEEDED = """
import sys
from mergekit.scripts.run_yaml import main
for cfg, out, seed in zip(sys.argv[1::3], sys.argv[2::3], sys.argv[3::3]):
    main([cfg, out, "--no-copy-tokenizer", "--no-write-model-card", "--random-seed", seed],
         standalone_mode=False)
"""


def run_seeded(cfgs: dict[str, tuple[dict, int]], root: Path) -> dict[str, dict[str, torch.Tensor]]:
    """mergekit-yaml's output of each named (config, seed), all in one subprocess."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    args = []
    for name, (cfg, seed) in cfgs.items():
        (root / f"{name}.yml").write_text(yaml.safe_dump(cfg))
        args += [str(root / f"{name}.yml"), str(root / name), str(seed)]
    proc = subprocess.run([sys.executable, "-c", _RUN_SEEDED, *args], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"mergekit-yaml failed:\n{(proc.stdout + proc.stderr)[-3000:]}"
    return {name: mp.load_raw(root / name) for name in cfgs}


def _reference(fam, root: Path, band: dict, della: dict) -> tuple[dict, dict]:
    """mergekit's outputs: the band cases and della at seed 1, della again at seed 2."""
    cfgs = {n: (_config(m, fam, d, g), 1) for n, (m, d, g) in band.items()}
    cfgs.update({f"{n}@{s}": (_config(m, fam, d), s) for n, (m, d) in della.items()
                 for s in (1, 2)})
    out = run_seeded(cfgs, root)
    one = {n: out[n] for n in band} | {n: out[f"{n}@1"] for n in della}
    return one, {n: out[f"{n}@2"] for n in della}


@pytest.fixture(scope="module")
def fast_reference(fam, tmp_path_factory):
    return _reference(fam, tmp_path_factory.mktemp("mk"), BAND_FAST, DELLA_FAST)


@pytest.mark.slow  # a mergekit subprocess (~30 s); make test keeps tests/test_mergekit_parity.py's
@pytest.mark.parametrize("name", list(BAND_FAST))
def test_breadcrumbs_configs_give_mergekits_bytes_off_the_cut_ties(name, fam, cat,
                                                                  fast_reference, tmp_path):
    method, dtype, gamma = BAND_FAST[name]
    _check_band(name, method, dtype, gamma, fam, cat, fast_reference[0][name], tmp_path / name)


@pytest.mark.slow  # a mergekit subprocess (~30 s)
def test_breadcrumbs_ties_of_experts_without_statistics_gives_mergekits_bytes(fam, fast_reference,
                                                                            tmp_path):
    """Experts ingested without statistics: their band cuts come from thresholds computed from
    the files when the merge starts (before, they were not trimmed at all)."""
    bare = Catalog(catalogs.new_catalog(tmp_path, "nostats"))
    try:
        method, dtype, gamma = BAND_FAST["bct-none"]
        _check_band("bct-none", method, dtype, gamma, fam, bare, fast_reference[0]["bct-none"],
                    tmp_path / "bct-none", stats=False)
    finally:
        bare.close()


@pytest.mark.slow  # a mergekit subprocess (~30 s); make test keeps tests/test_mergekit_parity.py's
@pytest.mark.parametrize("name", list(DELLA_FAST))
def test_della_is_within_mergekits_seed_to_seed_spread(name, fam, cat, fast_reference, tmp_path):
    method, dtype = DELLA_FAST[name]
    _check_della(name, method, dtype, fam, cat, fast_reference[0][name],
                 fast_reference[1][name], tmp_path)


def _check_della(name, method, dtype, fam, cat, theirs1, theirs2, tmp_path) -> tuple[float, float]:
    _, ours = mp.run_ours(cat, _config(method, fam, dtype),
                          tmp_path / f"ours-{tmp_path.name}-{name}")
    _, _, spread = mp.differences(theirs1, theirs2)
    _, _, ours_vs = mp.differences(ours, theirs1)
    assert 0 < ours_vs < 1.5 * spread, (name, ours_vs, spread)
    return ours_vs, spread


@pytest.mark.parametrize("method", [pytest.param("breadcrumbs_ties", marks=pytest.mark.slow),
                                    "della"])  # native budgets: test_operators_bands.py
def test_below_full_budget_sound_and_deterministic(method, fam, cat, tmp_path):
    cfg = _config(method, fam, "bfloat16", GAMMA if method.startswith("b") else None)
    s0, full = mp.budgeted_and_full(cat, cfg, tmp_path, f"{method}-")
    assert s0["plan_hash"] != full["plan_hash"]


@pytest.mark.slow
def test_every_dtype_gives_mergekits_bytes_or_spread(fam, cat, tmp_path_factory):
    root = tmp_path_factory.mktemp("mk-all")
    one, two = _reference(fam, root, BAND_SLOW, DELLA_SLOW)
    for name, (method, dtype, gamma) in BAND_SLOW.items():
        all_differ, tied = _check_band(name, method, dtype, gamma, fam, cat, one[name],
                                       root / "ours" / name)
        print(f"CONFORMANCE {name}: {all_differ} entries differ, all within the {tied} entries "
              "tied at a cut")
    for name, (method, dtype) in DELLA_SLOW.items():
        ours_vs, spread = _check_della(name, method, dtype, fam, cat, one[name], two[name], root)
        print(f"CONFORMANCE {name}: rel L2 ours vs mergekit {ours_vs:.3e}, mergekit seed 1 vs 2 "
              f"{spread:.3e}")
