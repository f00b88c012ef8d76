"""The README.md model card: Hugging Face front matter with lineage, parameters and realized I/O."""

from __future__ import annotations

from typing import Any, TypedDict

import pytest
import yaml

from mergepipe.core.request import build_request
from mergepipe.executor.model_card import render_model_card

EXPERTS = [{"model": "org/code", "weight": 1.0, "density": 0.5},
           {"model": "org/math", "weight": 0.5}]
REQUEST_ARGS: dict[str, Any] = {"base": "org/base", "operator": "ties", "seed": 7, "output_dtype": "BF16",
                "experts": EXPERTS, "params": {"normalize": True, "lambda": 1.0, "density": 0.5},
                "budget": {"fraction": 0.3}}
REQUEST = build_request(**REQUEST_ARGS)


class Ids(TypedDict):
    merge_id: str
    plan_hash: str


IDS: Ids = {"merge_id": "m-42", "plan_hash": "ab" * 32}
SUMMARY = {"budget_bytes": 3000, "full_read_bytes": 10_000, "planned_expert_bytes": 2990,
           "expert_bytes_read": 2990, "base_bytes_read": 12_000, "omission_bound": None}


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    head, _, _ = card[4:].partition("\n---\n")
    return yaml.safe_load(head)


def test_front_matter_lists_lineage_tags_and_io() -> None:
    hub = {"org/base": "hub-org/base", "org/code": "hub-org/code", "org/math": "hub-org/math"}
    meta = front_matter(render_model_card(REQUEST, SUMMARY, name="code-math", hub_ids=hub, **IDS))
    assert meta["base_model"] == ["hub-org/base", "hub-org/code", "hub-org/math"]
    assert meta["base_model_relation"] == "merge"
    assert {"merge", "mergepipe"} <= set(meta["tags"])
    mp = meta["mergepipe"]
    assert mp["operator"] == "ties" and mp["merge_id"] == "m-42" and mp["seed"] == 7
    assert mp["parameters"] == {"normalize": True, "lambda": 1.0, "density": 0.5}
    assert mp["budget"] == {"fraction": 0.3}
    assert mp["expert_bytes_read"] == 2990 and mp["full_read_bytes"] == 10_000
    assert mp["read_fraction"] == 0.299
    assert mp["experts"][1] == {"model": "org/math", "weight": 0.5}
    assert mp["output_dtype"] == "BF16"
    assert "omission_bound" not in mp


def test_body_is_short_and_human() -> None:
    card = render_model_card(REQUEST, SUMMARY, name="code-math", **IDS)
    body = card.split("\n---\n", 1)[1]
    assert "# code-math" in body and "TIES merge of 2 experts onto `org/base`" in body
    assert "| `org/code` | 1 | 0.5 |" in body
    assert "30% of the full-read cost" in body and "(29.9%)" in body
    assert "mergepipe replay m-42" in body
    assert len(body.splitlines()) < 40


def test_bytes_budget_full_read_and_bound() -> None:
    req = build_request(**{**REQUEST_ARGS, "operator": "linear", "budget": {"bytes": 3 * 2**20},
                           "params": {"normalize": True},
                           "experts": [{k: v for k, v in e.items() if k != "density"}
                                       for e in EXPERTS]})
    summ = {**SUMMARY, "expert_bytes_read": 10_000, "omission_bound": 0.0}
    card = render_model_card(req, summ, **IDS)
    assert "3.0 MiB of expert reads" in card
    assert "equals the standard full-read merge" in card
    assert "Bound on the L2 distance" in card
    assert front_matter(card)["mergepipe"]["omission_bound"] == 0.0


def test_deterministic() -> None:
    assert (render_model_card(REQUEST, SUMMARY, **IDS)
            == render_model_card(REQUEST, SUMMARY, **IDS))


@pytest.mark.parametrize(("op", "params", "densities"), [
    ("linear", {"normalize": True, "lambda": 1.0, "renormalize": "fixed"}, (None, None)),
    ("linear", {"normalize": False, "lambda": 0.5, "renormalize": "fixed"}, (None, None)),
    ("task_arithmetic", {"normalize": False, "lambda": 0.7}, (None, None)),
    ("ties", {"normalize": True, "lambda": 1.0, "density": 0.4}, (0.5, None)),
    ("dare_ties", {"normalize": False, "lambda": 1.0, "rescale": "l1"}, (0.5, 0.3)),
])
def test_card_config_round_trips_through_the_mergekit_parser(
        op: str, params: dict, densities: tuple[float | None, float | None]) -> None:
    """The card's mergekit config, read back by `mergepipe merge CONFIG.yml`, is the same merge."""
    from mergepipe.core.mergekit_config import parse_config
    experts = [{"model": "e1", "weight": 1.0, "density": densities[0]},
               {"model": "e2", "weight": 3.0, "density": densities[1]}]
    req = build_request(base="base", experts=[{k: v for k, v in e.items() if v is not None}
                                              for e in experts],
                        operator=op, params=params, output_dtype="BF16")
    card = render_model_card(req, {})
    text = card.split("```yaml\n", 1)[1].split("```", 1)[0]
    again = build_request(**parse_config(text).request_args("base", ["e1", "e2"]))
    assert again.coefficients() == pytest.approx(req.coefficients())
    assert again.densities() == req.densities() and again.output_dtype == "BF16"
    if op != "linear":  # linear folds lambda and normalize into the weights
        # read back as a mergekit config: mergekit's arithmetic in float32 (the card's dtype)
        assert again.params == {**req.params, "semantics": "mergekit"}
        assert again.weights() == req.weights()


def test_no_config_when_mergekit_has_no_equivalent() -> None:
    req = build_request(**{**REQUEST_ARGS, "operator": "dare_linear",
                           "params": {"rescale": "density"}})
    assert "```yaml" not in render_model_card(req, SUMMARY, **IDS)
