"""Typed answers of the z9 REST API (``/v1``), for the client.

Request bodies are the API's own models (:class:`z9.api.schemas.ServerCreate`,
:class:`z9.api.tokens.TokenCreate`), so what the client sends is validated by the very rules the
API applies; they live in :mod:`z9.api.bodies`, which imports pydantic only, so the client never
loads the API's server side (aiohttp, asyncpg, the store: tests/unit/test_client_imports.py).
Answers are parsed into the models below; they allow fields they do not know (``extra="allow"``),
so a newer API with more fields does not break an older client.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from z9.api.bodies import ServerCreate, Token, TokenCreate, TokenCreated

__all__ = ["ServerCreate", "Token", "TokenCreate", "TokenCreated", "Step", "JobError", "Job", "JobRef",
           "Observed", "Server", "Address", "LoadBalancer", "Cluster", "Kubeconfig", "Quota", "Accepted", "Page",
           "ResourceKind", "SERVERS", "ADDRESSES", "LOAD_BALANCERS", "CLUSTERS", "TERMINAL"]

TERMINAL = ("succeeded", "failed")


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class Step(_Answer):
    """One step of a job: ``state`` pending, running, done, failed or skipped; ``member`` the
    member of a multi-VM resource it acts on (``lb-1``; None: the resource as a whole); ``detail``
    holds e.g. the UPID waited on."""

    name: str
    member: str | None = None  # the member of a multi-VM resource it acts on (lb-1, cp-0); None: the whole
    state: str
    started_at: datetime | None = None
    finished_at: datetime | None = None
    detail: dict[str, Any] = Field(default_factory=dict)


class JobError(_Answer):
    """Why a job failed or is retrying: ``class_`` (``class`` in JSON) temporary, permanent or
    snooze."""

    class_: str = Field(alias="class")
    message: str
    at: datetime | None = None


class ResourceRef(_Answer):
    type: str
    id: str


class JobRef(_Answer):
    """The ``job`` of a 202 answer."""

    id: str
    kind: str
    status: str


class Job(_Answer):
    id: str
    kind: str
    region: str
    status: str
    attempt: int = 0
    max_attempts: int = 1
    resource: ResourceRef | None = None
    run_after: datetime | None = None
    steps: list[Step] = Field(default_factory=list)
    error: JobError | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    updated_at: datetime | None = None
    actor: str | None = None
    request_id: str | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


class Observed(_Answer):
    vmid: int | None = None
    node: str | None = None
    power_state: str | None = None
    at: datetime | None = None


class Server(_Answer):
    id: str
    name: str
    region: str
    image: str
    cores: int
    memory_mib: int
    disk_gib: int
    ssh_keys: list[str] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    status: str
    status_reason: str | None = None
    observed: Observed = Field(default_factory=Observed)
    delete_after: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    deleted_at: datetime | None = None


class Address(_Answer):
    id: str
    name: str | None = None
    region: str
    pool: str
    family: int
    ip: str
    kind: str
    server_id: str | None = None
    dns_ptr: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    status: str
    status_reason: str | None = None
    delete_after: datetime | None = None
    created_at: datetime | None = None


class LoadBalancer(_Answer):
    """A load balancer (``GET /v1/load-balancers/{id}``): ``services``, ``targets`` (each with its
    ``health_status``), ``members`` (the appliances) and ``public_net.ipv4.ip`` (the VIP)."""

    id: str
    name: str
    region: str
    type: str
    algorithm: str
    labels: dict[str, str] = Field(default_factory=dict)
    public_net: dict[str, Any] = Field(default_factory=dict)
    services: list[dict[str, Any]] = Field(default_factory=list)
    targets: list[dict[str, Any]] = Field(default_factory=list)
    members: list[dict[str, Any]] = Field(default_factory=list)
    config_hash: str | None = None
    health: str | None = None
    status: str
    status_reason: str | None = None
    delete_after: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    deleted_at: datetime | None = None

    @property
    def vip(self) -> str | None:
        return ((self.public_net or {}).get("ipv4") or {}).get("ip")


class Cluster(_Answer):
    """A Kubernetes cluster (``GET /v1/clusters/{id}``)."""

    id: str
    name: str
    region: str
    version: str
    image: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    status: str
    status_reason: str | None = None
    endpoint: dict[str, Any] = Field(default_factory=dict)
    control_plane: dict[str, Any] = Field(default_factory=dict)
    node_pools: list[dict[str, Any]] = Field(default_factory=list)
    members: list[dict[str, Any]] = Field(default_factory=list)
    kubeconfig_available: bool = False
    created_at: datetime | None = None
    updated_at: datetime | None = None
    deleted_at: datetime | None = None


class Kubeconfig(_Answer):
    """``GET /v1/clusters/{id}/kubeconfig``: the YAML, when its client certificate expires, its user."""

    kubeconfig: str
    expires_at: datetime
    user: str


class Quota(_Answer):
    """``GET /v1/quota``: per quota (the units the server's resource types declare: ``servers``, ``cores``, …; the
    document lists them) its ``limit`` (None: no limit) and what the tenant ``used``."""

    tenant: str | None = None
    quotas: dict[str, dict[str, Any]]


T = TypeVar("T")


class PlanDrift(_Answer):
    """One difference a plan found: ``path`` (``config.cores``…), ``want`` (the intent), ``have`` (the world)."""

    path: str
    want: Any = None
    have: Any = None


class PlanStep(_Answer):
    """A step the resource's job would run: ``disruptive`` when it stops, reboots, hot-unplugs or
    re-addresses a guest."""

    name: str
    member: str | None = None
    disruptive: bool
    why: str


class Plan(_Answer):
    """``POST /{plural}/{id}/actions/plan``: the drift and the steps the resource's job would run now
    (nothing changed); ``blocked_by`` the resource's live jobs (the plan is of the world before them)."""

    in_sync: bool
    job_kind: str | None = None
    drift: list[PlanDrift] = Field(default_factory=list)
    steps: list[PlanStep] = Field(default_factory=list)
    blocked_by: list[dict[str, Any]] = Field(default_factory=list)
    waiting: str | None = None  # the job would first wait on the world (a VM locked…): why


@dataclass(frozen=True)
class ResourceKind(Generic[T]):
    """What the client knows of a resource type's REST shape: ``name`` (the JSON key of one, e.g.
    ``load_balancer``), ``plural`` (the path segment, ``load-balancers``; its JSON key has ``_``),
    ``model`` (the answer model), ``buffered`` (two-phase deletion: restorable)."""

    name: str
    plural: str
    model: type[T]
    buffered: bool = True

    @property
    def key(self) -> str:
        """The JSON key of a page of them (``load_balancers``)."""
        return self.plural.replace("-", "_")

    @property
    def label(self) -> str:
        return self.name.replace("_", " ")


SERVERS: ResourceKind[Server] = ResourceKind("server", "servers", Server)
ADDRESSES: ResourceKind[Address] = ResourceKind("address", "addresses", Address)
LOAD_BALANCERS: ResourceKind[LoadBalancer] = ResourceKind("load_balancer", "load-balancers", LoadBalancer)
CLUSTERS: ResourceKind[Cluster] = ResourceKind("cluster", "clusters", Cluster, buffered=False)


class Accepted(_Answer, Generic[T]):
    """A 202: the resource as it is now and the job that will change it. ``key`` is the
    resource's JSON key in the API's answer (``server``, ``load_balancer``, …): :meth:`api_shape`
    gives the answer back as the API sent it (``{"server": …, "job": …}``)."""

    resource: T
    job: JobRef
    key: str = Field("resource", exclude=True)
    # every job the request made, ``job`` first (the API's ``jobs``): what was asked for is in
    # place when all have succeeded (a server with a public IPv4 address: ServerCreate, AddressAssign)
    jobs: list[JobRef] = Field(default_factory=list)

    def api_shape(self) -> dict[str, Any]:
        return {self.key: self.resource, "job": self.job, **({"jobs": self.jobs} if self.jobs else {}),
                **(self.model_extra or {})}

    def job_ids(self) -> list[str]:
        """Every job the request made: ``job``, then those of the ``jobs`` list when the API gives
        one (a create whose work takes more than one job), each once."""
        ids = [self.job.id]
        for j in self.jobs:
            if j.id not in ids:
                ids.append(j.id)
        return ids


class Page(_Answer, Generic[T]):
    """One page of a listing; pass ``next_after`` as ``after`` for the next (None: last page)."""

    items: list[T]
    next_after: str | None = None
