"""One settings object, built at start-up from the environment (and CLI options)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mergepipe.core.checkpoint_limits import CheckpointLimits
from mergepipe.core.errors import InvalidRequest

DEFAULT_CATALOG = "./mergepipe.duckdb"
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
CATALOG_URL_SCHEMES = ("postgresql://", "postgresql+psycopg://", "postgres://")
ENGINES = ("local", "ray")  # how merges execute: this process's threads, or Ray tasks
LOG_FORMATS = ("text", "json")


def catalog_location(raw: str | Path) -> str | Path:
    """A DuckDB file path, or a PostgreSQL URL kept as text (a Path would fold its `//`)."""
    return raw if isinstance(raw, str) and raw.startswith(CATALOG_URL_SCHEMES) else Path(raw)


@dataclass(frozen=True)
class Settings:
    catalog: Path | str = Path(DEFAULT_CATALOG)  # a str: a postgresql:// URL
    data_roots: tuple[Path, ...] = field(default_factory=tuple)  # empty: any path (CLI)
    # s3://bucket[/prefix] and http(s):// URL prefixes the service may read (empty: none)
    remote_roots: tuple[str, ...] = field(default_factory=tuple)
    output_root: Path = Path("./outputs")
    workers: int = 2
    api_token: str | None = None
    read_token: str | None = None        # when set, reads and SQL need it (or the api token)
    # Host header names served (DNS rebinding); "*": any. `serve` on a non-loopback address
    # without MERGEPIPE_ALLOWED_HOSTS serves any name (the token guards it then).
    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS
    sql_row_limit: int = 10_000
    sql_timeout_s: float = 10.0
    sql_result_bytes: int = 16 << 20     # larger SQL results (as JSON) are refused
    sql_memory_bytes: int = 512 << 20    # user SQL's DuckDB memory_limit (core/sql_limits.py)
    sql_threads: int = 1                 # user SQL's DuckDB threads
    sql_slots: int = 2                   # user queries at once
    sql_queue: int = 16                  # user queries waiting for a slot; 429 beyond
    max_body_bytes: int = 1 << 20        # larger request bodies are refused with 413
    shutdown_grace_s: float = 30.0       # how long `serve` waits for running jobs on SIGTERM
    max_queued_jobs: int = 1000          # more queued ingestions + merges are refused with 429
    lease_s: float = 30.0                # shared catalog: a dead worker's job is taken over after
    job_timeout_s: float = 6 * 3600.0    # a job's total time limit on remote calls; then it fails
    engine: str = "local"                # merges run on "local" threads or as "ray" tasks
    ray_address: str | None = None       # an existing Ray cluster (None: a local Ray runtime)
    log_format: str = "text"             # "json": one JSON object per log line
    # caps on what a checkpoint may claim (core/checkpoint_limits.py)
    max_file_bytes: int = CheckpointLimits.max_file_bytes
    max_tensors_per_file: int = CheckpointLimits.max_tensors_per_file
    max_tensor_elements: int = CheckpointLimits.max_tensor_elements
    max_blocks: int = CheckpointLimits.max_blocks

    def checkpoint_limits(self) -> CheckpointLimits:
        """The caps on what a checkpoint may claim, as the storage layer applies them."""
        return CheckpointLimits(self.max_file_bytes, self.max_tensors_per_file,
                                self.max_tensor_elements, self.max_blocks)

    @staticmethod
    def from_env(env: dict[str, str] | None = None, **overrides: object) -> Settings:
        e = dict(os.environ if env is None else env)
        numbers = {name: env_number(e, f"MERGEPIPE_{name.upper()}", type(default), default,
                                    minimum)
                   for name, minimum in _MINIMUMS.items()
                   for default in [getattr(Settings, name)]}
        s = Settings(
            catalog=catalog_location(e.get("MERGEPIPE_CATALOG") or DEFAULT_CATALOG),
            data_roots=tuple(Path(p).resolve() for p in
                             (e.get("MERGEPIPE_DATA_ROOTS") or "").split(":") if p),
            remote_roots=tuple((e.get("MERGEPIPE_REMOTE_ROOTS") or "").replace(",", " ").split()),
            output_root=Path(e.get("MERGEPIPE_OUTPUT_ROOT") or "./outputs"),
            api_token=e.get("MERGEPIPE_API_TOKEN") or None,
            read_token=e.get("MERGEPIPE_READ_TOKEN") or None,
            allowed_hosts=tuple(h.lower() for h in (e.get("MERGEPIPE_ALLOWED_HOSTS") or "")
                                .replace(",", " ").split()) or LOOPBACK_HOSTS,
            engine=e.get("MERGEPIPE_ENGINE") or "local",
            ray_address=e.get("MERGEPIPE_RAY_ADDRESS") or None,
            log_format=(e.get("MERGEPIPE_LOG_FORMAT") or "text").lower(),
            **numbers,
        )
        given = {k: v for k, v in overrides.items() if v is not None}
        if "catalog" in given:  # a command-line option: text
            given["catalog"] = catalog_location(str(given["catalog"]))
        s = replace(s, **given)  # type: ignore[arg-type]
        if s.engine not in ENGINES:
            raise InvalidRequest(f"engine {s.engine!r} is not one of {', '.join(ENGINES)} "
                                 "(MERGEPIPE_ENGINE, --engine)", field="engine")
        if s.log_format not in LOG_FORMATS:
            raise InvalidRequest(f"MERGEPIPE_LOG_FORMAT={s.log_format!r} is not one of "
                                 f"{', '.join(LOG_FORMATS)}", field="MERGEPIPE_LOG_FORMAT")
        return s


# The numeric settings: each read from MERGEPIPE_<NAME> (default: the field's), with its minimum.
_MINIMUMS: dict[str, float] = {
    "workers": 1, "sql_row_limit": 1, "sql_timeout_s": 0.001, "sql_result_bytes": 1,
    "sql_memory_bytes": 64 << 20, "sql_threads": 1, "sql_slots": 1, "sql_queue": 0,
    "max_body_bytes": 1, "shutdown_grace_s": 0, "max_queued_jobs": 1, "lease_s": 1.0,
    "job_timeout_s": 0.001, "max_file_bytes": 8, "max_tensors_per_file": 1,
    "max_tensor_elements": 1, "max_blocks": 1,
}


def env_number(env: dict[str, str], key: str, cast: type[int] | type[float], default: float,
            minimum: float) -> Any:
    """A numeric setting; a clear error naming the variable when it is not a number >= minimum."""
    raw = env.get(key)
    if not raw:
        return cast(default)
    try:
        v = cast(raw)
    except ValueError:
        v = None
    if v is None or v != v or v < minimum:
        raise InvalidRequest(f"{key}={raw!r} must be a number >= {minimum:g}", field=key)
    return v
