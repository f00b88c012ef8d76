"""docker-compose.yml's `cluster` profile, checked by reading (no Docker engine here): a
PostgreSQL service, a server and workers on its catalog with settings the code reads."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from mergepipe.cli.main import build_parser
from mergepipe.core.settings import Settings

REPO = Path(__file__).resolve().parent.parent


def _services() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]


def test_cluster_profile_has_postgres_a_server_and_workers() -> None:
    s = _services()
    assert "profiles" not in s["api"]  # the default `docker compose up` stays DuckDB
    for name in ("postgres", "cluster-api", "worker"):
        assert s[name]["profiles"] == ["cluster"], name
    pg = s["postgres"]
    assert pg["image"].startswith("postgres:") and "ports" not in pg
    assert "pg_isready" in pg["healthcheck"]["test"]
    assert s["worker"]["command"] == ["mergepipe", "worker"]
    assert s["worker"]["deploy"]["replicas"] >= 2
    assert s["cluster-api"]["command"][:2] == ["mergepipe", "serve"]
    args = build_parser().parse_args(s["worker"]["command"][1:])
    assert args.command == "worker"


def test_cluster_services_share_one_catalog_and_storage() -> None:
    s = _services()
    pg_env = s["postgres"]["environment"]
    for name in ("cluster-api", "worker"):
        env = s[name]["environment"]
        url = env["MERGEPIPE_CATALOG"]
        m = re.fullmatch(r"postgresql://(\w+)@postgres:5432/(\w+)", url)
        assert m and m.group(1) == pg_env["POSTGRES_USER"] and m.group(2) == pg_env["POSTGRES_DB"]
        assert env["PGPASSWORD"] == pg_env["POSTGRES_PASSWORD"]
        settings = Settings.from_env({k: str(v) for k, v in env.items()
                                      if not str(v).startswith("${")})
        assert settings.catalog == url  # kept as a URL, not folded into a path
        assert settings.lease_s == float(env["MERGEPIPE_LEASE_S"])
        assert s[name]["depends_on"]["postgres"]["condition"] == "service_healthy"
        targets = {v.split(":")[1] for v in s[name]["volumes"]}
        assert {env["MERGEPIPE_DATA_ROOTS"], env["MERGEPIPE_OUTPUT_ROOT"]} <= targets
    assert s["worker"]["volumes"] == s["cluster-api"]["volumes"]


def test_image_can_carry_the_cluster_extra() -> None:
    text = (REPO / "Dockerfile").read_text()
    assert "ARG EXTRAS=" in text and '[$EXTRAS]"' in text
    assert _services()["api"]["build"]["args"]["EXTRAS"] == "cluster"
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert any(d.startswith("psycopg[binary]") for d in extras["cluster"])
