"""A merge's record: catalog rows and manifest.json agree with what was read and written."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import xxhash
from safetensors import safe_open

from mergepipe.catalog.connection import SQL, Row
from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import Conflict
from mergepipe.core.progress import Progress
from mergepipe.core.request import build_request
from mergepipe.executor.manifest import MANIFEST_FORMAT
from mergepipe.jobs.merge import run_merge, submit_merge
from tests.catalogs import new_catalog
from tests.executor_family import ingest_family


@pytest.fixture(scope="module")
def merged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """One task_arithmetic merge at 40% budget; the tests below only read its record."""
    tmp_path = tmp_path_factory.mktemp("manifest")
    catalog = Catalog(new_catalog(tmp_path))
    ingest_family(catalog, tmp_path / "fam")
    req = build_request(base="base", experts="e0,e1:0.5,e2", operator="task_arithmetic",
                        budget=0.4, seed=3)
    mid = submit_merge(catalog, req, "child", tmp_path / "out").merge_id
    assert mid is not None
    assert catalog.query(SQL("SELECT status FROM merges"))[0][0] == "queued"
    seen: list[Progress] = []
    summary = run_merge(catalog, mid, progress=seen.append).to_dict()
    yield {"cat": catalog, "summary": summary, "progress": seen, "out": tmp_path / "out",
           "request": req}
    catalog.close()


def _json(v: object) -> dict:
    return v if isinstance(v, dict) else json.loads(str(v))


def _rows(cat: Catalog, sql: str, **params: object) -> list[Row]:
    return cat.query(SQL(sql), params)


def test_merge_row_records_the_run(merged: dict) -> None:
    catalog = merged["cat"]
    s = merged["summary"]
    (m,) = _rows(catalog, "SELECT * FROM merges WHERE merge_id = :m", m=s["merge_id"])
    assert m.status == "succeeded" and m.error is None and m.finished_at is not None
    assert (m.operator, m.base, m.seed, m.output_name) == ("task_arithmetic", "base", 3, "child")
    assert m.plan_hash == s["plan_hash"] and m.output_hash == s["output_hash"]
    assert m.expert_bytes_read == s["expert_bytes_read"] <= m.budget_bytes
    assert m.planned_expert_bytes == s["planned_expert_bytes"]
    assert m.base_bytes_read == s["base_bytes_read"] > 0
    assert m.blocks_done == m.blocks_total == s["blocks_total"]
    assert m.omission_bound == pytest.approx(s["omission_bound"])
    assert m.plan_seconds > 0 and m.exec_seconds > 0
    assert _json(m.request)["experts"][1] == {"model": "e1", "weight": 0.5, "density": None}
    plan = _json(m.plan)
    assert plan["plan_hash"] == s["plan_hash"] and plan["trims"] == []


def test_expert_rows_touched_blocks_and_lineage(merged: dict) -> None:
    catalog = merged["cat"]
    mid = merged["summary"]["merge_id"]
    experts = _rows(catalog, "SELECT model, weight, planned_bytes, bytes_read FROM "
                             "merge_experts WHERE merge_id = :m ORDER BY position", m=mid)
    assert [(e.model, e.weight) for e in experts] == [("e0", 1.0), ("e1", 0.5), ("e2", 1.0)]
    assert all(e.planned_bytes == e.bytes_read for e in experts)
    assert sum(e.bytes_read for e in experts) == merged["summary"]["expert_bytes_read"]
    touched = _rows(catalog, "SELECT model, sum(nbytes) AS n FROM touched_blocks "
                             "WHERE merge_id = :m GROUP BY model", m=mid)
    assert {t.model: t.n for t in touched} == {e.model: e.planned_bytes for e in experts
                                                if e.planned_bytes}
    lineage = _rows(catalog, "SELECT child, parent, role, weight FROM lineage "
                             "WHERE merge_id = :m ORDER BY parent", m=mid)
    assert [tuple(r) for r in lineage] == [("child", "base", "base", None),
                                           ("child", "e0", "expert", 1.0),
                                           ("child", "e1", "expert", 0.5),
                                           ("child", "e2", "expert", 1.0)]
    (model,) = _rows(catalog, "SELECT source_merge, base FROM models WHERE name = 'child'")
    assert tuple(model) == (mid, "base")


def test_output_tensor_hashes_are_those_of_the_file_bytes(merged: dict) -> None:
    catalog = merged["cat"]
    mid = merged["summary"]["merge_id"]
    stored = {r.tensor: r.content_hash for r in _rows(
        catalog, "SELECT tensor, content_hash FROM output_tensors WHERE merge_id = :m", m=mid)}
    f = merged["out"] / "model.safetensors"
    with safe_open(str(f), "pt") as st:
        names = list(st.keys())
    assert set(stored) == set(names)
    from mergepipe.storage.safetensors_format import read_header
    raw = f.read_bytes()
    for t in read_header(f).tensors:
        assert stored[t.name] == xxhash.xxh3_128_hexdigest(
            raw[t.data_offset:t.data_offset + t.nbytes]), t.name


def test_manifest_json_matches_the_catalog(merged: dict) -> None:
    catalog = merged["cat"]
    s = merged["summary"]
    doc = json.loads((merged["out"] / "manifest.json").read_text())
    assert doc["format"] == MANIFEST_FORMAT and doc["merge_id"] == s["merge_id"]
    for k in ("plan_hash", "budget_bytes", "full_read_bytes", "planned_expert_bytes",
              "expert_bytes_read", "base_bytes_read"):
        assert doc[k] == s[k], k
    assert doc["omission_bound"] == pytest.approx(s["omission_bound"])
    assert doc["omission_bound_l2"] == pytest.approx(s["omission_bound_l2"])
    assert doc["plan"]["omission_bound_l2"] == pytest.approx(s["omission_bound_l2"])
    assert 0 <= s["omission_bound_l2"] <= s["omission_bound"]
    assert doc["request"] == merged["request"].to_dict()
    assert doc["output"]["hash"] == s["output_hash"]
    assert [i["role"] for i in doc["inputs"]] == ["base", "expert", "expert", "expert"]
    rows = _rows(catalog, "SELECT model, tensor, block_index FROM touched_blocks "
                          "WHERE merge_id = :m", m=s["merge_id"])
    assert sorted(tuple(r[:3]) for r in doc["touched_blocks"]["rows"]) == sorted(
        tuple(r) for r in rows)
    hashes = {r.tensor: r.content_hash for r in _rows(
        catalog, "SELECT tensor, content_hash FROM output_tensors WHERE merge_id = :m",
        m=s["merge_id"])}
    assert {t["name"]: t["content_hash"] for t in doc["output"]["tensors"]} == hashes
    assert len(doc["lineage"]) == 4


def test_progress_is_reported_and_a_merge_runs_once(merged: dict) -> None:
    catalog = merged["cat"]
    last = merged["progress"][-1]
    assert last.unit == "blocks"
    assert last.done == last.total == merged["summary"]["blocks_total"]
    # the reads of this merge (Progress carries no merge id): the final counts at the last report
    assert last.expert_bytes_read == merged["summary"]["expert_bytes_read"]
    assert last.base_bytes_read == merged["summary"]["base_bytes_read"]
    with pytest.raises(Conflict, match="is succeeded, not queued"):
        run_merge(catalog, merged["summary"]["merge_id"])
