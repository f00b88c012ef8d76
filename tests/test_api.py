"""The HTTP API in process: every endpoint, with real checkpoints ingested through POST /v1/models."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api_helpers import (
    BASE_URL,
    EXPERTS,
    assert_error,
    client_for,
    make_family,
    register_family,
    run_merge,
    settings_for,
    ties_body,
    wait,
)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One server with the family registered and a 50%-budget TIES merge done."""
    tmp = tmp_path_factory.mktemp("api")
    family = make_family(tmp / "data" / "family")
    settings = settings_for(tmp)
    with client_for(settings) as client:
        register_family(client, family)
        merge = run_merge(client, ties_body("ties-50"))
        yield {"client": client, "family": family, "settings": settings, "merge": merge,
               "tmp": tmp}


@pytest.fixture
def client(env: dict[str, Any]) -> TestClient:
    c: TestClient = env["client"]
    return c


# -- health and docs ----------------------------------------------------------------------------
def test_healthz_and_openapi(client: TestClient) -> None:
    r = client.get("/healthz")
    assert r.status_code == 200
    assert r.json()["status"] == "ok" and r.json()["workers"] == 2
    assert client.get("/docs").status_code == 200
    paths = client.get("/openapi.json").json()["paths"]
    for p in ("/v1/models", "/v1/models/{name}", "/v1/plans", "/v1/merges", "/v1/merges/{merge_id}",
              "/v1/merges/{merge_id}/manifest", "/v1/merges/{merge_id}/touched-blocks",
              "/v1/lineage/{name}", "/v1/sql", "/healthz"):
        assert p in paths, p


# -- models -------------------------------------------------------------------------------------
def test_models_are_listed_ready_with_their_catalog_fields(client: TestClient) -> None:
    models = {m["name"]: m for m in client.get("/v1/models").json()["models"]}
    assert {"base", *EXPERTS, "ties-50"} <= set(models)
    for name in ("base", *EXPERTS):
        assert models[name]["status"] == "ready"
        assert models[name]["n_tensors"] > 0
        assert models[name]["has_stats"] is (name != "base")
    assert models["e1"]["base"] == "base" and models["base"]["base"] is None
    one = client.get("/v1/models/e1").json()
    assert one["name"] == "e1" and one["job"]["status"] == "succeeded"
    assert one["job"]["progress"]["done"] == one["job"]["progress"]["total"] > 0


def test_registration_is_202_with_a_job_and_visible_at_once(env: dict[str, Any],
                                                           client: TestClient) -> None:
    fam = env["family"]
    r = client.post("/v1/models", json={"name": "e0-again", "path": str(fam["e0"]),
                                        "base": "base", "kind": "full"})
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["status"] in ("queued", "running", "succeeded") and job["model"] == "e0-again"
    assert r.headers["location"] == "/v1/models/e0-again"
    seen = client.get("/v1/models/e0-again").json()
    assert seen["status"] in ("ingesting", "ready")
    assert wait(client, "/v1/models/e0-again")["status"] == "ready"
    # the job is closed just after the model's rows are committed: poll the job itself
    done = wait(client, f"/v1/ingestions/{job['id']}")
    assert done["status"] == "succeeded" and done["error"] is None


def test_relative_paths_resolve_inside_the_data_root(client: TestClient) -> None:
    r = client.post("/v1/models", json={"name": "e2-rel", "path": "family/e2", "base": "base"})
    assert r.status_code == 202, r.text
    assert wait(client, "/v1/models/e2-rel")["status"] == "ready"


def test_a_broken_checkpoint_fails_with_its_error_and_the_name_can_be_reused(
        env: dict[str, Any], client: TestClient) -> None:
    bad = env["tmp"] / "data" / "broken"
    bad.mkdir()
    (bad / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    r = client.post("/v1/models", json={"name": "broken", "path": str(bad), "base": "base"})
    assert r.status_code == 202, r.text
    m = wait(client, "/v1/models/broken")
    assert m["status"] == "failed" and m["error"], m
    listed = {x["name"]: x for x in client.get("/v1/models").json()["models"]}
    assert listed["broken"]["status"] == "failed"
    # a failed name is not taken: register the real checkpoint under it
    r = client.post("/v1/models", json={"name": "broken", "path": str(env["family"]["e1"]),
                                        "base": "base"})
    assert r.status_code == 202, r.text
    assert wait(client, "/v1/models/broken")["status"] == "ready"


def test_model_errors(env: dict[str, Any], client: TestClient) -> None:
    fam = env["family"]
    assert_error(client.get("/v1/models/nope"), 404, "not_found", "name")
    assert_error(client.get("/v1/ingestions/ing-nope"), 404, "not_found", "job_id")
    assert_error(client.post("/v1/models", json={"name": "x", "path": str(fam["e0"]),
                                                  "base": "nope"}), 404, "not_found", "base")
    # A name in use gets a new version (tests/test_lifecycle.py); a version key is no name.
    assert_error(client.post("/v1/models", json={"name": "e1~2", "path": str(fam["e1"]),
                                                  "base": "base"}), 422, "invalid_request", "name")
    assert_error(client.post("/v1/models", json={"name": "../evil", "path": str(fam["e1"]),
                                                  "base": "base"}), 422, "invalid_request", "name")
    assert_error(client.post("/v1/models", json={"path": str(fam["e1"])}),
                 422, "invalid_request", "name")
    assert_error(client.post("/v1/models", json={"name": "x", "path": str(fam["e1"]),
                                                  "kind": "zip"}), 422, "invalid_request", "kind")
    assert_error(client.post("/v1/models", json={"name": "x", "path": str(fam["e1"]),
                                                  "colour": "red"}),
                 422, "invalid_request", "colour")
    assert_error(client.post("/v1/models", json={"name": "x", "path": "family/missing",
                                                  "base": "base"}), 422, "invalid_request", "path")
    assert_error(client.post("/v1/models", json={"name": "x", "path": str(fam["e1"]),
                                                  "kind": "lora"}), 422, "invalid_request", "base")
    r = client.post("/v1/models", content=b"{not json", headers={"content-type": "application/json"})
    assert_error(r, 422, "invalid_request")


def test_paths_outside_the_data_roots_are_forbidden(env: dict[str, Any],
                                                    client: TestClient) -> None:
    tmp: Path = env["tmp"]
    outside = tmp / "outside"
    outside.mkdir(exist_ok=True)
    link = tmp / "data" / "sneaky"
    if not link.exists():
        link.symlink_to(outside, target_is_directory=True)
    for path in ("/etc", str(outside), "../outside", "family/../../outside", str(link),
                 "/nonexistent/secret"):
        err = assert_error(client.post("/v1/models", json={"name": "x", "path": path,
                                                            "base": "base"}),
                           403, "forbidden", "path")
        assert "outside" in err["message"]


# -- plans --------------------------------------------------------------------------------------
def test_plan_is_a_dry_run_with_a_stable_hash(client: TestClient) -> None:
    body = ties_body("unused", fraction=0.3)
    body.pop("output")
    before = len(client.get("/v1/merges").json()["merges"])
    a = client.post("/v1/plans", json=body)
    assert a.status_code == 200, a.text
    s = a.json()
    assert s["operator"] == "ties" and s["plan_hash"]
    assert s["planned_expert_bytes"] <= s["budget_bytes"] <= s["full_read_bytes"]
    assert (s["unit"], s["unit_region"]) == ("expert_block", None)  # the operator's default
    grouped = client.post("/v1/plans", json={**body, "params": {**body.get("params", {}),
                                                                "unit": "group"}}).json()
    assert (grouped["unit"], grouped["unit_region"]) == ("group", "tensor")
    assert grouped["plan_hash"] != s["plan_hash"]
    assert client.post("/v1/plans", json=body).json()["plan_hash"] == s["plan_hash"]
    assert len(client.get("/v1/merges").json()["merges"]) == before
    body["budget"] = {"fraction": 1.0}
    assert client.post("/v1/plans", json=body).json()["plan_hash"] != s["plan_hash"]


def test_plan_errors(client: TestClient) -> None:
    body = ties_body("x")
    body.pop("output")
    assert_error(client.post("/v1/plans", json={**body, "operator": "magic"}),
                 422, "invalid_request", "operator")
    assert_error(client.post("/v1/plans", json={**body, "experts": [{"model": "e0"},
                                                                    {"model": "ghost"}]}),
                 404, "not_found", "experts[1].model")
    assert_error(client.post("/v1/plans", json={**body, "budget": {"fraction": 0}}),
                 422, "invalid_request", "budget.fraction")
    assert_error(client.post("/v1/plans", json={**body, "budget": {"fraction": 0.5,
                                                                   "bytes": 10}}),
                 422, "invalid_request", "budget")
    assert_error(client.post("/v1/plans", json={**body, "experts": [{"model": "e0",
                                                                     "density": 1.5}]}),
                 422, "invalid_request", "experts[0].density")
    assert_error(client.post("/v1/plans", json={**body, "experts": []}),
                 422, "invalid_request", "experts")
    assert_error(client.post("/v1/plans", json={**body, "params": {"colour": 1}}),
                 422, "invalid_request", "params")
    assert_error(client.post("/v1/plans", json={**body, "params": {"unit": "rows"}}),
                 422, "invalid_request", "params.unit")


# -- merges -------------------------------------------------------------------------------------
def test_merge_status_io_and_output(env: dict[str, Any], client: TestClient) -> None:
    m = env["merge"]
    assert m["status"] == "succeeded" and m["error"] is None
    assert m["operator"] == "ties" and m["base"] == "base"
    assert 0 < m["expert_bytes_read"] <= m["budget_bytes"] < m["full_read_bytes"]
    assert m["progress"]["done"] == m["progress"]["total"] > 0
    assert [e["model"] for e in m["experts"]] == list(EXPERTS)
    out = env["settings"].output_root / "ties-50"
    assert m["output"]["path"] == str(out) and (out / "model.safetensors").is_file()
    assert not any(p.name.startswith(".") for p in out.parent.iterdir())
    model = client.get("/v1/models/ties-50").json()
    assert model["status"] == "ready" and model["source_merge"] == m["id"]
    listed = client.get("/v1/merges", params={"limit": 1000}).json()["merges"]
    assert m["id"] in [x["id"] for x in listed]


def test_manifest_is_the_published_file(env: dict[str, Any], client: TestClient) -> None:
    m = env["merge"]
    r = client.get(f"/v1/merges/{m['id']}/manifest")
    assert r.status_code == 200, r.text
    on_disk = json.loads((env["settings"].output_root / "ties-50" / "manifest.json").read_text())
    assert r.json() == on_disk
    assert r.json()["merge_id"] == m["id"]


def test_touched_blocks_pages_by_offset_and_by_cursor(env: dict[str, Any],
                                                      client: TestClient) -> None:
    mid = env["merge"]["id"]
    sql = client.post("/v1/sql", json={"sql": "SELECT model, tensor, block_index FROM "
                                              f"touched_blocks WHERE merge_id = '{mid}' "
                                              "ORDER BY rank"}).json()["rows"]
    assert sql
    first = client.get(f"/v1/merges/{mid}/touched-blocks", params={"limit": 7}).json()
    assert first["total"] == len(sql) and len(first["blocks"]) == min(7, len(sql))
    by_offset, offset = [], 0
    while True:
        page = client.get(f"/v1/merges/{mid}/touched-blocks",
                          params={"limit": 7, "offset": offset}).json()
        if not page["blocks"]:
            break
        by_offset += page["blocks"]
        offset += 7
    by_cursor, cursor = [], None
    for _ in range(1000):
        params: dict[str, Any] = {"limit": 7} | ({"cursor": cursor} if cursor else {})
        page = client.get(f"/v1/merges/{mid}/touched-blocks", params=params).json()
        by_cursor += page["blocks"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    keys = [[b["model"], b["tensor"], b["block_index"]] for b in by_offset]
    assert keys == sql and by_cursor == by_offset
    assert [b["rank"] for b in by_cursor] == sorted(b["rank"] for b in by_cursor)
    assert_error(client.get(f"/v1/merges/{mid}/touched-blocks", params={"cursor": "garbage"}),
                 422, "invalid_request", "cursor")
    assert_error(client.get(f"/v1/merges/{mid}/touched-blocks", params={"limit": 0}),
                 422, "invalid_request", "limit")


def test_merge_errors(env: dict[str, Any], client: TestClient) -> None:
    assert_error(client.get("/v1/merges/m-nope"), 404, "not_found", "merge_id")
    assert_error(client.get("/v1/merges/m-nope/manifest"), 404, "not_found", "merge_id")
    assert_error(client.get("/v1/merges/m-nope/touched-blocks"), 404, "not_found", "merge_id")
    assert_error(client.post("/v1/merges", json=ties_body("ties-50")),
                 409, "conflict", "output.name")
    assert_error(client.post("/v1/merges", json=ties_body("e1")), 409, "conflict", "output.name")
    for bad in ("../up", "a/b", "..", ".hidden", ""):
        assert_error(client.post("/v1/merges", json=ties_body(bad)),
                     422, "invalid_request", "output.name")
    assert_error(client.post("/v1/merges", json=ties_body("x", base="ghost")),
                 404, "not_found", "base")
    assert_error(client.post("/v1/merges", json={**ties_body("x"), "seed": -1}),
                 422, "invalid_request", "seed")
    body = ties_body("x")
    body.pop("output")
    assert_error(client.post("/v1/merges", json=body), 422, "invalid_request", "output")
    assert not (env["settings"].output_root / "x").exists()


def test_chained_merge_and_lineage_depth(env: dict[str, Any], client: TestClient) -> None:
    body = {"base": "base", "experts": [{"model": "ties-50", "weight": 2.0}, {"model": "e2"}],
            "operator": "task_arithmetic", "params": {"lambda": 0.5},
            "budget": {"bytes": 10**9}, "output": {"name": "chain-2"}}
    m = run_merge(client, body)
    assert m["expert_bytes_read"] <= m["budget_bytes"]
    lin = client.get("/v1/lineage/chain-2").json()
    assert lin["depth"] == 2
    edges = {(e["child"], e["parent"], e["role"]): e for e in lin["ancestors"]}
    assert edges[("chain-2", "ties-50", "expert")]["weight"] == 2.0
    assert edges[("chain-2", "ties-50", "expert")]["depth"] == 1
    assert edges[("chain-2", "base", "base")]["depth"] == 1
    assert edges[("ties-50", "e0", "expert")]["depth"] == 2
    below = {(e["child"], e["parent"]): e["depth"]
             for e in client.get("/v1/lineage/e0").json()["descendants"]}
    assert below[("ties-50", "e0")] == 1 and below[("chain-2", "ties-50")] == 2
    top = client.get("/v1/lineage/chain-2").json()
    assert top["descendants"] == []
    base = client.get("/v1/lineage/base").json()
    assert base["ancestors"] == [] and base["depth"] == 0
    assert_error(client.get("/v1/lineage/ghost"), 404, "not_found", "name")


# -- sql ----------------------------------------------------------------------------------------
def test_sql_select_and_refusals(env: dict[str, Any], client: TestClient) -> None:
    r = client.post("/v1/sql", json={"sql": "SELECT name, kind FROM models WHERE name = 'e0'"})
    assert r.status_code == 200, r.text
    assert r.json() == {"columns": ["name", "kind"], "rows": [["e0", "full"]],
                        "truncated": False}
    r = client.post("/v1/sql", json={"sql": "SELECT 'nan'::FLOAT8 AS x, 'inf'::FLOAT8 AS y"})
    assert r.status_code == 200 and r.json()["rows"] == [[None, None]]  # JSON has no NaN
    data = env["tmp"] / "data" / "family" / "base" / "config.json"
    for bad in ("DROP TABLE models", "DELETE FROM merges", "SELECT 1; DROP TABLE models",
                "INSERT INTO models SELECT * FROM models", "ATTACH 'x.db' AS x",
                "COPY models TO 'x.csv'", "PRAGMA database_list", "SET threads = 1",
                f"SELECT * FROM read_text('{data}')", f"SELECT * FROM '{data}'",
                "SELECT * FROM duckdb_settings()", "SELECT * FROM checkpoint()",
                "SELECT getenv('HOME')", "SELECT * FROM nowhere", "SELEC 1", ""):
        assert_error(client.post("/v1/sql", json={"sql": bad}), 422, "invalid_request", "sql")
    rows = client.post("/v1/sql", json={"sql": "SELECT count(*) FROM models"}).json()["rows"]
    assert rows[0][0] >= 4  # nothing above was applied


def test_sql_row_and_time_limits(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    with client_for(settings_for(tmp_path, sql_row_limit=5, sql_timeout_s=0.5,
                                 sql_result_bytes=1000)) as c:
        for _ in range(120):  # the first query starts the SQL workers (imports: ~1 s or more)
            if c.post("/v1/sql", json={"sql": "SELECT 1"}).status_code == 200:
                break
            time.sleep(0.5)
        r = c.post("/v1/sql", json={"sql": "SELECT * FROM generate_series(1, 100)"})
        assert r.json()["truncated"] is True and len(r.json()["rows"]) == 5
        err = assert_error(c.post("/v1/sql", json={
            "sql": "SELECT count(*) FROM generate_series(1, 10000000000) a"}), 422, "invalid_request", "sql")
        assert "time limit" in err["message"]
        err = assert_error(c.post("/v1/sql", json={"sql": "SELECT repeat('x', 2000)"}),
                           422, "invalid_request", "sql")
        assert "byte limit" in err["message"]


# -- generic error classes ----------------------------------------------------------------------
def test_unknown_routes_and_methods_use_the_error_shape(client: TestClient) -> None:
    assert_error(client.get("/v1/nothing"), 404, "not_found")
    assert_error(client.delete("/v1/models"), 405, "method_not_allowed")


def test_internal_faults_are_500_without_internals(
        client: TestClient, env: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    import mergepipe.service.routes.lineage as lineage_route

    def boom(*a: Any) -> Any:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(lineage_route, "model_lineage", boom)
    c = TestClient(client.app, raise_server_exceptions=False, base_url=BASE_URL)
    err = assert_error(c.get("/v1/lineage/base"), 500, "internal_error")
    assert "secret" not in err["message"]


def test_healthz_is_503_when_the_catalog_fails(client: TestClient,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import mergepipe.service.routes.health as health_route

    def boom(*a: Any) -> Any:
        raise RuntimeError("db gone")

    monkeypatch.setattr(health_route.queue, "ping", boom)
    assert_error(client.get("/healthz"), 503, "unavailable")


@pytest.mark.parametrize("kind", ["lora", "delta"])
def test_lora_and_delta_checkpoints_register_and_merge(env: dict[str, Any], client: TestClient,
                                                       kind: str) -> None:
    from tests import factory

    root = env["tmp"] / "data" / f"{kind}-expert"
    if kind == "lora":
        factory.make_lora(env["family"]["base"], root, seed=5)
    else:
        factory.make_delta(env["family"]["base"], root, seed=6)
    r = client.post("/v1/models", json={"name": f"{kind}-x", "path": str(root), "kind": kind,
                                        "base": "base"})
    assert r.status_code == 202, r.text
    m = wait(client, f"/v1/models/{kind}-x")
    assert m["status"] == "ready" and m["kind"] == kind, m
    if kind == "lora":
        assert m["lora_scale"] == 2.0  # alpha 8 / r 4
    merged = run_merge(client, {"base": "base", "experts": [{"model": f"{kind}-x"},
                                                             {"model": "e1"}],
                                "operator": "task_arithmetic", "budget": {"fraction": 0.5},
                                "output": {"name": f"{kind}-merged"}})
    assert merged["expert_bytes_read"] <= merged["budget_bytes"]


def test_strategy_field_plans_and_merges_incrementally(client: TestClient) -> None:
    """docs/incremental.md: `strategy` in plan and merge bodies, refusals as 422."""
    body = {"base": "base", "operator": "linear", "params": {"normalize": True}}
    first = run_merge(client, {**body, "experts": [{"model": "e0"}, {"model": "e1"}],
                               "strategy": "scratch", "output": {"name": "lin-2"}})
    assert first["strategy"] == "scratch"
    three = {**body, "experts": [{"model": e} for e in EXPERTS]}
    plan = client.post("/v1/plans", json={**three, "strategy": "incremental"}).json()
    inc = plan["strategy"]["incremental"]
    assert plan["strategy"]["chosen"] == "incremental" and inc["previous_model"] == "lin-2"
    assert inc["planned_expert_bytes"] < plan["strategy"]["scratch"]["planned_expert_bytes"]
    m = run_merge(client, {**three, "strategy": "incremental", "output": {"name": "lin-3"}})
    assert (m["strategy"], m["previous_merge"]) == ("incremental", first["id"])
    edges = {(e["parent"], e["role"]) for e in client.get("/v1/lineage/lin-3").json()["ancestors"]}
    assert ("lin-2", "previous") in edges and ("e2", "expert") in edges
    ties = {**three, "operator": "ties", "params": {"density": 0.5}, "strategy": "incremental"}
    err = assert_error(client.post("/v1/plans", json=ties), 422, "invalid_request", "strategy")
    assert "sign" in json.dumps(err)
    assert client.post("/v1/plans", json={**three, "strategy": "fastest"}).status_code == 422
