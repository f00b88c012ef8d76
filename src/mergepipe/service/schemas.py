"""Request and response bodies of the HTTP API (pydantic); they are also the OpenAPI schema."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Name = Field(min_length=1, max_length=128, description="letters, digits, '.', '_', '-'")


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


# -- requests ---------------------------------------------------------------------------------
class ModelIn(_In):
    name: str = Name
    path: str = Field(min_length=1, max_length=4096,
                      description="checkpoint file or directory inside a data root "
                                  "(relative paths: relative to the first root)")
    kind: Literal["full", "delta", "lora"] = "full"
    base: str | None = Field(None, min_length=1, max_length=128,
                             description="the base model (omit to register a base)")
    block_bytes: int | None = Field(None, gt=0, le=64 << 20, strict=True,
                                    description="block size of the grid (bases only)")
    stats: bool = Field(True, description="compute delta statistics (false: header-only)")
    force: bool = Field(False, description="register an expert whose delta to its base is "
                                           "far larger than a fine-tune's (docs/catalog.md)")


class ExpertIn(_In):
    model: str = Name
    weight: float | None = Field(None, strict=True)  # strict: no "1" or true for a number
    density: float | None = Field(None, strict=True)


class BudgetIn(_In):
    # strict: "0.5" and true are refused, not coerced (a budget is a number); the ranges are
    # core.request's (field "budget")
    fraction: float | None = Field(None, strict=True,
                                   description="of the operator's full-read cost (above 1: "
                                               "the full read)")
    bytes: int | None = Field(None, strict=True, description="expert bytes, at most 2^63 - 1")

    @model_validator(mode="after")
    def _one(self) -> BudgetIn:
        if (self.fraction is None) == (self.bytes is None):
            raise ValueError('give exactly one of {"fraction": f} or {"bytes": n}')
        return self


class OutputIn(_In):
    name: str = Name
    dtype: Literal["F32", "F16", "BF16", "float32", "float16", "bfloat16"] | None = None


class PlanIn(_In):
    base: str | None = Field(None, min_length=1, max_length=128,
                             description="required unless config_yaml is given")
    experts: list[ExpertIn] | None = Field(None, min_length=1, max_length=256)
    operator: str | None = Field(None, min_length=1, max_length=64)
    params: dict[str, Any] | None = None
    budget: BudgetIn | None = Field(None, description="default: the full read")
    seed: int | None = Field(None, ge=0, lt=2**63, strict=True)
    strategy: Literal["scratch", "incremental", "auto"] = Field(
        "scratch", description="scratch (default): the standard merge, whatever merges the "
                               "catalog holds; incremental: extend a stored merge of the same "
                               "base and operator by the changed experts; auto: incremental "
                               "only when its plan is complete and reads fewer bytes")
    config_yaml: str | None = Field(
        None, min_length=1, max_length=1_000_000,
        description="a mergekit YAML config instead of base/experts/operator/params; its models "
                    "are registered names or paths in the data roots (ingested on the fly)")

    @model_validator(mode="after")
    def _request_or_config(self) -> PlanIn:
        given = [k for k in ("base", "experts", "operator", "params") if getattr(self, k)]
        if self.config_yaml is not None and given:
            raise ValueError(f"give either config_yaml or {'/'.join(given)}, not both")
        missing = [k for k in ("base", "experts", "operator") if getattr(self, k) is None]
        if self.config_yaml is None and missing:
            raise ValueError(f"{', '.join(missing)} required (or a mergekit config_yaml)")
        return self


class MergeIn(PlanIn):
    output: OutputIn


class SqlIn(_In):
    sql: str = Field(min_length=1, max_length=100_000)


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
