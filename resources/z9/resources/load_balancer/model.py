"""A load balancer's row as a typed object, its public (API) JSON shape, and a target's key."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from z9.common.models import _ts, row_of


@dataclass
class LoadBalancer:
    """A row of ``load_balancers`` (migration 0008): services, targets and the addresses it was
    given (VIP and one per appliance) are JSON on the row; ``config_hash`` is the sha256 of the
    HAProxy configuration rendered from them (the desired state)."""

    id: str
    tenant_id: str
    region: str
    name: str
    type: str
    algorithm: str
    services: list[dict[str, Any]]
    targets: list[dict[str, Any]]
    addresses: dict[str, Any]
    config_hash: str | None
    config_version: int
    status: str
    status_reason: str | None
    status_before_delete: str | None
    delete_after: datetime | None
    health: str
    health_detail: dict[str, Any] | None
    health_at: datetime | None
    observed: dict[str, Any] | None
    observed_at: datetime | None
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None
    labels: dict[str, str] = field(default_factory=dict)  # migration 0011

    @classmethod
    def from_record(cls, r: asyncpg.Record) -> "LoadBalancer":
        return row_of(cls, r)

    @property
    def members(self) -> tuple[str, ...]:
        """The appliance members: ``lb-0`` (and ``lb-1`` for ``lb-ha``)."""
        return ("lb-0", "lb-1") if self.type == "lb-ha" else ("lb-0",)

    def public(self) -> dict[str, Any]:
        """``GET /v1/load-balancers/{id}``: health per target and listen port from the last
        verify/observe (``unknown``/``initial`` until then)."""
        detail = (self.health_detail or {}).get("targets", {})
        targets = []
        for t in self.targets:
            key = target_key(t)
            default = [{"listen_port": s["listen_port"], "status": "unknown", "reason": "initial", "detail": None}
                       for s in self.services]
            seen = {h["listen_port"]: h for h in detail.get(key, [])}
            health = [seen.get(d["listen_port"], d) for d in default]
            targets.append({"type": t["type"], "server_id": t.get("server_id"), "ip": t.get("ip"),
                            "health_status": health})
        vip = self.addresses.get("vip") or {}
        return {
            "id": self.id,
            "name": self.name,
            "region": self.region,
            "type": self.type,
            "algorithm": self.algorithm,
            "labels": dict(self.labels),
            "public_net": {"ipv4": {"ip": vip.get("ip"), "address_id": vip.get("id")}},
            "services": [dict(s) for s in self.services],
            "targets": targets,
            "members": [
                {"name": m, "ip": (self.addresses.get(m) or {}).get("ip"),
                 **{k: ((self.observed or {}).get("members", {}).get(m) or {}).get(k)
                    for k in ("vmid", "node", "running", "config_hash", "holds_vip")}}
                for m in self.members],
            "config_hash": self.config_hash,
            # lb-ha: the appliances run on different nodes (false: a node failure takes both)
            "spread": (self.observed or {}).get("spread"),
            "health": self.health,
            "health_at": _ts(self.health_at),
            "status": self.status,
            "status_reason": self.status_reason,
            "delete_after": _ts(self.delete_after) if self.status == "deleting" else None,
            "created_at": _ts(self.created_at),
            "updated_at": _ts(self.updated_at),
            "deleted_at": _ts(self.deleted_at),
        }


def target_key(t: dict[str, Any]) -> str:
    """A target's stable key: ``server:<id>`` or ``ip:<ip>`` (HAProxy server names, health keys)."""
    return f"server:{t['server_id']}" if t.get("type") == "server" else f"ip:{t['ip']}"
