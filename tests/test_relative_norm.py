"""An expert of another base is refused unless forced (issue 28): ingestion computes the relative
delta norm ||E - B|| / ||B|| from the base's tensor norms and the expert's block statistics,
refuses it above 0.5 (catalog.delta_norms) and `models` (CLI, API, SQL) shows it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.delta_norms import MAX_RELATIVE_DELTA
from mergepipe.catalog.ingest import ingest_model
from mergepipe.catalog.models import find_model
from mergepipe.core.errors import InvalidRequest
from tests import factory
from tests.api_helpers import client_for, settings_for, wait
from tests.catalogs import new_catalog


def norms(base: Path, expert: Path, kind: str = "full") -> tuple[float, float]:
    """(||D|| / ||B||, the largest per-tensor ratio), by hand from the files."""
    b, e = factory.load(base), factory.load(expert)
    d = {n: (e[n] - b[n]) if kind == "full" else e[n] for n in b}
    total = math.sqrt(sum(float((d[n].double() ** 2).sum()) for n in b)
                      / sum(float((b[n].double() ** 2).sum()) for n in b))
    worst = max(float(d[n].double().norm() / b[n].double().norm()) for n in b)
    return total, worst


@pytest.fixture
def family(tmp_path: Path) -> dict[str, Path]:
    base = factory.make_base(tmp_path / "base", seed=0)
    other = factory.make_base(tmp_path / "other", seed=1)  # another random base, same shapes
    return {"base": base, "e": factory.make_expert(base, tmp_path / "e", seed=10),
            "delta": factory.make_delta(base, tmp_path / "d", seed=11),
            "foreign": factory.make_expert(other, tmp_path / "foreign", seed=12)}


def test_ingestion_records_the_relative_norm_and_refuses_another_base(
        family: dict[str, Path], tmp_path: Path) -> None:
    with Catalog(new_catalog(tmp_path)) as cat:
        ingest_model(cat, family["base"], "base")
        for name, kind in (("e", "full"), ("delta", "delta")):
            m = ingest_model(cat, family[name], name, base="base", kind=kind)
            total, worst = norms(family["base"], family[name], kind)
            assert m.delta_rel_norm == pytest.approx(total, rel=1e-4)
            assert m.delta_rel_norm_max == pytest.approx(worst, rel=1e-4)
            assert m.delta_rel_norm is not None and m.delta_rel_norm < MAX_RELATIVE_DELTA
        total, _ = norms(family["base"], family["foreign"])
        assert total > MAX_RELATIVE_DELTA  # two random bases: O(1) apart
        with pytest.raises(InvalidRequest, match=r"has 0\.\d+ times the base's norm .* above "
                                                 r"0\.5: .* --force") as e:
            ingest_model(cat, family["foreign"], "foreign", base="base")
        assert e.value.field == "base" and find_model(cat, "foreign") is None
        m = ingest_model(cat, family["foreign"], "foreign", base="base", force=True)
        assert m.delta_rel_norm == pytest.approx(total, rel=1e-4)
        with cat.reader() as conn:  # SQL: the models table shows it
            found = conn.execute(SQL("SELECT name, delta_rel_norm FROM models")).fetchall()
        rows: dict[str, float | None] = dict(found)
        assert rows["base"] is None and rows["foreign"] == pytest.approx(total, rel=1e-4)
        # without statistics there is no delta to measure: registered, no norm
        m = ingest_model(cat, family["foreign"], "foreign-h", base="base", with_stats=False)
        assert m.delta_rel_norm is None


def test_cli_refuses_in_one_line_and_models_shows_the_norm(
        family: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mergepipe.cli.main import main
    db = str(new_catalog(tmp_path))
    assert main(["--catalog", db, "ingest", str(family["base"]), "--name", "base"]) == 0
    assert main(["--catalog", db, "ingest", str(family["e"]), "--name", "e",
                 "--base", "base"]) == 0
    capsys.readouterr()
    assert main(["--catalog", db, "ingest", str(family["foreign"]), "--name", "f",
                 "--base", "base"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--force" in err and "times the base's norm" in err
    assert main(["--catalog", db, "ingest", str(family["foreign"]), "--name", "f",
                 "--base", "base", "--force"]) == 0
    capsys.readouterr()
    assert main(["--catalog", db, "models"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert "rel_delta" in table[0]
    cells = {line.split()[0]: line.split() for line in table[2:]}
    assert float(cells["e"][5]) == pytest.approx(norms(family["base"], family["e"])[0], rel=1e-2)
    assert main(["--catalog", db, "models", "--json"]) == 0
    listed = {m["name"]: m for m in json.loads(capsys.readouterr().out)}
    assert listed["f"]["delta_rel_norm"] > MAX_RELATIVE_DELTA


def test_api_refuses_unless_forced_and_lists_the_norm(family: dict[str, Path],
                                                     tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for n in ("base", "e", "foreign"):
        family[n].rename(data / n)
    with client_for(settings_for(tmp_path)) as client:
        assert client.post("/v1/models", json={"name": "base", "path": "base"}).status_code == 202
        assert wait(client, "/v1/models/base")["status"] == "ready"
        for name, force in (("e", False), ("foreign", False), ("forced", True)):
            path = "e" if name == "e" else "foreign"
            r = client.post("/v1/models", json={"name": name, "path": path, "base": "base",
                                                "force": force})
            assert r.status_code == 202, r.text
        assert wait(client, "/v1/models/e")["status"] == "ready"
        failed = wait(client, "/v1/models/foreign")
        assert failed["status"] == "failed" and "--force" in failed["error"]
        assert "times the base's norm" in failed["error"]
        forced = wait(client, "/v1/models/forced")
        assert forced["status"] == "ready" and forced["delta_rel_norm"] > MAX_RELATIVE_DELTA
        listed = {m["name"]: m for m in client.get("/v1/models").json()["models"]}
        assert 0 < listed["e"]["delta_rel_norm"] < MAX_RELATIVE_DELTA
