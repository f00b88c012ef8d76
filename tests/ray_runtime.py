"""A real local Ray runtime with two worker CPUs for the Ray engine's tests (started once)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.site_hooks.hold_hooks import child_env

RAY_CPUS = 2


@contextmanager
def local_ray(hold_dir: Path) -> Iterator[Path]:
    """ray.init with 2 CPUs; its worker processes hold on `hold_dir` (tests.site_hooks: a
    file `hold` there makes output region 0 and ingestion shard 0 wait and write their worker's
    pid to `pid`)."""
    import ray

    saved = dict(os.environ)
    os.environ.update(child_env(os.environ, hold_dir, "region_started", "shard_started"))
    ray.init(num_cpus=RAY_CPUS, include_dashboard=False, object_store_memory=128 << 20,
             log_to_driver=False)
    try:
        yield hold_dir
    finally:
        ray.shutdown()
        os.environ.clear()
        os.environ.update(saved)
