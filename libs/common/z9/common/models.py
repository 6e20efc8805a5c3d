"""Rows as typed objects, and their public (API) JSON shapes."""
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
        return cls(**{k: r[k] for k in cls.__dataclass_fields__})

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
            "steps": self.steps,
            "error": self.error,
            "created_at": _ts(self.created_at),
            "started_at": _ts(self.started_at),
            "finished_at": _ts(self.finished_at),
            "updated_at": _ts(self.updated_at),
            "actor": self.actor_token_id,
            "request_id": self.request_id,
        }


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
        return cls(**{k: r[k] for k in cls.__dataclass_fields__ if k != "labels"}, labels=_labels(r))

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
        return cls(**{k: r[k] for k in cls.__dataclass_fields__ if k != "labels"}, labels=_labels(r))

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
        return cls(**{k: r[k] for k in cls.__dataclass_fields__ if k != "labels"}, labels=_labels(r))

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
            default = [{"listen_port": s["listen_port"], "status": "unknown", "reason": "initial"}
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
        return cls(**{k: r[k] for k in cls.__dataclass_fields__ if k != "labels"}, labels=_labels(r))

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


def _ip(v: Any) -> str:
    """An inet value (``IPv4Interface``/``IPv4Address``/str) as a bare IP."""
    return str(getattr(v, "ip", v))
