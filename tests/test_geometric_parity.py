"""slerp, nuslerp and model_stock give mergekit 0.1.5's bytes (bf16, fp32, no dtype; a few
entries may move by one ulp where a reduction sums in another order), and at budgets below 1
they stay within the budget and are deterministic.

One mergekit subprocess runs every config (its start-up is most of the cost).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests import geometric_parity as gp
from tests import mergekit_parity as mp

pytest.importorskip("mergekit", reason="mergekit (test extra) is the conformance reference")

from mergepipe.core.errors import InvalidRequest  # noqa: E402
from mergepipe.core.mergekit_config import parse_config  # noqa: E402

MAX_DIFFERING = 4  # entries one ulp away, per config (reductions summed in another order)


@pytest.fixture(scope="module")
def fam(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return mp.make_family(tmp_path_factory.mktemp("family"))


# one config of each method for the fast run; every case (3 dtypes, the options) is slow
FAST = ("slerp-bfloat16", "model_stock-none", "nuslerp-row_wise-bfloat16")


def _conformance(names, fam, cat, root: Path, tag: str) -> None:
    cases = {n: gp.config(gp.CASES[n][0], fam, gp.CASES[n][1], gp.CASES[n][2]) for n in names}
    base = mp.load_raw(fam["base"])
    theirs = mp.run_mergekit(cases, root)
    table = {}
    for name, cfg in cases.items():
        summary, ours = mp.run_ours(cat, cfg, root / "ours" / f"{tag}-{name}")
        assert summary["expert_bytes_read"] <= summary["full_read_bytes"]
        table[name] = gp.ulps(ours, theirs[name], promoted=name in gp.PROMOTED)
        assert any(not torch.equal(ours[k], v) for k, v in base.items()), name
    print(json.dumps(table))
    for name, (differ, worst, _) in table.items():
        assert differ <= MAX_DIFFERING and worst <= 1, f"{name}: {table[name]}"


@pytest.mark.slow  # a mergekit subprocess (~30 s); make test keeps tests/test_mergekit_parity.py's
def test_geometric_methods_give_mergekits_bytes(fam, cat, tmp_path):
    _conformance(FAST, fam, cat, tmp_path, "fast")


def test_the_newer_methods_give_mergekits_bytes(fam, cat, tmp_path):
    """nearswap, sce, multislerp and karcher: one config each in bf16 (all of them: slow)."""
    _conformance([f"{m}-bfloat16" for m in gp.NEWER], fam, cat, tmp_path, "newer")


@pytest.mark.slow
def test_every_dtype_and_option_gives_mergekits_bytes(fam, cat, tmp_path):
    _conformance(list(gp.CASES), fam, cat, tmp_path, "all")


@pytest.mark.parametrize("method", [
    "model_stock", "sce", pytest.param("slerp", marks=pytest.mark.slow),
    *(pytest.param(m, marks=pytest.mark.slow) for m in ("nuslerp", "multislerp", "karcher",
                                                         "nearswap", "ram", "ramplus_tl",
                                                         "arcee_fusion"))])
def test_under_a_budget_sound_and_deterministic(method, fam, cat, tmp_path):
    params = {"slerp": {"t": 0.3}, "nearswap": {"t": 0.004},
              "ramplus_tl": {"epsilon": 0.005}}.get(method, {})
    cfg = gp.config(method, fam, "bfloat16", params)
    s0, full = mp.budgeted_and_full(cat, cfg, tmp_path, f"{method}-")
    assert s0["expert_bytes_read"] < full["expert_bytes_read"]


def test_expert_counts_and_config_checks(fam):
    from mergepipe.core.request import build_request
    for op, n, why in (("slerp", 2, "exactly 1 expert"), ("nuslerp", 1, "exactly 2 experts"),
                       ("model_stock", 1, "at least 2 experts"), ("nearswap", 2, "exactly 1")):
        with pytest.raises(InvalidRequest, match=why) as e:
            build_request(base="b", operator=op,
                          experts=[{"model": f"x{i}"} for i in range(n)])
        assert e.value.field == "experts"
    base, e0, e1 = (str(fam[n]) for n in ("base", "e0", "e1"))
    with pytest.raises(InvalidRequest, match="parameters.t: missing"):
        parse_config(json.dumps({"merge_method": "slerp", "base_model": base,
                                 "models": [{"model": base}, {"model": e0}]}))
    # t per tensor (a gradient): resolved at each tensor (tests/test_mergekit_slerp_soup.py)
    grad = parse_config(json.dumps({"merge_method": "slerp", "base_model": base,
                                    "parameters": {"t": [0, 0.5, 1]},
                                    "models": [{"model": base}, {"model": e0}]}))
    assert grad.params["t"] == 0.0 and grad.experts[0].chains == {"t": [[0.0, 0.5, 1.0]]}
    cfg = parse_config(json.dumps({"merge_method": "model_stock", "base_model": base,
                                   "models": [{"model": e0, "parameters": {"weight": 2}},
                                              {"model": e1}]}))
    assert [x.weight for x in cfg.experts] == [1.0, 1.0]
    assert any("does not take weight" in n for n in cfg.notes)
    with pytest.raises(InvalidRequest, match="base_model: required: mergekit's nuslerp") as e:
        parse_config(json.dumps({"merge_method": "nuslerp", "models": [
            {"model": e0, "parameters": {"weight": 1}}, {"model": e1, "parameters": {"weight": 1}}
        ]}))
    assert e.value.field == "base_model"
    for method, key in (("nearswap", "parameters.t: missing"),
                        ("karcher", "base_model: required: mergekit's karcher"),
                        ("multislerp", "base_model: required: mergekit's multislerp")):
        doc = {"merge_method": method, "models": [{"model": e0}, {"model": e1}]}
        if method == "nearswap":
            doc = {**doc, "base_model": base, "models": [{"model": e0}]}
        with pytest.raises(InvalidRequest, match=key):
            parse_config(json.dumps(doc))
    for op, params, field in (("sce", {"select_topk": 1.5}, "params.select_topk"),
                              ("nearswap", {"t": -1.0}, "params.t")):
        with pytest.raises(InvalidRequest) as e:
            build_request(base="b", operator=op, params=params,
                          experts=[{"model": "x0"}] if op == "nearswap" else
                          [{"model": "x0"}, {"model": "x1"}])
        assert e.value.field == field


def test_whole_tensors_stay_in_one_chunk_and_the_output_does_not_depend_on_chunks(
        fam, cat, tmp_path):
    """A native slerp (float32 compute) with chunks far smaller than a tensor: every chunk
    ends at a tensor's last block, and the output equals the one-chunk run's bytes."""
    from mergepipe.core.request import build_request
    from mergepipe.executor.schedule import schedule
    from mergepipe.executor.stream import execute, prepare
    from mergepipe.planner.plan import make_plan

    mp.run_ours(cat, gp.config("model_stock", fam, None, {}), tmp_path / "register")
    req = build_request(base="base", operator="slerp", params={"t": 0.7},
                        experts=[{"model": "e1"}], budget=0.6)
    prep = prepare(cat, make_plan(cat, req))
    steps, _ = schedule(prep, 700)
    blocks = {t: len(prep.base.tensor_blocks(t)) for t in prep.base.tensors}
    assert max(blocks.values()) > 1 and len(steps) > 1
    for chunk in steps:
        assert chunk[-1].block_index == blocks[chunk[-1].tensor] - 1
    outs = []
    for chunk_bytes in (700, None):
        out = tmp_path / f"out-{chunk_bytes}"
        out.mkdir()
        res = execute(prep, out, chunk_bytes=chunk_bytes)
        assert res.expert_bytes_read <= prep.plan.budget_bytes
        outs.append(mp.load_raw(out))
    assert all(torch.equal(outs[0][k], outs[1][k]) for k in outs[0])
    base = mp.load_raw(fam["base"])
    assert any(not torch.equal(outs[0][k], base[k]) for k in base)
