"""The ``server`` type's API registration: its create hook (server and ServerCreate job in one
statement) and image check; the five routes are the generic ones (:mod:`z9.api.resources`)."""
from __future__ import annotations

import math
from typing import Any

from z9 import resources
from z9.common import store
from z9.common.errors import Conflict, UniqueViolation, ValidationFailed, deleting
from z9.resources.address.model import Address
from z9.resources.server.model import Server
from z9.resources.address import ADDRESS
from z9.resources.server import SERVER
from z9.common.settings import Settings
from z9.common.store import NewJob

from z9.api import quotas, schemas
from z9.resources.address import api as addresses
from z9.resources.server import api_actions as server_actions
from z9.api.resources import ApiResource, CreateContext
from z9.resources.address import store as address_store
from z9.resources.server import store as server_store
from z9.resources.address import ADDRESS_ASSIGN
from z9.resources.server import SERVER_CREATE

EXAMPLE: dict[str, Any] = {
    "id": "srv_01jd3x5v8q2m6n4p7r9s1t3w5y", "name": "web-1", "region": "dev-1", "image": "debian-12",
    "cores": 2, "memory_mib": 2048, "disk_gib": 20,
    "ssh_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIMQ+ctuWvPKZcSiB0avvBJbVNptRfvJ+8krZNKKKLvo alice@example"], "labels": {"env": "prod"},
    "status": "creating", "status_reason": None,
    "observed": {"vmid": None, "node": None, "power_state": None, "at": None},
    "public_ipv4": {"id": "adr_01jd3x5v8q2m6n4p7r9s1t3w60", "ip": "203.0.113.10"},
    "delete_after": None, "created_at": "2026-12-01T04:00:00Z", "updated_at": "2026-12-01T04:00:00Z",
    "deleted_at": None,
}


def check(settings: Settings, spec: schemas.ServerCreate) -> None:
    """422 when the image is not offered in the region, or its disk is larger than ``disk_gib``
    (the region's ``image_disk_gib``: a disk cannot shrink, the create would fail in its job)."""
    region = settings.regions[spec.region]
    if region.images and spec.image not in region.images:
        raise ValidationFailed(f"image: {spec.image!r} is not offered in region {spec.region} "
                               f"(offered: {', '.join(region.images)})",
                               details=[{"field": "image", "message": "unknown image"}])
    size = region.image_disk_gib.get(spec.image)
    if size is not None and spec.disk_gib < size:
        raise ValidationFailed(f"disk_gib: {spec.disk_gib} GiB is smaller than image {spec.image!r}'s disk ({size:g} GiB); "
                               f"disks cannot shrink: ask for at least {math.ceil(size)}",
                               details=[{"field": "disk_gib", "message": f"at least {math.ceil(size)} (the image's disk)"}])


async def create(ctx: CreateContext, spec: schemas.ServerCreate) -> tuple[Server, dict[str, Any]]:
    """The server and its ServerCreate job, in one statement; with ``public_ipv4``, in the same
    transaction, its primary address (the lowest free IP of the region's pool, or the address
    given) and the AddressAssign job that puts it in the VM's IP filter set once ServerCreate has
    made the VM (its lock keys hold the server: it runs after the create); the answer's ``jobs``
    names both (the server is reachable at its address when both have succeeded). ServerCreate's
    configure step writes the address as cloud-init ``ipconfig0`` (+ the pool's nameservers, else the region's)."""
    args = spec.model_dump(exclude={"public_ipv4", "networks", "labels"})
    region_ns = ctx.settings.regions[spec.region].guest_nameservers()
    if region_ns:  # the guest's DNS (a private network's own nameservers, or a pool's, take its place)
        args["nameserver"] = " ".join(region_ns)
    job = NewJob(kind=SERVER_CREATE, region=spec.region, args=args, max_attempts=ctx.settings.max_attempts)
    await quotas.check(ctx.conn, ctx.settings, ctx.tenant_id, servers=1, cores=spec.cores, memory_mib=spec.memory_mib,
                       addresses=1 if spec.public_ipv4 is True else 0)
    if spec.public_ipv4 is False:
        server, brief = await _insert(ctx, spec, job)
        return server, brief
    async with ctx.conn.transaction():  # (a savepoint when the handler's transaction is open)
        server, brief = await _insert(ctx, spec, job)
        address = await _primary(ctx, spec, server)
        network = {"ipconfig0": address.ipconfig0()}
        nameservers = ctx.settings.regions[spec.region].guest_nameservers(
            await address_store.address_pool_nameservers(ctx.conn, address.pool_id))
        if nameservers:
            network["nameserver"] = " ".join(nameservers)
        await store.job_args_merge(ctx.conn, brief["id"], network)
        assign = await store.job_insert(ctx.conn, ADDRESS.new_job(
            address, ADDRESS_ASSIGN, args={"server_id": server.id}, extra_lock_keys=(server.id,),
            max_attempts=ctx.settings.max_attempts), notify=False)
        ctx.more_jobs.append(assign.brief())  # the answer's jobs: done when both have succeeded
        server = await SERVER.get(ctx.conn, server.id)
    return server, brief


async def _insert(ctx: CreateContext, spec: schemas.ServerCreate, job: NewJob) -> tuple[Server, dict[str, Any]]:
    try:
        server, brief = await server_store.server_insert_with_job(
            ctx.conn, tenant_id=ctx.tenant_id, region=spec.region, name=spec.name, image=spec.image,
            cores=spec.cores, memory_mib=spec.memory_mib, disk_gib=spec.disk_gib, ssh_keys=spec.ssh_keys, job=job)
        if spec.labels:  # (the create's own transaction: its hooks run after this, on the labelled row)
            labelled = await server_store.server_patch(ctx.conn, server.id, ctx.tenant_id, name=None,
                                                       labels=dict(spec.labels))
            server = labelled or server
        return server, brief
    except UniqueViolation as e:
        if e.constraint != "servers_tenant_name_live":
            raise
        raise Conflict(f"a server named {spec.name!r} already exists in this tenant; "
                       "choose another name or delete that server first", code="uniqueness_error")


async def _primary(ctx: CreateContext, spec: schemas.ServerCreate, server: Server) -> Address:
    """The server's primary IPv4 address: allocated now, or the unassigned address given."""
    if spec.public_ipv4 is True:
        pool = await addresses.pick_pool(ctx.conn, ctx.settings, spec.region, 4, None)
        got = await address_store.address_allocate(ctx.conn, pool_id=pool["id"], tenant_id=ctx.tenant_id, kind="primary",
                                           auto_delete=True, server_id=server.id)
        if got is None:
            raise addresses.exhausted(pool)
        return got
    aid = str(spec.public_ipv4)
    got = await address_store.address_get_for_update(ctx.conn, aid, ctx.tenant_id)
    if got is None:
        raise ValidationFailed(f"public_ipv4: no address {aid!r}",
                               details=[{"field": "public_ipv4", "message": "unknown address"}])
    await addresses.refuse_owned(ctx.conn, got)
    if got.region != spec.region:
        raise Conflict(f"address {aid} is in region {got.region}, the server in {spec.region}",
                       code="region_mismatch")
    if got.family != 4:
        raise ValidationFailed(f"public_ipv4: address {aid} is IPv{got.family}",
                               details=[{"field": "public_ipv4", "message": "not an IPv4 address"}])
    if got.status not in ("creating", "active"):
        raise Conflict(f"address {aid} is {got.status}", **deleting("address", aid, got.status))
    if got.server_id is not None:
        raise Conflict(f"address {aid} is assigned to server {got.server_id}; unassign it first",
                       code="address_already_assigned")
    made = await address_store.address_make_primary(ctx.conn, aid, server.id)
    assert made is not None
    return made


API = ApiResource(rtype=SERVER, create_model=schemas.ServerCreate, public_model=schemas.Server,
                  create=create, check=check, example=EXAMPLE, transactional=True, actions=server_actions.operations)
