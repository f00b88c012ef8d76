"""Faults between MergePipe and the S3 server (injected by the proxy): 503 bursts, connections reset
mid-body and truncated bodies are retried, resuming at the first missing byte, and give the same
output; too many failures in a row, a changed object and a refused one give clear errors and
publish nothing."""

from __future__ import annotations

import json

import pytest

from mergepipe.cli.main import main
from mergepipe.core.errors import SourceChanged
from mergepipe.storage.storage import open_reader
from mergepipe.storage.store_types import Stamp
from tests.api_helpers import EXPERTS
from tests.catalogs import new_catalog
from tests.remote_family import cli_merge, ingest_all, s3_family, weights
from tests.remote_servers import Fault


def test_faults_are_retried_or_stop_the_merge_cleanly(s3_server, tmp_path, monkeypatch,
                                                      capsys) -> None:
    with s3_family(s3_server, tmp_path, monkeypatch) as fam:
        cat = new_catalog(tmp_path, "c")
        ingest_all(cat, {n: fam.url(n) for n in fam.local})
        rc, clean = cli_merge(cat, str(tmp_path / "clean"), capsys)
        assert rc == 0 and isinstance(clean, dict), clean
        reference = weights(tmp_path / "clean")
        by_expert = {e["model"]: e for e in json.loads(
            (tmp_path / "clean" / "manifest.json").read_text())["experts"]}

        fam.proxy.inject(Fault("status", times=3, path_part="/fam/e1/"))         # a 503 burst
        fam.proxy.inject(Fault("reset", times=2, path_part="/fam/e0/", after=300))
        fam.proxy.inject(Fault("truncate", times=2, path_part="/fam/e2/", after=200))
        fam.proxy.reset_counts()
        rc, faulty = cli_merge(cat, str(tmp_path / "faulty"), capsys)
        assert rc == 0 and isinstance(faulty, dict), faulty
        assert weights(tmp_path / "faulty") == reference
        experts = {e["model"]: e for e in json.loads(
            (tmp_path / "faulty" / "manifest.json").read_text())["experts"]}
        assert [experts[e]["retries"] for e in EXPERTS] == [2, 3, 2]
        for e in EXPERTS:
            # resumed, not restarted: the bytes received are the bytes planned, as without faults
            assert experts[e]["bytes_read"] == by_expert[e]["bytes_read"] == \
                experts[e]["planned_bytes"]
            assert experts[e]["requests"] == by_expert[e]["requests"] + experts[e]["retries"]
        # sent by the server: the same for a burst and for clean truncations; a reset may lose
        # what was in flight (at most the 2 x 300 bytes the proxy sent before resetting)
        for e in ("e1", "e2"):
            assert fam.proxy.counts.get_bytes(f"/fam/{e}/") == experts[e]["bytes_read"]
        sent = fam.proxy.counts.get_bytes("/fam/e0/")
        assert experts["e0"]["bytes_read"] <= sent <= experts["e0"]["bytes_read"] + 2 * 300
        assert faulty["expert_bytes_read"] <= faulty["budget_bytes"]

        fam.proxy.inject(Fault("status", times=20, path_part="/fam/e1/"))
        rc, err = cli_merge(cat, str(tmp_path / "unavailable"), capsys)
        assert rc == 2 and isinstance(err, str)
        assert err.count("\n") == 1 and fam.url("e1") in err and "gave up after 4" in err, err
        assert not (tmp_path / "unavailable").exists()
        fam.proxy.faults.clear()

        changed = bytearray(weights(fam.local["e2"]))
        changed[-8:] = bytes(8)  # same size, other bytes: a new ETag
        fam.client.put_object(Bucket=fam.bucket, Key="fam/e2/model.safetensors",
                              Body=bytes(changed))
        rc, err = cli_merge(cat, str(tmp_path / "changed"), capsys)
        assert rc == 2 and isinstance(err, str)
        assert f"{fam.url('e2')}/model.safetensors changed after ingestion (ETag" in err, err
        assert "re-ingest 'e2'" in err and not (tmp_path / "changed").exists()


def test_a_read_pinned_to_an_old_version_fails(s3_server, tmp_path, monkeypatch) -> None:
    """An object that changes while it is read (its ETag no longer matches) is never mixed in."""
    with s3_family(s3_server, tmp_path, monkeypatch) as fam:
        url = fam.url("e0") + "/model.safetensors"
        with open_reader(random_access=True) as reader:
            size = reader.size(url)
            assert bytes(reader.read(url, 0, 8)) == weights(fam.local["e0"])[:8]
            reader.pin(url, Stamp(size, 0, '"0123456789abcdef0123456789abcdef"'))
            with pytest.raises(SourceChanged, match="changed while it was being read"):
                reader.read(url, 8, 16)


def test_refused_objects_are_named(s3_server, tmp_path, monkeypatch, capsys) -> None:
    with s3_family(s3_server, tmp_path, monkeypatch) as fam:
        fam.proxy.inject(Fault("status", status=403, times=50, path_part="/fam/base",
                               any_request=True))
        assert main(["--catalog", str(new_catalog(tmp_path, "c")), "ingest", fam.url("base"),
                     "--name", "b"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and fam.url("base") in err, err
        assert "access denied (HTTP 403" in err, err
