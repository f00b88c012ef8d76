"""What the executor's check of a plan reads from the catalog (issue 31: planning's cost).

`prepare` loads the base whole, and of each expert its tensors and only the blocks the plan
reads; the planner's own rows of the planned blocks (Plan.block_rows) are reused
instead of being read again, where they were read of the same catalog and model rows. The
dtype promotion the kernels see (ChunkMerger.input_dtype) is the one every expert tensor's row
gives. The vocabulary check works on the tensor rows the executor reads anyway
(jobs.planning.check_vocab_rows)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.models import model_blocks, model_tensors
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.request import MergeRequest, build_request
from mergepipe.core.vocab import HF_DTYPE_NAMES
from mergepipe.executor import prepare as prepare_module
from mergepipe.executor import stream
from mergepipe.executor.blocks import ChunkMerger
from mergepipe.executor.prepare import prepare, read_inputs
from mergepipe.jobs import merge as merge_module
from mergepipe.jobs.merge import plan_and_prepare
from mergepipe.jobs.planning import check_inputs, check_vocab_rows
from mergepipe.planner.incremental import choose_plan
from mergepipe.planner.plan import Plan
from mergepipe.storage.fsconfine import confined, current_roots
from tests import factory

BLOCK = 256  # several blocks per matrix
F32_TENSOR = "lm_head.weight"  # e0 keeps this one tensor in float32


@pytest.fixture
def fam(catalog: Catalog, tmp_path: Path) -> Catalog:
    """A bf16 base; e0 bf16 but for F32_TENSOR, e1 bf16, d a float32 delta checkpoint."""
    base = factory.make_base(tmp_path / "base", seed=0)
    e0 = factory.make_expert(base, tmp_path / "e0", seed=1)
    tensors = load_file(str(e0 / "model.safetensors"))
    tensors[F32_TENSOR] = tensors[F32_TENSOR].float()
    save_file(tensors, str(e0 / "model.safetensors"), metadata={"format": "pt"})
    e1 = factory.make_expert(base, tmp_path / "e1", seed=2)
    d = factory.make_delta(base, tmp_path / "d", seed=3)
    from mergepipe.catalog.ingest import ingest_model

    ingest_model(catalog, base, "base", block_bytes=BLOCK)
    for name, path in (("e0", e0), ("e1", e1)):
        ingest_model(catalog, path, name, base="base")
    ingest_model(catalog, d, "d", base="base", kind="delta")
    return catalog


def _plan(cat: Catalog, budget: Any = 0.3, experts: str = "e0,e1,d", **params: Any) -> Plan:
    req = build_request(base="base", experts=experts, operator="linear", budget=budget,
                        params=params or None)
    return choose_plan(cat, check_inputs(cat, req))


def _named_queries(monkeypatch: pytest.MonkeyPatch) -> list[list[tuple[str, str, int]]]:
    """The keys of every blocks_named query prepare makes from now on."""
    calls: list[list[tuple[str, str, int]]] = []
    real = prepare_module.blocks_named

    def spy(conn: Any, named: Any) -> Any:
        calls.append(sorted(named))
        return real(conn, named)

    monkeypatch.setattr(prepare_module, "blocks_named", spy)
    return calls


def test_experts_are_loaded_as_far_as_the_plan_reads_them(fam: Catalog) -> None:
    plan = _plan(fam)
    prep = prepare(fam, plan)
    read = plan.selected()
    assert 0 < len(plan.blocks) < sum(len(model_blocks(fam, m)) for m in ("e0", "e1", "d"))
    for e in prep.experts:
        assert not e.complete
        assert list(e.tensors.values()) == model_tensors(fam, e.name)
        assert set(e.blocks) == {(t, i) for (m, t), idx in read.items() if m == e.name
                                 for i in idx}
    assert prep.base.complete
    assert list(prep.base.tensors) == [t.name for t in model_tensors(fam, "base")]
    assert set(prep.base.blocks) == {(b.tensor, b.block_index)
                                     for b in model_blocks(fam, "base")}
    # the rest is loaded when a re-verification needs every row
    e0 = prep.experts[0]
    assert e0.complete_blocks(fam) == {(b.tensor, b.block_index): b
                                       for b in model_blocks(fam, "e0")}
    assert e0.complete


def test_the_planners_rows_are_the_catalogs_and_are_not_read_again(
        fam: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _plan(fam)
    assert plan.block_rows is not None and len(plan.block_rows.rows) == len(plan.blocks)
    calls = _named_queries(monkeypatch)
    reused = prepare(fam, plan)
    assert calls == []  # every planned block's row came from the planner
    assert plan.block_rows is None  # dropped once used: not kept through the merge
    fresh = prepare(fam, replace(plan, block_rows=None))  # a plan rebuilt from its record
    assert calls == [sorted((b.model, b.tensor, b.block_index) for b in plan.blocks)]
    assert reused.selected == fresh.selected
    for a, b in zip(reused.experts, fresh.experts, strict=True):
        assert a.blocks == b.blocks
    catalog_rows = {(b.tensor, b.block_index): b for b in model_blocks(fam, "e1")}
    assert all(catalog_rows[k] == v for k, v in reused.experts[1].blocks.items())


@pytest.mark.parametrize("stale", ["catalog", "model_row", "missing_block"])
def test_rows_read_elsewhere_are_read_again(fam: Catalog, monkeypatch: pytest.MonkeyPatch,
                                            stale: str) -> None:
    """Rows of another catalog or another model row are not trusted; blocks the rows lack (a
    plan edited after planning) are read."""
    plan = _plan(fam)
    rows = plan.block_rows
    assert rows is not None
    keys = sorted((b.model, b.tensor, b.block_index) for b in plan.blocks)
    if stale == "catalog":
        plan.block_rows = replace(rows, catalog=rows.catalog + ".other")
        want = [keys]
    elif stale == "model_row":
        plan.block_rows = replace(rows, created={**rows.created, "e1": "1999-01-01T00:00:00"})
        want = [[k for k in keys if k[0] == "e1"]]
    else:
        plan.block_rows = replace(rows, rows=rows.rows[1:])
        first = rows.rows[0]
        want = [[(first[0], first[1], first[2])]]
    calls = _named_queries(monkeypatch)
    prep = prepare(fam, plan)
    assert calls == want
    assert prep.selected == prepare(fam, replace(plan, block_rows=None)).selected


@pytest.mark.parametrize("experts", ["e0,e1,d", "e1,d"])
def test_input_dtype_is_the_promotion_of_every_full_experts_tensor(fam: Catalog,
                                                                   experts: str) -> None:
    """F32 where a full expert's dtype differs from the base's (e0's F32_TENSOR; d, a delta
    checkpoint in float32, does not count), else the base's: computed from every tensor row,
    the plan's or not (here the plan reads nothing of F32_TENSOR)."""
    plan = _plan(fam, experts=experts, semantics="mergekit", compute_dtype="files")
    plan.blocks = [b for b in plan.blocks if b.tensor != F32_TENSOR]  # the executor runs any plan
    prep = prepare(fam, plan)
    assert all(b.tensor != F32_TENSOR for e in prep.experts for b in e.blocks.values())
    merger = ChunkMerger(prep)
    rows = {m: {t.name: t.dtype for t in model_tensors(fam, m)} for m in ("base", "e0", "e1")}
    full = [m for m in experts.split(",") if m != "d"]
    for tensor, dtype in rows["base"].items():
        want = "F32" if any(rows[m][tensor] != dtype for m in full) else dtype
        assert merger.input_dtype(tensor) == HF_DTYPE_NAMES[want]
    assert (merger.input_dtype(F32_TENSOR) == "float32") == ("e0" in full)
    assert merger.input_dtype("model.norm.weight") == "bfloat16"


def test_the_vocabulary_check_refuses_the_resized_tensors_of_full_experts(
        catalog: Catalog, tmp_path: Path) -> None:
    """check_vocab_rows, on the tensor rows the merge reads anyway: an expert whose embeddings
    have more rows than the base's is refused naming it and the first such tensor; a LoRA
    adapter (its lora_B has its own shape) and an expert with the base's shapes pass."""
    base = factory.make_base(tmp_path / "base", seed=0)
    same = factory.make_expert(base, tmp_path / "same", seed=1)
    weights = factory.load(base)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        weights[name] = torch.cat([weights[name], torch.zeros(4, 32)])
    wide = factory.save_checkpoint(tmp_path / "wide", weights)
    lora = factory.make_lora(base, tmp_path / "lora", seed=2)
    from mergepipe.catalog.ingest import ingest_model

    ingest_model(catalog, base, "base", block_bytes=BLOCK)
    ingest_model(catalog, same, "same", base="base")
    ingest_model(catalog, wide, "wide", base="base")
    ingest_model(catalog, lora, "lora", base="base", kind="lora")

    def check(experts: str) -> None:
        req = build_request(base="base", experts=experts, operator="linear")
        check_vocab_rows(req, read_inputs(catalog, ["base", *experts.split(",")]))

    check("lora,same")
    first = next(t.name for t in model_tensors(catalog, "wide")
                 if t.name in ("model.embed_tokens.weight", "lm_head.weight"))
    with pytest.raises(InvalidRequest, match=rf"experts\[2\]\.model: expert 'wide': tensor "
                       rf"'{first}' has 68 rows, 64 in the base 'base'") as e:
        check("lora,same,wide")
    assert e.value.field == "experts[2].model"


def _request(cat: Catalog, experts: str = "e0,e1,d") -> MergeRequest:
    return check_inputs(cat, build_request(base="base", experts=experts, operator="ties",
                                           budget=0.3))


def test_planning_beside_the_input_reads_prepares_what_planning_then_preparing_does(
        fam: Catalog) -> None:
    """plan_and_prepare reads the models' rows on a second connection while the planner runs:
    the same plan, rows, selection and promotion as the two in turn."""
    req = _request(fam)
    beside = plan_and_prepare(fam, req)
    in_turn = prepare(fam, choose_plan(fam, req))
    assert beside.plan.plan_hash == in_turn.plan.plan_hash
    assert beside.selected == in_turn.selected and beside.promoted == in_turn.promoted
    for a, b in zip([beside.base, *beside.experts], [in_turn.base, *in_turn.experts],
                    strict=True):
        assert (a.files, a.tensors, a.blocks, a.complete) == (b.files, b.tensors, b.blocks,
                                                              b.complete)


@pytest.mark.parametrize(("fails", "raised"), [
    ("vocab", "refused beside"), ("planner", "refused by the planner"),
    ("vocab,planner", "refused beside"), ("read", "read failed"),
    ("read,planner", "refused by the planner")])
def test_a_refusal_beside_the_planner_comes_first(fam: Catalog, monkeypatch: pytest.MonkeyPatch,
                                                  fails: str, raised: str) -> None:
    """The order of errors is the one of the steps run in turn: the vocabulary check's refusal
    before the planner's (also when both fail), the planner's before the executor's reads."""
    req = _request(fam)

    def failing(message: str) -> Any:
        def fail(*args: Any) -> Any:
            raise InvalidRequest(message)
        return fail

    if "vocab" in fails:
        monkeypatch.setattr(merge_module, "check_vocab_rows", failing("refused beside"))
    if "read" in fails:
        monkeypatch.setattr(stream, "read_inputs", failing("read failed"))
    if "planner" in fails:
        monkeypatch.setattr(merge_module, "choose_plan", failing("refused by the planner"))
    with pytest.raises(InvalidRequest, match=raised):
        plan_and_prepare(fam, req)


def test_the_reads_beside_the_planner_run_in_the_callers_confinement(
        fam: Catalog, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The second connection's work sees the caller's confinement roots (a worker confined to
    its data roots stays confined there)."""
    seen: list[tuple[str, ...] | None] = []
    real = stream.read_inputs

    def spy(cat: Catalog, names: Any) -> Any:
        seen.append(current_roots())
        return real(cat, names)

    monkeypatch.setattr(stream, "read_inputs", spy)
    with confined([tmp_path]):
        plan_and_prepare(fam, _request(fam))
    assert seen == [(str(tmp_path.resolve()),)]
