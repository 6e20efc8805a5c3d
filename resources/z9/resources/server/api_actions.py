"""A server's own routes: power actions, resize and PATCH (name, labels).

Every action is a job on the server (its four phases in ``services/executor/z9/executor/jobs``), enqueued in
the request's transaction after the server row was locked (``FOR UPDATE``): checks, the row's
new intent (sizes) and the job commit together; an Idempotency-Key replays the answer.

- ``start`` → ServerStart; ``shutdown`` → ServerStop (ACPI, forced off after its timeout);
  ``poweroff`` → ServerStop ``mode=poweroff`` (hard stop at once); ``reboot`` → ServerReboot
  (the VM has booted since the request: a re-run plans nothing).
- ``resize`` → ServerResize. Proxmox's default ``hotplug`` (``network,disk,usb``) takes neither
  CPU nor memory on a running VM (the change would stay *pending* until a cold boot), so a
  cores/memory change on a server not stopped is 409 ``server_not_stopped``; the disk grows
  online; it never shrinks (422). The new sizes count against the tenant's quotas.
- ``PATCH`` name/labels: database only (the VM's Proxmox name is not the server's name after
  a create: z9 finds VMs by tag, never by name).
"""
from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator, model_validator

from z9 import resources
from z9.common import store
from z9.common.errors import Conflict, NotFound, UniqueViolation, ValidationFailed, deleting
from z9.resources.server.model import Server
from z9.resources.server import SERVER
from z9.common.settings import Settings

from z9.api import quotas, schemas
from z9.api.resources import NOTIFIER, POOL, SETTINGS, ApiResource, action_transaction, Operation, dump, parse_body, path_id, tenant
from z9.resources.server import store as server_store
from z9.resources.server import SERVER_CREATE, SERVER_REBOOT, SERVER_RESIZE, SERVER_START, SERVER_STOP

LIVE = ("creating", "running", "stopped", "failed")


class ServerResize(BaseModel):
    """``POST /v1/servers/{id}/actions/resize``: the new sizes (at least one)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "examples": [{"cores": 4, "memory_mib": 8192}], **schemas.at_least_one("cores", "memory_mib", "disk_gib")})

    # left out: unchanged; never null (the document has no null type for them)
    cores: StrictInt = Field(None, ge=1, le=64, json_schema_extra=schemas.left_out)  # type: ignore[assignment]
    memory_mib: StrictInt = Field(None, ge=512, le=1048576, json_schema_extra=schemas.left_out)  # type: ignore[assignment]
    disk_gib: StrictInt = Field(None, ge=1, le=16384, description="grow only: disks never shrink",  # type: ignore[assignment]
                                json_schema_extra=schemas.left_out)

    _no_null = field_validator("cores", "memory_mib", "disk_gib", mode="before")(schemas.no_null)

    @model_validator(mode="after")
    def _some(self) -> "ServerResize":
        if self.cores is None and self.memory_mib is None and self.disk_gib is None:
            raise ValueError("give at least one of cores, memory_mib, disk_gib")
        return self


class ServerPatch(BaseModel):
    """``PATCH /v1/servers/{id}``: a new name and/or labels (replacing all labels)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"name": "web-2",
                                                                               "labels": {"env": "prod"}}]})

    name: StrictStr | None = Field(None, pattern=schemas.NAME_PATTERN, description="DNS label, lower case, 1-63 chars")
    labels: schemas.Labels | None = None


POWER: dict[str, tuple[str, dict[str, Any], str]] = {
    # action: (kind, args, summary)
    "start": (SERVER_START, {}, "Power a server on"),
    "shutdown": (SERVER_STOP, {"mode": "shutdown"},
                 "Shut a server down (ACPI, forced off after 60 s)"),
    "poweroff": (SERVER_STOP, {"mode": "poweroff"}, "Power a server off at once (hard stop)"),
    "reboot": (SERVER_REBOOT, {}, "Reboot a server (ACPI; a stopped one is started)"),
}


def _require_live(server: Server) -> None:
    if server.status not in LIVE:
        raise Conflict(f"server {server.id} is {server.status}; cancel the deletion first"
                       if server.status == "deleting" else f"server {server.id} is {server.status}",
                       **deleting("server", server.id, server.status))


def _require_stopped(server: Server, what: str) -> None:
    if server.status != "stopped" or server.power_state != "stopped":
        raise Conflict(f"server {server.id} is not stopped (status {server.status}): {what} needs it stopped — "
                       "Proxmox does not hot-plug CPU or memory by default; shut it down first",
                       code="server_not_stopped")


def operations(api: ApiResource) -> list[Operation]:
    accepted, one = api.models["accepted"], api.models["one"]
    id_doc = "the server's id (srv_…)"
    job_ref = {"id": "job_01jd3x5v8q2m6n4p7r9s1t3w5y", "status": "pending"}

    async def _action(request: web.Request, route: str, body: Any, fn: Any) -> web.Response:
        async def change(conn: Any, settings: Settings, tenant_id: str, rid: str) -> Any:
            server = await server_store.server_get_for_update(conn, rid, tenant_id)
            if server is None:
                raise NotFound(f"no server {rid!r}")
            _require_live(server)
            row, kind, args = await fn(conn, settings, tenant_id, server)
            return row, kind, args, ()

        return await action_transaction(request, SERVER, route, body, change, accepted=accepted, reread=True)

    def power(action: str) -> Any:
        kind, args, _ = POWER[action]

        async def handler(request: web.Request) -> web.Response:
            async def fn(conn: Any, settings: Settings, tenant_id: str, server: Server) -> Any:
                if server.status == "creating":
                    raise Conflict(f"server {server.id} is still being created; wait for its ServerCreate",
                                   code="server_creating")
                return server, kind, dict(args)

            return await _action(request, f"POST /servers/{{id}}/actions/{action}", None, fn)

        return handler

    async def resize(request: web.Request) -> web.Response:
        spec = await parse_body(request, ServerResize)

        async def fn(conn: Any, settings: Settings, tenant_id: str, server: Server) -> Any:
            cores = spec.cores if spec.cores is not None else server.cores
            memory = spec.memory_mib if spec.memory_mib is not None else server.memory_mib
            disk = spec.disk_gib if spec.disk_gib is not None else server.disk_gib
            if disk < server.disk_gib:
                raise ValidationFailed(f"disk_gib: {disk} is smaller than the disk ({server.disk_gib} GiB); disks "
                                       "cannot shrink", details=[{"field": "disk_gib", "message": "cannot shrink"}])
            if server.status == "creating":
                raise Conflict(f"server {server.id} is still being created; wait for its ServerCreate",
                               code="server_creating")
            # a failed create has no VM to resize: the fix is its create, at the new sizes
            never_made = server.status == "failed" and await store.resource_create_failed(
                conn, server.id, SERVER_CREATE)
            if (cores, memory) != (server.cores, server.memory_mib) and not never_made:
                _require_stopped(server, "changing cores or memory")
            await quotas.check(conn, settings, tenant_id, cores=cores - server.cores,
                               memory_mib=memory - server.memory_mib)
            row = await server_store.server_set_sizes(conn, server.id, cores=cores, memory_mib=memory, disk_gib=disk)
            if never_made:  # the request's network (cloud-init ipconfig0) kept, the rest the row's intent
                asked = await store.resource_latest_job_args(conn, server.id, SERVER_CREATE) or {}
                return row, SERVER_CREATE, SERVER.intent(row, SERVER_CREATE, dict(asked))  # type: ignore[misc]
            return row, SERVER_RESIZE, {"cores": cores, "memory_mib": memory, "disk_gib": disk}

        return await _action(request, "POST /servers/{id}/actions/resize", spec.model_dump(), fn)

    async def patch(request: web.Request) -> web.Response:
        spec = await parse_body(request, ServerPatch)
        pool, tenant_id = request.app[POOL], tenant(request)
        rid = path_id(request, "srv", "server")
        more: list[Any] = []
        try:
            async with pool.acquire() as conn, conn.transaction():
                row = await server_store.server_patch(conn, rid, tenant_id, name=spec.name, labels=spec.labels)
                if row is not None and spec.labels is not None:
                    # types reacting to the new labels (a firewall's selector), in this transaction
                    more = await resources.relabel_dependents(conn, "server", row, request.app[SETTINGS])
        except UniqueViolation as e:
            if e.constraint != "servers_tenant_name_live":
                raise
            raise Conflict(f"a server named {spec.name!r} already exists in this tenant", code="uniqueness_error")
        if row is None:
            if await server_store.server_get(pool, rid, tenant_id) is None:
                raise NotFound(f"no server {rid!r}")
            raise Conflict(f"server {rid} is deleted; it cannot be changed", **deleting("server", rid, "deleted"))
        row = await SERVER.get(pool, rid, tenant_id)
        if more:
            request.app[NOTIFIER].notify(more[0].region)
        return web.json_response(dump(one, {"server": row.public()}))

    errors: dict[int, Any] = {400: None, 401: None, 403: None, 404: None, 409: None, 422: None, 429: None}
    ops = [Operation("POST", f"/servers/{{id}}/actions/{action}", power(action), f"{action}Server", summary,
                     "servers", {202: accepted, **errors}, path_id=id_doc, idempotent=True,
                     example={"server": {**api.example, "status": "running"}, "job": {**job_ref, "kind": kind}})
           for action, (kind, _, summary) in POWER.items()]
    ops += [
        Operation("POST", "/servers/{id}/actions/resize", resize, "resizeServer",
                  "Change a server's cores or memory (stopped) or grow its disk", "servers",
                  {202: accepted, **errors}, request=ServerResize, path_id=id_doc, idempotent=True,
                  example={"server": {**api.example, "status": "stopped", "cores": 4, "memory_mib": 8192},
                           "job": {**job_ref, "kind": SERVER_RESIZE}}),
        Operation("PATCH", "/servers/{id}", patch, "updateServer", "Rename a server or set its labels", "servers",
                  {200: one, **errors}, request=ServerPatch, path_id=id_doc,
                  example={"server": {**api.example, "name": "web-2", "labels": {"env": "prod"}}}),
    ]
    return ops
