"""`config_yaml` in POST /v1/plans and /v1/merges: a mergekit config resolved against the catalog."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from mergepipe.service import store
from mergepipe.service.paths import confine_input
from mergepipe.service.routes.plans import to_request
from mergepipe.service.schemas import PlanIn
from mergepipe.service.state import AppState

from mergepipe.core.errors import MergePipeError
from mergepipe.core.request import MergeRequest
from mergepipe.jobs.mergekit_resolve import load_config, not_found

# Fields of the JSON body that the config replaces.
REPLACED = ("base", "experts", "operator", "params")


def body_request(st: AppState, body: PlanIn, output_dtype: str | None = None) -> MergeRequest:
    """The merge request of a plan/merge body: its JSON fields, or its mergekit config.

    Models in the config are registered names or paths inside MERGEPIPE_DATA_ROOTS (relative:
    to the first root); unregistered paths are ingested, with statistics, before this returns.
    `budget`, `seed` and `output.dtype` of the body apply on top of the config.
    """
    if body.config_yaml is None:
        return to_request(body, output_dtype)
    budget = body.budget.model_dump(exclude_none=True) if body.budget is not None else None

    def locate(text: str, key: str) -> Path:
        try:
            return confine_input(text, st.settings.data_roots, field=key)
        except MergePipeError as e:
            if "does not exist" in e.message:
                raise not_found(text, key) from None
            raise

    try:
        with st.names:  # names of models ingested here are claimed as POST /v1/models does
            reserved = {str(j["model"]) for j in store.unfinished_ingest_models(st.cat)}
            request, _ = load_config(st.cat, body.config_yaml, budget=budget, seed=body.seed,
                                     locate=locate, reserved=reserved)
    except MergePipeError as e:
        if e.field in ("budget", "seed"):
            raise
        key = f"config_yaml.{e.field}" if e.field else "config_yaml"
        raise type(e)(f"config_yaml: {e.message}", field=key) from None
    if output_dtype:
        from mergepipe.catalog.safetensors_format import normalize_dtype
        request = replace(request, output_dtype=normalize_dtype(output_dtype))
    return request
