"""Calibration-aware planning: `mergepipe calibrate` stores per linear weight the RMS of each
input channel; utility=activation ranks expert blocks by their calibrated output change."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from mergepipe.catalog.calibrations import (
    calibration_fisher,
    calibration_vectors,
    latest_calibration,
)
from mergepipe.catalog.col_groups import GROUPS, bounds
from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.ingest import ingest_model
from mergepipe.cli.main import main
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.request import build_request
from mergepipe.evaluation.calibration import calibrate
from mergepipe.planner.plan import Plan, make_plan
from tests import factory
from tests.api_helpers import client_for, settings_for
from tests.calibration_family import (
    OTHER_TEXT,
    TEXT,
    make_llama_base,
    make_placed_expert,
)
from tests.catalogs import new_catalog

BLOCK = 1024  # bytes: 8 rows of a 32-column float32 weight
Q0 = "model.layers.0.self_attn.q_proj.weight"
O0 = "model.layers.0.self_attn.o_proj.weight"
LINEARS = sorted(n for n, s in factory.LLAMA_SHAPES.items()
                 if len(s) == 2 and n != "model.embed_tokens.weight")


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A base whose layer-0 q/k/v_proj see zero in input channels 0..15, and an expert with a
    large delta on q_proj's columns 0..15 only and a small one on o_proj."""
    root = tmp_path_factory.mktemp("calib")
    base = make_llama_base(root / "base", zero_channels=16)
    g = torch.Generator().manual_seed(5)
    dq = torch.zeros(32, 32)
    dq[:, :16] = torch.randn(32, 16, generator=g) * 0.5
    do = torch.randn(32, 32, generator=g) * 0.01
    expert = make_placed_expert(base, root / "e0", {Q0: dq, O0: do})
    return {"base": base, "e0": expert, "root": root, "dq": dq, "do": do}  # type: ignore[dict-item]


@pytest.fixture(scope="module")
def cat(family: dict[str, Any], tmp_path_factory: pytest.TempPathFactory):
    c = Catalog(new_catalog(tmp_path_factory.mktemp("calib-cat")))
    ingest_model(c, family["base"], "base", block_bytes=BLOCK)
    ingest_model(c, family["e0"], "e0", base="base", block_bytes=BLOCK, force=True)  # big delta
    yield c
    c.close()


def _plan(cat: Catalog, utility: str, budget: int | str = 4096) -> Plan:
    return make_plan(cat, build_request(base="base", experts="e0", operator="linear",
                                        params={"utility": utility}, budget=f"{budget}B"))


def _hand_rms(base: Path, text: str, tokens: int) -> dict[str, torch.Tensor]:
    """The RMS of every nn.Linear's input channels, by hooks that keep the inputs."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(base))
    ids = tok(text, add_special_tokens=False)["input_ids"][:tokens]
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).eval()
    seen: dict[str, torch.Tensor] = {}
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            m.register_forward_hook(lambda _m, a, _o, name=name: seen.__setitem__(
                name, a[0].detach().reshape(-1, a[0].shape[-1]).double()))
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]))
    return {f"{n}.weight": x.pow(2).mean(dim=0).sqrt() for n, x in seen.items()}


def test_missing_calibration_is_a_clear_error(family: dict[str, Any], tmp_path: Path) -> None:
    with Catalog(new_catalog(tmp_path)) as fresh:
        ingest_model(fresh, family["base"], "base", block_bytes=BLOCK)
        ingest_model(fresh, family["e0"], "e0", base="base", block_bytes=BLOCK, force=True)
        for utility in ("activation", "fisher"):
            with pytest.raises(InvalidRequest, match=rf"utility={utility} .* base 'base' has no "
                                                     r"calibration: run `mergepipe calibrate "
                                                     r"base --text FILE`"):
                _plan(fresh, utility)


def test_ingestion_stores_channel_group_column_norms(cat: Catalog, family: dict[str, Any]
                                                     ) -> None:
    rows = cat.query(SQL("SELECT tensor, block_index, col_sq FROM block_stats "
                         "WHERE model = 'e0' AND tensor IN (:q, :o) ORDER BY tensor, block_index"),
                     {"q": Q0, "o": O0})
    assert len(rows) == 8
    b = bounds(32)
    for tensor, i, col_sq in rows:
        d = (family["dq"] if tensor == Q0 else family["do"])[8 * i:8 * (i + 1)].double()
        per_col = d.pow(2).sum(dim=0)
        want = [float(per_col[b[g]:b[g + 1]].sum()) for g in range(GROUPS)]
        assert col_sq == pytest.approx(want, rel=1e-6, abs=1e-12)
    norms = cat.query(SQL("SELECT count(*) FROM block_stats WHERE model = 'e0' "
                          "AND tensor = 'model.norm.weight' AND col_sq IS NOT NULL"))
    assert norms[0][0] == 0  # 1-D tensors have none


def test_calibrate_stores_one_rms_vector_per_linear_weight(cat: Catalog,
                                                           family: dict[str, Any]) -> None:
    row = calibrate(cat, "base", TEXT, tokens=100)
    assert row.tokens == 100 and row.model == "base"
    vectors = calibration_vectors(cat, row.calibration_id)
    assert sorted(vectors) == LINEARS
    hand = _hand_rms(family["base"], TEXT, 100)
    for name, v in vectors.items():
        assert len(v.rms) == factory.LLAMA_SHAPES[name][1]
        assert v.rms == pytest.approx(hand[name].tolist(), rel=1e-5, abs=1e-9)
        assert len(v.group_ms) == GROUPS
    # the zeroed norm channels: q_proj of layer 0 sees exactly zero in channels 0..15
    assert vectors[Q0].rms[:16] == [0.0] * 16 and min(vectors[Q0].rms[16:]) > 0
    # the same run again is the same calibration
    assert calibrate(cat, "base", TEXT, tokens=100).calibration_id == row.calibration_id


def test_calibrate_stores_the_fisher_diagonal_per_block_and_group(cat: Catalog,
                                                                  family: dict[str, Any]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    row = calibrate(cat, "base", TEXT, tokens=100)
    stored = calibration_fisher(cat, row.calibration_id)
    blocks = cat.query(SQL("SELECT tensor, block_index FROM blocks WHERE model = 'base'"))
    assert set(stored) == {(str(t), int(i)) for t, i in blocks}
    # by hand: examples of 64 tokens (no BOS in this tokenizer), squared gradients of the
    # summed loss, averaged over the examples
    tok = AutoTokenizer.from_pretrained(str(family["base"]))
    ids = tok(TEXT, add_special_tokens=False)["input_ids"][:100]
    model = AutoModelForCausalLM.from_pretrained(str(family["base"]), dtype=torch.float32)
    params = dict(model.named_parameters())
    acc = {n: torch.zeros_like(p) for n, p in params.items()}
    pieces = [ids[:64], ids[64:]]
    for piece in pieces:
        model.zero_grad()
        x = torch.tensor([piece])
        (model(input_ids=x, labels=x).loss * (len(piece) - 1)).backward()
        for n, p in params.items():
            assert p.grad is not None
            acc[n] += p.grad.square()
    f_q = (acc[Q0] / len(pieces)).double()
    b = bounds(32)
    for i in range(4):  # 8-row blocks of q_proj, 16 groups of 2 columns
        part = f_q[8 * i:8 * (i + 1)]
        want = [float(part[:, b[g]:b[g + 1]].mean()) for g in range(GROUPS)]
        assert stored[(Q0, i)] == pytest.approx(want, rel=1e-4, abs=1e-12)
        assert stored[(Q0, i)][:8] == [0.0] * 8  # dead input channels: no gradient
    norm = "model.layers.1.input_layernorm.weight"
    assert stored[(norm, 0)] == pytest.approx([float((acc[norm] / 2).double().mean())],
                                              rel=1e-4)


def test_activation_plan_skips_a_large_delta_on_dead_channels(cat: Catalog) -> None:
    calibrate(cat, "base", TEXT, tokens=100)
    l2 = _plan(cat, "l2")
    act = _plan(cat, "activation")
    # l2 reads q_proj's big delta; under the calibration it changes nothing (zero inputs)
    assert {b.tensor for b in l2.blocks} == {Q0}
    assert {b.tensor for b in act.blocks} == {O0}
    assert {b.tensor for b in _plan(cat, "fisher").blocks} == {O0}
    assert act.plan_hash != l2.plan_hash
    cal = act.summary()["calibration"]
    assert cal["calibration_id"] == latest_calibration(cat, "base").calibration_id  # type: ignore[union-attr]
    assert "calibration" not in l2.summary()


@pytest.fixture(scope="module")
def share_cat(family: dict[str, Any], tmp_path_factory: pytest.TempPathFactory):
    """An expert with a tiny delta in q_proj's block 0 (live columns 16..31 only) and deltas
    100x larger in o_proj's blocks 1 and 2, of one pattern at scales 2:1."""
    root = tmp_path_factory.mktemp("calib-share")
    g = torch.Generator().manual_seed(9)
    dq = torch.zeros(32, 32)
    dq[:8, 16:] = torch.randn(8, 16, generator=g) * 1e-3
    m = torch.randn(8, 32, generator=g)
    do = torch.zeros(32, 32)
    do[8:16], do[16:24] = 0.1 * m, 0.05 * m
    expert = make_placed_expert(family["base"], root / "e1", {Q0: dq, O0: do})
    c = Catalog(new_catalog(root))
    ingest_model(c, family["base"], "base", block_bytes=BLOCK)
    ingest_model(c, expert, "e0", base="base", block_bytes=BLOCK)
    calibrate(c, "base", TEXT, tokens=100)
    yield c
    c.close()


def test_activation_ranks_by_share_of_each_tensors_output_change(share_cat: Catalog) -> None:
    # act = the block's share of its (expert, tensor) output change: q_proj block 0 holds all
    # of q_proj's (1), o_proj's blocks 2/sqrt(5) and 1/sqrt(5), whatever the channel RMS; the
    # absolute output change (the ranking before) read o_proj's block 1 first
    want = [(Q0, 0), (O0, 1), (O0, 2)]
    for k in (1, 2, 3):
        p = _plan(share_cat, "activation", k * BLOCK)
        assert sorted((b.rank, b.tensor, b.block_index) for b in p.blocks) == [
            (r, t, i) for r, (t, i) in enumerate(want[:k])]


def test_activation_plans_are_budget_sound(cat: Catalog, family: dict[str, Any]) -> None:
    calibrate(cat, "base", TEXT, tokens=100)
    deltas = {Q0: family["dq"].double(), O0: family["do"].double()}
    for budget in (1024, 1500, 3072, 4096, 5000, 7168, 8192):
        p = _plan(cat, "activation", budget)
        assert p.planned_expert_bytes <= p.budget_bytes == budget
        chosen = p.selected().get(("e0", Q0), set()), p.selected().get(("e0", O0), set())
        omitted = [deltas[t][8 * i:8 * (i + 1)] for t, sel in zip((Q0, O0), chosen, strict=True)
                   for i in range(4) if i not in sel]
        # the bound is the omitted blocks' l2 (a sound bound on the omitted update)
        want = math.fsum(float(d.norm()) for d in omitted)
        assert p.omission_bound is not None and p.omission_bound == pytest.approx(want, rel=1e-6)
        realized = math.sqrt(sum(float(d.pow(2).sum()) for d in omitted))
        assert p.omission_bound >= realized - 1e-9


def test_plan_hash_covers_the_calibration(cat: Catalog) -> None:
    calibrate(cat, "base", TEXT, tokens=100)
    l2_before = _plan(cat, "l2", 6144).plan_hash
    first = _plan(cat, "activation", 6144)
    other = calibrate(cat, "base", OTHER_TEXT, tokens=90)
    second = _plan(cat, "activation", 6144)
    assert second.summary()["calibration"]["calibration_id"] == other.calibration_id
    assert second.plan_hash != first.plan_hash
    assert _plan(cat, "l2", 6144).plan_hash == l2_before  # l2 plans ignore calibrations


def test_calibrate_without_tokenizer_names_the_model(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    base = make_llama_base(tmp_path / "notok", tokenizer=False)
    db = str(new_catalog(tmp_path))
    assert main(["--catalog", db, "ingest", str(base), "--name", "bare"]) == 0
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    capsys.readouterr()
    assert main(["--catalog", db, "calibrate", "bare", "--text", str(text)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model 'bare' has no tokenizer files" in err[0], err


def test_cli_and_http_calibrate(tmp_path: Path, family: dict[str, Any],
                                capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    data = tmp_path / "data"
    shutil.copytree(family["base"], data / "base")
    settings = settings_for(tmp_path)
    with client_for(settings) as client:
        r = client.post("/v1/models", json={"name": "base", "path": str(data / "base"),
                                            "kind": "full"})
        assert r.status_code == 202, r.text
        from tests.api_helpers import wait
        assert wait(client, "/v1/models/base")["status"] == "ready"
        r = client.post("/v1/calibrations", json={"base": "base", "text": TEXT, "tokens": 100})
        assert r.status_code == 201, r.text
        body = r.json()
        assert body["tokens"] == 100 and body["model"] == "base"
        r = client.post("/v1/calibrations", json={"base": "nope", "text": TEXT})
        assert r.status_code == 404 and "nope" in r.text
        # a NUL in a model's name is refused as input (PostgreSQL text cannot hold one: it was a
        # 500 there), as for every request naming a registered model
        for path, req in (("/v1/calibrations", {"base": "ba\x00se", "text": TEXT}),
                          ("/v1/compare", {"model_a": "ba\x00se", "model_b": "base",
                                           "text": TEXT})):
            r = client.post(path, json=req)
            assert r.status_code == 422, (path, r.text)
            assert r.json()["error"]["field"] in ("base", "model_a"), r.text
    # the CLI on the same catalog gives the same calibration (same model, text and tokens)
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    capsys.readouterr()
    assert main(["--catalog", str(settings.catalog), "calibrate", "base", "--text", str(text),
                 "--tokens", "100", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["calibration_id"] == body["calibration_id"]


def test_python_api_merge_manifest_names_the_calibration(tmp_path: Path,
                                                          family: dict[str, Any]) -> None:
    import mergepipe

    text = tmp_path / "calib.txt"
    text.write_text(TEXT)
    with mergepipe.Catalog(new_catalog(tmp_path)) as cat:
        cat.ingest(family["base"], "base", block_bytes=BLOCK, progress=False)
        cat.ingest(family["e0"], "e0", base="base", block_bytes=BLOCK, force=True,
                   progress=False)
        row = cat.calibrate("base", text, tokens=100)
        for utility in ("activation", "fisher"):
            out = tmp_path / f"merged-{utility}"
            done = cat.merge(base="base", experts="e0", operator="linear", budget="4096B",
                             params={"utility": utility}, out=out, progress=False)
            manifest = json.loads((out / "manifest.json").read_text())
            assert manifest["plan"]["calibration"]["calibration_id"] == row.calibration_id
            assert manifest["plan"]["plan_hash"] == done.plan_hash
            # the large delta on dead input channels is left out either way
            plan = cat.plan(base="base", experts="e0", operator="linear", budget="4096B",
                            params={"utility": utility})
            assert plan.plan_hash == done.plan_hash
            assert {b.tensor for b in plan.blocks} == {O0}


def test_column_groups_of_element_ranges_add_up_to_the_tensor() -> None:
    """Blocks of an element grid cut rows anywhere: their groups still add up to the tensor's
    column sums (and a row-grid block's groups are its own columns')."""
    import numpy as np

    from mergepipe.catalog.col_groups import block_col_sq

    rng = np.random.default_rng(3)
    w = rng.standard_normal((7, 40)).astype(np.float32)
    flat = w.reshape(-1)
    cuts = [0, 13, 57, 58, 200, 280]
    total = np.zeros(GROUPS)
    for s, e in zip(cuts, cuts[1:], strict=False):
        got = block_col_sq(flat[s:e], (7, 40), s)
        assert got is not None
        total += np.asarray(got)
    b = bounds(40)
    per_col = (w.astype(np.float64) ** 2).sum(axis=0)
    assert total == pytest.approx([per_col[b[g]:b[g + 1]].sum() for g in range(GROUPS)],
                                  rel=1e-6)
    rows = block_col_sq(flat[80:160], (7, 40), 80)  # rows 2..3
    part = (w[2:4].astype(np.float64) ** 2).sum(axis=0)
    assert rows == pytest.approx([part[b[g]:b[g + 1]].sum() for g in range(GROUPS)], rel=1e-6)
    assert block_col_sq(flat[:7], (7,), 0) is None


def test_an_unreadable_calibration_text_names_the_file(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    """The Python API and the CLI read a calibration text file alike: InvalidRequest naming the
    file (the API raised FileNotFoundError), one line on stderr, before the catalog is used."""
    import mergepipe

    missing, latin = tmp_path / "missing.txt", tmp_path / "latin.txt"
    latin.write_bytes("caf\xe9".encode("latin-1"))
    db = new_catalog(tmp_path)
    with mergepipe.Catalog(db) as cat:
        for path, why in ((missing, "No such file or directory"), (latin, "not UTF-8 text")):
            with pytest.raises(InvalidRequest) as e:
                cat.calibrate("base", path)
            assert e.value.message == f"{path}: cannot read the calibration text ({why})"
            assert e.value.field == "text"
    capsys.readouterr()
    assert main(["--catalog", str(db), "calibrate", "base", "--text", str(missing)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"mergepipe calibrate: error: {missing}: cannot read the calibration text "
                   "(No such file or directory)"], err
