"""Making planning cheaper changes no plan: every request of tests/plan_hash_fixture.py gives the
plan hash, planned bytes and access set that main's planner recorded in
tests/data/plan_hashes.json (before issue 31's planning-cost work; rewritten once for the three
defaults the second ranking study changed: tests/plan_hash_fixture.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.plan_hash_fixture import FIXTURE, build_catalog, line, requests


def _recorded() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(FIXTURE.read_text())
    assert [r["request"] for r in rows] == requests()  # the fixture is of these requests
    return rows


def _check(tmp_path: Path, rows: list[dict[str, Any]]) -> None:
    with build_catalog(tmp_path) as cat:
        got = [line(cat, r["request"]) for r in rows]
    bad = [(r["request"], g) for r, g in zip(rows, got, strict=True) if g != r["line"]]
    assert not bad, f"{len(bad)} of {len(rows)} plans changed, first: {bad[0]}"


def test_a_sample_of_plans_is_unchanged(tmp_path: Path) -> None:
    rows = _recorded()
    sample = rows[::9]
    assert len({r["request"]["operator"] for r in sample}) > 10
    assert sum(not r["line"].startswith("refused") for r in sample) > 25
    _check(tmp_path, sample)


@pytest.mark.slow
def test_every_plan_is_unchanged(tmp_path: Path) -> None:
    _check(tmp_path, _recorded())
