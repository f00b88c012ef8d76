"""The console's server side, in process: its page and assets (offline, CSP), and the read-only
JSON it draws (per-tensor read shares, model statistics, operators, output sameness), checked
against numbers computed here from the checkpoints and the catalog."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest

from mergepipe.core.operators import REGISTRY
from tests import factory
from tests.api_helpers import (
    EXPERTS,
    assert_error,
    client_for,
    make_family,
    run_merge,
    settings_for,
    wait,
)

ASSETS = Path(__file__).resolve().parent.parent / "service" / "console"
BLOCK_BYTES = 512


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A family on a 512-byte block grid (tensors of several blocks), two linear merges."""
    tmp = tmp_path_factory.mktemp("console-api")
    fam = make_family(tmp / "data" / "family")
    with client_for(settings_for(tmp)) as c:
        assert c.post("/v1/models", json={"name": "base", "path": str(fam["base"]),
                                          "block_bytes": BLOCK_BYTES}).status_code == 202
        for e in EXPERTS:
            assert c.post("/v1/models", json={"name": e, "path": str(fam[e]),
                                              "base": "base"}).status_code == 202
        body = {"base": "base", "experts": [{"model": e} for e in EXPERTS],
                "operator": "linear", "budget": {"fraction": 0.4}}
        for n in ("base", *EXPERTS):
            assert wait(c, f"/v1/models/{n}")["status"] == "ready"
        part = run_merge(c, {**body, "output": {"name": "lin-40"}})
        full = run_merge(c, {**body, "budget": {"fraction": 1.0}, "output": {"name": "lin-100"}})
        yield c, fam, body, part, full


def rows(c: Any, sql: str) -> list[list[Any]]:
    r = c.post("/v1/sql", json={"sql": sql})
    assert r.status_code == 200, r.text
    return list(r.json()["rows"])


def test_page_and_assets_are_served_offline(served: Any) -> None:
    c = served[0]
    r = c.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp
    refs = re.findall(r'(?:src|href)="(/console/[^"]+)"', r.text)
    imports = {f"/console/{m}" for f in ASSETS.glob("*.js")
               for m in re.findall(r'from "\./([^"]+)"', f.read_text())}
    assert len(refs) == 2 and imports
    for path in {*refs, *imports}:
        a = c.get(path)
        assert a.status_code == 200 and a.content, path
        assert a.headers["content-security-policy"] == csp
    for f in ASSETS.iterdir():  # nothing from elsewhere: no URL but the SVG namespace
        urls = set(re.findall(r"https?://[^\s\"'`)]+", f.read_text()))
        assert urls <= {"http://www.w3.org/2000/svg"}, (f.name, urls)
    assert_error(c.get("/console/missing.js"), 404, "not_found")
    assert c.get("/v1/healthz").status_code == 404  # the API keeps its routes


def test_merge_tensor_shares_are_touched_over_stored_bytes(served: Any) -> None:
    c, _, body, part, full = served
    s = c.get(f"/v1/merges/{part['id']}/tensor-shares").json()
    assert s["experts"] == list(EXPERTS) and s["base"] == "base"
    read = {(m, t): (b, n) for m, t, b, n in rows(c, (
        "SELECT model, tensor, sum(nbytes), count(*) FROM touched_blocks "
        f"WHERE merge_id = '{part['id']}' GROUP BY model, tensor"))}
    sizes = {(m, t): (b, n) for m, t, b, n in rows(
        c, "SELECT model, tensor, nbytes, n_blocks FROM tensors "
           "WHERE model IN ('e0', 'e1', 'e2')")}
    cells = {(x["model"], x["tensor"]): x for x in s["tensors"]}
    assert cells.keys() == sizes.keys() and len(cells) == 3 * len(factory.TINY_SHAPES)
    for key, x in cells.items():
        got_bytes, got_blocks = read.get(key, (0, 0))
        assert (x["read_bytes"], x["read_blocks"]) == (got_bytes, got_blocks)
        assert (x["tensor_bytes"], x["blocks"]) == sizes[key]
        assert x["share"] == got_bytes / sizes[key][0]
    assert sum(x["read_bytes"] for x in cells.values()) == part["expert_bytes_read"]
    assert any(0 < x["share"] < 1 for x in cells.values())
    ordinals = [x["ordinal"] for x in s["tensors"]]
    assert ordinals == sorted(ordinals)  # the base's checkpoint order

    # at full budget every block with a nonzero delta is read: 1 everywhere but e0's norm
    whole = c.get(f"/v1/merges/{full['id']}/tensor-shares").json()["tensors"]
    assert {(x["model"], x["tensor"]) for x in whole if x["share"] != 1.0} == {
        ("e0", "model.norm.weight")}
    assert_error(c.get("/v1/merges/m-nope/tensor-shares"), 404, "not_found", "merge_id")


def test_dry_plan_shares_equal_the_merge_it_became(served: Any) -> None:
    c, _, body, part, _ = served
    plain = c.post("/v1/plans", json=body).json()
    assert "tensors" not in plain  # the plan summary is unchanged unless asked
    p = c.post("/v1/plans?tensors=true", json=body).json()
    assert p["plan_hash"] == part["plan_hash"]
    merged = c.get(f"/v1/merges/{part['id']}/tensor-shares").json()["tensors"]
    assert p["tensors"] == merged


def test_model_stats_are_the_delta_norms_and_lineage_depth(served: Any) -> None:
    c, fam, *_ = served
    chained = run_merge(c, {"base": "base", "experts": [{"model": "lin-40"}, {"model": "e1"}],
                            "operator": "task_arithmetic", "output": {"name": "chained"}})
    assert chained["status"] == "succeeded"
    stats = {m["name"]: m for m in c.get("/v1/model-stats").json()["models"]}
    base = factory.load(fam["base"])
    for e in EXPERTS:
        deltas = [(t - base[n]).double() for n, t in factory.load(fam[e]).items()]
        want = math.sqrt(sum(float((d * d).sum()) for d in deltas))
        assert math.isclose(stats[e]["delta_l2"], want, rel_tol=1e-5), e
        assert stats[e]["delta_nnz"] == sum(int((d != 0).sum()) for d in deltas)
        assert stats[e]["numel"] == sum(d.numel() for d in deltas)
    assert stats["base"]["delta_l2"] is None
    assert {n: stats[n]["lineage_depth"] for n in ("base", "e1", "lin-40", "chained")} == {
        "base": 0, "e1": 0, "lin-40": 1, "chained": 2}
    blocks = rows(c, "SELECT model, count(*) FROM blocks GROUP BY model")
    assert {m: n for m, n in blocks} == {n: s["n_blocks"] for n, s in stats.items()}


def test_operators_come_from_the_registry() -> None:
    from mergepipe.service.routes.operators import operators
    ops = {o["name"]: o for o in operators()["operators"]}
    assert list(ops) == list(REGISTRY)
    for name, spec in REGISTRY.items():
        o = ops[name]
        assert (o["additive"], o["density"]) == (spec.additive, spec.density)
        params = {p["name"]: p for p in o["params"]}
        assert params["normalize"]["default"] is spec.normalize_default
        assert {"lambda", "utility", "unit"} <= params.keys()
        assert params["unit"]["default"] == spec.planning_unit
        assert {p.name for p in spec.params} <= params.keys()


def test_identical_tensors_are_those_whose_nonzero_blocks_were_all_read(served: Any) -> None:
    c, _, _, part, full = served
    same = c.get(f"/v1/merges/{full['id']}/identical-tensors?reference={full['id']}").json()
    assert same["identical"] == same["tensors"] == len(factory.TINY_SHAPES)
    got = c.get(f"/v1/merges/{part['id']}/identical-tensors?reference={full['id']}").json()
    # a tensor comes out bit-identical to the full merge iff no block with a delta was skipped
    skipped = rows(c, (
        "SELECT DISTINCT s.tensor FROM block_stats s WHERE s.model IN ('e0', 'e1', 'e2') "
        "AND s.l2 > 0 AND NOT EXISTS (SELECT 1 FROM touched_blocks t WHERE t.merge_id = "
        f"'{part['id']}' AND t.model = s.model AND t.tensor = s.tensor "
        "AND t.block_index = s.block_index)"))
    assert got["tensors"] == len(factory.TINY_SHAPES)
    assert got["identical"] == len(factory.TINY_SHAPES) - len(skipped) > 0
    assert_error(c.get(f"/v1/merges/{part['id']}/identical-tensors?reference=m-x"), 404,
                 "not_found", "reference")
    assert_error(c.get(f"/v1/merges/{part['id']}/identical-tensors"), 422, "invalid_request",
                 "reference")
