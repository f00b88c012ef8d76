"""Experts ingested without statistics (`--no-stats`) merge to the same bytes as with them.

The operators that trim by magnitude (ties, breadcrumbs, breadcrumbs_ties) take their thresholds
from the catalog's statistics; without them the same thresholds are computed from the files of
the tensors the plan reads, when the merge starts (executor.fallback_trims). Before, no statistics meant no
trim at all: a full-budget ties merge kept every entry. The other operators need no statistics
in their kernels; they are here so that a new dependency on them cannot slip in unnoticed.
mergekit's side of the comparison: tests/test_mergekit_parity.py (ties without statistics).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mergepipe.api import Catalog
from mergepipe.core.errors import InvalidRequest
from mergepipe.executor.prepare import prepare
from tests import catalogs, factory

EXPERTS = ("e0", "e1", "e2")
BLOCK = 512  # several blocks per matrix
OPERATORS = {
    "ties": {"density": 0.5},
    "breadcrumbs_ties": {"density": 0.8, "gamma": 0.05},
    "breadcrumbs": {"density": 0.8, "gamma": 0.05},
    "dare_ties": {"density": 0.5},
    "dare_linear": {"density": 0.5},
    "della": {"density": 0.5, "epsilon": 0.1},
    "task_arithmetic": {"lambda": 0.6},
    "linear": {},
}
# which experts are ingested without statistics
MODES = {"stats": (), "none": EXPERTS, "mixed": ("e1",)}


@pytest.fixture(scope="module")
def cats(tmp_path_factory: pytest.TempPathFactory):
    """One catalog per mode over the same family (bf16, 3 experts, one with a sparse delta)."""
    root = tmp_path_factory.mktemp("nostats")
    base = factory.make_base(root / "base", seed=0)
    paths = {n: factory.make_expert(base, root / n, seed=10 + i, sparsity=0.3 if i == 2 else 0.0)
             for i, n in enumerate(EXPERTS)}
    out = {}
    for mode, bare in MODES.items():
        cat = Catalog(catalogs.new_catalog(root, mode))
        cat.ingest(base, name="base", block_bytes=BLOCK, progress=False)
        for n, p in paths.items():
            cat.ingest(p, name=n, base="base", stats=n not in bare, progress=False)
        out[mode] = cat
    yield out
    for cat in out.values():
        cat.close()


def _merge(cat: Catalog, op: str, out: Path, budget: float = 1.0):
    return cat.merge(name=f"{op}-{out.parent.name}-{out.name}", base="base", experts=[{"model": n, "weight": w}
                                          for n, w in zip(EXPERTS, (1.0, 0.5, 2.0), strict=True)],
                     operator=op, params=OPERATORS[op], budget=budget, out=out, progress=False)


_REFS: dict[str, str] = {}


# the default set: each operator of the brief with no expert's statistics, ties mixed too; the
# rest (breadcrumbs, dare_linear, every operator mixed) with -m slow
FAST = {("ties", "none"), ("ties", "mixed"), ("breadcrumbs_ties", "none"), ("dare_ties", "none"),
        ("della", "none"), ("task_arithmetic", "none"), ("linear", "none")}
CASES = [pytest.param(op, mode, marks=() if (op, mode) in FAST else pytest.mark.slow)
         for op in OPERATORS for mode in ("none", "mixed")]


@pytest.mark.parametrize(("op", "mode"), CASES)
def test_full_budget_merge_gives_the_same_bytes_without_statistics(op, mode, cats, tmp_path):
    assert [cats[mode].model(n).has_stats for n in EXPERTS] == [
        n not in MODES[mode] for n in EXPERTS]
    if op not in _REFS:  # the merge with statistics, once per operator
        _REFS[op] = _merge(cats["stats"], op, tmp_path / "stats").output_hash
    got = _merge(cats[mode], op, tmp_path / mode)
    assert got.output_hash == _REFS[op], f"{op}: {mode} differs from the merge with stats"


def test_budgeted_ties_without_statistics_uses_the_exact_thresholds(cats, tmp_path):
    """Below the full budget the fallback expert's tensors are read whole or not at all; each
    one read is trimmed at the threshold the catalog would hold with statistics (computed when
    the merge starts, not at planning), within the budget, and the same request plans and
    merges the same way again."""
    full = cats["mixed"].plan(base="base", experts=list(EXPERTS), operator="ties",
                              params=OPERATORS["ties"], budget=1.0, progress=False)
    budget = full.full_read_bytes // 2
    plans = [cats[m].plan(base="base", experts=list(EXPERTS), operator="ties",
                          params=OPERATORS["ties"], budget=budget, progress=False)
             for m in ("stats", "mixed", "mixed")]
    ref, plan, again = plans
    assert plan.plan_hash == again.plan_hash
    assert 0 < plan.planned_expert_bytes <= budget
    assert plan.fallback_experts == ["e1"]
    read = {b.tensor for b in plan.blocks if b.model == "e1"}
    assert read and read < {t for m, t in ref.trims if m == "e1"}  # some tensors, not all
    assert not any(m == "e1" for m, _ in plan.trims)  # planning reads no file
    prepare(cats["mixed"].db, plan)  # execution's first step fills them in
    assert {t for m, t in plan.trims if m == "e1"} == read
    for t in read:
        assert plan.trims[("e1", t)] == ref.trims[("e1", t)], t
    a, b = (cats["mixed"].merge(base="base", experts=list(EXPERTS), operator="ties",
                                params=OPERATORS["ties"], budget=budget, out=tmp_path / f"m{i}",
                                name=f"budgeted-{i}", progress=False) for i in range(2))
    assert a.output_hash == b.output_hash and a.expert_bytes_read <= budget


def test_a_trimmed_tensor_without_threshold_is_refused_naming_the_expert(cats):
    """The guard behind the fix: a ties plan that reads a tensor of an expert with no threshold
    for it (here one removed from the plan) is refused before anything is merged, naming the
    expert and how to fix it, never merged untrimmed."""
    plan = cats["stats"].plan(base="base", experts=list(EXPERTS), operator="ties",
                              params=OPERATORS["ties"], budget=1.0, progress=False)
    key = next(k for k in sorted(plan.trims) if k[0] == "e2")
    del plan.trims[key]
    with pytest.raises(InvalidRequest, match=r"expert 'e2'.*re-ingest 'e2' with statistics") as e:
        prepare(cats["stats"].db, plan)
    assert e.value.field == "experts" and key[1] in str(e.value)
