"""The console's plan explorer and frontier in headless chromium, against a real server whose
catalog holds a family and the output of one merge (registered as an expert of the same base):
the explorer ticks the fine-tuned experts only (a merge output is listed, unticked, marked as
one), and a frontier without an omission bound plots the share of candidate blocks left out,
labelled as such with per-cent ticks."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api_helpers import EXPERTS, make_family, register_family, run_merge, ties_body
from tests.live_server import Api
from tests.loopback_server import offline_browser, serving


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, str]]:
    tmp = tmp_path_factory.mktemp("console-defaults")
    with serving(tmp) as api:
        fam = make_family(tmp / "data" / "family")
        with httpx.Client(base_url=api.base, timeout=30) as client:
            register_family(client, fam)
            merge = run_merge(client, ties_body("soup", fraction=1.0))
        yield api, merge["merge_id"]


def test_the_plan_explorer_ticks_real_experts_only(server: tuple[Api, str],
                                                    tmp_path: Path) -> None:
    api, merge_id = server
    models = {m["name"]: m for m in api.ok("GET", "/v1/models")["models"]}
    assert models["soup"]["base"] == "base" and models["soup"]["source_merge"] == merge_id
    assert all(models[e]["source_merge"] is None for e in EXPERTS)
    with offline_browser(tmp_path / "profile", api.base) as (ctx, blocked, errors):
        page = ctx.new_page()
        page.goto(api.base + "/#/plan")
        page.locator("[data-expert=soup]").wait_for()
        ticked = {r.get_attribute("data-expert"): r.locator("[data-use]").is_checked()
                  for r in page.locator("[data-expert]").all()}
        assert ticked == {**{e: True for e in EXPERTS}, "soup": False}
        assert merge_id in page.locator("[data-expert=soup]").inner_text()
        # the plan of the default selection: the three experts, not the merge
        page.wait_for_function("() => document.querySelector('#plan-experts') !== null")
        assert "soup" not in page.inner_text("#plan-experts")
        for e in EXPERTS:
            assert e in page.inner_text("#plan-experts")
        check_frontier_axis(page, api)
    assert not blocked and not errors, (blocked, errors)


def check_frontier_axis(page: Any, api: Api) -> None:
    """ties has no omission bound: the y axis is the share of candidate blocks left out."""
    link = page.locator("a", has_text="Frontier of this request")
    page.wait_for_function("a => /^#\\/frontier\\?r=/.test(a.getAttribute('href'))",
                           arg=link.element_handle())
    before = link.get_attribute("href")
    page.select_option("#plan-op", "ties")
    page.wait_for_function("([a, old]) => a.getAttribute('href') !== old",
                           arg=[link.element_handle(), before])
    req = {"base": "base", "experts": [{"model": e} for e in EXPERTS], "operator": "ties",
           "params": {"density": 0.5}, "budget": {"fraction": 1.0}}
    assert api.ok("POST", "/v1/plans", req)["omission_bound"] is None
    link.click()
    page.locator("svg.chart").wait_for()
    labels = page.locator("svg.chart text.label").all_text_contents()
    assert "share of candidate blocks left out" in labels, labels
    ticks = page.locator("svg.chart text.tick").all_text_contents()
    y_ticks = ticks[1::2]  # x then y, per step
    assert all(re.fullmatch(r"\d+%", t) for t in y_ticks), y_ticks
    shares = [float(t[:-1]) for t in y_ticks]
    assert max(shares) <= 100 and shares == sorted(shares)
