"""mergekit `passthrough` configs as catalog merges: sources read by range from the fake Hub, a
merges row with its pinned sources, lineage to every source, replay to the same bytes, the
output registered, and POST /v1/merges accepting them (refusals naming the field)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from mergepipe.api import Catalog
from mergepipe.core.errors import InvalidRequest, SourceChanged
from mergepipe.storage.safetensors_format import read_header
from tests import api_helpers as ah
from tests import mergekit_parity as mp
from tests.catalogs import new_catalog
from tests.fake_hub import FakeHub, Repo, serve_as_hub

LAYERS = 4


def _src(model: str | Path, a: int, b: int, **params: Any) -> dict[str, Any]:
    return {"model": str(model), "layer_range": [a, b],
            **({"parameters": params} if params else {})}


def stack(e0: str | Path, e1: str | Path, base: str | Path) -> dict[str, Any]:
    """Layers 0-1 of e0, 3 of e1 (scaled), 2-3 of base: 5 output layers."""
    return {"merge_method": "passthrough", "slices": [
        {"sources": [_src(e0, 0, 2)]}, {"sources": [_src(e1, 3, 4, scale=0.5)]},
        {"sources": [_src(base, 2, 4)]}]}


def taken_bytes(fam: dict[str, Path], cfg: dict[str, Any]) -> int:
    """Hand count of the tensor bytes the stack takes: each slice's layers, the embeddings of
    the first slice's model, the final norm and lm_head of the last one's."""
    def tensors(path: Path) -> dict[str, int]:
        return {t.name: t.nbytes for t in read_header(path / "model.safetensors").tensors}

    total = 0
    for piece in cfg["slices"]:
        src = piece["sources"][0]
        a, b = src["layer_range"]
        total += sum(n for name, n in tensors(fam[Path(src["model"]).name]).items()
                     if any(name.startswith(f"model.layers.{i}.") for i in range(a, b)))
    first = tensors(fam[Path(cfg["slices"][0]["sources"][0]["model"]).name])
    last = tensors(fam[Path(cfg["slices"][-1]["sources"][0]["model"]).name])
    return (total + first["model.embed_tokens.weight"] + last["model.norm.weight"]
            + last["lm_head.weight"])


@pytest.fixture
def family(tmp_path: Path) -> dict[str, Path]:
    return mp.make_family(tmp_path / "fam", layers=LAYERS)


@pytest.fixture
def hub(family: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    repos = {f"acme/{n}": Repo.from_dir(family[n]) for n in ("base", "e0", "e1")}
    with serve_as_hub(FakeHub(repos), tmp_path / "hf-cache", monkeypatch) as h:
        yield h


def test_passthrough_from_the_hub_reads_the_layers_taken_and_equals_local(
        family: dict[str, Path], hub: Any, tmp_path: Path) -> None:
    """Hub ids (bare, @revision, hf://) stacked: the same bytes as the stack of the local
    copies (which tests/test_mergekit_slices.py holds equal to mergekit's); the bytes fetched
    are the tensors taken, far from the three whole files, and the manifest pins each
    source's commit."""
    sha_e1 = hub.repos["acme/e1"].sha
    remote = stack("acme/e0", f"acme/e1@{sha_e1}", "hf://acme/base")
    local = stack(family["e0"], family["e1"], family["base"])
    with Catalog(new_catalog(tmp_path, "cat")) as cat:
        got = cat.merge(remote, out=tmp_path / "hub-out", progress=False)
        cat.merge(local, out=tmp_path / "local-out", progress=False)
    ours, ref = mp.load_raw(tmp_path / "hub-out"), mp.load_raw(tmp_path / "local-out")
    assert sorted(ours) == sorted(ref)
    assert mp.differences(ours, ref)[:2] == (0, sum(t.numel() for t in ref.values()))
    want = taken_bytes(family, local)
    assert got.base_bytes_read == want and got.expert_bytes_read == 0
    files = [family[n] / "model.safetensors" for n in ("base", "e0", "e1")]
    headers = sum(read_header(f).header_len for f in files)
    assert sum(hub.body_bytes.values()) == want + headers  # the tensors taken, the headers
    assert want + headers < 0.5 * sum(f.stat().st_size for f in files)
    manifest = json.loads((tmp_path / "hub-out" / "manifest.json").read_text())
    paths = [s["path"] for s in manifest["plan"]["sources"]]
    assert paths == [f"hf://acme/e0@{hub.repos['acme/e0'].sha}", f"hf://acme/e1@{sha_e1}",
                     f"hf://acme/base@{hub.repos['acme/base'].sha}"]
    assert manifest["output"]["hash"] == got.output_hash


def test_passthrough_is_a_recorded_merge_with_lineage_and_replay(
        family: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A registered model and local paths as sources: a succeeded merges row (operator
    passthrough, its plan pinning every file), lineage from the output to each source, the
    output registered, replay giving the same bytes, and a changed source refused."""
    from mergepipe.cli.main import main

    loc = new_catalog(tmp_path, "cat")
    with Catalog(loc) as cat:
        cat.ingest(family["base"], "base", progress=False)
        cfg = stack(family["e0"], family["e1"], "base")
        done = cat.merge(cfg, out=tmp_path / "out", name="franken", progress=False)
        assert done.merge_id is not None
        row = cat.sql("SELECT status, operator, base, output_name, output_hash, plan_hash, "
                      "base_bytes_read FROM merges").rows
        assert row == [["succeeded", "passthrough", str(family["e0"]), "franken",
                        done.output_hash, done.plan_hash, taken_bytes(family, cfg
                                                                      | {"slices": [
            {"sources": [_src(family["e0"], 0, 2)]},
            {"sources": [_src(family["e1"], 3, 4)]},
            {"sources": [_src(family["base"], 2, 4)]}]})]]
        assert cat.model("franken").source_merge == done.merge_id
        parents = [(e.parent, e.role) for e in cat.lineage("franken").ancestors]
        assert parents == [(str(family["e0"]), "slice"), (str(family["e1"]), "slice"),
                           ("base", "slice")]
        assert [e.child for e in cat.lineage("base").descendants] == ["franken"]
        tensors = cat.sql(f"SELECT count(*) FROM output_tensors WHERE merge_id = "
                          f"'{done.merge_id}'").rows[0][0]
        assert tensors == len(mp.load_raw(tmp_path / "out")) == 2 + 5 * 9 + 1
        assert cat.sql("SELECT blocks_done, blocks_total FROM merges").rows == [[48, 48]]
        again = cat.replay(done.merge_id, tmp_path / "replayed")
        assert again.match and again.output_hash == done.output_hash
        assert (tmp_path / "replayed" / "model.safetensors").read_bytes() == \
            (tmp_path / "out" / "model.safetensors").read_bytes()
    assert main(["--catalog", str(loc), "lineage", "franken", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert {e["parent"] for e in shown["ancestors"]} == {"base", str(family["e0"]),
                                                        str(family["e1"])}
    assert main(["--catalog", str(loc), "replay", done.merge_id, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["match"] is True
    # a source rewritten after the merge: replay refuses it rather than give other bytes
    e1 = family["e1"] / "model.safetensors"
    e1.write_bytes(e1.read_bytes()[:-2] + b"\0\0")
    with Catalog(loc) as cat, pytest.raises(SourceChanged, match="changed since the merge"):
        cat.replay(done.merge_id)


def test_one_entry_point_for_every_config(family: dict[str, Path], tmp_path: Path) -> None:
    """merge() takes a YAML path, its text or a dict; `mergepipe merge CONFIG` runs a
    passthrough through it; plan() of a passthrough config names merge_method."""
    from mergepipe.cli.main import main

    cfg = {"merge_method": "passthrough", "out_dtype": "float16",
           "models": [{"model": str(family["e1"])}]}
    (tmp_path / "copy.yml").write_text(yaml.safe_dump(cfg))
    loc = new_catalog(tmp_path, "cat")
    assert main(["--catalog", str(loc), "merge", str(tmp_path / "copy.yml"), "--out",
                 str(tmp_path / "cli-out"), "--json"]) == 0
    with Catalog(loc) as cat:
        text = cat.merge(yaml.safe_dump(cfg), out=tmp_path / "text-out", progress=False)
        assert cat.model("cli-out").source_merge is not None
        with pytest.raises(InvalidRequest, match="merge_method: passthrough .* no budgeted "
                                                 "plan") as e:
            cat.plan(tmp_path / "copy.yml")
        assert e.value.field == "merge_method"
    a, b = mp.load_raw(tmp_path / "cli-out"), mp.load_raw(tmp_path / "text-out")
    assert sorted(a) == sorted(b) and all(a[k].equal(b[k]) for k in a)
    assert {str(t.dtype) for t in a.values()} == {"torch.float16"}
    assert text.output_hash == json.loads(
        (tmp_path / "cli-out" / "manifest.json").read_text())["output"]["hash"]


def test_post_merges_accepts_passthrough_and_refuses_bad_ranges(tmp_path: Path) -> None:
    """POST /v1/merges queues a passthrough config like any merge (token, job row, lineage,
    metrics); a range past the model's layers is 422 naming its key; /v1/plans refuses it."""
    family = mp.make_family(tmp_path / "data" / "family")  # 2 layers
    token = {"Authorization": "Bearer " + "t" * 24}
    s = ah.settings_for(tmp_path, api_token="t" * 24)
    cfg = {"merge_method": "passthrough", "slices": [
        {"sources": [_src(family["e0"], 0, 1)]}, {"sources": [_src(family["e1"], 0, 2)]}]}
    body = {"config_yaml": yaml.safe_dump(cfg), "output": {"name": "tall"}}
    with ah.client_for(s) as client:
        assert client.post("/v1/merges", json=body).status_code == 401
        r = client.post("/v1/merges", json=body, headers={**token, "X-Request-ID": "pt-1"})
        assert r.status_code == 202, r.text
        m = ah.wait(client, f"/v1/merges/{r.json()['id']}")
        assert (m["status"], m["operator"], m["request_id"]) == ("succeeded", "passthrough",
                                                                  "pt-1"), m
        out, e1 = mp.load_raw(s.output_root / "tall"), mp.load_raw(family["e1"])
        assert m["progress"]["done"] == m["progress"]["total"] == len(out)
        per_layer = sum(k.startswith("model.layers.0.") for k in e1)
        assert sum(k.startswith("model.layers.") for k in out) == 3 * per_layer
        assert out["model.layers.2.self_attn.q_proj.weight"].equal(
            e1["model.layers.1.self_attn.q_proj.weight"])
        lin = client.get("/v1/lineage/tall").json()
        assert {e["parent"] for e in lin["ancestors"]} == {str(family["e0"]),
                                                           str(family["e1"])}
        bad = {**cfg, "slices": [{"sources": [_src(family["e0"], 1, 3)]}]}
        r = client.post("/v1/merges", json={**body, "config_yaml": yaml.safe_dump(bad),
                                            "output": {"name": "bad"}}, headers=token)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["field"] == "config_yaml.slices[0].sources[0].layer_range"
        assert "has 2 layers" in r.json()["error"]["message"]
        templated = {**cfg, "chat_template": "{% for m in messages %}{{ m }}{% endfor %}"}
        r = client.post("/v1/merges", json={**body, "config_yaml": yaml.safe_dump(templated),
                                            "output": {"name": "ct"}}, headers=token)
        assert r.status_code == 422 and r.json()["error"]["field"] == \
            "config_yaml.tokenizer", r.text
        r = client.post("/v1/plans", json={"config_yaml": body["config_yaml"]}, headers=token)
        assert r.status_code == 422 and r.json()["error"]["field"] == \
            "config_yaml.merge_method", r.text
        scrape = client.get("/metrics").text
    assert 'mergepipe_jobs_run_total{kind="merge",status="succeeded"} 1.0' in scrape
    assert m["base_bytes_read"] > 0 and m["expert_bytes_read"] == 0
    assert f'mergepipe_bytes_read_total{{kind="base"}} {float(m["base_bytes_read"])}' in scrape


@pytest.mark.slow
def test_passthrough_from_s3_reads_by_range_and_replays(s3_server: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """s3:// sources (moto behind the counting proxy): the same bytes as from the local copies,
    the proxy counting the tensors taken plus each file's header, and replay reading the same
    objects again to the same hashes."""
    from tests.remote_family import s3_family

    with s3_family(s3_server, tmp_path, monkeypatch) as fam:
        def cfg(where: dict[str, str]) -> dict[str, Any]:
            return {"merge_method": "passthrough", "slices": [
                {"sources": [_src(where["e0"], 0, 1)]}, {"sources": [_src(where["e1"], 0, 2)]},
                {"sources": [_src(where["e2"], 1, 2)]}]}

        with Catalog(new_catalog(tmp_path, "cat")) as cat:
            fam.proxy.reset_counts()
            remote = cat.merge(cfg({n: fam.url(n) for n in fam.local}), out=tmp_path / "s3-out",
                               progress=False)
            assert remote.merge_id is not None
            fetched = sum(fam.proxy.counts.get_bytes(f"/fam/{n}/model.safetensors")
                          for n in fam.local)
            # each source's config.json (checked with the checkpoint), the donor's copied
            side = fam.proxy.counts.get_bytes("/fam/") - fetched
            configs = [(fam.local[n] / "config.json").stat().st_size for n in ("e0", "e1", "e2")]
            assert side == sum(configs) + configs[0]
            local = cat.merge(cfg({n: str(p) for n, p in fam.local.items()}),
                              out=tmp_path / "disk-out", progress=False)
            assert remote.output_hash == local.output_hash
            assert (tmp_path / "s3-out" / "model.safetensors").read_bytes() == \
                (tmp_path / "disk-out" / "model.safetensors").read_bytes()
            headers = sum(read_header(fam.local[n] / "model.safetensors").header_len
                          for n in ("e0", "e1", "e2"))
            assert fetched == remote.base_bytes_read + headers == local.base_bytes_read + headers
            whole = sum((fam.local[n] / "model.safetensors").stat().st_size
                        for n in ("e0", "e1", "e2"))
            assert fetched < whole
            assert cat.replay(remote.merge_id).match


def test_passthrough_from_https_is_pinned_by_etag(family: dict[str, Path],
                                                   tmp_path: Path) -> None:
    """An http(s):// source (a ranged file server on loopback) beside local ones: the bytes of
    the all-local stack; the plan records the object's ETag, and a replay after the object
    changed is refused rather than mixing versions."""
    from tests.remote_servers import file_server

    with file_server(tmp_path / "fam") as url, Catalog(new_catalog(tmp_path, "cat")) as cat:
        remote = cat.merge(stack(family["e0"], f"{url}/e1", family["base"]),
                           out=tmp_path / "web-out", progress=False)
        assert remote.merge_id is not None
        local = cat.merge(stack(family["e0"], family["e1"], family["base"]),
                          out=tmp_path / "disk-out", progress=False)
        assert remote.output_hash == local.output_hash
        plan = json.loads((tmp_path / "web-out" / "manifest.json").read_text())["plan"]
        web = next(s for s in plan["sources"] if s["path"] == f"{url}/e1")
        assert web["files"][0]["etag"].startswith('"') and not web["registered"]
        assert cat.replay(remote.merge_id).match
        e1 = family["e1"] / "model.safetensors"
        e1.write_bytes(e1.read_bytes()[:-2] + b"\0\0")
        with pytest.raises(SourceChanged, match="ETag"):
            cat.replay(remote.merge_id)
