"""ServerReboot: make sure the server's VM has booted since the reboot was asked for.

A reboot is made idempotent by what it promises: "a fresh boot after my request". The job's
``created_at`` is the request; the VM's ``uptime`` (``status/current``) says when its QEMU process
started. A run (or a re-run after a crash between the POST and the record) that finds the VM up
for less time than the request's age plans nothing.

observe  the VM carrying ``z9-id-<server id>``, and how long ago the job was asked for.
plan     (pure) the guard; nothing when the VM booted after the request; ``reboot`` when it
         runs (ACPI shutdown then a new start: pending config changes and cloud-init apply);
         ``start`` when it is stopped (the outcome asked for is a freshly booted VM).
apply    ``status/reboot`` (or ``status/start``) and wait for the task. On real PVE the reboot
         task only stops the VM and qmeventd starts it in a ``qmstart`` task of its own, so apply
         then waits (polling ``status/current``) for it to run again; a VM that stopped since it
         was read is refused ``VM n not running`` before any task: it is started instead.
verify   observe again: running, and booted after the request. Records ``running``.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import datetime

import asyncpg

from z9.common.errors import PermanentError, TemporaryError
from z9.common.models import Job
from z9.common.tags import identity_tag

from z9.executor.context import JobContext, Step
from z9.executor.proxmox import VmState
from z9.executor import guard, vms
from z9.resources.server.jobs import shared as _server
from z9.resources.server import store as server_store
from z9.resources.server import SERVER_REBOOT

KIND = SERVER_REBOOT
REBOOT_TIMEOUT_S = 60


@dataclass
class World:
    vm: VmState | None
    requested_ago_s: float  # seconds since the job was created (the customer's request)
    firewall: list[str] = field(default_factory=list)  # what of its VM firewall drifted (shared.firewall_drift)


def _age(job: Job, now: datetime) -> float:
    return max(0.0, (now - job.created_at).total_seconds())


async def observe(ctx: JobContext) -> World:
    """Our VM by tag (or None), and the request's age."""
    vm = await vms.find_one_vm(ctx, ctx.job.resource_id)
    return World(vm=vm, requested_ago_s=_age(ctx.job, ctx.clock.now()), firewall=await _server.firewall_drift(ctx, vm))


def booted_since_request(vm: VmState, requested_ago_s: float) -> bool:
    """The VM runs and its QEMU process started after the request."""
    return vm.running and vm.uptime_s is not None and vm.uptime_s < requested_ago_s


def plan(job: Job, world: World) -> list[Step]:
    """Pure: nothing when the VM booted after the request, else ``reboot`` (running) or
    ``start`` (stopped). Raises PermanentError (no VM), GuardRefusal, Snooze (locked)."""
    vm = world.vm
    if vm is None:
        raise PermanentError(f"no VM carries {identity_tag(job.resource_id)}: the server's VM is gone")
    guard.guard(job.resource_id, vm)
    steps = _server.firewall_steps(vm, world.firewall)  # its firewall put back first when it drifted
    if booted_since_request(vm, world.requested_ago_s):
        return steps
    vms.refuse_if_locked(vm)
    return [*steps, Step("reboot" if vm.running else "start", {"vmid": vm.vmid, "node": vm.node})]


async def apply(ctx: JobContext, world: World, step: Step) -> None:
    """Reboot (or start) the VM, re-read and guarded first, and wait for the task."""
    if step.name == _server.FIREWALL_STEP:
        assert world.vm is not None
        await _server.apply_firewall(ctx, world.vm, step)
        return
    if step.name not in ("reboot", "start"):
        raise PermanentError(f"{KIND}: unknown step {step.name!r}")
    assert world.vm is not None
    st = await guard.reread_guarded(ctx, ctx.job.resource_id, world.vm)
    if booted_since_request(st, _age(ctx.job, ctx.clock.now())):
        return
    if not st.running:
        await vms.ensure_running(ctx, step, st)
        return
    await ctx.fence()
    try:
        upid = await ctx.pve.reboot(st.node, st.vmid, timeout_s=REBOOT_TIMEOUT_S)
    except TemporaryError as e:
        # qemu-server API2/Qemu.pm vm_reboot: a VM that stopped since it was read is refused
        # before any task ("VM <id> not running", HTTP 500): start it instead (the outcome asked
        # for is a VM booted after the request)
        if f"VM {st.vmid} not running" not in str(e):
            raise
        st = await guard.reread_guarded(ctx, ctx.job.resource_id, st)
        await vms.ensure_running(ctx, step, st)
        return
    await ctx.wait_task(step, upid)
    await _await_restart(ctx, st)


async def _await_restart(ctx: JobContext, vm: VmState) -> None:
    """The ``qmreboot`` task only stops the VM (QemuServer.pm vm_reboot); qmeventd then starts it
    in a ``qmstart`` task of its own: the VM reads ``stopped`` in between. Wait (the lease kept)
    until it runs and booted after the request, at most ``task_deadline_s``; verify judges."""
    deadline = time.monotonic() + ctx.settings.task_deadline_s
    while time.monotonic() < deadline:
        cur = await ctx.pve.vm_status(vm.node, vm.vmid)
        if cur is None:
            return
        up = cur.get("uptime")
        if cur.get("status") == "running" and up is not None and int(up) < _age(ctx.job, ctx.clock.now()):
            return
        ctx.touch()
        await asyncio.sleep(ctx.settings.task_poll_s)


async def verify(ctx: JobContext) -> VmState:
    """Our VM runs and booted after the request (else TemporaryError); returns it."""
    world = await observe(ctx)
    if world.vm is None or not booted_since_request(world.vm, world.requested_ago_s):
        raise TemporaryError("verify: the VM has not booted since the reboot was asked for")
    if world.firewall:
        raise TemporaryError("verify: its firewall is not as z9 keeps it: " + ", ".join(world.firewall))
    return world.vm


async def record(conn: asyncpg.Connection, ctx: JobContext, vm: VmState) -> None:
    """Power state ``running``; status ``running`` when it was running or stopped."""
    await server_store.server_observed(conn, ctx.job.resource_id, vmid=vm.vmid, node=vm.node, power_state="running")
    await _server.verified_power(conn, ctx, "running")


record_failure = _server.record_failure
