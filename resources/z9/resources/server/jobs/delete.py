"""ServerDelete: the final, irreversible step of a two-phase deletion (enqueued by the reaper
when the deletion buffer expires).

observe  every VM carrying ``z9-id-<server id>``; every untagged clone a create job of this
         server made (a vmid it asked for, our marker in the description); plus the VM at the
         vmid/node the database last recorded for the server — a *suspect*, never trusted: a
         stale row can point at a vmid that now belongs to someone else, or at the region's own
         agent VM.
plan     (pure) the deletion guard (architecture §6) on every VM found: any platform role
         refuses unconditionally (permanent; the server carries the reason). Our VMs must also
         carry ``z9-role-customer``. A suspect without our tag and without a platform role is
         someone else's VM: left alone. Then ``stop`` (if running) and ``destroy`` per VM.
apply    re-reads the VM's tags right before destroying it and re-applies the guard.
         Our VMs carry ``protection=1`` (set by ServerCreate): it is lifted, with the digest of
         the config the guard just read, right before the destroy.
verify   no VM in the cluster carries the identity tag and no untagged clone of ours is left
         (never "vmid N is gone": the vmid is reused at once) — after waiting out
         ``uncertain_window_s`` from any clone request whose answer was lost, since it may
         still be performed. The server becomes ``deleted``.

Only a ``destroying`` server is touched: a job whose server is in any other state was
superseded (its server failed and was deleted again) and does nothing. Its own failure makes
the server ``failed`` with the reason (a deletion can then be asked again).
"""
from __future__ import annotations

import asyncpg

from z9 import resources
from z9.common.models import Job
from z9.resources.server import SERVER

from z9.executor import vms
from z9.executor.context import JobContext, Step
from z9.resources.server.jobs import shared as _server
from z9.resources.server import store as server_store
from z9.resources.server import SERVER_DELETE

KIND = SERVER_DELETE
World = vms.Removal


async def observe(ctx: JobContext) -> World:
    """Our tagged VMs, our untagged clones, the DB-recorded suspect; or ``superseded``."""
    server = await server_store.server_get(ctx.pool, ctx.job.resource_id)
    if server is None or server.status != "destroying":
        # Only a server whose buffer expired is destroyed; anything else means this job was
        # superseded (the server failed and was deleted again: the reaper enqueues a new one).
        return World(superseded=server.status if server else "gone")
    recorded = [(server.vmid, server.node)] if server.vmid is not None else []
    return await vms.observe_removal(ctx, ctx.job.resource_id, recorded)


def plan(job: Job, world: World) -> list[Step]:
    """Pure: stop/destroy per VM of ours. Raises GuardRefusal (platform role, or not ours),
    Snooze (VM locked)."""
    return vms.plan_removal(job.resource_id, world)


async def apply(ctx: JobContext, world: World, step: Step) -> None:
    """Stop or destroy one VM after re-reading it and re-applying the guard; waits for tasks."""
    await vms.apply_removal_step(ctx, ctx.job.resource_id, step)


async def verify(ctx: JobContext) -> None:
    """No VM carries our tag and no untagged clone of ours is left (else TemporaryError); waits
    (Snooze) while a lost clone request may still land, or a clone of ours still runs."""
    server = await server_store.server_get(ctx.pool, ctx.job.resource_id)
    if server is None or server.status != "destroying":
        return None  # superseded: nothing was done, nothing to check
    await vms.verify_removed(ctx, ctx.job.resource_id)


async def record(conn: asyncpg.Connection, ctx: JobContext, _: None) -> None:
    """``destroying`` → ``deleted`` (its VM facts and clone requests go); and now that verify saw
    the VM gone (never before: a live VM keeps its addresses), every resource depending on it
    reacts in this same transaction, through the hooks the dependent types registered with
    ``resources.on_final_delete("server", …)``: its addresses are released (the address slice),
    load balancers drop it from their targets (the load-balancer slice)."""
    if await SERVER.deleted(conn, ctx.job.resource_id):
        await server_store.server_observed(conn, ctx.job.resource_id, vmid=None, node=None, power_state=None)
        # what depends on the server (registered by the dependent types), in this transaction
        await resources.final_delete_dependents(conn, SERVER.name, ctx.job.resource_id, ctx.settings.max_attempts)


record_failure = _server.record_failure
