"""Translate a mergekit YAML config into a MergePipe merge request, refusing what we cannot honour."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from mergepipe.core.errors import InvalidRequest
from mergepipe.core.request import Budget, MergeRequest, build_request

SUPPORTED_METHODS = ("linear", "task_arithmetic", "ties", "dare_linear", "dare_ties")
# mergekit methods we know and why each is refused (they stay on the list for later).
_SPHERICAL = ("interpolates along the sphere between whole tensors, which is not a sum of "
              "per-block deltas: a block budget could neither be honoured nor bounded")
REFUSED_METHODS = {
    "slerp": _SPHERICAL, "nuslerp": _SPHERICAL, "multislerp": _SPHERICAL,
    "karcher": "needs an iterative mean of every full expert tensor (" + _SPHERICAL + ")",
    "model_stock": "weights each tensor by the angle between the full expert tensors, so every "
                   "expert byte must be read; it cannot run under a budget",
    "passthrough": "stacks or copies layers (frankenmerges); there are no deltas to plan",
    "breadcrumbs": "outlier trimming (gamma) is not implemented yet",
    "breadcrumbs_ties": "outlier trimming (gamma) is not implemented yet",
    "della": "magnitude-ranked drop probabilities (epsilon) are not implemented yet",
    "della_linear": "magnitude-ranked drop probabilities (epsilon) are not implemented yet",
    "sce": "variance-based selection needs every expert tensor at once; not implemented yet",
    "nearswap": "needs the full expert tensor to compare with the base; not implemented yet",
    "arcee_fusion": "needs the full expert tensors to score importance; not implemented yet",
    "ram": "not implemented yet", "ramplus_tl": "not implemented yet",
}
REFUSED_KEYS = {
    "slices": "layer slices (layer_range, frankenmerges) change the architecture; MergePipe "
              "merges whole checkpoints that share the base's tensors - list them under models:",
    "modules": "per-module configs are not supported; list whole models under models:",
    "tokenizer": "tokenizer surgery (merging vocabularies, new tokens) is not supported; the "
                 "output keeps the base's tokenizer files",
    "chat_template": "chat templates are not edited; the output keeps the base's tokenizer files "
                     "(edit tokenizer_config.json after the merge)",
}
TOP_LEVEL_KEYS = {"merge_method", "base_model", "models", "parameters", "dtype", "out_dtype",
                  "tokenizer_source", *REFUSED_KEYS}
MODEL_PARAMS = {"weight", "density"}
GLOBAL_PARAMS = {"weight", "density", "normalize", "lambda", "rescale", "int8_mask"}
_NUMBER_PARAMS = {"weight", "density", "lambda"}
SUM_TOLERANCE = 1e-6
BudgetSpec = str | float | dict[str, Any] | Budget | None  # what build_request takes


@dataclass(frozen=True)
class ModelRef:
    """A model as the config names it: a registered name or a local path, maybe `MODEL+LORA`."""

    key: str  # the YAML key that names it, e.g. "models[2].model"
    text: str  # as written, without the LoRA part
    lora: str | None = None  # mergekit's `model+adapter`: a PEFT adapter applied to `text`

    def same_model(self, other: ModelRef) -> bool:
        """Whether two references name the same checkpoint (same text or the same path)."""
        if self.text == other.text:
            return True
        try:
            return os.path.samefile(self.text, other.text)
        except OSError:
            return False


@dataclass(frozen=True)
class ConfigExpert:
    """One non-base entry of `models:` with its resolved parameters."""

    ref: ModelRef
    weight: float
    density: float | None


@dataclass(frozen=True)
class MergekitConfig:
    """A parsed, validated mergekit config (no catalog access yet)."""

    operator: str
    base: ModelRef | None
    experts: tuple[ConfigExpert, ...]
    params: dict[str, Any]  # MergePipe request params (normalize, lambda, rescale, density)
    output_dtype: str | None
    base_weight: float | None = None  # linear only: the base's own weight in the average
    notes: tuple[str, ...] = ()  # how the config was read, for the user

    def request_args(self, base: str, experts: list[str]) -> dict[str, Any]:
        """build_request keyword arguments, given the catalog names of the base and experts."""
        weights = [e.weight for e in self.experts]
        params = dict(self.params)
        if self.operator == "linear":
            weights, params["normalize"] = _linear_coefficients(self, weights)
        return {
            "base": base,
            "experts": [{"model": n, "weight": w, **({"density": e.density}
                                                      if e.density is not None else {})}
                        for n, w, e in zip(experts, weights, self.experts, strict=True)],
            "operator": self.operator,
            "params": params,
            "output_dtype": self.output_dtype,
        }


@dataclass
class ResolvedConfig:
    """A config whose models are catalog names; `ingested` lists the models registered for it."""

    config: MergekitConfig
    base: str
    experts: list[str]
    ingested: list[str] = field(default_factory=list)

    def request(self, *, budget: BudgetSpec = None, seed: int | None = 0) -> MergeRequest:
        """The validated merge request; errors name the YAML key."""
        args = self.config.request_args(self.base, self.experts)
        try:
            return build_request(**args, budget=budget, seed=seed)
        except InvalidRequest as e:
            key = _yaml_key(e.field, self.config)
            if key == e.field:
                raise
            raise InvalidRequest(f"{key}: {e.message}", field=key) from None


# -- parsing (pure) ---------------------------------------------------------------------------

# YAML is parsed in pure Python (about 13 s of CPU per megabyte): a config is a few kilobytes.
MAX_CONFIG_BYTES = 64 * 1024


def parse_config(text: str | bytes) -> MergekitConfig:
    """Parse and validate a mergekit YAML config; raise InvalidRequest naming the key and why."""
    if len(text) > MAX_CONFIG_BYTES:
        raise InvalidRequest(f"config is {len(text)} characters long, over the "
                             f"{MAX_CONFIG_BYTES} limit of a mergekit config", field="config")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        raise InvalidRequest(f"config is not valid YAML{at}: {getattr(e, 'problem', e)}",
                             field="config") from None
    except RecursionError:  # the YAML parser recurses once per nesting level
        raise InvalidRequest("config is nested too deeply to be a mergekit config",
                             field="config") from None
    if not isinstance(doc, dict):
        raise InvalidRequest("config must be a YAML mapping with merge_method, base_model and "
                             "models keys", field="config")
    for key in doc:
        if key not in TOP_LEVEL_KEYS:
            raise InvalidRequest(f"{key}: unknown key; a mergekit config has "
                                 f"{', '.join(sorted(TOP_LEVEL_KEYS))}", field=str(key))
    for key, why in REFUSED_KEYS.items():
        if doc.get(key) not in (None, [], {}):
            raise InvalidRequest(f"{key}: not supported: {why}", field=key)
    notes: list[str] = []
    _check_tokenizer_source(doc.get("tokenizer_source"), notes)
    op = _method(doc.get("merge_method"))
    gparams = _mapping(doc.get("parameters"), "parameters")
    _check_params(gparams, GLOBAL_PARAMS, "parameters", op)
    base = _ref(doc["base_model"], "base_model") if doc.get("base_model") is not None else None
    if base is not None and base.lora:
        raise InvalidRequest(f"base_model: {base.text}+{base.lora} applies a LoRA adapter to the "
                             "base; the base must be a full checkpoint (list the adapter under "
                             "models: as base+adapter)", field="base_model")
    models = doc.get("models")
    if not isinstance(models, list) or not models:
        raise InvalidRequest("models: required, a non-empty list of {model: PATH, parameters: "
                             "{weight, density}}", field="models")
    default_weight = gparams.get("weight")
    experts: list[ConfigExpert] = []
    base_weight: float | None = None
    base_listed = False
    for i, entry in enumerate(models):
        key = f"models[{i}]"
        if isinstance(entry, str):
            entry = {"model": entry}
        if not isinstance(entry, dict) or "model" not in entry:
            raise InvalidRequest(f"{key}: each entry needs a model: key", field=key)
        extra = set(entry) - {"model", "parameters"}
        if extra:
            bad = f"{key}.{sorted(extra)[0]}"
            raise InvalidRequest(f"{bad}: unknown key; an entry of models: has model and "
                                 "parameters", field=bad)
        ref = _ref(entry["model"], f"{key}.model")
        mparams = _mapping(entry.get("parameters"), f"{key}.parameters")
        _check_params(mparams, MODEL_PARAMS, f"{key}.parameters", op)
        weight = mparams.get("weight", default_weight)
        if base is not None and ref.lora is None and ref.same_model(base):
            base_listed = True
            if op == "linear":
                base_weight = _base_weight(weight, f"{key}.parameters.weight")
            elif mparams:
                notes.append(f"{key}: parameters of the base model are ignored by {op} "
                             "(as in mergekit)")
            continue
        density = mparams.get("density")
        experts.append(ConfigExpert(ref, 1.0 if weight is None else float(weight),
                                    None if density is None else float(density)))
    if not experts:
        raise InvalidRequest("models: lists only the base model; add the experts to merge",
                             field="models")
    if op == "linear" and base is not None and not base_listed:
        base_weight = _base_weight(default_weight, "base_model")
    if base_weight:
        notes.append(f"base_model takes part in the linear average with weight {base_weight:g}, "
                     "as in mergekit")
    params = _request_params(op, gparams, notes)
    out_dtype = _dtype(doc, notes)
    cfg = MergekitConfig(op, base, tuple(experts), params, out_dtype, base_weight, tuple(notes))
    if op == "linear":
        _linear_coefficients(cfg, [e.weight for e in experts])  # refuse early what can't map
    return cfg


def _base_weight(weight: object, key: str) -> float:
    """mergekit's linear averages base_model in too, and insists on its weight; so do we."""
    if weight is None:
        raise InvalidRequest(
            f"{key}: linear with a base_model averages the base in too (as mergekit does) and "
            "needs its weight: list the base under models: with parameters: {weight: 0} to keep "
            "it out of the average, or a positive weight to blend it in", field=key)
    return float(weight)  # type: ignore[arg-type]


def _method(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRequest("merge_method: required (one of " + ", ".join(SUPPORTED_METHODS)
                             + ")", field="merge_method")
    name = value.strip().lower()
    if name in SUPPORTED_METHODS:
        return name
    if name in REFUSED_METHODS:
        raise InvalidRequest(f"merge_method: {value} is not supported: {REFUSED_METHODS[name]}. "
                             f"Supported: {', '.join(SUPPORTED_METHODS)}", field="merge_method")
    raise InvalidRequest(f"merge_method: unknown method {value!r}; supported: "
                         f"{', '.join(SUPPORTED_METHODS)}", field="merge_method")


def _check_tokenizer_source(value: object, notes: list[str]) -> None:
    if value is None:
        return
    if value == "base":
        notes.append("tokenizer_source: base - the output carries the base's tokenizer files")
        return
    raise InvalidRequest(f"tokenizer_source: {value!r} is not supported: tokenizer surgery "
                         "(union vocabularies, another model's tokenizer, resized embeddings) is "
                         "not done; remove the key or use tokenizer_source: base", field=
                         "tokenizer_source")


def _ref(value: object, key: str) -> ModelRef:
    if isinstance(value, dict):
        raise InvalidRequest(f"{key}: give the model as a string (a registered model name or a "
                             "local path, optionally PATH+LORA_PATH)", field=key)
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(f"{key}: must be a model name or a local path", field=key)
    text = value.strip()
    model, _, lora = text.partition("+")
    for part in (model, lora):
        if "@" in part and not os.path.exists(part):
            raise InvalidRequest(f"{key}: {part!r} pins a Hub revision; MergePipe reads only local "
                                 "checkpoints - download that revision and give its directory",
                                 field=key)
    if not model or (text.count("+") and not lora) or "+" in lora:
        raise InvalidRequest(f"{key}: {text!r} must be MODEL or MODEL+LORA_ADAPTER", field=key)
    return ModelRef(key, model, lora or None)


def _mapping(value: object, key: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest(f"{key}: must be a mapping of parameter names to values", field=key)
    return {str(k): v for k, v in value.items()}


def _check_params(params: Mapping[str, Any], allowed: set[str], where: str, op: str) -> None:
    for name, value in params.items():
        key = f"{where}.{name}"
        if name not in allowed:
            raise InvalidRequest(f"{key}: not a parameter MergePipe supports here (supported: "
                                 f"{', '.join(sorted(allowed))})", field=key)
        if isinstance(value, list):
            if value and all(isinstance(v, dict) for v in value):
                raise InvalidRequest(f"{key}: filtered values (filter: ...) set the parameter per "
                                     "tensor name; MergePipe applies one value per model - give a "
                                     "single number", field=key)
            raise InvalidRequest(f"{key}: a list is a gradient (the value interpolated across "
                                 "layers); MergePipe applies one value per model - give a single "
                                 "number", field=key)
        if isinstance(value, dict):
            raise InvalidRequest(f"{key}: filtered values ({sorted(value)}) set the parameter per "
                                 "tensor name; MergePipe applies one value per model - give a "
                                 "single number", field=key)
        if name in _NUMBER_PARAMS and (isinstance(value, bool) or not isinstance(
                value, int | float) or not math.isfinite(value)):
            raise InvalidRequest(f"{key}: must be a finite number, got {value!r}", field=key)
        if name == "density":
            if not 0 < value <= 1:
                raise InvalidRequest(f"{key}: {value} is outside (0, 1] (the fraction of each "
                                     "delta kept)", field=key)
            if op == "ties" and abs(value * 100 - round(value * 100)) > 1e-6:
                raise InvalidRequest(f"{key}: {value} is not on the 1% grid for which the catalog "
                                     "keeps exact TIES trim thresholds; use e.g. "
                                     f"{round(value, 2):g}", field=key)
            if op in ("linear", "task_arithmetic") and value != 1:
                raise InvalidRequest(f"{key}: {op} does not sparsify, so density has no effect "
                                     "(mergekit ignores it too); remove it or use ties / "
                                     "dare_linear / dare_ties", field=key)
        if name in ("normalize", "int8_mask") and not isinstance(value, bool):
            raise InvalidRequest(f"{key}: must be true or false, got {value!r}", field=key)


def _request_params(op: str, g: Mapping[str, Any], notes: list[str]) -> dict[str, Any]:
    """Global mergekit parameters -> MergePipe request params (defaults as mergekit's)."""
    p: dict[str, Any] = {}
    if "normalize" in g:
        p["normalize"] = g["normalize"]
    if "lambda" in g:
        p["lambda"] = float(g["lambda"])
    if "int8_mask" in g:
        notes.append("parameters.int8_mask only saves memory in mergekit; ignored")
    if op in ("ties", "dare_linear", "dare_ties") and "density" in g:
        p["density"] = float(g["density"])
    if "rescale" in g or op.startswith("dare_"):
        p.update(_rescale(op, g.get("rescale"), notes))
    return p


def _rescale(op: str, value: object, notes: list[str]) -> dict[str, str]:
    key = "parameters.rescale"
    if not op.startswith("dare_"):
        if value is False:
            return {}
        raise InvalidRequest(f"{key}: rescaling kept entries applies to dare_linear and dare_ties; "
                             f"{op} with rescale: true is not supported", field=key)
    if value is None or value is True:
        notes.append("parameters.rescale: true (mergekit's default for DARE) -> rescale: l1, "
                     "kept entries rescaled to the dropped block's L1 norm")
        return {"rescale": "l1"}
    if value is False:
        return {"rescale": "none"}
    if value in ("density", "l1", "none"):
        return {"rescale": str(value)}
    raise InvalidRequest(f"{key}: must be true, false, or one of density, l1, none; got "
                         f"{value!r}", field=key)


def _dtype(doc: Mapping[str, Any], notes: list[str]) -> str | None:
    from mergepipe.catalog.safetensors_format import DTYPE_NAMES
    out = None
    for key in ("dtype", "out_dtype"):
        value = doc.get(key)
        if value is None:
            continue
        name = str(value).removeprefix("torch.")
        if name not in DTYPE_NAMES:
            raise InvalidRequest(f"{key}: {value!r} is not supported (float32, float16 or "
                                 "bfloat16)", field=key)
        out = DTYPE_NAMES[name]
    if doc.get("dtype") is not None:
        notes.append("dtype: MergePipe always computes in float32; dtype only sets the output "
                     "dtype when out_dtype is absent (as in mergekit)")
    return out


def _linear_coefficients(cfg: MergekitConfig, weights: list[float]) -> tuple[list[float], bool]:
    """mergekit linear averages the base too when base_model is set: fold that into weights.

    mergekit: M = (w_b B + sum w_i E_i) / (w_b + sum w_i)  (normalize)  or  w_b B + sum w_i E_i.
    MergePipe: M = B + sum c_i D_i with D_i = E_i - B. Normalized: c_i = w_i / total, the base's
    share is implied. Not normalized: exact only when the weights (base included) sum to 1.
    """
    normalize = cfg.params.get("normalize", True)
    bw = cfg.base_weight or 0.0
    total = bw + sum(weights)
    if abs(total) < SUM_TOLERANCE:
        raise InvalidRequest("models: the linear weights (base included) sum to zero",
                             field="models")
    if normalize:
        if cfg.base_weight is None:
            return weights, True
        return [w / total for w in weights], False
    if abs(total - 1) > SUM_TOLERANCE:
        raise InvalidRequest(
            f"parameters.normalize: false with linear weights summing to {total:g} scales the "
            "whole model (mergekit computes sum w_i * model_i); MergePipe adds deltas to the base, "
            "which is exact only when the weights, base included, sum to 1. Use normalize: true, "
            "adjust the weights, or use task_arithmetic", field="parameters.normalize")
    return weights, False


def _yaml_key(request_field: str | None, cfg: MergekitConfig) -> str | None:
    """A build_request field name -> the config key a user would edit."""
    if request_field is None:
        return None
    m = re.match(r"experts\[(\d+)\](.*)", request_field)
    if m:
        ref = cfg.experts[int(m.group(1))].ref
        suffix = m.group(2).lstrip(".")
        return ref.key.removesuffix(".model") + (f".parameters.{suffix}" if suffix else "")
    return {"operator": "merge_method", "experts": "models", "base": "base_model",
            "density": "parameters.density"}.get(
        request_field, request_field.replace("params.", "parameters.", 1))
