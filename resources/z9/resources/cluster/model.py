"""A Kubernetes cluster's row as a typed object, and its public (API) JSON shape."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from z9.common.models import _ip, _ts, row_of


@dataclass
class Cluster:
    """A row of ``clusters`` (migration 0009). ``control_plane`` is ``{count, cores, memory_mib,
    disk_gib}``; ``node_pools`` ``[{name, count, cores, memory_mib, disk_gib}]``; ``members`` what
    the last converge saw, one dict per member."""

    id: str
    tenant_id: str
    region: str
    name: str
    version: str
    image: str
    control_plane: dict[str, Any]
    node_pools: list[dict[str, Any]]
    endpoint_address_id: str | None
    endpoint_ip: Any
    members: list[dict[str, Any]]
    initialized_at: datetime | None
    status: str
    status_reason: str | None
    status_before_delete: str | None
    delete_after: datetime | None
    observed_at: datetime | None
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None
    labels: dict[str, str] = field(default_factory=dict)  # migration 0011

    @classmethod
    def from_record(cls, r: asyncpg.Record) -> "Cluster":
        return row_of(cls, r)

    def endpoint(self) -> str | None:
        """``https://<ip>:6443`` (the control-plane endpoint), or None."""
        return f"https://{_ip(self.endpoint_ip)}:6443" if self.endpoint_ip is not None else None

    def public(self) -> dict[str, Any]:
        """``GET /v1/clusters/{id}``."""
        members = sorted(self.members or [], key=lambda m: (m.get("role") != "control-plane", m.get("pool") or "",
                                                              int(m.get("ordinal", 0))))
        ready = {m["name"] for m in members if m.get("ready")}

        def pool_view(p: dict[str, Any]) -> dict[str, Any]:
            names = [m["name"] for m in members if m.get("pool") == p["name"]]
            return {**p, "ready": sum(1 for n in names if n in ready)}

        cp_ready = sum(1 for m in members if m.get("role") == "control-plane" and m["name"] in ready)
        return {
            "id": self.id, "name": self.name, "region": self.region, "version": self.version, "image": self.image,
            "labels": dict(self.labels),
            "status": self.status, "status_reason": self.status_reason,
            "endpoint": {"address_id": self.endpoint_address_id,
                         "address": _ip(self.endpoint_ip) if self.endpoint_ip is not None else None,
                         "port": 6443, "url": self.endpoint()},
            "control_plane": {**self.control_plane, "ready": cp_ready},
            "node_pools": [pool_view(p) for p in self.node_pools],
            "members": [{"name": m["name"], "role": m.get("role"), "pool": m.get("pool"), "vmid": m.get("vmid"),
                         "node": m.get("node"), "address": m.get("address"), "power_state": m.get("power_state"),
                         "ready": bool(m.get("ready"))} for m in members],
            "kubeconfig_available": self.initialized_at is not None and self.status not in ("destroying", "deleted"),
            "observed_at": _ts(self.observed_at),
            "created_at": _ts(self.created_at), "updated_at": _ts(self.updated_at), "deleted_at": _ts(self.deleted_at),
        }
