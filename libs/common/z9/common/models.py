"""The job row as a typed object and its public (API) JSON shape, and the helpers every type's row model
uses (``_labels``, ``_ts``); each type's own row model is in its slice (``z9.resources.<type>.model``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import asyncpg



def _labels(r: Any) -> dict[str, str]:
    """A row's labels (migration 0011); ``{}`` for a query that does not select them."""
    try:
        return dict(r["labels"] or {})
    except KeyError:
        return {}


def row_of(cls: Any, r: Any) -> Any:
    """A resource row model (a dataclass whose fields are the table's columns, ``labels`` among
    them) built from its record: every resource type's ``from_record``."""
    return cls(**{k: r[k] for k in cls.__dataclass_fields__ if k != "labels"}, labels=_labels(r))


def _ts(v: datetime | None) -> str | None:
    return v.isoformat().replace("+00:00", "Z") if v else None


def utc_now_iso() -> str:
    """Now, as the API writes times: ISO 8601 in UTC with a ``Z``."""
    return _ts(datetime.now(timezone.utc))  # type: ignore[return-value]


@dataclass
class Job:
    """A row of ``jobs``. ``steps`` is ``[{name, state, started_at, finished_at, detail}]``;
    ``error`` is ``{class, message, at}`` or None; ``memo`` holds what an attempt told the world
    (for example the vmid and UPID of a clone) so a later attempt can find it again."""

    id: str
    seq: int
    kind: str
    region: str
    tenant_id: str | None
    resource_type: str | None
    resource_id: str | None
    args: dict[str, Any]
    status: str
    attempt: int
    max_attempts: int
    run_after: datetime
    lease_owner: str | None
    lease_expires_at: datetime | None
    steps: list[dict[str, Any]]
    memo: dict[str, Any]
    error: dict[str, Any] | None
    trace_context: dict[str, Any] | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    extra_lock_keys: list[str] = field(default_factory=list)  # locked besides resource_id
    actor_token_id: str | None = None  # the API token that asked for it (None: z9 itself)
    request_id: str | None = None  # that request's X-Request-Id

    @classmethod
    def from_record(cls, r: asyncpg.Record) -> "Job":
        # positionally, in the fields' order (the executor makes one per claimed job)
        return cls(*map(r.__getitem__, _JOB_FIELDS))

    def brief(self) -> dict[str, Any]:
        """The ``job`` object of a 202 answer: id, kind, status."""
        return {"id": self.id, "kind": self.kind, "status": self.status}

    def public(self) -> dict[str, Any]:
        """``GET /v1/jobs/{id}``."""
        return {
            "id": self.id,
            "kind": self.kind,
            "region": self.region,
            "resource": {"type": self.resource_type, "id": self.resource_id}
            if self.resource_id
            else None,
            "status": self.status,
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            "run_after": _ts(self.run_after) if self.status in ("pending", "retry") else None,
            "steps": public_steps(self.steps),
            "error": self.error,
            "created_at": _ts(self.created_at),
            "started_at": _ts(self.started_at),
            "finished_at": _ts(self.finished_at),
            "updated_at": _ts(self.updated_at),
            "actor": self.actor_token_id,
            "request_id": self.request_id,
        }


_JOB_FIELDS: tuple[str, ...] = tuple(Job.__dataclass_fields__)
"""Job's fields in declaration order: the order of its ``__init__``'s parameters."""


def public_steps(steps: Any) -> list[dict[str, Any]]:
    """A job's steps as the API shows them: each with ``member`` (the member of a multi-VM
    resource it acts on, from its ``detail``; null for the resource as a whole) — rows written
    before steps carried it get it here too."""
    out = []
    for s in steps or []:
        member = s.get("member", (s.get("detail") or {}).get("member"))
        out.append({**s, "member": member if isinstance(member, str) else None})
    return out


def _ip(v: Any) -> str:
    """An inet value (``IPv4Interface``/``IPv4Address``/str) as a bare IP."""
    return str(getattr(v, "ip", v))
