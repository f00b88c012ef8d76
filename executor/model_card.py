"""Render the README.md model card of a merge output (Hugging Face front matter + a short body)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

CARD_FILE = "README.md"
TAGS = ("merge", "mergepipe")
HF_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
OPERATOR_TITLES = {"linear": "linear (weighted average)", "task_arithmetic": "task arithmetic",
                   "ties": "TIES", "dare_linear": "DARE (linear)", "dare_ties": "DARE-TIES"}


def render_model_card(request: Mapping[str, Any], summary: Mapping[str, Any], *,
                      name: str | None = None) -> str:
    """The model card text for a merge of `request` (MergeRequest.to_dict()) and its run summary.

    `summary` holds the run's keys (merge_id, plan_hash, budget_bytes, full_read_bytes,
    planned_expert_bytes, expert_bytes_read, omission_bound, output dtype...); missing ones are
    left out. Pure: no I/O, same inputs give the same text.
    """
    experts = [dict(e) for e in request.get("experts", ())]
    base = str(request["base"])
    op = str(request["operator"])
    params = {k: v for k, v in dict(request.get("params") or {}).items() if v is not None}
    budget = dict(request.get("budget") or {"fraction": 1.0})
    io = _io(summary)
    meta: dict[str, Any] = {
        "base_model": [base] + [str(e["model"]) for e in experts],
        "base_model_relation": "merge",
        "library_name": "transformers",
        "tags": list(TAGS) + [op.replace("_", "-")],
        "mergepipe": {
            **({"merge_id": summary["merge_id"]} if summary.get("merge_id") else {}),
            "operator": op,
            "base": base,
            "experts": [{k: v for k, v in e.items() if v is not None} for e in experts],
            "parameters": params,
            "seed": request.get("seed", 0),
            "budget": budget,
            **io,
            **({"plan_hash": summary["plan_hash"]} if summary.get("plan_hash") else {}),
            **({"output_dtype": d} if (d := request.get("output_dtype")
                                       or summary.get("output_dtype")) else {}),
        },
    }
    front = yaml.safe_dump(meta, sort_keys=False, default_flow_style=False, allow_unicode=True)
    body = _body(name, base, op, experts, params, budget, io,
                 {**summary, "output_dtype": request.get("output_dtype")})
    return f"---\n{front}---\n\n{body}"


def _io(summary: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("budget_bytes", "full_read_bytes", "planned_expert_bytes", "expert_bytes_read",
            "base_bytes_read", "omission_bound")
    out = {k: summary[k] for k in keys if summary.get(k) is not None}
    full, read = out.get("full_read_bytes"), out.get("expert_bytes_read")
    if full and read is not None:
        out["read_fraction"] = round(read / full, 6)
    return out


def _body(name: str | None, base: str, op: str, experts: list[dict[str, Any]],
          params: Mapping[str, Any], budget: Mapping[str, Any], io: Mapping[str, Any],
          summary: Mapping[str, Any]) -> str:
    title = name or str(summary.get("output_name") or "Merged model")
    lines = [f"# {title}", "",
             f"A {OPERATOR_TITLES.get(op, op)} merge of {len(experts)} expert"
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
    config = mergekit_config(base, op, experts, params, summary.get("output_dtype"))
    if config is not None:
        lines += ["The same merge at full budget as a mergekit config (model names as registered "
                  "in the catalog):", "", "```yaml", config.rstrip(), "```", ""]
    if summary.get("merge_id"):
        lines += ["Reproduce and verify it from the catalog that made it:", "",
                  "```", f"mergepipe replay {summary['merge_id']}", "```", ""]
    lines += ["The access set, plan hash, bytes read and lineage are in the manifest beside the "
              "weights and in the catalog tables `merges`, `touched_blocks` and `lineage`.", ""]
    return "\n".join(lines)


def mergekit_config(base: str, op: str, experts: list[dict[str, Any]],
                    params: Mapping[str, Any], output_dtype: str | None = None) -> str | None:
    """The request as an equivalent mergekit 0.1.x YAML config, or None if it has none."""
    p = dict(params)
    p.pop("utility", None)  # the planner's ranking under a budget: no mergekit equivalent needed
    if p.pop("renormalize", "fixed") != "fixed":
        return None  # per-block renormalization over the experts read: a budget-only notion
    rescale = p.pop("rescale", None)
    if rescale == "density":
        return None  # mergekit's DARE rescale is l1 (or none)
    if rescale is not None:
        p["rescale"] = rescale == "l1"
    models: list[dict[str, Any]] = []
    if op == "linear":
        # mergekit's linear averages every listed model, the base too: give it the weight that
        # makes M = B + sum c_i (E_i - B).
        lam = float(p.pop("lambda", 1.0))
        w = [float(e.get("weight", 1.0)) for e in experts]
        total = sum(w)
        c = [lam * x / total for x in w] if p.pop("normalize", True) else [lam * x for x in w]
        models.append({"model": base, "parameters": {"weight": 1.0 - sum(c)}})
        models += [{"model": str(e["model"]), "parameters": {"weight": ci}}
                   for e, ci in zip(experts, c, strict=True)]
        p = {"normalize": False}
    else:
        for e in experts:
            mp = {"weight": float(e.get("weight", 1.0))}
            if e.get("density") is not None:
                mp["density"] = float(e["density"])
            models.append({"model": str(e["model"]), "parameters": mp})
    doc: dict[str, Any] = {"merge_method": op, "base_model": base, "models": models,
                           "parameters": p, "dtype": "float32"}
    if output_dtype:
        doc["out_dtype"] = HF_DTYPES[output_dtype]
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)


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
