"""Nothing proportional to a claimed size: a header declaring a huge tensor that exactly fills a
sparse file costs a 4xx and constant memory (caps on file size, elements and blocks; the block
grid in closed form). Each ingestion runs in a child under an address-space limit, its resident
growth measured from VmHWM."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mergepipe.core.checkpoint_limits import CheckpointLimits
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.settings import Settings
from mergepipe.storage.grid import BlockGrid, block_rows

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
CEILING = 200 * MIB


def _probe(tmp_path: Path, rows: int, cols: int, *caps: int) -> dict:
    cmd = [sys.executable, "-m", "tests.size_claim_probe", str(tmp_path), str(rows), str(cols),
           *map(str, caps)]
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("the ingestion of a sparse size-claim bomb was still running after 90 s")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _sparse_ok(tmp_path: Path, nbytes: int) -> bool:
    try:
        with open(tmp_path / "probe", "wb") as f:
            f.truncate(nbytes)
        return True
    except OSError:
        return False
    finally:
        (tmp_path / "probe").unlink(missing_ok=True)


def test_a_file_larger_than_the_cap_is_refused_before_its_header(tmp_path: Path) -> None:
    # one BF16 tensor [2**20, 2**20]: 2 TiB claimed, nothing allocated on disk
    if not _sparse_ok(tmp_path, 1 << 41):
        pytest.skip("this file system cannot hold a 2 TiB sparse file")
    r = _probe(tmp_path, 1 << 20, 1 << 20)
    assert r["outcome"] == "refused" and r["status"] == 422, r
    assert "model.safetensors" in r["message"] and "MERGEPIPE_MAX_FILE_BYTES" in r["message"]
    assert r["rss_growth"] < CEILING, r


def test_a_tensor_with_more_elements_than_the_cap_is_refused_naming_it(tmp_path: Path) -> None:
    if not _sparse_ok(tmp_path, 1 << 41):
        pytest.skip("this file system cannot hold a 2 TiB sparse file")
    r = _probe(tmp_path, 1 << 20, 1 << 20, 1 << 42, CheckpointLimits.max_tensor_elements)
    assert r["outcome"] == "refused" and r["status"] == 422, r
    assert "tensor 'w'" in r["message"] and "MERGEPIPE_MAX_TENSOR_ELEMENTS" in r["message"], r
    assert r["rss_growth"] < CEILING, r


def test_a_grid_of_more_blocks_than_the_cap_is_refused_in_closed_form(tmp_path: Path) -> None:
    # file and element caps raised: [2**20, 2**22] BF16 (8 TiB, 2**23 blocks of 1 MiB) passes
    # the header, and the block count is refused before anything is allocated per block
    if not _sparse_ok(tmp_path, 1 << 43):
        pytest.skip("this file system cannot hold an 8 TiB sparse file")
    r = _probe(tmp_path, 1 << 20, 1 << 22, 1 << 44, 1 << 44)
    assert r["outcome"] == "refused" and r["status"] == 422, r
    assert f"{1 << 23} blocks, over the limit of {CheckpointLimits.max_blocks}" in r["message"]
    assert "'w'" in r["message"] and "MERGEPIPE_MAX_BLOCKS" in r["message"], r
    assert r["rss_growth"] < CEILING, r


def test_the_block_grid_of_a_claimed_2_61_byte_tensor_is_closed_form() -> None:
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    grid = block_rows((1 << 20, 1 << 40), 2, 1 << 20)  # [2**20, 2**40] BF16, 2**61 bytes
    assert isinstance(grid, BlockGrid)
    assert len(grid) == 1 << 41  # rows of 2 TiB: cut into element ranges of 1 MiB
    assert grid[0] == (0, 1 << 19) and grid[-1] == ((1 << 60) - (1 << 19), 1 << 60)
    assert grid[1 << 40] == (1 << 59, (1 << 59) + (1 << 19))
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0 < CEILING


def test_the_closed_form_grid_is_the_balanced_grid() -> None:
    # the bounds rows * i // n of the list the grid replaced, for uneven splits too
    for shape, itemsize, block in (((3000,), 2, 1024), ((40, 24), 2, 1024), ((2, 1500), 2, 1024),
                                   ((7, 3), 4, 16), ((0, 5), 2, 64), ((1,), 4, 64)):
        grid = block_rows(shape, itemsize, block)
        units = grid.units
        bounds = [units * i // len(grid) for i in range(len(grid) + 1)]
        assert list(grid) == list(zip(bounds[:-1], bounds[1:], strict=True)), shape
        assert grid == list(grid) and list(grid) == grid
        assert grid[1:3] == list(grid)[1:3]
        assert sum(e - s for s, e in grid) == units


def test_the_caps_come_from_the_settings() -> None:
    s = Settings.from_env({"MERGEPIPE_MAX_FILE_BYTES": "4096", "MERGEPIPE_MAX_BLOCKS": "7",
                           "MERGEPIPE_MAX_TENSOR_ELEMENTS": "100",
                           "MERGEPIPE_MAX_TENSORS_PER_FILE": "3"})
    assert s.checkpoint_limits() == CheckpointLimits(4096, 3, 100, 7)
    assert Settings.from_env({}).checkpoint_limits() == CheckpointLimits()
    with pytest.raises(InvalidRequest, match="MERGEPIPE_MAX_BLOCKS"):
        Settings.from_env({"MERGEPIPE_MAX_BLOCKS": "0"})


def test_a_small_cap_refuses_an_ordinary_checkpoint(tmp_path: Path) -> None:
    """The cap applies to whatever reads a header (here the CLI, from its settings)."""
    from tests import factory

    base = factory.make_base(tmp_path / "base")
    env = {**os.environ, "MERGEPIPE_MAX_FILE_BYTES": "64",
           "MERGEPIPE_CATALOG": str(tmp_path / "c.duckdb")}
    done = subprocess.run([sys.executable, "-m", "mergepipe", "ingest", str(base), "--name", "b"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "over the limit of 64" in done.stderr and "Traceback" not in done.stderr


def _hwm_reset(pid: int) -> bool:
    """Reset the peak resident size of process `pid` to its current one (Linux clear_refs)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def test_a_size_claim_bomb_costs_a_real_server_a_4xx_and_constant_memory(tmp_path: Path) -> None:
    from tests.live_server import serving
    from tests.size_claim_probe import sparse_checkpoint

    if not _sparse_ok(tmp_path, 1 << 41):
        pytest.skip("this file system cannot hold a 2 TiB sparse file")
    data = tmp_path / "data"
    bomb = sparse_checkpoint(data / "bomb", 1 << 20, 1 << 20)  # [2**20, 2**20] BF16: 2 TiB
    with serving(tmp_path, {"MERGEPIPE_CATALOG": str(tmp_path / "c.duckdb"),
                            "MERGEPIPE_DATA_ROOTS": str(data),
                            "MERGEPIPE_OUTPUT_ROOT": str(tmp_path / "out")}, up_s=60) as (proc, api):
        if not _hwm_reset(proc.pid):
            pytest.skip("needs /proc/PID/clear_refs to measure the server's peak memory")
        rss0 = _status_kib(proc.pid, "VmRSS")
        api.ok("POST", "/v1/models", {"name": "bomb", "path": str(bomb)}, status=202)
        deadline = time.monotonic() + 60
        while (m := api.ok("GET", "/v1/models/bomb"))["status"] not in ("failed", "ready"):
            assert time.monotonic() < deadline, f"the bomb's ingestion still {m} after 60 s"
            time.sleep(0.1)
        assert m["status"] == "failed", m
        assert "MERGEPIPE_MAX_FILE_BYTES" in m["error"] and "model.safetensors" in m["error"]
        assert _status_kib(proc.pid, "VmHWM") - rss0 < CEILING
        assert api.call("GET", "/healthz")[0] == 200
