"""The catalog on a real PostgreSQL server: same schema, same plans, same merges as on DuckDB."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mergepipe.catalog import records
from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog, CatalogUnavailable
from mergepipe.core.request import build_request
from mergepipe.jobs.merge import merge
from mergepipe.planner.plan import make_plan
from tests.executor_family import ingest_family

MIXED = ("full", "delta", "lora")
# (table, column) -> (type, nullable, has a default), in DuckDB's spelling
PG_TYPES = {"character varying": "VARCHAR", "bigint": "BIGINT", "integer": "INTEGER",
            "double precision": "DOUBLE", "boolean": "BOOLEAN", "json": "JSON",
            "timestamp without time zone": "TIMESTAMP", "_int8": "BIGINT[]",
            "_float8": "DOUBLE[]"}
COLUMNS = SQL("""SELECT table_name, column_name, data_type, udt_name, is_nullable,
                            column_default IS NOT NULL AS has_default
                     FROM information_schema.columns
                     WHERE table_schema = CAST(:schema AS VARCHAR)""")
KEYS = SQL("""SELECT tc.table_name, tc.constraint_type, kcu.column_name
                  FROM information_schema.table_constraints tc
                  JOIN information_schema.key_column_usage kcu
                    ON kcu.constraint_name = tc.constraint_name
                   AND kcu.table_name = tc.table_name
                  WHERE tc.table_schema = CAST(:schema AS VARCHAR)
                    AND tc.constraint_type IN ('PRIMARY KEY', 'UNIQUE')""")


def _schema(cat: Catalog, schema: str) -> tuple[set[tuple], set[tuple]]:
    cols = set()
    for t, c, dtype, udt, null, default in cat.query(COLUMNS, {"schema": schema}):
        ty = PG_TYPES.get(udt if dtype == "ARRAY" else dtype, dtype) if cat.postgres else dtype
        cols.add((t, c, ty, null, bool(default)))
    return cols, {tuple(r) for r in cat.query(KEYS, {"schema": schema})}


def test_migrations_give_the_same_schema_on_both(tmp_path: Path, postgres_url: str) -> None:
    with Catalog(tmp_path / "c.duckdb") as duck, Catalog(postgres_url) as pg:
        assert pg.migrate() == []  # applied once, recorded
        d_cols, d_keys = _schema(duck, "main")
        p_cols, p_keys = _schema(pg, "public")
        assert p_cols == d_cols
        assert p_keys == d_keys
        assert ("tensors", "shape", "BIGINT[]", "NO", False) in p_cols
        assert ("blocks", "PRIMARY KEY", "block_index") in p_keys
        versions = [r[0] for r in pg.query(SQL("SELECT version FROM schema_migrations"))]
        assert versions == [r[0] for r in duck.query(SQL(
            "SELECT version FROM schema_migrations"))]


@pytest.mark.parametrize("op,params,budget", [
    pytest.param("linear", {}, None, marks=pytest.mark.slow),
    ("ties", {"density": 0.5}, "0.4"),
    pytest.param("task_arithmetic", {}, "0.25", marks=pytest.mark.slow)])
def test_same_family_same_plans_and_outputs(tmp_path: Path, postgres_url: str, op: str,
                                           params: dict, budget: str | None) -> None:
    """Ingest one family into both catalogs: identical plan hashes, access sets, bounds and
    output bytes (a full, a delta and a LoRA expert; statistics, trims, fill passes)."""
    results = []
    with Catalog(tmp_path / "c.duckdb") as duck, Catalog(postgres_url) as pg:
        for cat in (duck, pg):
            root = tmp_path / ("pg" if cat.postgres else "duck")
            ingest_family(cat, root / "fam", kinds=MIXED, seed=3)
            req = build_request(base="base", experts="e0,e1:0.5,e2:2", operator=op,
                                params=params, budget=budget)
            p = make_plan(cat, req)
            s = merge(cat, req, root / "out")
            results.append((p, s, records.get_merge(cat, str(s.merge_id))))
    (pd, sd, rd), (pp, sp, rp) = results
    assert pp.plan_hash == pd.plan_hash
    assert [(b.model, b.tensor, b.block_index) for b in pp.blocks] == [
        (b.model, b.tensor, b.block_index) for b in pd.blocks]
    assert pp.full_read_bytes == pd.full_read_bytes and pp.budget_bytes == pd.budget_bytes
    assert pp.omission_bound == pytest.approx(pd.omission_bound)
    assert sp.plan_hash == sd.plan_hash and sp.output_hash == sd.output_hash
    assert sp.expert_bytes_read == sd.expert_bytes_read
    # Timing differs; the L2 bound is a SQL SUM, whose order (and so last bit) is the engine's.
    inexact = {"planning_seconds", "omission_bound_l2"}
    assert rp.plan is not None and rd.plan is not None
    assert ({k: v for k, v in rp.plan.items() if k not in inexact}
            == {k: v for k, v in rd.plan.items() if k not in inexact})
    bound_p, bound_d = rp.plan.get("omission_bound_l2"), rd.plan.get("omission_bound_l2")
    assert (bound_p is None) == (bound_d is None)
    assert bound_d is None or bound_p == pytest.approx(bound_d, rel=1e-12)
    assert rp.request == rd.request
    assert rp.status == rd.status == "succeeded" and rp.blocks_done == rd.blocks_done


@pytest.mark.slow  # six CLI start-ups
def test_cli_end_to_end_on_postgres(tmp_path: Path, postgres_url: str) -> None:
    """ingest, plan, merge, models and sql through the CLI with MERGEPIPE_CATALOG=postgresql://."""
    from tests import factory

    base = factory.make_base(tmp_path / "base", seed=5)
    expert = factory.make_expert(base, tmp_path / "e0", seed=6)
    env = dict(os.environ, MERGEPIPE_CATALOG=postgres_url)

    def cli(*args: str) -> str:
        r = subprocess.run([sys.executable, "-m", "mergepipe", *args], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout

    cli("ingest", str(base), "--name", "base")
    cli("ingest", str(expert), "--name", "e0", "--base", "base")
    models = cli("models", "--json")
    assert "e0" in models and "base" in models
    plan = json.loads(cli("plan", "--base", "base", "--experts", "e0", "--op", "linear", "--json"))
    out = json.loads(cli("merge", "--base", "base", "--experts", "e0", "--op", "linear", "--out",
                         str(tmp_path / "merged"), "--json"))
    assert out["plan_hash"] == plan["plan_hash"]
    assert (tmp_path / "merged" / "manifest.json").is_file()
    assert "merged" in cli("models", "--json")
    rows = json.loads(cli("sql", "SELECT name FROM models ORDER BY name", "--json"))
    assert rows["rows"] == [["base"], ["e0"], ["merged"]]


def test_unreachable_postgres_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CatalogUnavailable) as e:
        Catalog("postgresql://nobody:secret@127.0.0.1:9/nothing")
    assert "PostgreSQL catalog" in str(e.value) and "secret" not in str(e.value)


def test_user_sql_is_read_only_limited_and_sandboxed(postgres_url: str) -> None:
    from mergepipe.core.errors import InvalidRequest
    from mergepipe.core.sql_limits import SqlLimits
    from mergepipe.sandbox.user_sql import run_user_sql

    with Catalog(postgres_url) as cat:
        cat.execute(SQL("INSERT INTO lineage VALUES ('c', 'p', 'base', 1.5, 'm-1')"))
        got = run_user_sql(cat, "SELECT child, weight, 'a%' AS pct FROM lineage",
                           SqlLimits())
        assert got == {"columns": ["child", "weight", "pct"], "rows": [["c", 1.5, "a%"]],
                       "truncated": False}
        many = run_user_sql(cat, "SELECT g FROM generate_series(1, 50) AS g",
                            SqlLimits(row_limit=7))
        assert len(many["rows"]) == 7 and many["truncated"]
        refused = {
            "SELECT 1; DELETE FROM lineage": "one SELECT",
            "WITH d AS (DELETE FROM lineage RETURNING *) SELECT * FROM d": "read-only",
            "SELECT set_config('role', 'mergepipe', true)": "not allowed",
            "SELECT pg_sleep(5)": "not allowed",
            "SELECT * FROM pg_authid": "permission denied",
            "SELECT count(*) FROM generate_series(1, 1000000000)": "time limit",
            "SELECT repeat('x', 5000)": "byte limit",
            '=20\u00f2"': "query failed",  # found by the API fuzzer: a 500 on 0.x
        }
        for sql, why in refused.items():
            with pytest.raises(InvalidRequest) as e:
                run_user_sql(cat, sql, SqlLimits(timeout_s=0.3, result_bytes=1000))
            assert why in str(e.value), (sql, str(e.value))
        assert cat.query(SQL("SELECT count(*) FROM lineage"))[0][0] == 1


def test_dialect_rewrites_are_the_documented_ones() -> None:
    from mergepipe.catalog import dialect

    before, sql = dialect.to_postgres(
        "CREATE OR REPLACE TEMP TABLE planner_x AS SELECT CAST(0 AS DOUBLE) AS d, "
        "CAST(NULL AS DOUBLE PRECISION) AS e")
    assert before == ["DROP TABLE IF EXISTS pg_temp.planner_x"]
    assert sql == ("CREATE TEMP TABLE planner_x AS SELECT CAST(0 AS DOUBLE PRECISION) AS d, "
                   "CAST(NULL AS DOUBLE PRECISION) AS e")
    assert dialect.to_postgres("SELECT 1") == ([], "SELECT 1")
    # a filter on a list of names: DuckDB's list_contains, PostgreSQL's = ANY
    assert dialect.to_postgres(
        "SELECT * FROM blocks b WHERE list_contains(CAST(%(models)s AS VARCHAR[]), b.model)"
    ) == ([], "SELECT * FROM blocks b WHERE (b.model = ANY(CAST(%(models)s AS VARCHAR[])))")
    # a table re-made from itself (the planner's coherent groups) reads its previous version
    before, sql = dialect.to_postgres(
        "CREATE OR REPLACE TEMP TABLE planner_c AS SELECT c.* FROM planner_c c, planner_cx x")
    assert before == ["DROP TABLE IF EXISTS pg_temp.planner_c__prev",
                      "ALTER TABLE IF EXISTS pg_temp.planner_c RENAME TO planner_c__prev"]
    assert sql == ("CREATE TEMP TABLE planner_c AS SELECT c.* FROM planner_c__prev c, "
                   "planner_cx x")
    bulk = dialect.unnest_rows(
        "-- note\nINSERT INTO t (model, a, b)\nSELECT %(model)s, unnest(%(a)s), unnest(%(b)s)",
        {"model": "m", "a": [1, 2], "b": [[3, 4], None]})
    assert bulk == ("INSERT INTO t (model, a, b) VALUES (%s, %s, %s)",
                    [("m", 1, [3, 4]), ("m", 2, None)])
    assert dialect.unnest_rows("INSERT INTO t (a) VALUES (%(a)s)", {"a": 1}) is None
    url = "postgresql://u:secret@h:5432/db"
    assert dialect.is_postgres(url) and not dialect.is_postgres(Path("postgresql://x"))
    assert "secret" not in dialect.display(url) and "h:5432/db" in dialect.display(url)
    assert dialect.engine_url(url) == "postgresql+psycopg://u:secret@h:5432/db"
