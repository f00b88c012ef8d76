"""Points in a job where a caller may act: the fault tests pause a process there to kill it. The
product calls `hooks().<point>(...)`, no-ops unless a test installs its own (tests/site_hooks)."""

from __future__ import annotations


class Hooks:
    """The points, each a no-op."""

    def ingest_running(self, model: str) -> None:
        """An ingestion job is marked running; nothing is scanned yet."""

    def merge_staged(self, merge_id: str) -> None:
        """A merge's output is written to its staging folder; nothing is published yet."""

    def region_started(self, index: int) -> None:
        """An output region task (executor.ray_engine) starts, before it reads anything."""

    def shard_started(self, index: int) -> None:
        """An ingestion shard task (executor.ray_ingest) starts, before it reads anything."""


_installed: Hooks = Hooks()


def hooks() -> Hooks:
    """The hooks of this process."""
    return _installed


def install(new: Hooks) -> Hooks:
    """Make `new` this process's hooks; returns the ones it replaces (to restore them)."""
    global _installed
    old, _installed = _installed, new
    return old
