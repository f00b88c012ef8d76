"""Start-up: each command imports only what it needs (checked in a fresh interpreter)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.ingest import ingest_model
from mergepipe.catalog.models import find_model
from tests import factory
from tests.catalogs import copy_catalog, is_postgres, new_catalog

ROOT = Path(__file__).resolve().parents[1]
# Run the CLI in-process in a fresh interpreter, then report which of these it imported.
PROBE = """
import json, sys
from mergepipe.cli.main import main
try:
    rc = main(sys.argv[1:])
except SystemExit as e:
    rc = e.code
watched = {"torch", "fastapi", "starlette", "uvicorn", "pydantic", "transformers", "numpy",
           "sqlalchemy", "duckdb", "_duckdb", "safetensors", "yaml", "boto3", "xxhash", "urllib3"}
loaded = sorted({m.split(".")[0] for m in sys.modules} & watched)
print(json.dumps({"rc": rc, "loaded": loaded}), file=sys.stderr)
"""
SERVICE_ONLY = {"fastapi", "starlette", "uvicorn", "pydantic", "transformers"}
# duckdb 2.x: the catalog imports the engine, `_duckdb`, without the package's Python layer
ENGINE = "_duckdb" if importlib.util.find_spec("_duckdb") else "duckdb"


def _imports(*argv: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    out = json.loads(done.stderr.strip().splitlines()[-1])
    assert out["rc"] == 0, done.stderr[-2000:]
    return set(out["loaded"])


def test_help_imports_no_third_party_package() -> None:
    assert _imports("--help") == set()
    assert _imports("merge", "--help") == set()


@pytest.fixture(scope="module")
def cat_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("startup")
    base = factory.make_base(root / "base")
    factory.make_expert(base, root / "e0", seed=1)
    db = new_catalog(root, "c")
    with Catalog(db) as cat:
        ingest_model(cat, base, "base")
        ingest_model(cat, root / "e0", "e0", base="base")
    return str(db)


def _base_path(cat_path: str) -> Path:
    """Where the catalog's base checkpoint lies (the catalog may be a PostgreSQL URL)."""
    with Catalog(cat_path) as cat:
        row = find_model(cat, "base")
    assert row is not None
    return Path(row.path)


@pytest.mark.parametrize("argv", [["models"], ["sql", "SELECT count(*) FROM blocks"],
                                  ["plan", "--base", "base", "--experts", "e0", "--op", "ties",
                                   "--param", "density=0.5", "--budget", "0.3"]])
def test_catalog_commands_import_neither_torch_nor_the_service(cat_path: str,
                                                               argv: list[str]) -> None:
    loaded = _imports("--catalog", cat_path, *argv)
    # `plan` builds its request with the request schema (pydantic, about 0.2 s to import);
    # listing and SQL do not
    schema = {"pydantic"} if argv[0] == "plan" else set()
    assert not loaded & ({"torch", "numpy", "safetensors"} | SERVICE_ONLY) - schema, loaded
    assert ("pydantic" in loaded) == bool(schema), loaded
    if is_postgres(cat_path):
        assert "sqlalchemy" in loaded  # the catalog is open: the probe saw the command run
    else:  # DuckDB's own API: SQLAlchemy and its DuckDB dialect cost 0.4 s to import, the
        # duckdb package's relational layer 0.1 s (which `sql` needs: the sandbox's snapshot of
        # the catalog streams each table as Arrow, which only the package's sources can scan)
        relational = {"duckdb"} if argv[0] == "sql" else set()
        assert ENGINE in loaded, loaded
        assert not loaded & ({"sqlalchemy", "duckdb"} - {ENGINE} - relational), loaded


@pytest.mark.parametrize("kind", ["full", pytest.param("delta", marks=pytest.mark.slow)])
def test_ingesting_a_full_or_a_delta_checkpoint_never_imports_torch(cat_path: str, kind: str,
                                                                   tmp_path: Path) -> None:
    """numpy and the C pass compute their statistics; torch is for LoRA's product only."""
    base = _base_path(cat_path)
    make = factory.make_expert if kind == "full" else factory.make_delta
    path = make(base, tmp_path / kind, seed=5)
    loaded = _imports("--catalog", cat_path, "ingest", str(path), "--name", f"np-{kind}",
                      "--base", "base", "--kind", kind, "--json")
    assert "numpy" in loaded and not loaded & ({"torch"} | SERVICE_ONLY), loaded
    assert "urllib3" not in loaded, loaded  # the HTTP client loads for http(s):// locations
    with Catalog(cat_path) as cat, cat.reader() as conn:
        n = conn.execute(SQL("SELECT count(*) FROM block_stats WHERE model = :m AND l1 > 0"),
                         {"m": f"np-{kind}"}).scalar_one()
    assert n > 0  # registered with its statistics


@pytest.mark.slow
def test_a_lora_ingestion_imports_torch_for_its_product(cat_path: str, tmp_path: Path) -> None:
    base = _base_path(cat_path)
    lora = factory.make_lora(base, tmp_path / "lora", seed=7)
    loaded = _imports("--catalog", cat_path, "ingest", str(lora), "--name", "np-lora",
                      "--base", "base", "--kind", "lora", "--json")
    assert "torch" in loaded


@pytest.mark.parametrize(("argv", "torch_wanted"), [
    (["--op", "linear", "--budget", "0.5"], False),
    (["--op", "ties", "--param", "density=0.5"], False),
    (["--op", "dare_ties", "--param", "density=0.5", "--budget", "0.4"], False),
    (["--op", "ties", "--param", "density=0.5", "--param", "semantics=mergekit"], True),
    (["--op", "della", "--param", "density=0.5"], True),
])
def test_merge_loads_torch_only_for_blocks_the_fused_kernels_leave(
        cat_path: str, tmp_path: Path, argv: list[str], torch_wanted: bool) -> None:
    """torch (~1.5 s of CPU to import) loads with the first block that needs a torch kernel: a
    merge that the fused C kernels cover, its output registered with statistics, never does."""
    from mergepipe.core.operators import fused

    if not fused.available():
        pytest.skip("the C extension was not built: every merge uses torch")
    cat = copy_catalog(cat_path, tmp_path)
    loaded = _imports("--catalog", str(cat), "merge", "--base", "base", "--experts", "e0",
                      *argv, "--out", str(tmp_path / "out"), "--json")
    assert ENGINE in loaded  # the probe saw the merge run
    assert ("sqlalchemy" in loaded) == is_postgres(cat_path), loaded
    assert ("torch" in loaded) == torch_wanted, loaded
    assert (tmp_path / "out" / "model.safetensors").exists()


@pytest.mark.slow
def test_console_script_ends_with_its_code_and_all_its_output(cat_path: str) -> None:
    """`python -m mergepipe` ends with os._exit after the command (no interpreter teardown):
    every byte it printed to a pipe still arrives, and its exit code is the command's."""
    query = ("SELECT a.content_hash, b.tensor, b.block_index FROM blocks a, blocks b "
             "ORDER BY 1, 2, 3")
    with Catalog(cat_path) as cat, cat.reader() as conn:
        rows = conn.execute(SQL(query)).all()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # a buffered pipe
    done = subprocess.run([sys.executable, "-m", "mergepipe", "--catalog", cat_path, "sql",
                           "--json", query], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(done.stdout) > 8192  # more than one buffer of a pipe's stdout
    got = json.loads(done.stdout)
    assert got["rows"] == [list(r) for r in rows] and not got["truncated"]
    bad = subprocess.run([sys.executable, "-m", "mergepipe", "--catalog", cat_path, "sql",
                          "SELECT nope FROM blocks"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and "mergepipe sql: error:" in bad.stderr


@pytest.mark.slow
def test_local_ingest_imports_no_s3_client(tmp_path: Path) -> None:
    """boto3 is imported by S3 reads and writes only (0.1-0.3 s of every command otherwise)."""
    base = factory.make_base(tmp_path / "base")
    loaded = _imports("--catalog", str(tmp_path / "c.duckdb"), "ingest", str(base), "--name",
                      "base")
    assert "xxhash" in loaded  # the probe saw the ingestion run (its block hashes)
    assert "boto3" not in loaded, loaded


def test_preload_imports_in_a_background_thread_and_leaves_failures_to_the_command() -> None:
    from mergepipe.cli import preload

    sys.modules.pop("colorsys", None)
    t = preload.start("no_such_module_of_mergepipe", "colorsys")
    t.join(60)
    assert not t.is_alive() and t.daemon
    assert "colorsys" not in sys.modules  # the first failure ends the preload, unraised
    t = preload.start("colorsys")
    t.join(60)
    assert "colorsys" in sys.modules
