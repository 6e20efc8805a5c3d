"""ServerCreate: make the server's VM exist, configured and running.

observe  the template named by ``image`` — by the name its config has now, not the name
         ``/cluster/resources`` shows (its stats lag: a template renamed or imported moments ago
         shows its old name, or none; a missing template is waited for) — and the VM
         carrying ``z9-id-<server id>`` anywhere in the cluster; failing that, a clone a create
         job of this server started earlier (its vmid is in that job's memo and its description
         carries our marker: a clone has no tags of its own until ``configure``).
plan     (pure) clone → wait_clone → configure → resize_disk → start, keeping only what is
         missing. An existing, configured, running VM gives the empty plan. No VM, but a clone
         request whose answer was lost less than ``uncertain_window_s`` ago: snooze (it may
         still land) rather than clone a second time.
apply    each step re-reads the VM and acts only if still needed; the clone's vmid is written
         to the memo *before* the POST and its UPID right after, so a lost response or a crash
         never leads to a second clone: the next attempt waits on the same UPID or adopts the VM.
verify   observe again; the plan must be empty. The server becomes ``running`` with the
         observed vmid, node and power state.
"""
from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import asyncpg

from z9.common import kinds, store
from z9.common.resources.server import SERVER
from z9.common.errors import PermanentError, Snooze, TemporaryError
from z9.common.models import Job
from z9.common.tags import platform_roles

from ..context import JobContext, Step
from ..proxmox import OutcomeUnknown, VmidTaken, VmRef, VmState
from . import _server

KIND = kinds.SERVER_CREATE
CLONE_TRIES = 5


@dataclass
class World:
    template: VmRef | None
    vm: VmState | None
    template_disk_gib: float | None = None
    clone_in_flight_s: float = 0.0  # a clone request without answer may land for this long yet


async def observe(ctx: JobContext) -> World:
    """The template, and our VM (by tag, else an untagged clone of ours). Raises TemporaryError
    on hypervisor trouble, PermanentError when several VMs carry our tag."""
    image = ctx.args["image"]
    vm = await _server.find_one_vm(ctx, ctx.job.resource_id)
    in_flight = 0.0
    if vm is None:
        # A clone an earlier attempt (or an earlier job) made but did not tag yet.
        memos = await _server.clone_memos(ctx)
        clones = await _server.find_own_clones(ctx, memos, set())
        vm = clones[0] if clones else None
        since = _server.clone_uncertain_since(memos) if vm is None else None
        if since is not None:
            in_flight = max(0.0, since + ctx.settings.uncertain_window_s - time.time())
    template, disk = None, None
    if vm is None:
        tpl = await _server.find_template(ctx, image)
        if tpl is not None:
            template = VmRef(vmid=tpl.vmid, node=tpl.node, name=image, status=tpl.status, tags=tpl.tags,
                             lock=tpl.lock, template=True)
            found = _server.boot_disk(tpl.config)
            disk = found[1] if found else None
    return World(template=template, vm=vm, template_disk_gib=disk, clone_in_flight_s=in_flight)


def plan(job: Job, world: World) -> list[Step]:
    """Pure: the steps still missing. Raises PermanentError (no template, platform-tagged
    template, disk too small), GuardRefusal (our VM carries a platform role), Snooze (VM locked,
    or a lost clone request may still land)."""
    args = job.args
    if world.vm is None:
        if world.clone_in_flight_s > 0:  # never clone again while the lost request may still land
            raise Snooze(f"an earlier clone request got no answer and may still be performed; "
                         f"waiting up to {world.clone_in_flight_s:.0f}s for it", delay_s=min(world.clone_in_flight_s, 10.0))
        if world.template is None:
            # Not visible yet (an image being imported, a template being renamed): waiting on the
            # world, not a failure (it spends no attempt; snooze_limit_s bounds the wait).
            raise Snooze(f"image {args['image']!r}: no template with that name in region {job.region} yet; "
                         "waiting for it to appear", delay_s=5.0)
        if platform_roles(world.template.tags):
            raise PermanentError(f"image {args['image']!r}: template {world.template.vmid} carries platform role "
                                 f"{', '.join(sorted(platform_roles(world.template.tags)))}; its clones would "
                                 "inherit it, so z9 does not clone it")
        if world.template_disk_gib is not None:
            _check_no_shrink(world.template_disk_gib, args)
        return [Step("clone"), Step("configure"), Step("resize_disk"), Step("start")]
    vm = world.vm
    _server.refuse_platform(job.resource_id, vm)
    if vm.lock == "clone":
        return [Step("wait_clone", {"vmid": vm.vmid}), Step("configure"), Step("resize_disk"), Step("start")]
    _server.refuse_if_locked(vm)
    steps = []
    if _server.config_diff(vm.config, _server.desired_config(job.resource_id, args)):
        steps.append(Step("configure"))
    disk = _server.boot_disk(vm.config)
    if disk is None:
        raise PermanentError(f"VM {vm.vmid} has no data disk to size")
    _check_no_shrink(disk[1], args)
    if disk[1] < args["disk_gib"] - 1e-9:
        steps.append(Step("resize_disk"))
    if not vm.running:
        steps.append(Step("start"))
    return steps


async def apply(ctx: JobContext, world: World, step: Step) -> None:
    """Run one step if still needed (each re-reads the VM first) and wait for its task."""
    if step.name == "clone":
        await _clone(ctx, world, step)
    elif step.name == "wait_clone":
        await _wait_clone(ctx, world, step)
    elif step.name == "configure":
        vm = await _current(ctx, world)
        _server.refuse_platform(ctx.job.resource_id, vm)  # never rewrite a platform VM's tags
        _server.refuse_if_locked(vm)
        diff = _server.config_diff(vm.config, _server.desired_config(ctx.job.resource_id, ctx.args))
        if diff:
            await ctx.fence()
            upid = await ctx.pve.configure(vm.node, vm.vmid, diff, digest=vm.config.get("digest"))
            await ctx.wait_task(step, upid)
    elif step.name == "resize_disk":
        vm = await _current(ctx, world)
        _server.refuse_if_locked(vm)
        disk = _server.boot_disk(vm.config)
        if disk is None:
            raise PermanentError(f"VM {vm.vmid} has no data disk to size")
        _check_no_shrink(disk[1], ctx.args)
        if disk[1] < ctx.args["disk_gib"] - 1e-9:
            step.detail["disk"] = disk[0]
            await ctx.fence()
            upid = await ctx.pve.resize(vm.node, vm.vmid, disk[0], ctx.args["disk_gib"])
            if upid:
                await ctx.wait_task(step, upid)
    elif step.name == "start":
        vm = await _current(ctx, world)
        _server.refuse_if_locked(vm)
        await _server.ensure_running(ctx, step, vm)
    else:
        raise PermanentError(f"{KIND}: unknown step {step.name!r}")


def _check_no_shrink(size_gib: float, args: dict) -> None:
    """PermanentError when the disk (``size_gib`` GiB) is already larger than ``disk_gib``:
    Proxmox cannot shrink disks (``shrinking disks is not supported``)."""
    if size_gib > args["disk_gib"] + 1e-9:
        raise PermanentError(f"disk_gib {args['disk_gib']} is smaller than image {args['image']!r}'s disk "
                             f"({size_gib:g} GiB); disks cannot shrink")


async def _current(ctx: JobContext, world: World) -> VmState:
    """Re-read our VM (the previous step changed it)."""
    if world.vm is None:
        raise TemporaryError("no VM to act on yet")
    st = await ctx.pve.vm_state(world.vm.node, world.vm.vmid)
    if st is None:
        raise TemporaryError(f"VM {world.vm.vmid} disappeared from {world.vm.node}")
    world.vm = st
    return st


async def _clone(ctx: JobContext, world: World, step: Step) -> None:
    tpl = world.template
    assert tpl is not None
    for attempt in range(CLONE_TRIES):
        # nextid hands every parallel create the same lowest free id (it reserves nothing): after
        # a collision, spread out above it instead of racing for the same id again.
        newid = await ctx.pve.next_id() + (random.randint(1, 8 * attempt) if attempt else 0)
        # Record the request *before* sending it: until its answer is recorded it is uncertain
        # (the next attempt waits for it and a deletion looks at every vmid ever asked for).
        await store.vm_clone_sent(ctx.pool, ctx.lease, ctx.job.resource_id, _server.MEMBER, newid, tpl.node)
        await ctx.remember(clone={"vmid": newid, "node": tpl.node, "upid": None})
        await ctx.step_detail(step, vmid=newid, node=tpl.node, template=tpl.vmid)
        try:
            upid = await ctx.pve.clone(tpl.node, tpl.vmid, newid=newid, name=ctx.args["name"],
                                       description=_server.marker(ctx.job.resource_id))
        except VmidTaken:
            # A parallel create won this vmid (a definite answer: nothing was cloned). Forget it
            # and pick again; never adopt that VM.
            await store.vm_clone_refused(ctx.pool, ctx.job.resource_id, _server.MEMBER, newid)
            continue
        except (OutcomeUnknown, asyncio.CancelledError):
            raise  # the answer is lost: the request stays unanswered, uncertain since it was recorded
        except Exception:
            # Any other error is an answer (the hypervisor refused or failed the request): not
            # uncertain. The vmid stays recorded, so a deletion still looks there.
            await store.vm_clone_answered(ctx.pool, ctx.job.resource_id, _server.MEMBER, newid, None)
            raise
        await store.vm_clone_answered(ctx.pool, ctx.job.resource_id, _server.MEMBER, newid, upid)
        await ctx.remember(clone={"vmid": newid, "node": tpl.node, "upid": upid})
        await ctx.wait_task(step, upid)
        st = await ctx.pve.vm_state(tpl.node, newid)
        if st is None:
            raise TemporaryError(f"clone task {upid} ended OK but VM {newid} is not on {tpl.node}")
        world.vm = st
        return
    # Contention with other creates is waiting on the world, not a failure of this job.
    raise Snooze(f"every vmid tried was taken by a parallel create ({CLONE_TRIES} tries)", delay_s=1.0)


async def _wait_clone(ctx: JobContext, world: World, step: Step) -> None:
    """Wait for a clone started by an earlier attempt: on its UPID when this job recorded it,
    else until the target's ``lock: clone`` goes away."""
    clone = ctx.memo.get("clone") or {}
    vm = world.vm
    assert vm is not None
    if clone.get("upid") and int(clone["vmid"]) == vm.vmid:
        await ctx.wait_task(step, clone["upid"])
    else:
        deadline = time.monotonic() + ctx.settings.task_deadline_s
        while True:
            st = await ctx.pve.vm_state(vm.node, vm.vmid)
            if st is None:
                raise TemporaryError(f"VM {vm.vmid} vanished while its clone was running")
            if st.lock != "clone":
                break
            if time.monotonic() > deadline:
                raise TemporaryError(f"VM {vm.vmid} still locked (clone) after {ctx.settings.task_deadline_s:.0f}s")
            ctx.touch()
            await asyncio.sleep(ctx.settings.task_poll_s)
    st = await ctx.pve.vm_state(vm.node, vm.vmid)
    if st is None or _server.marker(ctx.job.resource_id) not in str(st.config.get("description", "")):
        raise TemporaryError(f"the clone at VM {vm.vmid} did not produce our VM; observing again")
    world.vm = st


async def verify(ctx: JobContext) -> VmState:
    """Observe again; the plan must be empty (else TemporaryError). Returns our VM."""
    world = await observe(ctx)
    remaining = plan(ctx.job, world)
    if remaining or world.vm is None:
        raise TemporaryError("verify: still to do: " + ", ".join(s.name for s in remaining))
    return world.vm


async def record(conn: asyncpg.Connection, ctx: JobContext, vm: VmState) -> None:
    """In the finishing transaction: the server is ``running`` with what verify saw."""
    await store.server_observed(conn, ctx.job.resource_id, vmid=vm.vmid, node=vm.node,
                                power_state="running" if vm.running else "stopped")
    await SERVER.observed(conn, ctx.job.resource_id, status="running",
                          from_statuses=("creating", "failed", "running", "stopped"))


record_failure = _server.record_failure

