"""One real tree: every product module lives under src/mergepipe/ and loads under one name.

The repository root keeps the product owner's names (service/, planner/, executor/, migrations/,
catalog_schema.sql) as links into that tree; a plain walk or `grep -r` of src/ sees every module
once, and importing a linked folder under its short name is a loud error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "src" / "mergepipe"
LINKED = ("service", "planner", "executor", "migrations")


def product_modules() -> list[Path]:
    """The .py files under src/mergepipe/, walked without following any link."""
    out = []
    for top, dirs, files in os.walk(PACKAGE):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        out += [Path(top, f) for f in sorted(files) if f.endswith(".py")]
    return out


def test_the_package_is_one_real_tree() -> None:
    links = [str(p) for p in PACKAGE.rglob("*") if p.is_symlink()]
    assert links == []
    names = {str(p.relative_to(PACKAGE)) for p in product_modules()}
    for sub in ("catalog", "storage", "sandbox", "planner", "executor", "service", "migrations",
                "core", "jobs", "cli"):
        assert f"{sub}/__init__.py" in names, sub
    # no product module lies outside the tree
    stray = [str(p.relative_to(REPO)) for p in REPO.glob("*/*.py")
             if not p.is_relative_to(REPO / "tests") and not p.parent.is_symlink()]
    assert stray == []


def test_root_names_point_into_the_tree() -> None:
    for name in (*LINKED, "catalog_schema.sql"):
        path = REPO / name
        assert path.is_symlink(), name
        assert path.resolve().is_relative_to(PACKAGE.resolve()), name


@pytest.mark.parametrize("short", [*LINKED, "catalog", "storage", "core"])
def test_no_module_loads_under_two_names(short: str) -> None:
    """With the repository root (or the package folder) on sys.path, a short name fails loudly."""
    code = (f"import sys; sys.path[:0] = [{str(REPO)!r}, {str(PACKAGE)!r}]\n"
            f"import mergepipe.{short}\n"
            "try:\n"
            f"    import {short}\n"
            "except ImportError as e:\n"
            "    print('refused:', e)\n"
            "else:\n"
            "    print('loaded twice')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("refused:"), proc.stdout
    assert f"import mergepipe.{short}" in proc.stdout
