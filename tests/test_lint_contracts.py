"""The import-linter contracts of pyproject.toml (layers only look down, no cycles) hold."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_import_contracts_hold() -> None:
    pytest.importorskip("importlinter", reason="import-linter (the dev extra) is not installed")
    script = Path(sys.executable).parent / "lint-imports"
    cmd = [str(script)] if script.exists() else [shutil.which("lint-imports") or "lint-imports"]
    proc = subprocess.run([*cmd, "--no-cache"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout
