"""Schemathesis against our own OpenAPI: no generated request gets a 5xx or a bare error."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings

from tests.api_helpers import (
    BASE_URL,
    client_for,
    make_family,
    register_family,
    run_merge,
    settings_for,
    ties_body,
)

schemathesis = pytest.importorskip("schemathesis")


@pytest.fixture(scope="module")
def fuzz_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    family = make_family(tmp / "data" / "family")
    with client_for(settings_for(tmp), raise_server_exceptions=False) as c:
        register_family(c, family)
        run_merge(c, ties_body("t"))
        yield c


def _fuzz(client: TestClient, examples: int) -> None:
    schema = schemathesis.openapi.from_dict(client.get("/openapi.json").json())
    failures: list[tuple[str, Any, int, str]] = []
    for result in schema.get_all_operations():
        op = result.ok()

        @settings(max_examples=examples, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck), database=None)
        @given(case=op.as_strategy())
        def check(case: Any) -> None:
            kw = case.as_transport_kwargs(base_url=BASE_URL)
            sent = {k: v for k, v in kw.items() if k in ("headers", "params", "json", "content",
                                                         "data")}
            r = client.request(kw["method"], kw["url"], **sent)
            bad = r.status_code >= 500 or (r.status_code >= 400 and set(r.json()) != {"error"})
            if bad:
                failures.append((case.operation.label, sent, r.status_code, r.text[:300]))

        check()
    assert not failures, failures[:5]


def test_fuzz_the_api_quickly(fuzz_client: TestClient) -> None:
    _fuzz(fuzz_client, examples=5)


@pytest.mark.slow
def test_fuzz_the_api_thoroughly(fuzz_client: TestClient) -> None:
    _fuzz(fuzz_client, examples=300)
