"""mergekit config parameters: which keys each method takes, their checks, and their translation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mergepipe.core.errors import InvalidRequest
from mergepipe.core.operators import OperatorSpec, mergekit_methods
from mergepipe.core.tensor_params import (
    SHARED_PARAMS,
    TENSOR_PARAMS,
    canonical,
    is_scalar,
    number,
    numbers,
    representative,
)
from mergepipe.core.vocab import HF_DTYPE_NAMES, dtype_name, share_problem

# mergekit methods no registered operator implements, and why each is refused.
REFUSED_METHODS = {
    "passthrough": "stacks or copies layers (frankenmerges); there are no deltas to plan",
}
REFUSED_KEYS = {
    "slices": "layer slices (layer_range, frankenmerges): passthrough stacks them, another "
              "method takes one slice of every layer of its models",
    "modules": "per-module configs are not supported; list whole models under models:",
}
TOP_LEVEL_KEYS = {"merge_method", "base_model", "models", "parameters", "dtype", "out_dtype",
                  "tokenizer_source", "tokenizer", "chat_template", *REFUSED_KEYS}
_NUMBER_PARAMS = {"weight", "density", "lambda", "gamma", "epsilon"}


def method_spec(value: object) -> OperatorSpec:
    """The operator of a `merge_method`, or a refusal that says why and what is supported."""
    methods = mergekit_methods()
    supported = ", ".join(methods)
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"merge_method: required (one of {supported})", field="merge_method")
    name = value.strip().lower()
    if name in methods:
        return methods[name]
    if name in REFUSED_METHODS:
        raise InvalidRequest(f"merge_method: {value} is not supported: {REFUSED_METHODS[name]}. "
                             f"Supported: {supported}", field="merge_method")
    raise InvalidRequest(f"merge_method: unknown method {value!r}; supported: {supported}",
                         field="merge_method")


def global_params(spec: OperatorSpec) -> set[str]:
    """The parameter names a method takes (mergekit ignores the others)."""
    assert spec.mergekit is not None
    return {"int8_mask", *(("weight",) if spec.mergekit.weights else ()),
            *(("density",) if spec.density else ()), *spec.mergekit.params}


def as_mapping(value: object, key: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest(f"{key}: must be a mapping of parameter names to values", field=key)
    return {str(k): v for k, v in value.items()}


def check_params(params: Mapping[str, Any], allowed: set[str], where: str,
                 spec: OperatorSpec, notes: list[str]) -> dict[str, Any]:
    """The parameters the method takes, checked; the others are ignored with a note, as
    mergekit ignores them."""
    kept: dict[str, Any] = {}
    for name, value in params.items():
        key = f"{where}.{name}"
        if name not in allowed:
            notes.append(f"{key}: ignored: mergekit's {spec.name} does not take {name} (it "
                         "ignores it too)")
            continue
        if isinstance(value, list | dict):
            if name not in TENSOR_PARAMS:
                raise InvalidRequest(f"{key}: per-tensor values (a gradient list or filter: "
                                     f"values) are supported for {', '.join(TENSOR_PARAMS)}, "
                                     f"not {name}; give a single value", field=key)
            kept[name] = setting = canonical(value, key)
            for v in numbers(setting):
                _check_number(name, v, key)
            continue
        if name in _NUMBER_PARAMS:
            _check_number(name, value, key)
        if name in ("normalize", "int8_mask") and not isinstance(value, bool):
            raise InvalidRequest(f"{key}: must be true or false, got {value!r}", field=key)
        kept[name] = value
    return kept


def _check_number(name: str, value: object, key: str) -> None:
    value = number(value, key)
    why = share_problem(value) if name == "density" else None
    if why is not None:  # here too, for per-tensor values: the pure parse refuses them
        raise InvalidRequest(f"{key}: {why} (the fraction of each delta kept)", field=key)


# per-model in mergekit (NON_BASE scope), one value per merge here
PER_MERGE = ("gamma", "epsilon")


def lift_model_params(spec: OperatorSpec, models: object, base: object,
                      gparams: dict[str, Any]) -> dict[str, Any]:
    """gamma / epsilon given per model: one value for every expert (its own, else the global
    one) becomes the global value; differing values are refused, naming the key."""
    assert spec.mergekit is not None
    out = dict(gparams)
    if not isinstance(models, list):
        return out
    for name in (n for n in PER_MERGE if n in spec.mergekit.params):
        values: list[tuple[str, object]] = []
        for i, entry in enumerate(models):
            if isinstance(entry, dict) and entry.get("model") != base:
                p = entry.get("parameters")
                own = p.get(name, gparams.get(name)) if isinstance(p, dict) else gparams.get(name)
                values.append((f"models[{i}].parameters.{name}", own))
        for key, v in values[1:]:
            if v != values[0][1]:
                raise InvalidRequest(f"{key}: {name} {v!r} differs from {values[0][1]!r} of "
                                     f"another model; MergePipe applies one {name} to every "
                                     "expert - give one value under parameters:", field=key)
        if values and values[0][1] is not None and name not in gparams:
            out[name] = check_params({name: values[0][1]}, {name}, "parameters", spec, [])[name]
    return out


def request_params(spec: OperatorSpec, g: Mapping[str, Any], notes: list[str]
                    ) -> dict[str, Any]:
    """Global mergekit parameters -> the operator's request params (defaults as mergekit's)."""
    assert spec.mergekit is not None
    p: dict[str, Any] = {}
    for key, value in g.items():
        ours = spec.mergekit.params.get(key)
        if ours is not None:  # a shared per-tensor setting: its value at untouched tensors
            p[ours] = value if is_scalar(value) or key not in SHARED_PARAMS else representative(
                [value])
    if "int8_mask" in g:
        notes.append("parameters.int8_mask only saves memory in mergekit; ignored")
    if spec.density and "density" in g and is_scalar(g["density"]):
        p["density"] = float(g["density"])  # per-tensor densities: in each expert's chain
    if "lambda" in p:
        p["lambda"] = float(p["lambda"])
    for name, what in spec.mergekit.required.items():
        if name not in p:
            raise InvalidRequest(f"parameters.{name}: missing; mergekit's {spec.mergekit.name} "
                                 f"requires {what}", field=f"parameters.{name}")
    if spec.mergekit.translate is not None:
        p = spec.mergekit.translate(p, notes)
    return p


def dtypes(doc: Mapping[str, Any], notes: list[str]) -> tuple[str, str | None]:
    """mergekit's `dtype` (the compute dtype: inputs are cast to it; absent, the files' dtype)
    and the written dtype (`out_dtype`, else `dtype`, else None: the base's)."""
    names: dict[str, str | None] = {}
    for key in ("dtype", "out_dtype"):
        value = doc.get(key)
        names[key] = None
        if value is None:
            continue
        try:
            names[key] = dtype_name(str(value))
        except ValueError:
            raise InvalidRequest(f"{key}: {value!r} is not supported (float32, float16 or "
                                 "bfloat16)", field=key) from None
    compute = HF_DTYPE_NAMES[names["dtype"]] if names["dtype"] else "files"
    notes.append(f"the arithmetic runs in {compute if names['dtype'] else 'the files dtype'}, "
                 "operation by operation as in mergekit")
    return compute, names["out_dtype"] or names["dtype"]
