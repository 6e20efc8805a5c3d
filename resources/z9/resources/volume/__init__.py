"""The ``volume`` resource type: block storage of a region that a tenant attaches to at most one server
of that region at a time, grows online and deletes in two phases (detached at once during the
buffer — VolumeDetach —, destroyed at its end — VolumeDelete —; a cancellation attaches it back to the
server it was on). Its slice is this folder (``resources/z9/resources/volume/``): the type, its row model, its kind
names (its row model in ``model.py``), its SQL in ``queries.sql`` and its store functions in ``store.py``; its API operations in ``api.py``, its job
kinds in ``jobs/`` (one module per kind; the reconciler they share in ``jobs/reconcile.py``), its client
commands in ``client.py``; its table is ``db/z9/db/migrations/0018_volumes.sql``.

A server's final delete detaches the volumes still meant for it (:func:`server_deleted`, a hook the
registry runs in that transaction); ``DELETE /v1/servers/{id}?delete_volumes=true`` deletes them with
it instead (the API starts their deletions).
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from z9.resources import (Buffered, PlanOf, QuotaUnit, QuotaUsage, ResourceType, VmParts, on_deletion, on_final_delete, on_restore,
                          register)
from z9.resources.volume.model import Volume, serial_of  # noqa: F401  (serial_of: the slice's public name)
from z9.resources.volume.guard import recorded_disks, volume_disk

STATUSES = ("creating", "available", "attached", "deleting", "destroying", "deleted", "failed")

# the kind names (the jobs' ``kind`` column): the type's own, named here and nowhere else
VOLUME_CREATE = "VolumeCreate"
VOLUME_ATTACH = "VolumeAttach"
VOLUME_DETACH = "VolumeDetach"
VOLUME_RESIZE = "VolumeResize"
VOLUME_DELETE = "VolumeDelete"


def restore(v: Volume) -> tuple[str, dict[str, Any]]:
    """What a cancelled deletion gives back: the attachment the volume had (the table put the server
    back into ``server_id``), or none."""
    if v.server_id:
        return VOLUME_ATTACH, {"server_id": v.server_id}
    return VOLUME_DETACH, {}


async def lock_server_first(conn: Any, volume_id: str, tenant_id: str) -> None:
    """A cancelled deletion gives the volume back to the server it was on unless that server is being
    deleted (the table's trigger reads its status): that server's row is locked first (FOR UPDATE, the
    order an attach takes), so a DELETE of it in flight is waited for — the trigger then sees it deleting
    — and one arriving later waits for this and finds the volume meant for it (its hook detaches it)."""
    from z9.resources.server import store as server_store

    row = await get(conn, volume_id, tenant_id)
    if row is not None and row.server_before_delete:
        await server_store.server_get_for_update(conn, row.server_before_delete, tenant_id)


def lock_keys(v: Volume) -> tuple[str, ...]:
    """The servers a volume job touches: the one it is meant for, and during a deletion the one it was
    on — its jobs are ordered with those servers' own (a server's delete waits for an attach)."""
    keys = [v.server_id]
    if v.status in ("deleting", "destroying"):
        keys.append(v.server_before_delete)
    return tuple(k for k in keys if k)


def stale(v: Volume, kind: str, args: dict[str, Any]) -> str | None:
    if kind not in (VOLUME_ATTACH, VOLUME_DETACH):
        return None
    meant = args.get("server_id") if kind == VOLUME_ATTACH else None
    if v.server_id == meant:
        return None
    return (f"volume {v.id} is meant for {('server ' + v.server_id) if v.server_id else 'no server'} since a later "
            f"request; attach or detach it again instead")


async def plan_of(db: Any, v: Volume) -> PlanOf:
    """A plan of a volume previews its reconciler as an attach (meant for a server) or a detach: every
    kind of the volume converges the world to its row (the server it is meant for, its size)."""
    if v.server_id:
        return PlanOf(VOLUME_ATTACH, {"server_id": v.server_id})
    return PlanOf(VOLUME_DETACH, {})


VOLUME: ResourceType[Volume] = register(ResourceType(
    name="volume", prefix="vol", table="volumes", model=Volume,
    kinds=(VOLUME_CREATE, VOLUME_ATTACH, VOLUME_DETACH, VOLUME_RESIZE, VOLUME_DELETE),
    deletion=Buffered(first_kind=VOLUME_DETACH, final_kind=VOLUME_DELETE),
    statuses=STATUSES, restore=restore, lock_keys=lock_keys, stale=stale, order=50, plan_of=plan_of,
    quotas=(QuotaUnit("volume_gib", "GiB of volumes", example=(1000, 50)),),
    quota_usage=QuotaUsage("volume_quota_usage", {"volume_gib": "volumes' sizes (GiB)"}),
    # its disk, on whatever VM it is (found by serial, and by every volid z9 recorded for it): kept by every
    # convergence, never destroyed with the VM
    vm_parts=VmParts(config_value=volume_disk, recorded=recorded_disks, outlives_vm=True), lock_before_restore=lock_server_first,
    pve_endpoints=("POST /nodes/{node}/qemu", "POST /nodes/{node}/qemu/{vmid}/move_disk"),
))


# ---------------------------------------------------------------- store (store.py, queries.sql)

from z9.resources.volume import store  # noqa: E402  (the slice's store needs the type above)
from z9.resources.volume.store import (  # noqa: E402
    get, get_for_update, insert, list_rows, observed, of_server, patch, set_server, set_size)


# ---------------------------------------------------------------- a server's final delete

async def server_deleted(conn: Any, server_id: str, max_attempts: int = 10) -> list[Any]:
    """A server is deleted for good: the volumes still meant for it are meant for none (their disks
    were taken off its VM before it was destroyed — the server's delete job detaches them first — and
    a VolumeDetach makes sure of it and records them ``available``)."""
    jobs = []
    for v in await of_server(conn, server_id):
        row = await set_server(conn, v.id, None)
        if row is not None:
            jobs.append(VOLUME.new_job(row, VOLUME_DETACH, args={}, max_attempts=max_attempts,
                                       extra_lock_keys=(server_id,)))
    return jobs


on_final_delete("server", server_deleted)


async def server_deleting(conn: Any, server: Any, options: Any, settings: Any) -> list[Any]:
    """A server's deletion starts (``DELETE /v1/servers/{id}``): each volume meant for it is detached
    now — never destroyed with the server's VM (qemu-server's destroy_vm frees every disk the VM owns,
    and an attached volume's is) — and stays ``available``; with ``?delete_volumes=true`` their own
    deletions start instead (two-phase: detached now, destroyed when their buffer ends). The jobs hold
    the server as a lock key: they run after its ServerStop and before its final ServerDelete."""
    given = {k: v for k, v in (options or {}).items() if k in ServerDeleteOptions.model_fields}
    delete_volumes = ServerDeleteOptions.model_validate(given).delete_volumes  # the API validated it first
    jobs = []
    # a volume meant for none whose disk was last seen on this server (its own detach failed part-way: a
    # bare unusedN there) is taken off it too — the server's destroy waits for it (the deletion guard)
    for v in await store.last_seen_on(conn, server.id):
        jobs.append(VOLUME.new_job(v, VOLUME_DETACH, args={}, max_attempts=settings.max_attempts,
                                   extra_lock_keys=(server.id,)))
    for v in await of_server(conn, server.id):
        if delete_volumes:
            row = await VOLUME.mark_deleting(conn, v.id, v.tenant_id, settings.deletion_buffer_s)
            kind, args = VOLUME_DETACH, {"from": server.id}
        else:
            row = await set_server(conn, v.id, None)
            kind, args = VOLUME_DETACH, {"from": server.id}
        if row is not None:
            jobs.append(VOLUME.new_job(row, kind, args=args, max_attempts=settings.max_attempts,
                                       extra_lock_keys=(server.id,)))
    return jobs


async def server_restored(conn: Any, server: Any, settings: Any) -> list[Any]:
    """A server's deletion is cancelled (``POST /v1/servers/{id}/actions/cancel-deletion``): the volumes
    its deletion detached, and that nothing has changed since (attached elsewhere, deleted), are meant
    for it again and attached back, after its restore job (the server as a lock key). Volumes deleted
    with it (``?delete_volumes=true``) stay in their own buffers: cancelling theirs attaches them back."""
    jobs = []
    for v in await store.detached_by_deletion_of(conn, server.id, server.tenant_id, VOLUME_DETACH):
        row = await set_server(conn, v.id, server.id)
        if row is not None:
            jobs.append(VOLUME.new_job(row, VOLUME_ATTACH, args={"server_id": server.id},
                                       max_attempts=settings.max_attempts, extra_lock_keys=(server.id,)))
    return jobs


class ServerDeleteOptions(BaseModel):
    """``DELETE /v1/servers/{id}`` query parameters (declared by the volume type)."""

    model_config = ConfigDict(extra="forbid")

    delete_volumes: bool = Field(False, description="delete the volumes attached to the server with it (two-phase: "
                                                    "detached now, destroyed when their own buffer ends); by "
                                                    "default they are detached and stay, available")


on_deletion("server", server_deleting, ServerDeleteOptions)
on_restore("server", server_restored)
