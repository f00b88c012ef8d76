"""Requests (issue 11): names matched whole, numbers range-checked where they enter (4xx naming
the field, one line on the CLI), auth and the Host allow-list before the body is read, the
optional read token, `mergepipe sql` never creating a catalog, `serve` refusing an exposed
address without a token, queued outputs' names reserved, and no file-system oracle in configs."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.queue import NewMerge, enqueue
from mergepipe.cli.main import main
from mergepipe.core.mergekit_config import parse_config
from mergepipe.core.request import build_request
from mergepipe.jobs.config import resolve
from tests import factory
from tests.api_helpers import (
    assert_error,
    client_for,
    make_family,
    register_family,
    settings_for,
    ties_body,
)
from tests.catalogs import new_catalog

TOKEN, READ = "write-tok-1", "read-tok-2"
AUTH, READ_AUTH = {"Authorization": f"Bearer {TOKEN}"}, {"Authorization": f"Bearer {READ}"}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp: Path = tmp_path_factory.mktemp("secreq")
    family = make_family(tmp / "data" / "family")
    settings = settings_for(tmp, api_token=TOKEN, read_token=READ)
    with client_for(settings) as c:
        register_family(c, family, headers=AUTH)
        yield {"tmp": tmp, "family": family, "client": c, "settings": settings}


# -- names -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["e0\n", "nl\n", "a\tb", "x\r", "ok\x00", "é"])
def test_names_are_matched_whole(env: dict[str, Any], name: str) -> None:
    """`$` let "e0\\n" through on 0.1: a second "e0" in listings, a directory "nl\\n", a crash
    writing the Location header."""
    c, out = env["client"], env["settings"].output_root
    out.mkdir(exist_ok=True)
    before = sorted(os.listdir(out))
    assert_error(c.post("/v1/merges", json=ties_body(name), headers=AUTH), 422,
                 "invalid_request", "output.name")
    assert_error(c.post("/v1/models", json={"name": name, "path": "family/e1", "base": "base"},
                        headers=AUTH), 422, "invalid_request", "name")
    assert sorted(os.listdir(out)) == before
    names = [m["name"] for m in c.get("/v1/models", headers=READ_AUTH).json()["models"]]
    assert len(names) == len(set(names)) and name not in names


# -- numbers -----------------------------------------------------------------------------------

@pytest.mark.parametrize("budget,field", [
    ({"bytes": 2**64}, "budget.bytes"), ({"bytes": 10**30}, "budget.bytes"),
    ({"bytes": "1000"}, "budget.bytes"), ({"bytes": True}, "budget.bytes"),
    ({"fraction": "0.5"}, "budget.fraction"), ({"fraction": True}, "budget.fraction"),
    ({"fraction": 0}, "budget.fraction"), ({"bytes": 1.5}, "budget.bytes"),
    ({"fraction": 1e300}, "budget.fraction"), ({"fraction": 1.5}, "budget.fraction"),
])
def test_budgets_out_of_range_or_of_the_wrong_type_are_422(env: dict[str, Any],
                                                           budget: dict[str, Any],
                                                           field: str) -> None:
    """2**64 and 10**30 bytes were 500s on 0.1; strings and booleans were accepted. A fraction
    is a share of the full read: {"fraction": 1e300} was the full read on /v1/plans and queued a
    merge on /v1/merges; now both refuse it, naming budget.fraction."""
    c = env["client"]
    plan = {k: v for k, v in ties_body("b-out").items() if k != "output"}
    for url, body in (("/v1/plans", plan), ("/v1/merges", ties_body("b-out"))):
        r = c.post(url, json={**body, "budget": budget}, headers=AUTH)
        assert_error(r, 422, "invalid_request", field)


@pytest.mark.parametrize("change,field", [
    ({"experts": [{"model": "e0", "weight": 1e308}, {"model": "e1"}]}, "experts[0].weight"),
    ({"operator": "task_arithmetic", "params": {"lambda": 1e308}}, "params.lambda"),
    ({"operator": "task_arithmetic", "params": {"lambda": 1e4},
      "experts": [{"model": "e0", "weight": 1e3}]}, "params.lambda"),
])
def test_weights_and_lambda_whose_products_overflow_are_422(env: dict[str, Any],
                                                            change: dict[str, Any],
                                                            field: str) -> None:
    """A weight of 1e308 merged "successfully" on 0.1; lambda 1e308 was published briefly."""
    body = {**ties_body("w-out"), **change}
    if body["operator"] == "task_arithmetic":
        body.pop("params", None) if "params" not in change else None
    assert_error(env["client"].post("/v1/merges", json=body, headers=AUTH), 422,
                 "invalid_request", field)
    assert not (env["settings"].output_root / "w-out").exists()


def test_request_validation_bounds_in_the_core() -> None:
    with pytest.raises(Exception, match="2\\^63"):
        build_request(base="b", experts=[{"model": "e"}], operator="linear",
                      budget={"bytes": 2**64})
    with pytest.raises(Exception, match="lambda"):
        build_request(base="b", experts=[{"model": "e"}], operator="task_arithmetic",
                      params={"lambda": 1e300})


# -- auth, read token, hosts -------------------------------------------------------------------

def test_auth_is_checked_before_the_body_is_parsed(env: dict[str, Any]) -> None:
    """Invalid JSON without a token was answered 400 on 0.1 (the body was parsed first); on
    /v1/plans (open without a token unless the body has a config) too, until the access guard
    read the plan's body itself."""
    c = env["client"]
    for url in ("/v1/models", "/v1/merges", "/v1/plans"):
        r = c.post(url, content=b"{not json", headers={"content-type": "application/json"})
        assert_error(r, 401, "unauthorized")
        r = c.post(url, content=b"{not json", headers={**AUTH,
                                                       "content-type": "application/json"})
        assert r.status_code in (400, 422), r.text


def test_the_read_token_guards_reads_and_sql(env: dict[str, Any]) -> None:
    c = env["client"]
    assert c.get("/healthz").status_code == 200  # probes need no token
    for method, url, body in (("GET", "/v1/models", None), ("GET", "/v1/merges", None),
                              ("POST", "/v1/sql", {"sql": "SELECT 1"})):
        assert_error(c.request(method, url, json=body), 401, "unauthorized")
        assert_error(c.request(method, url, json=body,
                               headers={"Authorization": "Bearer nope"}), 401, "unauthorized")
        for h in (READ_AUTH, AUTH):
            assert c.request(method, url, json=body, headers=h).status_code == 200
    # the read token is not a write token
    assert_error(c.post("/v1/merges", json=ties_body("r"), headers=READ_AUTH), 401,
                 "unauthorized")


@pytest.mark.parametrize("host,ok", [("localhost:8000", True), ("127.0.0.1", True),
                                     ("[::1]:8000", True), ("evil.example", False),
                                     ("evil.example:8000", False), ("localhost.evil", False),
                                     ("testserver", False)])
def test_the_host_allow_list(env: dict[str, Any], host: str, ok: bool) -> None:
    """Any Host was accepted on 0.1: DNS rebinding reached a loopback server's SQL. The test
    client's default name `testserver` is no loopback name: served only when configured."""
    r = env["client"].post("/v1/sql", json={"sql": "SELECT 1"},
                           headers={**READ_AUTH, "host": host})
    if ok:
        assert r.status_code == 200, r.text
    else:
        assert_error(r, 400, "bad_request", "host")


def test_allowed_hosts_from_the_environment(tmp_path: Path) -> None:
    from mergepipe.core.settings import Settings
    s = Settings.from_env({"MERGEPIPE_ALLOWED_HOSTS": "merge.internal, Other.Example"})
    assert s.allowed_hosts == ("merge.internal", "other.example")
    (tmp_path / "data").mkdir()
    with client_for(settings_for(tmp_path, allowed_hosts=s.allowed_hosts)) as c:
        assert c.get("/healthz", headers={"host": "merge.internal"}).status_code == 200
        assert c.get("/healthz", headers={"host": "localhost"}).status_code == 400


# -- CLI ---------------------------------------------------------------------------------------

@pytest.mark.duckdb_only("`mergepipe sql` never creates a missing DuckDB file")
def test_sql_on_a_missing_catalog_is_an_error(tmp_path: Path, capsys: Any) -> None:
    cat = tmp_path / "nope.duckdb"
    assert main(["--catalog", str(cat), "sql", "SELECT 1"]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and len(err.strip().splitlines()) == 1
    assert not cat.exists()


@pytest.mark.parametrize("budget", [str(2**64) + "B", "1e400", "true"])
def test_cli_budgets_are_one_line_errors(tmp_path: Path, capsys: Any, budget: str) -> None:
    cat = str(new_catalog(tmp_path, "c"))
    rc = main(["--catalog", cat, "plan", "--base", "b", "--experts", "e", "--operator", "linear",
               "--budget", budget])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "budget" in err, err


def test_serve_refuses_an_exposed_address_without_a_token(tmp_path: Path, capsys: Any,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.delenv("MERGEPIPE_API_TOKEN", raising=False)
    monkeypatch.delenv("MERGEPIPE_LOOPBACK_ONLY", raising=False)
    (tmp_path / "d").mkdir()
    rc = main(["--catalog", str(new_catalog(tmp_path, "c")), "serve", "--host", "0.0.0.0",
               "--data-root", str(tmp_path / "d"), "--output-root", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "MERGEPIPE_API_TOKEN" in err and "MERGEPIPE_LOOPBACK_ONLY" in err


# -- names reserved, no oracle -----------------------------------------------------------------

def test_a_queued_merge_output_name_is_not_given_to_a_config_ingestion(tmp_path: Path) -> None:
    """On 0.1 a config's checkpoint named like a queued merge's output got that name, and the
    request was refused with a conflict."""
    base = factory.make_base(tmp_path / "base", seed=0)
    factory.make_expert(base, tmp_path / "e9", seed=1)
    with Catalog(new_catalog(tmp_path, "c")) as cat:
        req = build_request(base="x", experts=[{"model": "y"}], operator="linear")
        enqueue(cat, merge=NewMerge(req, "e9", str(tmp_path / "out" / "e9")))
        cfg = parse_config(f"merge_method: task_arithmetic\nbase_model: {base}\nmodels:\n"
                           f"  - model: {tmp_path / 'e9'}\n    parameters: {{weight: 1}}\n")
        resolved = resolve(cat, cfg)
        names = {j.model for j in resolved.to_ingest}
        assert "e9" not in names and len(names) == 2
        enqueue(cat, ingests=resolved.to_ingest)  # no conflict


def test_no_existence_oracle_outside_the_roots(env: dict[str, Any], tmp_path: Path) -> None:
    """Two spellings of one directory outside the roots were told apart from two different
    directories (os.path.samefile on the config's paths) on 0.1."""
    outside = tmp_path / "outside"
    (outside / "real").mkdir(parents=True)
    (outside / "link").symlink_to(outside / "real", target_is_directory=True)
    (outside / "other").mkdir()
    answers = []
    for second in ("link", "other", "missing"):
        cfg = (f"merge_method: task_arithmetic\nbase_model: {outside / 'real'}\nmodels:\n"
               f"  - model: {outside / second}\n    parameters: {{weight: 1}}\n")
        r = env["client"].post("/v1/plans", json={"config_yaml": cfg}, headers=AUTH)
        answers.append((r.status_code, json.dumps(r.json()).replace(second, "X")))
    assert answers[0] == answers[1] == answers[2], answers
    assert answers[0][0] == 403


def test_compose_passes_the_token_and_the_loopback_switch_through() -> None:
    """docker compose up without a token starts `serve --host 0.0.0.0`: the refusal above."""
    import yaml
    api = yaml.safe_load((Path(__file__).parents[1] / "docker-compose.yml").read_text())
    api = api["services"]["api"]
    assert api["command"][api["command"].index("--host") + 1] == "0.0.0.0"
    env = api["environment"]
    assert env["MERGEPIPE_API_TOKEN"].startswith("${MERGEPIPE_API_TOKEN")
    assert env["MERGEPIPE_LOOPBACK_ONLY"].startswith("${MERGEPIPE_LOOPBACK_ONLY")
    assert all(p.startswith("127.0.0.1:") for p in api["ports"])
