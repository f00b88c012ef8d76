"""`merge --help` names every registered operator and every operator parameter (t, gamma,
epsilon included) with the operators that take it; the demo's closing hint is a command whose
output stays a few short lines per merge (SELECT * FROM merges printed every plan's JSON)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from mergepipe.catalog.db import Catalog
from mergepipe.cli.demo import closing_hint
from mergepipe.cli.main import main
from mergepipe.core.operators import REGISTRY
from tests.catalogs import new_catalog
from tests.executor_family import ingest_family


def _help(capsys: pytest.CaptureFixture[str], command: str) -> str:
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse's line wrapping undone


@pytest.mark.parametrize("command", ["merge", "plan"])
def test_help_lists_every_operator_and_parameter(command: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(capsys, command)
    start = text.index("--op OP, --operator OP")  # the options, past the usage line
    op_help = text[start:text.index("--param KEY=VALUE", start)]
    assert f"one of {len(REGISTRY)} operators" in op_help and len(REGISTRY) >= 12
    for spec in REGISTRY.values():
        assert re.search(rf"\b{spec.name}\b", op_help), spec.name
        for alias in spec.aliases:
            assert alias in op_help, alias
    param_help = text[text.index("--param KEY=VALUE", start):]
    for spec in REGISTRY.values():
        for p in spec.params:
            m = re.search(rf"\b{p.name} \(([^)]*)\)", param_help)
            assert m and spec.name in m.group(1), (p.name, spec.name)
    for name, where in (("t", "slerp: default 0.5"), ("gamma", "breadcrumbs_ties: default 0.01"),
                        ("epsilon", "della_linear: default 0.15")):
        assert f"{name} (" in param_help and where in param_help, name


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("hint")
    db = new_catalog(root)
    with Catalog(db) as cat:
        ingest_family(cat, root / "fam")
    return str(db)


def test_the_demos_closing_hint_prints_a_short_table(db: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    for i, op in enumerate(("ties", "task_arithmetic", "linear")):
        assert main(["--catalog", db, "merge", "--base", "base", "--experts", "e0,e1,e2",
                     "--op", op, "--out", str(tmp_path / f"o{i}"), "--json"]) == 0
    capsys.readouterr()
    hint = closing_hint(tmp_path)
    command = shlex.split(hint[hint.index("try: ") + 5:hint.rindex(")")])
    assert command[:2] == ["mergepipe", "--catalog"] and command[3] == "sql"
    assert main(["--catalog", db, *command[3:]]) == 0  # the demo's catalog is this one here
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert len(lines) <= 3 + 3 and max(map(len, lines)) <= 160, out  # header, rule, 3 merges
    for i in range(3):
        assert f"o{i}" in out
    # what the old hint printed, for scale: every merge's request and plan JSON
    assert main(["--catalog", db, "sql", "SELECT * FROM merges"]) == 0
    assert len(capsys.readouterr().out) > 10 * len(out)
