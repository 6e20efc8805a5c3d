"""The ``volume`` type's API registration: the create hook (the row and its VolumeCreate in one
transaction, after the ``volume_gib`` quota), and the type's own routes — ``PATCH``,
``actions/attach``, ``actions/detach``, ``actions/resize``. List, get, delete (two-phase: detached at
once, attached back on cancel) and cancel-deletion are the generic ones (:mod:`z9.api.resources`).

Refusals, each naming the field or the precondition: 422 ``size_gib`` (above the region's
``volume_max_gib``, or not larger than the current size on a resize: volumes never shrink), 422
``server_id`` (no such server of the tenant), 409 ``uniqueness_error`` (a name in use),
``region_mismatch`` (a volume attaches only to a server of its region), ``volume_already_attached``
(at most one server at a time: detach first), ``volume_not_attached``, ``resource_deleting`` (the
volume or the server), 403 ``quota_exceeded`` (``volume_gib``).
"""
from __future__ import annotations

from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, model_validator

from z9.common import store
from z9.common.errors import Conflict, NotFound, UniqueViolation, ValidationFailed, deleting
from z9.common.ids import new_id
from z9.resources.server.model import Server
from z9.resources import volume as vol
from z9.resources.server import store as server_store
from z9.resources.volume import VOLUME, Volume
from z9.common.settings import Settings

from z9.api import quotas, schemas
from z9.api.resources import (NOTIFIER, POOL, SETTINGS, ApiResource, CreateContext, Operation, dump, idempotency_begin,
                        idempotency_end, idempotency_key, parse_body, path_id, request_hash, room_for_a_job, tenant)

SERVER_ID = r"^srv_[0-9a-z]{26}$"
STATUSES = Literal["creating", "available", "attached", "deleting", "destroying", "deleted", "failed"]


class VolumeCreate(BaseModel):
    """``POST /v1/volumes``: a disk of ``size_gib`` GiB on the region's volume storage, attached at once
    to ``server_id`` when given (a running server takes it hot-plugged)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"name": "data", "region": "dev-1", "size_gib": 10}]})

    name: StrictStr = Field(pattern=schemas.NAME_PATTERN, description="DNS label, lower case, 1-63 chars")
    region: StrictStr = Field(min_length=1, max_length=63)
    size_gib: StrictInt = Field(ge=1, le=65536, description="GiB; at most the region's volume_max_gib")
    server_id: StrictStr | None = Field(None, pattern=SERVER_ID, description="attach it to this server at once")
    labels: schemas.Labels | None = None


class VolumePatch(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1, "examples": [{"name": "db"}]})

    name: StrictStr | None = Field(None, pattern=schemas.NAME_PATTERN)
    labels: schemas.Labels | None = None

    @model_validator(mode="after")
    def _something(self) -> "VolumePatch":
        if not self.model_fields_set:
            raise ValueError("give at least one of name, labels")
        return self


class VolumeAttach(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"server_id": "srv_01jd3x5v8q2m6n4p7r9s1t3w5y"}]})

    server_id: StrictStr = Field(pattern=SERVER_ID)


class VolumeResize(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"size_gib": 20}]})

    size_gib: StrictInt = Field(ge=1, le=65536, description="the new size, GiB: larger than the current one")


class VolumeAnchor(schemas.Response):
    vmid: int
    node: str


class VolumeObserved(schemas.Response):
    """What the last job saw: the VM holding the disk (found by the drive's serial), its key and size."""

    anchor: VolumeAnchor | None = Field(description="the stopped VM holding the disk while it is detached")
    server_id: str | None = Field(description="the server whose VM holds the disk; null: detached")
    vmid: int | None
    node: str | None
    disk: str | None = Field(description="the drive key on that VM (scsiN): changes with every attach")
    volid: str | None
    size_gib: float | None
    serial: str = Field(description="the drive's serial: the guest's /dev/disk/by-id/scsi-0QEMU_QEMU_HARDDISK_<serial>")
    device: str
    extra_anchors: list[VolumeAnchor] = Field(
        default_factory=list, description="other VMs carrying the volume's anchor identity (copies made by hand: "
                                          "a clone inherits the tags); z9 keeps the one holding the volume's disk, "
                                          "reports these and never touches them")
    at: schemas.OptTimestamp


class VolumeOut(schemas.Response):
    """A volume (``GET /v1/volumes/{id}``)."""

    id: str = Field(pattern=r"^vol_[0-9a-z]{26}$")
    name: str
    region: str
    size_gib: int
    server_id: str | None = Field(description="the server it is (to be) attached to; null: detached")
    labels: dict[str, str]
    status: STATUSES
    status_reason: str | None
    observed: VolumeObserved | None
    linux_device: str = Field(description="where the guest finds it, whatever its slot")
    delete_after: schemas.OptTimestamp
    created_at: schemas.Timestamp
    updated_at: schemas.Timestamp
    deleted_at: schemas.OptTimestamp


EXAMPLE: dict[str, Any] = {
    "id": "vol_01jd3x5v8q2m6n4p7r9s1t3w5y", "name": "data", "region": "dev-1", "size_gib": 10,
    "server_id": None, "labels": {}, "status": "creating", "status_reason": None, "observed": None,
    "linux_device": "/dev/disk/by-id/scsi-0QEMU_QEMU_HARDDISK_z9x5v8q2m6n4p7r9s1t3w5y",
    "delete_after": None, "created_at": "2026-12-01T04:00:00Z", "updated_at": "2026-12-01T04:00:00Z",
    "deleted_at": None,
}


def _size_limit(settings: Settings, region: str, size: int) -> None:
    most = settings.regions[region].volume_max_gib
    if size > most:
        raise ValidationFailed(f"size_gib: {size} is above the largest volume of region {region} ({most} GiB)",
                               details=[{"field": "size_gib", "message": "above the region's volume_max_gib"}])


def check(settings: Settings, spec: VolumeCreate) -> None:
    _size_limit(settings, spec.region, spec.size_gib)


#: the most volumes one server takes (Hetzner's limit): a VM has 31 SCSI slots (QemuServer/Drive.pm
#: $MAX_SCSI_DISKS), its boot disk in scsi0; refused at the request (409 server_volume_limit) rather than
#: accepted and failed by its job for want of a free slot
MAX_VOLUMES_PER_SERVER = 16


async def _server(conn: Any, tenant_id: str, server_id: str, region: str, volume_id: str = "") -> Server:
    """The server a volume is to be attached to, locked (FOR UPDATE) until the request's transaction ends:
    a DELETE of the server marks it deleting under that lock and then detaches the volumes meant for it,
    so an attach either commits first (and that delete finds it) or sees the server deleting (409)."""
    server = await server_store.server_get_for_update(conn, server_id, tenant_id)
    if server is None:
        raise ValidationFailed(f"server_id: no server {server_id!r}",
                               details=[{"field": "server_id", "message": "unknown server"}])
    if server.region != region:
        raise Conflict(f"server {server.id} is in region {server.region}, the volume in {region}: a volume "
                       "attaches only to a server of its region", code="region_mismatch",
                       details={"kind": "server", "id": server.id, "region": server.region})
    if server.status in ("deleting", "destroying", "deleted"):
        raise Conflict(f"server {server.id} is {server.status}; a volume cannot be attached to it",
                       **deleting("server", server.id, server.status))
    if await vol.store.count_of_server(conn, server.id, volume_id) >= MAX_VOLUMES_PER_SERVER:
        raise Conflict(f"server {server.id} has {MAX_VOLUMES_PER_SERVER} volumes, the most a server takes; "
                       "detach one first", code="server_volume_limit",
                       details={"kind": "server", "id": server.id, "limit": MAX_VOLUMES_PER_SERVER})
    return server


def _unique(e: UniqueViolation, name: str | None) -> Conflict:
    if e.constraint == "volumes_tenant_name_live":
        return Conflict(f"a volume named {name!r} already exists in this tenant", code="uniqueness_error")
    raise e


async def create(ctx: CreateContext, spec: VolumeCreate) -> tuple[Volume, dict[str, Any]]:
    if spec.server_id is not None:  # what the request names is checked (and locked) before the quota is counted
        await _server(ctx.conn, ctx.tenant_id, spec.server_id, spec.region)
    await quotas.check(ctx.conn, ctx.settings, ctx.tenant_id, volume_gib=spec.size_gib)
    try:
        row = await vol.insert(ctx.conn, id=new_id("vol"), tenant_id=ctx.tenant_id, region=spec.region,
                               name=spec.name, size_gib=spec.size_gib,
                               storage=ctx.settings.regions[spec.region].volume_storage,
                               server_id=spec.server_id, labels=dict(spec.labels or {}))
    except UniqueViolation as e:
        raise _unique(e, spec.name)
    job = await store.job_insert(ctx.conn, VOLUME.new_job(row, vol.VOLUME_CREATE,
                                                          args={"server_id": spec.server_id} if spec.server_id else {},
                                                          max_attempts=ctx.settings.max_attempts), notify=False)
    return row, job.brief()


# ---------------------------------------------------------------------------------- actions

def _operations(api: ApiResource) -> list[Operation]:
    accepted, one = api.models["accepted"], api.models["one"]
    id_doc = "the volume's id (vol_…)"
    job_ref = {"id": "job_01jd3x5v8q2m6n4p7r9s1t3w5y", "status": "pending"}

    async def _locked(conn: Any, request: web.Request) -> Volume:
        rid = path_id(request, "vol", "volume")
        row = await vol.get_for_update(conn, rid, tenant(request))
        if row is None:
            raise NotFound(f"no volume {rid!r}")
        if row.status in ("deleting", "destroying", "deleted"):
            raise Conflict(f"volume {row.id} is {row.status}; cancel the deletion first"
                           if row.status == "deleting" else f"volume {row.id} is {row.status}",
                           **deleting("volume", row.id, row.status))
        return row

    async def _action(request: web.Request, route: str, body: Any, fn: Any, server_id: str | None = None) -> web.Response:
        settings, pool, tenant_id = request.app[SETTINGS], request.app[POOL], tenant(request)
        key = idempotency_key(request)
        req_hash = request_hash(route, [request.match_info["id"], body])
        async with pool.acquire() as conn, conn.transaction():
            replay = await idempotency_begin(conn, tenant_id, key, req_hash)
            if replay is not None:
                return replay
            if server_id is not None:
                # the server's row before the volume's, the order a server's DELETE takes them in (it marks
                # the server deleting, then locks the volumes meant for it): no deadlock between the two
                await server_store.server_get_for_update(conn, server_id, tenant_id)
            row0 = await _locked(conn, request)
            row, kind, args, extra = await fn(conn, settings, tenant_id, row0)
            await room_for_a_job(conn, settings, "volume", row.id)
            job = await store.job_insert(conn, VOLUME.new_job(row, kind, args=args, extra_lock_keys=extra,
                                                              max_attempts=settings.max_attempts), notify=False)
            answer = dump(accepted, {"volume": row.public(), "job": job.brief()})
            await idempotency_end(conn, tenant_id, key, req_hash, 202, answer)
        request.app[NOTIFIER].notify(job.region)
        return web.json_response(answer, status=202)

    async def attach(request: web.Request) -> web.Response:
        spec = await parse_body(request, VolumeAttach)

        async def fn(conn: Any, settings: Settings, tenant_id: str, v: Volume) -> Any:
            if v.server_id is not None and not (v.server_id == spec.server_id and v.status == "failed"):
                raise Conflict(f"volume {v.id} is attached to server {v.server_id}: a volume is on at most one "
                               "server at a time; detach it first", code="volume_already_attached",
                               details={"kind": "server", "id": v.server_id})
            server = await _server(conn, tenant_id, spec.server_id, v.region, v.id)
            row = await vol.set_server(conn, v.id, server.id)
            return row, vol.VOLUME_ATTACH, {"server_id": server.id}, (server.id,)

        return await _action(request, "POST /volumes/{id}/actions/attach", spec.model_dump(), fn,
                             server_id=spec.server_id)

    async def detach(request: web.Request) -> web.Response:
        async def fn(conn: Any, settings: Settings, tenant_id: str, v: Volume) -> Any:
            seen_on = (v.observed or {}).get("server_id")
            if v.server_id is None and v.status == "failed" and seen_on:
                # a detach that failed (its disk still on the server it was last seen on): detach it again —
                # after that server's own jobs, unless it is being deleted: its final delete waits for this
                # detach (the deletion guard holds the VM's destroy while the disk is on it), never before it
                seen = await server_store.server_get(conn, seen_on, tenant_id)
                deleting_seen = seen is not None and seen.status in ("deleting", "destroying", "deleted")
                return v, vol.VOLUME_DETACH, {"from": seen_on}, (() if deleting_seen else (seen_on,))
            if v.server_id is None:
                raise Conflict(f"volume {v.id} is not attached to a server", code="volume_not_attached")
            row = await vol.set_server(conn, v.id, None)
            return row, vol.VOLUME_DETACH, {"from": v.server_id}, (v.server_id,)

        return await _action(request, "POST /volumes/{id}/actions/detach", None, fn)

    async def resize(request: web.Request) -> web.Response:
        spec = await parse_body(request, VolumeResize)

        async def fn(conn: Any, settings: Settings, tenant_id: str, v: Volume) -> Any:
            if spec.size_gib <= v.size_gib:
                raise ValidationFailed(f"size_gib: {spec.size_gib} is not larger than the volume's {v.size_gib} GiB: "
                                       "volumes only grow", details=[{"field": "size_gib", "message": (
                                           "already that size" if spec.size_gib == v.size_gib else "cannot shrink")}])
            _size_limit(settings, v.region, spec.size_gib)
            await quotas.check(conn, settings, tenant_id, volume_gib=spec.size_gib - v.size_gib)
            row = await vol.set_size(conn, v.id, spec.size_gib)
            return row, vol.VOLUME_RESIZE, {"size_gib": spec.size_gib}, ()

        return await _action(request, "POST /volumes/{id}/actions/resize", spec.model_dump(), fn)

    async def patch(request: web.Request) -> web.Response:
        spec = await parse_body(request, VolumePatch)
        pool, tenant_id = request.app[POOL], tenant(request)
        rid = path_id(request, "vol", "volume")
        try:
            row = await vol.patch(pool, rid, tenant_id, name=spec.name,
                                  labels=dict(spec.labels) if spec.labels is not None else None)
        except UniqueViolation as e:
            raise _unique(e, spec.name)
        if row is None:
            if await vol.get(pool, rid, tenant_id) is None:
                raise NotFound(f"no volume {rid!r}")
            raise Conflict(f"volume {rid} is deleted; it cannot be changed", **deleting("volume", rid, "deleted"))
        return web.json_response(dump(one, {"volume": row.public()}))

    attached = {**EXAMPLE, "status": "attached", "server_id": "srv_01jd3x5v8q2m6n4p7r9s1t3w5y"}
    return [
        Operation("PATCH", "/volumes/{id}", patch, "updateVolume", "Rename a volume or set its labels (no job)",
                  "volumes", {200: one, 400: None, 401: None, 404: None, 409: None, 422: None}, request=VolumePatch,
                  path_id=id_doc, example={"volume": {**EXAMPLE, "status": "available"}}),
        Operation("POST", "/volumes/{id}/actions/attach", attach, "attachVolume",
                  "Attach a volume to a server of its region (hot-plugged into a running one)", "volumes",
                  {202: accepted, 400: None, 401: None, 404: None, 409: None, 422: None}, request=VolumeAttach,
                  path_id=id_doc, idempotent=True,
                  example={"volume": attached, "job": {**job_ref, "kind": vol.VOLUME_ATTACH}}),
        Operation("POST", "/volumes/{id}/actions/detach", detach, "detachVolume",
                  "Detach a volume from its server (hot-unplugged from a running one)", "volumes",
                  {202: accepted, 401: None, 404: None, 409: None}, path_id=id_doc, idempotent=True,
                  example={"volume": EXAMPLE, "job": {**job_ref, "kind": vol.VOLUME_DETACH}}),
        Operation("POST", "/volumes/{id}/actions/resize", resize, "resizeVolume",
                  "Grow a volume (online: an attached volume grows under the running guest)", "volumes",
                  {202: accepted, 400: None, 401: None, 403: None, 404: None, 409: None, 422: None},
                  request=VolumeResize, path_id=id_doc, idempotent=True,
                  example={"volume": {**attached, "size_gib": 20}, "job": {**job_ref, "kind": vol.VOLUME_RESIZE}}),
    ]


class VolumeFilters(BaseModel):
    """``GET /v1/volumes`` filters."""

    model_config = ConfigDict(extra="forbid")

    region: StrictStr | None = Field(None, min_length=1, max_length=63, description="only volumes of this region")
    server_id: StrictStr | None = Field(None, pattern=SERVER_ID, description="only volumes attached to this server")


async def list_rows(db: Any, tenant_id: str, filters: VolumeFilters, *, after: str | None, status: str | None,
                    limit: int, name: str | None = None, selector: Any = None,
                    include_deleted: bool = True) -> list[Volume]:
    return await vol.list_rows(db, tenant_id, after=after, status=status, limit=limit, name=name, selector=selector,
                               include_deleted=include_deleted, region=filters.region, server_id=filters.server_id)


API = ApiResource(rtype=VOLUME, create_model=VolumeCreate, public_model=VolumeOut, create=create, check=check,
                  example=EXAMPLE, transactional=True, actions=_operations, list_filters=VolumeFilters,
                  list_rows=list_rows,
                  tag_description="Block storage: a disk of a region that attaches to one server at a time, moves "
                                  "between servers without copying, grows online and outlives its servers.")
