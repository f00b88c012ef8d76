"""The Ray engine on a real local Ray runtime: the local engine's bytes for every operator and
budget, sharded and single-file; the catalog record of a merge; a Ray worker killed mid-task."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.models import model_blocks
from mergepipe.cli.main import main
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.operators import REGISTRY
from mergepipe.core.request import build_request
from mergepipe.core.settings import Settings
from mergepipe.executor.engine import Engine
from mergepipe.jobs.merge import execute_plan, merge
from mergepipe.planner.plan import make_plan
from tests.api_helpers import (
    client_for,
    make_family,
    register_family,
    run_merge,
    settings_for,
    ties_body,
)
from tests.catalogs import new_catalog
from tests.crash_helpers import alive
from tests.executor_family import ingest_family

RAY = Engine("ray")
OPS = list(REGISTRY)  # every registered operator
FAMILIES = {"sharded": ("", "e0,e1:0.5,e2:2"), "single": ("s", "se0,se1:0.5,se2:2")}


@pytest.fixture(scope="module")
def fam(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """A two-shard family ('base', e0..e2) and a single-file one ('sbase', se0..se2)."""
    root = tmp_path_factory.mktemp("rayfam")
    cat = Catalog(new_catalog(root))
    ingest_family(cat, root / "sharded", shards=2)
    ingest_family(cat, root / "single", prefix="s", seed=3)
    yield {"cat": cat}
    cat.close()


def files_of(d: Path) -> dict[str, bytes]:
    """Every file of an output but its manifest (which holds timings and paths)."""
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.name != "manifest.json"}


def both_engines(cat: Catalog, tmp: Path, family: str, op: str, budget: float,
                 **params: object) -> tuple[Path, Path]:
    """The same plan executed by the local engine and by Ray; their output directories."""
    prefix, experts = FAMILIES[family]
    spec = REGISTRY[op]
    experts = ",".join(experts.split(",")[:spec.experts_count[1] or 3])  # slerp takes one
    req = build_request(base=f"{prefix}base", experts=experts, operator=op, budget=budget,
                        params={**({"density": 0.5} if spec.density else {}), **params},
                        seed=7)
    plan = make_plan(cat, req)
    local = execute_plan(cat, plan, tmp / "local")
    ray = execute_plan(cat, plan, tmp / "ray", engine=RAY)
    assert ray.expert_bytes_read == local.expert_bytes_read <= plan.budget_bytes
    assert ray.base_bytes_read == local.base_bytes_read
    assert (ray.blocks_total, ray.expert_blocks_read) == (local.blocks_total,
                                                          local.expert_blocks_read)
    assert ray.output_hash == local.output_hash
    return tmp / "local", tmp / "ray"


# every operator at both budgets and both layouts; the fast run takes a block operator budgeted
# on the sharded family, one at full budget on the single file and a whole-tensor one (slerp)
GRID = [pytest.param(op, budget, family, id=f"{op}-{budget}-{family}",
                     marks=() if (op, budget, family) in FAST else pytest.mark.slow)
        for FAST in [{("ties", 0.3, "sharded"), ("linear", 1.0, "single"),
                      ("slerp", 0.3, "sharded")}]
        for op in OPS for budget in (1.0, 0.3) for family in ("sharded", "single")]


@pytest.mark.parametrize(("op", "budget", "family"), GRID)
def test_ray_engine_writes_the_local_engines_bytes(ray_runtime: Path, fam: dict, tmp_path: Path,
                                                   op: str, budget: float, family: str) -> None:
    local, ray = both_engines(fam["cat"], tmp_path, family, op, budget)
    want = files_of(local)
    assert any(n.endswith(".safetensors") for n in want)
    assert files_of(ray) == want
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


@pytest.mark.slow  # the fast grid and the service test cover the engine
def test_ray_engine_under_mergekit_semantics(ray_runtime: Path, fam: dict,
                                             tmp_path: Path) -> None:
    """mergekit's arithmetic in bf16 runs every block through the operator: same bytes too."""
    local, ray = both_engines(fam["cat"], tmp_path, "sharded", "ties", 0.3,
                              semantics="mergekit", compute_dtype="bfloat16")
    assert files_of(ray) == files_of(local)


@pytest.mark.slow  # the fast grid and the service test cover the engine
def test_ray_merge_records_and_registers_like_local(ray_runtime: Path, fam: dict,
                                                    tmp_path: Path) -> None:
    """run_merge on Ray: the output registered from the tasks' first scan pass has the blocks
    (hashes, statistics) of the same merge on the local engine."""
    cat = fam["cat"]
    req = build_request(base="base", experts="e0,e1", operator="ties", budget=0.5,
                        params={"density": 0.5})
    a = merge(cat, req, tmp_path / "a", output_name="ray-a", engine=RAY)
    b = merge(cat, req, tmp_path / "b", output_name="ray-b")
    assert a.plan_hash == b.plan_hash and a.output_hash == b.output_hash
    weights = [n for n in files_of(tmp_path / "b") if n != "README.md"]  # the card names it
    assert weights and all((tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes()
                           for n in weights)
    blocks = [{k: v for k, v in vars(blk).items() if k not in ("model", "file_index")}
              for blk in model_blocks(cat, "ray-a")]
    assert blocks == [{k: v for k, v in vars(blk).items() if k not in ("model", "file_index")}
                      for blk in model_blocks(cat, "ray-b")]
    with cat.reader() as conn:
        stats = [conn.execute(SQL(
            "SELECT tensor, block_index, l2, l1, max_abs, nnz FROM block_stats WHERE model = :m "
            "ORDER BY tensor, block_index"), {"m": m}).all() for m in ("ray-a", "ray-b")]
    assert stats[0] and stats[0] == stats[1]


def test_killed_ray_worker_is_retried_with_identical_output(ray_runtime: Path, fam: dict,
                                                            tmp_path: Path) -> None:
    """kill -9 the worker process running output region 0 while it holds: Ray runs the task
    again (max_retries) and the output is the local engine's, byte for byte."""
    cat = fam["cat"]
    req = build_request(base="base", experts="e0,e1:0.5,e2:2", operator="dare_ties",
                        budget=0.6, params={"density": 0.5}, seed=3)
    plan = make_plan(cat, req)
    execute_plan(cat, plan, tmp_path / "local")
    hold, pid_file = ray_runtime / "hold", ray_runtime / "pid"
    pid_file.unlink(missing_ok=True)
    (ray_runtime / "starts").unlink(missing_ok=True)
    hold.touch()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            execute_plan(cat, plan, tmp_path / "ray", engine=RAY)
        except BaseException as e:  # noqa: BLE001 - asserted below
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGKILL)
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not alive(pid)
    finally:
        hold.unlink(missing_ok=True)
        t.join(120)
    assert not errors and not t.is_alive()
    starts = (ray_runtime / "starts").read_text().split()
    assert len(starts) == 2 and starts[0] == str(pid) != starts[1]  # killed, then run again
    assert files_of(tmp_path / "ray") == files_of(tmp_path / "local")


def test_cli_merge_engine_ray_prints_the_local_hash(ray_runtime: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    """`mergepipe merge --engine ray` (the session's runtime is used, not a new one) and the
    same merge on the local engine: same output hash and weights."""
    db = str(new_catalog(tmp_path))
    with Catalog(db) as cat:
        ingest_family(cat, tmp_path / "fam", prefix="s")
    hashes = []
    for engine, out in (("ray", "cli-ray"), ("local", "cli-local")):
        rc = main(["--catalog", db, "merge", "--base", "sbase", "--experts", "se0,se1",
                   "--op", "dare_ties", "--param", "density=0.4", "--budget", "0.5",
                   "--out", str(tmp_path / out), "--engine", engine, "--json"])
        assert rc == 0
        hashes.append(json.loads(capsys.readouterr().out)["output_hash"])
    assert hashes[0] == hashes[1]
    assert ((tmp_path / "cli-ray" / "model.safetensors").read_bytes()
            == (tmp_path / "cli-local" / "model.safetensors").read_bytes())


def test_an_unknown_engine_is_refused_naming_the_variable() -> None:
    with pytest.raises(InvalidRequest, match="engine 'spark' is not one of local, ray"):
        Settings.from_env({"MERGEPIPE_ENGINE": "spark"})
    s = Settings.from_env({"MERGEPIPE_ENGINE": "ray", "MERGEPIPE_RAY_ADDRESS": "head:6379"})
    assert Engine.of(s) == Engine("ray", "head:6379")


def test_service_workers_run_merges_on_ray(ray_runtime: Path, tmp_path: Path) -> None:
    """MERGEPIPE_ENGINE=ray in a server's job workers (inputs confined to the data roots in
    the tasks too): the output of the same request on the local engine."""
    family = make_family(tmp_path / "data" / "family")
    outs = {}
    settings = settings_for(tmp_path)
    for engine in ("ray", "local"):
        with client_for(dataclasses.replace(settings, engine=engine)) as c:
            if engine == "ray":
                register_family(c, family)
            m = run_merge(c, ties_body(f"via-{engine}", 0.5))
            outs[engine] = Path(m["output"]["path"])
    assert (outs["ray"] / "model.safetensors").read_bytes() == (
        outs["local"] / "model.safetensors").read_bytes()


@pytest.mark.slow
def test_cli_starts_and_stops_a_local_ray_runtime_for_the_merge(tmp_path: Path) -> None:
    """`mergepipe merge --engine ray` in a fresh process (no Ray yet): it starts a local
    runtime for the merge, writes the local engine's bytes, stops it and exits."""
    db = str(new_catalog(tmp_path))
    with Catalog(db) as cat:
        ingest_family(cat, tmp_path / "fam", shards=2)
    cli = [sys.executable, "-m", "mergepipe", "--catalog", db, "merge", "--base", "base",
           "--experts", "e0,e1", "--op", "ties", "--param", "density=0.5", "--budget", "0.5",
           "--json"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    for engine in ("ray", "local"):
        r = subprocess.run([*cli, "--out", str(tmp_path / engine), "--engine", engine],
                           capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        assert json.loads(r.stdout)["status"] == "succeeded"
    assert files_of(tmp_path / "ray").keys() == files_of(tmp_path / "local").keys()
    for n in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        assert (tmp_path / "ray" / n).read_bytes() == (tmp_path / "local" / n).read_bytes()


@pytest.mark.parametrize(("address", "said"), [
    ("127.0.0.1:PORT", "the Ray cluster at 127.0.0.1:PORT (nothing answers there: Connection refused)"),
    ("", "a local Ray runtime (NotADirectoryError)"),
], ids=["no-cluster-at-address", "local-runtime-cannot-start"])
def test_a_ray_runtime_that_cannot_start_or_be_reached_is_one_line_naming_it(
        tmp_path: Path, address: str, said: str) -> None:
    """`--engine ray` in a fresh process where Ray cannot run: an address where no cluster
    listens (Ray itself would retry, then end the process) or a local runtime that cannot start
    (its temp dir is below a file). Exit 2 (the CLI's status for any failure), one stderr line
    saying which runtime cannot be started or reached and Ray's reason, no traceback, no output
    left, the merge recorded as failed."""
    db = str(new_catalog(tmp_path))
    with Catalog(db) as cat:
        ingest_family(cat, tmp_path / "fam")
    (tmp_path / "afile").write_text("")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    address, said = address.replace("PORT", port), said.replace("PORT", port)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MERGEPIPE_RAY_ADDRESS")}
    env["RAY_TMPDIR"] = str(tmp_path / "afile" / "x")
    r = subprocess.run([sys.executable, "-m", "mergepipe", "--catalog", db, "merge", "--base",
                        "base", "--experts", "e0,e1", "--op", "linear", "--out",
                        str(tmp_path / "out"), "--engine", "ray",
                        *(["--ray-address", address] if address else [])],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"cannot start or reach {said}" in lines[0], lines[0]
    assert not (tmp_path / "out").exists()
    with Catalog(db) as cat:  # the failed merge is recorded as failed, with the same reason
        rows = [tuple(r) for r in cat.query(SQL("SELECT status, error FROM merges"))]
    assert [s for s, _ in rows] == ["failed"] and "cannot start or reach" in rows[0][1]
