"""A real local Ray runtime with two worker CPUs for the Ray engine's tests (started once)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mergepipe.executor.regions import HOLD_ENV

RAY_CPUS = 2


@contextmanager
def local_ray(hold_dir: Path) -> Iterator[Path]:
    """ray.init with 2 CPUs; its workers see HOLD_ENV = `hold_dir` (the fault tests' hook:
    a file `hold` there makes output region 0 wait and write its worker's pid to `pid`)."""
    import ray

    os.environ[HOLD_ENV] = str(hold_dir)
    ray.init(num_cpus=RAY_CPUS, include_dashboard=False, object_store_memory=128 << 20,
             log_to_driver=False)
    try:
        yield hold_dir
    finally:
        ray.shutdown()
        os.environ.pop(HOLD_ENV, None)
