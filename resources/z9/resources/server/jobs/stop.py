"""ServerStop: make sure the server's VM is not running (first phase of a deletion, the power
state to restore when a deletion is cancelled, or the customer's ``shutdown``/``poweroff``).

``args.mode``: ``shutdown`` (default: ACPI, forced off after the timeout) or ``poweroff`` (a hard
stop at once, as pulling the plug).

observe  the VM carrying ``z9-id-<server id>`` (none is fine: nothing to stop), and the VM at
         the vmid the database last recorded, as a suspect (see ServerDelete).
plan     (pure) the deletion guard on both (a recorded VM with a platform role refuses the
         whole job); ``shutdown`` when our VM runs.
apply    ACPI shutdown, forced off after a timeout (``forceStop=1``), or ``status/stop`` for
         ``poweroff``; waits for the task.
verify   observe again: not running. Records the power state, and status ``stopped`` when the
         server was ``running``/``stopped`` (never over the deletion states: during the buffer the
         status stays ``deleting``).
"""
from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from z9.resources.server import SERVER
from z9.common.errors import PermanentError, TemporaryError
from z9.common.models import Job

from z9.executor.context import JobContext, Step, StepKind, StepKinds
from z9.executor.proxmox import VmState
from z9.executor import guard, vms
from z9.resources.server.jobs import shared as _server
from z9.resources.server import store as server_store
from z9.resources.server import SERVER_STOP

KIND = SERVER_STOP
SHUTDOWN_TIMEOUT_S = 60
MODES = ("shutdown", "poweroff")


@dataclass
class World:
    vm: VmState | None
    suspect: VmState | None = None


async def observe(ctx: JobContext) -> World:
    """Our VM by tag (or None) and the DB-recorded VM as a suspect."""
    vm = await vms.find_one_vm(ctx, ctx.job.resource_id)
    recorded = await _server.recorded_vm(ctx)
    return World(vm=vm, suspect=await vms.find_suspect(ctx, recorded[0] if recorded else None, [vm] if vm else []))


def plan(job: Job, world: World) -> list[Step]:
    """Pure: ``shutdown`` when our VM runs. Raises GuardRefusal, Snooze (VM locked)."""
    guard.guard_suspect(job.resource_id, world.suspect)
    vm = world.vm
    if vm is None:
        return []
    guard.guard(job.resource_id, vm)
    if not vm.running:
        return []
    vms.refuse_if_locked(vm)
    mode = job.args.get("mode", "shutdown")
    if mode not in MODES:
        raise PermanentError(f"{KIND}: unknown mode {mode!r} (one of {', '.join(MODES)})")
    return [STEPS.by_name[mode].step({"vmid": vm.vmid, "node": vm.node})]


async def _shutdown(ctx: JobContext, vm: VmState) -> str:
    return await ctx.pve.shutdown(vm.node, vm.vmid, timeout_s=SHUTDOWN_TIMEOUT_S)


async def _poweroff(ctx: JobContext, vm: VmState) -> str:
    return await ctx.pve.stop(vm.node, vm.vmid)


#: one step per mode: run(ctx, the running VM re-read and guarded) -> the task's UPID
STEPS = StepKinds(StepKind("shutdown", _shutdown), StepKind("poweroff", _poweroff))


async def apply(ctx: JobContext, world: World, step: Step) -> None:
    """Shut the VM down (re-read and guarded first) and wait for the task."""
    kind = STEPS.of(step, KIND)
    assert world.vm is not None
    st = await guard.reread_guarded(ctx, ctx.job.resource_id, world.vm)
    if st.running:
        await ctx.fence()
        await ctx.wait_task(step, await kind.run(ctx, st))


async def verify(ctx: JobContext) -> VmState | None:
    """Our VM is not running (else TemporaryError); returns it (or None)."""
    world = await observe(ctx)
    if world.vm is not None and world.vm.running:
        raise TemporaryError(f"verify: VM {world.vm.vmid} is still running")
    return world.vm


async def record(conn: asyncpg.Connection, ctx: JobContext, vm: VmState | None) -> None:
    """The observed power state; status ``stopped`` from ``running``/``stopped`` only."""
    if vm is None:
        await server_store.server_observed(conn, ctx.job.resource_id, vmid=None, node=None, power_state=None)
    else:
        await server_store.server_observed(conn, ctx.job.resource_id, vmid=vm.vmid, node=vm.node,
                                    power_state="stopped")
    if vm is None:  # no VM: stopped as far as power goes, but nothing a failure is mended by
        await SERVER.observed(conn, ctx.job.resource_id, status="stopped", from_statuses=("running", "stopped"))
    else:
        await _server.verified_power(conn, ctx, "stopped")


record_failure = _server.record_failure
