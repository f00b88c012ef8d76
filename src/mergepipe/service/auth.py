"""Bearer-token check for the mutating endpoints (only when MERGEPIPE_API_TOKEN is set)."""

from __future__ import annotations

import hmac

from fastapi import Request

from mergepipe.core.errors import Unauthorized


def require_token(request: Request) -> None:
    """FastAPI dependency: 401 unless `Authorization: Bearer <token>` matches the setting."""
    token: str | None = request.app.state.mergepipe.settings.api_token
    if not token:
        return
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise Unauthorized("missing bearer token (Authorization: Bearer <token>)")
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise Unauthorized("invalid bearer token")
