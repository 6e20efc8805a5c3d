"""What the volume's job kinds — VolumeCreate, VolumeAttach, VolumeDetach, VolumeResize, VolumeDelete (one
module each beside this one) — share: one reconciler (:mod:`z9.resources.volume.jobs.reconcile`): the intent is the row (size, the server it is meant for,
or the final delete), so every kind converges the world to it and the kinds differ only in what they
are for (the request that made them) and in VolumeDelete's ``destroying`` check.

observe  the anchor VM (by ``z9-id-<vol>``/``z9-member-volume``), the VM holding the disk (by its drive
         serial: the anchor, the server it is meant for, a server it was last seen on), the target
         server's VM (by its tag), and what earlier attempts recorded (the job's memo: a create's
         vmid, the volids it unplugged).
plan     (pure) :func:`z9.resources.volume.jobs.reconcile.plan`.
apply    :func:`z9.resources.volume.jobs.reconcile.apply_step`: each step observes again and acts only if needed.
verify   observe again: the plan must be empty; records where the disk is (``attached``/``available``).
"""
from __future__ import annotations

from typing import Any

import asyncpg

from z9.common.errors import TemporaryError
from z9.common.models import Job
from z9.executor import vms
from z9.executor.context import JobContext, Step
from z9.resources.volume.pve import ProxmoxDisks
from z9.resources import volume as vol
from z9.resources.volume import VOLUME

from . import reconcile as rec


def intent_of(row: vol.Volume, kind: str) -> rec.VolumeIntent:
    return rec.VolumeIntent(row.id, row.name, row.size_gib, row.storage, server_id=row.server_id,
                            delete=kind == vol.VOLUME_DELETE,
                            had_disk=bool(row.observed and row.observed.get("volid")),
                            # the volid a verify last saw: a bare unusedN of it is the volume's disk (after an
                            # unplug whose job failed before the reassign, or a drive unplugged by hand)
                            last_volid=(row.observed or {}).get("volid"))


def known_servers(row: vol.Volume, job: Job) -> list[str]:
    obs = row.observed or {}
    return [s for s in (obs.get("server_id"), row.server_before_delete, job.args.get("from"),
                        job.args.get("server_id")) if s]


class World:
    def __init__(self, row: vol.Volume | None, intent: rec.VolumeIntent | None, world: rec.VolumeWorld | None,
                 superseded: str | None = None):
        self.row, self.intent, self.world, self.superseded = row, intent, world, superseded


def _env(ctx: JobContext, row: vol.Volume, intent: rec.VolumeIntent) -> rec.StepEnv:
    ops = ProxmoxDisks(ctx.pve)

    async def record(step: Step, **detail: Any) -> None:
        await ctx.step_detail(step, **detail)
        seen = list(ctx.memo.get("seen", [])) + [{"name": step.name, "detail": dict(detail)}]
        await ctx.remember(seen=seen[-20:])

    return rec.StepEnv(ops, lambda: _observe(ctx, row, intent), ctx.wait_task, ctx.fence, record, ctx.pve.nodes)


async def _observe(ctx: JobContext, row: vol.Volume, intent: rec.VolumeIntent) -> rec.VolumeWorld:
    async def anchor(owner: str) -> Any:
        return await vms.find_one_vm(ctx, owner, rec.ANCHOR_MEMBER)

    async def server(owner: str) -> Any:
        return await vms.find_one_vm(ctx, owner)

    return await rec.observe(ProxmoxDisks(ctx.pve), intent, find_anchor=anchor, find_server=server,
                             known_servers=known_servers(row, ctx.job), last_steps=list(ctx.memo.get("seen", [])))


class VolumeKind:
    """One job kind of the volume type (every phase shared; see the module docstring)."""

    def __init__(self, kind: str):
        self.kind = kind

    async def observe(self, ctx: JobContext) -> World:
        row = await vol.get(ctx.pool, ctx.job.resource_id or "")
        if row is None or row.status == "deleted":
            return World(row, None, None, superseded="gone")
        if self.kind == vol.VOLUME_DELETE and row.status != "destroying":
            return World(row, None, None, superseded=row.status)  # a cancelled or repeated deletion
        intent = intent_of(row, self.kind)
        return World(row, intent, await _observe(ctx, row, intent))

    def plan(self, job: Job, world: World) -> list[Step]:
        if world.superseded or world.intent is None or world.world is None:
            return []
        return rec.plan(world.intent, world.world)

    async def apply(self, ctx: JobContext, world: World, step: Step) -> None:
        assert world.row is not None and world.intent is not None
        await rec.apply_step(_env(ctx, world.row, world.intent), world.intent, step)

    async def verify(self, ctx: JobContext) -> dict[str, Any] | None:
        row = await vol.get(ctx.pool, ctx.job.resource_id or "")
        if row is None or row.status == "deleted" or (self.kind == vol.VOLUME_DELETE and row.status != "destroying"):
            return None
        intent = intent_of(row, self.kind)
        w = await _observe(ctx, row, intent)
        left = rec.plan(intent, w)
        if left:
            raise TemporaryError("verify: the volume is not there yet; still to do: " + ", ".join(s.name for s in left))
        return rec.observed(intent, w)

    async def record(self, conn: asyncpg.Connection, ctx: JobContext, observed: dict[str, Any] | None) -> None:
        rid = ctx.job.resource_id or ""
        if self.kind == vol.VOLUME_DELETE:
            if observed is not None:  # verify saw it gone (None: superseded, nothing done)
                await VOLUME.deleted(conn, rid)
            return
        if observed is None:
            return
        status = "attached" if observed.get("server_id") else "available"
        await vol.observed(conn, rid, observed, status=status,
                           from_statuses=("creating", "available", "attached", "failed"))

    async def record_failure(self, conn: Any, ctx: JobContext, error: dict[str, Any]) -> None:
        await VOLUME.mark_failed_by_job(conn, ctx.job.resource_id or "", error["message"], kind=ctx.job.kind,
                                        refused=bool(error.get("refused")))



def phases(kind: str) -> VolumeKind:
    """The phases of ``kind`` (each kind's module binds them to its names)."""
    return VolumeKind(kind)
