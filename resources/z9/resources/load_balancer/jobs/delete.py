"""LoadBalancerDelete: the final step of a two-phase deletion (enqueued by the reaper).

observe  every VM carrying ``z9-id-<lb>`` (every member) and untagged clones of ours (the VM
         machinery's removal); ``superseded`` unless the load balancer is ``destroying``.
plan     (pure) the deletion guard on every VM found; stop/destroy per VM.
apply    re-read and re-guard right before each destroy (protection lifted on the config read).
verify   no VM carries the tag, no clone of ours is left or may still land.
record   ``destroying`` → ``deleted``, and only then — the VMs are gone — the VIP and the
         appliance addresses are deleted, their IPs back to the pool (quarantined), in the same
         transaction.
"""
from __future__ import annotations

from typing import Any

from z9.common.models import Job
from z9.resources.load_balancer import LOAD_BALANCER

from z9.executor import vms
from z9.executor.context import JobContext, Step
from z9.resources.load_balancer.jobs import shared as _lb
from z9.resources.load_balancer import store as load_balancer_store
from z9.resources.load_balancer import LOAD_BALANCER_DELETE

KIND = LOAD_BALANCER_DELETE
World = vms.Removal
record_failure = _lb.record_failure


async def observe(ctx: JobContext) -> World:
    lb = await LOAD_BALANCER.get(ctx.pool, ctx.job.resource_id)
    if lb is None or lb.status != "destroying":
        return World(superseded=lb.status if lb else "gone")
    return await vms.observe_removal(ctx, ctx.job.resource_id)


def plan(job: Job, world: World) -> list[Step]:
    return vms.plan_removal(job.resource_id, world)


async def apply(ctx: JobContext, world: World, step: Step) -> None:
    await vms.apply_removal_step(ctx, ctx.job.resource_id, step)


async def verify(ctx: JobContext) -> None:
    lb = await LOAD_BALANCER.get(ctx.pool, ctx.job.resource_id)
    if lb is None or lb.status != "destroying":
        return None
    await vms.verify_removed(ctx, ctx.job.resource_id)


async def record(conn: Any, ctx: JobContext, _: None) -> None:
    if await LOAD_BALANCER.deleted(conn, ctx.job.resource_id):
        await load_balancer_store.lb_release_addresses(conn, ctx.job.resource_id)
