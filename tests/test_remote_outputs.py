"""Outputs to s3://: a merge uploads its files by multipart upload and completes them only after
every part is stored, manifest.json last; a failed upload leaves nothing visible (no object, no
pending upload); the published output is registered from S3 and is the same as a local one."""

from __future__ import annotations

import json

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.models import model_files
from tests.catalogs import new_catalog
from tests.remote_family import cli_merge, ingest_all, s3_family, weights
from tests.remote_servers import Fault


def test_merge_to_s3_publishes_complete_outputs_only(s3_server, tmp_path, monkeypatch,
                                                    capsys) -> None:
    with s3_family(s3_server, tmp_path, monkeypatch) as fam:
        cat = new_catalog(tmp_path, "c")
        ingest_all(cat, {n: str(p) for n, p in fam.local.items()})
        rc, local = cli_merge(cat, str(tmp_path / "local-out"), capsys, budget="0.5")
        assert rc == 0, local
        out = f"s3://{fam.bucket}/outputs/m1"
        fam.proxy.log.clear()
        rc, remote = cli_merge(cat, out, capsys, budget="0.5", extra=("--name", "m1"))
        assert rc == 0 and isinstance(remote, dict), remote
        assert remote["output"] == out
        keys = {o["Key"]: o for o in fam.client.list_objects_v2(
            Bucket=fam.bucket, Prefix="outputs/m1/")["Contents"]}
        names = sorted(k.rsplit("/", 1)[1] for k in keys)
        assert names == sorted(p.name for p in (tmp_path / "local-out").iterdir())
        body = fam.client.get_object(Bucket=fam.bucket, Key="outputs/m1/model.safetensors")
        assert body["Body"].read() == weights(tmp_path / "local-out")
        manifest = json.loads(fam.client.get_object(
            Bucket=fam.bucket, Key="outputs/m1/manifest.json")["Body"].read())
        assert manifest["output"]["path"] == out and manifest["merge_id"] == remote["merge_id"]
        # every part was stored before any upload was completed; the manifest's completed last
        writes = [(m, p) for m, p in fam.proxy.log if "/outputs/m1/" in p and m in ("PUT", "POST")]
        completes = [i for i, (m, p) in enumerate(writes) if m == "POST" and "uploadId=" in p]
        parts = [i for i, (m, p) in enumerate(writes) if m == "PUT" and "partNumber=" in p]
        assert len(completes) == len(names) and max(parts) < min(completes)
        assert "/manifest.json" in writes[completes[-1]][1]
        with Catalog(cat) as c:  # registered from S3, with the objects' ETags
            files = model_files(c, "m1")
        assert files[0].path == f"{out}/model.safetensors" and files[0].etag

        fam.proxy.inject(Fault("status", times=4, path_part="/outputs/m2/model.safetensors",
                               any_request=True))
        rc, err = cli_merge(cat, f"s3://{fam.bucket}/outputs/m2", capsys, budget="0.5",
                            extra=("--name", "m2"))
        assert rc == 2 and isinstance(err, str) and "gave up after 4" in err, err
        assert fam.client.list_objects_v2(Bucket=fam.bucket, Prefix="outputs/m2/")[
            "KeyCount"] == 0
        pending = fam.client.list_multipart_uploads(Bucket=fam.bucket, Prefix="outputs/m2/")
        assert not pending.get("Uploads"), pending

        rc, err = cli_merge(cat, out, capsys, budget="0.5", extra=("--name", "m3"))
        assert rc == 2 and "already holds objects" in str(err), err
