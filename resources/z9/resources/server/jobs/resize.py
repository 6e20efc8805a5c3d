"""ServerResize: give the server's VM the cores, memory and disk size the customer asked for.

``args``: ``cores``, ``memory_mib``, ``disk_gib`` (the server's new sizes; the API wrote them on
the server row in the request's transaction). Proxmox's default ``hotplug`` is
``network,disk,usb``: a CPU or memory change on a running VM only becomes a *pending* change
(applied at the next cold boot), so the API refuses it on a running server (409
``server_not_stopped``) and this job refuses it too if the VM was started meanwhile. A disk grows
online (``PUT …/resize``); disks never shrink.

observe  the VM carrying ``z9-id-<server id>``; none is a permanent error.
plan     (pure) the guard; ``configure`` when cores/memory differ (the VM must be stopped);
         ``resize_disk`` when the boot disk is smaller than asked; nothing when both match.
apply    ``POST …/config`` with the digest read (cores, memory), ``PUT …/resize``; waits for
         each task.
verify   observe again: the plan is empty. Records the observed power state.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import asyncpg

from z9.common.errors import PermanentError, TemporaryError
from z9.common.models import Job
from z9.common.tags import identity_tag

from z9.executor.context import JobContext, Step, StepKind, StepKinds
from z9.executor.proxmox import VmState
from z9.executor import guard, vms
from z9.resources.server.jobs import shared as _server
from z9.resources.server import store as server_store
from z9.resources.server import SERVER_RESIZE

KIND = SERVER_RESIZE


@dataclass
class World:
    vm: VmState | None
    firewall: list[str] = field(default_factory=list)  # what of its VM firewall drifted (shared.firewall_drift)


def desired(job: Job) -> dict[str, Any]:
    """The config keys the job sets (Proxmox names)."""
    return {"cores": int(job.args["cores"]), "memory": int(job.args["memory_mib"])}


async def observe(ctx: JobContext) -> World:
    vm = await vms.find_one_vm(ctx, ctx.job.resource_id)
    return World(vm=vm, firewall=await _server.firewall_drift(ctx, vm))


def plan(job: Job, world: World) -> list[Step]:
    """Pure: ``configure`` and/or ``resize_disk`` still needed. Raises PermanentError (no VM, a
    running VM for a CPU/memory change, a disk larger than asked), GuardRefusal, Snooze."""
    vm = world.vm
    if vm is None:
        raise PermanentError(f"no VM carries {identity_tag(job.resource_id)}: the server's VM is gone")
    guard.guard(job.resource_id, vm)
    steps = _server.firewall_steps(vm, world.firewall)  # its firewall put back first when it drifted
    diff = vms.config_diff(vm.config, desired(job))
    if diff:
        if vm.running:
            raise PermanentError(f"server_not_stopped: changing {', '.join(sorted(diff))} of VM {vm.vmid} needs it "
                                 "stopped (Proxmox does not hot-plug CPU or memory by default)")
        steps.append(CONFIGURE.step({"vmid": vm.vmid, "node": vm.node, "set": sorted(diff)}))
    disk = vms.boot_disk(vm.config)
    if disk is None:
        raise PermanentError(f"VM {vm.vmid} has no data disk to size")
    want = int(job.args["disk_gib"])
    if disk[1] > want + 1e-9:
        raise PermanentError(f"disk_gib {want} is smaller than the disk ({disk[1]:g} GiB); disks cannot shrink")
    if disk[1] < want - 1e-9:
        steps.append(RESIZE_DISK.step({"vmid": vm.vmid, "node": vm.node, "disk": disk[0]}))
    if steps:
        vms.refuse_if_locked(vm)
    return steps


async def _configure(ctx: JobContext, vm: VmState, step: Step) -> None:
    diff = vms.config_diff(vm.config, desired(ctx.job))
    if diff:
        if vm.running:
            raise PermanentError(f"server_not_stopped: VM {vm.vmid} was started before its resize")
        await ctx.fence()
        upid = await ctx.pve.configure(vm.node, vm.vmid, diff, digest=vm.config.get("digest"))
        await ctx.wait_task(step, upid)


async def _resize_disk(ctx: JobContext, vm: VmState, step: Step) -> None:
    disk = vms.boot_disk(vm.config)
    want = int(ctx.job.args["disk_gib"])
    if disk is not None and disk[1] < want - 1e-9:
        await ctx.fence()
        upid = await ctx.pve.resize(vm.node, vm.vmid, disk[0], want, digest=vm.config.get("digest"))
        if upid:
            await ctx.wait_task(step, upid)


#: the resize's steps: run(ctx, the VM re-read and guarded, step)
CONFIGURE = StepKind("configure", _configure)
RESIZE_DISK = StepKind("resize_disk", _resize_disk)
STEPS = StepKinds(CONFIGURE, RESIZE_DISK)


async def apply(ctx: JobContext, world: World, step: Step) -> None:
    """One step on the VM as it is now (re-read and guarded first); waits for its task."""
    assert world.vm is not None
    if step.name == _server.FIREWALL_STEP:
        await _server.apply_firewall(ctx, world.vm, step)
        return
    kind = STEPS.of(step, KIND)
    vm = await guard.reread_guarded(ctx, ctx.job.resource_id, world.vm)
    vms.refuse_if_locked(vm)
    await kind.run(ctx, vm, step)


async def verify(ctx: JobContext) -> VmState:
    """Observe again: nothing left to do (else TemporaryError)."""
    world = await observe(ctx)
    left = plan(ctx.job, world)
    if left:
        raise TemporaryError("verify: still to do: " + ", ".join(s.name for s in left))
    assert world.vm is not None
    vm = world.vm
    if vm.running and any(str(vm.config.get(k)) == str(v) for k, v in desired(ctx.job).items()):
        # A VM started between the read and the write: PVE kept the CPU/memory change in
        # [PENDING] (GET config lays it over), the running VM has the old sizes until its next
        # boot. Say so instead of recording a resize the guest does not have.
        pending = await ctx.pve.pending(vm.node, vm.vmid)
        waiting = sorted(k for k in desired(ctx.job) if k in pending)
        if waiting:
            raise PermanentError(f"server_not_stopped: VM {vm.vmid} was started before its resize; "
                                 f"{', '.join(waiting)} pending until its next boot (reboot the server to apply)")
    return vm


async def record(conn: asyncpg.Connection, ctx: JobContext, vm: VmState) -> None:
    """The observed power state; the status is left alone."""
    await server_store.server_observed(conn, ctx.job.resource_id, vmid=vm.vmid, node=vm.node,
                                power_state="running" if vm.running else "stopped")
    await _server.verified_power(conn, ctx, "running" if vm.running else "stopped")


record_failure = _server.record_failure
