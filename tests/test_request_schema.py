"""One request schema: the same bad value sent through the API (/v1/plans and /v1/merges), the
CLI and a mergekit config file is refused by the same check, each naming its field; values that
used to pass one entry point and fail later (a job, a merge) are refused where they enter."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.ingest import ingest_model
from mergepipe.cli.main import main
from mergepipe.core.errors import InvalidCheckpoint, InvalidRequest
from mergepipe.core.operators import get_operator
from mergepipe.core.request import build_request
from mergepipe.core.schema import params_model
from tests import factory
from tests.api_helpers import assert_error, client_for, make_family, register_family, wait
from tests.api_helpers import settings_for as api_settings
from tests.catalogs import new_catalog

PLAN = {"base": "base", "experts": [{"model": "e0"}, {"model": "e1"}], "operator": "ties",
        "params": {"density": 0.5}, "seed": 7}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp: Path = tmp_path_factory.mktemp("schema")
    family = make_family(tmp / "data" / "family")
    # a base with a 0-D tensor (a scalar), and an expert of it
    shapes = {**factory.TINY_SHAPES, "model.logit_scale": ()}
    scalar = factory.make_base(tmp / "data" / "scalar", seed=3, shapes=shapes)
    factory.make_expert(scalar, tmp / "data" / "scalar-e", seed=4)
    cli_catalog = str(new_catalog(tmp, "cli"))
    with Catalog(cli_catalog) as cat:
        ingest_model(cat, family["base"], "base")
        for name in ("e0", "e1"):
            ingest_model(cat, family[name], name, base="base")
    settings = api_settings(tmp)
    with client_for(settings) as c:
        register_family(c, family)
        for name, path, base in (("sbase", "scalar", None), ("sexp", "scalar-e", "sbase")):
            r = c.post("/v1/models", json={"name": name, "path": str(tmp / "data" / path),
                                           **({"base": base} if base else {})})
            assert r.status_code == 202, r.text
            assert wait(c, f"/v1/models/{name}")["status"] == "ready"
        yield {"tmp": tmp, "client": c, "cli_catalog": cli_catalog, "settings": settings}


def _cli(env: dict[str, Any], capsys: Any, *argv: str) -> tuple[int, str]:
    rc = main(["--catalog", env["cli_catalog"], *argv])
    err = capsys.readouterr().err.strip()
    return rc, err


def _config(env: dict[str, Any], name: str, text: str) -> Path:
    path = env["tmp"] / f"{name}.yml"
    path.write_text(text)
    return path


TIES_YAML = """merge_method: ties
base_model: base
parameters: {{density: 0.5{params}}}
models:
  - model: e0
    parameters: {{weight: {weight}{density}}}
  - model: e1
    parameters: {{weight: 1.0}}
{extra}"""


def _yaml(weight: str = "1.0", density: str = "", params: str = "", extra: str = "") -> str:
    return TIES_YAML.format(weight=weight, density=density, params=params, extra=extra)


# (case id, API body change, CLI plan options, config YAML or None, field named by the API and
# the CLI, field named in the config, the words of the one check that refuses it)
CASES = [
    ("huge-fraction", {"budget": {"fraction": 1e300}}, ["--budget", "1e300"], None,
     "budget.fraction", None, "1e+300 is outside (0, 1]"),
    ("zero-fraction", {"budget": {"fraction": 0}}, ["--budget", "0"], None,
     "budget.fraction", None, "0 is outside (0, 1]"),
    ("bytes-over-bigint", {"budget": {"bytes": 2**64}}, ["--budget", "16777216TiB"], None,
     "budget.bytes", None, "2^63 - 1"),
    ("density-above-1", {"experts": [{"model": "e0", "density": 1.5}, {"model": "e1"}]},
     ["--experts", "e0:1:1.5,e1"], _yaml(density=", density: 1.5"),
     "experts[0].density", "models[0].parameters.density", "1.5 is outside (0, 1]"),
    ("huge-weight", {"experts": [{"model": "e0", "weight": 1e308}, {"model": "e1"}]},
     ["--experts", "e0:1e308,e1"], _yaml(weight="1.0e+308"),
     "experts[0].weight", "models[0].parameters.weight", "less than or equal to 1000000"),
    ("huge-lambda", {"params": {"density": 0.5, "lambda": 1e300}},
     ["--param", "lambda=1e300"], _yaml(params=", lambda: 1.0e+300"),
     "params.lambda", "parameters.lambda", "times the sum of |weights|"),
    ("param-of-another-operator", {"params": {"density": 0.5, "gamma": 0.1}},
     ["--param", "gamma=0.1"], None, "params.gamma", None, "gamma applies to breadcrumbs"),
    ("wrong-choice", {"params": {"density": 0.5, "utility": "l3"}},
     ["--param", "utility=l3"], None, "params.utility", None,
     "'tensor_energy', 'region_energy', 'activation', 'fisher' or 'auto'"),
    ("negative-seed", {"seed": -1}, ["--seed", "-1"], None, "seed",
     None, "greater than or equal to 0"),
    ("density-off-the-grid", {"params": {"density": 0.555}}, ["--param", "density=0.555"],
     None, "density", None, "1% grid"),  # a config's mergekit arithmetic takes any density
]


@pytest.mark.parametrize(("api", "cli", "config", "field", "config_field", "words"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_one_bad_value_one_error_through_every_entry_point(
        env: dict[str, Any], capsys: Any, api: dict[str, Any], cli: list[str],
        config: str | None, field: str, config_field: str | None, words: str) -> None:
    c = env["client"]
    plan = assert_error(c.post("/v1/plans", json={**PLAN, **api}), 422, "invalid_request",
                        field)
    merge = assert_error(c.post("/v1/merges", json={**PLAN, **api, "output": {"name": "o"}}),
                         422, "invalid_request", field)
    assert words in plan["message"] and plan["message"] == merge["message"], (plan, merge)
    assert field in plan["message"]
    assert not (env["settings"].output_root / "o").exists()
    options = {"--base": "base", "--experts": "e0,e1", "--op": "ties"}
    argv = [a for k, v in options.items() if k not in cli for a in (k, v)]
    if "--param" not in cli or "density" not in " ".join(cli):
        argv += ["--param", "density=0.5"]
    for command in (["plan"], ["merge", "--out", str(env["tmp"] / "cli-out")]):
        rc, err = _cli(env, capsys, *command, *argv, *cli)
        assert rc == 2 and len(err.splitlines()) == 1, err
        assert field in err and words in err and "Traceback" not in err, err
    if config is not None:
        r = c.post("/v1/plans", json={"config_yaml": config})
        body = assert_error(r, 422, "invalid_request", f"config_yaml.{config_field}")
        assert words in body["message"], body
        path = _config(env, field.replace("[", "").replace("]", ""), config)
        rc, err = _cli(env, capsys, "plan", str(path))
        assert rc == 2 and len(err.splitlines()) == 1, err
        assert config_field is not None and config_field in err and words in err, err


def test_every_dtype_spelling_is_one_table(env: dict[str, Any], capsys: Any) -> None:
    """The API refused `bf16`, which the core and the CLI accepted."""
    c = env["client"]
    r = c.post("/v1/merges", json={**PLAN, "output": {"name": "bf16-out", "dtype": "bf16"}})
    assert r.status_code == 202, r.text
    m = wait(c, f"/v1/merges/{r.json()['id']}")
    assert m["status"] == "succeeded", m
    header = (env["settings"].output_root / "bf16-out" / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", header[:8])
    assert {v["dtype"] for k, v in json.loads(header[8:8 + n]).items()
            if k != "__metadata__"} == {"BF16"}
    bad = assert_error(c.post("/v1/merges", json={**PLAN, "output": {"name": "x",
                                                                      "dtype": "int8"}}),
                       422, "invalid_request", "output.dtype")
    rc, err = _cli(env, capsys, "plan", "--base", "base", "--experts", "e0,e1", "--op",
                   "linear", "--dtype", "int8")
    assert rc == 2 and "output_dtype" in err
    assert bad["message"].split(": ", 1)[1] == err.split("output_dtype: ", 1)[1]


@pytest.mark.parametrize("name", ["a..b", "x+y@2"])
def test_one_name_rule_for_models_and_outputs(env: dict[str, Any], name: str) -> None:
    """Ingestion allowed '+' and '@' in names, outputs did not; ingestion allowed '..'."""
    c = env["client"]
    model = c.post("/v1/models", json={"name": name, "path": "family/e2", "base": "base"})
    out = c.post("/v1/merges", json={**PLAN, "output": {"name": f"{name}-out"}})
    if ".." in name:
        assert_error(model, 422, "invalid_request", "name")
        assert_error(out, 422, "invalid_request", "output.name")
    else:
        assert model.status_code == out.status_code == 202, (model.text, out.text)
        assert wait(c, f"/v1/models/{name}")["status"] == "ready"


def test_block_bytes_below_the_minimum_are_refused_at_registration(
        env: dict[str, Any], capsys: Any) -> None:
    """block_bytes 1..63 was accepted by POST /v1/models and the ingestion job failed later."""
    c = env["client"]
    for bad in (1, 63, (64 << 20) + 1):
        r = c.post("/v1/models", json={"name": f"bb{bad}", "path": "family/base",
                                       "block_bytes": bad})
        body = assert_error(r, 422, "invalid_request", "block_bytes")
        assert "block_bytes" in body["message"]
    assert c.get("/v1/models/bb63").status_code == 404
    rc, err = _cli(env, capsys, "ingest", str(env["tmp"] / "data" / "family" / "base"),
                   "--name", "bb", "--block-bytes", "63")
    assert rc == 2 and len(err.splitlines()) == 1 and "block" in err, err


def test_della_on_a_base_with_a_scalar_tensor_is_a_422(env: dict[str, Any]) -> None:
    """della ranks each row's entries: a 0-D tensor was accepted and the job failed with an
    internal IndexError."""
    c = env["client"]
    body = {"base": "sbase", "experts": [{"model": "sexp"}], "operator": "della",
            "params": {"density": 0.5}}
    for url, extra in (("/v1/plans", {}), ("/v1/merges", {"output": {"name": "della-0d"}})):
        err = assert_error(c.post(url, json={**body, **extra}), 422, "invalid_request",
                           "operator")
        assert "model.logit_scale" in err["message"], err
    ok = c.post("/v1/plans", json={**body, "operator": "ties"})  # other operators merge it
    assert ok.status_code == 200, ok.text


def test_the_operator_parameter_model_is_generated_from_the_spec() -> None:
    model = params_model(get_operator("della"))
    fields = model.model_fields
    assert {"normalize", "lambda", "epsilon", "rescale", "density"} <= set(fields)
    assert fields["normalize"].default is True and fields["epsilon"].default == 0.15
    assert "gamma" not in fields  # breadcrumbs' own
    schema = model.model_json_schema()
    assert schema["properties"]["rescale"]["enum"] == ["l1", "none"]
    with pytest.raises(InvalidRequest) as e:
        build_request(base="b", experts="e", operator="della", params={"epsilon": "wide"})
    assert e.value.field == "params.epsilon"
    gamma = params_model(get_operator("breadcrumbs")).model_json_schema()["properties"]["gamma"]
    assert (gamma["minimum"], gamma["maximum"], gamma["default"]) == (0, 1, 0.01)


# -- integer bombs in checkpoint files -------------------------------------------------------------

BOMB = "1" + "0" * 5000


def _safetensors(path: Path, header: str, data: bytes) -> None:
    raw = header.encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


@pytest.mark.parametrize("where", ["header", "index", "config"])
def test_integer_bombs_are_refused_at_ingestion(tmp_path: Path, capsys: Any, where: str) -> None:
    """5000-digit integers in a safetensors header, an index or a base's config.json were
    internal errors (or, in config.json, ingested and then failed every merge with an output
    dtype)."""
    d = tmp_path / "ckpt"
    d.mkdir()
    header = '{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}'
    if where == "header":
        header = header.replace('"shape": [2]', f'"shape": [{BOMB}]')
    _safetensors(d / ("model-00001-of-00001.safetensors" if where == "index"
                      else "model.safetensors"), header, b"\0" * 8)
    if where == "index":
        (d / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": 8}, "weight_map": {"w": "model-00001-of-00001"
                                                                ".safetensors"}}
        ).replace('"total_size": 8', f'"total_size": {BOMB}'))
    (d / "config.json").write_text('{"model_type": "llama", "vocab_size": %s}'
                                   % (BOMB if where == "config" else "64"))
    with Catalog(new_catalog(tmp_path, "c")) as cat:
        with pytest.raises(InvalidCheckpoint, match="5001 digits") as e:
            ingest_model(cat, d, "bomb")
        assert e.value.status == 422
    rc = main(["--catalog", str(new_catalog(tmp_path, "c2")), "ingest", str(d), "--name", "x"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "5001 digits" in err, err
