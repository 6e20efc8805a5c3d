"""An address's row as a typed object, and its public (API) JSON shape."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from z9.common.models import _ts, row_of


@dataclass
class Address:
    """A row of ``addresses`` with its pool's name, prefix length and gateway (every address
    query joins them). ``ip`` and ``gateway`` are ``ipaddress`` objects (asyncpg's inet)."""

    id: str
    tenant_id: str
    region: str
    pool_id: str
    pool_name: str
    prefix: int
    gateway: Any
    ip: Any
    family: int
    kind: str
    name: str | None
    dns_ptr: str | None
    protect_delete: bool
    auto_delete: bool
    server_id: str | None
    status: str
    status_reason: str | None
    status_before_delete: str | None
    server_before_delete: str | None
    delete_after: datetime | None
    observed: dict[str, Any] | None
    observed_at: datetime | None
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None
    labels: dict[str, str] = field(default_factory=dict)  # migration 0011

    @classmethod
    def from_record(cls, r: asyncpg.Record) -> "Address":
        return row_of(cls, r)

    @property
    def ip_text(self) -> str:
        """The address without a prefix length (``203.0.113.17``)."""
        return str(getattr(self.ip, "ip", self.ip))

    def ipconfig0(self) -> str:
        """Its Proxmox cloud-init ``ipconfig0`` as a primary address:
        ``ip=<ip>/<prefix>[,gw=<gateway>]`` (``ip6``, ``gw6`` for IPv6)."""
        six = "6" if self.family == 6 else ""
        out = f"ip{six}={self.ip_text}/{self.prefix}"
        if self.gateway is not None:
            out += f",gw{six}={getattr(self.gateway, 'ip', self.gateway)}"
        return out

    def public(self) -> dict[str, Any]:
        """``GET /v1/addresses/{id}``."""
        gw = self.gateway
        return {
            "id": self.id,
            "name": self.name,
            "region": self.region,
            "pool": self.pool_name,
            "family": self.family,
            "ip": self.ip_text,
            "prefix": self.prefix,
            "gateway": str(getattr(gw, "ip", gw)) if gw is not None else None,
            "kind": self.kind,
            "server_id": self.server_id,
            "dns_ptr": self.dns_ptr,
            "protection": {"delete": self.protect_delete},
            "auto_delete": self.auto_delete,
            "labels": dict(self.labels),
            "status": self.status,
            "status_reason": self.status_reason,
            "observed": dict(self.observed, at=_ts(self.observed_at)) if self.observed is not None else None,
            "delete_after": _ts(self.delete_after) if self.status == "deleting" else None,
            "created_at": _ts(self.created_at),
            "updated_at": _ts(self.updated_at),
            "deleted_at": _ts(self.deleted_at),
        }
