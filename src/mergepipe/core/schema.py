"""The request schema: the pydantic models of a merge, a plan and an ingestion, shared by the HTTP
API, the CLI and mergekit configs; each value is checked here, once, and an error names its field
(InvalidRequest). Operator parameters are a model generated from each operator's spec."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    create_model,
    model_validator,
)

from mergepipe.core.errors import InvalidRequest
from mergepipe.core.operators import REGISTRY, OperatorSpec, Param, get_operator
from mergepipe.core.operators.spec import PLANNING_UNITS
from mergepipe.core.operators.ties import on_grid
from mergepipe.core.tensor_params import TENSOR_PARAMS, check_request_settings, numbers
from mergepipe.core.vocab import (
    DTYPE_HELP,
    KINDS,
    MAX_BLOCK_BYTES,
    MIN_BLOCK_BYTES,
    NAME_RULE,
    STRATEGIES,
    dtype_name,
    name_problem,
    share_problem,
)

M = TypeVar("M", bound=BaseModel)

# Weights and lambda multiply deltas in float32: bounded so that their products stay finite
# (a weight of 1e308 "merged" into the base; lambda 1e308 published inf).
MAX_COEFFICIENT = 1e6
MAX_BUDGET_BYTES = 2**63 - 1  # what the catalog's BIGINT holds
MAX_EXPERTS = 256


# -- errors: a pydantic error as the one error shape --------------------------------------------

def field_name(loc: tuple[Any, ...] | list[Any]) -> str | None:
    """('body', 'experts', 0, 'model') -> 'experts[0].model'; ('query', 'limit') -> 'limit'."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif isinstance(p, str) and not p.startswith("function-") and "[" not in p:
            out += f".{p}" if out else p
    return out or None


def error_message(err: dict[str, Any], field: str | None) -> str:
    """One line for one pydantic error, naming the field."""
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if err.get("type") == "json_invalid":
        return "request body is not valid JSON"
    if err.get("type") == "missing":
        return f"{field} is required" if field else "a required field is missing"
    if err.get("type") == "extra_forbidden":
        return f"unknown field {field}" if field else msg
    return f"{field}: {msg}" if field else msg


def validate(model: type[M], data: Any, prefix: str = "") -> M:
    """`model` validated from `data`; the first error as InvalidRequest naming its field."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        field = field_name((*([prefix] if prefix else []), *err["loc"])) or prefix or None
        raise InvalidRequest(error_message(dict(err), field), field=field) from None


# -- field types -------------------------------------------------------------------------------

def _refusing(problem: Callable[[Any], str | None]) -> AfterValidator:
    """A validator that refuses a value `problem` finds fault with (ValueError: its words)."""

    def check(v: Any) -> Any:
        why = problem(v)
        if why is not None:
            raise ValueError(why)
        return v

    return AfterValidator(check)


_share = _refusing(share_problem)
_bigint = _refusing(lambda v: "must be at most 2^63 - 1 (what the catalog holds)"
                    if v > MAX_BUDGET_BYTES else None)
Name = Annotated[str, Field(strict=True, description=NAME_RULE), _refusing(name_problem)]
# A registered model named by a request: looked up (an unknown name is a 404), never created;
# no NUL character (no registered name has one, and PostgreSQL refuses them in text)
Ref = Annotated[str, Field(strict=True, min_length=1, max_length=256, pattern=r"^[^\x00]+$",
                           description="a registered model's name")]
Finite = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Weight = Annotated[Finite, Field(ge=-MAX_COEFFICIENT, le=MAX_COEFFICIENT)]
Density = Annotated[Finite, _share,
                    Field(json_schema_extra={"exclusiveMinimum": 0, "maximum": 1})]
Fraction = Annotated[Finite, _share,
                     Field(description="of the operator's full-read cost",
                           json_schema_extra={"exclusiveMinimum": 0, "maximum": 1})]
ByteCount = Annotated[int, Field(strict=True, gt=0, description="expert bytes, at most 2^63 - 1"),
                      _bigint]
Seed = Annotated[int, Field(strict=True, ge=0, lt=2**63)]
Dtype = Annotated[Literal["F32", "F16", "BF16"], BeforeValidator(dtype_name),
                  Field(description=DTYPE_HELP)]
Strategy = Literal[STRATEGIES]  # type: ignore[valid-type]
Kind = Literal[KINDS]  # type: ignore[valid-type]
BlockBytes = Annotated[int, Field(strict=True, ge=MIN_BLOCK_BYTES, le=MAX_BLOCK_BYTES)]
# A plan's predicted deviation is a share of the full merge's update bound: 0 .. 1
Deviation = Annotated[Finite, Field(ge=0, le=1, description=(
    "the largest predicted deviation accepted (docs/deviation.md#predicted-deviation): the "
    "budget is the smallest fraction of the full read, in steps of 0.01, whose plan meets it"))]


class In(BaseModel):
    """A request part: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")


class BudgetIn(In):
    fraction: Fraction | None = None
    bytes: ByteCount | None = None

    @model_validator(mode="after")
    def _one(self) -> BudgetIn:
        if (self.fraction is None) == (self.bytes is None):
            raise ValueError('give exactly one of {"fraction": f} or {"bytes": n}')
        return self

    def value(self) -> dict[str, Any]:
        """{"fraction": f} or {"bytes": n}."""
        return self.model_dump(exclude_none=True)


class ExpertIn(In):
    model: Ref
    weight: Weight = 1.0
    density: Density | None = None


class OutputIn(In):
    name: Name
    dtype: Dtype | None = None


class ModelIn(In):
    """An ingestion: register the checkpoint at `path` as model `name`."""

    name: Name
    path: str = Field(min_length=1, max_length=4096,
                      description="checkpoint file or directory inside a data root "
                                  "(relative paths: relative to the first root)")
    kind: Kind = "full"
    base: Ref | None = Field(None, description="the base model (omit to register a base)")
    block_bytes: BlockBytes | None = Field(None, description="block size of the grid (bases "
                                                             "only)")
    stats: bool = Field(True, description="compute delta statistics (false: header-only)")
    force: bool = Field(False, description="register an expert whose delta to its base is "
                                           "far larger than a fine-tune's (docs/catalog.md)")

    @model_validator(mode="after")
    def _fits(self) -> ModelIn:
        if self.base is None and self.kind != "full":
            raise InvalidRequest(f"a {self.kind} checkpoint needs a base model", field="base")
        if self.base is not None and self.block_bytes is not None:
            raise InvalidRequest("block_bytes applies to bases only; experts use their base's "
                                 "block grid", field="block_bytes")
        if self.base is not None and self.base == self.name:
            raise InvalidRequest(f"model {self.name!r} cannot be its own base", field="base")
        return self


class _RequestFields(In):
    """What to merge: the fields a request body and a Python call share."""

    params: dict[str, Any] | None = None
    budget: BudgetIn | None = Field(None, description="default: the full read")
    seed: Seed | None = None
    strategy: Strategy | None = Field(
        None, description="scratch (default): the standard merge, whatever merges the catalog "
                          "holds; incremental: extend a stored merge of the same base and "
                          "operator by the changed experts; auto: incremental only when its "
                          "plan is complete and reads fewer bytes")
    target_deviation: Deviation | None = None
    _checked: dict[str, Any] | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _budget_or_target(self) -> _RequestFields:
        check_target_deviation(self.target_deviation, budget_given=self.budget is not None)
        return self

    def checked(self) -> dict[str, Any]:
        """The request's fields checked and normalized (core.request.request_of makes the
        MergeRequest of them)."""
        assert self._checked is not None, "a config_yaml request is resolved by the job layer"
        return self._checked

    def _finish(self, base: str, experts: list[ExpertIn], operator: str,
                output_dtype: str | None) -> None:
        self._checked = checked_request(base, experts, operator, self.params or {},
                                        self.budget, self.seed, output_dtype, self.strategy)


class RequestIn(_RequestFields):
    """A merge request as the Python API and the CLI give it (core.request.build_request)."""

    base: Ref
    experts: list[ExpertIn] = Field(min_length=1, max_length=MAX_EXPERTS)
    operator: str = Field(min_length=1, max_length=64)
    output_dtype: Dtype | None = None

    @model_validator(mode="after")
    def _whole(self) -> RequestIn:
        self._finish(self.base, self.experts, self.operator, self.output_dtype)
        return self


class PlanIn(_RequestFields):
    """The body of POST /v1/plans: a request, or a mergekit config resolved against the catalog."""

    base: Ref | None = Field(None, description="required unless config_yaml is given")
    experts: list[ExpertIn] | None = Field(None, min_length=1, max_length=MAX_EXPERTS)
    operator: str | None = Field(None, min_length=1, max_length=64)
    config_yaml: str | None = Field(
        None, min_length=1, max_length=1_000_000,
        description="a mergekit YAML config instead of base/experts/operator/params; its models "
                    "are registered names or paths in the data roots (ingested on the fly)")

    def output_dtype(self) -> str | None:
        return None

    @model_validator(mode="after")
    def _request_or_config(self) -> PlanIn:
        given = [k for k in ("base", "experts", "operator", "params") if getattr(self, k)]
        if self.config_yaml is not None and given:
            raise ValueError(f"give either config_yaml or {'/'.join(given)}, not both")
        if self.config_yaml is None:
            if self.base is None or self.experts is None or self.operator is None:
                missing = [k for k in ("base", "experts", "operator") if getattr(self, k) is None]
                raise ValueError(f"{', '.join(missing)} required (or a mergekit config_yaml)")
            self._finish(self.base, self.experts, self.operator, self.output_dtype())
        return self


class MergeIn(PlanIn):
    """The body of POST /v1/merges: a plan body and where the output goes."""

    output: OutputIn

    def output_dtype(self) -> str | None:
        return self.output.dtype


# -- operator parameters, generated from the spec -------------------------------------------------

# Parameters every operator takes. utility: the planner's ranking score of a block (per byte):
# l2 |alpha_i| * ||D_itb||_2, per_tensor divides by ||D_it|| (the block's share of its tensor),
# coverage / stratified discount that share by sqrt(k) - sqrt(k - 1), k its rank within its
# (expert, tensor) / output region (docs/catalog.md#rankings); only the order changes, not the bounds nor the output at full budget.
NORMALIZE = Param("normalize", bool, False, help="divide by the sum of the weights")
LAMBDA = Param("lambda", float, 1.0, help="scale of the merged delta")
# activation: the block's output change under the base's calibration (mergepipe calibrate);
# fisher: the KL the block's delta causes under the calibration's Fisher (planner.activation).
# tensor_energy: a_u^2 over the summed a^2 of its tensor (every expert), per byte: each tensor's
# omitted energy share, a quadratic model of the output change (docs/catalog.md#rankings).
# region_energy: that share times sqrt(k) - sqrt(k - 1), k the unit's rank by a_u among the
# experts of its output region (tensor, block): the disjoint means' version.
# auto: the operator's (flat, peaked) pair by the spread of the experts' updates over their
# tensors (planner.plan.resolve_utility).
UTILITY = Param("utility", str, "l2", ("l2", "per_tensor", "coverage", "stratified",
                                       "tensor_energy", "region_energy", "activation",
                                       "fisher", "auto"),
                help="the planner's block ranking")
# The dtype the arithmetic runs in, and whose arithmetic: native (float32 fused kernels) or
# mergekit's operation by operation (a mergekit config). Kept only when not the default.
COMPUTE_DTYPE = Param("compute_dtype", str, "float32",
                      ("float32", "bfloat16", "float16", "files"),
                      help="the dtype the merge arithmetic runs in (files: the inputs' dtype, "
                           "promoted per tensor as mergekit does without a dtype)")
SEMANTICS = Param("semantics", str, "native", ("native", "mergekit"),
                  help="mergekit: mergekit 0.1.5's operations in compute_dtype")
# mergekit's linear averages base_model in when it is one of its inputs: its weight and place
BASE_WEIGHT = Param("base_weight", float, 0.0, help="mergekit linear: the base's own weight")
BASE_POSITION = Param("base_position", float, 0.0, help="mergekit linear: the base's place")
# The access plan's unit (default: the spec's planning_unit; kept in params only when it
# differs, so plan hashes of default requests stay).
UNIT = Param("unit", str, "", tuple(PLANNING_UNITS),
             help="planning unit: expert_block, or coherent groups of all experts' blocks of one "
                  "output tensor (group) or one block (group_block)")
DENSITY = Param("density", float, 1.0, help="share of each delta kept")
_OPTIONAL = (COMPUTE_DTYPE, SEMANTICS)  # kept only when not the default
_MERGEKIT_LINEAR = (BASE_WEIGHT, BASE_POSITION)


def _annotation(p: Param) -> Any:
    if p.name == "density":
        return Density
    if p.name == "base_position":
        return Annotated[Finite, Field(ge=0, le=1e6, multiple_of=1)]
    if p.type is bool:
        return bool  # true / false, and "true", "yes", "1", ... from a command line
    if p.type is float:
        return Annotated[Finite, Field(ge=p.bounds[0], le=p.bounds[1])] if p.bounds else Finite
    return Literal[p.choices] if p.choices else Annotated[str, Field(strict=True)]


def _default(spec: OperatorSpec, p: Param) -> Any:
    return {"normalize": spec.normalize_default, "utility": spec.default_utility,
            "unit": spec.planning_unit}.get(p.name, p.default)


def known_params(spec: OperatorSpec, mergekit: bool) -> tuple[Param, ...]:
    """Every parameter a request of `spec` may give (mergekit: a mergekit config's request)."""
    extra = _MERGEKIT_LINEAR if (mergekit and spec.mergekit is not None
                                 and spec.mergekit.base_in_average) else ()
    return (NORMALIZE, LAMBDA, UTILITY, UNIT, *spec.params,
            *((DENSITY,) if spec.density else ()), *_OPTIONAL, *extra)


def params_model(spec: OperatorSpec, mergekit: bool = False) -> type[BaseModel]:
    """The pydantic model of `spec`'s parameters, defaults filled in (mergekit builds its method
    parameters the same way); mergekit: with the extras of a mergekit config's request."""
    key = (spec.name, id(spec), mergekit)
    if key not in _MODELS:  # the spec is kept with its model: its id is not reused
        _MODELS[key] = (spec, _params_model(spec, mergekit))
    return _MODELS[key][1]


_MODELS: dict[tuple[str, int, bool], tuple[OperatorSpec, type[BaseModel]]] = {}


def _params_model(spec: OperatorSpec, mergekit: bool) -> type[BaseModel]:
    fields: dict[str, Any] = {p.name: (_annotation(p), Field(_default(spec, p), description=p.help))
                              for p in known_params(spec, mergekit)}
    if mergekit:
        fields["tensor_params"] = (dict[str, Any] | None, None)
    return create_model(f"{spec.name}_params", __config__=ConfigDict(extra="forbid"), **fields)


def operator_params(spec: OperatorSpec, params: dict[str, Any]) -> dict[str, Any]:
    """The request's global parameters checked against the operator's spec, defaults filled in.
    A parameter at its default is left out where the plan hash never had it (utility, unit,
    optional ones), so plan hashes of older requests stay."""
    mergekit = params.get("semantics") == "mergekit"
    known = {p.name for p in known_params(spec, mergekit)} | ({"tensor_params"} if mergekit
                                                               else set())
    for name in sorted(set(params) - known, key=str):
        if name == "density":
            raise InvalidRequest(f"density applies to sparsifying operators, not {spec.name}",
                                 field="density")
        takers = [s.name for s in REGISTRY.values() if s.param(name) is not None]
        if takers:
            raise InvalidRequest(f"params.{name}: {name} applies to {', '.join(takers)}, not "
                                 f"{spec.name}", field=f"params.{name}")
        raise InvalidRequest(f"unknown parameter {str(name)[:40]!r} for {spec.name}; known: "
                             f"{sorted(known)}", field="params")
    spec.check_scale_params(params)
    given = validate(params_model(spec, mergekit), params, prefix="params")
    values = given.model_dump()
    out = {"normalize": values["normalize"], "lambda": values["lambda"]}
    own = set(spec.params)
    for p in known_params(spec, mergekit)[2:]:
        if p.name in ("density", "base_weight", "base_position"):  # only when given
            if p.name in given.model_fields_set:
                out[p.name] = values[p.name]
        elif (p in own and not p.optional) or values[p.name] != _default(spec, p):
            out[p.name] = values[p.name]
    if values.get("tensor_params") is not None:  # checked against the experts by the request
        out["tensor_params"] = values["tensor_params"]
    return out


# -- the whole request --------------------------------------------------------------------------

class _TargetIn(In):
    target_deviation: Deviation


def check_target_deviation(value: Any, *, budget_given: bool) -> float | None:
    """A target deviation (None: none) checked: a number in [0, 1], and no budget beside it
    (the target chooses the budget). InvalidRequest naming target_deviation."""
    if value is None:
        return None
    if budget_given:
        raise InvalidRequest("give either a budget or a target deviation, not both (the "
                             "target chooses the budget)", field="target_deviation")
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise InvalidRequest(f"target deviation {value[:40]!r} is not a number",
                                 field="target_deviation") from None
    return validate(_TargetIn, {"target_deviation": value}).target_deviation


def checked_request(base: str, experts: list[ExpertIn], operator: str, params: dict[str, Any],
                    budget: BudgetIn | None, seed: int | None, output_dtype: str | None,
                    strategy: str | None) -> dict[str, Any]:
    """The checks that span fields (the fields themselves are checked): the request's fields,
    normalized (the operator's canonical name, its parameters with defaults)."""
    spec = get_operator(operator)
    _check_expert_names(base, experts)
    why = spec.check_experts_count(len(experts))
    if why is not None:
        raise InvalidRequest(why, field="experts")
    p = operator_params(spec, params)
    if "tensor_params" in p:
        p["tensor_params"] = check_request_settings(
            p["tensor_params"], len(experts),
            [n for n in TENSOR_PARAMS if n == "weight" or (n == "density" and spec.density)
             or spec.param(n) is not None])
        _check_tensor_scale(p["tensor_params"])
    _check_coefficients(experts, p)
    densities = _densities(spec, experts, p)
    if spec.check is not None:
        spec.check(p, densities)
    return {"base": base, "experts": [e.model_dump() for e in experts], "operator": spec.name,
            "params": p, "budget": None if budget is None else budget.value(), "seed": seed or 0,
            "output_dtype": output_dtype, "strategy": strategy}


def _check_expert_names(base: str, experts: list[ExpertIn]) -> None:
    names = [e.model for e in experts]
    for n in names:
        if names.count(n) > 1:
            raise InvalidRequest(f"expert {n!r} is listed twice", field="experts")
        if n == base:
            raise InvalidRequest(f"expert {n!r} is the base model", field="experts")


def _check_coefficients(experts: list[ExpertIn], p: dict[str, Any]) -> None:
    """lambda times the weights stays in range; normalized weights do not sum to zero."""
    weights = [e.weight for e in experts]
    total = abs(p["lambda"]) * sum(map(abs, weights))
    if abs(p["lambda"]) > MAX_COEFFICIENT or total > MAX_COEFFICIENT:
        raise InvalidRequest(f"params.lambda {p['lambda']:g} times the sum of |weights| is "
                             f"{total:g}, over {MAX_COEFFICIENT:g}", field="params.lambda")
    if p["normalize"] and abs(sum(weights) + p.get("base_weight", 0.0)) < 1e-12:
        raise InvalidRequest("expert weights sum to zero with normalize=true", field="experts")


def _densities(spec: OperatorSpec, experts: list[ExpertIn], p: dict[str, Any]) -> list[float]:
    """Each expert's density (its own, else the operator's): only for sparsifying operators,
    on the 1% grid where the operator trims by the catalog's thresholds."""
    if not spec.density and any(e.density is not None for e in experts):
        raise InvalidRequest(f"density applies to sparsifying operators, not {spec.name}",
                             field="density")
    densities = [e.density if e.density is not None else p.get("density", 1.0) for e in experts]
    if spec.trim and spec.whole_tensor_reason(p, densities) is None:
        for e, d in zip(experts, densities, strict=True):
            if not on_grid(d):
                raise InvalidRequest(
                    f"ties density {d} of expert {e.model!r} is not on the 1% grid the catalog "
                    "keeps exact trim thresholds for (use e.g. 0.53)", field="density")
    return densities


def _check_tensor_scale(settings: dict[str, Any]) -> None:
    for i, chain in enumerate(settings.get("weight", [])):
        for v in (x for s in chain or () for x in numbers(s)):
            if abs(v) > MAX_COEFFICIENT:
                raise InvalidRequest(f"params.tensor_params.weight[{i}]: {v:g} is outside "
                                     f"[-{MAX_COEFFICIENT:g}, {MAX_COEFFICIENT:g}]",
                                     field=f"experts[{i}].weight")

