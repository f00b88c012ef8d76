"""The operator spec: everything about one merge operator, declared once in its own module."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from mergepipe.core.errors import InvalidRequest
from mergepipe.core.operators.base import Operator

ParamValue = bool | float | str


@dataclass(frozen=True)
class Param:
    """One global parameter of an operator: its type, default and allowed values (the request
    schema generates the operator's pydantic parameter model from these)."""

    name: str
    type: type[bool] | type[float] | type[str]
    default: ParamValue
    choices: tuple[str, ...] = ()  # for str parameters: the allowed values
    help: str = ""
    optional: bool = False  # kept in a request only when not the default (plan hashes stay)
    bounds: tuple[float | None, float | None] | None = None  # float parameters: [low, high]


@dataclass(frozen=True)
class MergekitMethod:
    """How a mergekit 0.1.x `merge_method` maps onto the operator."""

    name: str
    # mergekit's global `parameters:` keys -> ours (None: accepted and ignored with a note)
    params: Mapping[str, str | None] = field(default_factory=dict)
    # mergekit values -> ours where they differ (DARE's `rescale: true`), noting it for the user
    translate: Callable[[dict[str, Any], list[str]], dict[str, Any]] | None = None
    base_in_average: bool = False  # mergekit averages base_model in too (linear)
    weights: bool = True  # the method takes a `weight` per model (slerp, model_stock do not)
    # why MergePipe needs base_model where mergekit's method does without one (None: mergekit
    # requires it too, or averages the base in)
    base_needed: str | None = None
    # our parameters a config must give (a missing one is refused): name -> what it is
    required: Mapping[str, str] = field(default_factory=dict)


def default_coefficients(weights: Sequence[float], params: Mapping[str, Any]) -> list[float]:
    """alpha_i, the coefficient applied to D_i: lambda * w_i, divided under normalize by the
    weights' sum (the base's own weight included when mergekit's linear averages the base in)."""
    lam = float(params.get("lambda", 1.0))
    if params.get("normalize"):
        total = sum(weights) + float(params.get("base_weight", 0.0))
        return [lam * w / total for w in weights]
    return [lam * w for w in weights]


@dataclass(frozen=True)
class FusedKernel:
    """The one-pass C kernel (core/operators/fused.py) that computes an operator's blocks to the
    bits of its torch kernel: `linear` (a weighted sum of deltas) or `ties` (trim, sign election,
    disjoint sum); `drop`: each delta goes through DARE's keyed random drop first."""

    c_kernel: Literal["linear", "ties"]
    drop: bool = False


# Planning units: the unit name -> the output region a coherent group spans (None: no grouping).
# "group_block" (one block region) is kept for measurement: it did worse than whole tensors.
PLANNING_UNITS: dict[str, str | None] = {"expert_block": None, "group": "tensor",
                                         "group_block": "block"}


@dataclass(frozen=True)
class OperatorSpec:
    """Name, kernel, typed parameters and semantics of one merge operator: what validation,
    planning, the manifest, the model card and the mergekit translation read."""

    name: str
    title: str        # in model cards: "A {title} merge of ..."
    formula: str      # one line for help texts and docs
    kernel: Operator  # pure block function (no I/O)
    normalize_default: bool
    additive: bool    # fixed coefficients: omitted blocks add nothing and the bound holds
    density: bool = False  # per-expert density applies (sparsifying operators)
    trim: bool = False     # magnitude trim at catalog thresholds: blocks below tau are skipped
    params: tuple[Param, ...] = ()  # global parameters beyond normalize and lambda
    aliases: tuple[str, ...] = ()
    mergekit: MergekitMethod | None = None
    # why the bound does not apply for these (validated) params, despite `additive`
    bound_exception: Callable[[Mapping[str, Any]], str | None] | None = None
    # alpha_i, the coefficient applied to D_i: the planner's ranking weight and, for additive
    # operators, the factor of the omission bound
    coefficients: Callable[[Sequence[float], Mapping[str, Any]], list[float]] = (
        default_coefficients)
    # the access plan's default unit (PLANNING_UNITS): "expert_block" selects (expert, block)
    # pairs one by one (additive operators: the omitted-update bound is a sum over them);
    # "group" selects all candidate experts' blocks of one output tensor together or none
    # (sign-electing / normalizing operators, whose output depends on which experts were read)
    planning_unit: str = "expert_block"
    # the planner's default block ranking (core.schema.UTILITY): "l2" = |alpha_i| ||D_itb|| per
    # byte; "per_tensor" divides by ||D_it|| so every tensor's share counts, not its scale;
    # "auto": one of auto_utility, by how the experts' updates spread over their tensors
    default_utility: str = "l2"
    # utility=auto's rankings (flat, peaked): flat where each expert's per-entry update is about
    # the same in every tensor, so block norms tell little about where it matters (the planner
    # measures that spread from the catalog: planner.plan.resolve_utility); peaked otherwise
    auto_utility: tuple[str, str] = ("per_tensor", "l2")
    # None: M - B is a fixed-coefficient sum of per-expert terms (each term a function of one
    # expert), so a stored merge can be extended by the changed experts alone
    # (planner.incremental); else why it cannot
    not_incremental: str | None = "M - B is not a fixed-coefficient sum of per-expert terms"
    # band sparsifiers (breadcrumbs): (numel, density, params) -> (k_upper, k_lower), the
    # magnitude ranks that bound the kept band (top k_lower minus top k_upper); the planner
    # turns them into catalog thresholds (planner.bands)
    cuts: Callable[[int, float, Mapping[str, Any]], tuple[int, int] | None] | None = None
    # request checks beyond the parameter types: (params, densities) -> None or InvalidRequest
    check: Callable[[Mapping[str, Any], Sequence[float]], None] | None = None
    # None: the kernel runs block by block. Else the reduction over whole tensors the kernel
    # needs (norms, dot products, angles) before any entry can be combined: the executor keeps
    # each tensor's blocks together and calls the kernel once per tensor (executor.torch_path)
    whole_tensor: str | None = None
    # None, or (params, densities) -> the whole-tensor reduction this request needs (None: its
    # blocks run one by one): an operator whose requests need whole tensors only sometimes
    whole_tensor_for: Callable[[Mapping[str, Any], Sequence[float]], str | None] | None = None
    # how many experts (non-base models) the operator combines: (at least, at most or None)
    experts_count: tuple[int, int | None] = (1, None)
    # the C kernel computing `kernel`'s blocks in one pass (None: the torch kernel only); a spec
    # whose kernel is replaced must drop it (dataclasses.replace(spec, kernel=k, fused=None))
    fused: FusedKernel | None = None
    # the fewest dimensions a tensor must have (della ranks the entries of each row): a base
    # with a smaller tensor is refused when the request is checked against the catalog
    min_ndim: int = 0

    def __post_init__(self) -> None:
        if self.planning_unit not in PLANNING_UNITS:
            raise ValueError(f"operator {self.name}: planning_unit {self.planning_unit!r} is "
                             f"not one of {', '.join(PLANNING_UNITS)}")

    def check_scale_params(self, params: Mapping[str, Any]) -> None:
        """Whole-tensor operators (slerp, nuslerp, model_stock) neither scale nor normalize: a
        `lambda` or `normalize` other than the default would be silently ignored, so refused."""
        if self.whole_tensor is None:
            return
        for name, default in (("lambda", 1.0), ("normalize", self.normalize_default)):
            if name in params and params[name] != default:
                raise InvalidRequest(f"params.{name}: {self.name} interpolates whole tensors "
                                     f"and takes no {name}; remove it", field=f"params.{name}")

    def check_experts_count(self, n: int) -> str | None:
        """Why `n` experts cannot be merged by this operator (None: they can)."""
        low, high = self.experts_count
        if low <= n and (high is None or n <= high):
            return None
        want = (f"exactly {low}" if low == high else f"at least {low}" if high is None
                else f"{low} to {high}")
        return (f"{self.name} merges {want} expert{'s' if (high or low) != 1 else ''} with the "
                f"base, got {n}")

    def whole_tensor_reason(self, params: Mapping[str, Any], densities: Sequence[float]
                            ) -> str | None:
        """The reduction over whole tensors a request's kernel needs (None: block by block)."""
        if self.whole_tensor is not None:
            return self.whole_tensor
        return self.whole_tensor_for(params, densities) if self.whole_tensor_for else None

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def bound_note(self, params: Mapping[str, Any]) -> str | None:
        """Why the omitted-update bound does not apply to a request (None: it applies)."""
        if not self.additive:
            return f"no bound: {self.name} is not a fixed-coefficient additive operator"
        return self.bound_exception(params) if self.bound_exception else None

    def incremental_note(self, params: Mapping[str, Any]) -> str | None:
        """Why a merge with these params cannot reuse a stored merge (None: it can, exactly)."""
        if self.not_incremental is not None:
            return f"{self.name}: {self.not_incremental}"
        if (params.get("semantics") == "mergekit"
                or params.get("compute_dtype", "float32") != "float32"):
            return (f"{self.name}: a mergekit config runs mergekit's own arithmetic on the "
                    "models' values in its compute dtype, which a stored merge cannot be "
                    "extended by exactly; run the request natively (mergepipe merge --base "
                    "... --experts ...) to merge incrementally")
        if self.additive and self.bound_exception is not None:
            why = self.bound_exception(params)
            if why is not None:
                return f"{self.name}: {why.removeprefix('no bound: ')}"
        return None
