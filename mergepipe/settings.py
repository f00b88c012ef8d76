"""One settings object, built at start-up from the environment (and CLI options)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

DEFAULT_CATALOG = "./mergepipe.duckdb"


@dataclass(frozen=True)
class Settings:
    catalog: Path = Path(DEFAULT_CATALOG)
    data_roots: tuple[Path, ...] = field(default_factory=tuple)  # empty: any path (CLI)
    output_root: Path = Path("./outputs")
    workers: int = 2
    api_token: str | None = None
    sql_row_limit: int = 10_000
    sql_timeout_s: float = 10.0
    max_body_bytes: int = 1 << 20        # larger request bodies are refused with 413
    shutdown_grace_s: float = 30.0       # how long `serve` waits for running jobs on SIGTERM

    @staticmethod
    def from_env(env: dict[str, str] | None = None, **overrides: object) -> Settings:
        e = dict(os.environ if env is None else env)
        s = Settings(
            catalog=Path(e.get("MERGEPIPE_CATALOG") or DEFAULT_CATALOG),
            data_roots=tuple(Path(p).resolve() for p in
                             (e.get("MERGEPIPE_DATA_ROOTS") or "").split(":") if p),
            output_root=Path(e.get("MERGEPIPE_OUTPUT_ROOT") or "./outputs"),
            workers=int(e.get("MERGEPIPE_WORKERS") or 2),
            api_token=e.get("MERGEPIPE_API_TOKEN") or None,
            sql_row_limit=int(e.get("MERGEPIPE_SQL_ROW_LIMIT") or 10_000),
            sql_timeout_s=float(e.get("MERGEPIPE_SQL_TIMEOUT_S") or 10.0),
            max_body_bytes=int(e.get("MERGEPIPE_MAX_BODY_BYTES") or 1 << 20),
            shutdown_grace_s=float(e.get("MERGEPIPE_SHUTDOWN_GRACE_S") or 30.0),
        )
        return replace(s, **{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]
