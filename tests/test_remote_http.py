"""Checkpoints behind HTTP (a hub's directory layout, served on loopback with Range, ETag and a
bearer token, behind the counting proxy): ingestion, a budgeted merge that fetches at most its
budget and matches the merge of local copies, retried faults, refused tokens, changed files."""

from __future__ import annotations

import os
from pathlib import Path

from mergepipe.cli.main import main
from tests.api_helpers import EXPERTS, make_family
from tests.catalogs import new_catalog
from tests.remote_family import cli_merge, ingest_all, weights
from tests.remote_servers import CountingProxy, Fault, file_server

TOKEN = "hub-token-for-tests"


def test_merge_from_http_matches_local_and_fetches_its_budget(tmp_path: Path, monkeypatch,
                                                              capsys) -> None:
    local = make_family(tmp_path / "data")
    monkeypatch.setenv("MERGEPIPE_HTTP_TOKEN", TOKEN)
    monkeypatch.setenv("MERGEPIPE_REMOTE_BACKOFF_S", "0.01")
    with file_server(tmp_path / "data", token=TOKEN) as upstream:
        proxy = CountingProxy(upstream)
        with proxy.serve() as url:
            remote_cat, local_cat = new_catalog(tmp_path, "remote"), new_catalog(tmp_path, "local")
            ingest_all(remote_cat, {n: f"{url}/{n}" for n in local})
            ingest_all(local_cat, {n: str(p) for n, p in local.items()})
            proxy.reset_counts()
            proxy.inject(Fault("reset", times=2, path_part="/e1/", after=100))
            rc, remote = cli_merge(remote_cat, str(tmp_path / "from-http"), capsys)
            assert rc == 0 and isinstance(remote, dict), remote
            rc, disk = cli_merge(local_cat, str(tmp_path / "from-disk"), capsys)
            assert rc == 0 and isinstance(disk, dict), disk
            assert weights(tmp_path / "from-http") == weights(tmp_path / "from-disk")
            sent = sum(proxy.counts.get_bytes(f"/{e}/") for e in EXPERTS)
            assert remote["expert_bytes_read"] == disk["expert_bytes_read"]
            assert remote["expert_bytes_read"] <= sent <= remote["expert_bytes_read"] + 200
            assert remote["expert_bytes_read"] <= remote["budget_bytes"] <= \
                0.2 * remote["full_read_bytes"] + 1
            assert (tmp_path / "from-http" / "config.json").read_text() == \
                (tmp_path / "from-disk" / "config.json").read_text()

            monkeypatch.setenv("MERGEPIPE_HTTP_TOKEN", "wrong")
            assert main(["--catalog", str(remote_cat), "ingest", f"{url}/e2", "--name", "x",
                         "--base", "base"]) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and f"{url}/e2" in err and "HTTP 401" in err, err
            monkeypatch.setenv("MERGEPIPE_HTTP_TOKEN", TOKEN)

            f = local["e0"] / "model.safetensors"
            st = f.stat()
            os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))  # a new ETag
            rc, _ = cli_merge(remote_cat, str(tmp_path / "touched"), capsys)
            assert rc == 0  # the same bytes: re-verified by content hash, accepted
            data = bytearray(f.read_bytes())
            data[-4:] = bytes(b ^ 0x5A for b in data[-4:])
            f.write_bytes(bytes(data))  # other bytes, another ETag
            rc, err = cli_merge(remote_cat, str(tmp_path / "changed"), capsys)
            assert rc == 2 and isinstance(err, str)
            assert f"{url}/e0/model.safetensors changed after ingestion (ETag" in err, err
            assert "content hash" in err, err
            assert not (tmp_path / "changed").exists()
