"""The ``load_balancer`` type's API registration (issue 10): the create hook (the row, its VIP and
one address per appliance from the region's pool, and its LoadBalancerCreate job, in one
transaction) and the actions — ``add-target``, ``remove-target``, ``add-service``,
``update-service``, ``delete-service``, ``change-algorithm`` (kebab-case like every action path; the
snake_case paths they had are deprecated aliases for one release) — each changing the row and enqueuing a
LoadBalancerConfigure in one transaction (202). List, get, delete (two-phase: appliances stopped,
addresses kept) and cancel-deletion (appliances started again) are the generic ones.

409 codes (Hetzner's where the meaning is the same): ``target_already_defined``,
``target_not_found``, ``source_port_already_used``, ``service_not_found``, ``server_deleting``,
``region_mismatch``, ``missing_ipv4``, ``load_balancer_deleting``, ``pool_exhausted``,
``uniqueness_error``; each message names the precondition. ``PATCH`` renames a load balancer or
replaces its labels (database only, no job).

What an ``ip`` target may reach (platform networks, other tenants' and load balancers' addresses,
the pools' networks, private ranges: 422 naming the rule in ``details[].rule``) is decided by
:func:`z9.resources.load_balancer.ip_target_refusal`, here at every action and create and
again by the executor at every configure. A load balancer's size is bounded by the installation:
``Z9_LB_MAX_TARGET_SERVICES`` and ``Z9_LB_MAX_CHECKS_PER_S`` (409 ``resource_limit_exceeded``).

Quotas: the VIP and each appliance's address are addresses of the tenant (rows of ``addresses``
from the region's pool, counted by the ``addresses`` quota like any other): the create checks
``1 + appliances`` against it (403 ``quota_exceeded``). The appliance VMs are not the tenant's
servers: they count against neither ``servers``, ``cores`` nor ``memory_mib``.
"""
from __future__ import annotations

import ipaddress
from typing import Annotated, Any, Literal

from aiohttp import web
from pydantic import (BaseModel, ValidationError, ConfigDict, Field, StrictBool, StrictInt, StrictStr, WithJsonSchema,
                      field_validator, model_validator)

from z9.common import store
from z9.common.errors import Conflict, NotFound, UniqueViolation, ValidationFailed, deleting
from z9.common.ids import new_id
from z9.resources.load_balancer.model import LoadBalancer, target_key
from z9.resources.load_balancer import LOAD_BALANCER, RULE_TEXT, ip_target_refusal, target_networks
from z9.common.settings import Settings

from z9.api import quotas, schemas
from z9.resources.address.api import exhausted, pick_pool
from z9.api.resources import (POOL, ApiResource, action_transaction, CreateContext, Operation, dump, parse_body, path_id, tenant, validation_error)
from z9.resources.address import store as address_store
from z9.resources.load_balancer import store as load_balancer_store
from z9.resources.server import store as server_store
from z9.resources.load_balancer import LOAD_BALANCER_CONFIGURE, LOAD_BALANCER_CREATE

SERVER_ID = r"^srv_[0-9a-z]{26}$"
MAX_TARGETS = 500
MAX_SERVICES = 16
STATUS_CODE = r"^[1-5][0-9?]{2}$"
APPLIANCES = {"lb-small": 1, "lb-ha": 2}
THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")


class HttpCheck(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # RFC 3986 path and query characters only: HAProxy's config parser reads ``"``, ``'`` and ``\``
    # as quoting and ``#`` as a comment, so those would make the rendered file fail ``haproxy -c``
    # (the load balancer failed) or silently check another path
    path: StrictStr = Field("/", pattern=r"^/[A-Za-z0-9._~!$&()*+,;=:@%/?-]{0,255}$", description="request path")
    status_codes: list[Annotated[StrictStr, Field(pattern=STATUS_CODE)]] = Field(default_factory=lambda: ["2??", "3??"], min_length=1, max_length=8,
                                          description="expected status codes; ? matches any digit")

    @field_validator("status_codes")
    @classmethod
    def _codes(cls, v: list[str]) -> list[str]:
        import re
        for c in v:
            if not re.match(STATUS_CODE, c):
                raise ValueError(f"status code {c!r}: three characters, digits or ?, starting 1-5")
        return v


class _CheckTiming(BaseModel):
    model_config = ConfigDict(extra="forbid")
    port: StrictInt = Field(ge=1, le=65535)
    interval_s: StrictInt = Field(15, ge=3, le=300)
    timeout_s: StrictInt = Field(10, ge=1, le=300)
    retries: StrictInt = Field(3, ge=1, le=10)


class TcpHealthCheck(_CheckTiming):
    """A TCP health check (a connect): ``protocol`` tcp or left out, no ``http``."""
    protocol: Literal["tcp"] = "tcp"
    http: None = None


class HttpHealthCheck(_CheckTiming):
    """An HTTP health check: ``protocol`` http and the request to make."""
    protocol: Literal["http"]
    http: HttpCheck | None = None


def _one_of(*models: type[BaseModel], discriminator: str | None = None) -> Any:
    """``__get_pydantic_json_schema__`` of a model that validates itself (its own rules, its own
    messages) but is documented as a ``oneOf`` of its shapes, each a named schema: what code
    generators read (a top-level ``anyOf`` beside ``properties`` becomes branch-only models with
    untyped fields). ``discriminator``: the field that selects the shape (its values: each
    model's ``Literal``)."""
    def schema(cls: type[BaseModel], core_schema: Any, handler: Any) -> dict[str, Any]:
        # each shape through the generator itself (not this model's handler chain): a named
        # definition and a $ref to it, like any field of that model's type
        refs = [handler.generate_json_schema.generate_inner(m.__pydantic_core_schema__) for m in models]
        # without a discriminator, anyOf: a shape told apart by an optional field's const is
        # exclusive, but linters (Redocly's no-illogical-composition-keywords) cannot see it
        out: dict[str, Any] = {"title": cls.__name__, ("oneOf" if discriminator else "anyOf"): refs}
        if cls.__doc__:
            out["description"] = cls.__doc__.strip()
        if discriminator is not None:
            out["discriminator"] = {"propertyName": discriminator, "mapping": {
                m.model_fields[discriminator].annotation.__args__[0]: r["$ref"] for m, r in zip(models, refs)}}
        return out
    return classmethod(schema)


class HealthCheck(BaseModel):
    """A health check: a TCP connect, or an HTTP request (``http`` only with protocol http)."""
    # documented as TcpHealthCheck | HttpHealthCheck; timeout_s <= interval_s is the API's alone
    model_config = ConfigDict(extra="forbid")
    __get_pydantic_json_schema__ = _one_of(TcpHealthCheck, HttpHealthCheck)
    protocol: Literal["tcp", "http"] = "tcp"
    port: StrictInt = Field(ge=1, le=65535)
    interval_s: StrictInt = Field(15, ge=3, le=300)
    timeout_s: StrictInt = Field(10, ge=1, le=300)
    retries: StrictInt = Field(3, ge=1, le=10)
    http: HttpCheck | None = None

    @model_validator(mode="after")
    def _shape(self) -> "HealthCheck":
        if self.timeout_s > self.interval_s:
            raise ValueError("timeout_s must not exceed interval_s")
        if self.protocol == "http" and self.http is None:
            self.http = HttpCheck()
        if self.protocol == "tcp" and self.http is not None:
            raise ValueError("http is only for protocol http")
        return self


class Service(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"protocol": "tcp", "listen_port": 80, "destination_port": 8080, "proxyprotocol": False,
         "health_check": {"protocol": "tcp", "port": 8080, "interval_s": 15, "timeout_s": 10, "retries": 3}}]})
    protocol: Literal["tcp", "http"]
    listen_port: StrictInt = Field(ge=1, le=65535)
    destination_port: StrictInt = Field(ge=1, le=65535)
    proxyprotocol: StrictBool = False
    health_check: HealthCheck | None = None

    def normalized(self) -> dict[str, Any]:
        hc = self.health_check or HealthCheck(port=self.destination_port)
        return {"protocol": self.protocol, "listen_port": self.listen_port, "destination_port": self.destination_port,
                "proxyprotocol": self.proxyprotocol, "health_check": hc.model_dump()}


# what Target's validator accepts as an ip target's address: IPv4, not 0.0.0.0, loopback or multicast
# not 0/8, loopback, link-local (169.254/16), multicast (224/4), reserved (240/4) or broadcast
_TARGET_IP = {"type": "string", "format": "ipv4", "not": {"pattern": r"^(0\.|127\.|169\.254\.|2(2[4-9]|[3-5][0-9])\.)"}}


class ServerTarget(BaseModel):
    """A server of the load balancer's region, balanced to at its primary address."""
    model_config = ConfigDict(extra="forbid")
    type: Literal["server"]
    server_id: StrictStr = Field(pattern=SERVER_ID)
    ip: None = None


class IpTarget(BaseModel):
    """An IPv4 address (not 0/8, loopback, link-local, multicast or reserved)."""
    model_config = ConfigDict(extra="forbid")
    type: Literal["ip"]
    ip: Annotated[StrictStr, WithJsonSchema(_TARGET_IP)]
    server_id: None = None


class Target(BaseModel):
    """A target: a server (``type`` server, ``server_id``) or an IP (``type`` ip, ``ip``)."""
    # documented as ServerTarget | IpTarget, discriminated by type; validated here (one message each)
    model_config = ConfigDict(extra="forbid")
    __get_pydantic_json_schema__ = _one_of(ServerTarget, IpTarget, discriminator="type")
    type: Literal["server", "ip"]
    server_id: StrictStr | None = Field(None, pattern=SERVER_ID)
    ip: StrictStr | None = None

    @model_validator(mode="after")
    def _shape(self) -> "Target":
        if self.type == "server":
            if self.server_id is None or self.ip is not None:
                raise ValueError("a server target has server_id (and no ip)")
        else:
            if self.ip is None or self.server_id is not None:
                raise ValueError("an ip target has ip (and no server_id)")
            try:
                addr = ipaddress.ip_address(self.ip)
            except ValueError:
                raise ValueError(f"ip: {self.ip!r} is not an IP address") from None
            if addr.version != 4 or addr.is_multicast or addr.is_loopback or addr.is_link_local \
                    or addr.is_reserved or addr in THIS_NETWORK:
                # link-local (169.254/16: the guests' metadata address), 0/8, 240/4 and the
                # broadcast address are not a host the appliances can balance to
                raise ValueError(f"ip: {self.ip} is not a usable IPv4 unicast address")
            self.ip = str(addr)
        return self

    def normalized(self) -> dict[str, Any]:
        return {"type": "server", "server_id": self.server_id} if self.type == "server" \
            else {"type": "ip", "ip": self.ip}


class LoadBalancerCreate(BaseModel):
    """``POST /v1/load-balancers``."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{
        "name": "web", "region": "dev-1", "type": "lb-small", "algorithm": "round_robin",
        "services": [{"protocol": "tcp", "listen_port": 80, "destination_port": 8080,
                      "health_check": {"protocol": "tcp", "port": 8080, "interval_s": 15, "timeout_s": 10,
                                       "retries": 3}}],
        "targets": [{"type": "ip", "ip": "198.51.100.200"}]}]})

    name: StrictStr = Field(pattern=schemas.NAME_PATTERN)
    region: StrictStr = Field(min_length=1, max_length=63)
    type: Literal["lb-small", "lb-ha"] = "lb-small"
    algorithm: Literal["round_robin", "least_connections"] = "round_robin"
    address_pool: StrictStr | None = Field(None, pattern=r"^[a-z0-9][a-z0-9-]{0,62}$",
                                           description="pool of the VIP and appliance addresses (default public)")
    labels: schemas.Labels = Field(default_factory=dict)
    services: list[Service] = Field(default_factory=list, max_length=MAX_SERVICES)
    targets: list[Target] = Field(default_factory=list, max_length=MAX_TARGETS)

    @model_validator(mode="after")
    def _unique(self) -> "LoadBalancerCreate":
        ports = [s.listen_port for s in self.services]
        if len(ports) != len(set(ports)):
            raise ValueError("services: two services listen on the same port")
        keys = [target_key(t.normalized()) for t in self.targets]
        if len(keys) != len(set(keys)):
            raise ValueError("targets: a target is listed twice")
        return self


class ServiceOut(schemas.Response):
    protocol: Literal["tcp", "http"]
    listen_port: int
    destination_port: int
    proxyprotocol: bool
    health_check: dict[str, Any]


class TargetHealth(schemas.Response):
    listen_port: int
    status: Literal["healthy", "unhealthy", "unknown", "unused", "refused"]
    reason: str = Field(description="initial, connect_failed, timeout, response_code_mismatch, server_stopped, "
                                    "server_deleted, no_address, no_appliance, firewall (the target server's VM "
                                    "firewall drops the appliance: see detail), ...; for refused (an ip target the "
                                    "last configure left out of the config) the rule: platform_network, "
                                    "another_tenant, load_balancer_address, address_pool, private_range")
    detail: str | None = Field(None, description="for reason firewall: which rule or policy of which VM drops "
                                                 "the appliance's connections")


class TargetOut(schemas.Response):
    type: Literal["server", "ip"]
    server_id: str | None
    ip: str | None
    health_status: list[TargetHealth]


class LoadBalancerMember(schemas.Response):
    """One appliance VM of a load balancer."""

    name: str
    ip: str | None
    vmid: int | None
    node: str | None
    running: bool | None
    config_hash: str | None
    holds_vip: bool | None


class LoadBalancerOut(schemas.Response):
    """A load balancer (``GET /v1/load-balancers/{id}``)."""

    id: str = Field(pattern=r"^lb_[0-9a-z]{26}$")
    name: str
    region: str
    type: Literal["lb-small", "lb-ha"]
    algorithm: Literal["round_robin", "least_connections"]
    labels: dict[str, str]
    public_net: dict[str, Any]
    services: list[ServiceOut]
    targets: list[TargetOut]
    members: list[LoadBalancerMember]
    config_hash: str | None = Field(description="sha256 of the HAProxy config every appliance was verified to run")
    spread: bool | None = Field(description="the appliances run on different nodes (lb-ha); null: not observed yet")
    health: Literal["healthy", "degraded", "unhealthy", "unknown"]
    health_at: schemas.OptTimestamp
    status: Literal["creating", "active", "deleting", "destroying", "deleted", "failed"]
    status_reason: str | None
    delete_after: schemas.OptTimestamp
    created_at: schemas.Timestamp
    updated_at: schemas.Timestamp
    deleted_at: schemas.OptTimestamp


EXAMPLE: dict[str, Any] = {
    "id": "lb_01jd3x5v8q2m6n4p7r9s1t3w5y", "name": "web", "region": "dev-1", "type": "lb-small",
    "algorithm": "round_robin", "labels": {}, "public_net": {"ipv4": {"ip": "203.0.113.10", "address_id": "adr_01jd3x5v8q2m6n4p7r9s1t3w5y"}},
    "services": [{"protocol": "tcp", "listen_port": 80, "destination_port": 8080, "proxyprotocol": False,
                  "health_check": {"protocol": "tcp", "port": 8080, "interval_s": 15, "timeout_s": 10, "retries": 3,
                                   "http": None}}],
    "targets": [{"type": "ip", "server_id": None, "ip": "198.51.100.200",
                 "health_status": [{"listen_port": 80, "status": "unknown", "reason": "initial", "detail": None}]}],
    "members": [{"name": "lb-0", "ip": "203.0.113.11", "vmid": None, "node": None, "running": None,
                 "config_hash": None, "holds_vip": None}], "config_hash": None, "spread": None, "health": "unknown",
    "health_at": None, "status": "creating", "status_reason": None, "delete_after": None,
    "created_at": "2026-12-01T04:00:00Z", "updated_at": "2026-12-01T04:00:00Z", "deleted_at": None,
}


# ---------------------------------------------------------------------------------- checks

async def _check_server_targets(conn: Any, tenant_id: str, region: str, targets: list[dict[str, Any]]) -> None:
    """Every server target is the tenant's, in the region, not being deleted, and has an IPv4
    address the appliances can reach (its primary)."""
    for t in targets:
        if t["type"] != "server":
            continue
        server = await server_store.server_get(conn, t["server_id"], tenant_id)
        if server is None:
            raise ValidationFailed(f"targets: no server {t['server_id']!r}",
                                   details=[{"field": "targets", "message": "unknown server"}])
        if server.region != region:
            raise Conflict(f"server {server.id} is in region {server.region}, the load balancer in {region}: "
                           "targets must be in the load balancer's region", code="region_mismatch")
        if server.status in ("deleting", "destroying", "deleted"):
            raise Conflict(f"server {server.id} is {server.status}; it cannot become a target",
                           **deleting("server", server.id, server.status))
        if server.primary_ipv4_id is None:
            raise Conflict(f"server {server.id} has no public IPv4 address for the appliances to reach; create it "
                           "with public_ipv4: true or assign it a primary address", code="missing_ipv4")


async def _check_ip_targets(conn: Any, tenant_id: str, region: str, targets: list[dict[str, Any]],
                            settings: Settings) -> None:
    """Every ip target is one the region lets a load balancer reach (the rules, in order, are in
    :mod:`z9.resources.load_balancer`: platform networks, another tenant's address, a load
    balancer's address, the pools' networks, private ranges): else 422 naming the rule."""
    ips = [t["ip"] for t in targets if t["type"] == "ip"]
    if not ips:
        return
    holders = await address_store.address_ip_holders(conn, ips)
    nets = target_networks(settings.regions, region)
    for ip in ips:
        rule = ip_target_refusal(ip, tenant_id, holders.get(ip), **nets)
        if rule is not None:
            raise ValidationFailed(f"ip: {ip} {RULE_TEXT[rule]} (rule {rule}); a target is one of your servers "
                                   "(type server), one of your addresses, or a public host outside the cloud",
                                   details=[{"field": "ip", "message": RULE_TEXT[rule], "rule": rule}])


def _check_size(settings: Settings, lb_id: str | None, services: list[dict[str, Any]],
                targets: list[dict[str, Any]]) -> None:
    """A load balancer's load on the shared hypervisor, bounded: targets × services (HAProxy
    server lines and health checks) and health checks per second per appliance."""
    what = f"load balancer {lb_id}" if lb_id else "the load balancer"
    pairs = len(services) * len(targets)
    if pairs > settings.lb_max_target_services:
        raise Conflict(f"{what} would have {len(targets)} targets × {len(services)} services = {pairs}, more than "
                       f"Z9_LB_MAX_TARGET_SERVICES ({settings.lb_max_target_services})", code="resource_limit_exceeded",
                       details=[{"limit": "lb_max_target_services", "max": settings.lb_max_target_services,
                                 "value": pairs}])
    rate = sum(len(targets) / float((s.get("health_check") or {}).get("interval_s") or 15) for s in services)
    if rate > settings.lb_max_checks_per_s + 1e-9:
        raise Conflict(f"{what} would make {rate:.1f} health checks per second per appliance, more than "
                       f"Z9_LB_MAX_CHECKS_PER_S ({settings.lb_max_checks_per_s:g}): fewer targets or services, or a "
                       "longer interval_s", code="resource_limit_exceeded",
                       details=[{"limit": "lb_max_checks_per_s", "max": settings.lb_max_checks_per_s,
                                 "value": round(rate, 3)}])


def _check_not_own_address(lb: LoadBalancer, targets: list[dict[str, Any]]) -> None:
    """An ip target is not the load balancer's own VIP or an appliance's address (HAProxy would
    send the traffic back to itself)."""
    own = {a["ip"] for k, a in (lb.addresses or {}).items() if isinstance(a, dict) and a.get("ip")}
    for t in targets:
        if t["type"] == "ip" and t["ip"] in own:
            raise ValidationFailed(f"ip: {t['ip']} is an address of load balancer {lb.id} itself (its VIP or an "
                                   "appliance's); a target must be another host",
                                   details=[{"field": "ip", "message": "the load balancer's own address"}])


# ---------------------------------------------------------------------------------- create

async def create(ctx: CreateContext, spec: LoadBalancerCreate) -> tuple[LoadBalancer, dict[str, Any]]:
    """The row, the VIP and one address per appliance (the region's pool, lowest free IPs) and
    the LoadBalancerCreate job, in the request's transaction."""
    services = [s.normalized() for s in spec.services]
    targets = [t.normalized() for t in spec.targets]
    await _check_server_targets(ctx.conn, ctx.tenant_id, spec.region, targets)
    await _check_ip_targets(ctx.conn, ctx.tenant_id, spec.region, targets, ctx.settings)
    _check_size(ctx.settings, None, services, targets)
    pool = await pick_pool(ctx.conn, ctx.settings, spec.region, 4, spec.address_pool)
    # the VIP and one address per appliance are the tenant's addresses (see the module's doc)
    await quotas.check(ctx.conn, ctx.settings, ctx.tenant_id, addresses=1 + APPLIANCES[spec.type], load_balancers=1)
    lb_id = new_id("lb")
    try:
        lb = await load_balancer_store.lb_insert(ctx.conn, lb_id=lb_id, tenant_id=ctx.tenant_id, region=spec.region,
                                   name=spec.name, type=spec.type, algorithm=spec.algorithm, services=services,
                                   targets=targets, labels=spec.labels)
    except UniqueViolation as e:
        if e.constraint == "load_balancers_tenant_name_live":
            raise Conflict(f"a load balancer named {spec.name!r} already exists in this tenant",
                           code="uniqueness_error") from e
        raise
    # the VIP and one address per appliance count against the tenant's address quota (as the
    # usage counts them), checked before they are allocated
    await quotas.check(ctx.conn, ctx.settings, ctx.tenant_id, addresses=1 + len(lb.members))
    addresses: dict[str, Any] = {}
    for member in (None, *lb.members):
        adr = await load_balancer_store.lb_address_allocate(ctx.conn, pool_id=pool["id"], lb_id=lb.id, member=member,
                                              tenant_id=ctx.tenant_id)
        if adr is None:
            raise exhausted(pool)
        gw = adr.gateway
        addresses[member or "vip"] = {"id": adr.id, "ip": adr.ip_text, "prefix": adr.prefix,
                                      "gateway": str(getattr(gw, "ip", gw)) if gw is not None else None}
    addresses["nameservers"] = ctx.settings.regions[lb.region].guest_nameservers(
        await address_store.address_pool_nameservers(ctx.conn, pool["id"]))
    lb = await load_balancer_store.lb_set_addresses(ctx.conn, lb.id, addresses)
    _check_not_own_address(lb, targets)
    job = await store.job_insert(ctx.conn, LOAD_BALANCER.new_job(lb, LOAD_BALANCER_CREATE,
                                                                 max_attempts=ctx.settings.max_attempts),
                                 notify=False)
    return lb, job.brief()


# ---------------------------------------------------------------------------------- actions

class TargetBody(Target):
    """``add-target``/``remove-target``: a server target or an ip target."""
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"type": "server", "server_id": "srv_01jd3x5v8q2m6n4p7r9s1t3w5y"}]})


class ServiceBody(Service):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"protocol": "tcp", "listen_port": 443, "destination_port": 8443}]})


def _left_out(schema: dict[str, Any]) -> None:
    """A field that may be left out (unchanged) but is never null: no ``default: null`` in the
    document (it would not validate against the field's own schema)."""
    schema.pop("default", None)


class HealthCheckChange(BaseModel):
    """``update_service``'s ``health_check``: only the fields given change (Hetzner's semantics);
    the merged check must still satisfy every rule of a health check."""
    model_config = ConfigDict(extra="forbid")
    # left out: unchanged; never null (the document has no null type for them)
    protocol: Literal["tcp", "http"] = Field(None, json_schema_extra=_left_out)  # type: ignore[assignment]
    port: StrictInt = Field(None, ge=1, le=65535, json_schema_extra=_left_out)  # type: ignore[assignment]
    interval_s: StrictInt = Field(None, ge=3, le=300, json_schema_extra=_left_out)  # type: ignore[assignment]
    timeout_s: StrictInt = Field(None, ge=1, le=300, json_schema_extra=_left_out)  # type: ignore[assignment]
    retries: StrictInt = Field(None, ge=1, le=10, json_schema_extra=_left_out)  # type: ignore[assignment]
    http: HttpCheck | None = None

    @field_validator("protocol", "port", "interval_s", "timeout_s", "retries", mode="before")
    @classmethod
    def _no_null(cls, v: Any) -> Any:
        if v is None:
            raise ValueError("null is not a value; leave the field out to keep it")
        return v

    def merged(self, current: dict[str, Any]) -> dict[str, Any]:
        out = {**current, **self.model_dump(exclude_unset=True)}
        if out.get("protocol") == "tcp" and "http" not in self.model_fields_set:
            out["http"] = None  # switched to tcp: the http part goes with it
        return out


class ServiceUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"listen_port": 443, "destination_port": 9443}]})
    listen_port: StrictInt = Field(ge=1, le=65535, description="the service to change")
    # left out: unchanged; an explicit null is not a value (the document says so: no null type)
    protocol: Literal["tcp", "http"] = Field(None, json_schema_extra=_left_out)  # type: ignore[assignment]
    destination_port: StrictInt = Field(None, ge=1, le=65535, json_schema_extra=_left_out)  # type: ignore[assignment]
    proxyprotocol: StrictBool = Field(None, json_schema_extra=_left_out)  # type: ignore[assignment]
    health_check: HealthCheckChange | None = Field(None, description="the fields of the health check to change")

    @field_validator("protocol", "destination_port", "proxyprotocol", mode="before")
    @classmethod
    def _no_null(cls, v: Any) -> Any:
        """A field left out keeps its value; an explicit null is not a value (422 naming it)."""
        if v is None:
            raise ValueError("null is not a value; leave the field out to keep it")
        return v


class ServiceRef(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"listen_port": 443}]})
    listen_port: StrictInt = Field(ge=1, le=65535)


class LoadBalancerPatch(BaseModel):
    """``PATCH /v1/load-balancers/{id}``: a new name and/or labels (replacing all labels)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"name": "web-2", "labels": {"env": "prod"}}],
                                                                 **schemas.at_least_one("name", "labels")})
    # left out: unchanged; never null (the document has no null type for them)
    name: StrictStr = Field(None, pattern=schemas.NAME_PATTERN, description="DNS label, lower case, 1-63 chars",  # type: ignore[assignment]
                            json_schema_extra=schemas.left_out)
    labels: schemas.Labels = Field(None, json_schema_extra=schemas.left_out)  # type: ignore[assignment]

    _no_null = field_validator("name", "labels", mode="before")(schemas.no_null)

    @model_validator(mode="after")
    def _some(self) -> "LoadBalancerPatch":
        if self.name is None and self.labels is None:
            raise ValueError("give at least one of name, labels")
        return self


class AlgorithmBody(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"type": "least_connections"}]})
    type: Literal["round_robin", "least_connections"]


def _operations(api: ApiResource) -> list[Operation]:
    accepted = api.models["accepted"]
    id_doc = "the load balancer's id (lb_…)"

    async def _action(request: web.Request, route: str, body: Any, fn: Any) -> web.Response:
        async def change(conn: Any, settings: Settings, tenant_id: str, rid: str) -> Any:
            lb = await load_balancer_store.lb_get_for_update(conn, rid, tenant_id)
            if lb is None:
                raise NotFound(f"no load balancer {rid!r}")
            if lb.status in ("deleting", "destroying", "deleted"):
                raise Conflict(f"load balancer {lb.id} is {lb.status}" + ("; cancel the deletion first"
                                                                           if lb.status == "deleting" else ""),
                               **deleting("load_balancer", lb.id, lb.status))
            services = [dict(s) for s in lb.services]
            targets = [dict(t) for t in lb.targets]
            algorithm = await fn(conn, settings, tenant_id, lb, services, targets)
            row = await load_balancer_store.lb_change(conn, lb.id, services=services, targets=targets,
                                                      algorithm=algorithm or lb.algorithm)
            return row, LOAD_BALANCER_CONFIGURE, None, ()

        return await action_transaction(request, LOAD_BALANCER, route, body, change, accepted=accepted)

    async def add_target(request: web.Request) -> web.Response:
        spec = await parse_body(request, TargetBody)

        async def fn(conn: Any, settings: Settings, tenant_id: str, lb: LoadBalancer, services: list, targets: list):
            t = spec.normalized()
            if any(target_key(x) == target_key(t) for x in targets):
                raise Conflict(f"load balancer {lb.id} already has target {target_key(t)}",
                               code="target_already_defined")
            if len(targets) >= MAX_TARGETS:
                raise Conflict(f"load balancer {lb.id} has {MAX_TARGETS} targets, the most a load balancer has",
                               code="resource_limit_exceeded")
            await _check_server_targets(conn, tenant_id, lb.region, [t])
            _check_not_own_address(lb, [t])
            await _check_ip_targets(conn, tenant_id, lb.region, [t], settings)
            _check_size(settings, lb.id, services, [*targets, t])
            targets.append(t)

        return await _action(request, "POST /load-balancers/{id}/actions/add_target", spec.model_dump(), fn)

    async def remove_target(request: web.Request) -> web.Response:
        spec = await parse_body(request, TargetBody)

        async def fn(conn: Any, settings: Settings, tenant_id: str, lb: LoadBalancer, services: list, targets: list):
            k = target_key(spec.normalized())
            keep = [x for x in targets if target_key(x) != k]
            if len(keep) == len(targets):
                raise Conflict(f"load balancer {lb.id} has no target {k}", code="target_not_found")
            targets[:] = keep

        return await _action(request, "POST /load-balancers/{id}/actions/remove_target", spec.model_dump(), fn)

    async def add_service(request: web.Request) -> web.Response:
        spec = await parse_body(request, ServiceBody)

        async def fn(conn: Any, settings: Settings, tenant_id: str, lb: LoadBalancer, services: list, targets: list):
            if any(s["listen_port"] == spec.listen_port for s in services):
                raise Conflict(f"load balancer {lb.id} already has a service listening on port {spec.listen_port}",
                               code="source_port_already_used")
            if len(services) >= MAX_SERVICES:
                raise Conflict(f"load balancer {lb.id} has {MAX_SERVICES} services, the most a load balancer has",
                               code="resource_limit_exceeded")
            _check_size(settings, lb.id, [*services, spec.normalized()], targets)
            services.append(spec.normalized())
            services.sort(key=lambda s: s["listen_port"])

        return await _action(request, "POST /load-balancers/{id}/actions/add_service", spec.model_dump(), fn)

    async def update_service(request: web.Request) -> web.Response:
        spec = await parse_body(request, ServiceUpdate)

        async def fn(conn: Any, settings: Settings, tenant_id: str, lb: LoadBalancer, services: list, targets: list):
            for i, s in enumerate(services):
                if s["listen_port"] == spec.listen_port:
                    merged = {**s, **{k: v for k, v in spec.model_dump(exclude_unset=True).items()
                                      if k not in ("listen_port", "health_check")}}
                    if spec.health_check is not None:
                        merged["health_check"] = spec.health_check.merged(dict(s["health_check"]))
                    try:
                        services[i] = Service.model_validate(merged).normalized()
                    except ValidationError as e:
                        raise validation_error(e) from None
                    _check_size(settings, lb.id, services, targets)
                    return
            raise Conflict(f"load balancer {lb.id} has no service listening on port {spec.listen_port}",
                           code="service_not_found")

        return await _action(request, "POST /load-balancers/{id}/actions/update_service", spec.model_dump(), fn)

    async def delete_service(request: web.Request) -> web.Response:
        spec = await parse_body(request, ServiceRef)

        async def fn(conn: Any, settings: Settings, tenant_id: str, lb: LoadBalancer, services: list, targets: list):
            keep = [s for s in services if s["listen_port"] != spec.listen_port]
            if len(keep) == len(services):
                raise Conflict(f"load balancer {lb.id} has no service listening on port {spec.listen_port}",
                               code="service_not_found")
            services[:] = keep

        return await _action(request, "POST /load-balancers/{id}/actions/delete_service", spec.model_dump(), fn)

    async def change_algorithm(request: web.Request) -> web.Response:
        spec = await parse_body(request, AlgorithmBody)

        async def fn(conn: Any, settings: Settings, tenant_id: str, lb: LoadBalancer, services: list, targets: list):
            return spec.type

        return await _action(request, "POST /load-balancers/{id}/actions/change_algorithm", spec.model_dump(), fn)

    async def patch(request: web.Request) -> web.Response:
        spec = await parse_body(request, LoadBalancerPatch)
        pool, tenant_id = request.app[POOL], tenant(request)
        rid = path_id(request, "lb", "load balancer")
        try:
            row = await load_balancer_store.lb_patch(pool, rid, tenant_id, name=spec.name, labels=spec.labels)
        except UniqueViolation as e:
            if e.constraint != "load_balancers_tenant_name_live":
                raise
            raise Conflict(f"a load balancer named {spec.name!r} already exists in this tenant",
                           code="uniqueness_error") from e
        if row is None:
            if await LOAD_BALANCER.get(pool, rid, tenant_id) is None:
                raise NotFound(f"no load balancer {rid!r}")
            raise Conflict(f"load balancer {rid} is deleted; it cannot be changed",
                           **deleting("load_balancer", rid, "deleted"))
        return web.json_response(dump(api.models["one"], {"load_balancer": row.public()}))

    job_ref = {"id": "job_01jd3x5v8q2m6n4p7r9s1t3w5y", "status": "pending", "kind": LOAD_BALANCER_CONFIGURE}
    example = {"load_balancer": {**EXAMPLE, "status": "active"}, "job": job_ref}
    responses = {202: accepted, 400: None, 401: None, 404: None, 409: None, 422: None}
    ops = []
    for name, handler, body, summary in (
            ("add_target", add_target, TargetBody, "Add a target (a server of the region, or an IP)"),
            ("remove_target", remove_target, TargetBody, "Remove a target"),
            ("add_service", add_service, ServiceBody, "Add a service (a listen port and its health check)"),
            ("update_service", update_service, ServiceUpdate, "Change the service listening on listen_port"),
            ("delete_service", delete_service, ServiceRef, "Delete the service listening on listen_port"),
            ("change_algorithm", change_algorithm, AlgorithmBody, "Change the balancing algorithm")):
        op_id = "".join(p.capitalize() for p in name.split("_"))
        path = f"/load-balancers/{{id}}/actions/{name.replace('_', '-')}"  # kebab-case, as every action path
        ops.append(Operation("POST", path, handler,
                             f"{op_id[0].lower()}{op_id[1:]}LoadBalancer", summary, "load-balancers", responses,
                             request=body, path_id=id_doc, idempotent=True, example=example))
        # the snake_case path it had until now: an alias for one release, deprecated in the document
        ops.append(Operation("POST", f"/load-balancers/{{id}}/actions/{name}", handler,
                             f"{op_id[0].lower()}{op_id[1:]}LoadBalancerSnakeCase", f"{summary} (deprecated path)",
                             "load-balancers", responses, request=body, path_id=id_doc, idempotent=True,
                             example=example, deprecated=True,
                             description=f"Deprecated: use `POST {path}` (the same operation); this path is "
                                         "kept for one release."))
    ops.append(Operation("PATCH", "/load-balancers/{id}", patch, "updateLoadBalancer",
                         "Rename a load balancer or set its labels (no job)", "load-balancers",
                         {200: api.models["one"], 400: None, 401: None, 404: None, 409: None, 422: None},
                         request=LoadBalancerPatch, path_id=id_doc,
                         example={"load_balancer": {**EXAMPLE, "status": "active", "labels": {"env": "prod"}}}))
    return ops


API = ApiResource(rtype=LOAD_BALANCER, create_model=LoadBalancerCreate, public_model=LoadBalancerOut, create=create,
                  example=EXAMPLE, transactional=True, actions=_operations,
                  tag_description="Load balancers: HAProxy appliances (one, or two with keepalived) in front of "
                                  "servers or IPs, configured through the guest agent, with target health.")
