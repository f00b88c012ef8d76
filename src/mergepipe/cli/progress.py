"""Progress bars on a terminal (tqdm on stderr), fed by the one Progress shape of our jobs."""

from __future__ import annotations

import sys
from typing import Any, Self

from mergepipe.core.progress import Progress, ProgressFn


class _Bar:
    """One tqdm bar at a time; nothing at all unless stderr is a terminal."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self._bar: Any = None
        self._label: str | None = None

    def show(self, label: str, p: Progress, **tqdm_args: Any) -> None:
        if not self.enabled:
            return
        if self._label != label:
            self.close()
            from tqdm import tqdm
            self._bar = tqdm(total=p.total, desc=label, file=sys.stderr, leave=False,
                             **tqdm_args)
            self._label = label
        self._bar.total = p.total
        self._bar.n = p.done
        self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
            self._label = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class IngestBar(_Bar):
    """Bytes scanned, one bar per model ingested."""

    def update(self, p: Progress) -> None:
        self.show(f"ingesting {p.model or ''}".strip(), p, unit="B", unit_scale=True,
                  unit_divisor=1024)

    def update_for(self, model: str) -> ProgressFn:
        """A callback for the ingestion of `model` (the scan does not know the name)."""
        return lambda p: self.update(Progress(p.done, p.total, p.unit, model=model))


class MergeBar(_Bar):
    """Output blocks written by a merge."""

    def update(self, p: Progress) -> None:
        self.show("merging", p, unit="block")
