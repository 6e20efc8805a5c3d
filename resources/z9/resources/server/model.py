"""A server's row as a typed object, and its public (API) JSON shape."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from z9.common.models import _ts, row_of


@dataclass
class Server:
    """A row of ``servers``."""

    id: str
    tenant_id: str
    region: str
    name: str
    image: str
    cores: int
    memory_mib: int
    disk_gib: int
    ssh_keys: list[str]
    status: str
    status_reason: str | None
    vmid: int | None
    node: str | None
    power_state: str | None
    status_before_delete: str | None
    power_before_delete: str | None
    delete_after: datetime | None
    observed_at: datetime | None
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None
    # its primary IPv4 address (kept on the row by the addresses table: migration 0005)
    primary_ipv4_id: str | None = None
    primary_ipv4: Any = None
    labels: dict[str, str] = field(default_factory=dict)  # migration 0011

    @classmethod
    def from_record(cls, r: asyncpg.Record) -> "Server":
        return row_of(cls, r)

    def public(self) -> dict[str, Any]:
        """``GET /v1/servers/{id}``."""
        return {
            "id": self.id,
            "name": self.name,
            "region": self.region,
            "image": self.image,
            "cores": self.cores,
            "memory_mib": self.memory_mib,
            "disk_gib": self.disk_gib,
            "ssh_keys": list(self.ssh_keys),
            "labels": dict(self.labels),
            "status": self.status,
            "status_reason": self.status_reason,
            "observed": {
                "vmid": self.vmid,
                "node": self.node,
                "power_state": self.power_state,
                "at": _ts(self.observed_at),
            },
            "public_ipv4": {"id": self.primary_ipv4_id, "ip": str(getattr(self.primary_ipv4, "ip", self.primary_ipv4))}
            if self.primary_ipv4_id else None,
            "delete_after": _ts(self.delete_after) if self.status == "deleting" else None,
            "created_at": _ts(self.created_at),
            "updated_at": _ts(self.updated_at),
            "deleted_at": _ts(self.deleted_at),
        }
