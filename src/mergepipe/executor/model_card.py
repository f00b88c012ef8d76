"""Render the README.md model card of a merge output (Hugging Face front matter + a short body)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from mergepipe.catalog.models import ModelRow
from mergepipe.core.errors import MergePipeError
from mergepipe.core.request import MergeRequest
from mergepipe.core.tensor_params import SHARED_PARAMS
from mergepipe.core.vocab import HF_DTYPE_NAMES
from mergepipe.storage.locations import basename, is_url, join, parent, parse_url
from mergepipe.storage.store import store_for

CARD_FILE = "README.md"
TAGS = ("merge", "mergepipe")


def render_model_card(request: MergeRequest, io: Mapping[str, Any], *, name: str | None = None,
                      merge_id: str | None = None, plan_hash: str | None = None,
                      hub_ids: Mapping[str, str] | None = None) -> str:
    """The model card of a merge of `request` (pure); `base_model` lists the inputs' Hub ids."""
    spec = request.spec
    experts = [{"model": e.model, "weight": e.weight, "density": e.density}
               for e in request.experts]
    base, op = request.base, request.operator
    params = {k: v for k, v in request.params.items() if v is not None}
    budget = request.budget.to_dict()
    figures = _io(io)
    ids = list(dict.fromkeys(hub_ids[n] for n in [base, *(e.model for e in request.experts)]
                             if hub_ids and n in hub_ids))
    meta: dict[str, Any] = {
        **({"base_model": ids} if ids else {}),
        **({"base_model_relation": "merge"} if len(ids) > 1 else {}),
        "library_name": "transformers",
        "tags": list(TAGS) + [op.replace("_", "-")],
        "mergepipe": {
            **({"merge_id": merge_id} if merge_id else {}),
            "operator": op,
            "base": base,
            "experts": [{k: v for k, v in e.items() if v is not None} for e in experts],
            "parameters": params,
            "seed": request.seed,
            "budget": budget,
            **figures,
            **({"plan_hash": plan_hash} if plan_hash else {}),
            **({"output_dtype": request.output_dtype} if request.output_dtype else {}),
        },
    }
    front = yaml.safe_dump(meta, sort_keys=False, default_flow_style=False, allow_unicode=True)
    body = _body(name, base, spec.title, experts, params, budget, figures, merge_id,
                 mergekit_config(request))
    return f"---\n{front}---\n\n{body}"


def _io(summary: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("budget_bytes", "full_read_bytes", "planned_expert_bytes", "expert_bytes_read",
            "base_bytes_read", "omission_bound")
    out = {k: summary[k] for k in keys if summary.get(k) is not None}
    full, read = out.get("full_read_bytes"), out.get("expert_bytes_read")
    if full and read is not None:
        out["read_fraction"] = round(read / full, 6)
    return out


def _body(name: str | None, base: str, title: str, experts: list[dict[str, Any]],
          params: Mapping[str, Any], budget: Mapping[str, Any], io: Mapping[str, Any],
          merge_id: str | None, config: str | None) -> str:
    lines = [f"# {name or 'Merged model'}", "",
             f"A {title} merge of {len(experts)} expert"
             f"{'s' if len(experts) != 1 else ''} onto `{base}`, made with "
             "MergePipe under an explicit expert-read budget.", "",
             "| expert | weight | density |", "| --- | --- | --- |"]
    for e in experts:
        dens = e.get("density")
        lines.append(f"| `{e['model']}` | {_num(e.get('weight', 1.0))} | "
                     f"{'-' if dens is None else _num(dens)} |")
    lines.append("")
    if params:
        lines += ["Parameters: " + ", ".join(f"{k} = {_num(v)}" for k, v in params.items()) + ".",
                  ""]
    lines.append(f"- Budget: {_budget(budget)}.")
    if "expert_bytes_read" in io and "full_read_bytes" in io:
        read, full = io["expert_bytes_read"], io["full_read_bytes"]
        share = f" ({100 * read / full:.1f}%)" if full else ""
        lines.append(f"- Expert bytes read: {_size(read)} of the {_size(full)} a full-read merge "
                     f"reads{share}" + (", so the output equals the standard full-read merge."
                                        if full and read >= full else "."))
    if io.get("omission_bound") is not None:
        lines.append(f"- Bound on the L2 distance to the full-budget merge: "
                     f"{io['omission_bound']:.4g}.")
    lines.append("")
    if config is not None:
        lines += ["The same merge at full budget as a mergekit config (model names as registered "
                  "in the catalog):", "", "```yaml", config.rstrip(), "```", ""]
    if merge_id:
        lines += ["Reproduce and verify it from the catalog that made it:", "",
                  "```", f"mergepipe replay {merge_id}", "```", ""]
    lines += ["The access set, plan hash, bytes read and lineage are in the manifest beside the "
              "weights and in the catalog tables `merges`, `touched_blocks` and `lineage`.", ""]
    return "\n".join(lines)


def mergekit_config(request: MergeRequest) -> str | None:
    """The request as an equivalent mergekit 0.1.x YAML config, or None if it has none."""
    method = request.spec.mergekit
    if method is None:
        return None
    p = dict(request.params)
    p.pop("utility", None)  # the planner's ranking under a budget: no mergekit equivalent needed
    mk_semantics = p.pop("semantics", "native") == "mergekit"
    compute = p.pop("compute_dtype", "float32")
    base_weight, base_at = p.pop("base_weight", None), p.pop("base_position", None)
    per_model, shared = _tensor_settings(p.pop("tensor_params", None), len(request.experts))
    mk_params = _mergekit_params(request, p)
    if mk_params is None:
        return None
    models, mk_params = _models(request, mk_params, mk_semantics, per_model, shared,
                                (base_weight, base_at))
    doc: dict[str, Any] = {"merge_method": method.name, "base_model": request.base,
                           "models": models, "parameters": mk_params, "dtype": compute}
    if compute == "files":  # mergekit computes in the inputs' dtype when dtype is absent
        del doc["dtype"]
    if method.base_in_average and mk_semantics and base_weight is None:
        del doc["base_model"]  # mergekit's linear would average a base_model in
    if request.output_dtype:
        doc["out_dtype"] = HF_DTYPE_NAMES[request.output_dtype]
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)


def _mergekit_params(request: MergeRequest, p: dict[str, Any]) -> dict[str, Any] | None:
    """The other parameters under mergekit's names; None when its method cannot express one."""
    method = request.spec.mergekit
    assert method is not None
    if p.pop("renormalize", "fixed") != "fixed":
        return None  # per-block renormalization over the experts read: a budget-only notion
    rescale = p.pop("rescale", None)
    if rescale == "density":
        return None  # mergekit's DARE rescale is l1 (or none)
    if rescale is not None:
        p["rescale"] = rescale == "l1"
    ours = {v: k for k, v in method.params.items() if v is not None}  # our name -> mergekit's
    defaults = {"normalize": request.spec.normalize_default, "lambda": 1.0,
                **{q.name: q.default for q in request.spec.params}}
    if not method.base_in_average and any(k not in ours and k != "density"
                                          and v != defaults.get(k) for k, v in p.items()):
        return None  # a parameter mergekit's method cannot express
    return {ours.get(k, k): v for k, v in p.items() if k in ours or k == "density"}


def _models(request: MergeRequest, p: dict[str, Any], mk_semantics: bool,
            per_model: list[dict[str, Any]], shared: dict[str, Any],
            base_entry: tuple[float | None, int | None]
            ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """mergekit's `models:` list and global parameters of the request."""
    method = request.spec.mergekit
    assert method is not None
    base, (base_weight, base_at) = request.base, base_entry
    models: list[dict[str, Any]] = []
    if method.base_in_average and mk_semantics:  # the config's own inputs, base included
        models = [{"model": e.model, "parameters": _given({"weight": float(e.weight), **own})}
                  for e, own in zip(request.experts, per_model, strict=True)]
        if base_weight is not None:
            models.insert(int(base_at if base_at is not None else len(models)),
                          {"model": base, "parameters": {"weight": float(base_weight)}})
        return models, {"normalize": bool(p.get("normalize", True)), **shared}
    if method.base_in_average:
        # mergekit's linear averages every listed model, the base too: give it the weight that
        # makes M = B + sum c_i (E_i - B).
        c = request.coefficients()
        models.append({"model": base, "parameters": {"weight": 1.0 - sum(c)}})
        models += [{"model": e.model, "parameters": {"weight": ci}}
                   for e, ci in zip(request.experts, c, strict=True)]
        return models, {"normalize": False}
    for e, own in zip(request.experts, per_model, strict=True):
        mp: dict[str, Any] = {"weight": float(e.weight)} if method.weights else {}
        if e.density is not None:
            mp["density"] = float(e.density)
        given = _given({**mp, **own})
        models.append({"model": e.model, **({"parameters": given} if given else {})})
    return models, {**p, **shared}


def _tensor_settings(settings: Mapping[str, Any] | None, n: int
                     ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per-tensor parameters as mergekit settings: each model's own and the global ones."""
    per_model: list[dict[str, Any]] = [{} for _ in range(n)]
    shared: dict[str, Any] = {}
    for name, chains in (settings or {}).items():
        if name in SHARED_PARAMS:  # one global setting (slerp's t), the same in every chain
            shared[name] = next(c[0] for c in chains if c)
            continue
        for chain in chains:
            if chain and len(chain) > 1:
                shared[name] = chain[1]
        for own, chain in zip(per_model, chains, strict=True):
            if chain:
                own[name] = None if chain == [shared.get(name)] else chain[0]
    return per_model, shared


def _given(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v is not None}


def _budget(budget: Mapping[str, Any]) -> str:
    if budget.get("bytes") is not None:
        return f"{_size(int(budget['bytes']))} of expert reads"
    return f"{100 * float(budget.get('fraction', 1.0)):g}% of the full-read cost"


def _num(v: object) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v).lower() if isinstance(v, bool) else str(v)


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


# -- the inputs' Hub ids (`base_model`): recorded by an hf:// location, a Hub cache directory or
# config.json's `_name_or_path`; nothing is fetched (a remote config.json would pass the budget).
# the Hub's repository id: a namespace and a name of letters, digits, '-', '_' and '.'
HUB_ID = re.compile(r"[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9])?/[A-Za-z0-9_.-]{1,96}")
_CACHE = re.compile(r"(?:^|/)models--([\w.-]+?)--([\w.-]+)/snapshots/")
MAX_CONFIG_BYTES = 1 << 20


def hub_ids(models: Iterable[ModelRow]) -> dict[str, str]:
    """Catalog name -> Hub id, for the models that record one."""
    out = {}
    for m in models:
        found = None if m.source_merge else hub_id(m.path)
        if found is not None:
            out[m.name] = found
    return out


def hub_id(path: str) -> str | None:
    """The Hub id of the checkpoint at `path` (a directory or one .safetensors file)."""
    directory = parent(path) if basename(path).endswith(".safetensors") else path
    if is_url(directory):
        url = parse_url(directory)
        repo = f"{url.authority}/{url.key.split('/', 1)[0].partition('@')[0]}"
        return repo if url.scheme == "hf" and _valid(repo) else None
    m = _CACHE.search(directory.rstrip("/") + "/")
    if m and _valid(f"{m.group(1)}/{m.group(2)}"):
        return f"{m.group(1)}/{m.group(2)}"
    try:
        cfg = json.loads(store_for(directory).read_bytes(join(directory, "config.json"),
                                                         MAX_CONFIG_BYTES))
    except (OSError, ValueError, RecursionError, MergePipeError):  # absent, outside the
        return None  # roots, unreadable, not JSON
    name = cfg.get("_name_or_path") if isinstance(cfg, dict) else None
    return name if isinstance(name, str) and _valid(name) else None


def _valid(name: str) -> bool:
    return HUB_ID.fullmatch(name) is not None and ".." not in name and "--" not in name \
        and not name.startswith(".")
