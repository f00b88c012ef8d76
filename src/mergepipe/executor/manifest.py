"""manifest.json: the document published beside a merge's output (request, plan, I/O, lineage)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.models import model_block_hashes
from mergepipe.catalog.records import LineageEdge, lineage_edges
from mergepipe.core.jsonable import jsonable
from mergepipe.executor.stream import ExecutionResult, Prepared
from mergepipe.executor.writer import write_json
from mergepipe.planner.incremental import previous_of, strategy_of, user_request
from mergepipe.planner.plan import Plan
from mergepipe.storage.store_types import Stamp

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "mergepipe-manifest/1"
TOUCHED_COLUMNS = ["model", "tensor", "block_index", "nbytes", "utility", "rank"]


def input_digest(cat: Catalog, prep: Prepared, model: str) -> str:
    """sha256 over a model's (tensor, block, content hash) rows: what the merge read from."""
    src = prep.base if model == prep.base.name else next(
        e for e in prep.experts if e.name == model)
    rows = (sorted((t, bi, b.content_hash) for (t, bi), b in src.blocks.items())
            if src.complete else sorted(model_block_hashes(cat, src.name)))
    h = hashlib.sha256()
    for tensor, bi, content_hash in rows:
        h.update(f"{tensor}\0{bi}\0{content_hash}\n".encode())
    return h.hexdigest()


def io_figures(prep: Prepared, result: ExecutionResult) -> dict[str, Any]:
    """Budget, expert bytes (full, planned, read), base bytes, bounds and predicted deviation."""
    plan = prep.plan
    return {
        "budget_bytes": plan.budget_bytes,
        "full_read_bytes": plan.full_read_bytes,
        "planned_expert_bytes": prep.planned_bytes,
        "expert_bytes_read": result.expert_bytes_read,
        "base_bytes_read": result.base_bytes_read,
        "omission_bound": plan.omission_bound,
        "omission_bound_l2": plan.omission_bound_l2,
        "predicted_deviation": plan.predicted_deviation,
    }


def merge_lineage(plan: Plan, output_name: str) -> list[LineageEdge]:
    """The output's lineage rows: base and experts as asked (and the reused merge, weight c)."""
    edges = lineage_edges(user_request(plan), output_name)
    previous = previous_of(plan)
    if previous is not None:
        edges.append(LineageEdge(output_name, previous[1], "previous", previous[2]))
    return edges


def tensor_entries(tensors: Iterable[Any]) -> list[dict[str, Any]]:
    """The output tensors as a manifest lists them (rows with name, file, dtype, shape, hash)."""
    return [{"name": t.name, "file": t.file, "dtype": t.dtype, "shape": list(t.shape),
             "content_hash": t.content_hash} for t in tensors]


def lineage_entries(edges: Iterable[LineageEdge]) -> list[dict[str, Any]]:
    """The output's lineage edges as a manifest lists them."""
    return [{"child": e.child, "parent": e.parent, "role": e.role, "weight": e.weight}
            for e in edges]


def build_manifest(cat: Catalog, *, merge_id: str | None, prep: Prepared, result: ExecutionResult,
                   output_name: str | None, output_path: Path | str, plan_seconds: float | None,
                   wall_seconds: float | None = None) -> dict[str, Any]:
    """The manifest.json document: request, plan, access set, realized I/O, outputs, lineage."""
    plan = prep.plan
    req = plan.request
    asked = user_request(plan)
    densities = req.densities()
    fallback = set(plan.fallback_experts)
    lineage: list[LineageEdge] = merge_lineage(plan, output_name) if output_name else []
    return dict(jsonable({
        "format": MANIFEST_FORMAT,
        "merge_id": merge_id,
        "request": asked.to_dict(),
        "executed": {"strategy": strategy_of(plan), "request": req.to_dict()},
        "operator": asked.operator,
        "params": asked.params,
        "seed": asked.seed,
        "plan_hash": plan.plan_hash,
        "plan": plan.document(),
        **io_figures(prep, result),
        "inputs": [{"model": m.name, "role": "base" if m is prep.base else "expert",
                    "kind": m.kind, "path": m.path,
                    "blocks_digest": input_digest(cat, prep, m.name),
                    "files": [file_entry(f.path, f.stamp) for f in m.files.values()]}
                   for m in (prep.base, *prep.experts)],
        "experts": [{"position": i, "model": e.model, "weight": e.weight,
                     "density": densities[i], "fallback": e.model in fallback,
                     "planned_bytes": prep.planned_by_model[e.model],
                     "bytes_read": result.expert_bytes_by_model.get(e.model, 0),
                     "requests": result.expert_fetch_by_model.get(e.model, {}).get("requests", 0),
                     "retries": result.expert_fetch_by_model.get(e.model, {}).get("retries", 0)}
                    for i, e in enumerate(req.experts)],
        "touched_blocks": {"columns": TOUCHED_COLUMNS, "rows": [list(b) for b in plan.blocks]},
        "output": {"name": output_name, "path": str(output_path), "hash": result.output_hash,
                   "extra_files": result.extra_files,
                   "left_out_files": result.left_out_files,
                   "tensors": tensor_entries(result.tensors)},
        "lineage": lineage_entries(lineage),
        "timings": {"plan_seconds": plan_seconds, "exec_seconds": result.exec_seconds,
                    "wall_seconds": wall_seconds},
        "blocks_total": result.blocks_total,
        "expert_blocks_read": result.expert_blocks_read,
    }))


def file_entry(path: str, s: Stamp) -> dict[str, Any]:
    """An input file as the manifest and a passthrough plan record it."""
    out: dict[str, Any] = {"path": path, "size": s.size, "mtime_ns": s.mtime_ns}
    out.update({k: v for k, v in (("etag", s.etag), ("version_id", s.version_id)) if v})
    return out


def write_manifest(out_dir: Path, manifest: Mapping[str, Any]) -> Path:
    path = Path(out_dir) / MANIFEST_FILE
    write_json(path, manifest)
    return path
