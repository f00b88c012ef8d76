"""The streaming executor end to end on tiny real checkpoints: numbers, layout, budget, drift, atomicity."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import BudgetViolation, Conflict, SourceChanged
from mergepipe.core.operators import BlockContext
from mergepipe.core.request import build_request
from mergepipe.executor import stream
from mergepipe.jobs.merge import execute_plan, merge
from mergepipe.planner.plan import Plan, PlannedBlock, make_plan
from mergepipe.storage.checkpoint import open_checkpoint
from tests import factory
from tests.catalogs import new_catalog
from tests.executor_family import additive_reference, ingest_family

EXPERTS = "e0,e1:0.5,e2:2"
MIXED = ("full", "delta", "lora")


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """Two ingested families that the tests below only read: 'base' (two shards, three full
    experts) and 'mbase' (single file; a full, a delta and a LoRA expert)."""
    root = tmp_path_factory.mktemp("shared")
    cat = Catalog(new_catalog(root))
    full = ingest_family(cat, root / "full", shards=2)
    mixed = ingest_family(cat, root / "mixed", kinds=MIXED, prefix="m", seed=1)
    yield {"cat": cat, "full": full, "mixed": mixed}
    cat.close()


def _outputs(d: Path) -> list[str]:
    """What merges left in `d`: outputs and (never) hidden temporary directories."""
    return sorted(p.name for p in d.iterdir() if p.name not in ("fam",)
                  and not p.name.startswith("catalog.duckdb"))


@pytest.mark.parametrize("family", ["full", "mixed"])
@pytest.mark.parametrize("op", ["linear", "task_arithmetic"])
def test_full_budget_equals_whole_tensor_merge(shared: dict, tmp_path: Path, op: str,
                                              family: str) -> None:
    paths = shared[family]
    kinds = ("full",) * 3 if family == "full" else MIXED
    p = "" if family == "full" else "m"
    req = build_request(base=f"{p}base", experts=EXPERTS.replace("e", f"{p}e"), operator=op,
                        budget=1.0, params={"lambda": 0.7}, output_dtype="F32")
    r = merge(shared["cat"], req, tmp_path / "out", output_name=f"{op}-{family}").to_dict()
    assert r["expert_bytes_read"] == r["planned_expert_bytes"] <= r["budget_bytes"]
    ref = additive_reference(paths, kinds, req.coefficients())
    out = factory.load(tmp_path / "out")
    assert out.keys() == ref.keys()
    for n, t in ref.items():
        torch.testing.assert_close(out[n], t, rtol=0, atol=2e-6, msg=n)


def test_default_output_dtype_is_the_bases_and_rounds_like_torch(shared: dict,
                                                                 tmp_path: Path) -> None:
    req = build_request(base="base", experts=EXPERTS, operator="linear", budget=1.0)
    merge(shared["cat"], req, tmp_path / "out", output_name="bf16")
    ref = additive_reference(shared["full"], ("full",) * 3, req.coefficients())
    got = factory.load(tmp_path / "out")
    assert {t.dtype for t in open_checkpoint(tmp_path / "out").tensors} == {"BF16"}
    for n, t in ref.items():
        # float32 rounding differences between block-wise and whole-tensor math can flip a
        # bf16 rounding: at most one bf16 ulp apart
        torch.testing.assert_close(got[n], t.to(torch.bfloat16).float(), rtol=2**-7, atol=1e-6,
                                   msg=n)


def test_output_keeps_the_bases_layout_and_extra_files(shared: dict, tmp_path: Path) -> None:
    paths = shared["full"]
    req = build_request(base="base", experts=EXPERTS, operator="ties", budget=0.5,
                        params={"density": 0.5}, output_dtype="F16")
    merge(shared["cat"], req, tmp_path / "out", output_name="layout")
    base, out = open_checkpoint(paths["base"]), open_checkpoint(tmp_path / "out")
    assert [os.path.basename(h.path) for h in out.files] == [
        os.path.basename(h.path) for h in base.files]
    assert [t.name for t in out.tensors] == [t.name for t in base.tensors]
    assert [t.shape for t in out.tensors] == [t.shape for t in base.tensors]
    assert {t.dtype for t in out.tensors} == {"F16"}
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {t.name: os.path.basename(t.file) for t in out.tensors}
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in out.tensors)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["torch_dtype"] == "float16"
    assert (tmp_path / "out" / "tokenizer.json").read_text() == '{"version": "1.0"}'
    assert (tmp_path / "out" / "manifest.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_unread_blocks_are_the_base_bit_for_bit(shared: dict, tmp_path: Path) -> None:
    catalog, paths = shared["cat"], shared["full"]
    req = build_request(base="base", experts=EXPERTS, operator="linear", budget=0.05)
    r = merge(catalog, req, tmp_path / "out", output_name="sparse").to_dict()
    touched = {(row.tensor, row.block_index) for row in catalog.query(SQL(
        "SELECT tensor, block_index FROM touched_blocks WHERE merge_id = :m"),
        {"m": r["merge_id"]})}
    grid = catalog.query(SQL("SELECT tensor, block_index, row_start, row_end FROM blocks "
                                 "WHERE model = 'base'"))
    base, out = factory.load(paths["base"]), factory.load(tmp_path / "out")
    untouched = [g for g in grid if (g.tensor, g.block_index) not in touched]
    assert untouched and len(untouched) < len(grid)
    for g in untouched:
        assert torch.equal(out[g.tensor][g.row_start:g.row_end],
                           base[g.tensor][g.row_start:g.row_end])


def test_budget_is_never_exceeded_and_checked_before_reading(shared: dict,
                                                            tmp_path: Path) -> None:
    catalog = shared["cat"]
    req = build_request(base="base", experts=EXPERTS, operator="linear", budget=1.0)
    rows = catalog.query(SQL("SELECT model, tensor, block_index, nbytes FROM blocks "
                                 "WHERE model IN ('e0', 'e1', 'e2') ORDER BY model, tensor, block_index"))
    blocks = [PlannedBlock(r.model, r.tensor, r.block_index, r.nbytes, 1.0, i)
              for i, r in enumerate(rows)]
    need = sum(b.nbytes for b in blocks)
    plan = Plan(req, "0" * 64, need - 1, need, need, blocks)
    with pytest.raises(BudgetViolation, match=f"needs {need} expert bytes, over its budget"):
        execute_plan(catalog, plan, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    plan.budget_bytes = need
    r = execute_plan(catalog, plan, tmp_path / "out").to_dict()  # any plan runs: e.g. a random one
    assert r["expert_bytes_read"] == need and r["merge_id"] is None


def test_changed_expert_file_is_refused_naming_model_and_file(catalog: Catalog,
                                                             tmp_path: Path) -> None:
    paths = ingest_family(catalog, tmp_path / "fam")
    f = paths["e1"] / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-2:] = bytes(b ^ 0x5A for b in data[-2:])
    f.write_bytes(bytes(data))  # other bytes, new mtime (a touch alone is re-verified, accepted)
    req = build_request(base="base", experts=EXPERTS, operator="linear", budget=1.0)
    with pytest.raises(SourceChanged, match=rf"model 'e1': file {f} changed after ingestion"):
        merge(catalog, req, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    row = catalog.query(SQL("SELECT status, error FROM merges"))[0]
    assert row.status == "failed" and "re-ingest 'e1'" in row.error


def test_corrupted_block_with_same_mtime_fails_the_content_hash(catalog: Catalog,
                                                               tmp_path: Path) -> None:
    paths = ingest_family(catalog, tmp_path / "fam")
    f = paths["e2"] / "model.safetensors"
    st = f.stat()
    data = bytearray(f.read_bytes())
    data[-3] ^= 0xFF  # a byte of the last tensor's data
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    req = build_request(base="base", experts=EXPERTS, operator="linear", budget=1.0)
    with pytest.raises(SourceChanged, match=r"model 'e2': tensor .* does not match the "
                                            r"catalog's content hash"):
        merge(catalog, req, tmp_path / "out")
    assert _outputs(tmp_path) == []


def test_failure_mid_way_leaves_no_output_and_no_temp_dir(shared: dict, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    catalog = shared["cat"]
    from mergepipe.core import operators
    calls = {"n": 0}
    real = operators.REGISTRY["linear"]

    def flaky(base: torch.Tensor, experts: list, ctx: BlockContext) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] == 20:
            raise RuntimeError("disk on fire")
        return real.kernel(base, experts, ctx)

    # a replaced kernel has no fused twin: every block runs `flaky`
    monkeypatch.setitem(operators.REGISTRY, "linear",
                        dataclasses.replace(real, kernel=flaky, fused=None))
    req = build_request(base="base", experts=EXPERTS, operator="linear", budget=1.0)
    with pytest.raises(RuntimeError, match="disk on fire"):
        merge(catalog, req, tmp_path / "out", output_name="fails")
    assert list(tmp_path.iterdir()) == []
    row = catalog.query(SQL("SELECT status, error FROM merges WHERE output_name = 'fails'"))[0]
    assert (row.status, row.error) == (
        "failed", "internal error during the merge (RuntimeError: disk on fire)")
    assert catalog.query(SQL("SELECT count(*) FROM models WHERE name = 'fails'"))[0][0] == 0


def test_existing_output_is_refused(shared: dict, tmp_path: Path) -> None:
    catalog = shared["cat"]
    req = build_request(base="base", experts=EXPERTS, operator="linear", budget=0.5)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("x")
    with pytest.raises(Conflict, match="not empty"):
        merge(catalog, req, tmp_path / "out")
    merge(catalog, req, tmp_path / "first")
    with pytest.raises(Conflict, match="model name 'first' is taken"):
        merge(catalog, req, tmp_path / "elsewhere", output_name="first")
    r = merge(catalog, req, tmp_path / "out", output_name="second", overwrite=True).to_dict()
    assert not (tmp_path / "out" / "mine.txt").exists() and r["output_name"] == "second"


def test_thread_count_and_chunking_do_not_change_the_output(shared: dict, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    req = build_request(base="base", experts=EXPERTS, operator="dare_ties", budget=0.6,
                        params={"density": 0.4}, seed=7)
    a = execute_plan(shared["cat"], make_plan(shared["cat"], req), tmp_path / "a", threads=1).to_dict()
    monkeypatch.setattr(stream, "CHUNK_BYTES", 1)  # one block per chunk
    b = execute_plan(shared["cat"], make_plan(shared["cat"], req), tmp_path / "b", threads=8).to_dict()
    assert a["output_hash"] == b["output_hash"] and a["plan_hash"] == b["plan_hash"]


def test_output_is_registered_and_can_be_merged_again(shared: dict, tmp_path: Path) -> None:
    catalog = shared["cat"]
    req = build_request(base="base", experts=EXPERTS, operator="ties", budget=0.5,
                        params={"density": 0.5})
    r = merge(catalog, req, tmp_path / "m1", output_name="m1").to_dict()
    m = catalog.query(SQL("SELECT kind, base, source_merge, has_stats, status FROM models "
                              "WHERE name = 'm1'"))[0]
    assert tuple(m) == ("full", "base", r["merge_id"], True, "ready")
    again = build_request(base="base", experts="m1,e2", operator="linear", budget=0.5)
    r2 = merge(catalog, again, tmp_path / "m2").to_dict()
    assert r2["expert_bytes_read"] <= r2["budget_bytes"]


def test_lora_with_rank_and_alpha_patterns_uses_each_modules_scale(tmp_path: Path) -> None:
    """rank_pattern / alpha_pattern give modules their own scale; the merge must apply each."""
    cat = Catalog(new_catalog(tmp_path))
    base = factory.make_base(tmp_path / "base", seed=3, dtype="F32")
    lora = factory.make_lora(base, tmp_path / "lora", seed=4, r=4, alpha=8.0,
                             rank_pattern={"layers.0.self_attn.q_proj": 2},
                             alpha_pattern={"v_proj": 3.0})
    from mergepipe.catalog.ingest import ingest_model
    ingest_model(cat, base, "pbase", block_bytes=512)
    ingest_model(cat, lora, "plora", base="pbase", kind="lora")
    req = build_request(base="pbase", experts="plora", operator="task_arithmetic", budget=1.0,
                        output_dtype="F32")
    merge(cat, req, tmp_path / "out", output_name="pout")
    cfg = json.loads((lora / "adapter_config.json").read_text())
    b, ad, out = factory.load(base), factory.load(lora / "adapter_model.safetensors"), \
        factory.load(tmp_path / "out")
    checked = 0
    for n, t in b.items():
        stem = n.removesuffix(".weight")
        a_key = f"base_model.model.{stem}.lora_A.weight"
        if a_key not in ad:
            torch.testing.assert_close(out[n], t, rtol=0, atol=0, msg=n)
            continue
        r = ad[a_key].shape[0]
        alpha = next((v for k, v in cfg["alpha_pattern"].items() if stem.endswith(k)),
                     cfg["lora_alpha"])
        want = t + (alpha / r) * (ad[f"base_model.model.{stem}.lora_B.weight"] @ ad[a_key])
        torch.testing.assert_close(out[n], want, rtol=0, atol=2e-6, msg=n)
        checked += 1
    assert checked == 4
    cat.close()
