"""The calibration study's oracle and exact-channel orders on a tiny trained family: the
leave-one-out KL computed in memory equals the KL of the executed merge without that block, and
the oracle's plans are first-fit in leave-one-out KL per byte within the budget."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

# trains a tiny family and runs several merges and evaluations (~20 s)
pytestmark = pytest.mark.slow

import torch  # noqa: E402
from mergepipe_bench.fidelity.calibration_oracle import (  # noqa: E402
    LeaveOneOut,
    candidates,
    oracle_plan,
)
from mergepipe_bench.fidelity.evaluate import log_probs, masks, token_kl  # noqa: E402
from mergepipe_bench.fidelity.family import build_family  # noqa: E402
from mergepipe_bench.fidelity.model import load_model  # noqa: E402
from mergepipe_bench.fidelity.random_plan import _first_fit  # noqa: E402
from mergepipe_bench.fidelity.tasks import eval_set  # noqa: E402
from mergepipe_bench.fidelity.units import quick_units_config  # noqa: E402

from mergepipe.catalog.db import Catalog  # noqa: E402
from mergepipe.catalog.ingest import ingest_model  # noqa: E402
from mergepipe.core.request import build_request  # noqa: E402
from mergepipe.jobs.merge import execute_plan  # noqa: E402
from mergepipe.planner.plan import make_plan  # noqa: E402


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("oracle")
    spec = quick_units_config().family
    fam = build_family(spec, root)
    cat = Catalog(root / "c.duckdb")
    ingest_model(cat, fam["base"]["path"], "base", block_bytes=4 << 10)
    experts = list(fam["experts"])
    for e in experts:
        ingest_model(cat, fam["experts"][e]["path"], e, base="base", block_bytes=4 << 10)
    full = make_plan(cat, build_request(base="base", experts=[{"model": e} for e in experts],
                                        operator="linear", params={"utility": "l2"},
                                        budget=1.0, output_dtype="F32"))
    execute_plan(cat, full, root / "full", threads=1)
    examples = eval_set(list(spec.tasks), 4, 0)
    loo = LeaveOneOut(cat, full, root / "full", Path(fam["base"]["path"]),
                      {e: Path(fam["experts"][e]["path"]) for e in experts}, examples)
    yield {"cat": cat, "full": full, "loo": loo, "root": root, "examples": examples}
    cat.close()


def _kl(setup: dict[str, Any], out: Path) -> float:
    with torch.inference_mode():
        lp, targets = log_probs(load_model(out), setup["examples"])
    answer = masks(setup["examples"], targets)["answer"]
    return float(token_kl(setup["loo"].ref, lp)[answer].mean())


def test_leave_one_out_kl_is_the_executed_merge_without_the_block(setup: dict[str, Any]) -> None:
    cat, full, loo = setup["cat"], setup["full"], setup["loo"]
    cands = candidates(cat, full)
    c = max(cands, key=lambda x: x.utility)
    rest = _first_fit(full, cands, [x for x in cands if x != c], {"test": "all but one"})
    assert len(rest.blocks) == len(cands) - 1
    execute_plan(cat, rest, setup["root"] / "rest", threads=1, overwrite=True)
    want = _kl(setup, setup["root"] / "rest")
    assert want > 0
    assert loo.kl(c) == pytest.approx(want, rel=1e-3)
    assert loo.kl(c) == pytest.approx(want, rel=1e-3)  # the model is restored after each


def test_oracle_plan_is_first_fit_by_kl_per_byte(setup: dict[str, Any]) -> None:
    cat, full = setup["cat"], setup["full"]
    cands = candidates(cat, full)
    scores = [float(i % 7) for i in range(len(cands))]  # any scores: the order is by KL/byte
    half = _first_fit(full, cands, cands, {"test": "prefix"})
    budget = sum(c.nbytes for c in cands) // 2
    target = replace(half, planned_expert_bytes=budget)
    p = oracle_plan(target, cands, scores)
    assert p.planned_expert_bytes <= budget
    order = sorted(range(len(cands)), key=lambda i: -scores[i] / cands[i].nbytes)
    chosen = {(b.model, b.tensor, b.block_index) for b in p.blocks}
    spent, want = 0, set()
    for i in order:
        if spent + cands[i].nbytes <= budget:
            spent += cands[i].nbytes
            want.add((cands[i].model, cands[i].tensor, cands[i].block_index))
    assert chosen == want
