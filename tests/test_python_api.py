"""docs/python.md's examples run, in order, on a tiny family: the page cannot go stale."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests import factory, tiny_lm

DOC = Path(__file__).resolve().parents[1] / "docs" / "python.md"


def examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_page_has_examples() -> None:
    assert len(examples()) >= 5


def test_every_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = factory.make_base(tmp_path / "family" / "base", seed=0)
    for i, name in enumerate(("math", "code")):
        factory.make_expert(base, tmp_path / "family" / name, seed=10 + i)
    lm = tiny_lm.make_lm(tmp_path / "family" / "lm-base", seed=0)
    tiny_lm.make_lm_expert(lm, tmp_path / "family" / "lm-chat", seed=1, scale=0.1)
    (tmp_path / "family" / "notes.txt").write_text(tiny_lm.TEXT)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MERGEPIPE_CATALOG", raising=False)
    namespace: dict[str, object] = {}
    for i, code in enumerate(examples()):
        exec(compile(code, f"{DOC.name} example {i + 1}", "exec"), namespace)  # noqa: S102
    assert (tmp_path / "out" / "ties-30" / "manifest.json").is_file()
    assert sorted(os.listdir(tmp_path / "out")) == ["avg", "lm-cheap", "lm-full", "stacked",
                                                    "ta-50", "ties-30"]


def test_the_api_and_the_cli_make_the_same_plan(tmp_path: Path) -> None:
    """One request through the API and through `mergepipe plan --json`: the same plan hash."""
    import json
    import subprocess
    import sys

    import mergepipe

    base = factory.make_base(tmp_path / "base", seed=0)
    factory.make_expert(base, tmp_path / "e1", seed=1)
    catalog = tmp_path / "c.duckdb"
    with mergepipe.Catalog(catalog) as cat:
        cat.ingest(tmp_path / "base", "base", progress=False)
        cat.ingest(tmp_path / "e1", "e1", base="base", progress=False)
        ours = cat.plan(base="base", experts=["e1"], operator="linear", budget=0.5)
        with pytest.raises(mergepipe.InvalidRequest) as bad:
            cat.request(base="base", experts=["e1"], operator="linear", budget=-1)
        assert bad.value.field == "budget.fraction" and bad.value.status == 422
    cli = subprocess.run([sys.executable, "-m", "mergepipe", "--catalog", str(catalog), "plan",
                          "--base", "base", "--experts", "e1", "--op", "linear",
                          "--budget", "0.5", "--json"], capture_output=True, text=True,
                         timeout=120, check=True)
    assert json.loads(cli.stdout)["plan_hash"] == ours.plan_hash


def test_import_mergepipe_stays_light() -> None:
    import subprocess
    import sys

    code = ("import sys, mergepipe; heavy = [m for m in ('torch', 'duckdb', 'fastapi', "
            "'mergepipe.api') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    assert out == "[]"
