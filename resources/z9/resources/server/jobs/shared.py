"""What the server job kinds share: a server is the owner of one VM, member ``main``; the VM
machinery itself (finding VMs by tag, the guard, the clone ladder) is :mod:`z9.executor.vms`.

A server's VM carries only its own identity (``VmSpec.only_own_identity``): the template's
cloud-init values and seed media are deleted in the configure step, so the guest boots from PVE's
drive with exactly the request's keys. :func:`check_guest` reads the result inside the guest.
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import yaml

from z9.common import store
from z9.common.errors import PermanentError, Snooze, TemporaryError
from z9.common.models import Job
from z9.resources.server import SERVER

from z9.executor.context import JobContext
from z9.executor.proxmox import VmState
from z9.executor.vms import MAIN, VmSpec, agent_configured

INSTANCE_ID_FILE = "/var/lib/cloud/data/instance-id"  # cloud-init writes the current instance's id there


def spec(job: Job) -> VmSpec:
    """The server's VM, from the job's arguments (the create body)."""
    a = job.args
    return VmSpec(owner=job.resource_id, member=MAIN, name=a["name"], image=a["image"], cores=int(a["cores"]),
                  memory_mib=int(a["memory_mib"]), disk_gib=int(a["disk_gib"]),
                  ssh_keys=tuple(a.get("ssh_keys") or ()), only_own_identity=True,
                  # a primary address from a pool: the API put its cloud-init keys in the args
                  config={k: str(a[k]) for k in ("ipconfig0", "nameserver") if a.get(k)})


async def recorded_vm(ctx: JobContext) -> list[tuple[int, str]]:
    """The (vmid, node) the database last recorded for the server (a suspect, never trusted)."""
    server = await store.server_get(ctx.pool, ctx.job.resource_id)
    return [(server.vmid, server.node)] if server is not None and server.vmid is not None else []


async def record_failure(conn: Any, ctx: JobContext, error: dict[str, Any]) -> None:
    """The server carries a failed job's reason (``ResourceType.mark_failed_by_job``)."""
    await SERVER.mark_failed_by_job(conn, ctx.job.resource_id, error["message"], kind=ctx.job.kind,
                                    refused=bool(error.get("refused")))


GUEST_WAIT_S = 15.0  # one ``cloud-init status --wait`` at most this long, then asked again (the lease renewed)


class GuestFailed(PermanentError):
    """The server's guest did not come up as its request asked (cloud-init failed, or it booted
    from another seed): the VM runs, the server is failed with this reason."""


GUEST_SNOOZE_S = 10.0  # a snoozed look into a guest not up yet: again after this long


async def check_guest(ctx: JobContext, spec: VmSpec, vm: VmState) -> None:
    """Inside the running guest (its agent): cloud-init ended without error, the instance is the
    one z9's cloud-init drive describes (its ``meta-data`` instance-id, as PVE generates it from the
    config) and the hostname is the server's name. Raises GuestFailed naming what is wrong.
    A guest not up yet is waited on for at most ``server_guest_slot_s`` in this claim, then the job
    snoozes (its attempt given back, its executor slot free for other jobs — a few guests that never
    boot must not hold every slot of the region) and looks again; ``server_guest_ready_s`` after the
    first look (kept in the job's memo) it is a TemporaryError. A VM without a guest agent
    (``agent`` unset or 0) is not looked into."""
    if ctx.settings.server_guest_ready_s <= 0 or not agent_configured(vm.config):
        return
    since = ctx.memo.get("guest_look_since")
    if since is None:
        since = time.time()
        await ctx.remember(guest_look_since=since)
    slot_end = time.monotonic() + ctx.settings.server_guest_slot_s
    last = "its guest agent does not answer yet"
    while True:
        ctx.touch()
        try:
            last = await _guest_once(ctx, spec, vm)
            if last == "":
                return
        except GuestFailed:
            raise
        except TemporaryError as e:
            last = str(e)
        if time.time() - float(since) > ctx.settings.server_guest_ready_s:
            raise TemporaryError(f"VM {vm.vmid}: the guest is not up after {ctx.settings.server_guest_ready_s:.0f}s: {last}")
        if time.monotonic() > slot_end:
            raise Snooze(f"VM {vm.vmid}: {last}; looked into again in {GUEST_SNOOZE_S:.0f}s", delay_s=GUEST_SNOOZE_S)
        await asyncio.sleep(1.0)  # the agent is not up yet (booting): each try is a request through pveproxy


async def _guest_once(ctx: JobContext, spec: VmSpec, vm: VmState) -> str:
    """'' when the guest is as asked, else what is still missing; raises GuestFailed."""
    # --wait: one command that ends when cloud-init has (cloud-init 22.4 cmd/status.py), polled each
    # second, instead of a status command a poll (each poll two requests through pveproxy)
    code, out, err = await ctx.pve.agent_exec(vm.node, vm.vmid, ["cloud-init", "status", "--wait", "--format", "json"],
                                              timeout_s=GUEST_WAIT_S, poll_s=1.0)
    try:
        st = json.loads(out) if out.strip() else {}
    except ValueError:
        st = {}
    status = str(st.get("status") or "")
    if status == "error":
        errors = "; ".join(str(e) for e in st.get("errors") or []) or (st.get("detail") or err or "").strip()
        raise GuestFailed(f"cloud-init failed in the guest of VM {vm.vmid}: {errors}")
    if status == "disabled":
        raise GuestFailed(f"cloud-init found no seed in the guest of VM {vm.vmid}: it has no cloud-init drive")
    if status != "done":
        return f"cloud-init is {status or 'not reporting'}" + (f" ({err.strip()})" if code not in (0, 1, 2) else "")
    iid = ((await ctx.pve.agent_file_read(vm.node, vm.vmid, INSTANCE_ID_FILE)) or b"").decode("utf-8", "replace").strip()
    if not any(r.get("pending") is not None or r.get("delete") for r in await ctx.pve.cloudinit_pending(vm.node, vm.vmid)):
        # (with changes pending, the drive the guest booted from was generated before them)
        meta = yaml.safe_load(await ctx.pve.cloudinit_dump(vm.node, vm.vmid, "meta")) or {}
        want = str(meta.get("instance-id", "")) if isinstance(meta, dict) else ""
        if want and iid != want:
            raise GuestFailed(f"the guest of VM {vm.vmid} booted from another seed: its instance-id is {iid or 'none'!r}, "
                              f"z9's cloud-init drive gives {want!r}")
    host = await ctx.pve.agent_hostname(vm.node, vm.vmid)
    if host.split(".", 1)[0] != spec.name:
        raise GuestFailed(f"the guest of VM {vm.vmid} calls itself {host!r}, not {spec.name!r}: "
                          "it did not take its hostname from z9's cloud-init drive")
    return ""


async def record_guest_failure(ctx: JobContext, vm: VmState) -> None:
    """Before the job fails on its guest: the VM facts verify saw (the server's ``observed``)."""
    await store.server_observed(ctx.pool, ctx.job.resource_id, vmid=vm.vmid, node=vm.node,
                                power_state="running" if vm.running else "stopped")
