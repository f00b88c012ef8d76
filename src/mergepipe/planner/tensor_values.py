"""Per-(expert, tensor) weights and densities of a request with per-tensor parameters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mergepipe.core.errors import InvalidRequest
from mergepipe.core.operators.ties import grid_index
from mergepipe.core.request import MergeRequest
from mergepipe.core.tensor_params import SHARED_PARAMS, layer_counts, layer_t, resolve
from mergepipe.planner.weights import trim_k

# (model, tensor) -> {"weight": w, "density": d, "t": t}: the values that differ from the expert's
# own (a shared parameter such as slerp's t: from the request's global one)
TensorValues = dict[tuple[str, str], dict[str, float]]


@dataclass(frozen=True)
class Resolved:
    """The request's parameters at every base tensor: what the planner and executor use."""

    values: TensorValues      # only where they differ from the expert's scalar ones
    rows: list[dict[str, Any]]  # planner_tensor_params rows (every expert, every tensor)


def resolve_request(request: MergeRequest, tensors: Sequence[tuple[str, int]]) -> Resolved:
    """Resolve `params.tensor_params` at each base tensor as mergekit does: the model's setting,
    then the global one (a gradient at the tensor's layer position, the first matching filter);
    a missing weight is mergekit's "Missing required parameter weight" (a missing t likewise);
    a missing density is 1."""
    settings = request.params.get("tensor_params")
    if not settings:
        return Resolved({}, [])
    spec = request.spec
    grid = spec.trim and request.whole_tensor is None  # else the kernel's own thresholds
    counts = layer_counts(name for name, _ in tensors)
    scalar_w = request.weights()
    scalar_d = request.densities()
    values: TensorValues = {}
    rows: list[dict[str, Any]] = []
    for tensor, numel in tensors:
        t = layer_t(tensor, counts)
        weights, densities = [], []
        for i, e in enumerate(request.experts):
            w = _value(settings, "weight", i, tensor, t, scalar_w[i])
            if w is None:
                raise InvalidRequest(f"experts[{i}].weight: Missing required parameter weight "
                                     f"for {e.model}.{tensor} (no filter of the model's or the "
                                     "global weight names this tensor)",
                                     field=f"experts[{i}].weight")
            d = _value(settings, "density", i, tensor, t, scalar_d[i])
            weights.append(w)
            densities.append(1.0 if d is None else d)
            shared = _shared(settings, request.params, i, tensor, t)
            if shared:
                values[(e.model, tensor)] = shared
        alphas = spec.coefficients(weights, request.params)
        for i, e in enumerate(request.experts):
            j = _trim_j(densities[i], numel, e.model, tensor, i) if grid else None
            rows.append({"position": i, "tensor": tensor, "rank_weight": abs(alphas[i]),
                         "trim_j": j})
            diff = {k: v for k, v, own in (("weight", weights[i], scalar_w[i]),
                                           ("density", densities[i], scalar_d[i]))
                    if v != own and (k == "weight" or spec.density)}
            if diff:
                values[(e.model, tensor)] = {**values.get((e.model, tensor), {}), **diff}
    return Resolved(values, rows)


def _shared(settings: dict[str, Any], params: dict[str, Any], i: int, tensor: str, t: float
            ) -> dict[str, float]:
    """Expert i's shared parameters (slerp's t, ...) at `tensor` that differ from the global
    scalar ones."""
    shared = {}
    for name in SHARED_PARAMS:
        own = float(params.get(name, 0.0))
        v = _value(settings, name, i, tensor, t, own)
        if v is None:
            raise InvalidRequest(f"params.{name}: Missing required parameter {name} for "
                                 f"{tensor} (no filter of the global {name} names this "
                                 "tensor)", field=f"params.{name}")
        if v != own:
            shared[name] = v
    return shared


def _value(settings: dict[str, Any], name: str, i: int, tensor: str, t: float,
           own: float) -> float | None:
    chains = settings.get(name)
    chain = chains[i] if chains else None
    return own if chain is None else resolve(chain, tensor, t)


def _trim_j(density: float, numel: int, model: str, tensor: str, i: int) -> int:
    """The trim-grid index of a resolved TIES density; refused off the 1% grid, or where
    mergekit's k = max(1, int(density * numel)) is not the grid's k."""
    j = grid_index(density)
    k = max(1, int(density * numel)) if numel else 0
    if j is None or trim_k(j, numel) != k:
        raise InvalidRequest(
            f"experts[{i}].density: ties density {density!r} of {model!r} at tensor {tensor!r} "
            f"(keeping {k} of {numel} entries) is not on the 1% grid of the catalog's exact trim "
            "thresholds; choose gradient endpoints whose interpolation at every layer is a whole "
            "percentage, or filter: values", field=f"experts[{i}].density")
    return j
