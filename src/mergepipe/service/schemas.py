"""Request and response bodies of the HTTP API (pydantic); they are also the OpenAPI schema."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# The request bodies are the core's request schema: one path of validation for the API, the CLI
# and mergekit configs.
from mergepipe.core.schema import In as _In
from mergepipe.core.schema import MergeIn, ModelIn, PlanIn, Ref

__all__ = ["MergeIn", "ModelIn", "PlanIn"]


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


class SqlIn(_In):
    sql: str = Field(min_length=1, max_length=100_000)


# The most tokens one POST /v1/compare reads: the request runs while the client waits.
MAX_COMPARE_TOKENS = 8192


class CompareIn(_In):
    """Two registered models and a text: POST /v1/compare."""

    model_a: Ref
    model_b: Ref
    text: str = Field(min_length=1, max_length=1_000_000)
    tokens: int = Field(2048, strict=True, ge=2, le=MAX_COMPARE_TOKENS,
                        description="read at most this many tokens of the text")
    tokenizer: Ref | None = Field(None, description="the model whose tokenizer to use "
                                                    "(default: model_a's, else model_b's)")


# -- responses --------------------------------------------------------------------------------
class Progress(_Out):
    done: int
    total: int
    unit: Literal["bytes", "blocks"]


class IngestJobOut(_Out):
    id: str
    kind: Literal["ingest"] = "ingest"
    model: str
    status: Literal["queued", "running", "succeeded", "failed"]
    progress: Progress
    error: str | None = None


class ModelOut(_Out):
    name: str
    status: Literal["ingesting", "ready", "failed"]
    kind: str
    path: str
    base: str | None = None
    error: str | None = None
    source_merge: str | None = None  # the merge whose output it is (None: ingested)
    job: IngestJobOut | None = None
    delta_rel_norm: float | None = Field(
        None, description="an expert's ||E - B|| / ||B|| (a fine-tune: about 0.001 to 0.1)")
    delta_rel_norm_max: float | None = Field(None, description="the largest ratio of one tensor")


class ModelList(_Out):
    models: list[ModelOut]


class ModelRemoved(_Out):
    name: str
    retired: list[str]  # the version keys retired
    deleted: list[str]  # merge output directories deleted (delete_files)
    kept: list[str]     # directories not deleted, with why


class MergeAccepted(_Out):
    id: str
    status: str


class MergeOut(_Out):
    id: str
    merge_id: str
    status: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    operator: str
    base: str
    progress: Progress
    error: str | None = None


class MergeList(_Out):
    merges: list[MergeOut]


class TouchedBlock(_Out):
    model: str
    tensor: str
    block_index: int
    nbytes: int
    utility: float
    rank: int


class TouchedPage(_Out):
    merge_id: str
    total: int
    limit: int
    offset: int
    next_cursor: str | None
    blocks: list[TouchedBlock]


class LineageEdge(_Out):
    child: str
    parent: str
    role: str
    weight: float | None
    merge_id: str
    depth: int


class LineageOut(_Out):
    name: str
    ancestors: list[LineageEdge]
    descendants: list[LineageEdge]
    depth: int


class SqlOut(_Out):
    columns: list[str]
    rows: list[list[Any]]
    truncated: bool


class Health(_Out):
    status: Literal["ok"]
    workers: int
    queued: int
    running: int


class TensorShare(_Out):
    model: str
    tensor: str
    ordinal: int
    tensor_bytes: int | None
    blocks: int | None
    read_bytes: int
    read_blocks: int
    share: float | None


class TensorShares(_Out):
    merge_id: str
    base: str
    experts: list[str]
    tensors: list[TensorShare]


class IdenticalTensors(_Out):
    merge_id: str
    reference: str
    tensors: int
    identical: int


class ModelStats(_Out):
    name: str
    n_blocks: int
    delta_l2: float | None
    delta_l1: float | None
    delta_max_abs: float | None
    delta_nnz: int | None
    numel: int | None
    lineage_depth: int


class ModelStatsList(_Out):
    models: list[ModelStats]


class CompareOut(_Out):
    model_a: str
    model_b: str
    tokenizer: str
    tokens: int
    positions: int
    windows: int
    context: int
    kl: float
    perplexity_a: float
    perplexity_b: float
    seconds: float


class OperatorParam(_Out):
    name: str
    type: Literal["bool", "float", "str"]
    default: bool | float | str
    choices: list[str]
    help: str


class OperatorOut(_Out):
    name: str
    aliases: list[str]
    title: str
    formula: str
    additive: bool
    density: bool
    normalize_default: bool
    params: list[OperatorParam]


class OperatorList(_Out):
    operators: list[OperatorOut]


class CalibrationIn(_In):
    """POST /v1/calibrations: run a registered base over a calibration text."""

    base: Ref
    text: str = Field(min_length=1, max_length=4_000_000)
    tokens: int = Field(2048, ge=1, le=1_000_000)


class CalibrationOut(_Out):
    calibration_id: str
    model: str
    text_sha256: str
    tokens: int
    fallback_rms: float
    created_at: str | None
