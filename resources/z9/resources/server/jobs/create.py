"""ServerCreate: make the server's VM (member ``main``) exist, configured and running.

observe  the VM carrying ``z9-id-<server id>`` anywhere in the cluster; failing that, a clone of
         ours not tagged yet, or a clone request that may still land; else the template named by
         ``image`` — by the name its config has now, not the name ``/cluster/resources`` shows
         (its stats lag: a template renamed or imported moments ago shows its old name, or none).
         A server without a primary address first gets its address on the region's private
         network (``private_network``; :func:`z9.executor.vms.private_address`).
plan     (pure) clone → wait_clone → configure → resize_disk → ip_filter → start, keeping only what is
         missing. An existing, configured, running VM gives the empty plan. No VM, but a clone
         request without a recorded answer less than ``uncertain_window_s`` old: snooze (it may
         still land) rather than clone a second time. No template of that name (yet): snooze.
apply    each step re-reads the VM and acts only if still needed; the clone request is recorded
         *before* the POST and its UPID right after, so a lost response, a crash or a freeze
         never leads to a second clone: the next attempt waits on it or adopts the VM.
verify   observe again; the plan must be empty; inside the guest (agent) cloud-init ended without
         error, from the VM's own drive (instance-id and hostname as z9's drive gives them). The
         server becomes ``running`` with the observed vmid, node and power state — or ``failed``
         with the guest's reason (cloud-init's error text, another seed) in ``status_reason``.

The phases are the VM machinery's (:mod:`z9.executor.vms`) for the server's one member.
"""
from __future__ import annotations

import asyncpg

from z9.common.models import Job
from z9.resources.server import SERVER

from z9.executor import vms
from z9.executor.context import JobContext, Step
from z9.executor.proxmox import VmState
from z9.resources.server.jobs import shared as _server
from z9.resources.server import store as server_store
from z9.resources.server import SERVER_CREATE

KIND = SERVER_CREATE
World = vms.MemberWorld


async def observe(ctx: JobContext) -> World:
    """Our VM (by tag, else an untagged clone of ours) and the template. Raises TemporaryError on
    hypervisor trouble, PermanentError when several VMs carry our tag."""
    private = await _server.private_address(ctx)
    world = await vms.observe_member(ctx, _server.spec(ctx.job, private))
    world.private = private
    return world


def plan(job: Job, world: World) -> list[Step]:
    """Pure: the steps still missing (see :func:`z9.executor.vms.plan_member`)."""
    return vms.plan_member(_server.spec(job, world.private), world, region=job.region)


async def apply(ctx: JobContext, world: World, step: Step) -> None:
    """Run one step if still needed and wait for its task."""
    await vms.apply_member_step(ctx, _server.spec(ctx.job, world.private), world, step)


async def verify(ctx: JobContext) -> VmState:
    """Observe again; the plan must be empty (else TemporaryError); then inside the guest:
    cloud-init ended without error, from z9's drive (:func:`_server.check_guest`: a failure is
    permanent — the server is failed with the guest's reason, its observed VM recorded). Returns
    our VM."""
    spec = _server.spec(ctx.job, await _server.private_address(ctx))
    vm = await vms.verify_member(ctx, spec)
    try:
        await _server.check_guest(ctx, spec, vm)
    except _server.GuestFailed:
        await _server.record_guest_failure(ctx, vm)
        raise
    return vm


async def record(conn: asyncpg.Connection, ctx: JobContext, vm: VmState) -> None:
    """In the finishing transaction: the server is ``running`` with what verify saw."""
    await server_store.server_observed(conn, ctx.job.resource_id, vmid=vm.vmid, node=vm.node,
                                power_state="running" if vm.running else "stopped")
    await SERVER.observed(conn, ctx.job.resource_id, status="running",
                          from_statuses=("creating", "failed", "running", "stopped"))


record_failure = _server.record_failure
