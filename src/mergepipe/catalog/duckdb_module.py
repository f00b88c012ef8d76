"""DuckDB's engine, imported without the duckdb package's pure-Python layer when it can be.

duckdb 2.x is a C++ extension, `_duckdb`, that the `duckdb` package re-exports beside a
relational-expression API and a version lookup through importlib.metadata: 0.11 s of every
command's start-up on the benchmark VM (0.06 s for `_duckdb` alone). The catalog needs only the
extension: connections, statements, errors. duckdb 1.x ships no `_duckdb`; its package serves.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import _duckdb as duckdb
else:
    try:
        import _duckdb as duckdb
    except ImportError:  # duckdb 1.x
        import duckdb

__all__ = ["duckdb"]
