"""Which engine executes a prepared merge (and an ingestion's scan): local threads or Ray tasks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mergepipe.catalog.ingest import ScanFn
from mergepipe.core.progress import ProgressFn
from mergepipe.core.settings import Settings

if TYPE_CHECKING:  # the merge's modules load torch: imported when a merge runs, not an ingestion
    from mergepipe.executor.prepare import Prepared
    from mergepipe.executor.stream import ExecutionResult


@dataclass(frozen=True)
class Engine:
    """`local`: this process's threads; `ray`: Ray tasks. Both write the same bytes."""

    name: str = "local"
    ray_address: str | None = None

    @staticmethod
    def of(settings: Settings) -> Engine:
        return Engine(settings.engine, settings.ray_address)

    def execute(self, prep: Prepared, out_dir: Path, *, threads: int | None = None,
                progress: ProgressFn | None = None, first_pass: bool = False
                ) -> ExecutionResult:
        from mergepipe.executor import stream
        from mergepipe.executor.ray_engine import execute_ray

        if self.name == "ray":
            return execute_ray(prep, out_dir, address=self.ray_address, threads=threads,
                               progress=progress, first_pass=first_pass)
        return stream.execute(prep, out_dir, threads=threads, progress=progress,
                              first_pass=first_pass)

    def ingest_scan(self) -> ScanFn | None:
        """How an ingestion scans its blocks: one Ray task per shard file, or None (locally)."""
        if self.name != "ray":
            return None
        from mergepipe.executor.ray_ingest import ray_scan

        return ray_scan(self.ray_address)


LOCAL = Engine()
