"""Independent reference values for ingestion tests: whole-tensor torch math and catalog rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from tests import factory

TABLES = ("models", "files", "tensors", "blocks", "block_stats", "tensor_stats")


def rows(cat: Catalog, sql: str, **params: Any) -> list[dict[str, Any]]:
    return [dict(r._mapping) for r in cat.query(SQL(sql), params)]


def registered(cat: Catalog, name: str) -> dict[str, int]:
    """Row count of `name` in every ingestion table (all zero: nothing registered)."""
    out = {}
    for table in TABLES:
        col = "name" if table == "models" else "model"
        out[table] = rows(cat, f"SELECT count(*) AS n FROM {table} WHERE {col} = :m", m=name)[0]["n"]
    return out


def nothing_registered(cat: Catalog, name: str) -> bool:
    return not any(registered(cat, name).values())


def full_deltas(base: Path, expert: Path) -> dict[str, torch.Tensor]:
    """expert - base in float32, whole tensors (factory.load reads with the safetensors library)."""
    b, e = factory.load(base), factory.load(expert)
    return {n: e[n] - b[n] for n in b}


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """A tensor as (rows, rest): the block grid cuts rows (0-D and 1-D: one entry per row)."""
    if t.ndim == 0:
        return t.reshape(1, 1)
    rest = 1
    for d in t.shape[1:]:
        rest *= d
    return t.reshape(t.shape[0], rest)


def check_block_stats(cat: Catalog, model: str, deltas: dict[str, torch.Tensor],
                      rel: float = 2e-6) -> int:
    """Assert every block_stats row against the reference delta's rows; returns the row count."""
    import pytest
    got = rows(cat, """SELECT s.*, b.row_start, b.row_end FROM block_stats s JOIN blocks b
                       USING (model, tensor, block_index) WHERE model = :m""", m=model)
    assert got
    for r in got:
        d = as_rows(deltas[r["tensor"]])[r["row_start"]:r["row_end"]].double()
        where = f"{r['tensor']} block {r['block_index']}"
        if d.numel() == 0:
            assert (r["l2"], r["l1"], r["max_abs"], r["nnz"]) == (0, 0, 0, 0), where
            continue
        assert r["l2"] == pytest.approx(float(d.norm()), rel=rel, abs=1e-30), where
        assert r["l1"] == pytest.approx(float(d.abs().sum()), rel=rel, abs=1e-30), where
        assert r["max_abs"] == float(d.abs().max()), where
        assert r["nnz"] == int(torch.count_nonzero(d)), where
    return len(got)


def check_tensor_stats(cat: Catalog, model: str, deltas: dict[str, torch.Tensor],
                       rel: float = 2e-6) -> None:
    """Assert tensor_stats (norms, nnz, and the exact trim thresholds by sorting)."""
    import pytest
    got = {r["tensor"]: r for r in rows(cat, "SELECT * FROM tensor_stats WHERE model = :m",
                                        m=model)}
    assert set(got) == set(deltas)
    for name, d in deltas.items():
        r = got[name]
        a = d.reshape(-1).abs()
        assert r["numel"] == a.numel()
        if a.numel() == 0:
            assert (r["l2"], r["l1"], r["max_abs"], r["nnz"]) == (0, 0, 0, 0), name
            assert r["trim_tau"] == [float("inf")] * 100, name
            continue
        assert r["l2"] == pytest.approx(float(d.double().norm()), rel=rel), name
        assert r["l1"] == pytest.approx(float(a.double().sum()), rel=rel), name
        assert r["max_abs"] == float(a.max()), name
        assert r["nnz"] == int(torch.count_nonzero(a)), name
        tau, above, tied = reference_trims(a)
        assert r["trim_tau"] == tau, name
        assert r["trim_above"] == above, name
        assert r["trim_tied"] == tied, name


def reference_trims(a: torch.Tensor) -> tuple[list[float], list[int], list[int]]:
    """tau_j = k-th largest |d| (k = max(1, int((j+1)/100 * numel))), count above, count tied; by
    sorting."""
    s = torch.sort(a.reshape(-1), descending=True).values
    n = s.numel()
    taus, above, tied = [], [], []
    for j in range(100):
        k = max(1 if n else 0, int((j + 1) / 100 * n))
        if k == 0:
            taus.append(float("inf"))
            above.append(0)
            tied.append(0)
            continue
        t = s[k - 1]
        taus.append(float(t))
        above.append(int((s > t).sum()))
        tied.append(int((s == t).sum()))
    return taus, above, tied
