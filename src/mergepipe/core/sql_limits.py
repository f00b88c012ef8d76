"""Every limit of user SQL in one place (the DuckDB sandbox applies them; others mirror them)."""

from __future__ import annotations

from dataclasses import dataclass

from mergepipe.core.settings import Settings


@dataclass(frozen=True)
class SqlLimits:
    """What one user query may use (the time limit counts from arrival, the wait included)."""

    row_limit: int = 10_000        # more rows: the first row_limit, "truncated": true
    result_bytes: int = 16 << 20   # a result over this many bytes of JSON is refused
    timeout_s: float = 10.0        # the query is interrupted then; the caller hears by +1 s
    memory_bytes: int = 512 << 20  # the engine's memory limit (DuckDB: memory_limit)
    threads: int = 1               # the engine's threads (DuckDB: threads)
    slots: int = 2                 # user queries running at once (the server: worker
    # processes, killed past the time limit; the CLI: threads, one deaf to its interrupt keeps
    # its slot until it ends)
    queue: int = 16                # more wait for a slot (within their time limit); then 429
    temp_bytes: int = 1 << 30      # spill to disk (DuckDB: max_temp_directory_size)

    @staticmethod
    def from_settings(s: Settings) -> SqlLimits:
        return SqlLimits(row_limit=s.sql_row_limit, result_bytes=s.sql_result_bytes,
                         timeout_s=s.sql_timeout_s, memory_bytes=s.sql_memory_bytes,
                         threads=s.sql_threads, slots=s.sql_slots, queue=s.sql_queue)
