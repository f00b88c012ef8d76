"""The SQL sandbox's allow-list of functions (sandbox/allowed_functions.py) and its own database:
a function off the list is refused by name, whatever DuckDB adds; files, the network and
statements stay refused; ordinary analytics over the catalog still run; and the in-process path
(`Catalog.sql`, `mergepipe sql`) leaves the live catalog's settings alone."""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

import mergepipe
from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.sql_limits import SqlLimits
from mergepipe.sandbox import user_sql
from mergepipe.sandbox.allowed_functions import ALLOWED, KEYWORD_CALLS, TABLE
from mergepipe.sandbox.sql_guard import check_query
from mergepipe.sandbox.sql_snapshot import snapshot_for
from tests import catalogs, factory

ON_DUCKDB = not catalogs.ON_POSTGRES
duckdb_only = pytest.mark.duckdb_only("DuckDB's functions and the sandbox's own DuckDB database")


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[mergepipe.Catalog]:
    """A base and one expert of the tiny layout (19 tensors each), ingested without stats."""
    root = tmp_path_factory.mktemp("allow")
    base = factory.make_base(root / "base", seed=3)
    factory.make_expert(base, root / "e1", seed=4)
    with mergepipe.Catalog(catalogs.new_catalog(root)) as cat:
        cat.ingest(root / "base", "base", progress=False, stats=False)
        cat.ingest(root / "e1", "e1", base="base", progress=False, stats=False)
        yield cat


def _refusal(cat: mergepipe.Catalog, sql: str) -> str:
    with pytest.raises(InvalidRequest) as err:
        cat.sql(sql)
    assert err.value.field == "sql" and err.value.status == 422
    return err.value.message


@duckdb_only
@pytest.mark.parametrize(("sql", "name"), [
    ("SELECT vector_type(42)", "vector_type"),  # harmless-looking, but nobody vetted it
    ("SELECT can_cast_implicitly(1, 2)", "can_cast_implicitly"),
    ("SELECT name FROM models WHERE name = lower(stats(name))", "stats"),
    ("SELECT list_transform([1], x -> sleep_ms(x))", "sleep_ms"),
    ("SELECT (SELECT max(version()) FROM models)", "version"),
    ("WITH t AS (SELECT json_serialize_sql('SELECT 1') AS j) SELECT * FROM t",
     "json_serialize_sql"),
    ("SELECT current_user", "current_user"), ("SELECT \"user\"", "user()"),
    ("SELECT list_aggr([1], 'nope')", "nope"),
])
def test_an_unlisted_function_is_refused_naming_it(api: mergepipe.Catalog, sql: str,
                                                    name: str) -> None:
    assert name in _refusal(api, sql)


@duckdb_only
def test_every_duckdb_function_off_the_list_is_refused() -> None:
    """What a new DuckDB version adds is refused until someone puts it on the list."""
    raw = duckdb.connect()
    names = {str(r[0]).lower() for r in raw.execute(
        "SELECT DISTINCT function_name FROM duckdb_functions() "
        "WHERE function_type IN ('scalar', 'aggregate', 'macro', 'window')").fetchall()}
    # both sides are real (a listed name an older DuckDB lacks fails in its binder)
    assert len(ALLOWED & names) > 0.9 * len(ALLOWED) and len(names - ALLOWED) > 300
    for name in sorted(names - ALLOWED):
        quoted = '"' + name.replace('"', '""') + '"'
        with pytest.raises(InvalidRequest, match=re.escape(f"{name}()")):
            check_query(raw, f"SELECT {quoted}(1) FROM models", {"models"})
    raw.close()


@duckdb_only
def test_the_keyword_calls_are_mapped_to_real_functions() -> None:
    raw = duckdb.connect()
    names = {str(r[0]) for r in raw.execute(
        "SELECT function_name FROM duckdb_functions()").fetchall()}
    raw.close()
    assert set(KEYWORD_CALLS.values()) <= names and names >= TABLE


ATTACKS = [
    "SELECT * FROM read_csv('{secret}')", "SELECT * FROM read_csv_auto('{secret}')",
    "SELECT * FROM read_parquet('{secret}')", "SELECT * FROM glob('{dir}/*')",
    "SELECT * FROM read_csv('https://example.com/x.csv')", "SELECT * FROM 'https://x.org/y.csv'",
    "SELECT * FROM read_parquet('s3://bucket/key.parquet')", "INSTALL httpfs", "LOAD httpfs",
    "ATTACH '{secret}' AS x", "COPY models TO '{dir}/out.csv'", "PRAGMA database_list",
    "SET threads = 8", "SET memory_limit = '8GB'", "EXPORT DATABASE '{dir}/export'",
    "WITH t AS (SELECT * FROM read_csv('{secret}')) SELECT * FROM t",
    "SELECT * FROM models WHERE name IN (SELECT * FROM read_text('{secret}'))",
]


@pytest.mark.parametrize("sql", ATTACKS)
def test_files_network_and_statements_are_refused(api: mergepipe.Catalog, tmp_path: Path,
                                                  sql: str) -> None:
    secret = tmp_path / "secret.csv"
    secret.write_text("x\nTOP-SECRET\n")
    msg = _refusal(api, sql.format(secret=secret, dir=tmp_path))
    assert "TOP-SECRET" not in msg
    assert not (tmp_path / "out.csv").exists() and not (tmp_path / "export").exists()


# The tiny layout: numel of each tensor; every model's tensors are BF16 (2 bytes an element).
NUMEL = {n: math.prod(s) for n, s in factory.TINY_SHAPES.items()}
TOTAL_BYTES = 2 * sum(NUMEL.values())


def test_standard_analytics_still_work(api: mergepipe.Catalog) -> None:
    """CTEs, joins, aggregates with FILTER and window functions over the catalog's tables (on
    PostgreSQL too)."""
    r = api.sql("WITH sizes AS (SELECT model, count(*) AS n, sum(nbytes) AS b FROM tensors "
                "GROUP BY model) SELECT m.name, m.base, s.n, s.b, sum(s.b) OVER () AS total, "
                "rank() OVER (ORDER BY m.name DESC) AS r FROM models m JOIN sizes s "
                "ON s.model = m.name ORDER BY m.name")
    assert r.columns == ["name", "base", "n", "b", "total", "r"]
    assert [list(row) for row in r.rows] == [
        ["base", None, 19, TOTAL_BYTES, 2 * TOTAL_BYTES, 2],
        ["e1", "base", 19, TOTAL_BYTES, 2 * TOTAL_BYTES, 1]]
    biggest = max(NUMEL.values())
    r = api.sql("SELECT tensor, dense_rank() OVER (ORDER BY nbytes DESC) AS r, "
                "count(*) FILTER (WHERE nbytes > 100) OVER () AS big FROM tensors "
                "WHERE model = 'base' ORDER BY r, tensor LIMIT 3")
    top = sorted(n for n, v in NUMEL.items() if v == biggest)
    assert [row[0] for row in r.rows[:len(top)]] == top and r.rows[0][1] == 1
    assert r.rows[0][2] == sum(2 * v > 100 for v in NUMEL.values())


@duckdb_only
@pytest.mark.parametrize(("sql", "expected"), [
    # lists, lambdas and list aggregates
    ("SELECT list_sort(list(DISTINCT regexp_extract(tensor, '\\.(\\w+)_proj', 1)) "
     "FILTER (WHERE tensor LIKE '%_proj%')) FROM tensors WHERE model = 'base'",
     [["down", "gate", "k", "o", "q", "up", "v"]]),
    ("SELECT list_product(shape), len(shape), shape[1], list_sum(shape) "
     "FROM tensors WHERE model = 'base' AND tensor = 'model.embed_tokens.weight'",
     [64.0 * 32, 2, 64, 96]),
    ("SELECT list_aggr([3, 1, 2], 'max'), [x * 10 FOR x IN [1, 2] IF x > 1], "
     "list_distinct([1, 1]), unnest([7])", [3, [20], [1], 7]),
    # structs and maps
    ("SELECT {'name': name, 'kind': kind}.kind, struct_pack(n := n_tensors).n, "
     "map_extract(map([name], [n_tensors]), name) FROM models WHERE name = 'e1'",
     ["full", 19, [19]]),
    # strings
    ("SELECT upper(name) || '-' || lpad(CAST(n_tensors AS VARCHAR), 3, '0'), "
     "split_part('a.b.c', '.', 2), starts_with(name, 'ba'), md5('x') = md5('x') "
     "FROM models WHERE name = 'base'", ["BASE-019", "b", True, True]),
    # dates (the clock, and fixed dates)
    ("SELECT strftime(DATE '2024-05-17', '%Y/%m'), date_diff('day', DATE '2024-05-01', "
     "DATE '2024-05-17'), year(date_trunc('month', DATE '2024-05-17')), "
     "current_date >= DATE '2024-01-01', max(created_at) <= now() FROM models",
     ["2024/05", 16, 2024, True, True]),
    # aggregates and statistics
    ("SELECT median(nbytes), arg_max(tensor, nbytes) LIKE '%weight', stddev_pop(1), "
     "count(DISTINCT model) FROM tensors", [float(2 * sorted(NUMEL.values())[9]), True, 0.0, 2]),
])
def test_duckdb_analytics_still_work(api: mergepipe.Catalog, sql: str,
                                     expected: list[object]) -> None:
    (row,) = api.sql(sql).rows
    assert list(row) == expected


@duckdb_only
def test_the_live_catalogs_settings_are_untouched(api: mergepipe.Catalog) -> None:
    """The sandbox's limits are the config of its own database (a read-only snapshot), never
    SET on the catalog's: before, `Catalog.sql` left the catalog at 512 MiB and one thread."""
    setting = ("SELECT current_setting('memory_limit'), current_setting('threads'), "
               "current_setting('lock_configuration')")
    limits = SqlLimits.from_settings(api.settings)
    with api.db.duckdb_reader() as raw:
        before = raw.execute(setting).fetchone()
    assert before != (f"{limits.memory_bytes >> 20}.0 MiB", limits.threads, False)
    assert api.sql("SELECT count(*) FROM models").rows == [[2]]
    with api.db.duckdb_reader() as raw:
        assert raw.execute(setting).fetchone() == before


@duckdb_only
@pytest.mark.parametrize(("sql", "why"), [
    ("SET threads = 8", "locked"), ("SET lock_configuration = false", "locked"),
    ("SELECT * FROM read_csv('{secret}')", "disabled"),
    ("SELECT current_setting('memory_limit')", "96"),
    ("ATTACH ':memory:' AS m", "read-only"),
])
def test_the_sandbox_database_holds_without_the_guard(api: mergepipe.Catalog, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch, sql: str,
                                                      why: str) -> None:
    """With the guard switched off, DuckDB itself refuses: the snapshot is read-only, external
    access is off, and the limits are locked in its config."""
    secret = tmp_path / "secret.csv"
    secret.write_text("x\nTOP-SECRET\n")
    monkeypatch.setattr(user_sql, "check_query", lambda *a: None)
    lim = SqlLimits(memory_bytes=96 << 20, timeout_s=10)
    try:
        out = user_sql.run_readonly(api.db, sql.format(secret=secret), lim)
        assert why in str(out["rows"]), out  # the limit is the sandbox's own
    except InvalidRequest as e:
        assert why in e.message and "TOP-SECRET" not in e.message, e.message


@duckdb_only
def test_a_catalog_change_leaves_a_running_query_alone(tmp_path: Path) -> None:
    """A query still running on the previous copy of the catalog ends with its answer when a
    later query, after a write, opens the new copy (the old database closes after it)."""
    n = 600_000_000  # about 1 s on one thread
    with Catalog(tmp_path / "c.duckdb") as cat:
        got: dict[str, object] = {}
        long = threading.Thread(target=lambda: got.update(
            a=user_sql.run_readonly(cat, f"SELECT sum(i) FROM range({n}) t(i)",
                                    SqlLimits(timeout_s=120))))
        long.start()
        snap = snapshot_for(cat)
        while long.is_alive() and not (snap._open and snap._open[1]._held):
            time.sleep(0.01)
        version = snap.version
        cat.execute(SQL("INSERT INTO lineage VALUES ('c1', 'p', 'base', 1.0, 'm1')"))
        assert user_sql.run_readonly(cat, "SELECT count(*) FROM lineage")["rows"] == [[1]]
        assert snap.version == version + 1 and long.is_alive()  # the first still runs
        long.join(120)
        assert got["a"] == {"columns": ["sum(i)"], "rows": [[n * (n - 1) // 2]],
                            "truncated": False}
