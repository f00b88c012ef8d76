"""Domain exceptions; each carries the HTTP status that says whose fault it is."""

from __future__ import annotations

from typing import Any

# A message quotes what it is about (a name, a path, a value): never more than this in all, so
# that a hostile value cannot make the error itself large (a 351 MB body in 0.1).
MAX_MESSAGE_CHARS = 1000


class MergePipeError(Exception):
    """Base of every error we raise on purpose; `status` maps it to HTTP, `code` names it."""

    status = 500
    code = "internal_error"

    def __init_subclass__(cls, status: int | None = None, code: str | None = None,
                          **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.status = cls.status if status is None else status
        cls.code = cls.code if code is None else code

    def __init__(self, message: str, *, field: str | None = None) -> None:
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[:MAX_MESSAGE_CHARS - 3] + "..."
        if field is not None and len(field) > 200:
            field = field[:197] + "..."
        super().__init__(message)
        self.message = message
        self.field = field

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"code": self.code, "message": self.message}
        if self.field is not None:
            out["field"] = self.field
        return out


class InvalidRequest(MergePipeError, status=422, code="invalid_request"):
    """The request makes no sense (bad operator, density, budget, shapes...)."""


class InvalidCheckpoint(InvalidRequest, code="invalid_checkpoint"):
    """A checkpoint file is corrupt, truncated or does not match its base."""


class NotFound(MergePipeError, status=404, code="not_found"):
    pass


class Conflict(MergePipeError, status=409, code="conflict"):
    pass


class Forbidden(MergePipeError, status=403, code="forbidden"):
    pass


class Unauthorized(MergePipeError, status=401, code="unauthorized"):
    pass


class Busy(MergePipeError, status=429, code="too_many_requests"):
    """Too many requests of one kind are running (e.g. read-only SQL); retry later."""


class SourceChanged(MergePipeError, status=409, code="source_changed"):
    """A registered file changed on disk after ingestion; re-ingest it."""


class BudgetViolation(MergePipeError, status=500, code="budget_violation"):
    """Internal invariant: the executor was about to read past the budget."""


class RemoteUnavailable(MergePipeError, status=503, code="remote_unavailable"):
    """Remote storage kept failing (timeouts, throttling, 5xx) after every retry; try later."""


class InsufficientStorage(MergePipeError, status=507, code="insufficient_storage"):
    """The output's disk is full (or a quota or file-size limit is reached); free space there."""


class CatalogReadOnly(MergePipeError, status=503, code="catalog_read_only"):
    """The catalog cannot be written (a read-only file or mount, an immutable file, a read-only
    database); an administrator must make it writable."""


class JobTimeout(MergePipeError, status=504, code="job_timeout"):
    """A job ran past its total time limit (MERGEPIPE_JOB_TIMEOUT_S) waiting on the outside."""


def failure_message(e: BaseException, job: str) -> str:
    """The message a failed job records, the one users see in the API and the CLI alike: our
    errors say what went wrong in their own words; anything else is an internal error named by
    its type and first line (no traceback, nothing over a few hundred characters)."""
    if isinstance(e, MergePipeError):
        return e.message
    if isinstance(e, KeyboardInterrupt):
        return "interrupted"
    first = (str(e).strip().splitlines() or [""])[0]
    return f"internal error during the {job} ({type(e).__name__}: {first[:300]})"
