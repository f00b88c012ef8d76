"""Start-up: each command imports only what it needs (checked in a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.ingest import ingest_model
from tests import factory
from tests.catalogs import new_catalog

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
           "sqlalchemy", "duckdb", "safetensors", "yaml", "boto3", "xxhash"}
loaded = sorted({m.split(".")[0] for m in sys.modules} & watched)
print(json.dumps({"rc": rc, "loaded": loaded}), file=sys.stderr)
"""
SERVICE_ONLY = {"fastapi", "starlette", "uvicorn", "pydantic", "transformers"}


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


@pytest.mark.parametrize("argv", [["models"], ["sql", "SELECT count(*) FROM blocks"],
                                  ["plan", "--base", "base", "--experts", "e0", "--op", "ties",
                                   "--param", "density=0.5", "--budget", "0.3"]])
def test_catalog_commands_import_neither_torch_nor_the_service(cat_path: str,
                                                               argv: list[str]) -> None:
    loaded = _imports("--catalog", cat_path, *argv)
    assert "sqlalchemy" in loaded  # the catalog is open: the probe saw the command run
    assert not loaded & ({"torch", "numpy", "safetensors"} | SERVICE_ONLY), loaded
