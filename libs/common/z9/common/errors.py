"""Typed errors. Jobs raise these; foreign exceptions are translated into them at one boundary
(Proxmox: ``z9.executor.proxmox``), and the API maps :class:`ApiError` to JSON responses.

Job outcome classes (architecture §4):

- :class:`TemporaryError` — busy, lock held, 5xx/595/596, connection reset, timeout. The job goes
  to ``retry`` with exponential backoff; the resource is not marked failed.
- :class:`PermanentError` — the request cannot succeed as specified (invalid spec, template
  missing, refused by the deletion guard). The job goes to ``failed`` and the resource carries
  the reason.
- :class:`Snooze` — waiting on the world (a VM lock held by another task): ``retry`` after
  ``delay_s`` seconds without spending an attempt.
- :class:`LeaseLost` — a fenced write matched zero rows: another worker owns the job now. The
  worker stops the job at once and writes nothing else.
"""
from __future__ import annotations

from typing import Any


class Z9Error(Exception):
    """Base of every z9 error."""


class JobError(Z9Error):
    """Base of the errors that decide a job attempt's outcome. ``error_class`` goes to the job row."""

    error_class = "temporary"


class TemporaryError(JobError):
    """Retry later with backoff; the resource keeps its status."""

    error_class = "temporary"


class InternalError(TemporaryError):
    """An unexpected exception (a bug, an untranslated error) during a job: retried like a
    temporary error (the job row says ``temporary``); metrics count it apart as ``internal``."""


class PermanentError(JobError):
    """Stop now; the job is ``failed`` and the resource carries ``str(self)`` as its reason."""

    error_class = "permanent"


class GuardRefusal(PermanentError):
    """The deletion guard refused to touch a VM (platform role, or not this resource's VM)."""


class Cancelled(PermanentError):
    """The job was superseded by a later job of its resource that ends it (an immediate deletion):
    it stops between two steps and fails with error class ``cancelled``, naming that job."""

    error_class = "cancelled"

    def __init__(self, message: str, by_job: str):
        super().__init__(message)
        self.by_job = by_job


class Snooze(JobError):
    """Wait ``delay_s`` seconds for the world and try again without spending an attempt."""

    error_class = "snooze"

    def __init__(self, message: str, delay_s: float | None = None):
        super().__init__(message)
        self.delay_s = delay_s


class DatabaseMisconfigured(Z9Error):
    """The database z9 reached is not set up the way z9 needs (``plan_cache_mode`` not
    ``force_custom_plan`` behind a pooler, synchronous replication required but off): the
    service refuses to run rather than run degraded. The message says what to change."""


class LeaseLost(Z9Error):
    """A fenced write to a running job matched no row: this worker no longer owns the job."""


class DatabaseError(Z9Error):
    """Base of the errors the store (the one PostgreSQL boundary, ``z9.common.store``) raises
    instead of asyncpg's."""


class DatabaseUnavailable(DatabaseError):
    """The database cannot be reached right now (connection lost or refused, server shutting
    down): back off and retry; nothing of the statement can be assumed either way."""


class LockWaitTimeout(DatabaseError):
    """A statement waited longer than its connection's bound (``lock_timeout``,
    ``statement_timeout``) for a row another transaction holds, or lost a deadlock: rolled back,
    nothing written; retry later."""


class ConstraintViolation(DatabaseError):
    """A write would break a constraint; ``constraint`` names it, so the caller can say which
    precondition failed."""

    def __init__(self, constraint: str, message: str = ""):
        super().__init__(message or f"constraint {constraint} violated")
        self.constraint = constraint


class UniqueViolation(ConstraintViolation):
    """A unique constraint or index (e.g. ``servers_tenant_name_live``)."""


class CheckViolation(ConstraintViolation):
    """A CHECK constraint, or a table's own rule raised as one by a trigger (e.g.
    ``addresses_protected``: a deletion-protected address)."""


class ExclusionViolation(ConstraintViolation):
    """An exclusion constraint (e.g. overlapping ranges)."""


class ApiError(Z9Error):
    """An error answered to an API client as ``{"error": {"code", "message", "details"}}``.

    ``details`` is always a list of objects (``[]`` when there is nothing more to say): each names
    what it is about — ``field`` (422), ``limit`` (a quota), ``kind``/``id`` (a resource), ``pool``…"""

    status = 400
    code = "bad_request"

    def __init__(self, message: str, *, details: Any = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.details = [] if details is None else details if isinstance(details, list) else [details]
        self.headers = headers or {}  # sent with the answer (WWW-Authenticate, Retry-After, …)
        if code:
            self.code = code


class BadRequest(ApiError):
    status, code = 400, "bad_request"


class Unauthorized(ApiError):
    status, code = 401, "unauthorized"


class Forbidden(ApiError):
    """The token is valid but lacks the scope (or quota) the request needs."""

    status, code = 403, "forbidden"


class TooManyRequests(ApiError):
    status, code = 429, "rate_limited"


class NotFound(ApiError):
    status, code = 404, "not_found"


class Conflict(ApiError):
    status, code = 409, "conflict"


class ValidationFailed(ApiError):
    status, code = 422, "validation_failed"


RESOURCE_DELETING = "resource_deleting"
"""The 409 code of every request a resource's deletion stops (it is ``deleting``, ``destroying``
or ``deleted``), whatever its kind: ``details`` names it. It replaced ``server_deleting``,
``address_deleting``, ``load_balancer_deleting`` and ``cluster_deleting``."""


def deleting(kind: str, rid: str, status: str | None) -> dict[str, Any]:
    """``Conflict(message, **deleting("server", id, status))``: code ``resource_deleting``,
    details ``[{"kind", "id", "status"}]``."""
    return {"code": RESOURCE_DELETING, "details": [{"kind": kind, "id": rid, "status": status}]}


class PoolConfigError(Z9Error):
    """The address pools of the settings cannot be written to the database (two pools of a
    region overlap). Services refuse to start with this message."""
