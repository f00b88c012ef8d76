"""A catalog held by another process (a running server or merge): every CLI command says so in
one line and exits non-zero; nothing is written."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from mergepipe.cli.main import main

pytestmark = pytest.mark.duckdb_only("DuckDB's one-process file lock")

HOLD = """
import sys, time
from mergepipe.catalog.db import Catalog
cat = Catalog(sys.argv[1])
with cat.reader() as conn:
    open(sys.argv[2], "w").close()
    time.sleep(120)
"""


@pytest.mark.parametrize("argv", [["models"], ["sql", "SELECT 1"],
                                  ["ingest", "nowhere", "--name", "x"],
                                  ["merge", "--base", "b", "--experts", "e", "--op", "linear",
                                   "--out", "OUT"]])
def test_cli_against_a_catalog_held_by_another_process(tmp_path: Path, argv: list[str],
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    db, ready = tmp_path / "catalog.duckdb", tmp_path / "holding"
    repo = Path(__file__).resolve().parent.parent
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(db), str(ready)], cwd=repo)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert holder.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        args = [a.replace("OUT", str(tmp_path / "out")) for a in argv]
        capsys.readouterr()
        rc = main(["--catalog", str(db), *args])
        err = capsys.readouterr().err.strip()
        assert rc != 0 and len(err.splitlines()) == 1, err
        assert "in use by another process" in err and f"PID {holder.pid}" in err, err
        assert not (tmp_path / "out").exists()
    finally:
        holder.kill()
        holder.wait()
