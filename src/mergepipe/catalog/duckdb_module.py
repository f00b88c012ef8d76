"""DuckDB's engine: the C++ extension `_duckdb` alone when it exists (duckdb 2.x; the package's
Python layer costs 0.05 s of every command's start-up), else the duckdb 1.x package."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import _duckdb as duckdb
else:
    try:
        import _duckdb as duckdb
    except ImportError:  # duckdb 1.x
        import duckdb

__all__ = ["duckdb"]
