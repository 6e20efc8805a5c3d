"""LoadBalancerStop: the deletion buffer's first job — the appliances are stopped (their VMs,
addresses and configuration are kept: a cancellation starts them again).

observe  the appliances' VMs by tag (every member); ``superseded`` unless the load balancer is
         ``deleting`` (a cancellation came first).
plan     (pure) the guard on each VM; ``stop`` per running one.
apply    re-read, re-guard, hard stop, wait for the task.
verify   no appliance runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from z9.common.errors import TemporaryError
from z9.common.models import Job
from z9.resources.load_balancer import LOAD_BALANCER

from z9.executor import guard, vms
from z9.executor.context import JobContext, Step
from z9.executor.proxmox import VmState
from z9.resources.load_balancer.jobs import shared as _lb
from z9.resources.load_balancer import LOAD_BALANCER_STOP

KIND = LOAD_BALANCER_STOP
record_failure = _lb.record_failure


@dataclass
class World:
    vms: list[VmState] = field(default_factory=list)
    superseded: str | None = None


async def observe(ctx: JobContext) -> World:
    lb = await LOAD_BALANCER.get(ctx.pool, ctx.job.resource_id)
    if lb is None or lb.status != "deleting":
        return World(superseded=lb.status if lb else "gone")
    return World(vms=await vms.find_vms(ctx, ctx.job.resource_id))


def plan(job: Job, world: World) -> list[Step]:
    if world.superseded:
        return []
    steps = []
    for vm in world.vms:
        guard.guard(job.resource_id, vm)
        if vm.running:
            vms.refuse_if_locked(vm)
            steps.append(Step("stop", {"vmid": vm.vmid, "node": vm.node, "member": vms.member_of(vm)}))
    return steps


async def apply(ctx: JobContext, world: World, step: Step) -> None:
    vm = await ctx.pve.vm_state(step.detail["node"], step.detail["vmid"])
    if vm is None:
        return
    vm = await guard.reread_guarded(ctx, ctx.job.resource_id, vm)
    if vm.running:
        await ctx.fence()
        await ctx.wait_task(step, await ctx.pve.stop(vm.node, vm.vmid))


async def verify(ctx: JobContext) -> dict[str, Any] | None:
    world = await observe(ctx)
    if world.superseded:
        return None
    running = [v.vmid for v in world.vms if v.running]
    if running:
        raise TemporaryError(f"verify: appliances still running: {running}")
    return {"members": {vms.member_of(v): {"vmid": v.vmid, "node": v.node, "running": False, "config_hash": None,
                                           "holds_vip": False} for v in world.vms}}


async def record(conn: Any, ctx: JobContext, seen: dict[str, Any] | None) -> None:
    """The appliances are stopped: nothing serves, health is ``unknown`` until they run again."""
    if seen is not None:
        await _lb.record_seen(conn, ctx, {**seen, "vip_holder": None, "spread": None, "health": "unknown",
                                          "health_detail": {"targets": {}}}, status=None)
