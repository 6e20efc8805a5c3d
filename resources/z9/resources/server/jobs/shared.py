"""What the server job kinds share: a server is the owner of one VM, member ``main``; the VM
machinery itself (finding VMs by tag, the guard, the clone ladder) is :mod:`z9.executor.vms`.

A server's VM carries only its own identity (``VmSpec.only_own_identity``): the template's
cloud-init values and seed media are deleted in the configure step, so the guest boots from PVE's
drive with exactly the request's keys. :func:`check_guest` reads the result inside the guest.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

import yaml

from z9.common.errors import PermanentError, Snooze, TemporaryError
from z9.common.models import Job
from z9.resources.server import SERVER, SERVER_REBOOT, SERVER_RESIZE, SERVER_START, SERVER_STOP

from z9.executor import guard, vms
from z9.executor.context import JobContext, Step
from z9.executor.proxmox import VmState
from z9.executor.vms import (MAIN, RESOLV_CONF, FirewallPart, FirewallSpec, PrivateAddress, VmSpec, agent_configured,
                             no_dns, resolv_nameservers)
from z9.executor.vms import private_address as vm_private_address
from z9.resources.server import store as server_store

INSTANCE_ID_FILE = "/var/lib/cloud/data/instance-id"  # cloud-init writes the current instance's id there


def spec(job: Job, private: PrivateAddress | None = None) -> VmSpec:
    """The server's VM, from the job's arguments (the create body) and, for a server without a
    primary address, the address z9 gave it on the region's private network (``private``: its
    static cloud-init network and the one address its IP filter lets it send from; the address
    jobs add its floating addresses to that filter beside it)."""
    a = job.args
    # a primary address from a pool: the API put its cloud-init keys in the args
    config = {k: str(a[k]) for k in ("ipconfig0", "nameserver") if a.get(k)}
    ip_filter: tuple[str, ...] = ()
    if "ipconfig0" not in config and private is not None:
        config["ipconfig0"] = private.ipconfig0
        if private.nameservers:
            config["nameserver"] = " ".join(private.nameservers)
        ip_filter = (private.ip,)
    return VmSpec(owner=job.resource_id, member=MAIN, name=a["name"], image=a["image"], cores=int(a["cores"]),
                  memory_mib=int(a["memory_mib"]), disk_gib=int(a["disk_gib"]),
                  ssh_keys=tuple(a.get("ssh_keys") or ()), only_own_identity=True,
                  config=config, ip_filter=ip_filter, firewall=FIREWALL)


# A server's VM firewall: explicit policies accepting every connection in and out, as a Hetzner or
# DigitalOcean server without a firewall does — its guest decides what it serves — while its IP
# filter (its addresses' jobs, or its private address) still holds what it may send from. A load
# balancer's appliances reach it on its targets' ports under this policy (nothing to open for them).
FIREWALL = FirewallSpec(policy_in="ACCEPT", policy_out="ACCEPT")


# Every job of a server that finds its VM keeps its firewall part (ServerCreate through its VM spec;
# start, reboot, resize through these): a policy changed by hand, or a VM made before z9 wrote one, is
# put back by the next job of the server (the filter set stays the addresses' and the create's).
FIREWALL_STEP = "firewall"


def firewall_part(server_id: str) -> FirewallPart:
    return FirewallPart(owner=server_id, firewall=FIREWALL)


async def firewall_drift(ctx: JobContext, vm: VmState | None) -> list[str]:
    """What of the server's VM firewall is not as z9 keeps it (read now; [] without a VM, or locked)."""
    if vm is None or vm.lock:
        return []
    part = await vms.effective_firewall(ctx, firewall_part(ctx.job.resource_id))
    return vms.firewall_drift(part, vm, await vms.observe_firewall(ctx, part, vm))


def firewall_steps(vm: VmState, drift: list[str]) -> list[Step]:
    """Pure: the step putting the firewall back, first, when it drifted."""
    return [Step(FIREWALL_STEP, {"vmid": vm.vmid, "node": vm.node, "drift": drift})] if drift else []


async def apply_firewall(ctx: JobContext, vm: VmState, step: Step) -> None:
    st = await guard.reread_guarded(ctx, ctx.job.resource_id, vm)
    vms.refuse_if_locked(st)
    part = await vms.effective_firewall(ctx, firewall_part(ctx.job.resource_id))
    fw = await vms.observe_firewall(ctx, part, st)
    if vms.firewall_drift(part, st, fw):
        await vms.apply_firewall(ctx, part, st, step, fw)


async def private_address(ctx: JobContext) -> PrivateAddress | None:
    """The server's private address when it has no primary (None: it has one, or the region has no
    private network)."""
    if ctx.job.args.get("ipconfig0"):
        return None
    return await vm_private_address(ctx, ctx.job.resource_id, MAIN)


async def recorded_vm(ctx: JobContext) -> list[tuple[int, str]]:
    """The (vmid, node) the database last recorded for the server (a suspect, never trusted)."""
    server = await server_store.server_get(ctx.pool, ctx.job.resource_id)
    return [(server.vmid, server.node)] if server is not None and server.vmid is not None else []


#: the jobs whose failure a later power action's verify mends: a failed power action or resize says
#: nothing the next verify that reads the VM as intended does not answer (a failed create — a guest
#: that did not come up as asked — is not mended by a start: its verify does not look at the guest)
MENDED_BY_VERIFY = frozenset({SERVER_START, SERVER_STOP, SERVER_REBOOT, SERVER_RESIZE})


async def verified_power(conn: Any, ctx: JobContext, status: str) -> None:
    """Status from the latest verify: the server moves to ``status`` (what verify read: ``running``
    or ``stopped``) from ``running``/``stopped`` — and from ``failed`` when its latest failed job was
    a power action or a resize (:data:`MENDED_BY_VERIFY`): that job keeps its reason, the server no
    longer carries it."""
    rid = ctx.job.resource_id
    allowed: tuple[str, ...] = ("running", "stopped")
    if await server_store.server_last_failed_job_kind(conn, rid) in MENDED_BY_VERIFY:
        allowed += ("failed",)
    await SERVER.observed(conn, rid, status=status, from_statuses=allowed)


async def record_failure(conn: Any, ctx: JobContext, error: dict[str, Any]) -> None:
    """The server carries a failed job's reason (``ResourceType.mark_failed_by_job``)."""
    await SERVER.mark_failed_by_job(conn, ctx.job.resource_id, error["message"], kind=ctx.job.kind,
                                    refused=bool(error.get("refused")))




class GuestFailed(PermanentError):
    """The server's guest did not come up as its request asked (cloud-init failed, or it booted
    from another seed): the VM runs, the server is failed with this reason."""


GUEST_SNOOZE_S = 10.0  # a snoozed look into a guest not up yet: again after this long


async def check_guest(ctx: JobContext, spec: VmSpec, vm: VmState) -> None:
    """Inside the running guest (its agent): cloud-init ended without error, the instance is the
    one z9's cloud-init drive describes (its ``meta-data`` instance-id, as PVE generates it from the
    config), the hostname is the server's name and its resolv.conf names a nameserver (DNS). Raises GuestFailed naming what is wrong.
    A guest not up yet is waited on for at most ``server_guest_slot_s`` in this claim, then the job
    snoozes (its attempt given back, its executor slot free for other jobs — a few guests that never
    boot must not hold every slot of the region) and looks again; ``server_guest_ready_s`` after the
    first look (kept in the job's memo) it is a TemporaryError. A VM without a guest agent
    (``agent`` unset or 0) is not looked into."""
    if ctx.settings.server_guest_ready_s <= 0 or not agent_configured(vm.config):
        return
    since = ctx.memo.get("guest_look_since")
    if since is None:
        since = ctx.clock.time()
        await ctx.remember(guest_look_since=since)
    slot_end = ctx.clock.monotonic() + ctx.settings.server_guest_slot_s
    last = "its guest agent does not answer yet"
    # One look at a time: its process (GUEST_LOOK, waiting for cloud-init to end) is asked about
    # until it ended — across this claim and, through the memo, the next one after a snooze — and
    # asked less often the longer it runs; a new one only when the guest no longer knows it (a
    # reboot) or it ended without cloud-init done. Each question is a request through pveproxy.
    look = ctx.memo.get("guest_look")
    pid = int(look["pid"]) if isinstance(look, dict) and look.get("vmid") == vm.vmid else None
    started, seen_running = ctx.clock.monotonic(), False
    delay = ctx.settings.server_guest_poll_s
    looked_at = ctx.clock.monotonic()  # about when verify read the VM's uptime
    agent_up = ctx.pve.exec_first_poll_s(AGENT_UP_KEY)
    if pid is None and vm.uptime_s is not None and agent_up > vm.uptime_s + 1:
        # a guest just started: its agent answered at about this uptime lately — ask then, not
        # once a second before (each "not running" answer is a request through pveproxy)
        await asyncio.sleep(agent_up - vm.uptime_s - 1)
    while True:
        ctx.touch()
        try:
            if pid is None:
                pid = await ctx.pve.agent_exec_start(vm.node, vm.vmid, GUEST_LOOK)
                if vm.uptime_s is not None:
                    ctx.pve.exec_took(AGENT_UP_KEY, vm.uptime_s + ctx.clock.monotonic() - looked_at, True)
                await ctx.remember(guest_look={"vmid": vm.vmid, "pid": pid})
                started, seen_running = ctx.clock.monotonic(), False
                first = ctx.pve.exec_first_poll_s(GUEST_LOOK_KEY)
                if first:
                    await asyncio.sleep(first)
            st = await ctx.pve.agent_exec_status(vm.node, vm.vmid, pid)
            if int(st.get("exited") or 0):
                ctx.pve.exec_took(GUEST_LOOK_KEY, ctx.clock.monotonic() - started, seen_running)
                pid = None
                await ctx.remember(guest_look=None)
                last = await _judge(ctx, spec, vm, str(st.get("out-data") or ""), str(st.get("err-data") or ""))
                if last == "":
                    return
            else:
                seen_running, last = True, "cloud-init is still running in the guest"
        except GuestFailed:
            raise
        except TemporaryError as e:
            # the agent is not up yet (booting), or no longer knows the process (the guest
            # restarted: "Invalid parameter 'pid'"): a new look next time
            last, pid = str(e), None
        if ctx.clock.time() - float(since) > ctx.settings.server_guest_ready_s:
            raise TemporaryError(f"VM {vm.vmid}: the guest is not up after {ctx.settings.server_guest_ready_s:.0f}s: {last}")
        if ctx.clock.monotonic() > slot_end:
            raise Snooze(f"VM {vm.vmid}: {last}; looked into again in {GUEST_SNOOZE_S:.0f}s", delay_s=GUEST_SNOOZE_S)
        # each question is a request through pveproxy: asked less often the longer it takes (from
        # server_guest_poll_s up to GUEST_POLL_MAX_S, or five times the setting when that is less)
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, max(ctx.settings.server_guest_poll_s,
                                     min(GUEST_POLL_MAX_S, 5 * ctx.settings.server_guest_poll_s)))


GUEST_POLL_MAX_S = 5.0  # the longest wait between two questions about the guest look
GUEST_LOOK_KEY = "guest-look"  # its runs' durations, learned by the client (ProxmoxClient.exec_took)
AGENT_UP_KEY = "guest-agent-up"  # the guest's uptime when its agent took the look lately (same store)


_SEP = "z9-guest-look-part"
# One command for the whole look (one agent/exec and its exec-status; it was an exec with its
# polls, a file-read and a get-host-name): cloud-init's status, waiting until it ended (--wait: the
# command ends when cloud-init has, cloud-init 22.4 cmd/status.py; JSON: no progress dots), the
# current instance's id as cloud-init recorded it, and the hostname (what qemu-ga's
# guest-get-host-name answers: gethostname()). ``echo`` before each separator: a file without a
# final newline does not run into it.
GUEST_LOOK = ["sh", "-c", f"cloud-init status --wait --format json; echo; echo {_SEP}; "
                          f"cat {INSTANCE_ID_FILE}; echo; echo {_SEP}; hostname; echo {_SEP}; cat {RESOLV_CONF}"]


def parse_guest_look(out: str) -> tuple[dict[str, Any], str, str, list[str]]:
    """``(cloud-init status, instance-id, hostname, nameservers)`` from :data:`GUEST_LOOK`'s output
    (an empty status, '' and [] where a part is missing)."""
    parts = [p.strip() for p in out.split(f"\n{_SEP}\n")]
    parts += [""] * (4 - len(parts))
    try:
        st = json.loads(parts[0]) if parts[0] else {}
    except ValueError:
        st = {}
    return (st if isinstance(st, dict) else {}), parts[1], parts[2], resolv_nameservers(parts[3])


async def _judge(ctx: JobContext, spec: VmSpec, vm: VmState, out: str, err: str) -> str:
    """What one ended :data:`GUEST_LOOK` says: '' when the guest is as asked, else what is still
    missing; raises GuestFailed."""
    st, iid, host, nameservers = parse_guest_look(out)
    status = str(st.get("status") or "")
    if status == "error":
        errors = "; ".join(str(e) for e in st.get("errors") or []) or str(st.get("detail") or "").strip()
        raise GuestFailed(f"cloud-init failed in the guest of VM {vm.vmid}: {errors or err.strip()}")
    if status == "disabled":
        raise GuestFailed(f"cloud-init found no seed in the guest of VM {vm.vmid}: it has no cloud-init drive")
    if status != "done":
        return f"cloud-init is {status or 'not reporting'}" + (f" ({err.strip()})" if not st and err.strip() else "")
    meta = yaml.safe_load(await ctx.pve.cloudinit_dump(vm.node, vm.vmid, "meta")) or {}
    want = str(meta.get("instance-id", "")) if isinstance(meta, dict) else ""
    # With cloud-init changes pending, the drive the guest booted from was generated before them and
    # the dump (from the config now) is no authority: asked only when the two differ (the outcome of
    # "pending, else compare" in one request where they agree, which is every healthy create).
    if want and iid != want and not any(r.get("pending") is not None or r.get("delete")
                                        for r in await ctx.pve.cloudinit_pending(vm.node, vm.vmid)):
        raise GuestFailed(f"the guest of VM {vm.vmid} booted from another seed: its instance-id is {iid or 'none'!r}, "
                          f"z9's cloud-init drive gives {want!r}")
    if host.split(".", 1)[0] != spec.name:
        raise GuestFailed(f"the guest of VM {vm.vmid} calls itself {host!r}, not {spec.name!r}: "
                          "it did not take its hostname from z9's cloud-init drive")
    if not nameservers:
        raise GuestFailed(no_dns(vm.vmid))
    return ""


async def record_guest_failure(ctx: JobContext, vm: VmState) -> None:
    """Before the job fails on its guest: the VM facts verify saw (the server's ``observed``)."""
    await server_store.server_observed(ctx.pool, ctx.job.resource_id, vmid=vm.vmid, node=vm.node,
                                power_state="running" if vm.running else "stopped")
