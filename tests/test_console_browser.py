"""The web console in a real browser: Debian's chromium, headless, driven by Playwright, against a
real `mergepipe serve` on loopback. Ingest a family, plan and start a merge from the plan
explorer, watch it reach 100%, check the heatmap, the lineage graph, the frontier and SQL with
numbers computed here from the catalog; screenshots are kept as artifacts."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import shutil
import time
from collections.abc import Iterator
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.api_helpers import EXPERTS, make_family
from tests.catalogs import new_catalog
from tests.live_server import Api, serving
from tests.loopback_server import chromium

TOKEN = "console-token"
BLOCK_BYTES = 512  # tensors of several blocks: shares between 0 and 1

pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="session")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Screenshots: under the pytest tmp path; also copied to $MERGEPIPE_CONSOLE_SHOTS if set."""
    return tmp_path_factory.mktemp("console-screenshots")


def shoot(page: Any, shots: Path, name: str, **kw: Any) -> Path:
    path = shots / f"{name}.png"
    (kw.pop("locator", None) or page).screenshot(path=str(path), **kw)
    if os.environ.get("MERGEPIPE_CONSOLE_SHOTS"):
        dest = Path(os.environ["MERGEPIPE_CONSOLE_SHOTS"])
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, dest / path.name)
    return path


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One chromium for this module. Module-scoped: Playwright's sync API runs one instance at
    a time, and other modules (tests/loopback_server.py) start their own."""
    with chromium(tmp_path_factory.mktemp("chromium-profile"),
                  viewport={"width": 1280, "height": 800}, accept_downloads=True) as ctx:
        ctx.set_default_timeout(15_000)
        yield ctx


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Api, Path]]:
    tmp = tmp_path_factory.mktemp("console-server")
    data = tmp / "data"
    make_family(data / "family")
    with serving(tmp, {"MERGEPIPE_CATALOG": str(new_catalog(tmp)),
                       "MERGEPIPE_DATA_ROOTS": str(data),
                       "MERGEPIPE_OUTPUT_ROOT": str(tmp / "outputs"), "MERGEPIPE_WORKERS": "2"},
                 token=TOKEN, graceful=True) as (_, api):
        yield api.base, api, tmp
    assert "Traceback" not in (tmp / "server.log").read_text()


@pytest.fixture(scope="module")
def page(browser: Any, server: tuple[str, Api, Path]) -> Iterator[Any]:
    """One tab on the console; every request it makes and every script error it logs."""
    pg = browser.new_page()
    pg.requests, pg.errors = [], []
    pg.on("request", lambda r: pg.requests.append(r.url))
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
    yield pg
    pg.close()


def sql(api: Api, query: str) -> list[list[Any]]:
    return list(api.ok("POST", "/v1/sql", {"sql": query})["rows"])


def numbers(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", text.replace(",", ""))]


def ingest(page: Any, name: str, path: str, base: str | None = None) -> None:
    page.fill("#ingest-name", name)
    page.fill("#ingest-path", path)
    if base:
        page.select_option("#ingest-base", base)
    else:
        page.select_option("#ingest-base", "")
        page.fill("#ingest-block", str(BLOCK_BYTES))
    page.click("form.card button[type=submit]")
    page.locator("form.card .result", has_text=f" of {name}.").wait_for()


def test_console_end_to_end(page: Any, server: tuple[str, Api, Path], shots: Path) -> None:
    url, api, tmp = server
    page.goto(url + "/")
    page.locator("h1", has_text="Models").wait_for()
    set_token_after_401(page)
    ingest_family(page, api, shots)
    plan = check_plan_explorer(page, api, shots)
    merge_id, merge = run_merge(page, api, plan)
    check_merge_page(page, api, merge_id, merge, shots)
    check_lineage(page, shots)
    check_frontier(page, merge_id, plan, shots)
    check_sql(page, api, merge_id, shots)

    assert all(u.startswith((url, "blob:", "data:")) for u in page.requests), page.requests
    assert [e for e in page.errors if "401" not in e] == [], page.errors


def set_token_after_401(page: Any) -> None:
    """A write without the token: the API's 401 is shown and the token field asks for it."""
    page.fill("#ingest-name", "base")
    page.fill("#ingest-path", "family/base")
    page.click("form.card button[type=submit]")
    page.locator("p.error", has_text="401").wait_for()
    assert "needs a token" in page.inner_text("#token-state")
    page.fill("#token", TOKEN)
    page.press("#token", "Enter")
    page.locator("#token-state", has_text="token set").wait_for()


def ingest_family(page: Any, api: Api, shots: Path) -> None:
    """The base and the experts ingested from the form; the models table shows them ready."""
    ingest(page, "base", "family/base")
    page.locator("#ingest-base option[value=base]").wait_for(state="attached")
    for e in EXPERTS:
        ingest(page, e, f"family/{e}", base="base")
    # (functions, not expressions: the console's CSP allows no eval)
    page.wait_for_function("() => document.querySelectorAll('#models-table tbody tr').length "
                           "=== 4 && [...document.querySelectorAll('#models-table tbody tr')]"
                           ".every(r => r.cells[1].textContent === 'ready')")
    shoot(page, shots, "models")
    stats = {m["name"]: m for m in api.ok("GET", "/v1/model-stats")["models"]}
    row = page.locator("#models-table tbody tr", has_text="e1").inner_text()
    assert f"{stats['e1']['n_blocks']}" in row and "full" in row and "base" in row


def console_bytes(n: int) -> str:
    """A byte count as the console's ui.js `bytes` writes it (B, then KiB, MiB, ...)."""
    v, u = float(n), 0
    while abs(v) >= 1024 and u < 4:
        v, u = v / 1024, u + 1
    if u == 0:
        return f"{n} B"
    places = Decimal(1).scaleb(-(0 if v >= 100 else 1 if v >= 10 else 2))
    fixed = Decimal(v).quantize(places, rounding=ROUND_HALF_UP)  # toFixed rounds half up
    return f"{fixed} {['B', 'KiB', 'MiB', 'GiB', 'TiB'][u]}"

def check_plan_explorer(page: Any, api: Api, shots: Path) -> dict[str, Any]:
    """The plan explorer: task arithmetic, budget 40% set with the keyboard, shows the API's
    plan; that plan."""
    page.click("nav >> text=Plan explorer")
    page.select_option("#plan-op", "task_arithmetic")
    page.focus("#budget")
    page.keyboard.press("Home")
    for _ in range(39):
        page.keyboard.press("ArrowRight")
    page.locator("#budget-out", has_text="40% of the full read").wait_for()
    request = {"base": "base", "experts": [{"model": e, "weight": 1.0} for e in EXPERTS],
               "operator": "task_arithmetic", "budget": {"fraction": 0.4}}
    plan: dict[str, Any] = api.ok("POST", "/v1/plans?tensors=true", request)
    page.wait_for_function("h => document.querySelector('#plan-result').dataset.planHash === h",
                           arg=plan["plan_hash"])
    assert f"{plan['planned_expert_bytes']:,} bytes" in page.inner_text("#plan-bytes")
    assert f"{plan['full_read_bytes']:,} bytes" in page.inner_text("#plan-full")
    bound = numbers(page.inner_text("#plan-bound"))
    assert math.isclose(bound[-2], plan["omission_bound_l2"], rel_tol=1e-3)
    assert math.isclose(bound[-1], plan["omission_bound"], rel_tol=1e-3)
    # task_arithmetic's default, auto, says which ranking it chose
    assert page.inner_text("#plan-ranking").startswith(f"{plan['ranking']['utility']} (auto: "
                                                       f"{plan['ranking']['regime']} updates,")
    planned_cells = cells(page, "#plan-heatmap")
    assert planned_cells == {(c["model"], c["tensor"]): c["share"] for c in plan["tensors"]}
    shoot(page, shots, "plan-explorer", full_page=True)
    return plan


def run_merge(page: Any, api: Api, plan: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The explorer's plan merged from its button, progress shown to 100%; (id, merge job)."""
    page.fill("#plan-output", "ta-40")
    page.click("#start-merge")
    page.wait_for_url(re.compile(r"#/merge/m-"))
    merge_id = page.url.rsplit("/", 1)[1]
    seen = set()
    deadline = time.monotonic() + 60
    while "succeeded" not in page.inner_text("#merge-status"):
        seen.add(page.inner_text("#merge-progress"))
        assert time.monotonic() < deadline, seen
        time.sleep(0.05)
    merge: dict[str, Any] = api.ok("GET", f"/v1/merges/{merge_id}")
    total = merge["progress"]["total"]
    page.locator("#merge-progress", has_text=f"100% ({total}/{total} blocks)").wait_for()
    assert merge["plan_hash"] == plan["plan_hash"] and merge["status"] == "succeeded"
    return merge_id, merge


def cells(page: Any, root: str) -> dict[tuple[str, str], float | None]:
    """(expert, tensor) -> share of every heatmap cell under `root`; the printed number too."""
    got = page.eval_on_selector_all(
        f"{root} table.heatmap td.cell[data-model]",
        "els => els.map(e => [e.dataset.model, e.dataset.tensor, e.dataset.share ?? null, "
        "e.textContent])")
    out: dict[tuple[str, str], float | None] = {}
    for model, tensor, share, text in got:
        value = None if share is None else float(share)
        assert text == ("·" if value is None else str(math.floor(100 * value + 0.5))), (model, tensor, text)  # JS Math.round
        out[(model, tensor)] = value
    return out


def check_merge_page(page: Any, api: Api, merge_id: str, merge: dict[str, Any],
                     shots: Path) -> None:
    """The heatmap's numbers, computed here from the catalog: touched bytes over tensor bytes."""
    page.locator("table.heatmap").wait_for()
    read = {(m, t): b for m, t, b in sql(api, (
        "SELECT model, tensor, sum(nbytes) FROM touched_blocks "
        f"WHERE merge_id = '{merge_id}' GROUP BY model, tensor"))}
    sizes = sql(api, "SELECT model, tensor, nbytes FROM tensors WHERE model IN ('e0', 'e1', 'e2')")
    expected = {(m, t): read.get((m, t), 0) / n for m, t, n in sizes}
    got = cells(page, "main")
    assert got.keys() == expected.keys()
    assert all(math.isclose(got[k] or 0.0, v, abs_tol=1e-12) for k, v in expected.items())
    assert 0 < sum(expected.values()) < len(expected)  # some tensors partly read, not all
    assert any(0 < v < 1 for v in expected.values())
    # numbers on hover, and the same numbers as a table
    key = next(k for k, v in expected.items() if 0 < v < 1)
    page.hover(f"td.cell[data-model='{key[0]}'][data-tensor='{key[1]}']")
    detail = page.inner_text("p.detail")
    assert key[1] in detail and console_bytes(read[key]) in detail
    experts_text = page.inner_text("#experts-table")
    for e in merge["experts"]:
        assert e["model"] in experts_text
    bound = numbers(page.inner_text("#merge-bound"))
    assert math.isclose(bound[-1], merge["omission_bound"], rel_tol=1e-3)
    shoot(page, shots, "merge-heatmap", full_page=True)
    # keyboard: one tab stop into the grid, arrows move
    first = page.locator("td.cell[tabindex='0']")
    first.focus()
    before = page.evaluate("() => document.activeElement.dataset.tensor + document.activeElement.dataset.model")
    page.keyboard.press("ArrowRight")
    after = page.evaluate("() => document.activeElement.dataset.tensor + document.activeElement.dataset.model")
    assert before != after
    page.click("text=Show as a table")
    assert page.locator("table.shares tbody tr").count() == len(expected)
    page.click("text=Show the heatmap")
    assert page.locator("text=Download manifest.json").is_visible()
    # narrow window: the page does not scroll sideways (wide tables scroll in their own box)
    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth + 1")
    shoot(page, shots, "merge-narrow", full_page=True)
    page.set_viewport_size({"width": 1280, "height": 800})


def check_lineage(page: Any, shots: Path) -> None:
    page.click("dd >> text=ta-40")
    page.locator("svg.lineage").wait_for()
    nodes = set(page.eval_on_selector_all("svg.lineage .node", "els => els.map(e => e.dataset.node)"))
    assert nodes == {"ta-40", "base", *EXPERTS}
    labels = dict(page.eval_on_selector_all(
        "svg.lineage .edge-label", "els => els.map(e => [e.dataset.edge, e.textContent])"))
    assert labels == {"base>ta-40": "base", **{f"{e}>ta-40": "w 1.00" for e in EXPERTS}}
    assert page.locator("#lineage-table tbody tr").count() == 4
    shoot(page, shots, "lineage", full_page=True)


def check_frontier(page: Any, merge_id: str, plan: dict[str, Any], shots: Path) -> None:
    page.go_back()
    page.click("text=Frontier of this request")
    page.locator("#frontier-planned").wait_for()
    assert page.locator("#frontier-planned tbody tr").count() == 11
    row40 = page.locator("#frontier-planned tbody tr", has_text="40%").first.inner_text()
    assert f"{plan['selected_blocks']} / {plan['candidate_blocks']}" in row40
    assert merge_id in page.inner_text("#frontier-realized")
    assert page.locator("svg.chart rect.realized").count() == 1
    shoot(page, shots, "frontier", full_page=True)


def check_sql(page: Any, api: Api, merge_id: str, shots: Path) -> None:
    page.click("nav >> text=SQL")
    query = (f"SELECT model, count(*) AS blocks, sum(nbytes) AS bytes FROM touched_blocks "
             f"WHERE merge_id = '{merge_id}' GROUP BY model ORDER BY model")
    page.fill("#sql-text", query)
    page.press("#sql-text", "Control+Enter")
    page.locator("#sql-table").wait_for()
    want = sql(api, query)
    shown = page.eval_on_selector_all("#sql-table tbody tr",
                                      "rows => rows.map(r => [...r.cells].map(c => c.textContent))")
    assert shown == [[str(v) for v in r] for r in want]
    shoot(page, shots, "sql")
    with page.expect_download() as d:
        page.click("text=Download CSV")
    rows = list(csv.reader(io.StringIO(Path(d.value.path()).read_text())))
    assert rows == [["model", "blocks", "bytes"], *[[str(v) for v in r] for r in want]]
    with page.expect_download() as d:
        page.click("text=Download JSON")
    assert json.loads(Path(d.value.path()).read_text())["rows"] == want


def test_console_target_deviation_and_compare(page: Any, server: tuple[str, Api, Path],
                                              shots: Path) -> None:
    """The plan explorer finds the budget of a target deviation and shows the prediction; the
    merge page shows it too; the compare page shows the KL and perplexities the API computes."""
    from tests import tiny_lm

    url, api, tmp = server
    lm = tiny_lm.make_lm(tmp / "data" / "lm" / "lm-base", seed=0)
    tiny_lm.make_lm_expert(lm, tmp / "data" / "lm" / "lm-chat", seed=1, scale=0.1)
    api.ok("POST", "/v1/models", {"name": "lm-base", "path": "lm/lm-base"}, status=202)
    assert api.wait("/v1/models/lm-base")["status"] == "ready"
    api.ok("POST", "/v1/models", {"name": "lm-chat", "path": "lm/lm-chat", "base": "lm-base"},
           status=202)
    assert api.wait("/v1/models/lm-chat")["status"] == "ready"
    asked = {"base": "lm-base", "experts": [{"model": "lm-chat", "weight": 1.0}],
             "operator": "task_arithmetic"}
    full = api.ok("POST", "/v1/merges", {**asked, "output": {"name": "lm-full"}}, status=202)

    page.goto(url + "/#/plan")
    page.fill("#token", TOKEN)
    page.press("#token", "Enter")
    page.locator("#plan-base option[value=lm-base]").wait_for(state="attached")
    page.select_option("#plan-base", "lm-base")
    page.select_option("#plan-op", "task_arithmetic")
    page.fill("#plan-target", "0.5")
    page.click("#find-budget")
    want = api.ok("POST", "/v1/plans", {**asked, "target_deviation": 0.5})
    f = round(100 * want["budget_search"]["fraction"])
    page.locator("#budget-out", has_text=f"{f}% of the full read").wait_for()
    assert f"{f}% of the full read predicts" in page.inner_text("#target-result")
    page.wait_for_function("h => document.querySelector('#plan-result').dataset.planHash === h",
                           arg=want["plan_hash"])
    shown = numbers(page.inner_text("#plan-deviation"))
    assert math.isclose(shown[0], want["predicted_deviation"], rel_tol=1e-3)
    assert want["predicted_deviation"] <= 0.5
    shoot(page, shots, "plan-target", full_page=True)
    page.fill("#plan-output", "lm-half")
    page.click("#start-merge")
    page.wait_for_url(re.compile(r"#/merge/m-"))
    assert api.wait(f"/v1/merges/{page.url.rsplit('/', 1)[1]}")["status"] == "succeeded"
    assert api.wait(f"/v1/merges/{full['id']}")["status"] == "succeeded"
    page.locator("#merge-status", has_text="succeeded").wait_for()
    assert math.isclose(numbers(page.inner_text("#merge-deviation"))[0],
                        want["predicted_deviation"], rel_tol=1e-3)

    page.goto(url + "/#/compare?a=lm-full&b=lm-half")
    page.locator("#compare-a option[value=lm-full]").wait_for(state="attached")
    page.fill("#compare-text", tiny_lm.TEXT)
    page.click("#compare-run")
    page.locator("#compare-kl").wait_for(timeout=60_000)
    r = api.ok("POST", "/v1/compare", {"model_a": "lm-full", "model_b": "lm-half",
                                       "text": tiny_lm.TEXT, "tokens": 2048})
    assert r["kl"] > 0
    for sel, key in (("#compare-kl", "kl"), ("#compare-ppl-a", "perplexity_a"),
                     ("#compare-ppl-b", "perplexity_b")):
        assert math.isclose(numbers(page.inner_text(sel))[0], r[key], rel_tol=1e-3), sel
    assert f"{r['tokens']} (" in page.inner_text("#compare-tokens")
    shoot(page, shots, "compare", full_page=True)
    assert [e for e in page.errors if "401" not in e] == [], page.errors
