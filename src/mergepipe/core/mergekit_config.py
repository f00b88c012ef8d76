"""Translate a mergekit YAML config into a MergePipe merge request, refusing what we cannot honour."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from mergepipe.core import safe_yaml
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.mergekit_params import (
    REFUSED_KEYS,
    TOP_LEVEL_KEYS,
    as_mapping,
    check_params,
    dtypes,
    global_params,
    lift_model_params,
    method_spec,
    request_params,
)
from mergepipe.core.mergekit_tokenizer import TokenizerOptions, parse_tokenizer
from mergepipe.core.operators import OperatorSpec
from mergepipe.core.request import Budget
from mergepipe.core.tensor_params import (
    SHARED_PARAMS,
    TENSOR_PARAMS,
    is_scalar,
    representative,
)

BudgetSpec = str | float | dict[str, Any] | Budget | None  # what build_request takes


@dataclass(frozen=True)
class ModelRef:
    """A model as the config names it: a registered name or a local path, maybe `MODEL+LORA`."""

    key: str  # the YAML key that names it, e.g. "models[2].model"
    text: str  # as written, without the LoRA part
    lora: str | None = None  # mergekit's `model+adapter`: a PEFT adapter applied to `text`

    def same_model(self, other: ModelRef) -> bool:
        """Whether two references name the same checkpoint: the same text, or the same path
        written two ways ("./base/" and "base"). Decided on the text alone: a config is parsed
        before its paths are confined, so the file system is not asked (no oracle of which
        paths exist outside the data roots); the catalog matches paths once located."""
        return self.text == other.text or os.path.normpath(self.text) == os.path.normpath(
            other.text)


@dataclass(frozen=True)
class ConfigExpert:
    """One non-base entry of `models:` with its resolved parameters."""

    ref: ModelRef
    weight: float
    density: float | None
    # per-tensor settings (gradients, filter: values): name -> [the model's, the global one]
    chains: dict[str, list[Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class MergekitConfig:
    """A parsed, validated mergekit config (no catalog access yet)."""

    operator: str
    base: ModelRef | None
    experts: tuple[ConfigExpert, ...]
    params: dict[str, Any]  # MergePipe request params (normalize, lambda, rescale, density)
    output_dtype: str | None
    base_weight: float | None = None  # the base's own weight, for methods that average it in
    notes: tuple[str, ...] = ()  # how the config was read, for the user
    compute_dtype: str = "files"  # mergekit's `dtype` (files: the inputs' own, per tensor)
    base_position: int | None = None  # the base's place among linear's inputs
    tokenizer: TokenizerOptions | None = None  # tokenizer_source, tokenizer:, chat_template

    def request_args(self, base: str, experts: list[str]) -> dict[str, Any]:
        """build_request keyword arguments, given the catalog names of the base and experts."""
        params = {**self.params, "semantics": "mergekit", "compute_dtype": self.compute_dtype}
        if self.base_weight is not None:
            params["base_weight"] = self.base_weight
            params["base_position"] = self.base_position
        per_tensor = {name: [e.chains.get(name) for e in self.experts] for name in TENSOR_PARAMS
                      if any(name in e.chains for e in self.experts)}
        if per_tensor:
            params["tensor_params"] = per_tensor
        return {
            "base": base,
            "experts": [{"model": n, "weight": e.weight, **({"density": e.density}
                                                             if e.density is not None else {})}
                        for n, e in zip(experts, self.experts, strict=True)],
            "operator": self.operator,
            "params": params,
            "output_dtype": self.output_dtype,
        }

    def as_soup(self) -> MergekitConfig:
        """linear without base_model whose models are not all experts of one registered base:
        mergekit averages the models themselves (a model soup). The first model with one weight
        becomes the base, kept in the average at its place with its weight; the others are its
        experts. The same sum in the same order: mergekit's bytes."""
        k = next((i for i, e in enumerate(self.experts)
                  if e.ref.lora is None and "weight" not in e.chains), None)
        if k is None or len(self.experts) < 2:
            raise InvalidRequest(
                "base_model: missing. A linear merge without base_model averages the models "
                "(a model soup); MergePipe stores one of them as the base, which needs two models "
                "or more and one full checkpoint with a single weight" + (
                    "" if len(self.experts) < 2 else " (every model has per-tensor weights)"),
                field="base_model")
        chosen = self.experts[k]
        note = (f"no base_model: a model soup as in mergekit ({chosen.ref.key} "
                f"{chosen.ref.text!r} is registered as the base and averaged in with weight "
                f"{chosen.weight:g}, the other models as its experts)")
        return replace(self, base=chosen.ref, experts=self.experts[:k] + self.experts[k + 1:],
                       base_weight=chosen.weight, base_position=k, notes=(*self.notes, note))

    def yaml_key(self, request_field: str | None) -> str | None:
        """A build_request field name -> the config key a user would edit."""
        if request_field is None:
            return None
        m = re.match(r"experts\[(\d+)\](.*)", request_field)
        if m:
            ref = self.experts[int(m.group(1))].ref
            suffix = m.group(2).lstrip(".")
            return ref.key.removesuffix(".model") + (f".parameters.{suffix}" if suffix else "")
        return {"operator": "merge_method", "experts": "models", "base": "base_model",
                "density": "parameters.density"}.get(
            request_field, request_field.replace("params.", "parameters.", 1))


# -- parsing (pure) ---------------------------------------------------------------------------

# YAML is parsed in pure Python (about 13 s of CPU per megabyte): a config is a few kilobytes.
MAX_CONFIG_BYTES = 64 * 1024


def parse_config(text: str | bytes) -> MergekitConfig:
    """Parse and validate a mergekit YAML config; raise InvalidRequest naming the key and why."""
    doc = load_document(text)
    _check_keys(doc)
    notes: list[str] = []
    tokenizer = parse_tokenizer(doc)
    spec = method_spec(doc.get("merge_method"))
    op = spec.name
    compute, out_dtype = dtypes(doc, notes)
    gparams = check_params(as_mapping(doc.get("parameters"), "parameters"), global_params(spec),
                           "parameters", spec, notes)
    gparams = lift_model_params(spec, doc.get("models"), doc.get("base_model"), gparams)
    base = _base(doc, spec)
    in_average = spec.mergekit is not None and spec.mergekit.base_in_average
    models = doc.get("models")
    if not isinstance(models, list) or not models:
        raise InvalidRequest("models: required, a non-empty list of {model: PATH, parameters: "
                             "{weight, density}}", field="models")
    experts, base_weight, base_at = _read_models(models, spec, base, gparams, notes)
    if not experts:
        raise InvalidRequest("models: lists only the base model; add the experts to merge",
                             field="models")
    named = sorted({n for e in experts for n in e.chains})
    if named:
        notes.append(f"per-tensor {' and '.join(named)} (gradients across the layers, filter: "
                     "values) are resolved at each tensor as mergekit does; the plan and the "
                     "manifest list them (tensor_params)")
    if in_average and base is not None and base_at is None:
        base_weight = _base_weight(gparams.get("weight"), "base_model")  # mergekit appends it
        base_at = len(experts)
    if base_weight:
        notes.append(f"base_model takes part in the {op} average with weight {base_weight:g}, "
                     "as in mergekit")
    params = request_params(spec, gparams, notes)
    return MergekitConfig(op, base, tuple(experts), params, out_dtype, base_weight, tuple(notes),
                          compute, base_at if in_average else None, tokenizer)


def _check_keys(doc: dict[Any, Any]) -> None:
    """Unknown top-level keys, and the known ones MergePipe refuses, named."""
    for key in doc:
        if key not in TOP_LEVEL_KEYS:
            raise InvalidRequest(f"{key}: unknown key; a mergekit config has "
                                 f"{', '.join(sorted(TOP_LEVEL_KEYS))}", field=str(key))
    for key, why in REFUSED_KEYS.items():
        if doc.get(key) not in (None, [], {}):
            raise InvalidRequest(f"{key}: not supported: {why}", field=key)


def _base(doc: dict[Any, Any], spec: OperatorSpec) -> ModelRef | None:
    """base_model, checked against what the method needs."""
    base = _ref(doc["base_model"], "base_model") if doc.get("base_model") is not None else None
    method = spec.mergekit
    if base is None and method is not None and method.base_needed:
        raise InvalidRequest(f"base_model: required: {method.base_needed}; add "
                             "base_model: PATH", field="base_model")
    if base is None and not (method is not None and method.base_in_average):
        raise InvalidRequest(f"base_model: required: mergekit's {spec.name} refuses a config "
                             "without one (\"Merge method requires a base input\"); add "
                             "base_model: PATH", field="base_model")
    if base is not None and base.lora:
        raise InvalidRequest(f"base_model: {base.text}+{base.lora} applies a LoRA adapter to the "
                             "base; the base must be a full checkpoint (list the adapter under "
                             "models: as base+adapter)", field="base_model")
    return base


def load_document(text: str | bytes) -> dict[Any, Any]:
    """The YAML document of a config: a mapping, bounded in size and nesting."""
    if len(text) > MAX_CONFIG_BYTES:
        raise InvalidRequest(f"config is {len(text)} characters long, over the "
                             f"{MAX_CONFIG_BYTES} limit of a mergekit config", field="config")
    try:
        doc = safe_yaml.load(text)
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        why = str(getattr(e, "problem", None) or e)[:200]
        raise InvalidRequest(f"config is not valid YAML{at}: {why}", field="config") from None
    except RecursionError:  # the YAML parser recurses once per nesting level
        raise InvalidRequest("config is nested too deeply to be a mergekit config",
                             field="config") from None
    if not isinstance(doc, dict):
        raise InvalidRequest("config must be a YAML mapping with merge_method, base_model and "
                             "models keys", field="config")
    return doc


def _read_models(models: list[Any], spec: OperatorSpec, base: ModelRef | None,
                 gparams: dict[str, Any], notes: list[str]
                 ) -> tuple[list[ConfigExpert], float | None, int | None]:
    """The experts of `models:`, the base's weight where the method averages it in, and
    the base's place among the inputs (None: not listed)."""
    in_average = spec.mergekit is not None and spec.mergekit.base_in_average
    experts: list[ConfigExpert] = []
    base_weight: float | None = None
    base_at: int | None = None
    for i, entry in enumerate(models):
        key = f"models[{i}]"
        entry = _entry(entry, key)
        ref = _ref(entry["model"], f"{key}.model")
        mparams = check_params(as_mapping(entry.get("parameters"), f"{key}.parameters"),
                               global_params(spec), f"{key}.parameters", spec, notes)
        for name in SHARED_PARAMS:
            if mparams.pop(name, None) is not None:
                notes.append(f"{key}.parameters.{name}: ignored: mergekit's {spec.name} reads "
                             f"{name} only from the global parameters: (as mergekit does)")
        weight = mparams.get("weight", gparams.get("weight"))
        if base is not None and ref.lora is None and ref.same_model(base):
            base_at = len(experts)
            if in_average:
                base_weight = _base_weight(weight, f"{key}.parameters.weight")
            elif mparams:
                notes.append(f"{key}: parameters of the base model are ignored by {spec.name} "
                             "(as in mergekit)")
            continue
        experts.append(_expert(ref, key, weight, spec, mparams, gparams))
    return experts, base_weight, base_at


def _entry(entry: object, key: str) -> dict[Any, Any]:
    """One entry of models: as a mapping with a model: key (a bare string is the model)."""
    if isinstance(entry, str):
        entry = {"model": entry}
    if not isinstance(entry, dict) or "model" not in entry:
        raise InvalidRequest(f"{key}: each entry needs a model: key", field=key)
    extra = set(entry) - {"model", "parameters"}
    if extra:
        bad = f"{key}.{sorted(extra)[0]}"
        raise InvalidRequest(f"{bad}: unknown key; an entry of models: has model and "
                             "parameters", field=bad)
    return entry


def _expert(ref: ModelRef, key: str, weight: object, spec: OperatorSpec,
            mparams: dict[str, Any], gparams: dict[str, Any]) -> ConfigExpert:
    """A non-base model with its weight, density and per-tensor settings."""
    if weight is None and spec.mergekit is not None and not spec.mergekit.weights:
        weight = 1.0  # the method takes no weights (slerp, model_stock)
    if weight is None:
        raise InvalidRequest(f"{key}.parameters.weight: missing; mergekit's {spec.name} "
                             "requires a weight for every model (\"Missing required "
                             "parameter weight\"): give it here or under parameters:",
                             field=f"{key}.parameters.weight")
    chains = _chains(mparams, gparams)
    if "weight" in chains:
        weight = representative(chains["weight"])
    density = mparams.get("density")
    if "density" in chains:
        density = representative(chains["density"])
    return ConfigExpert(ref, float(weight),  # type: ignore[arg-type]
                        None if density is None else float(density), chains)


def _chains(mparams: dict[str, Any], gparams: dict[str, Any]) -> dict[str, list[Any]]:
    """The per-tensor parameters of one model: the model's setting, then the global one (as
    mergekit's resolver tries them), where the first that applies is not one number; a shared
    parameter (slerp's t) has the global setting alone."""
    out = {}
    for name in TENSOR_PARAMS:
        m, g = (None if name in SHARED_PARAMS else mparams.get(name)), gparams.get(name)
        first = m if m is not None else g
        if first is not None and not is_scalar(first):
            out[name] = [s for s in (m, g) if s is not None]
    return out


def _base_weight(weight: object, key: str) -> float:
    """mergekit's linear averages base_model in too, and insists on its weight; so do we."""
    if weight is not None and not is_scalar(weight):
        raise InvalidRequest(f"{key}: the base's own weight in linear's average takes one value "
                             "in MergePipe, not per-tensor values (a gradient or filter: values); "
                             "give the base a single weight under models:", field=key)
    if weight is None:
        raise InvalidRequest(
            f"{key}: linear with a base_model averages the base in too (as mergekit does) and "
            "needs its weight: list the base under models: with parameters: {weight: 0} to keep "
            "it out of the average, or a positive weight to blend it in", field=key)
    return float(weight)  # type: ignore[arg-type]


def _ref(value: object, key: str) -> ModelRef:
    if isinstance(value, dict):
        raise InvalidRequest(f"{key}: give the model as a string (a registered model name, a "
                             "local path or a Hub id, optionally MODEL+LORA)", field=key)
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(f"{key}: must be a model name or a local path", field=key)
    text = value.strip()
    model, _, lora = text.partition("+")
    if not model or (text.count("+") and not lora) or "+" in lora:
        raise InvalidRequest(f"{key}: {text!r} must be MODEL or MODEL+LORA_ADAPTER", field=key)
    return ModelRef(key, model, lora or None)

