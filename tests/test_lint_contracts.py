"""The import-linter contracts of pyproject.toml (layers only look down, no cycles) hold, and so
do ruff's complexity rules (modules sized by cohesion, functions by their branches)."""

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


def test_functions_stay_under_the_complexity_rules() -> None:
    """pyproject.toml selects C901 (complexity 10), PLR0912 and PLR0915 for src and tests, and
    no function goes over them."""
    import tomllib

    lint = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert {"C901", "PLR0912", "PLR0915"} <= set(lint["select"])
    assert lint["mccabe"]["max-complexity"] == 10
    assert "pylint" not in lint  # the PLR thresholds are ruff's defaults
    script = Path(sys.executable).parent / "ruff"
    ruff = str(script) if script.exists() else shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff (the dev extra) is not installed")
    proc = subprocess.run([ruff, "check", "--no-cache", "--select", "C901,PLR0912,PLR0915",
                           "src", "tests"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
