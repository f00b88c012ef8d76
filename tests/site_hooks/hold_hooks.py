"""The fault tests' hold hooks (mergepipe.core.hooks): at a chosen point a process appends its
pid to `<folder>/starts`; while `<folder>/hold` exists it publishes its pid as `<folder>/pid`
(the test's kill target) and waits there.

In the test's own process: `with holding(folder, point): ...`. In the processes a test starts
(a `mergepipe worker`, Ray's worker processes): `child_env(env, folder, point)` puts this folder
first on their PYTHONPATH, so that its `sitecustomize` installs the hooks as they start. The
indexed points (output regions, ingestion shards) hold index 0 only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from mergepipe.core import hooks

POINTS = ("ingest_running", "merge_staged", "region_started", "shard_started")
HOLD_TIMEOUT_S = 300  # a forgotten hold file never blocks a run for longer
# how a test hands the hold to a child process (read by sitecustomize.py there, never by the
# product)
FOLDER_ENV, POINTS_ENV = "MERGEPIPE_TEST_HOLD_DIR", "MERGEPIPE_TEST_HOLD_AT"
SITE = Path(__file__).resolve().parent  # the folder with sitecustomize.py


class HoldHooks(hooks.Hooks):
    """Hold at `points` (names of POINTS) on `folder`."""

    def __init__(self, folder: Path | str, points: tuple[str, ...]) -> None:
        unknown = set(points) - set(POINTS)
        if unknown:
            raise ValueError(f"unknown hook points {sorted(unknown)}; known: {POINTS}")
        self.folder = Path(folder)
        self.points = points

    def ingest_running(self, model: str) -> None:
        self._at("ingest_running")

    def merge_staged(self, merge_id: str) -> None:
        self._at("merge_staged")

    def region_started(self, index: int) -> None:
        if index == 0:
            self._at("region_started")

    def shard_started(self, index: int) -> None:
        if index == 0:
            self._at("shard_started")

    def _at(self, point: str) -> None:
        if point not in self.points:
            return
        pid = os.getpid()
        with (self.folder / "starts").open("a") as f:  # one line per attempt
            f.write(f"{pid}\n")
        hold = self.folder / "hold"
        if not hold.exists():
            return
        tmp = self.folder / f"pid.{pid}"
        tmp.write_text(str(pid))
        os.replace(tmp, self.folder / "pid")
        deadline = time.monotonic() + HOLD_TIMEOUT_S
        while hold.exists() and time.monotonic() < deadline:
            time.sleep(0.02)


@contextmanager
def holding(folder: Path, *points: str) -> Iterator[HoldHooks]:
    """This process holds at `points` on `folder` inside the block."""
    mine = HoldHooks(folder, points)
    old = hooks.install(mine)
    try:
        yield mine
    finally:
        hooks.install(old)


def child_env(env: Mapping[str, str], folder: Path, *points: str) -> dict[str, str]:
    """`env` for a child process that holds at `points` on `folder`."""
    HoldHooks(folder, points)  # checks the names here, not in the child
    path = [str(SITE), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    return {**env, "PYTHONPATH": os.pathsep.join(path), FOLDER_ENV: str(folder),
            POINTS_ENV: ",".join(points)}


def install_from_env() -> None:
    """In a child started with `child_env`: install its hooks."""
    folder = os.environ.get(FOLDER_ENV)
    if folder:
        hooks.install(HoldHooks(folder, tuple(filter(None, os.environ.get(POINTS_ENV, "")
                                                     .split(",")))))
