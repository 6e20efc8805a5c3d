"""ServerDelete: the final, irreversible step of a two-phase deletion (enqueued by the reaper
when the deletion buffer expires).

observe  every VM carrying ``z9-id-<server id>``; every untagged clone a create job of this
         server made (its memo's vmid, our marker in the description); plus the VM at the
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

import time
from dataclasses import dataclass, field

import asyncpg

from z9.common import kinds, store
from z9.common.resources.server import SERVER
from z9.common.errors import PermanentError, Snooze, TemporaryError
from z9.common.models import Job
from z9.common.tags import identity_tag

from ..context import JobContext, Step
from ..proxmox import VmState
from . import _server

KIND = kinds.SERVER_DELETE


@dataclass
class World:
    ours: list[VmState] = field(default_factory=list)
    clones: list[VmState] = field(default_factory=list)
    suspects: list[VmState] = field(default_factory=list)
    superseded: str | None = None


async def observe(ctx: JobContext) -> World:
    """Our tagged VMs, our untagged clones, the DB-recorded suspect; or ``superseded``."""
    server = await store.server_get(ctx.pool, ctx.job.resource_id)
    if server is None or server.status != "destroying":
        # Only a server whose buffer expired is destroyed; anything else means this job was
        # superseded (the server failed and was deleted again: the reaper enqueues a new one).
        return World(superseded=server.status if server else "gone")
    ours = await _server.find_vms(ctx, ctx.job.resource_id)
    clones = await _server.find_own_clones(ctx, await _server.clone_memos(ctx), {v.vmid for v in ours})
    suspect = await _server.find_suspect(ctx, server, ours + clones)
    return World(ours=ours, clones=clones, suspects=[suspect] if suspect else [])


def plan(job: Job, world: World) -> list[Step]:
    """Pure: stop/destroy per VM of ours. Raises GuardRefusal (platform role, or not ours),
    Snooze (VM locked)."""
    if world.superseded:
        return []
    for vm in world.suspects:
        _server.guard_suspect(job.resource_id, vm)
    steps = []
    for vm in world.ours:
        _server.guard(job.resource_id, vm)
        if vm.lock == "destroyed":
            continue  # a destroy is already under way; verify waits for it
        _server.refuse_if_locked(vm)
        if vm.running:
            steps.append(Step("stop", {"vmid": vm.vmid, "node": vm.node}))
        steps.append(Step("destroy", {"vmid": vm.vmid, "node": vm.node}))
    for vm in world.clones:  # half-made: cloned, never tagged (the create failed or was cut short)
        _server.refuse_if_locked(vm)
        _server.guard_own_clone(job.resource_id, vm)
        detail = {"vmid": vm.vmid, "node": vm.node, "untagged": True}
        if vm.running:
            steps.append(Step("stop", dict(detail)))
        steps.append(Step("destroy", dict(detail)))
    return steps


async def apply(ctx: JobContext, world: World, step: Step) -> None:
    """Stop or destroy one VM after re-reading it and re-applying the guard; waits for tasks."""
    vmid, node = step.detail["vmid"], step.detail["node"]
    st = await ctx.pve.vm_state(node, vmid)
    if st is None:
        return  # already gone; verify checks by tag
    # Re-check right before acting: the tags (or, for an untagged clone, our marker).
    if step.detail.get("untagged"):
        _server.guard_own_clone(ctx.job.resource_id, st)
    else:
        _server.guard(ctx.job.resource_id, st)
    _server.refuse_if_locked(st)
    if step.name == "stop":
        if st.running:
            await ctx.fence()
            await ctx.wait_task(step, await ctx.pve.stop(node, vmid))
    elif step.name == "destroy":
        if st.running:
            raise TemporaryError(f"VM {vmid} is running again; stopping it first next attempt")
        if str(st.config.get("protection", "0")) == "1":
            # Lift our protection on exactly the config the guard just read (digest), then destroy.
            await ctx.fence()
            upid = await ctx.pve.configure(node, vmid, {"delete": "protection"}, digest=st.config.get("digest"))
            await ctx.wait_task(step, upid)
        await ctx.fence()
        await ctx.wait_task(step, await ctx.pve.destroy(node, vmid))
    else:
        raise PermanentError(f"{KIND}: unknown step {step.name!r}")


async def verify(ctx: JobContext) -> None:
    """No VM carries our tag and no untagged clone of ours is left (else TemporaryError); waits
    (Snooze) while a lost clone request may still land."""
    server = await store.server_get(ctx.pool, ctx.job.resource_id)
    if server is None or server.status != "destroying":
        return None  # superseded: nothing was done, nothing to check
    memos = await _server.clone_memos(ctx)
    since = _server.clone_uncertain_since(memos)
    if since is not None:
        wait = since + ctx.settings.uncertain_window_s - time.time()
        if wait > 0:
            raise Snooze(f"a clone request sent {time.time() - since:.0f}s ago got no answer and may still "
                         f"be performed; checking again in {wait:.0f}s", delay_s=min(wait, 30.0))
    left = await ctx.pve.find_by_tag(identity_tag(ctx.job.resource_id))
    if left:
        raise TemporaryError("verify: VMs still carry the identity tag: "
                             + ", ".join(f"{v.vmid} on {v.node}" for v in left))
    clones = await _server.find_own_clones(ctx, memos, set())
    running = [v for v in clones if v.lock == "clone"]
    if running:  # a clone of ours is still being made: waiting on the world spends no attempt
        raise Snooze("verify: a clone of ours is still running at "
                     + ", ".join(f"{v.vmid} on {v.node}" for v in running) + "; waiting for it", delay_s=2.0)
    if clones:
        raise TemporaryError("verify: untagged clones of ours remain: "
                             + ", ".join(f"{v.vmid} on {v.node}" for v in clones))


async def record(conn: asyncpg.Connection, ctx: JobContext, _: None) -> None:
    """``destroying`` → ``deleted`` (its VM facts and clone requests go); and now that verify saw
    the VM gone (never before: a live VM keeps its addresses), its addresses are released in this
    same transaction: auto-delete primaries deleted with their IPs quarantined, the others
    unassigned."""
    if await SERVER.deleted(conn, ctx.job.resource_id):
        await store.server_observed(conn, ctx.job.resource_id, vmid=None, node=None, power_state=None)
        await store.addresses_release_for_server(conn, ctx.job.resource_id)


record_failure = _server.record_failure
