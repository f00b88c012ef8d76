"""The README.md model card: Hugging Face front matter with lineage, parameters and realized I/O."""

from __future__ import annotations

import yaml

from executor.model_card import render_model_card

REQUEST = {"base": "org/base", "operator": "ties", "seed": 7, "output_dtype": "BF16",
           "experts": [{"model": "org/code", "weight": 1.0, "density": 0.5},
                       {"model": "org/math", "weight": 0.5, "density": None}],
           "params": {"normalize": True, "lambda": 1.0, "density": 0.5},
           "budget": {"fraction": 0.3}}
SUMMARY = {"merge_id": "m-42", "plan_hash": "ab" * 32, "budget_bytes": 3000,
           "full_read_bytes": 10_000, "planned_expert_bytes": 2990, "expert_bytes_read": 2990,
           "base_bytes_read": 12_000, "omission_bound": None}


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    head, _, _ = card[4:].partition("\n---\n")
    return yaml.safe_load(head)


def test_front_matter_lists_lineage_tags_and_io() -> None:
    meta = front_matter(render_model_card(REQUEST, SUMMARY, name="code-math"))
    assert meta["base_model"] == ["org/base", "org/code", "org/math"]
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
    card = render_model_card(REQUEST, SUMMARY, name="code-math")
    body = card.split("\n---\n", 1)[1]
    assert "# code-math" in body and "TIES merge of 2 experts onto `org/base`" in body
    assert "| `org/code` | 1 | 0.5 |" in body
    assert "30% of the full-read cost" in body and "(29.9%)" in body
    assert "mergepipe replay m-42" in body
    assert len(body.splitlines()) < 40


def test_bytes_budget_full_read_and_bound() -> None:
    req = {**REQUEST, "operator": "linear", "budget": {"bytes": 3 * 2**20},
           "params": {"normalize": True}}
    summ = {**SUMMARY, "expert_bytes_read": 10_000, "omission_bound": 0.0}
    card = render_model_card(req, summ)
    assert "3.0 MiB of expert reads" in card
    assert "equals the standard full-read merge" in card
    assert "Bound on the L2 distance" in card
    assert front_matter(card)["mergepipe"]["omission_bound"] == 0.0


def test_deterministic() -> None:
    assert render_model_card(REQUEST, SUMMARY) == render_model_card(REQUEST, SUMMARY)
