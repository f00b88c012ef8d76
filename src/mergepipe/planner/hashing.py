"""The plan hash: sha256 of canonical JSON of what decides a merge's reads and output."""

from __future__ import annotations

import hashlib
import json
from typing import Any

HASH_VERSION = 1  # bump when the hashed document changes shape


def canonical_json(obj: Any) -> bytes:
    """Sorted keys, no whitespace, ASCII, no NaN: the same bytes on every run and machine."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode()


def plan_hash(*, request: dict[str, Any], budget_bytes: int, base_content: str,
              experts: list[dict[str, Any]], trims: list[list[Any]], access: str,
              unit: str = "expert_block", tensor_params: list[Any] | None = None,
              calibration: str | None = None) -> str:
    """sha256 of the canonical JSON of: the normalized request, the resolved budget, the digest
    of the base's block content hashes, each expert's identity (kind, LoRA scale, statistics,
    lora_A content hashes),
    the trim thresholds of the touched tensors, and the digest of the access set (model, tensor,
    block_index, content_hash of every selected block in rank order; computed in SQL).
    The planning unit is hashed when it is not "expert_block" (whose plans hash as before it
    existed); the per-tensor parameter values when the request has any; the calibration id
    (a digest of its values) when the plan ranked with one (utility=activation).
    No timestamps, paths or computed floats: stored values only (floats print as shortest repr)."""
    doc = {
        "version": HASH_VERSION,
        "request": request,
        "budget_bytes": budget_bytes,
        "base_content": base_content,
        "experts": experts,
        "trims": trims,
        "access": access,
    }
    if unit != "expert_block":
        doc["unit"] = unit
    if tensor_params:
        doc["tensor_params"] = tensor_params
    if calibration is not None:
        doc["calibration"] = calibration
    return hashlib.sha256(canonical_json(doc)).hexdigest()
