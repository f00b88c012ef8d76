"""Per-tensor parameters of mergekit configs (gradients, `filter:` values), resolved as mergekit does."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mergepipe.core.errors import InvalidRequest
from mergepipe.core.vocab import share_problem

# The parameters a config may give per tensor: the per-model (NON_BASE) ones of mergekit's methods,
# and slerp's `t`, a SHARED one: only the global `parameters:` give it (mergekit reads no model's
# own `t`). A request holds every one as a chain per expert (slerp has one expert).
TENSOR_PARAMS = ("weight", "density", "t")
SHARED_PARAMS = ("t",)
# A setting in canonical JSON: a number; a gradient (a list of numbers, interpolated across the
# layers); or conditionals [{"filter": substring | None, "value": number | gradient}], the first
# whose filter is in the tensor's name winning (None and "*" match every tensor).
Setting = Any
_LAYER = re.compile(r"^(.*?)\.(\d+)\.")  # the first numeric component: model.layers.N.


def canonical(value: object, key: str) -> Setting:
    """A mergekit parameter setting checked and in canonical form; InvalidRequest naming `key`."""
    if isinstance(value, dict):
        return [_conditional(value, key)]
    if isinstance(value, list):
        if not value:
            raise InvalidRequest(f"{key}: an empty list; give a number, a gradient [v0, v1, ...] "
                                 "or filtered values [{filter: ..., value: ...}]", field=key)
        if all(isinstance(v, dict) for v in value):
            return [_conditional(v, f"{key}[{i}]") for i, v in enumerate(value)]
        return [number(v, f"{key}[{i}]") for i, v in enumerate(value)]
    return number(value, key)


def _conditional(d: dict[Any, Any], key: str) -> dict[str, Any]:
    extra = set(d) - {"filter", "value"}
    if extra or "value" not in d:
        raise InvalidRequest(f"{key}: a filtered value is {{filter: SUBSTRING, value: X}}"
                             + (f"; unknown key {sorted(map(str, extra))[0]}" if extra else
                                ": value is missing"), field=key)
    f = d.get("filter")
    if f is not None and not isinstance(f, str):
        raise InvalidRequest(f"{key}.filter: must be a substring of tensor names, got {f!r}",
                             field=f"{key}.filter")
    v = d["value"]
    if isinstance(v, list):
        if not v:
            raise InvalidRequest(f"{key}.value: an empty gradient", field=f"{key}.value")
        value: Any = [number(x, f"{key}.value[{i}]") for i, x in enumerate(v)]
    else:
        value = number(v, f"{key}.value")
    return {"filter": f, "value": value}


def number(v: object, key: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(float(v)):
        raise InvalidRequest(f"{key}: must be a finite number, got {v!r}", field=key)
    return float(v)


def is_scalar(setting: Setting) -> bool:
    return isinstance(setting, float | int) and not isinstance(setting, bool)


def numbers(setting: Setting) -> list[float]:
    """Every number a setting can give (the endpoints of its gradients): what bounds checks see."""
    if is_scalar(setting):
        return [float(setting)]
    out: list[float] = []
    for s in setting:
        out += numbers(s["value"]) if isinstance(s, dict) else [float(s)]
    return out


def evaluate(setting: Setting, tensor: str, t: float) -> float | None:
    """mergekit's evaluate_setting: a number, a gradient interpolated at t, or the first
    conditional whose filter matches the tensor (None: none matches)."""
    if is_scalar(setting):
        return float(setting)
    if setting and all(is_scalar(v) for v in setting):
        scaled = t * (len(setting) - 1)
        i0 = int(scaled)
        i1 = min(len(setting) - 1, i0 + 1)
        frac = scaled - i0
        return float((1 - frac) * setting[i0] + frac * setting[i1])
    for cond in setting:
        f = cond["filter"]
        if f is None or f == "*" or (tensor and f in tensor):
            return evaluate(cond["value"], tensor, t)
    return None


def resolve(chain: Sequence[Setting], tensor: str, t: float) -> float | None:
    """The first setting of `chain` (the model's, then the global one) that gives a value."""
    for s in chain:
        v = evaluate(s, tensor, t)
        if v is not None:
            return v
    return None


def layer_counts(tensors: Iterable[str]) -> dict[str, int]:
    """Layers per stack (the name before the first numeric component: model.layers)."""
    counts: dict[str, int] = {}
    for name in tensors:
        m = _LAYER.match(name)
        if m:
            counts[m.group(1)] = max(counts.get(m.group(1), 0), int(m.group(2)) + 1)
    return counts


def layer_t(tensor: str, counts: Mapping[str, int]) -> float:
    """mergekit's t of a tensor: layer / (layers - 1) in its stack (1 with one layer); 0 for the
    tensors outside the layers (embeddings, final norm, lm_head)."""
    m = _LAYER.match(tensor)
    if not m:
        return 0.0
    n = counts.get(m.group(1), 0)
    return int(m.group(2)) / (n - 1) if n > 1 else 1.0


def representative(chain: Sequence[Setting]) -> float | None:
    """The value of a tensor no filter names, at layer 0 (the expert's scalar in summaries),
    else the first number the chain holds."""
    v = resolve(chain, "", 0.0)
    if v is not None:
        return v
    for s in chain:
        return numbers(s)[0]
    return None


def check_request_settings(value: object, n_experts: int, names: Sequence[str]
                           ) -> dict[str, Any]:
    """A request's `params.tensor_params` ({name: [per expert: None or [setting, ...] in
    precedence order]}) checked and canonical; `names`: the operator's per-tensor parameters."""
    key = "params.tensor_params"
    if not isinstance(value, dict) or not value:
        raise InvalidRequest(f"{key}: must be a mapping of {' / '.join(names)} to one "
                             "list of settings per expert", field=key)
    out: dict[str, Any] = {}
    for name, chains in value.items():
        where = f"{key}.{name}"
        if name not in names:
            raise InvalidRequest(f"{where}: not a per-tensor parameter of this operator",
                                 field=where)
        if not isinstance(chains, list) or len(chains) != n_experts:
            raise InvalidRequest(f"{where}: must list one entry per expert ({n_experts})",
                                 field=where)
        out[name] = [None if c is None else _chain(c, f"{where}[{i}]", name)
                     for i, c in enumerate(chains)]
    return out


def _chain(chain: object, key: str, name: str) -> list[Setting]:
    if not isinstance(chain, list) or not chain:
        raise InvalidRequest(f"{key}: must be a non-empty list of settings", field=key)
    out = [canonical(s, f"{key}[{i}]") for i, s in enumerate(chain)]
    for v in (x for s in out for x in numbers(s)):
        why = share_problem(v) if name == "density" else None
        if why is not None:
            raise InvalidRequest(f"{key}: density {why}", field=key)
    return out
