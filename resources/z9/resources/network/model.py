"""A network's row as a typed object, its public (API) JSON shape, and a member's."""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from z9.common.models import _ts, row_of


@dataclass(frozen=True)
class Network:
    """A row of ``networks``."""

    id: str
    tenant_id: str
    region: str
    name: str
    ip_range: Any  # ipaddress.IPv4Network (asyncpg's cidr)
    vni: int
    vnet: str
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

    @classmethod
    def from_record(cls, r: Any) -> Network:
        return row_of(cls, r)

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(str(self.ip_range))

    def public(self) -> dict[str, Any]:
        """``GET /v1/networks/{id}``."""
        obs = dict(self.observed) if self.observed else None
        if obs is not None:
            obs["at"] = _ts(self.observed_at)
        return {
            "id": self.id, "name": self.name, "region": self.region, "ip_range": str(self.network),
            "labels": dict(self.labels), "status": self.status, "status_reason": self.status_reason,
            "vnet": self.vnet, "observed": obs, "delete_after": _ts(self.delete_after),
            "created_at": _ts(self.created_at), "updated_at": _ts(self.updated_at), "deleted_at": _ts(self.deleted_at),
        }


@dataclass(frozen=True)
class Member:
    """A row of ``network_members``: a server's NIC on a network, with its address there."""

    network_id: str
    server_id: str
    tenant_id: str
    ip: Any
    nic: str
    state: str
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_record(cls, r: Any) -> Member:
        return cls(**{k: r[k] for k in cls.__dataclass_fields__})

    @property
    def address(self) -> str:
        return str(ipaddress.ip_interface(str(self.ip)).ip)

    def public(self) -> dict[str, Any]:
        return {"network_id": self.network_id, "server_id": self.server_id, "ip": self.address, "nic": self.nic,
                "state": self.state}


def vnet_id(vni: int) -> str:
    """The VNet's id z9 mints from the network's VXLAN id (tag) — ``z9`` and the tag in hex, as
    ``network_insert`` writes it: at most 8 characters (pve-network VnetPlugin.pm ``pve-sdn-vnet-id``:
    ``maxLength 8``, a letter first; tags ≤ 16777215 = ``ffffff``), unique in the region as the tag is
    (the ``network_vni_live`` index)."""
    return f"z9{int(vni):x}"
