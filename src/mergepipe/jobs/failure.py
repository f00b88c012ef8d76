"""The message a failed job records: the one users see, in the API and the CLI alike."""

from __future__ import annotations

from mergepipe.core.errors import MergePipeError


def failure_message(e: BaseException, job: str) -> str:
    """Our errors say what went wrong in their own words; anything else is an internal error
    named by its type and first line (no traceback, nothing over a few hundred characters)."""
    if isinstance(e, MergePipeError):
        return e.message
    if isinstance(e, KeyboardInterrupt):
        return "interrupted"
    first = (str(e).strip().splitlines() or [""])[0]
    return f"internal error during the {job} ({type(e).__name__}: {first[:300]})"
