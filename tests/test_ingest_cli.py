"""`mergepipe ingest` and `mergepipe models` on the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mergepipe.cli.main import main
from tests import factory
from tests.catalogs import new_catalog


@pytest.fixture
def fam(tmp_path: Path) -> dict[str, Path | str]:
    base = factory.make_base(tmp_path / "base", seed=0)
    return {"base": base, "e": factory.make_expert(base, tmp_path / "e", seed=1),
            "lora": factory.make_lora(base, tmp_path / "lora", seed=2),
            "cat": new_catalog(tmp_path, "c")}


def test_ingest_and_list(fam, capsys) -> None:
    cat = str(fam["cat"])
    assert main(["--catalog", cat, "ingest", str(fam["base"]), "--name", "base",
                 "--block-bytes", "1KiB"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("registered 'base': base model, 19 tensors")
    assert main(["--catalog", cat, "ingest", str(fam["e"]), "--name", "e", "--base", "base",
                 "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["name"] == "e" and m["has_stats"] is True and m["block_bytes"] == 1024
    assert main(["--catalog", cat, "ingest", str(fam["lora"]), "--name", "l", "--base", "base",
                 "--kind", "lora", "--no-stats"]) == 0
    assert "lora expert of 'base' without statistics" in capsys.readouterr().out
    assert main(["--catalog", cat, "models", "--json"]) == 0
    models = json.loads(capsys.readouterr().out)
    assert [x["name"] for x in models] == ["base", "e", "l"]
    assert main(["--catalog", cat, "models"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:4] == ["name", "kind", "base", "status"]
    assert table[3].split()[:5] == ["e", "full", "base", "ready", "yes"]
    assert table[-1] == "(3 rows)"


def test_errors_are_one_line(fam, capsys) -> None:
    cat = str(fam["cat"])
    assert main(["--catalog", cat, "ingest", str(fam["e"]), "--name", "e", "--base", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mergepipe ingest: error: base model 'nope'")
    assert main(["--catalog", cat, "models", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_bad_block_size_is_a_usage_error(fam, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--catalog", str(fam["cat"]), "ingest", str(fam["base"]), "--name", "b",
              "--block-bytes", "lots"])
    assert info.value.code == 2
    assert "not a size in bytes" in capsys.readouterr().err
