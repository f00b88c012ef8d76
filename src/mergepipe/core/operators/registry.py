"""The registry of merge operators by name: one line per operator in operators/__init__.py."""

from __future__ import annotations

from mergepipe.core.errors import InvalidRequest
from mergepipe.core.operators.spec import OperatorSpec

REGISTRY: dict[str, OperatorSpec] = {}
_ALIASES: dict[str, str] = {}


def register(spec: OperatorSpec) -> OperatorSpec:
    """Add an operator (and its aliases); a name already taken is a programming error."""
    for name in (spec.name, *spec.aliases):
        if name in REGISTRY or name in _ALIASES:
            raise ValueError(f"operator name {name!r} is already registered")
    REGISTRY[spec.name] = spec
    _ALIASES.update({a: spec.name for a in spec.aliases})
    return spec


def unregister(name: str) -> None:
    """Remove an operator and its aliases (tests that register a toy operator)."""
    spec = REGISTRY.pop(name)
    for a in spec.aliases:
        _ALIASES.pop(a, None)


def get_operator(name: str) -> OperatorSpec:
    """The spec of an operator by name or alias (case-insensitive); InvalidRequest otherwise."""
    key = str(name).strip().lower()
    spec = REGISTRY.get(_ALIASES.get(key, key))
    if spec is None:
        raise InvalidRequest(f"unknown operator {name!r}; choose one of "
                             f"{', '.join([*REGISTRY, *_ALIASES])}", field="operator")
    return spec


def mergekit_methods() -> dict[str, OperatorSpec]:
    """mergekit merge_method name -> the operator that implements it."""
    return {s.mergekit.name: s for s in REGISTRY.values() if s.mergekit is not None}
