"""User SQL on a PostgreSQL catalog: one prepared SELECT in a READ ONLY transaction, always
rolled back, as a NOLOGIN role granted SELECT on the catalog's tables only."""

from __future__ import annotations

import threading
import time
from typing import Any

import sqlglot
import sqlglot.expressions as exp
from sqlglot.errors import ParseError, TokenError

from mergepipe.catalog.db import Catalog, outage
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.sql_limits import SqlLimits
from mergepipe.sandbox.sql_exec import fetch

READER_ROLE = "mergepipe_reader"
# PostgreSQL functions that read files, sleep, signal backends, change settings or run SQL
# given as text; refused before the query runs (the role could not use most of them anyway).
FORBIDDEN_PREFIXES = ("pg_", "set_config", "current_setting", "dblink", "lo_", "query_to_",
                      "table_to_", "cursor_to_", "schema_to_", "database_to_", "xpath",
                      "txid_", "nextval", "setval", "currval", "version")
# Once per catalog and process; the catalog's user needs CREATEROLE the first time (or an
# administrator runs these statements).
_ENSURE_ROLE = [
    f"""DO $$ BEGIN
          IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{READER_ROLE}') THEN
            CREATE ROLE {READER_ROLE} NOLOGIN;
          END IF;
        END $$""",
    f"GRANT USAGE ON SCHEMA public TO {READER_ROLE}",
    f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {READER_ROLE}",
    f"GRANT {READER_ROLE} TO CURRENT_USER",
]
_ready: set[str] = set()
_ready_lock = threading.Lock()


def ensure_reader_role(cat: Catalog) -> None:
    url = str(cat.engine.url)
    with _ready_lock:
        if url in _ready:
            return
        with cat.engine.begin() as conn:
            raw = conn.connection.driver_connection
            assert raw is not None
            for stmt in _ENSURE_ROLE:
                raw.execute(stmt)
        _ready.add(url)


def check_functions(sql: str) -> None:
    """One SELECT, without the functions above (a clear error naming the function)."""
    try:
        trees = [t for t in sqlglot.parse(sql, read="postgres") if t is not None]
    except (ParseError, TokenError) as e:  # an unclosed quote fails in the tokenizer
        raise InvalidRequest(f"query failed: {str(e).splitlines()[0]}", field="sql") from None
    if len(trees) != 1 or not isinstance(trees[0], exp.Query):
        raise InvalidRequest("only one SELECT statement is allowed", field="sql")
    for node in trees[0].find_all(exp.Func):
        name = (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower()
        if name.startswith(FORBIDDEN_PREFIXES):
            raise InvalidRequest(f"function {name}() is not allowed in catalog queries",
                                 field="sql")


def run_readonly_postgres(cat: Catalog, sql: str, limits: SqlLimits) -> dict[str, Any]:
    """{columns, rows, truncated}, as `user_sql.run_readonly` gives on DuckDB."""
    try:
        return _run(cat, sql, limits)
    except Exception as e:
        down = outage(e)  # the reader role's session is not the catalog's own: translate here
        if down is None:
            raise
        raise down from e


def _run(cat: Catalog, sql: str, limits: SqlLimits) -> dict[str, Any]:
    deadline = time.monotonic() + limits.timeout_s
    check_functions(sql)
    ensure_reader_role(cat)
    with cat.engine.connect() as conn:
        raw = conn.connection.driver_connection
        assert raw is not None
        try:
            with raw.cursor() as cur:
                cur.execute("SET TRANSACTION READ ONLY")
                timeout_ms = max(1, int(limits.timeout_s * 1000))
                cur.execute(f"SET LOCAL statement_timeout = {timeout_ms}")
                cur.execute(f"SET LOCAL ROLE {READER_ROLE}")
                cur.execute("SET LOCAL search_path = public")
                cur.execute(sql, prepare=True)  # prepared: exactly one statement
                if cur.description is None:
                    raise InvalidRequest("only one SELECT statement is allowed", field="sql")
                return fetch(cur, limits, deadline)
        except InvalidRequest:
            raise
        except Exception as e:  # noqa: BLE001 - a user's query failing is the user's error
            msg = (str(e).strip().splitlines() or ["error"])[0]
            if "statement timeout" in msg:
                msg = f"query exceeded the {limits.timeout_s:g}s time limit"
            raise InvalidRequest(f"query failed: {msg}", field="sql") from None
        finally:
            raw.rollback()  # whatever the query did, nothing of it is kept
