"""Trying hard to break the read-only SQL of POST /v1/sql and `mergepipe sql`: statements that
write, read files, reveal settings or state, DuckDB-specific syntax, and queries that try to
exhaust the server (rows, bytes, time, concurrency)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import Busy, InvalidRequest
from mergepipe.core.sql_limits import SqlLimits
from mergepipe.sandbox import sql_exec, user_sql
from mergepipe.sandbox.allowed_functions import TABLE
from mergepipe.sandbox.sql_guard import check_query
from mergepipe.sandbox.sql_slots import slots_for
from mergepipe.sandbox.user_sql import run_readonly
from tests.api_helpers import assert_error, client_for, settings_for

pytestmark = pytest.mark.duckdb_only(
    "DuckDB's SQL sandbox (file functions, range(), the guard); the PostgreSQL read-only role "
    "is tested in tests/test_postgres_catalog.py")

SECRET = "TOP-SECRET-4f1d"


@pytest.fixture(scope="module")
def cat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Catalog, Path]]:
    tmp = tmp_path_factory.mktemp("sql")
    secret = tmp / "secret.csv"
    secret.write_text(f"x\n{SECRET}\n")
    with Catalog(tmp / "catalog.duckdb") as c:
        yield c, secret


# Every one of these is refused with a 422 naming the `sql` field, and never shows the secret.
REFUSED = [
    # writes, DDL, several statements, sessions, settings
    "DROP TABLE models", "DELETE FROM merges", "UPDATE models SET kind = 'x'",
    "INSERT INTO lineage SELECT * FROM lineage", "CREATE TABLE t AS SELECT 1",
    "CREATE MACRO m() AS 1", "CREATE SECRET s (TYPE s3)", "ALTER TABLE models ADD c INT",
    "SELECT 1; DROP TABLE models", "SELECT 1; SELECT 2", "BEGIN", "COMMIT", "CHECKPOINT",
    "ATTACH '{secret}' AS x", "DETACH x", "USE memory", "COPY models TO '{secret}'",
    "COPY (SELECT 1) TO '{secret}'", "EXPORT DATABASE '{dir}'", "IMPORT DATABASE '{dir}'",
    "INSTALL httpfs", "LOAD httpfs", "PRAGMA database_list", "PRAGMA version",
    "SET threads = 1", "SET memory_limit = '1GB'", "RESET threads", "SET VARIABLE x = 1",
    "CALL pragma_version()", "EXPLAIN SELECT 1", "EXPLAIN ANALYZE SELECT 1",
    "SUMMARIZE models", "DESCRIBE models", "SHOW TABLES", "SHOW models",
    "PIVOT models ON kind USING count(*)", "VALUES (1)", "VACUUM", "ANALYZE",
    "SELECT * INTO t FROM models", "WITH x AS (DELETE FROM models RETURNING *) SELECT * FROM x",
    # files, through table functions, strings as tables, and scalar functions
    "SELECT * FROM read_text('{secret}')", "SELECT * FROM read_blob('{secret}')",
    "SELECT * FROM read_csv('{secret}')", "SELECT * FROM read_csv_auto('{secret}')",
    "SELECT * FROM sniff_csv('{secret}')", "SELECT * FROM glob('{dir}/*')",
    "SELECT * FROM '{secret}'", "FROM '{secret}'", "SELECT * FROM (FROM '{secret}')",
    "SELECT * FROM (DESCRIBE '{secret}')", "SELECT * FROM (SUMMARIZE '{secret}')",
    "SELECT * FROM \"read_text\"('{secret}')", "SELECT * FROM Read_Text('{secret}')",
    "SELECT * FROM main.read_text('{secret}')", "SELECT * FROM system.main.read_text('{secret}')",
    "SELECT * FROM parquet_scan('{secret}')", "SELECT * FROM parquet_metadata('{secret}')",
    "SELECT * FROM read_json_auto('{secret}')", "SELECT * FROM read_ndjson_objects('{secret}')",
    "SELECT * FROM st_read('{secret}')", "SELECT * FROM sqlite_scan('{secret}', 't')",
    "SELECT (SELECT content FROM read_text('{secret}'))",
    "SELECT * FROM models WHERE EXISTS (FROM read_text('{secret}'))",
    "WITH models AS (SELECT * FROM read_text('{secret}')) SELECT * FROM models",
    "SELECT * FROM range(3) t, LATERAL (SELECT * FROM read_text('{secret}'))",
    "SELECT list_transform([1], x -> (SELECT content FROM read_text('{secret}')))",
    "SELECT * FROM (SUMMARIZE SELECT * FROM read_text('{secret}'))",
    # settings, environment, state, other databases, introspection functions
    "SELECT getenv('HOME')", "SELECT 'a' || getenv('HOME')", "SELECT current_setting('threads')",
    "SELECT current_setting('home_directory')", "SELECT getvariable('x')",
    "SELECT set_config('threads', '1', false)", "SELECT nextval('s')", "SELECT setval('s', 3)",
    "SELECT currval('s')", "SELECT * FROM duckdb_settings()", "SELECT * FROM duckdb_secrets()",
    "SELECT * FROM duckdb_extensions()", "SELECT * FROM duckdb_databases()",
    "SELECT * FROM which_secret('s3://b/k', 's3')", "SELECT * FROM pragma_table_info('models')",
    "SELECT * FROM (SUMMARIZE SELECT * FROM duckdb_settings())",
    "SELECT * FROM (DESCRIBE SELECT current_setting('home_directory'))",
    "SELECT * FROM duckdb_secrets", "SELECT * FROM pg_catalog.pg_settings",
    "SELECT * FROM system.main.models", "SELECT * FROM temp.main.t", "SELECT * FROM x.models",
    "SELECT * FROM query('SELECT 1')", "SELECT * FROM query_table('models')",
    "SELECT * FROM json_execute_serialized_sql(json_serialize_sql('SELECT 1'))",
    "SELECT * FROM repeat_row(1, num_rows := 100000000)", "SELECT * FROM test_all_types()",
    "SELECT * FROM truncate_duckdb_logs()", "SELECT * FROM checkpoint()",
    "SELECT * FROM sqlite_master", "SELECT * FROM nowhere",
    "SELECT table_name FROM information_schema.tables", "SELECT * FROM information_schema.schemata",
    "SELECT * FROM pg_settings", "SELECT * FROM duckdb_databases", "SELECT * FROM pragma_database_list",
    "SELECT current_database()", "SELECT version()", "SELECT current_user", "SELECT pg_typeof(1)",
    # a CTE's name is a table only in the scope where it is defined
    "SELECT * FROM (WITH pg_settings AS (SELECT 1) SELECT 1) t, pg_settings",
    "SELECT * FROM (WITH duckdb_databases AS (SELECT 1) SELECT 1) t, duckdb_databases",
    "SELECT * FROM (WITH pragma_database_list AS (SELECT 1) SELECT 1) t, pragma_database_list",
    "SELECT (WITH pg_settings AS (SELECT 1) SELECT 1), * FROM pg_settings",
    "WITH a AS (WITH duckdb_settings AS (SELECT 1) SELECT 1) SELECT * FROM duckdb_settings",
    "WITH a AS (SELECT * FROM duckdb_settings), duckdb_settings AS (SELECT 1) SELECT * FROM a",
    "WITH duckdb_settings AS (SELECT * FROM duckdb_settings) SELECT * FROM duckdb_settings",
    "(WITH pg_settings AS (SELECT 1) SELECT * FROM pg_settings) UNION ALL "
    "(SELECT 1 FROM pg_settings)",
    "WITH RECURSIVE duckdb_settings AS (SELECT 1 FROM duckdb_settings UNION ALL "
    "SELECT 1 FROM duckdb_settings) SELECT 1",
    # junk
    "", "   ", "SELEC 1", "SELECT 'unterminated", "-- only a comment", "SELECT 1 /*",
]


@pytest.mark.parametrize("sql", REFUSED)
def test_refused(cat: tuple[Catalog, Path], sql: str) -> None:
    c, secret = cat
    q = sql.format(secret=secret, dir=secret.parent)
    with pytest.raises(InvalidRequest) as err:
        run_readonly(c, q, SqlLimits(timeout_s=5))
    assert err.value.field == "sql" and err.value.message
    assert SECRET not in err.value.message


def test_every_table_function_but_the_allowed_ones_is_refused(cat: tuple[Catalog, Path]) -> None:
    """Whatever DuckDB adds in a new version: a table function not allowed by name is refused."""
    raw = duckdb.connect()
    names = {r[0] for r in raw.execute("SELECT DISTINCT function_name FROM duckdb_functions() "
                                       "WHERE function_type IN ('table', 'table_macro')"
                                       ).fetchall()}
    assert len(names) > 20
    raw = duckdb.connect()
    for name in sorted(names - TABLE):
        for sql in (f"SELECT * FROM {name}('x')", f"FROM {name}('x')",
                    f"SELECT * FROM models, {name}('x')"):
            with pytest.raises(InvalidRequest):
                check_query(raw, sql, tables={"models"})
    raw.close()


@pytest.mark.parametrize("sql", [
    "FROM models", "FROM models SELECT name", "SELECT * FROM \"models\"", "TABLE models",
    "SELECT * EXCLUDE (path) FROM models", "SELECT COLUMNS('name|kind') FROM models",
    "FROM range(3) SELECT *", "SELECT * FROM (DESCRIBE models)", "SELECT * FROM (SUMMARIZE models)",
    "SELECT * FROM models UNION BY NAME SELECT * FROM models",
    "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t WHERE n < 5) "
    "SELECT sum(n) FROM t", "WITH a AS (SELECT 1 AS x), b AS (SELECT x FROM a) SELECT * FROM b",
    "WITH models AS (SELECT name FROM models) SELECT * FROM models",
    "SELECT * FROM (WITH m AS (SELECT 1) SELECT * FROM m) t, models",
    "SELECT * FROM unnest([1, 2])", "SELECT 1 -- ; DROP TABLE models", "SELECT $$a;b$$",
])
def test_duckdb_syntax_over_the_catalog_is_allowed(cat: tuple[Catalog, Path], sql: str) -> None:
    out = run_readonly(cat[0], sql, SqlLimits(timeout_s=5))
    assert set(out) == {"columns", "rows", "truncated"}


def test_nothing_was_changed_by_the_refused_statements(cat: tuple[Catalog, Path]) -> None:
    c, secret = cat
    with c.duckdb_reader() as raw:
        tables = {r[0] for r in raw.execute(sql_exec.SELECT_TABLES).fetchall()}
    assert {"models", "merges"} <= tables and "t" not in tables
    assert secret.read_text() == f"x\n{SECRET}\n"
    assert not (secret.parent / "x.csv").exists()


def test_row_byte_and_time_limits(cat: tuple[Catalog, Path]) -> None:
    c, _ = cat
    out = run_readonly(c, "SELECT * FROM range(1000)", SqlLimits(row_limit=10))
    assert out["truncated"] and len(out["rows"]) == 10
    with pytest.raises(InvalidRequest, match="byte limit"):
        run_readonly(c, "SELECT repeat('x', 100000) FROM range(20)", SqlLimits(result_bytes=1 << 20))
    for bomb in ("WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t) "
                 "SELECT count(*) FROM t",
                 "SELECT count(*) FROM range(1000000) a, range(1000000) b"):
        t0 = time.monotonic()
        with pytest.raises(InvalidRequest, match="time limit"):
            run_readonly(c, bomb, SqlLimits(timeout_s=0.3))
        assert time.monotonic() - t0 < 5


def hold_slots(limits: SqlLimits) -> threading.Event:
    """Take every slot of `limits` with queries-in-progress until the returned event is set."""
    release = threading.Event()
    slots = slots_for(limits)
    for _ in range(limits.slots):
        slots.acquire(time.monotonic())
        slots.start(lambda: (release.wait(30), {})[1])
    return release


def test_a_query_deaf_to_interrupts_still_answers_in_time_and_holds_one_slot(
        cat: tuple[Catalog, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """One huge scalar ignores DuckDB's interrupt until it is computed: the caller gets the
    time-limit error anyway, and such queries cannot take more than their slots."""
    c, _ = cat
    monkeypatch.setattr(user_sql, "DEADLINE_GRACE_S", 0.2)
    # about 2 s of work that DuckDB's interrupt cannot stop (md5 of a huge string can be)
    slow = "SELECT length(regexp_replace(repeat('a', 30000000), 'a', 'bb', 'g'))"
    t0 = time.monotonic()
    lim = SqlLimits(timeout_s=0.2, slots=3)
    with pytest.raises(InvalidRequest, match="time limit"):
        run_readonly(c, slow, lim)
    assert time.monotonic() - t0 < 1.5
    # while it still runs, the other slots serve queries; with no slot free: Busy at once
    assert run_readonly(c, "SELECT 42", SqlLimits(timeout_s=5, slots=3))["rows"] == [[42]]
    one = SqlLimits(timeout_s=5, slots=1, queue=0)
    release = hold_slots(one)
    try:
        t0 = time.monotonic()
        with pytest.raises(Busy) as busy:
            run_readonly(c, "SELECT 1", one)
        assert busy.value.status == 429 and busy.value.field == "sql"
        assert time.monotonic() - t0 < 0.5
    finally:
        release.set()
    time.sleep(0.1)
    assert run_readonly(c, "SELECT 1", one)["rows"] == [[1]]


def test_a_bounded_queue_waits_for_a_slot_within_the_time_limit(
        cat: tuple[Catalog, Path]) -> None:
    c, _ = cat
    lim = SqlLimits(timeout_s=3, slots=1, queue=1)
    release = hold_slots(lim)
    got: dict[str, Any] = {}

    def waiter() -> None:
        try:
            got["out"] = run_readonly(c, "SELECT 7", lim)
        except Exception as e:  # noqa: BLE001 - checked below
            got["err"] = e

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.3)  # the waiter holds the one place in the queue: a third caller is refused
    t0 = time.monotonic()
    with pytest.raises(Busy):
        run_readonly(c, "SELECT 1", lim)
    assert time.monotonic() - t0 < 0.5
    release.set()
    t.join(5)
    assert got.get("out", got)["rows"] == [[7]]
    # nobody frees the slot: the waiter hears Busy at its deadline, not later
    release = hold_slots(SqlLimits(timeout_s=0.5, slots=1, queue=1))
    try:
        t0 = time.monotonic()
        with pytest.raises(Busy):
            run_readonly(c, "SELECT 1", SqlLimits(timeout_s=0.5, slots=1, queue=1))
        assert 0.4 < time.monotonic() - t0 < 1.5
    finally:
        release.set()


def test_through_the_api_busy_is_429_and_refusals_are_422(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    # a generous time limit: the server's first query starts its SQL worker processes
    settings = settings_for(tmp_path, sql_timeout_s=60, sql_slots=1, sql_queue=0)
    with client_for(settings) as client:
        for sql in ("SELECT * FROM duckdb_secrets()", "FROM '/etc/passwd'",
                    "SELECT * FROM (DESCRIBE '/etc/passwd')", "SET threads = 1"):
            assert_error(client.post("/v1/sql", json={"sql": sql}), 422, "invalid_request", "sql")
        release = hold_slots(SqlLimits(slots=1, queue=0))
        try:
            assert_error(client.post("/v1/sql", json={"sql": "SELECT 1"}), 429,
                         "too_many_requests", "sql")
        finally:
            release.set()
        time.sleep(0.1)
        assert client.post("/v1/sql", json={"sql": "SELECT 1"}).json()["rows"] == [[1]]


@pytest.mark.parametrize("sql", [
    "SELECT * FROM duckdb_settings()", "SELECT * FROM read_text('{secret}')",
    "FROM '{secret}'", "SELECT * FROM (DESCRIBE '{secret}')", "SELECT getenv('HOME')",
    "SELECT current_setting('threads')", "SELECT * FROM glob('{dir}/*')",
    "SELECT (SELECT count(*) FROM duckdb_secrets())", "SELECT * FROM query('SELECT 1')",
    "SELECT * FROM system.main.models", "SELECT * FROM nowhere", "SELECT setval('s', 1)",
    "SELECT * FROM repeat_row(1, num_rows := 3)", "SELECT row_number() OVER () FROM glob('x')",
    "WITH t AS (SELECT * FROM read_blob('{secret}')) SELECT * FROM t",
])
def test_the_guard_refuses_on_duckdbs_own_parse_tree(cat: tuple[Catalog, Path], sql: str) -> None:
    """The refusal is the guard's, naming the function or table (DuckDB's own protections
    behind it would refuse most of these too, with other words)."""
    c, secret = cat
    with pytest.raises(InvalidRequest) as err:
        run_readonly(c, sql.format(secret=secret, dir=secret.parent), SqlLimits(timeout_s=5))
    assert "not allowed" in err.value.message or "not a catalog table" in err.value.message \
        or "another database" in err.value.message, err.value.message


@pytest.mark.parametrize("sql", [
    "SELECT " + "(" * 600 + "1" + ")" * 600, "SELECT " + "(" * 20000 + "1" + ")" * 20000,
    "SELECT 1" + " + 1" * 600, "SELECT " + "[" * 3000 + "]" * 3000,
    "SELECT * FROM " + "(SELECT * FROM " * 600 + "models" + ")" * 600,
    "SELECT " + "-" * 5000 + "1",
])
def test_deeply_nested_queries_are_refused_not_crashing(cat: tuple[Catalog, Path],
                                                        sql: str) -> None:
    with pytest.raises(InvalidRequest):
        run_readonly(cat[0], sql, SqlLimits(timeout_s=5))


def test_deep_nesting_through_the_api_is_422(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    with client_for(settings_for(tmp_path), raise_server_exceptions=False) as client:
        r = client.post("/v1/sql", json={"sql": "SELECT " + "(" * 5000 + "1" + ")" * 5000})
        assert_error(r, 422, "invalid_request", "sql")


@pytest.mark.parametrize("sql", ["DROP TABLE models", "SELECT * FROM read_text('/etc/passwd')",
                                 "SELECT 1; SELECT 2", "SELECT " + "(" * 3000 + "1" + ")" * 3000,
                                 "FROM duckdb_secrets()"])
def test_the_cli_refuses_in_one_line(tmp_path: Path, sql: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    from mergepipe.cli.main import main

    capsys.readouterr()
    rc = main(["--catalog", str(tmp_path / "c.duckdb"), "sql", sql])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and len(err.splitlines()) == 1 and "sql" in err, err


def test_sql_text_is_bounded_before_it_is_parsed(cat: tuple[Catalog, Path]) -> None:
    """A megabyte of SQL costs seconds of parsing outside the time limit: refused at once."""
    big = "SELECT 1" + " UNION ALL SELECT 1" * 50_000
    t0 = time.monotonic()
    with pytest.raises(InvalidRequest, match="characters long"):
        run_readonly(cat[0], big, SqlLimits(timeout_s=5))
    assert time.monotonic() - t0 < 0.5
    ok = "SELECT 1" + " UNION ALL SELECT 1" * 500
    assert len(run_readonly(cat[0], ok, SqlLimits(timeout_s=10, row_limit=1000))["rows"]) == 501


def test_the_cli_runs_with_the_same_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from mergepipe.cli.main import main

    monkeypatch.setenv("MERGEPIPE_SQL_ROW_LIMIT", "5")
    # (2 s: the first query of a fresh process, checks included, must fit on a loaded machine)
    monkeypatch.setenv("MERGEPIPE_SQL_TIMEOUT_S", "2")
    Catalog(tmp_path / "c.duckdb").close()  # `mergepipe sql` never creates a catalog
    capsys.readouterr()
    assert main(["--catalog", str(tmp_path / "c.duckdb"), "sql", "SELECT * FROM range(50)",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["truncated"] is True and len(out["rows"]) == 5
    t0 = time.monotonic()
    rc = main(["--catalog", str(tmp_path / "c.duckdb"), "sql",
               "SELECT count(*) FROM range(1000000) a, range(1000000) b"])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and "time limit" in err and len(err.splitlines()) == 1, err
    assert time.monotonic() - t0 < 2 + 1
