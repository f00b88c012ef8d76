"""Where a checkpoint file lives: a local path, or an s3://, http(s):// or hf:// URL."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import quote, unquote

from mergepipe.core.errors import InvalidRequest

SCHEMES = ("s3", "https", "http", "hf")
_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<authority>[^/?#]*)(?P<rest>.*)$",
                  re.DOTALL)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:\d{1,5})?$")
# hf://: the authority is the Hub user or organization (storage.hub)
_HUB_OWNER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
# A Hub id as mergekit configs write them: org/name, optionally @revision.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
                     r"(@[A-Za-z0-9._-]{1,128})?$")
_DEFAULT_PORTS = {"http": ":80", "https": ":443"}
# Characters of a path segment left as they are in the canonical form of an http(s) URL (RFC
# 3986 pchar, less ';', which some servers take as the start of path parameters).
_SEGMENT_SAFE = "!$&'()*+,=:@"
_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")


@dataclass(frozen=True)
class Url:
    """A remote object or directory: scheme, bucket or host[:port], canonical key."""

    scheme: str
    authority: str
    key: str

    def __str__(self) -> str:
        return f"{self.scheme}://{self.authority}/{self.key}" if self.key else \
            f"{self.scheme}://{self.authority}"

    @property
    def name(self) -> str:
        last = self.key.rsplit("/", 1)[-1]
        return last if self.scheme == "s3" else unquote(last)

    @property
    def origin(self) -> tuple[str, str]:
        """(scheme, host[:port]): where credentials may go (the exact origin a user named)."""
        return self.scheme, self.authority

    def child(self, name: str) -> Url:
        """The file `name` inside this directory (one segment, encoded for http(s))."""
        _check_segment(name, str(self), "name")
        seg = name if self.scheme == "s3" else quote(name, safe=_SEGMENT_SAFE)
        return Url(self.scheme, self.authority, f"{self.key}/{seg}" if self.key else seg)

    def parent(self) -> Url:
        return Url(self.scheme, self.authority, self.key.rsplit("/", 1)[0] if "/" in self.key
                   else "")

    def within(self, root: Url) -> bool:
        return (self.scheme, self.authority) == (root.scheme, root.authority) and (
            not root.key or self.key == root.key or self.key.startswith(root.key + "/"))


def hub_id_location(text: str) -> str | None:
    """'org/name[@rev]' (a model in a mergekit config) as an hf:// location; None otherwise."""
    return f"hf://{text}" if _HUB_ID.match(text) else None


def is_url(path: object) -> bool:
    """Whether `path` names a remote location (any scheme://, refused later if unknown)."""
    return isinstance(path, str) and _URL.match(path) is not None


def parse_url(text: str, field: str = "path") -> Url:
    """A checked URL in canonical form: a known scheme, a bucket or host (lower case, no
    default port), no credentials or query; each path segment percent-decoded once and refused
    if it is '.' or '..' or holds a separator ('/', '\\'), a control character or another
    escape (double encoding): what a server that decodes `%2F` or `%2e` would resolve
    differently from the text checked against the remote roots."""
    m = _URL.match(text)
    if m is None:
        raise InvalidRequest(f"{field} {text!r} is not a URL", field=field)
    scheme, authority, rest = m.group("scheme").lower(), m.group("authority"), m.group("rest")
    if scheme not in SCHEMES:
        raise InvalidRequest(f"{field} {text!r}: scheme {scheme}:// is not supported (s3://, "
                             "https://, http://, hf://)", field=field)
    if "@" in authority:
        raise InvalidRequest(f"{field}: a URL may not carry credentials; use the AWS "
                             "environment or MERGEPIPE_HTTP_TOKEN", field=field)
    if "?" in rest or "#" in rest or "\\" in rest or any(ord(c) < 32 for c in rest):
        raise InvalidRequest(f"{field} {text!r}: no query, fragment or control characters in a "
                             "checkpoint URL", field=field)
    authority = _authority(scheme, authority, text, field)
    parts = [p for p in rest.split("/") if p]
    for p in parts:
        try:
            decoded = unquote(p, errors="strict")
        except UnicodeDecodeError:
            raise InvalidRequest(f"{field} {short(text)}: a path segment is not UTF-8 once "
                                 "percent-decoded", field=field) from None
        _check_segment(decoded, text, field)
    if scheme != "s3":
        parts = [quote(unquote(p), safe=_SEGMENT_SAFE) for p in parts]
    return Url(scheme, authority, "/".join(parts))


def _authority(scheme: str, authority: str, text: str, field: str) -> str:
    """A checked bucket, Hub owner or host; a host in lower case without its default port."""
    ok = {"s3": _BUCKET, "hf": _HUB_OWNER}.get(scheme, _HOST).match(authority)
    if not ok:
        what = {"s3": "bucket name", "hf": "Hub user or organization"}.get(scheme, "host")
        raise InvalidRequest(f"{field} {text!r}: {authority!r} is not a valid {what}",
                             field=field)
    if scheme in ("s3", "hf"):
        return authority
    authority = authority.lower()
    port = authority.rpartition(":")[2] if not authority.endswith("]") else ""
    if ":" in authority and not authority.endswith("]") and not 0 < int(port) < 65536:
        raise InvalidRequest(f"{field} {text!r}: port {port} is out of range", field=field)
    return authority.removesuffix(_DEFAULT_PORTS[scheme])


def _check_segment(seg: str, text: str, field: str) -> None:
    """A decoded path segment: no dot segment, separator, control character or escape."""
    if seg.split(";", 1)[0] in (".", "..") or "/" in seg or "\\" in seg or \
            any(ord(c) < 32 or ord(c) == 127 for c in seg) or _ESCAPE.search(seg):
        raise InvalidRequest(f"{field} {short(text)}: a path segment may not be '.' or '..' "
                             "or hold a separator, control character or escape, encoded or "
                             "not", field=field)


def short(text: str) -> str:
    r = repr(text)
    return r if len(r) <= 200 else r[:197] + "..."


def absolute(path: str | os.PathLike[str]) -> str:
    """The canonical form of a location: a checked URL, or an absolute local path."""
    text = os.fspath(path)
    return str(parse_url(text)) if is_url(text) else os.path.abspath(text)


def join(directory: str, name: str) -> str:
    return str(parse_url(directory).child(name)) if is_url(directory) else \
        os.path.join(directory, name)


def basename(path: str) -> str:
    return parse_url(path).name if is_url(path) else os.path.basename(path)


def parent(path: str) -> str:
    return str(parse_url(path).parent()) if is_url(path) else os.path.dirname(path)
