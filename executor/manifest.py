"""The record of a merge: catalog rows (merges, experts, touched blocks, outputs, lineage) and manifest.json."""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from mergepipe.catalog.db import Catalog, load_sql, register_sql_package
from mergepipe.executor.stream import ExecutionResult, PlanLike, Prepared

from mergepipe.core.errors import Conflict, NotFound
from mergepipe.core.request import MergeRequest

register_sql_package("mergepipe.executor")

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "mergepipe-manifest/1"
TOUCHED_COLUMNS = ["model", "tensor", "block_index", "nbytes", "utility", "rank"]


def new_merge_id() -> str:
    """'m-' + 12 hex digits."""
    return "m-" + uuid.uuid4().hex[:12]


def jsonable(v: Any) -> Any:
    """Plain JSON values (non-finite floats become null, tuples lists)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, Mapping):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple | set):
        return [jsonable(x) for x in v]
    if v is None or isinstance(v, bool | int | str):
        return v
    return str(v)


def dumps(v: Any) -> str:
    return json.dumps(jsonable(v), separators=(",", ":"), allow_nan=False)


def plan_document(plan: PlanLike) -> dict[str, Any]:
    """The plan summary plus the TIES trims, enough to re-execute the access set exactly."""
    summary = plan.summary() if hasattr(plan, "summary") else {}
    doc = dict(jsonable(summary))
    doc["plan_hash"] = plan.plan_hash
    doc["trims"] = [
        {"model": m, "tensor": t, "tau": None if math.isinf(tr.tau) else float(tr.tau),
         "above": int(tr.above), "tied": int(tr.tied), "k": int(tr.k)}
        for (m, t), tr in sorted(plan.trims.items())]
    return doc


# -- catalog rows --------------------------------------------------------------------------------
def insert_queued(cat: Catalog, merge_id: str, request: MergeRequest, output_name: str,
                  output_path: Path) -> None:
    """The merge row, status 'queued'; refuses an output name that exists or is pending."""
    if cat.query("model_exists", {"name": output_name})[0][0]:
        raise Conflict(f"a model named {output_name!r} already exists; choose another output "
                       "name", field="output.name")
    pending = cat.query("merge_output_pending", {"output_name": output_name})
    if pending:
        raise Conflict(f"merge {pending[0][0]} is already producing {output_name!r}",
                       field="output.name")
    cat.execute("merge_insert", {
        "merge_id": merge_id, "operator": request.operator, "base": request.base,
        "request": dumps(request.to_dict()), "params": dumps(request.params),
        "seed": request.seed, "output_name": output_name, "output_path": str(output_path)})


def get_merge(cat: Catalog, merge_id: str) -> dict[str, Any]:
    """The merges row as a dict (request, params and plan parsed); NotFound if absent."""
    rows = cat.query("merge_get", {"merge_id": merge_id})
    if not rows:
        raise NotFound(f"merge {merge_id!r} not found", field="merge_id")
    d = dict(rows[0]._mapping)
    for k in ("request", "params", "plan"):
        if isinstance(d.get(k), str):
            d[k] = json.loads(d[k])
    return d


def mark_running(cat: Catalog, merge_id: str) -> dict[str, Any]:
    """queued -> running; Conflict if the merge is not queued."""
    row = get_merge(cat, merge_id)
    if row["status"] != "queued":
        raise Conflict(f"merge {merge_id} is {row['status']}, not queued", field="merge_id")
    cat.execute("merge_start", {"merge_id": merge_id})
    return row


def record_plan(cat: Catalog, merge_id: str, prep: Prepared, plan_seconds: float,
                blocks_total: int) -> None:
    """Plan fields, per-expert planned bytes and the access set, in one transaction."""
    plan = prep.plan
    req = plan.request
    fallback = set(getattr(plan, "fallback_experts", []) or [])
    densities = req.densities()
    with cat.transaction() as conn:
        conn.execute(load_sql("merge_planned"), {
            "merge_id": merge_id, "plan_hash": plan.plan_hash, "plan": dumps(plan_document(plan)),
            "budget_bytes": plan.budget_bytes,
            "full_read_bytes": getattr(plan, "full_read_bytes", None),
            "planned_expert_bytes": prep.planned_bytes,
            "omission_bound": jsonable(getattr(plan, "omission_bound", None)),
            "blocks_total": blocks_total, "plan_seconds": plan_seconds})
        conn.execute(load_sql("merge_experts_insert"), {
            "merge_id": merge_id, "positions": list(range(len(req.experts))),
            "models": [e.model for e in req.experts], "weights": [e.weight for e in req.experts],
            "densities": [densities[i] if req.operator in ("ties", "dare_linear", "dare_ties")
                          else None for i in range(len(req.experts))],
            "planned_bytes": [prep.planned_by_model[e.model] for e in req.experts],
            "fallbacks": [e.model in fallback for e in req.experts]})
        rows = touched_rows(plan)
        if rows:
            cols = list(zip(*rows, strict=True))
            conn.execute(load_sql("touched_blocks_insert"), {
                "merge_id": merge_id, "models": list(cols[0]), "tensors": list(cols[1]),
                "block_indexes": list(cols[2]), "nbytes": list(cols[3]),
                "utilities": [float(u) for u in cols[4]], "ranks": list(cols[5])})


def touched_rows(plan: PlanLike) -> list[tuple[str, str, int, int, float, int]]:
    """The access set as (model, tensor, block_index, nbytes, utility, rank) in rank order."""
    out = []
    for i, b in enumerate(plan.blocks):
        out.append((b.model, b.tensor, int(b.block_index), int(b.nbytes),
                    float(getattr(b, "utility", 0.0)), int(getattr(b, "rank", i))))
    return out


def record_progress(cat: Catalog, merge_id: str, info: Mapping[str, Any]) -> None:
    cat.execute("merge_progress", {"merge_id": merge_id, "blocks_done": info["blocks_done"],
                                   "expert_bytes_read": info["expert_bytes_read"],
                                   "base_bytes_read": info["base_bytes_read"]})


def record_success(conn: sa.Connection, merge_id: str, request: MergeRequest, output_name: str,
                   output_path: Path, result: ExecutionResult) -> None:
    """Realized I/O, output tensor hashes, lineage and status 'succeeded' (caller's transaction)."""
    conn.execute(load_sql("merge_succeeded"), {
        "merge_id": merge_id, "expert_bytes_read": result.expert_bytes_read,
        "base_bytes_read": result.base_bytes_read, "output_hash": result.output_hash,
        "output_path": str(output_path), "exec_seconds": result.exec_seconds})
    for model, n in result.expert_bytes_by_model.items():
        conn.execute(load_sql("merge_experts_read"),
                     {"merge_id": merge_id, "model": model, "bytes_read": n})
    if result.tensors:
        conn.execute(load_sql("output_tensors_insert"), {
            "merge_id": merge_id, "tensors": [t.name for t in result.tensors],
            "dtypes": [t.dtype for t in result.tensors],
            "shapes": [list(t.shape) for t in result.tensors],
            "hashes": [t.content_hash for t in result.tensors]})
    for edge in lineage_edges(request, output_name):
        conn.execute(load_sql("lineage_insert"), {**edge, "merge_id": merge_id})


def record_failure(cat: Catalog, merge_id: str, error: str, exec_seconds: float | None) -> None:
    cat.execute("merge_failed", {"merge_id": merge_id, "error": error[:4000],
                                 "exec_seconds": exec_seconds})


def lineage_edges(request: MergeRequest, child: str) -> list[dict[str, Any]]:
    """child -> base (role base) and child -> each expert (role expert, its weight)."""
    edges: list[dict[str, Any]] = [
        {"child": child, "parent": request.base, "role": "base", "weight": None}]
    edges += [{"child": child, "parent": e.model, "role": "expert", "weight": e.weight}
              for e in request.experts]
    return edges


def output_tensors(cat: Catalog, merge_id: str) -> dict[str, str]:
    """tensor -> stored content hash of a merge's output."""
    return {str(r.tensor): str(r.content_hash)
            for r in cat.query("output_tensors_get", {"merge_id": merge_id})}


def touched_blocks(cat: Catalog, merge_id: str) -> list[dict[str, Any]]:
    return [dict(r._mapping) for r in cat.query("touched_blocks_get", {"merge_id": merge_id})]


def merge_experts(cat: Catalog, merge_id: str) -> list[dict[str, Any]]:
    return [dict(r._mapping) for r in cat.query("merge_experts_get", {"merge_id": merge_id})]


# -- manifest.json -------------------------------------------------------------------------------
def input_digest(prep: Prepared, model: str) -> str:
    """sha256 over a model's (tensor, block, content hash) rows: what the merge read from."""
    src = prep.base if model == prep.base.name else next(
        e for e in prep.experts if e.name == model)
    h = hashlib.sha256()
    for (tensor, bi), blk in sorted(src.blocks.items()):
        h.update(f"{tensor}\0{bi}\0{blk.content_hash}\n".encode())
    return h.hexdigest()


def io_figures(prep: Prepared, result: ExecutionResult) -> dict[str, Any]:
    """Budget, full / planned / realized expert bytes, base bytes and the omission bounds."""
    plan = prep.plan
    return {
        "budget_bytes": plan.budget_bytes,
        "full_read_bytes": getattr(plan, "full_read_bytes", None),
        "planned_expert_bytes": prep.planned_bytes,
        "expert_bytes_read": result.expert_bytes_read,
        "base_bytes_read": result.base_bytes_read,
        "omission_bound": getattr(plan, "omission_bound", None),
        "omission_bound_l2": getattr(plan, "omission_bound_l2", None),
    }


def build_manifest(*, merge_id: str | None, prep: Prepared, result: ExecutionResult,
                   output_name: str | None, output_path: Path, plan_seconds: float | None,
                   wall_seconds: float | None = None) -> dict[str, Any]:
    """The manifest.json document: request, plan, access set, realized I/O, outputs, lineage."""
    plan = prep.plan
    req = plan.request
    densities = req.densities()
    fallback = set(getattr(plan, "fallback_experts", []) or [])
    return jsonable({
        "format": MANIFEST_FORMAT,
        "merge_id": merge_id,
        "request": req.to_dict(),
        "operator": req.operator,
        "params": req.params,
        "seed": req.seed,
        "plan_hash": plan.plan_hash,
        "plan": plan_document(plan),
        **io_figures(prep, result),
        "inputs": [{"model": m.name, "role": "base" if m is prep.base else "expert",
                    "kind": m.kind, "path": m.path, "blocks_digest": input_digest(prep, m.name),
                    "files": [{"path": f.path, "size": f.size, "mtime_ns": f.mtime_ns}
                              for f in m.files.values()]}
                   for m in (prep.base, *prep.experts)],
        "experts": [{"position": i, "model": e.model, "weight": e.weight,
                     "density": densities[i], "fallback": e.model in fallback,
                     "planned_bytes": prep.planned_by_model[e.model],
                     "bytes_read": result.expert_bytes_by_model.get(e.model, 0)}
                    for i, e in enumerate(req.experts)],
        "touched_blocks": {"columns": TOUCHED_COLUMNS, "rows": touched_rows(plan)},
        "output": {"name": output_name, "path": str(output_path), "hash": result.output_hash,
                   "extra_files": result.extra_files,
                   "tensors": [{"name": t.name, "file": t.file, "dtype": t.dtype,
                                "shape": list(t.shape), "content_hash": t.content_hash}
                               for t in result.tensors]},
        "lineage": lineage_edges(req, output_name) if output_name else [],
        "timings": {"plan_seconds": plan_seconds, "exec_seconds": result.exec_seconds,
                    "wall_seconds": wall_seconds},
        "blocks_total": result.blocks_total,
        "expert_blocks_read": result.expert_blocks_read,
    })


def write_manifest(out_dir: Path, manifest: Mapping[str, Any]) -> Path:
    from mergepipe.executor.writer import write_json
    path = Path(out_dir) / MANIFEST_FILE
    write_json(path, manifest)
    return path
