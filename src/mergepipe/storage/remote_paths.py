"""Confinement of remote sources: URLs under an allowed bucket or URL prefix (MERGEPIPE_REMOTE_ROOTS)."""

from __future__ import annotations

from collections.abc import Sequence

from mergepipe.core.errors import Forbidden
from mergepipe.storage.locations import parse_url


def confine_url(raw: str, remote_roots: Sequence[str], field: str = "path") -> str:
    """The canonical form of the URL `raw` if it lies under a remote root (whole path
    segments: s3://bucket/team does not allow s3://bucket/team-b). Existence is left to the
    ingestion job, which names the missing object."""
    if not remote_roots:
        raise Forbidden("no remote roots are configured (MERGEPIPE_REMOTE_ROOTS); the server "
                        "may not read any URL", field=field)
    url = parse_url(raw, field)
    roots = [parse_url(r, "MERGEPIPE_REMOTE_ROOTS") for r in remote_roots]
    if not any(url.within(r) for r in roots):
        raise Forbidden(f"{field} {str(url)!r} is outside the allowed remote roots",
                        field=field)
    return str(url)
