"""A firewall's row and its members' rows as typed objects, and the firewall's public (API) JSON shape."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from z9.common.models import _ts


@dataclass(frozen=True)
class Member:
    """A row of ``firewall_members``: a server the firewall applies to, how (``via``), and where its rules
    stand on that server's VM (``state`` pending|applied|removing; ``enforced``: the datacenter firewall,
    the VM's and its NIC's switches on when last seen)."""

    firewall_id: str
    server_id: str
    via: str
    state: str
    generation: int | None
    enforced: bool | None
    detail: str | None
    applied_at: datetime | None
    updated_at: datetime

    @classmethod
    def from_record(cls, r: Any) -> Member:
        return cls(**{k: r[k] for k in cls.__dataclass_fields__})

    def public(self) -> dict[str, Any]:
        return {"server_id": self.server_id, "via": self.via, "status": self.state, "enforced": self.enforced,
                "detail": self.detail, "applied_at": _ts(self.applied_at)}


@dataclass(frozen=True)
class Firewall:
    """A row of ``firewalls`` (``members``: its member rows, when read with them)."""

    id: str
    tenant_id: str
    region: str
    name: str
    rules: list[dict[str, Any]]
    applied_to: list[dict[str, Any]]
    generation: int
    status: str
    status_reason: str | None
    status_before_delete: str | None
    delete_after: datetime | None
    observed: dict[str, Any] | None
    observed_at: datetime | None
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None
    labels: dict[str, str] = field(default_factory=dict)
    members: tuple[Member, ...] | None = None

    @classmethod
    def from_record(cls, r: Any) -> Firewall:
        return cls(**{k: r[k] for k in cls.__dataclass_fields__ if k not in ("labels", "members")},
                   labels=dict(r["labels"] or {}))

    def public(self) -> dict[str, Any]:
        """``GET /v1/firewalls/{id}``: ``applied_to`` as asked, each selector with the servers it resolved to;
        ``members`` each with its status (DigitalOcean's ``pending_changes``, per server)."""
        members = list(self.members or ())
        applied = []
        for a in self.applied_to:
            if a.get("label_selector") is not None:
                applied.append({"type": "label_selector", "server_id": None, "label_selector": a["label_selector"],
                                "applied_to_resources": [
                                    m.server_id for m in members
                                    if m.via == "label_selector" and m.state != "removing"]})
            else:
                applied.append({"type": "server", "server_id": a["server_id"], "label_selector": None,
                                "applied_to_resources": None})
        return {
            "id": self.id, "name": self.name, "region": self.region, "labels": dict(self.labels),
            "rules": [public_rule(r) for r in self.rules], "applied_to": applied,
            "members": [m.public() for m in members],
            "status": self.status, "status_reason": self.status_reason,
            "created_at": _ts(self.created_at), "updated_at": _ts(self.updated_at), "deleted_at": _ts(self.deleted_at),
        }


def public_rule(r: dict[str, Any]) -> dict[str, Any]:
    """A stored rule in its full public shape (every field, empty lists and nulls included)."""
    return {"direction": r["direction"], "protocol": r["protocol"], "port": r.get("port"),
            "source_ips": list(r.get("source_ips") or []), "destination_ips": list(r.get("destination_ips") or []),
            "source_firewalls": list(r.get("source_firewalls") or []),
            "destination_firewalls": list(r.get("destination_firewalls") or []), "description": r.get("description")}
