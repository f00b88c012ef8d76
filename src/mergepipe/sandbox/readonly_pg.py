"""User SQL on a PostgreSQL catalog: one SELECT, read-only, as a role that can only read.

The statement runs in a READ ONLY transaction under `SET LOCAL ROLE mergepipe_reader` (a NOLOGIN
role granted SELECT on the catalog's tables and nothing else), with `statement_timeout`; it is
sent as a prepared statement, so it can never be several statements; the row and size limits
are those of the DuckDB path. The transaction is always rolled back."""

from __future__ import annotations

import json
import threading
from typing import Any

import sqlglot
import sqlglot.expressions as exp
from sqlglot.errors import ParseError, TokenError

from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.jsonable import jsonable

READER_ROLE = "mergepipe_reader"
# PostgreSQL functions that read files, sleep, signal backends, change settings or run SQL
# given as text; refused before the query runs (the role could not use most of them anyway).
FORBIDDEN_PREFIXES = ("pg_", "set_config", "current_setting", "dblink", "lo_", "query_to_",
                      "table_to_", "cursor_to_", "schema_to_", "database_to_", "xpath",
                      "txid_", "nextval", "setval", "currval", "version")
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
    """The reader role exists, reads every catalog table, and the catalog's user may assume it
    (once per catalog and process; the catalog's user needs CREATEROLE the first time, or an
    administrator runs these statements)."""
    with _ready_lock:
        if cat.url in _ready:
            return
        with cat.engine.begin() as conn:
            raw = conn.connection.driver_connection
            assert raw is not None
            for stmt in _ENSURE_ROLE:
                raw.execute(stmt)
        _ready.add(cat.url)


def check_functions(sql: str) -> None:
    """Refuse the PostgreSQL functions above (a clear error naming the function)."""
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


def run_readonly_postgres(cat: Catalog, sql: str, *, row_limit: int = 10_000,
                          timeout_s: float = 10.0, byte_limit: int = 16 << 20
                          ) -> dict[str, Any]:
    """{columns, rows, truncated}, as `user_sql.run_readonly` gives on DuckDB."""
    check_functions(sql)
    ensure_reader_role(cat)
    with cat.engine.connect() as conn:
        raw = conn.connection.driver_connection
        assert raw is not None
        try:
            with raw.cursor() as cur:
                cur.execute("SET TRANSACTION READ ONLY")
                cur.execute(f"SET LOCAL statement_timeout = {max(1, int(timeout_s * 1000))}")
                cur.execute(f"SET LOCAL ROLE {READER_ROLE}")
                cur.execute("SET LOCAL search_path = public")
                cur.execute(sql, prepare=True)  # prepared: exactly one statement
                if cur.description is None:
                    raise InvalidRequest("only one SELECT statement is allowed", field="sql")
                columns = [d.name for d in cur.description]
                rows = cur.fetchmany(row_limit + 1)
        except InvalidRequest:
            raise
        except Exception as e:  # noqa: BLE001 - a user's query failing is the user's error
            msg = (str(e).strip().splitlines() or ["error"])[0]
            if "statement timeout" in msg:
                msg = f"query exceeded the {timeout_s:g}s time limit"
            raise InvalidRequest(f"query failed: {msg}", field="sql") from None
        finally:
            raw.rollback()  # whatever the query did, nothing of it is kept
    truncated = len(rows) > row_limit
    out = [jsonable(list(r)) for r in rows[:row_limit]]
    size = len(json.dumps(out, default=str))
    if size > byte_limit:
        raise InvalidRequest(f"the result is {size} bytes of JSON, over the {byte_limit} byte "
                             "limit; select fewer rows or columns", field="sql")
    return {"columns": columns, "rows": out, "truncated": truncated}
