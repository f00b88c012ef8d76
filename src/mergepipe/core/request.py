"""A merge request, validated and normalized: the contract of the CLI, the API and the planner."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from mergepipe.core.errors import InvalidRequest
from mergepipe.core.operators import OperatorSpec, get_operator
from mergepipe.core.vocab import DEFAULT_STRATEGY
from mergepipe.core.vocab import STRATEGIES as STRATEGIES  # re-exported

# The CLI's budget sizes: 2GiB, 500MB, 1234B.
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
        """Bytes of expert reads allowed."""
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
        from mergepipe.core.schema import BudgetIn, validate

        return Budget(**validate(BudgetIn, budget_value(text), prefix="budget").value())

    def to_dict(self) -> dict[str, float | int]:
        return {"fraction": self.fraction} if self.fraction is not None else {"bytes": self.bytes or 0}


def budget_value(text: str | float | dict[str, Any]) -> dict[str, Any]:
    """A budget as the CLI or a Python call spells it ('0.3', 0.3, '2GiB') -> {"fraction": f} or
    {"bytes": n}, for the schema to check; a mapping is passed on as given."""
    if isinstance(text, dict):
        return text
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise InvalidRequest(f"budget {str(text)[:40]!r} is not a number", field="budget")
    if not isinstance(text, str):
        return {"fraction": text}
    s = text.strip()
    m = _SIZE.match(s)
    if m and m.group(2):
        unit = m.group(2).lower()
        if unit not in _UNITS:
            raise InvalidRequest(f"budget {s[:40]!r}: unknown unit", field="budget")
        size = float(m.group(1)) * _UNITS[unit]
        return {"bytes": int(size) if math.isfinite(size) and size >= 1 else size}
    try:
        return {"fraction": float(s)}
    except ValueError:
        raise InvalidRequest(f"budget {s[:40]!r} is neither a fraction (0.3) nor a size (2GiB)",
                             field="budget") from None


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
        budget = d.get("budget")
        if isinstance(budget, dict) and isinstance(budget.get("fraction"), float | int) \
                and budget["fraction"] > 1:  # stored before 0.2: the
            budget = {"fraction": 1.0}  # full read, what a fraction above 1 meant then
        return build_request(base=d["base"], experts=list(d["experts"]), operator=d["operator"],
                             params=d.get("params"), budget=budget,
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
        executor then merges each tensor in one kernel call (executor.torch_path)."""
        return self.spec.whole_tensor_reason(self.params, self.densities())

    @property
    def planning_unit(self) -> str:
        """The access plan's unit: params.unit, else the operator's default."""
        return str(self.params.get("unit", self.spec.planning_unit))


def build_request(*, base: str, experts: Sequence[dict[str, Any] | ExpertSpec] | str,
                  operator: str, params: dict[str, Any] | None = None,
                  budget: str | float | dict[str, Any] | Budget | None = None, seed: int | None = 0,
                  output_dtype: str | None = None, strategy: str | None = None) -> MergeRequest:
    """The request checked by the request schema (core.schema); raise InvalidRequest naming the
    field. `experts` and `budget` may be spelled as on the command line ('e1,e2:0.5', '2GiB')."""
    from mergepipe.core.schema import RequestIn, validate  # pydantic: not on `--help`'s path

    items: Any = parse_experts(experts) if isinstance(experts, str) else experts
    if isinstance(items, list | tuple):
        items = [asdict(e) if isinstance(e, ExpertSpec) else e for e in items]
    fields = {"base": base, "operator": operator, "params": params, "seed": seed,
              "output_dtype": output_dtype, "strategy": strategy, "experts": items,
              "budget": (budget.to_dict() if isinstance(budget, Budget)
                         else None if budget is None else budget_value(budget))}
    return request_of(validate(RequestIn, {k: v for k, v in fields.items() if v is not None})
                      .checked())


def request_of(checked: dict[str, Any]) -> MergeRequest:
    """The MergeRequest of fields a request schema model checked (its `checked()`)."""
    budget = checked["budget"]
    extra = {} if checked["strategy"] is None else {"strategy": checked["strategy"]}
    return MergeRequest(checked["base"], tuple(ExpertSpec(**e) for e in checked["experts"]),
                        checked["operator"], checked["params"],
                        Budget(fraction=1.0) if budget is None else Budget(**budget),
                        checked["seed"], checked["output_dtype"], **extra)


def parse_experts(text: str) -> list[ExpertSpec]:
    """'e1,e2:0.5,e3:1:0.7' -> experts with optional weight and density (for the schema to check)."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        bits = part.split(":")
        if len(bits) > 3 or not bits[0]:
            raise InvalidRequest(f"expert {part[:40]!r}: use NAME[:WEIGHT[:DENSITY]]",
                                 field="experts")
        try:
            weight = float(bits[1]) if len(bits) > 1 and bits[1] else 1.0
            density = float(bits[2]) if len(bits) > 2 and bits[2] else None
        except ValueError:
            raise InvalidRequest(f"expert {part[:40]!r}: weight and density must be numbers",
                                 field="experts") from None
        out.append(ExpertSpec(bits[0], weight, density))
    if not out:
        raise InvalidRequest("at least one expert is required", field="experts")
    return out
