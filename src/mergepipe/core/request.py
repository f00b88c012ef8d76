"""A merge request, validated and normalized: the contract of the CLI, the API and the planner."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from mergepipe.core.dtypes import normalize_dtype
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.operators import REGISTRY, OperatorSpec, Param, get_operator
from mergepipe.core.operators.spec import PLANNING_UNITS
from mergepipe.core.operators.ties import on_grid
from mergepipe.core.tensor_params import TENSOR_PARAMS, check_request_settings, numbers

# Parameters every operator takes, and the planner's ranking score of a block (per byte). l2
# (default; docs/catalog.md#definitions): |alpha_i| * ||D_itb||_2. per_tensor: |alpha_i| * ||D_itb|| / ||D_it||,
# the block's share of its (expert, tensor) delta. Only the order changes: block utilities, the
# omission bounds and the output at full budget do not.
# How a merge is computed (docs/incremental.md). The default, scratch, never depends on which
# merges the catalog holds; incremental and auto reuse a stored merge only when asked.
STRATEGIES = ("scratch", "incremental", "auto")
DEFAULT_STRATEGY = "scratch"
NORMALIZE = Param("normalize", bool, False, help="divide by the sum of the weights")
LAMBDA = Param("lambda", float, 1.0, help="scale of the merged delta")
UTILITY = Param("utility", str, "l2", ("l2", "per_tensor"), help="the planner's block ranking")
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
_OPTIONAL = (COMPUTE_DTYPE, SEMANTICS)
_MERGEKIT_LINEAR = (BASE_WEIGHT, BASE_POSITION)
# The access plan's unit (default: the operator spec's planning_unit; kept in params only when
# it differs from that default, so plan hashes of default requests stay).
UNIT = Param("unit", str, "", tuple(PLANNING_UNITS),
             help="planning unit: expert_block, or coherent groups of all experts' blocks of one "
                  "output tensor (group) or one block (group_block)")
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]?i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6,
          "mib": 2**20, "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12,
          "tib": 2**40}


@dataclass(frozen=True)
class Budget:
    """Expert-read budget: a fraction of the operator's full-read cost, or bytes."""

    fraction: float | None = None
    bytes: int | None = None

    def resolve(self, full_read_bytes: int) -> int:
        """Bytes of expert reads allowed; a fraction above 1 is the full read."""
        if self.bytes is not None:
            return self.bytes
        assert self.fraction is not None
        return math.floor(min(self.fraction, 1.0) * full_read_bytes)

    @staticmethod
    def parse(text: str | float | int | dict[str, Any] | Budget | None) -> Budget:
        """'0.3' or 0.3 -> fraction; '2GiB' / '500MB' / '1234B' -> bytes; {fraction}|{bytes}."""
        if text is None:
            return Budget(fraction=1.0)
        if isinstance(text, Budget):
            return text
        if isinstance(text, dict):
            keys = set(text) - {"fraction", "bytes"}
            if keys or len(text) != 1:
                raise InvalidRequest("budget must be {\"fraction\": f} or {\"bytes\": n}",
                                     field="budget")
            if "fraction" in text:
                return Budget(fraction=_fraction(text["fraction"]))
            return Budget(bytes=_bytes(text["bytes"]))
        if isinstance(text, bool):
            raise InvalidRequest(f"budget {text!r} is not a number", field="budget")
        if isinstance(text, int | float):
            return Budget(fraction=_fraction(text))
        s = str(text).strip()
        m = _SIZE.match(s)
        if m and m.group(2):
            unit = m.group(2).lower()
            if unit not in _UNITS:
                raise InvalidRequest(f"budget {s!r}: unknown unit", field="budget")
            return Budget(bytes=_bytes(float(m.group(1)) * _UNITS[unit]))
        try:
            return Budget(fraction=_fraction(float(s)))
        except ValueError:
            raise InvalidRequest(f"budget {s!r} is neither a fraction (0.3) nor a size (2GiB)",
                                 field="budget") from None

    def to_dict(self) -> dict[str, float | int]:
        return {"fraction": self.fraction} if self.fraction is not None else {"bytes": self.bytes or 0}


def _fraction(v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise InvalidRequest(f"budget fraction {v!r} is not a number", field="budget")
    f = _to_float(v)
    if not math.isfinite(f) or f <= 0:
        raise InvalidRequest(f"budget fraction {_short(v)} must be a finite number > 0",
                             field="budget")
    return f


MAX_BUDGET_BYTES = 2**63 - 1  # what the catalog's BIGINT holds


def _bytes(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(_to_float(v)):
        raise InvalidRequest(f"budget bytes {_short(v)} is not a number", field="budget")
    if v <= 0 or int(v) <= 0:
        raise InvalidRequest(f"budget bytes {_short(v)} must be > 0", field="budget")
    if int(v) > MAX_BUDGET_BYTES:
        raise InvalidRequest(f"budget bytes {_short(v)} is over 2^63 - 1", field="budget")
    return int(v)


@dataclass(frozen=True)
class ExpertSpec:
    model: str
    weight: float = 1.0
    density: float | None = None


@dataclass(frozen=True)
class MergeRequest:
    """What to merge. `params` holds the operator's global parameters with defaults filled in."""

    base: str
    experts: tuple[ExpertSpec, ...]
    operator: str
    params: dict[str, Any] = field(default_factory=dict)
    budget: Budget = field(default_factory=lambda: Budget(fraction=1.0))
    seed: int = 0
    output_dtype: str | None = None  # F32 | F16 | BF16; None = the base's
    strategy: str = DEFAULT_STRATEGY  # scratch | incremental | auto (docs/incremental.md)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["budget"] = self.budget.to_dict()
        d["experts"] = [asdict(e) for e in self.experts]
        if self.strategy == DEFAULT_STRATEGY:  # stored requests and plan hashes as they were
            del d["strategy"]
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> MergeRequest:
        """Rebuild (and re-validate) a request stored by `to_dict()`."""
        return build_request(base=d["base"], experts=list(d["experts"]), operator=d["operator"],
                             params=d.get("params"), budget=d.get("budget"),
                             seed=d.get("seed", 0), output_dtype=d.get("output_dtype"),
                             strategy=d.get("strategy", DEFAULT_STRATEGY))

    def weights(self) -> list[float]:
        return [e.weight for e in self.experts]

    def densities(self) -> list[float]:
        """Per-expert density (expert's own, else the global `density` param, else 1.0)."""
        g = self.params.get("density", 1.0)
        return [e.density if e.density is not None else g for e in self.experts]

    @property
    def spec(self) -> OperatorSpec:
        """The operator's spec (the request holds its canonical name)."""
        return get_operator(self.operator)

    def coefficients(self) -> list[float]:
        """alpha_i: the coefficient an additive operator applies to D_i (a ranking weight for
        the others)."""
        return self.spec.coefficients(self.weights(), self.params)

    @property
    def whole_tensor(self) -> str | None:
        """The reduction over whole tensors the kernel needs (None: it runs block by block): the
        executor then merges each tensor in one kernel call (executor.tensors)."""
        return self.spec.whole_tensor_reason(self.params, self.densities())

    @property
    def planning_unit(self) -> str:
        """The access plan's unit: params.unit, else the operator's default."""
        return str(self.params.get("unit", self.spec.planning_unit))


def build_request(*, base: str, experts: Sequence[dict[str, Any] | ExpertSpec] | str,
                  operator: str, params: dict[str, Any] | None = None,
                  budget: str | float | dict[str, Any] | Budget | None = None, seed: int | None = 0,
                  output_dtype: str | None = None, strategy: str | None = DEFAULT_STRATEGY
                  ) -> MergeRequest:
    """Validate everything that can be checked without the catalog; raise InvalidRequest."""
    if not isinstance(base, str) or not base:
        raise InvalidRequest("base model name is required", field="base")
    spec = get_operator(operator)
    specs = parse_experts(experts) if isinstance(experts, str) else [
        e if isinstance(e, ExpertSpec) else _expert(e, i) for i, e in enumerate(experts)]
    _check_experts(specs, base)
    why = spec.check_experts_count(len(specs))
    if why is not None:
        raise InvalidRequest(why, field="experts")
    p = operator_params(spec, params or {})
    if "tensor_params" in p:
        p["tensor_params"] = check_request_settings(
            p["tensor_params"], len(specs),
            [n for n in TENSOR_PARAMS if n == "weight" or (n == "density" and spec.density)
             or spec.param(n) is not None])
        _check_tensor_scale(p["tensor_params"])
    _check_scale(specs, p["lambda"])
    if p["normalize"] and abs(sum(e.weight for e in specs) + p.get("base_weight", 0.0)) < 1e-12:
        raise InvalidRequest("expert weights sum to zero with normalize=true", field="experts")
    if not spec.density and (p.get("density") is not None
                             or any(e.density is not None for e in specs)):
        raise InvalidRequest(f"density applies to sparsifying operators, not {spec.name}",
                             field="density")
    densities = [e.density if e.density is not None else p.get("density", 1.0) for e in specs]
    if spec.trim and spec.whole_tensor_reason(p, densities) is None:
        _check_trim_grid(specs, p.get("density", 1.0))
    if spec.check is not None:
        spec.check(p, densities)
    if seed is None:
        seed = 0
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise InvalidRequest(f"seed {_short(seed)} must be an integer in [0, 2^63)", field="seed")
    out_dtype = normalize_dtype(output_dtype) if output_dtype else None
    if strategy is None:
        strategy = DEFAULT_STRATEGY
    if strategy not in STRATEGIES:
        raise InvalidRequest(f"strategy {_short(strategy)} must be one of {', '.join(STRATEGIES)}",
                             field="strategy")
    return MergeRequest(base, tuple(specs), spec.name, p, Budget.parse(budget), seed, out_dtype,
                        str(strategy))


def operator_params(spec: OperatorSpec, params: dict[str, Any]) -> dict[str, Any]:
    """The request's global parameters checked against the operator's spec, defaults filled in
    (the planner's `utility` is kept only when it is not the operator's default, so plan hashes stay)."""
    own = {p.name: p for p in spec.params}
    extra = _MERGEKIT_LINEAR if (spec.mergekit is not None and spec.mergekit.base_in_average
                                 and params.get("semantics") == "mergekit") else ()
    known = {"normalize", "lambda", "utility", "unit", *own,
             *(("density",) if spec.density else ()),
             *(("tensor_params",) if params.get("semantics") == "mergekit" else ()),
             *(p.name for p in (*_OPTIONAL, *extra))}
    for name in sorted(set(params) - known):
        if name == "density":
            raise InvalidRequest(f"density applies to sparsifying operators, not {spec.name}",
                                 field="density")
        takers = [s.name for s in REGISTRY.values() if s.param(name) is not None]
        if takers:
            raise InvalidRequest(f"{name} applies to {', '.join(takers)}, not {spec.name}",
                                 field=f"params.{name}")
        raise InvalidRequest(f"unknown parameter {name!r} for {spec.name}; known: "
                             f"{sorted(known)}", field="params")
    spec.check_scale_params(params)
    p: dict[str, Any] = {
        "normalize": NORMALIZE.parse(params.get("normalize", spec.normalize_default)),
        "lambda": LAMBDA.parse(params.get("lambda", 1.0)),
    }
    if "density" in params:
        p["density"] = _density(params["density"], "params.density")
    utility = UTILITY.parse(params.get("utility", spec.default_utility))
    if utility != spec.default_utility:
        p["utility"] = utility
    unit = UNIT.parse(params.get("unit", spec.planning_unit))
    if unit != spec.planning_unit:
        p["unit"] = unit
    for name, param in own.items():
        value = param.parse(params.get(name, param.default))
        if not param.optional or value != param.default:
            p[name] = value
    for param in _OPTIONAL:
        value = param.parse(params.get(param.name, param.default))
        if value != param.default:
            p[param.name] = value
    for param in extra:
        if param.name in params:
            p[param.name] = param.parse(params[param.name])
    if "tensor_params" in params:  # checked against the experts by build_request
        p["tensor_params"] = params["tensor_params"]
    if "base_position" in p and (p["base_position"] != int(p["base_position"])
                                 or not 0 <= p["base_position"] <= 1e6):
        raise InvalidRequest("params.base_position must be a whole number >= 0",
                             field="params.base_position")
    return p


# Weights and lambda multiply deltas in float32: bounded so that their products stay finite
# (a weight of 1e308 "merged" into the base in 0.1; lambda 1e308 published inf).
MAX_COEFFICIENT = 1e6


def _check_scale(specs: list[ExpertSpec], lam: float) -> None:
    for i, e in enumerate(specs):
        if abs(e.weight) > MAX_COEFFICIENT:
            raise InvalidRequest(f"experts[{i}].weight {e.weight:g} is outside "
                                 f"[-{MAX_COEFFICIENT:g}, {MAX_COEFFICIENT:g}]",
                                 field=f"experts[{i}].weight")
    total = abs(lam) * sum(abs(e.weight) for e in specs)
    if abs(lam) > MAX_COEFFICIENT or total > MAX_COEFFICIENT:
        raise InvalidRequest(f"params.lambda {lam:g} times the sum of |weights| is "
                             f"{total:g}, over {MAX_COEFFICIENT:g}", field="params.lambda")


def _check_tensor_scale(settings: dict[str, Any]) -> None:
    for i, chain in enumerate(settings.get("weight", [])):
        for v in (x for s in chain or () for x in numbers(s)):
            if abs(v) > MAX_COEFFICIENT:
                raise InvalidRequest(f"params.tensor_params.weight[{i}]: {v:g} is outside "
                                     f"[-{MAX_COEFFICIENT:g}, {MAX_COEFFICIENT:g}]",
                                     field=f"experts[{i}].weight")


def _check_experts(specs: list[ExpertSpec], base: str) -> None:
    if not specs:
        raise InvalidRequest("at least one expert is required", field="experts")
    names = [e.model for e in specs]
    for n in names:
        if names.count(n) > 1:
            raise InvalidRequest(f"expert {n!r} is listed twice", field="experts")
        if n == base:
            raise InvalidRequest(f"expert {n!r} is the base model", field="experts")


def _check_trim_grid(specs: list[ExpertSpec], default: float) -> None:
    """Trim thresholds are catalogued on the 1% density grid."""
    for e in specs:
        d = e.density if e.density is not None else default
        if not on_grid(d):
            raise InvalidRequest(
                f"ties density {d} of expert {e.model!r} is not on the 1% grid the catalog "
                "keeps exact trim thresholds for (use e.g. 0.53)", field="density")


def parse_experts(text: str) -> list[ExpertSpec]:
    """'e1,e2:0.5,e3:1:0.7' -> experts with optional weight and density."""
    out = []
    for i, part in enumerate(p.strip() for p in text.split(",")):
        if not part:
            continue
        bits = part.split(":")
        if len(bits) > 3 or not bits[0]:
            raise InvalidRequest(f"expert {part!r}: use NAME[:WEIGHT[:DENSITY]]", field="experts")
        d: dict[str, Any] = {"model": bits[0]}
        try:
            if len(bits) > 1 and bits[1]:
                d["weight"] = float(bits[1])
            if len(bits) > 2 and bits[2]:
                d["density"] = float(bits[2])
        except ValueError:
            raise InvalidRequest(f"expert {part!r}: weight and density must be numbers",
                                 field="experts") from None
        out.append(_expert(d, i))
    return out


def _expert(d: object, i: int) -> ExpertSpec:
    if not isinstance(d, dict) or not isinstance(d.get("model"), str) or not d["model"]:
        raise InvalidRequest(f"experts[{i}] needs a model name", field=f"experts[{i}].model")
    extra = set(d) - {"model", "weight", "density"}
    if extra:
        raise InvalidRequest(f"experts[{i}]: unknown field(s) {sorted(extra)}",
                             field=f"experts[{i}]")
    w = _finite(d.get("weight", 1.0), f"experts[{i}].weight")
    dens = d.get("density")
    return ExpertSpec(d["model"], w, None if dens is None else _density(dens, f"experts[{i}].density"))


def _finite(v: object, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(_to_float(v)):
        raise InvalidRequest(f"{name} must be a finite number, got {_short(v)}", field=name)
    return float(v)


def _to_float(v: int | float) -> float:
    """float(v), with integers too large for a float as infinity (float() would raise)."""
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


def _short(v: object) -> str:
    """repr(v), cut short: a 400-digit integer does not belong in an error message."""
    try:
        r = repr(v)
    except ValueError:  # an integer past Python's digit limit for str()
        return f"an integer of about {int.bit_length(v) * 0.30103:.0f} digits" \
            if isinstance(v, int) else type(v).__name__
    return r if len(r) <= 40 else r[:37] + "..."


def _density(v: object, name: str) -> float:
    d = _finite(v, name)
    if not 0 < d <= 1:
        raise InvalidRequest(f"{name} {d} is outside (0, 1]", field=name)
    return d
