"""S3-compatible object storage through boto3: stat, list, ranged GETs (resumed on retry), uploads."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any, NoReturn

from mergepipe.core.errors import InvalidCheckpoint, InvalidRequest
from mergepipe.storage.locations import Url, parse_url
from mergepipe.storage.remote import (
    RangedBody,
    RangedReads,
    RemoteConfig,
    Transient,
    check_size,
    current_scope,
    raise_for_status,
    with_retries,
)
from mergepipe.storage.store_types import DIR, FILE, FetchStats, Stamp


class _NoBotocore(Exception):
    """Stands for botocore's exceptions where the extra is not installed (never raised)."""


@functools.cache
def _botocore_errors() -> tuple[type[Exception], type[Exception]]:
    """botocore's (BotoCoreError, ClientError), imported when an S3 call fails (boto3 is slow)."""
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:  # pragma: no cover - exercised by an install without the extra
        return _NoBotocore, _NoBotocore
    return BotoCoreError, ClientError

TRANSIENT_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
                   "RequestTimeTooSkewed", "InternalError", "ServiceUnavailable",
                   "RequestLimitExceeded", "TooManyRequests"}
DENIED_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled",
                "InvalidToken", "ExpiredToken"}
MISSING_CODES = {"NoSuchKey", "NoSuchBucket", "NotFound", "NoSuchVersion"}
# the HTTP status an error code means, whatever status came with it
_CODE_STATUS = ((503, TRANSIENT_CODES), (404, MISSING_CODES), (403, DENIED_CODES),
                (412, {"PreconditionFailed"}), (416, {"InvalidRange"}))


class S3Store(RangedReads):
    """Objects of any S3-compatible store."""

    def __init__(self, cfg: RemoteConfig) -> None:
        self.cfg = cfg
        self._client: Any = None
        self._lock = threading.Lock()

    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self._make_client()
            return self._client

    def _make_client(self) -> Any:
        try:  # the optional extra `remote`
            import boto3
            from botocore.config import Config
        except ImportError:  # pragma: no cover - exercised by an install without the extra
            raise InvalidRequest("s3:// checkpoints need the remote extra: pip install "
                                 "'mergepipe[remote]'", field="path") from None
        endpoint = self.cfg.aws_value("AWS_ENDPOINT_URL_S3") or self.cfg.aws_value(
            "AWS_ENDPOINT_URL")
        allow_http = (self.cfg.aws_value("AWS_ALLOW_HTTP") or "").lower() in ("1", "true", "yes")
        if endpoint and endpoint.lower().startswith("http://") and not allow_http:
            raise InvalidRequest(f"AWS_ENDPOINT_URL {endpoint} is plain HTTP; set "
                                 "AWS_ALLOW_HTTP=true to use it", field="AWS_ENDPOINT_URL")
        config = Config(retries={"total_max_attempts": 1}, connect_timeout=self.cfg.timeout_s,
                        read_timeout=self.cfg.timeout_s, max_pool_connections=32,
                        request_checksum_calculation="when_required",
                        response_checksum_validation="when_required")
        return boto3.session.Session().client("s3", endpoint_url=endpoint, config=config)

    # -- discovery ---------------------------------------------------------------------------

    def stat(self, path: str) -> Stamp:
        r = self._object(path, "head_object")
        return Stamp(check_size(path, int(r["ContentLength"])),
                     int(r["LastModified"].timestamp() * 1e9),
                     r.get("ETag"), r.get("VersionId"))

    def kind(self, path: str) -> str | None:
        url = parse_url(path)
        if url.key:
            try:
                self.stat(path)
                return FILE
            except FileNotFoundError:
                pass
        return DIR if self.any_under(path) or not url.key else None

    def entries(self, path: str) -> dict[str, str]:
        url = parse_url(path)
        prefix, out, token = _prefix(url), {}, None
        while True:
            kw: dict[str, str] = {"ContinuationToken": token} if token else {}
            r = self._call(path, FetchStats(), "list_objects_v2", Bucket=url.authority,
                           Prefix=prefix, Delimiter="/", **kw)
            out.update({o["Key"][len(prefix):]: FILE for o in r.get("Contents", [])})
            out.update({p["Prefix"][len(prefix):].rstrip("/"): DIR
                        for p in r.get("CommonPrefixes", [])})
            token = r.get("NextContinuationToken")
            if not r.get("IsTruncated") or not token:
                out.pop("", None)  # a "directory marker" object
                return out

    # -- byte ranges -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _ranged(self, path: str, start: int, end: int, pin: Stamp | None
                ) -> Iterator[RangedBody]:
        """A ranged GET of the pinned version (VersionId, else If-Match on the ETag)."""
        from mergepipe.storage.http_store import watching  # urllib3: with boto3, not before

        url = parse_url(path)
        pinned = ({"VersionId": pin.version_id} if pin and pin.version_id
                  else {"IfMatch": pin.etag} if pin and pin.etag else {})
        r = self._request(path, "get_object", Bucket=url.authority, Key=url.key,
                          Range=f"bytes={start}-{end - 1}", **pinned)
        body = r["Body"]
        # the job's deadline cuts off a body still arriving (a trickling endpoint)
        conn = getattr(getattr(body, "_raw_stream", None), "connection", None)
        try:
            with watching(conn, current_scope().deadline):
                yield r.get("ContentRange"), lambda k: self._read_body(body, k)
        finally:
            body.close()

    @staticmethod
    def _read_body(body: Any, nbytes: int) -> bytes:
        try:
            return bytes(body.read(nbytes))
        except (_botocore_errors()[0], OSError) as e:
            raise Transient(f"reading the body: {e}") from None

    # -- uploads (outputs) -------------------------------------------------------------------

    def any_under(self, path: str) -> bool:
        """Whether any object lies under the prefix `path` (one listing, a missing bucket too)."""
        url = parse_url(path)
        r = self._call(path, FetchStats(), "list_objects_v2", Bucket=url.authority,
                       Prefix=_prefix(url), MaxKeys=1)
        return bool(r.get("KeyCount", 0))

    def start_upload(self, path: str) -> str:
        return str(self._object(path, "create_multipart_upload")["UploadId"])

    def upload_part(self, path: str, upload_id: str, number: int, data: bytes) -> str:
        return str(self._object(path, "upload_part", UploadId=upload_id, PartNumber=number,
                                Body=data)["ETag"])

    def complete_upload(self, path: str, upload_id: str, etags: list[str]) -> None:
        parts = [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags)]
        self._object(path, "complete_multipart_upload", UploadId=upload_id,
                     MultipartUpload={"Parts": parts})

    def abort_upload(self, path: str, upload_id: str) -> None:
        self._object(path, "abort_multipart_upload", UploadId=upload_id)

    def delete(self, path: str) -> None:
        self._object(path, "delete_object")

    # -- requests ----------------------------------------------------------------------------

    def _object(self, path: str, op: str, **kw: Any) -> Any:
        url = parse_url(path)
        return self._call(path, FetchStats(), op, Bucket=url.authority, Key=url.key, **kw)

    def _call(self, path: str, stats: FetchStats, op: str, **kw: Any) -> Any:
        def attempt() -> Any:
            stats.add(requests=1)
            return self._request(path, op, **kw)
        return with_retries(path, self.cfg, stats, attempt)

    def _request(self, path: str, op: str, **kw: Any) -> Any:
        try:
            return getattr(self.client(), op)(**kw)
        except _botocore_errors()[1] as e:
            _raise_for(path, e, kw)
        except (_botocore_errors()[0], OSError) as e:
            raise Transient(f"{type(e).__name__}: {e}") from None


def _prefix(url: Url) -> str:
    return f"{url.key}/" if url.key else ""


def _raise_for(path: str, e: Any, kw: dict[str, Any]) -> NoReturn:
    """The error for an S3 error response: retried, missing, refused, changed or invalid."""
    err = e.response.get("Error", {})
    code = str(err.get("Code", ""))
    status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    label = f"HTTP {status}" + (f" {code}" if code and code != str(status) else "")
    status = next((s for s, codes in _CODE_STATUS if code in codes), status)
    raise_for_status(path, status, label, "bucket" if code == "NoSuchBucket" else "object",
                     "the credentials in the environment may not read it", kw.get("IfMatch"),
                     kw.get("Range"))
    raise InvalidCheckpoint(f"{path}: S3 error {label}: {err.get('Message', '')}")
