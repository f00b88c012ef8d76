"""Replay: re-execute a merge's stored access set and compare the output tensor hashes."""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import Conflict
from mergepipe.core.request import MergeRequest, build_request
from mergepipe.executor import manifest, publish, stream


@dataclass(frozen=True)
class StoredTrim:
    """A TIES trim threshold as recorded in the merge's plan document."""

    tau: float
    above: int
    tied: int
    k: int


@dataclass(frozen=True)
class StoredBlock:
    """One touched block as recorded in touched_blocks."""

    model: str
    tensor: str
    block_index: int
    nbytes: int
    utility: float
    rank: int


@dataclass
class StoredPlan:
    """A plan rebuilt from the catalog rows of a merge (satisfies stream.PlanLike)."""

    request: MergeRequest
    plan_hash: str
    budget_bytes: int
    full_read_bytes: int | None
    omission_bound: float | None
    blocks: list[StoredBlock]
    trims: dict[tuple[str, str], StoredTrim]
    fallback_experts: list[str] = field(default_factory=list)
    document: dict[str, Any] = field(default_factory=dict)

    @property
    def omission_bound_l2(self) -> float | None:
        """The plan's tighter bound, from the stored plan document (None for older records)."""
        v = self.document.get("omission_bound_l2")
        return None if v is None else float(v)

    def summary(self) -> dict[str, Any]:
        return {k: v for k, v in self.document.items() if k != "trims"}


def request_from_dict(d: dict[str, Any]) -> MergeRequest:
    """Rebuild (and re-validate) a request stored by MergeRequest.to_dict()."""
    return build_request(base=d["base"], experts=list(d["experts"]), operator=d["operator"],
                         params=d.get("params"), budget=d.get("budget"), seed=d.get("seed", 0),
                         output_dtype=d.get("output_dtype"))


def stored_plan(cat: Catalog, merge_id: str) -> StoredPlan:
    """The access set, trims and budget a merge executed, from its catalog rows."""
    row = manifest.get_merge(cat, merge_id)
    if row["plan_hash"] is None or row["plan"] is None:
        raise Conflict(f"merge {merge_id} was never planned (status {row['status']}); nothing "
                       "to replay", field="merge_id")
    doc = row["plan"]
    blocks = [StoredBlock(str(r["model"]), str(r["tensor"]), int(r["block_index"]),
                          int(r["nbytes"]), float(r["utility"]), int(r["rank"]))
              for r in manifest.touched_blocks(cat, merge_id)]
    trims = {(t["model"], t["tensor"]): StoredTrim(
        math.inf if t["tau"] is None else float(t["tau"]), int(t["above"]), int(t["tied"]),
        int(t["k"])) for t in doc.get("trims", [])}
    fallback = [e["model"] for e in manifest.merge_experts(cat, merge_id) if e["fallback"]]
    return StoredPlan(request_from_dict(row["request"]), str(row["plan_hash"]),
                      int(row["budget_bytes"]), row["full_read_bytes"], row["omission_bound"],
                      blocks, trims, fallback, doc)


def replay(cat: Catalog, merge_id: str, output_dir: Path | None = None, *,
           threads: int | None = None,
           progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Re-run the stored access set into `output_dir` (default: a temporary directory that is
    removed afterwards) and report, per tensor, whether the output hash matches the stored one."""
    t0 = time.perf_counter()
    row = manifest.get_merge(cat, merge_id)
    if row["status"] != "succeeded":
        raise Conflict(f"merge {merge_id} is {row['status']}; only succeeded merges can be "
                       "replayed", field="merge_id")
    plan = stored_plan(cat, merge_id)
    expected = manifest.output_tensors(cat, merge_id)
    prep = stream.prepare(cat, plan)
    tmp_root = None
    if output_dir is None:
        tmp_root = Path(tempfile.mkdtemp(prefix=f"mergepipe-replay-{merge_id}-"))
        target = tmp_root / "output"
    else:
        target = Path(output_dir).absolute()
    try:
        with publish.staged(target, f"replay-{merge_id[2:]}") as stage:
            result = stream.execute(prep, stage, threads=threads, progress=progress)
            manifest.write_manifest(stage, manifest.build_manifest(
                merge_id=merge_id, prep=prep, result=result, output_name=None,
                output_path=target, plan_seconds=None))
    finally:
        if tmp_root is not None:
            shutil.rmtree(tmp_root, ignore_errors=True)
    actual = {t.name: t.content_hash for t in result.tensors}
    tensors = [{"tensor": name, "expected": expected.get(name), "actual": actual.get(name),
                "match": expected.get(name) == actual.get(name)}
               for name in sorted(expected.keys() | actual.keys())]
    mismatches = [t["tensor"] for t in tensors if not t["match"]]
    return {
        "merge_id": merge_id, "match": not mismatches and result.output_hash == row["output_hash"],
        "plan_hash": plan.plan_hash, "expected_output_hash": row["output_hash"],
        "output_hash": result.output_hash, "n_tensors": len(tensors),
        "mismatched_tensors": mismatches, "tensors": tensors,
        "expert_bytes_read": result.expert_bytes_read,
        "base_bytes_read": result.base_bytes_read, "budget_bytes": plan.budget_bytes,
        "output": None if tmp_root is not None else str(target),
        "wall_seconds": time.perf_counter() - t0}
