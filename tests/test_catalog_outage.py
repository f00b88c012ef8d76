"""A PostgreSQL catalog that goes down (a real server started here, then stopped): every endpoint
answers 503 with Retry-After and a message saying so, the job threads back off and log one line
per outage (no traceback per poll), and all is well again once the server is back."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mergepipe.catalog.db import Catalog, CatalogUnavailable
from mergepipe.jobs import outage
from tests import factory
from tests.api_helpers import client_for, settings_for
from tests.pg_server import StoppableServer, create_database, stoppable_server

# every route that reads or writes the catalog, with a body where it takes one
ENDPOINTS: list[tuple[str, str, dict[str, object] | None]] = [
    ("GET", "/healthz", None),
    ("GET", "/v1/models", None),
    ("GET", "/v1/models/base", None),
    ("POST", "/v1/models", {"name": "x", "path": "base", "kind": "full"}),
    ("GET", "/v1/model-stats", None),
    ("GET", "/v1/ingestions/1", None),
    ("POST", "/v1/plans", {"base": "base", "experts": [{"model": "e0"}], "operator": "linear"}),
    ("POST", "/v1/merges", {"base": "base", "experts": [{"model": "e0"}], "operator": "linear",
                            "output": {"name": "o"}}),
    ("GET", "/v1/merges", None),
    ("GET", "/v1/merges/m-0123456789ab", None),
    ("GET", "/v1/merges/m-0123456789ab/manifest", None),
    ("GET", "/v1/merges/m-0123456789ab/touched-blocks", None),
    ("GET", "/v1/merges/m-0123456789ab/tensor-shares", None),
    ("GET", "/v1/merges/m-0123456789ab/identical-tensors?reference=m-0123456789ac", None),
    ("GET", "/v1/lineage/base", None),
    ("POST", "/v1/sql", {"sql": "SELECT count(*) FROM models"}),
]


@pytest.fixture
def pg() -> Iterator[StoppableServer]:
    with stoppable_server() as server:
        yield server


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_an_outage_is_a_503_and_job_threads_back_off(tmp_path: Path, pg: StoppableServer,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    url = create_database(pg.url, "outage")
    factory.make_base(tmp_path / "data" / "base", seed=0)
    settings = settings_for(tmp_path, catalog=url, workers=3)
    monkeypatch.setattr(outage, "MAX_WAIT_S", 1.0)  # (the cap: a quick recovery here)
    monkeypatch.setattr(outage.Outage.__init__, "__defaults__", (0.1, 1.0))
    seen = Records()
    logging.getLogger("mergepipe").addHandler(seen)
    try:
        with client_for(settings) as client:
            assert client.get("/v1/models").status_code == 200
            assert client.get("/healthz").status_code == 200
            pg.stop()
            t0 = time.monotonic()
            for method, path, body in ENDPOINTS:
                r = client.request(method, path, json=body)
                assert r.status_code == 503, (method, path, r.status_code, r.text)
                assert r.headers.get("retry-after", "").isdigit(), (path, r.headers)
                err = r.json()["error"]
                assert err["code"] in ("catalog_unavailable", "unavailable"), (path, err)
                assert "internal" not in err["message"] and "catalog" in err["message"], err
            time.sleep(max(0.0, 3.0 - (time.monotonic() - t0)))  # job threads poll meanwhile
            down = [r for r in seen.records if r.name.startswith("mergepipe.jobs")]
            assert not any(r.exc_info for r in seen.records), [r.getMessage() for r in down]
            began = [r for r in down if "catalog unreachable" in r.getMessage()]
            assert len(began) == 1 and len(down) == 1, [r.getMessage() for r in down]

            pg.start()
            deadline = time.monotonic() + 30
            while client.get("/v1/models").status_code != 200:
                assert time.monotonic() < deadline
                time.sleep(0.2)
            deadline = time.monotonic() + 10
            while not any("reachable again" in r.getMessage() for r in seen.records):
                assert time.monotonic() < deadline, [r.getMessage() for r in seen.records]
                time.sleep(0.1)
            assert client.get("/healthz").status_code == 200
    finally:
        logging.getLogger("mergepipe").removeHandler(seen)


def test_a_catalog_that_cannot_be_reached_at_open_says_so(pg: StoppableServer) -> None:
    url = create_database(pg.url, "gone")
    Catalog(url).close()
    pg.stop()
    with pytest.raises(CatalogUnavailable, match="cannot use the PostgreSQL catalog"):
        Catalog(url)
    pg.start()
    Catalog(url).close()
