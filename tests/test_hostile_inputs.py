"""Hostile and broken inputs through both front doors, the API and the CLI: each is answered by
a clear error naming the problem (a 4xx, a failed job with its error, or a one-line CLI error),
and nothing is registered or written."""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load_file, save_file

from mergepipe.cli.main import main
from tests import factory
from tests.api_helpers import (
    EXPERTS,
    assert_error,
    client_for,
    make_family,
    register_family,
    settings_for,
    ties_body,
    wait,
)
from tests.catalogs import new_catalog

W = "model.layers.0.mlp.up_proj.weight"


def _raw(d: Path, header: bytes | dict[str, Any], data: bytes = b"", length: int | None = None
         ) -> None:
    js = header if isinstance(header, bytes) else json.dumps(header).encode()
    d.mkdir(parents=True)
    n = len(js) if length is None else length
    (d / "model.safetensors").write_bytes(struct.pack("<Q", n) + js + data)


def _edit(base: Path, d: Path, edit: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]
          ) -> None:
    tensors = {k: v.clone() for k, v in load_file(str(base / "model.safetensors")).items()}
    d.mkdir(parents=True)
    save_file(edit(tensors), str(d / "model.safetensors"))


def _nonfinite(value: float) -> Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    def edit(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        x = t[W].clone()
        x[3, 5] = value
        return {**t, W: x}
    return edit


def _file(d: Path, name: str, data: bytes) -> None:
    """A new folder `d` holding one file."""
    d.mkdir(parents=True)
    (d / name).write_bytes(data)


def _truncated(base: Path, d: Path) -> None:
    shutil.copytree(base, d)
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])


def _missing_shard(base: Path, d: Path) -> None:
    factory.make_expert(base, d, seed=3, shards=2)
    next(d.glob("*00002-of-00002.safetensors")).unlink()


def _lora_wrong_base(base: Path, d: Path) -> None:
    other = factory.make_base(d.parent / f"{d.name}-other-base", seed=1, shapes={
        k: tuple(2 * s for s in v) for k, v in factory.TINY_SHAPES.items()})
    factory.make_lora(other, d, seed=1)


def _fifo(name: str, *regular: str) -> Callable[[Path, Path], None]:
    """A named pipe planted where a file is expected (reading it would block forever)."""
    def build(base: Path, d: Path) -> None:
        d.mkdir(parents=True)
        os.mkfifo(d / name)
        for r in regular:
            (d / r).write_bytes(b"")
    return build


# name -> (kind, builder(base_dir, target_dir), words the error must hold)
CHECKPOINTS: dict[str, tuple[str, Callable[[Path, Path], None], tuple[str, ...]]] = {
    "header-not-json": ("full", lambda b, d: _raw(d, b"{not json at all"), ("not valid JSON",)),
    "header-not-utf8": ("full", lambda b, d: _raw(d, b"\xff\xfe\x00{}"), ("not valid JSON",)),
    "header-a-list": ("full", lambda b, d: _raw(d, b"[1, 2]"), ("not a JSON object",)),
    "header-deep-json": ("full", lambda b, d: _raw(d, b'{"a": ' + b"[" * 50000 + b"]" * 50000
                                                    + b"}"), ("nested too deeply",)),
    "index-deep-json": ("full", lambda b, d: _file(d, "model.safetensors.index.json",
                                                  b"[" * 50000 + b"]" * 50000),
                        ("nested too deeply",)),
    "header-longer-than-file": ("full", lambda b, d: _raw(d, b"{}", length=4096),
                                ("larger than the file",)),
    "header-absurd": ("full", lambda b, d: _raw(d, b"{}", length=2**63), ("exceeds",)),
    "file-too-short": ("full", lambda b, d: _file(d, "model.safetensors", b"\x01\x02"),
                       ("too short",)),
    "offsets-past-the-end": ("full", lambda b, d: _raw(d, {W: {
        "dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4), ("past the end",)),
    "offsets-reversed": ("full", lambda b, d: _raw(d, {W: {
        "dtype": "F32", "shape": [0], "data_offsets": [8, 0]}}, b"\0" * 8), ("out of order",)),
    "offsets-overlap": ("full", lambda b, d: _raw(d, {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12),
        ("overlaps",)),
    "offsets-size-mismatch": ("full", lambda b, d: _raw(d, {W: {
        "dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8), ("bytes for shape",)),
    "truncated-data": ("full", _truncated, ("truncated",)),
    "dtype-unsupported": ("full", lambda b, d: _edit(b, d, lambda t: {**t, W: t[W].double()}),
                          ("'F64' unsupported",)),
    "shape-mismatch": ("full", lambda b, d: _edit(b, d, lambda t: {**t, W: t[W][:8].clone()}),
                       (W,)),
    "tensor-missing": ("full", lambda b, d: _edit(b, d, lambda t: {
        k: v for k, v in t.items() if k != W}), (W,)),
    "nan-weights": ("full", lambda b, d: _edit(b, d, _nonfinite(math.nan)), (W,)),
    "inf-weights": ("full", lambda b, d: _edit(b, d, _nonfinite(math.inf)), (W,)),
    "index-missing-shard": ("full", _missing_shard, ("missing shard",)),
    "lora-for-another-base": ("lora", _lora_wrong_base, ("does not fit",)),
    "fifo-weights": ("full", _fifo("model.safetensors"), ("not a regular file",)),
    "fifo-index": ("full", _fifo("model.safetensors.index.json"), ("not a regular file",)),
    "fifo-adapter-config": ("lora", _fifo("adapter_config.json", "adapter_model.safetensors"),
                            ("not a regular file",)),
}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp: Path = tmp_path_factory.mktemp("hostile")
    family = make_family(tmp / "data" / "family")
    bad = tmp / "data" / "bad"
    for name, (_, build, _) in CHECKPOINTS.items():
        build(family["base"], bad / name)
    cli_db = new_catalog(tmp, "cli")
    assert main(["--catalog", str(cli_db), "ingest", str(family["base"]), "--name", "base",
                 "--json"]) == 0
    for e in EXPERTS:
        assert main(["--catalog", str(cli_db), "ingest", str(family[e]), "--name", e,
                     "--base", "base", "--json"]) == 0
    settings = settings_for(tmp)
    with client_for(settings) as c:
        register_family(c, family)
        yield {"tmp": tmp, "client": c, "settings": settings, "bad": bad, "cli_db": cli_db}


def _no_rows(c: TestClient, name: str) -> None:
    for table, col in (("models", "name"), ("files", "model"), ("tensors", "model"),
                       ("blocks", "model"), ("block_stats", "model")):
        r = c.post("/v1/sql", json={"sql": f"SELECT count(*) FROM {table} WHERE {col} = "
                                            f"'{name}'"})
        assert r.json()["rows"] == [[0]], (table, name)


@pytest.mark.parametrize("case", sorted(CHECKPOINTS))
def test_broken_checkpoints_through_the_api(env: dict[str, Any], case: str) -> None:
    c = env["client"]
    kind, _, words = CHECKPOINTS[case]
    r = c.post("/v1/models", json={"name": case, "path": f"bad/{case}", "kind": kind,
                                   "base": "base"})
    assert r.status_code == 202, r.text
    m = wait(c, f"/v1/models/{case}")
    assert m["status"] == "failed", m
    for w in words:
        assert w in m["error"], (w, m["error"])
    assert "Traceback" not in m["error"] and "internal error" not in m["error"]
    _no_rows(c, case)


@pytest.mark.parametrize("case", sorted(CHECKPOINTS))
def test_broken_checkpoints_through_the_cli(env: dict[str, Any], case: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    kind, _, words = CHECKPOINTS[case]
    capsys.readouterr()
    rc = main(["--catalog", str(env["cli_db"]), "ingest", str(env["bad"] / case), "--name",
               "x", "--base", "base", "--kind", kind])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, (w, err)
    capsys.readouterr()
    assert main(["--catalog", str(env["cli_db"]), "models", "--json"]) == 0
    assert "x" not in [m["name"] for m in json.loads(capsys.readouterr().out)]


# -- merge requests ---------------------------------------------------------------------------
RAW_BODIES = {  # JSON that Python's parser accepts but no number field should
    "budget-nan": ('{"fraction": NaN}', "budget"),
    "budget-inf": ('{"fraction": Infinity}', "budget"),
    "budget-overflow": ('{"fraction": 1e400}', "budget"),
    "budget-huge-int": ('{"bytes": ' + "9" * 500 + "}", "budget"),
    "budget-negative": ('{"bytes": -1}', "budget"),
    "budget-zero": ('{"fraction": 0}', "budget"),
    "budget-both": ('{"fraction": 0.5, "bytes": 10}', "budget"),
    "budget-string": ('{"fraction": "half"}', "budget"),
}


@pytest.mark.parametrize("case", sorted(RAW_BODIES))
def test_bad_budgets_are_422(env: dict[str, Any], case: str) -> None:
    c = env["client"]
    budget, field = RAW_BODIES[case]
    merge = {**ties_body(f"b-{case}"), "budget": "@"}
    plan = {k: v for k, v in merge.items() if k != "output"}
    for path, body in (("/v1/plans", plan), ("/v1/merges", merge)):
        raw = json.dumps(body).replace('"@"', budget)
        r = c.post(path, content=raw, headers={"content-type": "application/json"})
        err = assert_error(r, 422, "invalid_request")
        assert (err.get("field") or "").startswith(field), err
    assert not (env["settings"].output_root / f"b-{case}").exists()


@pytest.mark.parametrize("patch,field", [
    ({"operator": "magic"}, "operator"), ({"operator": ""}, "operator"),
    ({"operator": 7}, "operator"),
    ({"experts": [{"model": "e0", "density": 0}]}, "experts[0].density"),
    ({"experts": [{"model": "e0", "density": 1.01}]}, "experts[0].density"),
    ({"experts": [{"model": "e0", "density": -0.5}]}, "experts[0].density"),
    ({"params": {"density": 2}}, "params"), ({"params": {"density": "dense"}}, "params"),
    ({"experts": [{"model": "e0", "weight": "1e309"}]}, "experts[0].weight"),
    ({"experts": [{"model": "e0", "weight": "NaN"}]}, "experts[0].weight"),
    ({"experts": [{"model": "e0"}, {"model": "e0"}]}, "experts"),
    ({"experts": [{"model": "base"}]}, "experts"), ({"experts": []}, "experts"),
    ({"experts": [{"model": "e0"}] * 5000}, "experts"),
    ({"seed": 2**64}, "seed"), ({"seed": 1.5}, "seed"),
    ({"output": {"name": "ok", "dtype": "int8"}}, "output"),
])
def test_bad_merge_requests_are_422_and_write_nothing(env: dict[str, Any], patch: dict[str, Any],
                                                      field: str) -> None:
    c = env["client"]
    before = c.get("/v1/merges", params={"limit": 1000}).json()["merges"]
    raw = json.dumps({**ties_body("never"), **patch})
    for number in ("1e309", "NaN"):  # not JSON, but Python's parser takes them
        raw = raw.replace(f'"{number}"', number)
    err = assert_error(c.post("/v1/merges", content=raw,
                              headers={"content-type": "application/json"}),
                       422, "invalid_request")
    assert (err.get("field") or "").startswith(field.split("[")[0]), err
    assert c.get("/v1/merges", params={"limit": 1000}).json()["merges"] == before
    out = env["settings"].output_root
    assert not (out / "never").exists() and not (out / "ok").exists()


def test_giant_bodies_are_413_at_the_default_limit(env: dict[str, Any]) -> None:
    c = env["client"]
    limit = env["settings"].max_body_bytes
    body = {**ties_body("giant"), "experts": [{"model": "e0" * 1000}] * (limit // 2000 + 10)}
    assert_error(c.post("/v1/merges", json=body), 413, "payload_too_large")
    assert_error(c.post("/v1/sql", json={"sql": "SELECT 1 -- " + "x" * limit}), 413,
                 "payload_too_large")
    deep = "[" * 100_000 + "]" * 100_000  # nesting bombs are refused by size or by the parser
    r = c.post("/v1/plans", content=deep, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, r.text


@pytest.mark.parametrize("args,words", [
    (["--budget", "0"], ["budget"]), (["--budget", "-1"], ["budget"]),
    (["--budget", "nan"], ["budget"]), (["--budget", "inf"], ["budget"]),
    (["--budget", "1e999GiB"], ["budget"]), (["--budget", "lots"], ["budget"]),
    (["--budget", "0B"], ["budget"]),
    (["--op", "magic"], ["unknown operator", "magic"]),
    (["--param", "density=1.5"], ["density", "(0, 1]"]),
    (["--param", "density=0"], ["density"]), (["--param", "density=nan"], ["density"]),
    (["--experts", "e0:1:0"], ["density"]), (["--experts", "e0:nan"], ["weight"]),
    (["--experts", "e0,e0"], ["twice"]), (["--experts", "ghost"], ["ghost"]),
    (["--param", "colour=red"], ["colour"]), (["--seed", "-1"], ["seed"]),
])
def test_bad_merges_through_the_cli(env: dict[str, Any], tmp_path: Path, args: list[str],
                                    words: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--base", "base", "--experts", "e0,e1", "--op", "ties", "--param", "density=0.5",
            "--budget", "0.5"]
    argv = list(base)
    for i in range(0, len(args), 2):  # the option given replaces the default one
        if args[i] in argv and args[i] != "--param":
            argv[argv.index(args[i]) + 1] = args[i + 1]
        elif args[i] == "--param" and args[i + 1].startswith("density"):
            argv[argv.index("density=0.5")] = args[i + 1]
        else:
            argv += args[i:i + 2]
    capsys.readouterr()
    rc = main(["--catalog", str(env["cli_db"]), "merge", *argv, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, (w, err)
    assert not (tmp_path / "o").exists()
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def _laughs(key: str) -> str:
    """A billion-laughs YAML: 9^8 leaves through aliases, a few hundred bytes of text."""
    lines = ["merge_method: linear", "models:", "  - model: e0", "    parameters:",
             f"      {key}: &a0 [x,x,x,x,x,x,x,x,x]"]
    for i in range(1, 9):
        lines += [f"  - model: e{i}", "    parameters:",
                  f"      {key}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]"]
    return "\n".join(lines) + "\n"


YAML_BOMBS = {
    "deep-lists": "models: " + "[" * 1500 + "]" * 1500,
    "deep-maps": "models: " + "{a: " * 1500 + "1" + "}" * 1500,
    "laughs-weight": _laughs("weight"),
    "laughs-density": _laughs("density"),
    "python-tag": "!!python/object/apply:os.system ['touch pwned']",
    "not-yaml": "models: [unclosed",
}


@pytest.mark.parametrize("case", sorted(YAML_BOMBS))
def test_hostile_mergekit_configs(env: dict[str, Any], case: str, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    c = env["client"]
    r = c.post("/v1/plans", json={"config_yaml": YAML_BOMBS[case], "budget": {"fraction": 0.5}})
    err = assert_error(r, 422, "invalid_request")
    assert err["field"].startswith("config_yaml"), err
    cfg = tmp_path / "config.yml"
    cfg.write_text(YAML_BOMBS[case])
    capsys.readouterr()
    rc = main(["--catalog", str(env["cli_db"]), "merge", str(cfg), "--out", str(tmp_path / "o")])
    line = capsys.readouterr().err.strip()
    assert rc != 0 and len(line.splitlines()) == 1, line
    assert not (tmp_path / "o").exists() and not (tmp_path / "pwned").exists()
    assert not Path("pwned").exists()


def test_racing_for_one_name_gives_one_winner(env: dict[str, Any]) -> None:
    """Ten requests claim the same output name (and ten the same model name) at once: one is
    accepted, the others are 409, and one output appears."""
    from concurrent.futures import ThreadPoolExecutor

    c = env["client"]
    fam = env["tmp"] / "data" / "family"
    with ThreadPoolExecutor(max_workers=10) as pool:
        merges = list(pool.map(lambda _: c.post("/v1/merges", json=ties_body("raced")),
                               range(10)))
        models = list(pool.map(lambda _: c.post("/v1/models", json={
            "name": "raced-model", "path": str(fam / "e2"), "base": "base"}), range(10)))
    for responses in (merges, models):
        codes = sorted(r.status_code for r in responses)
        assert codes == [202] + [409] * 9, [r.text for r in responses]
    (won,) = [r.json()["id"] for r in merges if r.status_code == 202]
    assert wait(c, f"/v1/merges/{won}")["status"] == "succeeded"
    assert wait(c, "/v1/models/raced-model")["status"] == "ready"
    out = env["settings"].output_root
    assert [p.name for p in out.iterdir() if "raced" in p.name] == ["raced"]


def test_a_megabyte_of_yaml_is_refused_before_parsing(env: dict[str, Any]) -> None:
    import time

    big = "merge_method: linear\nmodels:\n" + "  - model: e0\n" * 60_000  # under 1 MiB
    t0 = time.monotonic()
    r = env["client"].post("/v1/plans", json={"config_yaml": big, "budget": {"fraction": 0.5}})
    err = assert_error(r, 422, "invalid_request")
    assert "limit" in err["message"] and time.monotonic() - t0 < 2
