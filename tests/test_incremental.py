"""Incremental merges (issue 16): add, drop, reweight and chains of increments equal the scratch
merge within the bound docs/incremental.md states, reading the stored merge and the changed
experts only."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import InvalidRequest, MergePipeError
from mergepipe.core.request import MergeRequest, build_request
from mergepipe.jobs.merge import merge
from mergepipe.jobs.planning import plan_merge
from mergepipe.jobs.replay import replay
from mergepipe.jobs.report import MergeSummary
from tests import factory
from tests.catalogs import copy_catalog, new_catalog
from tests.executor_family import deltas, ingest_family

K = 8
MBITS = {"BF16": 7, "F16": 10, "F32": 23}


@pytest.fixture(scope="module")
def fam(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path | str, dict[str, Path]]:
    """A bf16 base and K + 1 full experts, ingested once; each test gets a copy of the catalog."""
    root = tmp_path_factory.mktemp("incremental")
    db = new_catalog(root)
    with Catalog(db) as cat:
        paths = ingest_family(cat, root / "fam", kinds=("full",) * (K + 1), block_bytes=1024)
    return db, paths


@pytest.fixture
def cat(fam: tuple[Path | str, dict[str, Path]], tmp_path: Path) -> Iterator[Catalog]:
    c = Catalog(copy_catalog(fam[0], tmp_path))
    yield c
    c.close()


def req(experts: list[str] | str, op: str = "linear", **kw: object) -> MergeRequest:
    names = experts if isinstance(experts, str) else ",".join(experts)
    return build_request(base="base", experts=names, operator=op, **kw)  # type: ignore[arg-type]


def run(cat: Catalog, tmp_path: Path, name: str, request: MergeRequest) -> MergeSummary:
    return merge(cat, request, tmp_path / name)


def ulp(x: torch.Tensor, dtype: str) -> torch.Tensor:
    """The spacing of `dtype` at |x| (normal numbers; tiny values get the smallest normal's)."""
    _, e = torch.frexp(x.abs().clamp_min(2.0 ** -14))
    return torch.ldexp(torch.ones_like(x), e - 1 - MBITS[dtype])


def slack(paths: dict[str, Path], request: MergeRequest, scale: float, prev_delta: dict) -> dict:
    """float32 sums of both computations: (K + 4) * 2^-24 * (|B| + sum |alpha_i D_i| + |c| |M_old - B|)."""
    base = factory.load(paths["base"])
    out = {n: b.abs() + scale * prev_delta[n].abs() for n, b in base.items()}
    for e, a in zip(request.experts, request.coefficients(), strict=True):
        for n, d in deltas(paths, e.model, "full").items():
            out[n] += abs(a) * d.abs()
    n_terms = len(request.experts) + 4
    return {n: v * n_terms * 2.0 ** -24 for n, v in out.items()}


def error_bound(paths: dict[str, Path], request: MergeRequest, prev: Path, c: float,
                prev_bound: dict | None, out_dtype: str, prev_dtype: str) -> dict:
    """|M - M_exact| per entry before M's own rounding, for an increment from `prev` whose error
    before its rounding was `prev_bound` (None: prev was made from scratch: float32 sums)."""
    old = factory.load(prev)
    base = factory.load(paths["base"])
    own = slack(paths, request, abs(c), {n: old[n] - base[n] for n in base})
    before = prev_bound or own  # a scratch merge's sums are no longer than this one's
    return {n: abs(c) * (before[n] + ulp(old[n], prev_dtype) / 2) + own[n] for n in base}


def assert_within(inc: Path, scratch: Path, bound: dict, out_dtype: str) -> float:
    """|inc - scratch| <= bound + 1/2 ulp of each output's own rounding, entry by entry."""
    a, b = factory.load(inc), factory.load(scratch)
    worst = 0.0
    for n in a:
        limit = bound[n] + ulp(torch.maximum(a[n].abs(), b[n].abs()), out_dtype)
        diff = (a[n] - b[n]).abs()
        assert bool((diff <= limit).all()), (n, float((diff - limit).max()))
        worst = max(worst, float(diff.max()))
    return worst


def experts(n: int) -> list[str]:
    return [f"e{i}" for i in range(n)]


SLOW = pytest.mark.slow  # a few seconds per merge on a loaded 2-core machine


@pytest.mark.parametrize("dtype", ["BF16", pytest.param("F32", marks=SLOW)])
def test_adding_one_expert_to_k8_reads_the_stored_merge_and_the_new_expert(
        cat: Catalog, fam: tuple[Path | str, dict[str, Path]], tmp_path: Path, dtype: str) -> None:
    paths = fam[1]
    m8 = run(cat, tmp_path, "m8", req(experts(K), output_dtype=dtype))
    assert m8.strategy == "scratch" and m8.previous_merge is None
    # the default never reuses a stored merge; auto (asked for) takes the complete increment
    default = plan_merge(cat, req(experts(K + 1), output_dtype=dtype)).strategy
    assert default is not None and default["chosen"] == "scratch"
    plan = plan_merge(cat, req(experts(K + 1), output_dtype=dtype, strategy="auto"))
    st = plan.summary()["strategy"]
    assert st["chosen"] == "incremental" and st["incremental"]["previous_merge"] == m8.merge_id
    assert st["incremental"]["complete"]
    assert [c["change"] for c in st["incremental"]["changes"]] == ["added"]
    assert st["incremental"]["c"] == pytest.approx(K / (K + 1))
    inc = run(cat, tmp_path, "m9", req(experts(K + 1), output_dtype=dtype, strategy="auto"))
    scratch = run(cat, tmp_path, "s9", req(experts(K + 1), output_dtype=dtype,
                                           strategy="scratch"))
    assert (inc.strategy, inc.previous_merge) == ("incremental", m8.merge_id)
    by_model = {e.model: e.bytes_read for e in inc.experts}
    assert set(by_model) == {"m8", f"e{K}"}
    one = {e.model: e.bytes_read for e in scratch.experts}[f"e{K}"]  # one expert checkpoint
    # bf16: M_old is one checkpoint more than the new expert; float32: M_old is twice a bf16 one
    assert inc.expert_bytes_read == by_model["m8"] + by_model[f"e{K}"]
    assert inc.expert_bytes_read <= (2 if dtype == "BF16" else 3) * one * 1.01
    assert scratch.expert_bytes_read >= (K + 1) * one * 0.9
    assert inc.expert_bytes_read <= inc.budget_bytes
    bound = error_bound(paths, req(experts(K + 1)), tmp_path / "m8", K / (K + 1), None,
                        dtype, dtype)
    assert_within(tmp_path / "m9", tmp_path / "s9", bound, dtype)
    # records: the merges row, lineage (role previous), manifest and model card
    with cat.reader() as conn:
        row = conn.execute(SQL("SELECT strategy, previous_merge FROM merges WHERE "
                                   "merge_id = :m"), {"m": inc.merge_id}).one()
        edges = conn.execute(SQL("SELECT parent, role, weight FROM lineage WHERE "
                                     "child = 'm9' ORDER BY role, parent")).fetchall()
    assert tuple(row) == ("incremental", m8.merge_id)
    assert ("m8", "previous", pytest.approx(K / (K + 1))) in [tuple(e) for e in edges]
    assert sorted(p for p, r, _ in edges if r == "expert") == experts(K + 1)
    manifest = json.loads((tmp_path / "m9" / "manifest.json").read_text())
    assert manifest["plan"]["strategy"]["chosen"] == "incremental"
    assert "e8" in (tmp_path / "m9" / "README.md").read_text()
    # replay re-executes what was read (M_old + the new expert) and matches the recorded hashes
    assert inc.merge_id is not None
    again = replay(cat, inc.merge_id)
    assert again.match and again.expert_bytes_read == inc.expert_bytes_read


@pytest.mark.parametrize(("change", "op"), [
    pytest.param("drop", "linear", marks=SLOW),
    pytest.param("reweight", "task_arithmetic", marks=SLOW)])
def test_drop_and_reweight_read_the_changed_expert_only(
        cat: Catalog, fam: tuple[Path | str, dict[str, Path]], tmp_path: Path, change: str,
        op: str) -> None:
    paths = fam[1]
    old = "e0,e1,e2,e3:0.5" if op == "task_arithmetic" else "e0,e1,e2,e3"
    new = "e0,e1,e2" if change == "drop" else "e0,e1,e2,e3:0.25"
    run(cat, tmp_path, "old", req(old, op))
    inc = run(cat, tmp_path, "new", req(new, op, strategy="incremental"))
    run(cat, tmp_path, "scratch", req(new, op, strategy="scratch"))
    assert {e.model for e in inc.experts if e.bytes_read} == {"old", "e3"}
    c = 4 / 3 if change == "drop" else 1.0  # linear: sum of weights 4 -> 3; task arithmetic: 1
    plan = plan_merge(cat, req(new, op, strategy="incremental"))
    assert plan.summary()["strategy"]["incremental"]["c"] == pytest.approx(c)
    expected = -1 / 3 if change == "drop" else -0.25
    assert plan.request.experts[1].weight == pytest.approx(expected)
    assert_within(tmp_path / "new", tmp_path / "scratch",
                  error_bound(paths, req(new, op), tmp_path / "old", c, None, "BF16", "BF16"),
                  "BF16")


@SLOW
@pytest.mark.parametrize("dtype", ["BF16", "F32"])
def test_a_chain_of_increments_stays_within_the_accumulated_bound(
        cat: Catalog, fam: tuple[Path | str, dict[str, Path]], tmp_path: Path, dtype: str) -> None:
    paths = fam[1]
    run(cat, tmp_path, "k3", req(experts(3), output_dtype=dtype))
    prev, bound = "k3", None
    for k in (4, 5, 6):
        r = run(cat, tmp_path, f"k{k}", req(experts(k), output_dtype=dtype,
                                            strategy="incremental"))
        assert r.strategy == "incremental" and {e.model for e in r.experts} == {prev, f"e{k - 1}"}
        bound = error_bound(paths, req(experts(k)), tmp_path / prev, (k - 1) / k, bound,
                            dtype, dtype)
        prev = f"k{k}"
    plan = plan_merge(cat, req(experts(7), output_dtype=dtype, strategy="auto"))
    assert plan.summary()["strategy"]["incremental"]["chain_depth"] == 4
    run(cat, tmp_path, "s6", req(experts(6), output_dtype=dtype, strategy="scratch"))
    assert bound is not None
    worst = assert_within(tmp_path / "k6", tmp_path / "s6", bound, dtype)
    if dtype == "F32":
        assert worst < 1e-6


@SLOW
def test_a_budgeted_previous_merge_carries_its_bound(
        cat: Catalog, fam: tuple[Path | str, dict[str, Path]], tmp_path: Path) -> None:
    old = run(cat, tmp_path, "half", req(experts(4), budget=0.5, output_dtype="F32"))
    assert old.omission_bound is not None and old.omission_bound > 0
    # at the full budget an increment of it would not be the standard merge: refused (issue
    # 28); under a budget of the user's (0.9 of scratch's full read) it is used
    with pytest.raises(InvalidRequest, match="read under a budget"):
        plan_merge(cat, req(experts(5), output_dtype="F32", strategy="incremental"))
    plan = plan_merge(cat, req(experts(5), output_dtype="F32", strategy="incremental",
                               budget=0.9))
    assert plan.summary()["strategy"]["incremental"]["carried_bound"] == old.omission_bound
    # the new expert and M_old are read whole: the bound is |c| times M_old's
    assert plan.omission_bound == pytest.approx(0.8 * old.omission_bound)
    run(cat, tmp_path, "inc", req(experts(5), output_dtype="F32", strategy="incremental",
                                  budget=0.9))
    run(cat, tmp_path, "full", req(experts(5), output_dtype="F32", strategy="scratch"))
    a, b = factory.load(tmp_path / "inc"), factory.load(tmp_path / "full")
    dev = sum(float(((a[n] - b[n]) ** 2).sum()) for n in a) ** 0.5
    assert plan.omission_bound is not None
    assert 0 < dev <= plan.omission_bound * (1 + 1e-5) + 1e-6


@SLOW
def test_dare_linear_keeps_each_experts_keyed_drop(
        cat: Catalog, fam: tuple[Path | str, dict[str, Path]], tmp_path: Path) -> None:
    paths = fam[1]
    kw = {"params": {"density": 0.5}, "seed": 7, "output_dtype": "F32"}
    run(cat, tmp_path, "d3", req(experts(3), "dare_linear", **kw))
    inc = run(cat, tmp_path, "d4", req(experts(4), "dare_linear", strategy="incremental", **kw))
    run(cat, tmp_path, "s4", req(experts(4), "dare_linear", strategy="scratch", **kw))
    assert {e.model for e in inc.experts} == {"d3", "e3"}
    a, b = factory.load(tmp_path / "d4"), factory.load(tmp_path / "s4")
    assert max(float((a[n] - b[n]).abs().max()) for n in a) < 1e-5
    # another seed drops other entries: not an increment of d3
    with pytest.raises(InvalidRequest, match="no stored dare_linear merge"):
        plan_merge(cat, req(experts(4), "dare_linear", strategy="incremental",
                            **{**kw, "seed": 8}))
    assert len(paths) == K + 2


def test_incremental_is_refused_where_it_is_not_exact(cat: Catalog, tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="no stored linear merge of base 'base'"):
        plan_merge(cat, req(experts(3), strategy="incremental"))
    with pytest.raises(InvalidRequest, match="elects each entry's sign over all experts"):
        plan_merge(cat, req(experts(3), "ties", params={"density": 0.5},
                            strategy="incremental"))
    with pytest.raises(InvalidRequest, match="renormalize=selected changes the coefficients"):
        plan_merge(cat, req(experts(3), params={"renormalize": "selected"},
                            strategy="incremental"))
    with pytest.raises(InvalidRequest, match="strategy: Input should be 'scratch', 'incremental' or 'auto'"):
        req(experts(3), strategy="fastest")
    # auto with nothing stored: scratch, and the plan says why not incremental
    st = plan_merge(cat, req(experts(3), strategy="auto")).summary()["strategy"]
    assert st["chosen"] == "scratch" and not st["incremental"]["available"]


def test_cli_plan_shows_both_strategies_and_refuses_with_one_line(
        fam: tuple[Path | str, dict[str, Path]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from mergepipe.cli.main import main
    db = str(copy_catalog(fam[0], tmp_path))
    common = ["--base", "base", "--op", "linear", "--dtype", "fp32"]
    assert main(["--catalog", db, "merge", *common, "--experts", "e0,e1,e2",
                 "--out", str(tmp_path / "m3"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["strategy"] == "scratch"
    assert main(["--catalog", db, "plan", *common, "--experts", "e0,e1,e2,e3",
                 "--strategy", "auto"]) == 0
    out = capsys.readouterr().out
    assert "strategy        incremental (asked: auto)" in out
    assert "linear of 4 expert(s) on base 'base'" in out  # the request's, not M_old + 1
    assert "(m3, c=0.75) + added e3" in out and "    scratch       " in out
    config = tmp_path / "linear.yml"  # a mergekit config: the same request, the same increment
    config.write_text("merge_method: linear\nbase_model: base\ndtype: float32\nmodels: "
                      "[{model: base, parameters: {weight: 0}}, {model: e0, parameters: {weight: 1}}, "
                      "{model: e1, parameters: {weight: 1}}, {model: e2, parameters: {weight: 1}}, "
                      "{model: e3, parameters: {weight: 1}}]\n")
    # a mergekit config runs mergekit's arithmetic on values: refused with the reason, one line
    assert main(["--catalog", db, "plan", str(config), "--strategy", "incremental",
                 "--json"]) != 0
    err = capsys.readouterr().err.strip()
    assert "mergekit's own arithmetic" in err and len(err.splitlines()) == 1
    assert main(["--catalog", db, "plan", str(config), "--strategy", "auto", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["strategy"]["chosen"] == "scratch"
    assert main(["--catalog", db, "plan", "--base", "base", "--op", "ties", "--experts",
                 "e0,e1,e2,e3", "--param", "density=0.5", "--strategy", "incremental"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "elects each entry's sign" in err


def test_auto_falls_back_to_scratch_when_the_stored_output_changed(
        cat: Catalog, tmp_path: Path) -> None:
    run(cat, tmp_path, "m3", req(experts(3)))
    weights = next((tmp_path / "m3").glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-2:] = bytes(b ^ 0x5A for b in data[-2:])  # other bytes (a touch alone is accepted)
    weights.write_bytes(bytes(data))
    r = run(cat, tmp_path, "m4", req(experts(4), strategy="auto"))
    assert r.strategy == "scratch" and r.previous_merge is None
    doc = json.loads((tmp_path / "m4" / "manifest.json").read_text())["plan"]["strategy"]
    assert doc["requested"] == "auto" and "cannot be read" in doc["incremental"]["reason"]
    with pytest.raises(MergePipeError, match="m3"):
        run(cat, tmp_path, "m4b", req(experts(4), strategy="incremental"))
