"""The fault tests' hold hook: a process logs its start and waits while a hold file exists."""

from __future__ import annotations

import os
import time

HOLD_TIMEOUT_S = 300  # a forgotten hold file never blocks a run for longer


def wait_while_held(env: str) -> None:
    """When `env` names a folder: append this pid to its `starts`, publish it as `pid` (the
    test's kill target) and wait while `hold` exists there. A no-op when `env` is unset."""
    hold_dir = os.environ.get(env)
    if not hold_dir:
        return
    with open(os.path.join(hold_dir, "starts"), "a") as f:  # one line per attempt
        f.write(f"{os.getpid()}\n")
    if not os.path.exists(os.path.join(hold_dir, "hold")):
        return
    tmp = os.path.join(hold_dir, f"pid.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.replace(tmp, os.path.join(hold_dir, "pid"))
    deadline = time.monotonic() + HOLD_TIMEOUT_S
    while os.path.exists(os.path.join(hold_dir, "hold")) and time.monotonic() < deadline:
        time.sleep(0.02)
