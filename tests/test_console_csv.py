"""The console's CSV export neutralizes formula cells as OWASP recommends: a text cell beginning
with =, +, -, @, a tab or a carriage return gets a leading single quote (run in node against the
shipped ui.js)."""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

UI = Path(__file__).resolve().parents[1] / "src" / "mergepipe" / "service" / "console" / "ui.js"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs node to run the console's modules")


def _csv_cells(tmp_path: Path, values: Sequence[object]) -> list[str]:
    """csvCell of each value, joined as a CSV row, read back by Python's csv module."""
    mod = tmp_path / "ui.mjs"  # the same file as an ES module node can import
    shutil.copy(UI, mod)
    script = (f"import {{csvCell}} from {json.dumps(mod.as_uri())};\n"
              f"const vals = {json.dumps(values)};\n"
              "process.stdout.write(vals.map(csvCell).join(',') + '\\r\\n');\n")
    assert NODE is not None
    done = subprocess.run([NODE, "--input-type=module", "-e", script], capture_output=True,
                          timeout=60)  # bytes: a text pipe would turn the cells' \r into \n
    assert done.returncode == 0, done.stderr
    (row,) = list(csv.reader(io.StringIO(done.stdout.decode(), newline="")))
    return row


def test_formula_cells_are_neutralized(tmp_path: Path) -> None:
    hostile = ['=HYPERLINK("http://x","y")', "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(A1:A2)",
               "\t=1+1", "\r=1+1", "=1,2"]
    assert _csv_cells(tmp_path, hostile) == ["'" + v for v in hostile]


def test_plain_values_and_numbers_are_unchanged(tmp_path: Path) -> None:
    plain = ["base", "a=b", "e-1", "", None, 3, -1.5, "-1.5e-3", "+7", {"k": "=v"}, 'say "hi"']
    assert _csv_cells(tmp_path, plain) == ["base", "a=b", "e-1", "", "", "3", "-1.5", "-1.5e-3",
                                           "+7", '{"k":"=v"}', 'say "hi"']
