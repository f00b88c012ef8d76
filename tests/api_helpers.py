"""Shared pieces of the API tests: a seeded family under a data root, an app client, polling."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from mergepipe.core.settings import Settings
from mergepipe.service.app import create_app
from tests import catalogs, factory

EXPERTS = ("e0", "e1", "e2")
BASE_URL = "http://localhost"  # TestClient's own default names Host `testserver`


def make_family(root: Path) -> dict[str, Path]:
    """A bf16 base and three full experts under `root` (the data root of the tests)."""
    base = factory.make_base(root / "base", seed=0)
    out = {"base": base}
    for i, name in enumerate(EXPERTS):
        out[name] = factory.make_expert(base, root / name, seed=100 + i,
                                        zero_tensors=("model.norm.weight",) if i == 0 else ())
    return out


def settings_for(tmp: Path, **overrides: Any) -> Settings:
    """Settings of a test server under `tmp`, on a fresh catalog unless `catalog` is given."""
    catalog = overrides.pop("catalog", None) or catalogs.new_catalog(tmp)
    s = Settings(catalog=catalog, data_roots=((tmp / "data").resolve(),),
                 output_root=(tmp / "outputs").resolve(), workers=2, shutdown_grace_s=30)
    return replace(s, **overrides)


@contextmanager
def client_for(settings: Settings, **kw: Any) -> Iterator[TestClient]:
    """A TestClient with the lifespan run (catalog opened, workers started and stopped); its
    requests name Host `localhost`, one of the default allowed hosts."""
    with TestClient(create_app(settings), **{"base_url": BASE_URL, **kw}) as c:
        yield c


def wait(client: Any, path: str, done: tuple[str, ...] = ("ready", "succeeded"),
         timeout: float = 60.0, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """Poll GET `path` until its status is in `done` (or failed); bounded by `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        r = client.get(path, headers=headers)
        assert r.status_code == 200, r.text
        obj: dict[str, Any] = r.json()
        if obj["status"] in done or obj["status"] == "failed":
            return obj
        assert time.monotonic() < deadline, f"{path} still {obj['status']} after {timeout}s"
        time.sleep(0.05)


def register_family(client: Any, family: dict[str, Path],
                    headers: dict[str, str] | None = None) -> None:
    """POST the base and the experts at once (experts wait for their base), wait until ready."""
    r = client.post("/v1/models", json={"name": "base", "path": str(family["base"]),
                                        "kind": "full"}, headers=headers)
    assert r.status_code == 202, r.text
    for name in EXPERTS:
        r = client.post("/v1/models", json={"name": name, "path": str(family[name]),
                                            "kind": "full", "base": "base"}, headers=headers)
        assert r.status_code == 202, r.text
    for name in ("base", *EXPERTS):
        m = wait(client, f"/v1/models/{name}", headers=headers)
        assert m["status"] == "ready", m


def ties_body(output: str, fraction: float = 0.5, base: str = "base",
              experts: tuple[str, ...] = EXPERTS, **extra: Any) -> dict[str, Any]:
    return {"base": base, "experts": [{"model": e} for e in experts], "operator": "ties",
            "params": {"density": 0.5}, "budget": {"fraction": fraction}, "seed": 7,
            "output": {"name": output}, **extra}


def run_merge(client: Any, body: dict[str, Any], headers: dict[str, str] | None = None
              ) -> dict[str, Any]:
    r = client.post("/v1/merges", json=body, headers=headers)
    assert r.status_code == 202, r.text
    m = wait(client, f"/v1/merges/{r.json()['id']}", headers=headers)
    assert m["status"] == "succeeded", m
    return m


def assert_error(r: Any, status: int, code: str, field: str | None = None) -> dict[str, Any]:
    """The one error shape, with the expected status, code and (when given) field."""
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}, body
    err: dict[str, Any] = body["error"]
    assert err["code"] == code, err
    assert isinstance(err["message"], str) and err["message"], err
    assert set(err) <= {"code", "message", "field"}, err
    if field is not None:
        assert err.get("field") == field, err
    return err
