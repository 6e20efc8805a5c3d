"""ServerStart: make sure the server's VM runs (restoring the power state when a deletion is
cancelled).

observe  the VM carrying ``z9-id-<server id>``; none is a permanent error (the VM is gone).
plan     (pure) the guard (never start a platform VM); ``start`` when it is not running.
apply    ``status/start`` and wait for the task (a task failing with ``already running`` means
         someone else started it: done).
verify   observe again: running. Records ``running`` (outside the deletion states).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import asyncpg

from z9.common.errors import PermanentError, TemporaryError
from z9.common.models import Job
from z9.common.tags import identity_tag

from z9.executor.context import JobContext, Step
from z9.executor.proxmox import VmState
from z9.executor import guard, vms
from z9.resources.server.jobs import shared as _server
from z9.resources.server import store as server_store
from z9.resources.server import SERVER_START

KIND = SERVER_START


@dataclass
class World:
    vm: VmState | None
    firewall: list[str] = field(default_factory=list)  # what of its VM firewall drifted (shared.firewall_drift)


async def observe(ctx: JobContext) -> World:
    """Our VM by tag (or None)."""
    vm = await vms.find_one_vm(ctx, ctx.job.resource_id)
    return World(vm=vm, firewall=await _server.firewall_drift(ctx, vm))


def plan(job: Job, world: World) -> list[Step]:
    """Pure: its firewall put back when it drifted; ``start`` when stopped. Raises PermanentError (no
    VM), GuardRefusal, Snooze."""
    vm = world.vm
    if vm is None:
        raise PermanentError(f"no VM carries {identity_tag(job.resource_id)}: the server's VM is gone")
    guard.guard(job.resource_id, vm)
    steps = _server.firewall_steps(vm, world.firewall)
    if vm.running:
        return steps
    vms.refuse_if_locked(vm)
    return [*steps, Step("start", {"vmid": vm.vmid, "node": vm.node})]


async def apply(ctx: JobContext, world: World, step: Step) -> None:
    """Start the VM (re-read and guarded first) and wait for the task."""
    assert world.vm is not None
    if step.name == _server.FIREWALL_STEP:
        await _server.apply_firewall(ctx, world.vm, step)
        return
    if step.name != "start":
        raise PermanentError(f"{KIND}: unknown step {step.name!r}")
    assert world.vm is not None
    await vms.ensure_running(ctx, step, await guard.reread_guarded(ctx, ctx.job.resource_id, world.vm))


async def verify(ctx: JobContext) -> VmState:
    """Our VM runs (else TemporaryError); returns it."""
    world = await observe(ctx)
    if world.vm is None or not world.vm.running:
        raise TemporaryError("verify: the VM is not running")
    if world.firewall:
        raise TemporaryError("verify: its firewall is not as z9 keeps it: " + ", ".join(world.firewall))
    return world.vm


async def record(conn: asyncpg.Connection, ctx: JobContext, vm: VmState) -> None:
    """Power state ``running``; status ``running`` when it was running or stopped."""
    await server_store.server_observed(conn, ctx.job.resource_id, vmid=vm.vmid, node=vm.node, power_state="running")
    await _server.verified_power(conn, ctx, "running")


record_failure = _server.record_failure
