"""The ``network`` type's API registration: the create hook (the row, its NetworkCreate and — when none
is queued — the region's SDN apply, in one transaction), a server joining networks at its create
(:func:`join_at_create`), and the type's own routes: ``PATCH /networks/{id}``, ``GET
/networks/{id}/members``, ``POST /servers/{id}/actions/attach_to_network`` and
``…/detach_from_network``. List, get, delete (two-phase; refused with members) and cancel-deletion
are the generic ones (:mod:`z9.api.resources`).

Refusals, each naming the field or the precondition: 422 ``ip_range`` (not an RFC 1918 IPv4 network
of /16 to /28, or host bits set), 422 ``ip`` (not in the network's range, or its network/broadcast
address), 409 ``networks_unavailable`` (the region has no SDN zone configured), ``uniqueness_error``
(a name in use), ``region_mismatch``, ``ip_not_available`` (the address asked for is taken),
``no_subnet_available`` (no address of the range is free, or the region's tags are all taken),
``server_already_attached``, ``server_not_attached``, ``resource_in_use`` (a network with members),
``resource_deleting``.
"""
from __future__ import annotations

import ipaddress
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictStr, model_validator
from z9.api import schemas
from z9.api.resources import (
    NOTIFIER,
    POOL,
    SETTINGS,
    ApiResource,
    CreateContext,
    Operation,
    dump,
    idempotency_begin,
    idempotency_end,
    idempotency_key,
    parse_body,
    path_id,
    request_hash,
    room_for_a_job,
    tenant,
)
from z9.common import store
from z9.common.errors import (
    Conflict,
    NotFound,
    UniqueViolation,
    ValidationFailed,
    deleting,
)
from z9.common.ids import new_id
from z9.common.settings import Settings
from z9.common.store import NewJob
from z9.resources.network import (
    NETWORK,
    NETWORK_ATTACH,
    NETWORK_CREATE,
    NETWORK_DETACH,
    SDN_APPLY,
    Member,
    Network,
    sdn_resource,
)
from z9.resources.network import store as net_store
from z9.resources.server import store as server_store

STATUSES = Literal["creating", "available", "deleting", "destroying", "deleted", "failed"]
PRIVATE = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
#: an RFC 1918 IPv4 network of /16 to /28, as the document states it (host bits set: refused by the API)
RANGE_PATTERN = (rf"^(10\.{_OCTET}\.{_OCTET}\.{_OCTET}|172\.(1[6-9]|2[0-9]|3[01])\.{_OCTET}\.{_OCTET}"
                 rf"|192\.168\.{_OCTET}\.{_OCTET})/(1[6-9]|2[0-8])$")
IP_PATTERN = rf"^{_OCTET}\.{_OCTET}\.{_OCTET}\.{_OCTET}$"


class NetworkCreate(BaseModel):
    """``POST /v1/networks``: a private network of the region (one SDN VNet), addresses of ``ip_range``
    given to its members by z9."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"name": "backend", "region": "dev-1", "ip_range": "10.0.0.0/24"}]})

    name: StrictStr = Field(pattern=schemas.NAME_PATTERN, description="DNS label, lower case, 1-63 chars")
    region: StrictStr = Field(min_length=1, max_length=63)
    ip_range: StrictStr = Field(pattern=RANGE_PATTERN, description=(
        "an RFC 1918 IPv4 network, /16 to /28 (e.g. 10.0.0.0/24); other networks — of this tenant or "
        "another — may use the same range: they never reach each other"))
    labels: schemas.Labels | None = None


class NetworkPatch(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1, "examples": [{"name": "db"}]})

    name: StrictStr | None = Field(None, pattern=schemas.NAME_PATTERN)
    labels: schemas.Labels | None = None

    @model_validator(mode="after")
    def _something(self) -> NetworkPatch:
        if not self.model_fields_set:
            raise ValueError("give at least one of name, labels")
        return self


class AttachToNetwork(BaseModel):
    """``POST /v1/servers/{id}/actions/attach_to_network``."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"network_id": "net_01jd3x5v8q2m6n4p7r9s1t3w5y", "ip": "10.0.0.7"}]})

    network_id: StrictStr = Field(pattern=r"^net_[0-9a-z]{26}$")
    ip: StrictStr | None = Field(None, pattern=IP_PATTERN, description="an address of the network's range; none: "
                                                                       "the lowest free one")


class DetachFromNetwork(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"network_id": "net_01jd3x5v8q2m6n4p7r9s1t3w5y"}]})

    network_id: StrictStr = Field(pattern=r"^net_[0-9a-z]{26}$")


class NetworkObserved(schemas.Response):
    """What the last job saw: the VNet in the running SDN config and each node's zone."""

    vnet: str | None
    zone: str | None
    tag: int | None
    mtu: int | None = Field(description="the MTU the network's NICs are given")
    nodes: dict[str, str] = Field(description="each node's view of the zone: available | pending | error")
    at: schemas.OptTimestamp


class NetworkOut(schemas.Response):
    """A network (``GET /v1/networks/{id}``)."""

    id: str = Field(pattern=r"^net_[0-9a-z]{26}$")
    name: str
    region: str
    ip_range: str
    labels: dict[str, str]
    status: STATUSES
    status_reason: str | None
    vnet: str = Field(description="the Proxmox SDN VNet (its bridge on every node)")
    observed: NetworkObserved | None
    delete_after: schemas.OptTimestamp
    created_at: schemas.Timestamp
    updated_at: schemas.Timestamp
    deleted_at: schemas.OptTimestamp


class SdnRegionOut(schemas.Response):
    region: str
    condition: dict[str, Any] | None = Field(description=(
        "what blocks the region's SDN apply (null: nothing): `code` foreign_sdn_edits (pending SDN edits z9 "
        "did not make, named in `objects`), sdn_locked (a lock another client holds), node_reload_failed "
        "(`nodes` that did not reload), with `message` and the apply `job_id`"))
    locked: bool = Field(description="z9 holds PVE's SDN lock now (its token recorded)")
    applies: int = Field(description="SDN applies z9 made in the region")
    applied_at: schemas.OptTimestamp


class SdnRegionList(schemas.Response):
    regions: list[SdnRegionOut]


class NetworkMemberOut(schemas.Response):
    network_id: str
    server_id: str
    ip: str
    nic: str = Field(description="the server's NIC on the network (net1…)")
    state: Literal["attaching", "attached", "detaching"]


class NetworkMembersOut(schemas.Response):
    members: list[NetworkMemberOut]


class ServerNetworkAccepted(schemas.Accepted):
    """Accepted: the server, the network it joins or leaves, and the job (NetworkAttach or NetworkDetach)."""

    server: schemas.Server
    network: NetworkOut
    job: schemas.JobRef


EXAMPLE: dict[str, Any] = {
    "id": "net_01jd3x5v8q2m6n4p7r9s1t3w5y", "name": "backend", "region": "dev-1", "ip_range": "10.0.0.0/24",
    "labels": {}, "status": "creating", "status_reason": None, "vnet": "z9186a0", "observed": None,
    "delete_after": None, "created_at": "2026-12-01T04:00:00Z", "updated_at": "2026-12-01T04:00:00Z",
    "deleted_at": None,
}


def parse_range(text: str) -> ipaddress.IPv4Network:
    """``ip_range`` checked: an RFC 1918 IPv4 network of /16 to /28 without host bits (422 naming it)."""
    def bad(why: str) -> ValidationFailed:
        return ValidationFailed(f"ip_range: {text!r} {why}", details=[{"field": "ip_range", "message": why}])

    try:
        net = ipaddress.IPv4Network(text, strict=True)
    except ValueError as e:
        if "has host bits set" in str(e):
            loose = ipaddress.IPv4Network(text, strict=False)
            raise bad(f"has host bits set: the network is {loose}") from None
        raise bad(f"is not an IPv4 network with its prefix ({e})") from None
    if "/" not in text:
        raise bad("has no prefix length")
    if not any(net.subnet_of(p) for p in PRIVATE):
        raise bad("is not private (RFC 1918: 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16)")
    if not 16 <= net.prefixlen <= 28:
        raise bad("is not /16 to /28")
    return net


def check(settings: Settings, spec: NetworkCreate) -> None:
    parse_range(spec.ip_range)


def _sdn(settings: Settings, region: str) -> Any:
    sdn = settings.regions[region].sdn
    if sdn is None:
        raise Conflict(f"region {region} offers no private networks (its operator configured no SDN zone)",
                       code="networks_unavailable")
    return sdn


async def ensure_apply(conn: Any, region: str, max_attempts: int) -> str:
    """The region's next SDN apply job: the queued one, or a new one (under the region's SDN row lock,
    which the apply job takes as it starts: an edit committed after an apply looked is picked up by
    the next). Returns its id."""
    row = await net_store.sdn_region_lock(conn, region)
    if row.get("apply_job_id"):
        job = await store.job_get(conn, row["apply_job_id"])
        if job is not None and job.status == "pending" and job.attempt == 0:
            return str(job.id)
    job = await store.job_insert(conn, NewJob(kind=SDN_APPLY, region=region, resource_type=NETWORK.name,
                                              resource_id=sdn_resource(region), args={}, max_attempts=max_attempts),
                                 notify=False)
    await net_store.sdn_region_set_apply_job(conn, region, job.id)
    return str(job.id)


def _unique(e: UniqueViolation, name: str | None) -> Exception:
    if e.constraint == "networks_tenant_name_live":
        return Conflict(f"a network named {name!r} already exists in this tenant", code="uniqueness_error")
    return e


async def create(ctx: CreateContext, spec: NetworkCreate) -> tuple[Network, dict[str, Any]]:
    sdn = _sdn(ctx.settings, spec.region)
    net = parse_range(spec.ip_range)
    # the region's SDN row first: the creates of a region pick their tags one after another (and this
    # one's edit is seen by the apply it queues, or a later one: ensure_apply)
    await net_store.sdn_region_lock(ctx.conn, spec.region)
    try:
        row = await net_store.insert(ctx.conn, id=new_id("net"), tenant_id=ctx.tenant_id, region=spec.region,
                                     name=spec.name, ip_range=str(net), tags=sdn.tags, labels=dict(spec.labels or {}))
    except UniqueViolation as e:
        raise _unique(e, spec.name)
    if row is None:
        raise Conflict(f"region {spec.region} has no network tag left ({sdn.tags[0]}-{sdn.tags[1]} all in use)",
                       code="no_subnet_available")
    job = await store.job_insert(ctx.conn, NETWORK.new_job(row, NETWORK_CREATE, max_attempts=ctx.settings.max_attempts),
                                 notify=False)
    await ensure_apply(ctx.conn, spec.region, ctx.settings.max_attempts)
    return row, job.brief()


# ---------------------------------------------------------------------------------- members

def host_range(net: ipaddress.IPv4Network) -> tuple[str, str]:
    """The addresses z9 gives members: every host address of the range (no gateway: z9's networks
    are layer 2 only, PVE is given no subnet)."""
    return str(net.network_address + 1), str(net.broadcast_address - 1)


async def join(conn: Any, settings: Settings, server: Any, network_id: str, ip: str | None, *,
               field: str = "network_id") -> tuple[Network, Member, NewJob]:
    """``server`` (its row locked by the caller) joins network ``network_id`` of its tenant: the
    membership (its address and NIC) now, and the NetworkAttach that plugs it (holding the server)."""
    row = await net_store.get_for_update(conn, network_id, server.tenant_id)
    if row is None:
        raise ValidationFailed(f"{field}: no network {network_id!r}",
                               details=[{"field": field, "message": "unknown network"}])
    if row.status in ("deleting", "destroying", "deleted"):
        raise Conflict(f"network {row.id} is {row.status}", **deleting("network", row.id, row.status))
    if row.region != server.region:
        raise Conflict(f"network {row.id} is in region {row.region}, server {server.id} in {server.region}",
                       code="region_mismatch")
    if await net_store.member_get(conn, row.id, server.id) is not None:
        raise Conflict(f"server {server.id} is already attached to network {row.id}",
                       code="server_already_attached", details=[{"kind": "network", "id": row.id}])
    first, last = host_range(row.network)
    if ip is not None:
        try:
            addr = ipaddress.IPv4Address(ip)
        except ValueError:
            raise ValidationFailed(f"ip: {ip!r} is not an IPv4 address",
                                   details=[{"field": "ip", "message": "not an IPv4 address"}]) from None
        if not ipaddress.IPv4Address(first) <= addr <= ipaddress.IPv4Address(last):
            raise ValidationFailed(f"ip: {ip} is not a host address of network {row.id}'s range {row.network}",
                                   details=[{"field": "ip", "message": f"not in {row.network} (from {first} to {last})"}])
    try:
        async with conn.transaction():
            member = await net_store.member_insert(conn, row.id, server.id, server.tenant_id, ip, first, last)
    except UniqueViolation as e:
        if e.constraint == "network_members_ip":
            raise Conflict(f"{ip} is taken in network {row.id}", code="ip_not_available",
                           details=[{"field": "ip", "message": "taken"}]) from None
        raise
    if member is None:
        raise Conflict(f"network {row.id} has no address left for server {server.id} (its range {row.network}, "
                       "or the server's 31 NICs, all taken)", code="no_subnet_available")
    job = NETWORK.new_job(row, NETWORK_ATTACH, args={"server_id": server.id}, extra_lock_keys=(server.id,),
                          max_attempts=settings.max_attempts)
    return row, member, job


async def join_at_create(conn: Any, server: Any, wanted: list[Any], settings: Settings) -> list[NewJob]:
    """A server's create names networks (the ``server_created`` hook): it joins each (a NetworkAttach
    per network, after its ServerCreate)."""
    jobs = []
    seen: set[str] = set()
    for i, w in enumerate(wanted):
        nid, ip = str(w.network_id), w.ip
        if nid in seen:
            raise ValidationFailed(f"networks[{i}]: network {nid} is named twice",
                                   details=[{"field": f"networks.{i}.network_id", "message": "named twice"}])
        seen.add(nid)
        _, _, job = await join(conn, settings, server, nid, ip, field=f"networks.{i}.network_id")
        jobs.append(job)
    return jobs


# ---------------------------------------------------------------------------------- routes

def _operations(api: ApiResource) -> list[Operation]:
    one = api.models["one"]
    id_doc = "the network's id (net_…)"
    job_ref = {"id": "job_01jd3x5v8q2m6n4p7r9s1t3w5y", "status": "pending"}

    async def _server_action(request: web.Request, route: str, body: Any, fn: Any) -> web.Response:
        settings, pool, tenant_id = request.app[SETTINGS], request.app[POOL], tenant(request)
        key = idempotency_key(request)
        req_hash = request_hash(route, [request.match_info["id"], body])
        sid = path_id(request, "srv", "server")
        async with pool.acquire() as conn, conn.transaction():
            replay = await idempotency_begin(conn, tenant_id, key, req_hash)
            if replay is not None:
                return replay
            server = await server_store.server_get_for_update(conn, sid, tenant_id)
            if server is None:
                raise NotFound(f"no server {sid!r}")
            if server.status in ("deleting", "destroying", "deleted"):
                raise Conflict(f"server {sid} is {server.status}", **deleting("server", sid, server.status))
            row, job_spec = await fn(conn, settings, server)
            await room_for_a_job(conn, settings, "network", row.id)
            job = await store.job_insert(conn, job_spec, notify=False)
            answer = dump(ServerNetworkAccepted, {"server": server.public(), "network": row.public(),
                                                  "job": job.brief(), "jobs": [job.brief()]})
            await idempotency_end(conn, tenant_id, key, req_hash, 202, answer)
        request.app[NOTIFIER].notify(job.region)
        return web.json_response(answer, status=202)

    async def attach(request: web.Request) -> web.Response:
        spec = await parse_body(request, AttachToNetwork)

        async def fn(conn: Any, settings: Settings, server: Any) -> Any:
            row, _, job = await join(conn, settings, server, spec.network_id, spec.ip)
            return row, job

        return await _server_action(request, "POST /servers/{id}/actions/attach_to_network", spec.model_dump(), fn)

    async def detach(request: web.Request) -> web.Response:
        spec = await parse_body(request, DetachFromNetwork)

        async def fn(conn: Any, settings: Settings, server: Any) -> Any:
            row = await net_store.get_for_update(conn, spec.network_id, server.tenant_id)
            member = await net_store.member_get(conn, spec.network_id, server.id) if row is not None else None
            if row is None or member is None or member.state == "detaching":
                raise Conflict(f"server {server.id} is not attached to network {spec.network_id}"
                               + (" (its detach is under way)" if member is not None else ""),
                               code="server_not_attached")
            await net_store.member_set_state(conn, row.id, server.id, "detaching")
            return row, NETWORK.new_job(row, NETWORK_DETACH, args={"server_id": server.id},
                                        extra_lock_keys=(server.id,), max_attempts=settings.max_attempts)

        return await _server_action(request, "POST /servers/{id}/actions/detach_from_network", spec.model_dump(), fn)

    async def members(request: web.Request) -> web.Response:
        pool, tenant_id = request.app[POOL], tenant(request)
        rid = path_id(request, "net", "network")
        if await net_store.get(pool, rid, tenant_id) is None:
            raise NotFound(f"no network {rid!r}")
        rows = await net_store.members_of(pool, rid)
        return web.json_response(dump(NetworkMembersOut, {"members": [m.public() for m in rows]}))

    async def patch(request: web.Request) -> web.Response:
        spec = await parse_body(request, NetworkPatch)
        pool, tenant_id = request.app[POOL], tenant(request)
        rid = path_id(request, "net", "network")
        try:
            row = await net_store.patch(pool, rid, tenant_id, name=spec.name,
                                        labels=dict(spec.labels) if spec.labels is not None else None)
        except UniqueViolation as e:
            raise _unique(e, spec.name)
        if row is None:
            if await net_store.get(pool, rid, tenant_id) is None:
                raise NotFound(f"no network {rid!r}")
            raise Conflict(f"network {rid} is deleted; it cannot be changed", **deleting("network", rid, "deleted"))
        return web.json_response(dump(one, {"network": row.public()}))

    async def operator_sdn(request: web.Request) -> web.Response:
        from z9.api.operator import require_operator

        require_operator(request)
        rows = await net_store.sdn_region_conditions(request.app[POOL])
        out = [{"region": r["region"], "condition": dict(r["condition"]) if r["condition"] else None,
                "locked": bool(r["locked"]), "applies": int(r["applies"]),
                "applied_at": r["applied_at"].isoformat().replace("+00:00", "Z") if r["applied_at"] else None}
               for r in rows]
        return web.json_response(dump(SdnRegionList, {"regions": out}))

    server_doc = "the server's id (srv_…)"
    from z9.resources.server.api import EXAMPLE as SERVER_EXAMPLE
    ops = [
        Operation("GET", "/operator/sdn", operator_sdn, "operatorListSdn",
                  "Each region's SDN apply: what blocks it (foreign pending edits, a foreign lock, a node that did "
                  "not reload), whether z9 holds the lock, its applies", "operator",
                  {200: SdnRegionList, 401: None, 403: None},
                  description="Needs a token with the operator scope (`z9 token --scope operator`); any other "
                              "answers 403.",
                  example={"regions": [{"region": "dev-1", "locked": False, "applies": 3,
                                        "applied_at": "2026-12-01T04:00:00Z", "condition": {
                                            "code": "foreign_sdn_edits", "objects": ["vnet ops1 (new)"],
                                            "message": "pending SDN edits z9 did not make block the region's "
                                                       "SDN apply: vnet ops1 (new)",
                                            "job_id": "job_01jd3x5v8q2m6n4p7r9s1t3w5y"}}]}),
        Operation("PATCH", "/networks/{id}", patch, "updateNetwork", "Rename a network or set its labels (no job)",
                  "networks", {200: one, 400: None, 401: None, 404: None, 409: None, 422: None}, request=NetworkPatch,
                  path_id=id_doc, example={"network": {**EXAMPLE, "status": "available"}}),
        Operation("GET", "/networks/{id}/members", members, "listNetworkMembers",
                  "The servers on a network, each with its address and NIC", "networks",
                  {200: NetworkMembersOut, 401: None, 404: None}, path_id=id_doc,
                  example={"members": [{"network_id": EXAMPLE["id"], "server_id": "srv_01jd3x5v8q2m6n4p7r9s1t3w5y",
                                        "ip": "10.0.0.1", "nic": "net1", "state": "attached"}]}),
    ]
    errors = {202: ServerNetworkAccepted, 400: None, 401: None, 404: None, 409: None, 422: None}
    for name, handler, body, kind, op_id, summary in (
            ("attach_to_network", attach, AttachToNetwork, NETWORK_ATTACH, "attachServerToNetwork",
             "Attach a server to a private network of its region (a NIC hot-plugged on the network)"),
            ("detach_from_network", detach, DetachFromNetwork, NETWORK_DETACH, "detachServerFromNetwork",
             "Detach a server from a network (its NIC there unplugged, its address freed)")):
        path = f"/servers/{{id}}/actions/{name.replace('_', '-')}"  # kebab-case, as every action path
        example = {"server": SERVER_EXAMPLE, "network": {**EXAMPLE, "status": "available"},
                   "job": {**job_ref, "kind": kind}}
        ops.append(Operation("POST", path, handler, op_id, summary, "networks", errors, request=body,
                             path_id=server_doc, idempotent=True, example=example))
        # Hetzner Cloud's spelling of the same action (snake_case): an alias, marked deprecated in the document
        ops.append(Operation("POST", f"/servers/{{id}}/actions/{name}", handler, f"{op_id}SnakeCase",
                             f"{summary} (Hetzner's path)", "networks", errors, request=body, path_id=server_doc,
                             idempotent=True, example=example, deprecated=True,
                             description=f"Hetzner Cloud's spelling of `POST {path}` (the same operation), kept as "
                                         "an alias: z9's action paths are kebab-case."))
    return ops


class NetworkFilters(BaseModel):
    """``GET /v1/networks`` filters."""

    model_config = ConfigDict(extra="forbid")

    region: StrictStr | None = Field(None, min_length=1, max_length=63, description="only networks of this region")


async def list_rows(db: Any, tenant_id: str, filters: NetworkFilters, *, after: str | None, status: str | None,
                    limit: int, name: str | None = None, selector: Any = None,
                    include_deleted: bool = True) -> list[Network]:
    return await net_store.list_rows(db, tenant_id, after=after, status=status, limit=limit, name=name,
                                     selector=selector, include_deleted=include_deleted, region=filters.region)


API = ApiResource(rtype=NETWORK, create_model=NetworkCreate, public_model=NetworkOut, create=create, check=check,
                  example=EXAMPLE, transactional=True, actions=_operations, list_filters=NetworkFilters,
                  list_rows=list_rows,
                  tag_description="Private networks: a layer-2 network of a region (a Proxmox SDN VNet) that "
                                  "servers join with a NIC of their own and an address z9 gives them; networks "
                                  "never reach each other, whatever their address ranges.")
