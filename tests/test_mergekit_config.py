"""mergekit YAML configs: parsing, translation to merge requests, and refusals naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.mergekit_config import parse_config
from mergepipe.core.mergekit_tokenizer import TokenSource, TokenSpec
from mergepipe.core.progress import Progress


def refused(text: str) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as e:
        parse_config(text)
    return e.value


TIES = """
merge_method: ties
base_model: base
models:
  - model: base
  - model: e1
    parameters: {weight: 1.0, density: 0.5}
  - model: e2
    parameters: {weight: 0.5, density: 0.3}
parameters:
  normalize: true
  lambda: 0.9
dtype: bfloat16
out_dtype: float16
"""


def test_ties_config_maps_to_request_args() -> None:
    cfg = parse_config(TIES)
    args = cfg.request_args("B", ["E1", "E2"])
    assert args == {
        "base": "B", "operator": "ties", "output_dtype": "F16",
        "experts": [{"model": "E1", "weight": 1.0, "density": 0.5},
                    {"model": "E2", "weight": 0.5, "density": 0.3}],
        "params": {"normalize": True, "lambda": 0.9, "semantics": "mergekit",
                   "compute_dtype": "bfloat16"},
    }
    assert cfg.base is not None and cfg.base.text == "base"
    assert [e.ref.key for e in cfg.experts] == ["models[1].model", "models[2].model"]


def test_dtype_is_the_compute_dtype_and_the_output_dtype_without_out_dtype() -> None:
    cfg = parse_config("merge_method: task_arithmetic\nbase_model: b\n"
                       "models: [{model: e, parameters: {weight: 1}}]\ndtype: float32\n")
    assert (cfg.output_dtype, cfg.compute_dtype) == ("F32", "float32")
    cfg = parse_config("merge_method: task_arithmetic\nbase_model: b\n"
                       "models: [{model: e, parameters: {weight: 1}}]\n")
    assert (cfg.output_dtype, cfg.compute_dtype) == (None, "files")  # the inputs' own dtype
    assert cfg.request_args("b", ["e"])["params"]["compute_dtype"] == "files"


def test_global_weight_and_density_are_defaults() -> None:
    cfg = parse_config("merge_method: dare_ties\nbase_model: b\nmodels:\n  - model: e1\n"
                       "  - model: e2\n    parameters: {weight: 2}\n"
                       "parameters: {weight: 0.5, density: 0.7, rescale: false}\n")
    args = cfg.request_args("b", ["e1", "e2"])
    assert [e["weight"] for e in args["experts"]] == [0.5, 2.0]
    assert args["params"] == {"density": 0.7, "rescale": "none", "semantics": "mergekit",
                              "compute_dtype": "files"}


def test_dare_rescale_defaults_to_mergekit_l1() -> None:
    cfg = parse_config("merge_method: dare_linear\nbase_model: b\n"
                       "models: [{model: e, parameters: {weight: 1}}]\n")
    assert cfg.params["rescale"] == "l1"
    assert any("rescale" in n for n in cfg.notes)


def test_linear_base_is_an_input_with_its_weight_and_place() -> None:
    # mergekit: M = (1 E1 + 2 B + 1 E2) / 4, summed in that order
    cfg = parse_config("merge_method: linear\nbase_model: b\nmodels:\n"
                       "  - {model: e1, parameters: {weight: 1}}\n"
                       "  - {model: b, parameters: {weight: 2}}\n"
                       "  - {model: e2, parameters: {weight: 1}}\n")
    args = cfg.request_args("b", ["e1", "e2"])
    assert [e["weight"] for e in args["experts"]] == [1.0, 1.0]
    assert (args["params"]["base_weight"], args["params"]["base_position"]) == (2.0, 1)


def test_linear_base_not_listed_comes_last_with_the_global_weight() -> None:
    cfg = parse_config("merge_method: linear\nbase_model: b\nmodels: [e1, e2]\n"
                       "parameters: {weight: 0.5, normalize: false}\n")
    args = cfg.request_args("b", ["e1", "e2"])
    assert (args["params"]["base_weight"], args["params"]["base_position"]) == (0.5, 2)
    assert args["params"]["normalize"] is False  # any weights: mergekit's sum, computed as is


def test_linear_without_base_keeps_mergekit_normalize() -> None:
    cfg = parse_config("merge_method: linear\nmodels:\n  - {model: e1, parameters: {weight: 1}}\n"
                       "  - {model: e2, parameters: {weight: 3}}\n")
    assert cfg.base is None
    args = cfg.request_args("b", ["e1", "e2"])
    assert [e["weight"] for e in args["experts"]] == [1.0, 3.0]
    assert "base_weight" not in args["params"]


def test_parameters_the_method_does_not_take_are_ignored_with_a_note() -> None:
    cfg = parse_config("merge_method: linear\nmodels:\n"
                       "  - {model: e1, parameters: {weight: 1, density: 0.5, gamma: 0.1}}\n"
                       "  - {model: e2, parameters: {weight: 3}}\nparameters: {lambda: 0.5}\n")
    assert "lambda" not in cfg.params and cfg.experts[0].density is None
    for key in ("parameters.lambda", "models[0].parameters.density",
                "models[0].parameters.gamma"):
        assert any(n.startswith(key + ": ignored") for n in cfg.notes), (key, cfg.notes)


def test_weight_is_required_as_in_mergekit() -> None:
    e = refused("merge_method: ties\nbase_model: b\nmodels:\n  - {model: e1, parameters: "
                "{density: 0.5}}\n")
    assert e.field == "models[0].parameters.weight"
    assert "Missing required parameter weight" in e.message
    cfg = parse_config("merge_method: ties\nbase_model: b\nmodels:\n  - {model: e1, parameters: "
                       "{density: 0.5}}\nparameters: {weight: 0.3}\n")
    assert cfg.experts[0].weight == 0.3  # a global weight is every model's


def test_base_model_is_required_where_mergekit_requires_it() -> None:
    for method in ("task_arithmetic", "ties", "dare_linear", "dare_ties"):
        e = refused(f"merge_method: {method}\nmodels:\n  - {{model: e1, parameters: "
                    "{weight: 1}}\n")
        assert e.field == "base_model" and "requires a base input" in e.message


def test_linear_base_needs_a_weight_like_mergekit() -> None:
    e = refused("merge_method: linear\nbase_model: b\nmodels:\n"
                "  - {model: e1, parameters: {weight: 1}}\n  - {model: e2, parameters: {weight: 1}}\n")
    assert e.field == "base_model" and "weight: 0" in e.message


def test_lora_reference() -> None:
    cfg = parse_config("merge_method: task_arithmetic\nbase_model: /m/base\nmodels:\n"
                       "  - model: /m/base+/m/adapter\nparameters: {weight: 1}\n")
    assert cfg.experts[0].ref.text == "/m/base" and cfg.experts[0].ref.lora == "/m/adapter"


@pytest.mark.parametrize(("text", "key", "words"), [
    ("merge_method: passthrough\nbase_model: b\nmodels: [e]", "merge_method", "frankenmerges"),
    ("merge_method: slerp\nbase_model: b\nmodels: [b, e]", "parameters.t", "missing"),
    ("merge_method: frob\nbase_model: b\nmodels: [e]", "merge_method", "unknown method"),
    ("base_model: b\nmodels: [e]", "merge_method", "required"),
    ("merge_method: ties\nbase_model: b\nslices:\n  - sources: [{model: e, layer_range: [0, 2]}]",
     "slices", "layer"),
    ("merge_method: ties\nbase_model: b\nmodels: [e]\ntokenizer_source: union\n"
     "tokenizer: {source: union}", "tokenizer", "not both"),
    ("merge_method: ties\nbase_model: b\nmodels: [e]\ntokenizer: {source: base, tokens: "
     "{x: {force: 2}}}", "tokenizer.tokens.x.force", "true or false"),
    ("merge_method: ties\nbase_model: b\nmodels: [e]\ntokenizer: {source: base, tokens: "
     "{x: {source: {kind: model_token, model: e}}}}", "tokenizer.tokens.x.source",
     "one of token and token_id"),
    ("merge_method: ties\nbase_model: b\nmodels: [e]\ntokenizer: {source: base, tokens: "
     "{x: {source: {kind: mean}}}}", "tokenizer.tokens.x.source", "kind: zero"),
    ("merge_method: ties\nbase_model: b\nmodels: [e]\ntokenizer: {pad_to_multiple_of: 0}",
     "tokenizer.pad_to_multiple_of", "positive integer"),
    ("merge_method: ties\nbase_model: b\nmodels: [e]\nchat_template: hello", "chat_template",
     "not a chat template"),
    ("merge_method: ties\nbase_model: b\nmodels:\n  - model: e\n    parameters:\n"
     "      weight: []", "models[0].parameters.weight", "empty list"),
    ("merge_method: ties\nbase_model: b\nmodels: [e]\nparameters: {lambda: [1, 2]}",
     "parameters.lambda", "gradient"),
    ("merge_method: ties\nbase_model: b\nmodels:\n  - {model: e, parameters: {density: 1.5}}",
     "models[0].parameters.density", "outside (0, 1]"),
    ("merge_method: ties\nbase_model: b\nmodels:\n  - {model: e, parameters: {weight: abc}}",
     "models[0].parameters.weight", "finite number"),
    ("merge_method: ties\nbase_model: b\nmodels: [e]\nparameters: {weight: 1, rescale: maybe}",
     "parameters.rescale", "true or false"),
    ("merge_method: ties\nbase_model: b\nmodels: [e]\ndtype: int8", "dtype", "not supported"),
    ("merge_method: ties\nbase_model: b\nmodels: [e]\nout_dtype: float64", "out_dtype",
     "not supported"),
    ("merge_method: ties\nbase_model: b\nmodels: [b]", "models", "only the base"),
    ("merge_method: ties\nbase_model: b", "models", "required"),
    ("merge_method: ties\nbase_model: b\nmodels: [e]\nfoo: 1", "foo", "unknown key"),
    ("merge_method: ties\nbase_model: b+lora\nmodels: [e]", "base_model", "full checkpoint"),
    ("merge_method: ties\nbase_model: b\nmodels:\n  - {model: e, extra: 1}", "models[0].extra",
     "unknown key"),
    ("merge_method: ties\nbase_model: b\nmodels: [e]\nparameters: {normalize: maybe}",
     "parameters.normalize", "true or false"),
    ("- just\n- a list", "config", "mapping"),
    ("merge_method: [ties\n", "config", "not valid YAML"),
])
def test_refusals_name_the_key_and_why(text: str, key: str, words: str) -> None:
    e = refused(text)
    assert e.field == key, e.message
    assert e.message.startswith(key) or key == "config", e.message
    assert words in e.message, e.message


def test_tokenizer_options_are_parsed() -> None:
    cfg = parse_config("merge_method: ties\nbase_model: b\nmodels: [e]\ntokenizer: {source: e, "
                       "pad_to_multiple_of: 8, tokens: {x: {}}}\nparameters: {weight: 1}\n"
                       "chat_template: '{% for m in messages %}{{ m.content }}{% endfor %}'")
    assert cfg.tokenizer is not None
    assert (cfg.tokenizer.source, cfg.tokenizer.key, cfg.tokenizer.pad_to_multiple_of,
            cfg.tokenizer.tokens) == ("e", "tokenizer.source", 8, (TokenSpec("x"),))
    assert cfg.tokenizer.chat_template == "{% for m in messages %}{{ m.content }}{% endfor %}"
    cfg = parse_config("merge_method: ties\nbase_model: b\nmodels: [e]\nparameters: {weight: 1}\n"
                       "tokenizer: {tokens: {a: {source: e, force: true}, b: {source: {kind: "
                       "zero}}, c: {source: {kind: model_token, model: b, token_id: 3}}}}\n"
                       "chat_template: chatml")
    assert cfg.tokenizer is not None and cfg.tokenizer.source == "union"  # mergekit's default
    assert cfg.tokenizer.tokens == (
        TokenSpec("a", TokenSource("model", "e"), True), TokenSpec("b", TokenSource("zero")),
        TokenSpec("c", TokenSource("model_token", "b", token_id=3)))
    # a built-in template's name: its text, as mergekit ships it
    assert cfg.tokenizer.chat_template is not None
    assert cfg.tokenizer.chat_template.startswith("{% for message in messages %}{{'<|im_start|>'")



def test_a_built_in_template_name_without_mergekit_is_refused_naming_the_field(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The built-in templates' texts are mergekit's data, read from an installed mergekit (not
    shipped with MergePipe): without one, the name is one clear error."""
    from mergepipe.core import mergekit_tokenizer

    monkeypatch.setattr(mergekit_tokenizer.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(InvalidRequest, match="mergekit's built-in templates") as e:
        parse_config("merge_method: linear\nmodels: [a, b]\nparameters: {weight: 1}\n"
                     "chat_template: llama3")
    assert e.value.field == "chat_template"

def test_parameters_of_the_base_entry_are_ignored_for_task_methods() -> None:
    cfg = parse_config("merge_method: ties\nbase_model: b\nmodels:\n"
                       "  - {model: b, parameters: {weight: 3}}\n  - model: e\n"
                       "parameters: {weight: 1}\n")
    assert [e.ref.text for e in cfg.experts] == ["e"]
    assert any("models[0]" in n for n in cfg.notes)


# -- resolution against the catalog (names, paths, on-the-fly ingestion) ------------------------

def _ingest_all(catalog: Catalog, family: dict[str, Path]) -> None:
    from mergepipe.catalog.ingest import ingest_model
    ingest_model(catalog, family["base"], "base")
    for n in ("e0", "e1"):
        ingest_model(catalog, family[n], n, base="base")


def test_paths_are_ingested_base_first_then_matched(catalog: Catalog,
                                                    family: dict[str, Path]) -> None:
    from mergepipe.catalog.models import find_model, get_model
    from mergepipe.jobs.config import load_config
    from mergepipe.jobs.ingest import run_ingestion
    text = (f"merge_method: ties\nbase_model: {family['base']}\nmodels:\n"
            f"  - {{model: {family['e0']}, parameters: {{density: 0.5, weight: 1}}}}\n"
            f"  - {{model: {family['e1']}, parameters: {{density: 0.3, weight: 2}}}}\n")
    req, resolved = load_config(catalog, text, budget=0.5, seed=3)
    assert [j.model for j in resolved.to_ingest] == ["base", "e0", "e1"]
    assert [j.base for j in resolved.to_ingest] == [None, "base", "base"]  # the base first
    assert find_model(catalog, "base") is None  # resolving never ingests
    seen: list[tuple[str, str]] = []
    for job in resolved.to_ingest:
        def track(p: Progress, name: str = job.model) -> None:
            seen.append((name, p.unit))

        run_ingestion(catalog, job, progress=track)
    assert seen[0] == ("base", "bytes") and {n for n, _ in seen} == {"base", "e0", "e1"}
    assert get_model(catalog, "e1").base == "base" and get_model(catalog, "e1").has_stats
    assert [(e.model, e.weight, e.density) for e in req.experts] == [("e0", 1.0, 0.5),
                                                                       ("e1", 2.0, 0.3)]
    assert req.budget.fraction == 0.5 and req.seed == 3
    _, again = load_config(catalog, text)
    assert again.to_ingest == [] and again.experts == ["e0", "e1"]


def test_registered_names_and_inferred_base(catalog: Catalog, family: dict[str, Path]) -> None:
    from mergepipe.jobs.config import load_config
    _ingest_all(catalog, family)
    req, _ = load_config(catalog, "merge_method: linear\nmodels:\n"
                                  "  - {model: e0, parameters: {weight: 1}}\n"
                                  "  - {model: e1, parameters: {weight: 3}}\n")
    assert req.base == "base" and req.coefficients() == [0.25, 0.75]


def test_resolution_errors_name_the_key(catalog: Catalog, family: dict[str, Path],
                                        tmp_path: Path) -> None:
    from mergepipe.jobs.config import load_config
    _ingest_all(catalog, family)
    cases = [
        ("merge_method: ties\nbase_model: e0\nmodels: [e1]\nparameters: {weight: 1}", "base_model", "registered as an "
         "expert of 'base'"),
        ("merge_method: ties\nbase_model: base\nmodels: [e0, e0]\nparameters: {weight: 1}",
         "models[1].model",
         "listed twice"),
        (f"merge_method: ties\nbase_model: base\nmodels: [{tmp_path / 'nope'}]\n"
         "parameters: {weight: 1}",
         "models[0].model", "neither a registered model, a local path nor a Hub id"),
        # no base_model: a model soup, whose models must exist (a path or a registered name)
        ("merge_method: linear\nmodels: [e0, nowhere]\nparameters: {weight: 1}",
         "models[1].model", "neither a registered model, a local path nor a Hub id"),
        (f"merge_method: ties\nbase_model: base\nmodels: [{family['e2']}+{family['e0']}]\n"
         "parameters: {weight: 1}",
         "models[0].model", "not base_model"),
    ]
    for text, key, words in cases:
        with pytest.raises(InvalidRequest) as e:
            load_config(catalog, text)
        assert e.value.field == key and words in e.value.message, (key, e.value.message)
