"""Where a checkpoint file lives: a local path, or an s3:// / http(s):// URL (parse, join, name)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import unquote

from mergepipe.core.errors import InvalidRequest

SCHEMES = ("s3", "https", "http")
_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<authority>[^/?#]*)(?P<rest>.*)$",
                  re.DOTALL)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:\d{1,5})?$")


@dataclass(frozen=True)
class Url:
    """A remote object or directory: scheme, bucket or host[:port], and the key (no leading
    or trailing slash; '' for the bucket or the site's root)."""

    scheme: str
    authority: str
    key: str

    def __str__(self) -> str:
        return f"{self.scheme}://{self.authority}/{self.key}" if self.key else \
            f"{self.scheme}://{self.authority}"

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    def child(self, name: str) -> Url:
        return Url(self.scheme, self.authority, f"{self.key}/{name}" if self.key else name)

    def parent(self) -> Url:
        return Url(self.scheme, self.authority, self.key.rsplit("/", 1)[0] if "/" in self.key
                   else "")

    def within(self, root: Url) -> bool:
        """Whether this URL is `root` or lies under it (whole path segments)."""
        return (self.scheme, self.authority) == (root.scheme, root.authority) and (
            not root.key or self.key == root.key or self.key.startswith(root.key + "/"))


def is_url(path: object) -> bool:
    """Whether `path` names a remote location (any scheme://, refused later if unknown)."""
    return isinstance(path, str) and _URL.match(path) is not None


def parse_url(text: str, field: str = "path") -> Url:
    """A checked URL: a known scheme, a bucket or host, no credentials, query or '..'."""
    m = _URL.match(text)
    if m is None:
        raise InvalidRequest(f"{field} {text!r} is not a URL", field=field)
    scheme, authority, rest = m.group("scheme").lower(), m.group("authority"), m.group("rest")
    if scheme not in SCHEMES:
        raise InvalidRequest(f"{field} {text!r}: scheme {scheme}:// is not supported (s3://, "
                             "https://, http://)", field=field)
    if "@" in authority:
        raise InvalidRequest(f"{field}: a URL may not carry credentials; use the AWS "
                             "environment or MERGEPIPE_HTTP_TOKEN", field=field)
    if "?" in rest or "#" in rest or "\\" in rest or any(ord(c) < 32 for c in rest):
        raise InvalidRequest(f"{field} {text!r}: no query, fragment or control characters in a "
                             "checkpoint URL", field=field)
    ok = _BUCKET.match(authority) if scheme == "s3" else _HOST.match(authority)
    if not ok:
        what = "bucket name" if scheme == "s3" else "host"
        raise InvalidRequest(f"{field} {text!r}: {authority!r} is not a valid {what}",
                             field=field)
    parts = [p for p in rest.split("/") if p]
    if any(unquote(p) in (".", "..") for p in parts):
        raise InvalidRequest(f"{field} {text!r}: '.' and '..' segments are not allowed",
                             field=field)
    return Url(scheme, authority.lower() if scheme != "s3" else authority, "/".join(parts))


def absolute(path: str | os.PathLike[str]) -> str:
    """The canonical form of a location: a checked URL, or an absolute local path."""
    text = os.fspath(path)
    return str(parse_url(text)) if is_url(text) else os.path.abspath(text)


def join(directory: str, name: str) -> str:
    """`name` inside the directory `directory` (local or remote)."""
    return str(parse_url(directory).child(name)) if is_url(directory) else \
        os.path.join(directory, name)


def basename(path: str) -> str:
    return parse_url(path).name if is_url(path) else os.path.basename(path)


def parent(path: str) -> str:
    return str(parse_url(path).parent()) if is_url(path) else os.path.dirname(path)
