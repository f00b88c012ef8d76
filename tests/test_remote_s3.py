"""Checkpoints in S3 (moto's server on loopback, behind a counting proxy): ingestion on the CLI and
through the API, and a budgeted merge that fetches at most its budget over the network (counted
by the proxy) and writes the same bytes as the same merge from local copies."""

from __future__ import annotations

import json
import struct

from mergepipe.cli.main import main
from tests.api_helpers import EXPERTS, assert_error, client_for, settings_for, wait
from tests.catalogs import new_catalog
from tests.remote_family import cli_merge, ingest_all, s3_family, weights


def test_budgeted_merge_from_s3_fetches_its_budget_and_matches_local(s3_server, tmp_path,
                                                                     monkeypatch, capsys) -> None:
    with s3_family(s3_server, tmp_path, monkeypatch) as fam:
        remote_cat, local_cat = new_catalog(tmp_path, "remote"), new_catalog(tmp_path, "local")
        ingest_all(remote_cat, {n: fam.url(n) for n in fam.local})
        ingest_all(local_cat, {n: str(p) for n, p in fam.local.items()})
        # ingestion read every byte of every object once (statistics need every byte)
        for n in EXPERTS:
            assert fam.proxy.counts.get_bytes(f"/fam/{n}/model.safetensors") == \
                (fam.local[n] / "model.safetensors").stat().st_size

        fam.proxy.reset_counts()
        rc, remote = cli_merge(remote_cat, str(tmp_path / "from-s3"), capsys)
        assert rc == 0, remote
        rc, local = cli_merge(local_cat, str(tmp_path / "from-disk"), capsys)
        assert rc == 0, local
        assert isinstance(remote, dict) and isinstance(local, dict)

        # counted by the proxy: expert response bodies within the budget (<= 20% of the full read)
        fetched = sum(fam.proxy.counts.get_bytes(f"/fam/{e}/") for e in EXPERTS)
        assert 0 < fetched <= remote["budget_bytes"] <= 0.2 * remote["full_read_bytes"] + 1
        assert fetched == remote["expert_bytes_read"] == local["expert_bytes_read"]
        # the whole base was streamed (and its header read to check it), the experts by range
        header = 8 + struct.unpack("<Q", weights(fam.local["base"])[:8])[0]
        assert fam.proxy.counts.get_bytes("/fam/base/model.safetensors") == \
            remote["base_bytes_read"] + header
        assert weights(tmp_path / "from-s3") == weights(tmp_path / "from-disk")
        assert remote["output_hash"] == local["output_hash"]

        manifest = json.loads((tmp_path / "from-s3" / "manifest.json").read_text())
        for e in manifest["experts"]:
            counted = fam.proxy.counts.get_bytes(f"/fam/{e['model']}/")
            assert e["bytes_read"] == counted
            assert e["requests"] == fam.proxy.counts.get_requests(f"/fam/{e['model']}/") > 0
            assert e["retries"] == 0
        files = manifest["inputs"][1]["files"]
        assert files[0]["path"] == fam.url("e0") + "/model.safetensors"
        assert files[0]["etag"].startswith('"')
        text = json.dumps(manifest)
        assert "testing" not in text  # no credential of the environment is recorded
        assert (tmp_path / "from-s3" / "config.json").read_text() == \
            (tmp_path / "from-disk" / "config.json").read_text()


CONFIG = """\
merge_method: task_arithmetic
base_model: {base}
models:
  - model: {e0}
    parameters: {{weight: 0.5}}
  - model: {e1}
    parameters: {{weight: 1.0}}
  - model: {e2}
    parameters: {{weight: 0.3}}
"""


def test_ingest_through_the_api_is_confined_to_the_remote_roots(s3_server, tmp_path,
                                                               monkeypatch) -> None:
    with s3_family(s3_server, tmp_path, monkeypatch) as fam:
        settings = settings_for(tmp_path, remote_roots=(f"s3://{fam.bucket}/fam",))
        with client_for(settings) as c:
            r = c.post("/v1/models", json={"name": "base", "path": fam.url("base"),
                                           "block_bytes": 1024})
            assert r.status_code == 202, r.text
            r = c.post("/v1/models", json={"name": "e0", "path": fam.url("e0") + "/",
                                           "base": "base"})
            assert r.status_code == 202, r.text
            assert wait(c, "/v1/models/base")["status"] == "ready"
            e0 = wait(c, "/v1/models/e0")
            assert e0["status"] == "ready" and e0["path"] == fam.url("e0"), e0
            for path in (f"s3://{fam.bucket}/famx/e1", f"s3://{fam.bucket}-2/fam/e1",
                         f"https://example.com/{fam.bucket}/fam/e1"):
                r = c.post("/v1/models", json={"name": "e1", "path": path, "base": "base"})
                assert "remote roots" in assert_error(r, 403, "forbidden", "path")["message"]
            r = c.post("/v1/models", json={"name": "e1", "path": f"s3://{fam.bucket}/fam/../x",
                                           "base": "base"})
            assert_error(r, 422, "invalid_request", "path")
            r = c.post("/v1/models", json={"name": "e9", "path": fam.url("nothing-here"),
                                           "base": "base"})
            assert r.status_code == 202
            job = wait(c, "/v1/models/e9")
            assert job["status"] == "failed", job
            assert f"{fam.url('nothing-here')}: no such file or directory" in str(job), job

            # a mergekit config naming the checkpoints by URL: registered ones match by URL,
            # the others are queued for ingestion with the merge
            config = CONFIG.format(**{n: fam.url(n) for n in ("base", *EXPERTS)})
            r = c.post("/v1/merges", json={"config_yaml": config, "output": {"name": "ta"}})
            assert r.status_code == 202, r.text
            done = wait(c, f"/v1/merges/{r.json()['id']}")
            assert done["status"] == "succeeded", done
            manifest = c.get(f"/v1/merges/{r.json()['id']}/manifest").json()
            assert [i["path"] for i in manifest["inputs"]] == \
                [fam.url(n) for n in ("base", *EXPERTS)]
            outside = config.replace(fam.url("e2"), f"s3://{fam.bucket}/elsewhere/e2")
            r = c.post("/v1/merges", json={"config_yaml": outside, "output": {"name": "tb"}})
            assert_error(r, 403, "forbidden")


def test_cli_ingest_errors_name_the_object(s3_server, tmp_path, monkeypatch, capsys) -> None:
    with s3_family(s3_server, tmp_path, monkeypatch) as fam:
        cat = str(new_catalog(tmp_path, "c"))
        assert main(["--catalog", cat, "ingest", f"s3://{fam.bucket}-missing/fam/base",
                     "--name", "b"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{fam.bucket}-missing" in err and "404" in err, err
        monkeypatch.setenv("AWS_ALLOW_HTTP", "false")
        assert main(["--catalog", cat, "ingest", fam.url("base"), "--name", "b"]) == 2
        assert "AWS_ALLOW_HTTP" in capsys.readouterr().err
