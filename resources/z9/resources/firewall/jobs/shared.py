"""What the firewall's job kinds — FirewallCreate, FirewallSetRules, FirewallApplyToResources,
FirewallRemoveFromResources, FirewallDelete (one module each beside this one) — share: one reconciler whose
intent is the database (the firewall's rules, its member rows), so every kind converges every server it
touches to the same thing: that server's VM firewall as *all* its firewalls compile (``VmParts.firewall``,
:func:`z9.executor.vms.effective_firewall`), beside the server kind's platform rules.

observe  for each server the job touches (its members, those leaving, the job's ``servers``): its VM (by
         tag), its firewall as the server's jobs keep it plus every type's contribution, read now; the
         datacenter firewall's switch.
plan     (pure) ``firewall`` for each VM whose firewall differs (rules rewritten whole under the list's
         digest, new first: :func:`z9.executor.vms.apply_firewall`); then ``wait_cycle`` while a member is
         pending: pve-firewall enforces what is written only at its next compile, every 10 s
         (``src/PVE/Service/pve_firewall.pm`` ``$updatetime = 10``) — the API write returns before.
apply    each step re-reads the VM (the deletion guard, its lock) and writes only what differs; the time of
         the last write is remembered (the job's memo: a retry waits from it, not from its own start).
verify   observe again: every VM as its firewalls say (else a temporary error: a retry converges it); then,
         one cycle after the last write, the check: the rules read back answer as the tenant's rules say —
         each opened port accepted from its sources, a port no rule opens dropped (:func:`check_member`,
         pve-firewall's chain order as :func:`z9.executor.vms.inbound_drop` evaluates it). A member passing
         it is ``applied``; ``enforced`` is the datacenter firewall's, the VM's and its NIC's switches.
"""
from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any

from z9.common.errors import TemporaryError
from z9.common.models import Job
from z9.executor import guard, vms
from z9.executor.context import JobContext, Step
from z9.executor.proxmox import VmState
from z9.resources import firewall as fwt
from z9.resources.firewall import FIREWALL, Firewall
from z9.resources.firewall import store as fw_store
from z9.resources.firewall.compile import WITH_PORTS, ipset_name
from z9.resources.firewall.pve import ClusterIpsets
from z9.resources.server.jobs.shared import firewall_part

log = logging.getLogger("z9.resources.firewall")

#: pve-firewall's compile cycle (pve_firewall.pm ``$updatetime = 10``) and a margin past it
CYCLE_S = 10.0
CYCLE_MARGIN_S = 1.0
OUTSIDE_PROBE = "192.0.2.1"  # TEST-NET-1: a source no tenant rule names unless it opens to everyone


@dataclass
class ServerFw:
    server_id: str
    vm: VmState | None
    part: Any = None  # the server's FirewallPart with every contribution (effective_firewall)
    read: vms.FirewallState | None = None
    drift: list[str] = field(default_factory=list)


@dataclass
class World:
    row: Firewall | None
    servers: dict[str, ServerFw] = field(default_factory=dict)
    cluster_enabled: bool = False
    superseded: str | None = None
    # the cluster IP sets ("members of firewall X") this job keeps: set name → (want, have; None: no set)
    ipsets: dict[str, tuple[list[str], list[str] | None]] = field(default_factory=dict)
    drop_ipset: bool = False  # the final delete: the firewall's own set goes (nobody names it any more)


def touched(row: Firewall, job: Job) -> list[str]:
    """The servers a job looks at: the firewall's members (those leaving too) and the job's own."""
    return sorted({m.server_id for m in (row.members or ())} | set(job.args.get("servers") or []))


async def observe_server(ctx: JobContext, server_id: str) -> ServerFw:
    vm = await vms.find_one_vm(ctx, server_id)
    if vm is None or vm.lock:
        return ServerFw(server_id, vm)
    part = await vms.effective_firewall(ctx, firewall_part(server_id))
    read = await vms.observe_firewall(ctx, part, vm)
    return ServerFw(server_id, vm, part, read, vms.firewall_drift(part, vm, read))


def vm_address(vm: VmState | None) -> str | None:
    """The address a server's VM has from z9 (its cloud-init ``ipconfig0``: a pool's or the private
    network's); None for a DHCP guest (its lease is not known to z9)."""
    if vm is None:
        return None
    for part in str(vm.config.get("ipconfig0", "")).split(","):
        k, _, v = part.partition("=")
        if k == "ip" and v and v != "dhcp":
            return v.split("/", 1)[0]
    return None


async def member_addresses(ctx: JobContext, firewall_id: str) -> list[str]:
    """What firewall ``firewall_id``'s cluster IP set holds: its members' addresses (not those leaving, nor
    those of a server being deleted)."""
    out = []
    for sid in await fw_store.members_with_live_servers(ctx.pool, firewall_id):
        addr = vm_address(await vms.find_one_vm(ctx, sid))
        if addr:
            out.append(addr)
    return sorted(set(out))


async def observe_ipsets(ctx: JobContext, row: Firewall, delete: bool) -> dict[str, tuple[list[str], list[str] | None]]:
    """The cluster IP sets this job keeps: the firewall's own when some live firewall's rule names its
    members (updated in the job that changes its membership), and every set its own rules name (they
    must exist, filled, before a rule naming them is written: PVE refuses ``no such ipset``)."""
    wanted = set()
    if not delete and await fw_store.referenced_by(ctx.pool, row.id):
        wanted.add(row.id)
    for r in row.rules if not delete else []:
        wanted.update(r.get("source_firewalls") or [])
        wanted.update(r.get("destination_firewalls") or [])
    if not wanted:
        return {}
    sets = ClusterIpsets(ctx.pve)
    have_names = await sets.names()
    out = {}
    for fid in sorted(wanted):
        name = ipset_name(fid)
        have = [str(e["cidr"]) for e in (await sets.entries(name) or [])] if name in have_names else None
        out[name] = (await member_addresses(ctx, fid), have)
    return out


async def observe(ctx: JobContext) -> World:
    row = await fw_store.get(ctx.pool, ctx.job.resource_id or "")
    if row is None or row.status == "deleted":
        return World(row, superseded="gone")
    if ctx.job.kind == fwt.FIREWALL_DELETE and row.status != "destroying":
        return World(row, superseded=row.status)
    row = (await fw_store.with_members(ctx.pool, [row]))[0]
    w = World(row, cluster_enabled=str((await ctx.pve.cluster_firewall_options()).get("enable", 0)) == "1")
    delete = ctx.job.kind == fwt.FIREWALL_DELETE
    w.ipsets = await observe_ipsets(ctx, row, delete)
    if delete:
        w.drop_ipset = ipset_name(row.id) in await ClusterIpsets(ctx.pve).names()
    for sid in touched(row, ctx.job):
        w.servers[sid] = await observe_server(ctx, sid)
    return w


def pending(w: World) -> list[str]:
    assert w.row is not None
    return [m.server_id for m in (w.row.members or ()) if m.state == "pending"
            and w.servers.get(m.server_id) is not None and w.servers[m.server_id].vm is not None]


def plan(job: Job, w: World) -> list[Step]:
    """Pure: a ``firewall`` step for each VM not as its firewalls say, then ``wait_cycle`` while a member
    with a VM is pending."""
    if w.superseded or w.row is None:
        return []
    if w.drop_ipset:
        return [Step("delete_ipset", {"name": ipset_name(w.row.id)})]
    # the sets first: a rule naming one is refused while it does not exist
    steps = [Step("ipset", {"name": name, "want": want})
             for name, (want, have) in w.ipsets.items() if have is None or sorted(have) != want]
    steps += [Step("firewall", {"server_id": s.server_id, "vmid": s.vm.vmid, "node": s.vm.node, "drift": s.drift})
             for s in w.servers.values() if s.vm is not None and s.drift]
    if any(s.name == "firewall" for s in steps) or pending(w):
        steps.append(Step("wait_cycle", {"seconds": CYCLE_S}))
    return steps


async def apply(ctx: JobContext, w: World, step: Step) -> None:
    if step.name == "ipset":
        name, want = step.detail["name"], list(step.detail["want"])
        sets = ClusterIpsets(ctx.pve)
        have = await sets.entries(name)
        if have is None:
            await ctx.fence()
            await sets.create(name, f"z9: the members of firewall {name.removeprefix('z9-')}")
            have = []
        for ip in want:
            if ip not in {str(e["cidr"]) for e in have}:
                await ctx.fence()
                await sets.add(name, ip, "z9 firewall member")
        for e in have:
            if str(e["cidr"]) not in want:
                await ctx.fence()
                await sets.remove(name, str(e["cidr"]))
        return
    if step.name == "delete_ipset":
        await ctx.fence()
        await ClusterIpsets(ctx.pve).delete(step.detail["name"])
        return
    if step.name == "firewall":
        sid = step.detail["server_id"]
        cur = w.servers[sid]
        assert cur.vm is not None
        st = await guard.reread_guarded(ctx, sid, cur.vm)
        now = await observe_server(ctx, sid)
        if now.vm is not None and now.drift:
            await vms.apply_firewall(ctx, now.part, st, step, now.read)
            await ctx.remember(written_at=ctx.clock.time())
        return
    if step.name == "wait_cycle":
        since = float(ctx.memo.get("written_at") or 0.0)
        if not since:
            # nothing written by this job (a server's own create wrote it): one whole cycle from now
            since = ctx.clock.time()
            await ctx.remember(written_at=since)
        left = since + CYCLE_S + CYCLE_MARGIN_S - ctx.clock.time()
        if left > 0:
            await ctx.step_detail(step, until=since + CYCLE_S + CYCLE_MARGIN_S)
            await ctx.clock.sleep(left)
        return
    raise TemporaryError(f"firewall: unknown step {step.name!r}")


def _first_address(cidr: str) -> str:
    net = ipaddress.ip_network(cidr, strict=False)
    return str(net.network_address + (1 if net.num_addresses > 2 else 0))


def _closed_port(rules: list[dict[str, Any]]) -> int | None:
    """A TCP port no tenant rule opens (None: every one is)."""
    opened: list[tuple[int, int]] = []
    for r in rules:
        if r["direction"] != "in" or r["protocol"] != "tcp":
            continue
        p = r.get("port")
        if p in (None, "any"):
            return None
        lo, _, hi = str(p).partition("-")
        opened.append((int(lo), int(hi or lo)))
    for port in (1, 7, 9, 13, 17, 19, 113, 6, 4, 2):
        if not any(a <= port <= b for a, b in opened):
            return port
    return None


def check_member(firewalls: list[Firewall], s: ServerFw, cluster_enabled: bool) -> tuple[bool, bool, str | None]:
    """(applied, enforced, detail) for one member whose VM's firewall was read one cycle after the last
    write: the rules read back admit what the tenant's rules open (each ``in`` rule's port from the first
    address of its first source) and drop a TCP port none opens, from outside."""
    if s.vm is None or s.read is None:
        return False, False, "the server has no VM (yet)"
    if s.drift:
        return False, False, "its VM firewall differs: " + "; ".join(s.drift)
    opts = s.read.options
    rules: list[Mapping[str, Any]] = list(s.read.rules)
    nic = str(s.vm.config.get("net0", ""))
    enforced = cluster_enabled and str(opts.get("enable", 0)) == "1" and "firewall=1" in nic.split(",")
    # the check runs on the VM's own switches (the datacenter's aside: off, nothing is filtered at all)
    on = {**opts, "enable": 1}
    tenant = [r for fw in firewalls for r in fw.rules]
    for r in tenant:
        if r["direction"] != "in" or not r.get("source_ips"):
            continue
        src = _first_address(r["source_ips"][0])
        port = None
        if r["protocol"] in WITH_PORTS and r.get("port") not in (None, "any"):
            port = int(str(r["port"]).partition("-")[0])
        if r["protocol"] in WITH_PORTS and port is None:
            port = 1
        dropped = vms.inbound_drop(on, rules, nic, src, r["protocol"], port)
        if dropped is not None:
            return False, enforced, f"{r['protocol']} port {port} from {src} is dropped by {dropped}"
    closed = _closed_port(tenant)
    if closed is not None and vms.inbound_drop(on, rules, nic, OUTSIDE_PROBE, "tcp", closed) is None:
        return False, enforced, f"tcp port {closed} (no rule opens it) is accepted from {OUTSIDE_PROBE}"
    return True, enforced, None


async def verify(ctx: JobContext) -> dict[str, Any] | None:
    w = await observe(ctx)
    if w.superseded or w.row is None:
        return None
    if w.drop_ipset:
        raise TemporaryError(f"verify: the cluster IP set {ipset_name(w.row.id)} is still there")
    stale = [n for n, (want, have) in w.ipsets.items() if have is None or sorted(have) != want]
    if stale:
        raise TemporaryError("verify: the cluster IP sets " + ", ".join(stale) + " do not hold the members yet")
    left = [s.server_id for s in w.servers.values() if s.vm is not None and s.drift]
    if left:
        raise TemporaryError("verify: the VM firewall of " + ", ".join(left) + " is not as its firewalls say yet")
    seen: dict[str, Any] = {}
    for m in w.row.members or ():
        s = w.servers.get(m.server_id)
        if s is None:
            continue
        if m.state == "removing":
            seen[m.server_id] = {"removed": s.vm is None or not s.drift}
            continue
        firewalls = await fw_store.of_server(ctx.pool, m.server_id)
        ok, enforced, detail = check_member(firewalls, s, w.cluster_enabled)
        seen[m.server_id] = {"applied": ok, "enforced": enforced, "detail": detail}
    return {"generation": w.row.generation, "members": seen, "cluster_firewall": w.cluster_enabled,
            "at": ctx.clock.time()}


async def record(conn: Any, ctx: JobContext, observed: dict[str, Any] | None) -> None:
    rid = ctx.job.resource_id or ""
    if ctx.job.kind == fwt.FIREWALL_DELETE:
        if observed is not None:
            await FIREWALL.deleted(conn, rid)
        return
    if observed is None:
        return
    from datetime import datetime

    at = datetime.fromtimestamp(float(observed["at"]), UTC)
    for sid, m in observed["members"].items():
        if "removed" in m:
            if m["removed"]:
                await fw_store.member_removed(conn, rid, sid)
            continue
        await fw_store.member_applied(conn, rid, sid, int(observed["generation"]), applied=bool(m["applied"]),
                                      enforced=bool(m["enforced"]), detail=m["detail"], at=at)
    await fw_store.observed(conn, rid, {"cluster_firewall": observed["cluster_firewall"],
                                        "members": len(observed["members"])},
                            status="active", from_statuses=("creating", "active", "failed"))


async def record_failure(conn: Any, ctx: JobContext, error: dict[str, Any]) -> None:
    await FIREWALL.mark_failed_by_job(conn, ctx.job.resource_id or "", error["message"], kind=ctx.job.kind,
                                      refused=bool(error.get("refused")))


class FirewallKind:
    """One job kind of the firewall type (every phase shared; see the module docstring)."""

    def __init__(self, kind: str):
        self.KIND = kind

    async def observe(self, ctx: JobContext) -> World:
        return await observe(ctx)

    def plan(self, job: Job, world: World) -> list[Step]:
        return plan(job, world)

    async def apply(self, ctx: JobContext, world: World, step: Step) -> None:
        await apply(ctx, world, step)

    async def verify(self, ctx: JobContext) -> dict[str, Any] | None:
        return await verify(ctx)

    async def record(self, conn: Any, ctx: JobContext, observed: dict[str, Any] | None) -> None:
        await record(conn, ctx, observed)

    async def record_failure(self, conn: Any, ctx: JobContext, error: dict[str, Any]) -> None:
        await record_failure(conn, ctx, error)
