"""The ``address`` type's API registration (issue 8 §2): the create hook (the lowest free IP of a
pool and the address's job in one statement), and the type's own routes — ``PATCH``,
``actions/assign``, ``actions/unassign``. List, get, delete (two-phase) and cancel-deletion are the
generic ones (:mod:`z9.api.resources`).

409s use Hetzner's codes where the meaning is the same, and z9's own otherwise, each with a
message naming the precondition: ``pool_exhausted``, ``address_already_assigned``,
``address_not_assigned``, ``server_not_stopped`` (a primary address changes only on a stopped
server: cloud-init applies it at the next boot, as a new instance), ``server_has_ipv4``/``…ipv6``,
``region_mismatch``, ``server_deleting``, ``address_deleting``, ``protected``, ``uniqueness_error``,
``load_balancer_address``/``cluster_endpoint`` (another resource's address: never on a server).
"""
from __future__ import annotations

from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, model_validator

from z9.common.errors import CheckViolation, Conflict, NotFound, UniqueViolation, ValidationFailed, deleting
from z9.resources.address.model import Address
from z9.resources.server.model import Server
from z9.resources.address import ADDRESS
from z9.common.settings import Settings
from z9.common.store import NewJob

from z9.api import quotas, schemas
from z9.api.resources import (POOL, ApiResource, action_transaction, CreateContext, Operation, dump, parse_body, path_id, tenant)
from z9.resources.address import store as address_store
from z9.resources.server import store as server_store
from z9.resources.address import ADDRESS_ASSIGN, ADDRESS_CREATE, ADDRESS_UNASSIGN

DNS_PTR_PATTERN = r"^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?$"
SERVER_ID = r"^srv_[0-9a-z]{26}$"


class Protection(schemas.Response):
    delete: bool = Field(description="while true, DELETE answers 409 protected")


class ProtectionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    delete: StrictBool


class AddressCreate(BaseModel):
    """``POST /v1/addresses``: an address from a pool of the region (the lowest free IP), on no
    server or assigned to ``server_id`` (floating: it moves live between servers)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"region": "dev-1", "name": "www"}]})

    region: StrictStr = Field(min_length=1, max_length=63)
    family: Literal[4, 6] = Field(4, description="IP version")
    pool: StrictStr | None = Field(None, pattern=r"^[a-z0-9][a-z0-9-]{0,62}$",
                                   description="pool name; default: the region's pool named public, or its only one")
    name: StrictStr | None = Field(None, pattern=schemas.NAME_PATTERN)
    server_id: StrictStr | None = Field(None, pattern=SERVER_ID, description="assign it to this server at once")
    dns_ptr: StrictStr | None = Field(None, pattern=DNS_PTR_PATTERN, max_length=253, description="reverse DNS name")
    protection: ProtectionIn | None = None


class AddressPatch(BaseModel):
    """``PATCH /v1/addresses/{id}``: database-only changes (no job)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1, "examples": [
        {"name": "www", "dns_ptr": "www.example.com", "protection": {"delete": True}}]})

    name: StrictStr | None = Field(None, pattern=schemas.NAME_PATTERN)
    dns_ptr: StrictStr | None = Field(None, pattern=DNS_PTR_PATTERN, max_length=253)
    protection: ProtectionIn | None = None
    auto_delete: StrictBool | None = Field(None, description="primary: deleted with its server")
    labels: schemas.Labels | None = None

    @model_validator(mode="after")
    def _something(self) -> "AddressPatch":
        if not self.model_fields_set:
            raise ValueError("give at least one of name, dns_ptr, protection, auto_delete, labels")
        return self


class AddressAssign(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"server_id": "srv_01jd3x5v8q2m6n4p7r9s1t3w5y"}]})

    server_id: StrictStr = Field(pattern=SERVER_ID)


class AddressHolder(schemas.Response):
    server_id: str | None
    vmid: int
    node: str
    tag: bool = Field(description="the VM carries z9-addr-<id>")
    ipset_entry: bool = Field(description="the VM's ipfilter-net0 IP set holds the IP")
    ipconfig0: str | None = Field(description="primary: the VM's cloud-init ipconfig0")


class AddressConflict(schemas.Response):
    vmid: int
    node: str
    name: str | None
    why: str


class AddressObserved(schemas.Response):
    """What the last job's verify saw: the VM the address is on (found by its tag, across the
    cluster), whether the VM's IP filter enforces it, and VMs z9 does not manage that use it."""

    holder: AddressHolder | None
    enforced: bool | None = Field(description="the VM's firewall and IP filter are on (and the cluster's)")
    cluster_firewall: bool | None
    conflicts: list[AddressConflict]
    guest_configured: bool | None = Field(description="advisory (guest agent); null: not known")
    at: schemas.OptTimestamp


class AddressOut(schemas.Response):
    """An address (``GET /v1/addresses/{id}``)."""

    id: str = Field(pattern=r"^adr_[0-9a-z]{26}$")
    name: str | None
    region: str
    pool: str
    family: Literal[4, 6]
    ip: str
    prefix: int
    gateway: str | None
    kind: Literal["primary", "floating", "load_balancer"]
    server_id: str | None = Field(description="the server it is (to be) on; null: unassigned")
    dns_ptr: str | None
    protection: Protection
    auto_delete: bool
    labels: dict[str, str]
    status: Literal["creating", "active", "deleting", "destroying", "deleted", "failed"]
    status_reason: str | None = Field(description="why it failed, or a conflict seen in the world")
    observed: AddressObserved | None
    delete_after: schemas.OptTimestamp
    created_at: schemas.Timestamp
    updated_at: schemas.Timestamp
    deleted_at: schemas.OptTimestamp


EXAMPLE: dict[str, Any] = {
    "id": "adr_01jd3x5v8q2m6n4p7r9s1t3w5y", "name": "www", "region": "dev-1", "pool": "public", "family": 4,
    "ip": "203.0.113.10", "prefix": 24, "gateway": "203.0.113.1", "kind": "floating",
    "server_id": "srv_01jd3x5v8q2m6n4p7r9s1t3w5y", "dns_ptr": None, "protection": {"delete": False},
    "auto_delete": False, "status": "creating", "status_reason": None, "observed": None, "delete_after": None,
    "created_at": "2026-12-01T04:00:00Z", "updated_at": "2026-12-01T04:00:00Z", "deleted_at": None, "labels": {},
}


# ---------------------------------------------------------------------------------- pools

async def pick_pool(conn: Any, settings: Settings, region: str, family: int, name: str | None, *,
                    field: str = "pool", family_field: str = "family") -> dict[str, Any]:
    """The pool an allocation draws from (422 naming the field when there is none or the choice
    is ambiguous: ``field`` and ``family_field`` as the request body names them)."""
    pools = await address_store.address_pool_pick(conn, region, family, name)
    if name is not None:
        if not pools:
            known = ", ".join(p.name for p in settings.regions[region].address_pools
                              if p.family == family) or "none"
            raise ValidationFailed(f"{field}: region {region} has no IPv{family} pool named {name!r} (pools: {known})",
                                   details=[{"field": field, "message": "unknown pool"}])
        return pools[0]
    if not pools:
        raise ValidationFailed(f"{family_field}: region {region} has no IPv{family} address pool",
                               details=[{"field": family_field, "message": "no pool of this family"}])
    if len(pools) > 1 and pools[0]["name"] != "public":
        raise ValidationFailed(f"{field}: region {region} has several IPv{family} pools "
                               f"({', '.join(p['name'] for p in pools)}); name one",
                               details=[{"field": field, "message": "required"}])
    return pools[0]


def exhausted(pool: dict[str, Any]) -> Conflict:
    return Conflict(f"address pool {pool['name']!r} of region {pool['region']} ({pool['cidr']}) has no free "
                    "address left (released addresses come back after their quarantine)",
                    code="pool_exhausted", details={"pool": pool["name"], "region": pool["region"]})


def _unique(e: UniqueViolation, name: str | None) -> Conflict:
    if e.constraint == "addresses_tenant_name_live":
        return Conflict(f"an address named {name!r} already exists in this tenant", code="uniqueness_error")
    if e.constraint == "addresses_primary_per_server":
        return Conflict("the server already has a primary address of this family", code="server_has_ipv4")
    raise e


# ---------------------------------------------------------------------------------- server checks

async def _target_server(conn: Any, tenant_id: str, server_id: str, address: Address | None,
                         region: str) -> Server:
    server = await server_store.server_get(conn, server_id, tenant_id)
    if server is None:
        raise ValidationFailed(f"server_id: no server {server_id!r}",
                               details=[{"field": "server_id", "message": "unknown server"}])
    if server.region != region:
        raise Conflict(f"server {server.id} is in region {server.region}, the address in {region}: "
                       "an address can only be assigned to a server of its region", code="region_mismatch")
    if server.status in ("deleting", "destroying", "deleted"):
        raise Conflict(f"server {server.id} is {server.status}; an address cannot be assigned to it",
                       **deleting("server", server.id, server.status))
    return server


async def refuse_owned(conn: Any, address: Address) -> None:
    """409 when the address belongs to another resource (a load balancer's, a cluster's
    endpoint): its owner's VMs hold it, so it is never put on a server (assigned, or made a
    server's primary) — another VM answering for the IP would steal its traffic."""
    lb_id, cluster_id = await address_store.address_owner(conn, address.id)
    if lb_id is not None:
        raise Conflict(f"address {address.id} belongs to load balancer {lb_id}; it is neither assigned nor "
                       "unassigned on its own", code="load_balancer_address")
    if cluster_id is not None:
        raise Conflict(f"address {address.id} is the control-plane endpoint of Kubernetes cluster {cluster_id}; "
                       "it is not put on a server", code="cluster_endpoint")


def _require_stopped(server: Server, what: str) -> None:
    if server.status != "stopped" or server.power_state != "stopped":
        raise Conflict(f"server {server.id} is not stopped: {what} changes its cloud-init network config, which "
                       "the guest applies only at its next boot, as a new instance (new SSH host keys); stop the "
                       "server first", code="server_not_stopped")


# ---------------------------------------------------------------------------------- create

async def create(ctx: CreateContext, spec: AddressCreate) -> tuple[Address, dict[str, Any]]:
    """The lowest free IP of the pool, the address and its job (AddressAssign when a server is
    named, else AddressCreate), in one statement (the pool is chosen in it too: one round trip;
    only a refusal reads the pools again to say why)."""
    await quotas.check(ctx.conn, ctx.settings, ctx.tenant_id, addresses=1)
    extra: tuple[str, ...] = ()
    if spec.server_id is not None:
        await _target_server(ctx.conn, ctx.tenant_id, spec.server_id, None, spec.region)
        extra = (spec.server_id,)
    kind = ADDRESS_ASSIGN if spec.server_id else ADDRESS_CREATE
    try:
        got = await address_store.address_allocate_with_job(
            ctx.conn, region=spec.region, family=spec.family, pool=spec.pool, tenant_id=ctx.tenant_id,
            kind="floating", name=spec.name, dns_ptr=spec.dns_ptr,
            protect_delete=bool(spec.protection and spec.protection.delete), server_id=spec.server_id,
            job=NewJob(kind=kind, region=spec.region, args={"server_id": spec.server_id} if spec.server_id else {},
                       max_attempts=ctx.settings.max_attempts, extra_lock_keys=extra))
    except UniqueViolation as e:
        raise _unique(e, spec.name)
    if got is None:  # which: no such pool (422), or exhausted (409)
        raise exhausted(await pick_pool(ctx.conn, ctx.settings, spec.region, spec.family, spec.pool))
    return got


# ---------------------------------------------------------------------------------- actions

def _operations(api: ApiResource) -> list[Operation]:
    accepted, one = api.models["accepted"], api.models["one"]
    id_doc = "the address's id (adr_…)"
    job_ref = {"id": "job_01jd3x5v8q2m6n4p7r9s1t3w5y", "status": "pending"}

    async def _locked(conn: Any, request: web.Request) -> Address:
        rid = path_id(request, "adr", "address")
        row = await address_store.address_get_for_update(conn, rid, tenant(request))
        if row is None:
            raise NotFound(f"no address {rid!r}")
        if row.status in ("deleting", "destroying", "deleted"):
            raise Conflict(f"address {row.id} is {row.status}; cancel the deletion first"
                           if row.status == "deleting" else f"address {row.id} is {row.status}",
                           **deleting("address", row.id, row.status))
        await refuse_owned(conn, row)
        return row

    async def _action(request: web.Request, route: str, body: Any, fn: Any) -> web.Response:
        async def change(conn: Any, settings: Settings, tenant_id: str, rid: str) -> Any:
            return await fn(conn, settings, tenant_id, await _locked(conn, request))

        return await action_transaction(request, ADDRESS, route, body, change, accepted=accepted)

    async def assign(request: web.Request) -> web.Response:
        spec = await parse_body(request, AddressAssign)

        async def fn(conn: Any, settings: Settings, tenant_id: str, a: Address) -> Any:
            if a.server_id == spec.server_id and a.status != "failed":  # failed: this is the retry
                raise Conflict(f"address {a.id} is already assigned to server {a.server_id}",
                               code="address_already_assigned")
            server = await _target_server(conn, tenant_id, spec.server_id, a, a.region)
            if a.kind == "primary":
                if a.server_id is not None and a.server_id != server.id:
                    raise Conflict(f"primary address {a.id} is assigned to server {a.server_id}; unassign it "
                                   "first (with that server stopped)", code="address_already_assigned")
                _require_stopped(server, "assigning a primary address")
            try:
                row = await address_store.address_set_server(conn, a.id, server.id)
            except UniqueViolation as e:
                raise Conflict(f"server {server.id} already has a primary IPv{a.family} address",
                               code=f"server_has_ipv{a.family}") from e
            except CheckViolation as e:
                # a rule of the address's owner (addresses_<code>: a cluster's endpoint) refused it
                code = e.constraint.removeprefix("addresses_")
                if e.constraint.startswith("addresses_") and code in ADDRESS.deletion_rules:
                    raise Conflict(str(e).split("\n")[0], code=code) from e
                raise
            extra = tuple(s for s in (server.id, a.server_id) if s)
            return row, ADDRESS_ASSIGN, {"server_id": server.id}, extra

        return await _action(request, "POST /addresses/{id}/actions/assign", spec.model_dump(), fn)

    async def unassign(request: web.Request) -> web.Response:
        async def fn(conn: Any, settings: Settings, tenant_id: str, a: Address) -> Any:
            if a.server_id is None:
                raise Conflict(f"address {a.id} is not assigned to a server", code="address_not_assigned")
            if a.kind == "primary":
                server = await server_store.server_get(conn, a.server_id, tenant_id)
                if server is not None and server.status not in ("deleted", "destroying"):
                    _require_stopped(server, "unassigning its primary address")
            row = await address_store.address_set_server(conn, a.id, None)
            return row, ADDRESS_UNASSIGN, {}, (a.server_id,)

        return await _action(request, "POST /addresses/{id}/actions/unassign", None, fn)

    async def patch(request: web.Request) -> web.Response:
        spec = await parse_body(request, AddressPatch)
        pool, tenant_id = request.app[POOL], tenant(request)
        rid = path_id(request, "adr", "address")
        fields = spec.model_fields_set
        try:
            row = await address_store.address_patch(
                pool, rid, tenant_id,
                name=(spec.name,) if "name" in fields else None,
                dns_ptr=(spec.dns_ptr,) if "dns_ptr" in fields else None,
                protect_delete=spec.protection.delete if spec.protection is not None else None,
                auto_delete=spec.auto_delete, labels=spec.labels)
        except UniqueViolation as e:
            raise _unique(e, spec.name)
        if row is None:
            current = await address_store.address_get(pool, rid, tenant_id)
            if current is None:
                raise NotFound(f"no address {rid!r}")
            raise Conflict(f"address {rid} is deleted; it cannot be changed", **deleting("address", rid, "deleted"))
        return web.json_response(dump(one, {"address": row.public()}))

    return [
        Operation("PATCH", "/addresses/{id}", patch, "updateAddress",
                  "Change an address's name, reverse DNS, delete protection or auto-delete", "addresses",
                  {200: one, 400: None, 401: None, 404: None, 409: None, 422: None}, request=AddressPatch,
                  path_id=id_doc, example={"address": {**EXAMPLE, "status": "active", "dns_ptr": "www.example.com"}}),
        Operation("POST", "/addresses/{id}/actions/assign", assign, "assignAddress",
                  "Assign an address to a server (a floating address moves from the server holding it)",
                  "addresses", {202: accepted, 400: None, 401: None, 404: None, 409: None, 422: None},
                  request=AddressAssign, path_id=id_doc, idempotent=True,
                  example={"address": EXAMPLE, "job": {**job_ref, "kind": ADDRESS_ASSIGN}}),
        Operation("POST", "/addresses/{id}/actions/unassign", unassign, "unassignAddress",
                  "Take an address off its server", "addresses",
                  {202: accepted, 401: None, 404: None, 409: None}, path_id=id_doc, idempotent=True,
                  example={"address": {**EXAMPLE, "server_id": None},
                           "job": {**job_ref, "kind": ADDRESS_UNASSIGN}}),
    ]


class AddressFilters(BaseModel):
    """``GET /v1/addresses`` filters."""

    model_config = ConfigDict(extra="forbid")

    region: StrictStr | None = Field(None, min_length=1, max_length=63, description="only addresses of this region")
    server_id: StrictStr | None = Field(None, pattern=SERVER_ID, description="only addresses on this server")


async def list_rows(db: Any, tenant_id: str, filters: AddressFilters, *, after: str | None, status: str | None,
                    limit: int, name: str | None = None, selector: Any = None,
                    include_deleted: bool = True) -> list[Address]:
    return await address_store.address_list(db, tenant_id, after=after, status=status, region=filters.region,
                                    server_id=filters.server_id, limit=limit, name=name, selector=selector,
                                    include_deleted=include_deleted)


API = ApiResource(rtype=ADDRESS, create_model=AddressCreate, public_model=AddressOut, create=create,
                  example=EXAMPLE, transactional=True, actions=_operations, list_filters=AddressFilters, list_rows=list_rows,
                  tag_description="Public addresses from the region's pools: floating ones move between "
                                  "servers; a server's primary one is its cloud-init ipconfig0.")
