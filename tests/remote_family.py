"""A seeded family uploaded to the loopback S3 server, and the same merge run from S3 and locally."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from mergepipe.cli.main import main
from tests.api_helpers import EXPERTS, make_family
from tests.remote_servers import CountingProxy, environ_for, upload_dir

BLOCK = "1KiB"  # a fine grid: every 4 KiB tensor is 4 blocks, so a budget picks some of them


@dataclass
class S3Family:
    """A family on local disk and its copy in a fresh bucket, reached through a counting proxy."""

    local: dict[str, Path]
    bucket: str
    client: Any  # the test's own boto3 client (straight to the server, not counted)
    proxy: CountingProxy
    endpoint: str  # the proxy's URL (what MergePipe talks to)

    def url(self, name: str) -> str:
        return f"s3://{self.bucket}/fam/{name}"


@contextmanager
def s3_family(s3_server: str, tmp: Path, monkeypatch: pytest.MonkeyPatch
              ) -> Iterator[S3Family]:
    local = make_family(tmp / "data")
    bucket = f"mp-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    client.create_bucket(Bucket=bucket)
    for name, path in local.items():
        upload_dir(client, bucket, f"fam/{name}", path)
    proxy = CountingProxy(s3_server)
    with proxy.serve() as endpoint:
        for k, v in environ_for(endpoint).items():
            monkeypatch.setenv(k, v)
        yield S3Family(local, bucket, client, proxy, endpoint)


def ingest_all(catalog: Path | str, source: dict[str, str]) -> None:
    """`mergepipe ingest` the base and the experts (paths or URLs) on the CLI."""
    assert main(["--catalog", str(catalog), "ingest", source["base"], "--name", "base",
                 "--block-bytes", BLOCK]) == 0
    for e in EXPERTS:
        assert main(["--catalog", str(catalog), "ingest", source[e], "--name", e,
                     "--base", "base"]) == 0


def cli_merge(catalog: Path | str, out: str, capsys: pytest.CaptureFixture[str],
              budget: str = "0.2",
              extra: tuple[str, ...] = ()) -> tuple[int, dict[str, Any] | str]:
    """A TIES merge of the three experts on the CLI: (exit code, its JSON summary or error)."""
    capsys.readouterr()
    rc = main(["--catalog", str(catalog), "merge", "--base", "base", "--experts",
               ",".join(EXPERTS), "--op", "ties", "--param", "density=0.5", "--budget", budget,
               "--out", out, "--json", *extra])
    captured = capsys.readouterr()
    return rc, json.loads(captured.out) if rc == 0 else captured.err


def weights(out: Path) -> bytes:
    return (out / "model.safetensors").read_bytes()
