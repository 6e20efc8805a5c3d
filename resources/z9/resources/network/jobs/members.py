"""NetworkAttach, NetworkDetach: a server's NIC on a network (job of the network, the server its lock
key: it runs after the server's earlier jobs — at a create, after ServerCreate made and started the VM).

observe  the membership row (address, NIC), the network's VNet, the server's VM (by its identity tag)
         and — running, with a guest agent — the guest's interfaces.
plan     (pure) attach: ``nic`` (``netN: virtio,bridge=<vnet>,firewall=1,mtu=<zone MTU>`` and cloud-init
         ``ipconfigN: ip=<address>/<prefix>``, hot-plugged into a running VM), ``ip_filter`` (the VM's
         ``ipfilter-netN`` set holding the address only: pve-firewall filters a NIC's sources by it),
         ``guest`` (a running guest: the NIC found by its MAC, brought up with the MTU and given the
         address — cloud-init applies ``ipconfigN`` at the next boot, PVE regenerates the drive then);
         detach: ``unplug`` (``delete=netN,ipconfigN``) and the set removed.
apply    each step re-reads the VM (the deletion guard, its lock) and acts only if still needed.
verify   observe again: the plan must be empty; record: the member ``attached`` (detach: the row gone —
         its address is free only now).
"""
from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field
from typing import Any

from z9.common.errors import PermanentError, TemporaryError
from z9.common.models import Job
from z9.executor import guard, vms
from z9.executor.context import JobContext, Step
from z9.executor.proxmox import VmState
from z9.resources.network import (
    ENTRY_COMMENT,
    NETWORK_ATTACH,
    NETWORK_DETACH,
    Member,
    Network,
)
from z9.resources.network import store as net_store

NIC, IP_FILTER, GUEST, UNPLUG = "nic", "ip_filter", "guest", "unplug"


@dataclass
class World:
    network: Network | None
    member: Member | None
    vm: VmState | None
    ipset: list[dict[str, Any]] | None = None
    guest_ifaces: list[dict[str, Any]] | None = None  # ``ip -j addr`` rows; None: not looked (or not up)
    skip: str | None = None
    mtu: int = 1450
    extra: dict[str, Any] = field(default_factory=dict)


def nic_value(current: str | None, vnet: str, mtu: int) -> str:
    """``netN`` on the VNet's bridge through the firewall with the zone's MTU, keeping the NIC's MAC."""
    mac = re.match(r"virtio=([0-9A-Fa-f:]{17})", current or "")
    return f"virtio{'=' + mac.group(1) if mac else ''},bridge={vnet},firewall=1,mtu={mtu}"


def _opts(net: str) -> dict[str, str]:
    return dict(p.partition("=")[::2] for p in str(net).split(",")[1:] if p)


def nic_ok(current: str | None, vnet: str, mtu: int) -> bool:
    o = _opts(current or "")
    return bool(current) and o.get("bridge") == vnet and o.get("firewall") == "1" and o.get("mtu") == str(mtu)


def ipconfig(m: Member, net: Network) -> str:
    return f"ip={m.address}/{net.network.prefixlen}"


def mac_of(net: str | None) -> str | None:
    m = re.match(r"\w+=([0-9A-Fa-f:]{17})", net or "")
    return m.group(1).lower() if m else None


def guest_has(ifaces: list[dict[str, Any]], mac: str | None, cidr: str) -> bool:
    want = ipaddress.ip_interface(cidr)
    for i in ifaces:
        if mac and str(i.get("address", "")).lower() == mac:
            return any(a.get("local") == str(want.ip) and int(a.get("prefixlen", -1)) == want.network.prefixlen
                       for a in i.get("addr_info") or [])
    return False


def plan(kind: str, w: World) -> list[Step]:
    """Pure: the steps left (see the module docstring)."""
    if w.skip or w.member is None or w.network is None:
        return []
    m, net, vm = w.member, w.network, w.vm
    if vm is None:
        return []
    cfg = vm.config
    if kind == NETWORK_DETACH:
        steps = []
        if m.nic in cfg or f"ipconfig{m.nic[3:]}" in cfg:
            steps.append(Step(UNPLUG, {"vmid": vm.vmid, "nic": m.nic}))
        if w.ipset is not None:
            steps.append(Step(IP_FILTER, {"vmid": vm.vmid, "nic": m.nic, "remove": True}))
        return steps
    steps = []
    if not nic_ok(cfg.get(m.nic), net.vnet, w.mtu) or cfg.get(f"ipconfig{m.nic[3:]}") != ipconfig(m, net):
        steps.append(Step(NIC, {"vmid": vm.vmid, "nic": m.nic, "vnet": net.vnet, "ip": m.address}))
    if not any(str(e.get("cidr")) == m.address for e in (w.ipset or [])):
        steps.append(Step(IP_FILTER, {"vmid": vm.vmid, "nic": m.nic, "ip": m.address}))
    if w.guest_ifaces is not None and (steps or not guest_has(w.guest_ifaces, mac_of(cfg.get(m.nic)),
                                                                 f"{m.address}/{net.network.prefixlen}")):
        steps.append(Step(GUEST, {"vmid": vm.vmid, "nic": m.nic, "ip": m.address}))
    return steps


async def _guest_ifaces(ctx: JobContext, vm: VmState) -> list[dict[str, Any]] | None:
    if not vm.running or not vms.agent_configured(vm.config):
        return None
    code, out, err = await ctx.pve.agent_exec(vm.node, vm.vmid, ["ip", "-j", "addr", "show"],
                                              poll_s=ctx.settings.task_poll_s)
    if code != 0:
        raise TemporaryError(f"VM {vm.vmid}: ip addr in the guest exited {code}: {err.strip()}")
    return list(json.loads(out or "[]"))


async def _observe(ctx: JobContext, kind: str) -> World:
    server_id = str(ctx.job.args.get("server_id") or "")
    net = await net_store.get(ctx.pool, ctx.job.resource_id or "")
    member = await net_store.member_get(ctx.pool, ctx.job.resource_id or "", server_id)
    if net is None or member is None:
        return World(net, member, None, skip="no such membership (detached since)")
    if kind == NETWORK_ATTACH and member.state == "detaching":
        return World(net, member, None, skip="a detach was asked since")
    sdn = ctx.settings.regions[net.region].sdn
    mtu = sdn.guest_mtu if sdn else 1500
    vm = await vms.find_one_vm(ctx, server_id)
    if vm is None:
        if kind == NETWORK_DETACH:
            return World(net, member, None, mtu=mtu)
        raise TemporaryError(f"server {server_id} has no VM yet: its NIC on network {net.id} waits for it")
    if vm.lock:
        raise TemporaryError(f"VM {vm.vmid} is locked ({vm.lock})")
    ipset = await ctx.pve.ipset_entries(vm.node, vm.vmid, vms.ipfilter_set(member.nic))
    ifaces = await _guest_ifaces(ctx, vm) if kind == NETWORK_ATTACH else None
    return World(net, member, vm, ipset=ipset, guest_ifaces=ifaces, mtu=mtu)


async def _nic(ctx: JobContext, w: World, step: Step) -> None:
    assert w.member is not None and w.network is not None and w.vm is not None
    st = await guard.reread_guarded(ctx, str(ctx.job.args["server_id"]), w.vm)
    m, net = w.member, w.network
    want = {m.nic: nic_value(st.config.get(m.nic), net.vnet, w.mtu), f"ipconfig{m.nic[3:]}": ipconfig(m, net)}
    await ctx.fence()
    status = await ctx.wait_task(step, await ctx.pve.configure(st.node, st.vmid, want, digest=st.config.get("digest")))
    if status != "OK" and not status.startswith("WARNINGS"):
        raise TemporaryError(f"VM {st.vmid}: plugging {m.nic} on {net.vnet} ended {status}")


async def _ip_filter(ctx: JobContext, w: World, step: Step) -> None:
    assert w.member is not None and w.vm is not None
    m, vm = w.member, w.vm
    name = vms.ipfilter_set(m.nic)
    await ctx.fence()
    if step.detail.get("remove"):
        await ctx.pve.ipset_delete(vm.node, vm.vmid, name)
        return
    await ctx.pve.ipset_create(vm.node, vm.vmid, name, comment=f"{ENTRY_COMMENT}{m.network_id}: what {m.nic} may send from")
    for e in await ctx.pve.ipset_entries(vm.node, vm.vmid, name) or []:
        if str(e.get("cidr")) != m.address:
            await ctx.pve.ipset_remove(vm.node, vm.vmid, name, str(e.get("cidr")))
    await ctx.pve.ipset_add(vm.node, vm.vmid, name, m.address, comment=f"{ENTRY_COMMENT}{m.network_id}")


async def _guest(ctx: JobContext, w: World, step: Step) -> None:
    """The running guest takes the NIC now: found by its MAC, up with the zone's MTU, the address on it."""
    assert w.member is not None and w.network is not None and w.vm is not None
    st = await guard.reread_guarded(ctx, str(ctx.job.args["server_id"]), w.vm)
    m, net = w.member, w.network
    mac = mac_of(st.config.get(m.nic))
    ifaces = await _guest_ifaces(ctx, st) or []
    name = next((str(i.get("ifname")) for i in ifaces if str(i.get("address", "")).lower() == mac), None)
    if name is None:
        raise TemporaryError(f"VM {st.vmid}: the guest shows no interface with {m.nic}'s MAC {mac} yet")
    cidr = f"{m.address}/{net.network.prefixlen}"
    for argv in (["ip", "link", "set", "dev", name, "up", "mtu", str(w.mtu)],
                 *([] if guest_has(ifaces, mac, cidr) else [["ip", "addr", "add", cidr, "dev", name]])):
        code, _, err = await ctx.pve.agent_exec(st.node, st.vmid, argv, poll_s=ctx.settings.task_poll_s)
        if code != 0 and "File exists" not in err:
            raise TemporaryError(f"VM {st.vmid}: {' '.join(argv)} in the guest exited {code}: {err.strip()}")
    await ctx.step_detail(step, iface=name)


async def _unplug(ctx: JobContext, w: World, step: Step) -> None:
    assert w.member is not None and w.vm is not None
    st = await guard.reread_guarded(ctx, str(ctx.job.args["server_id"]), w.vm)
    m = w.member
    keys = [k for k in (m.nic, f"ipconfig{m.nic[3:]}") if k in st.config]
    if not keys:
        return
    await ctx.fence()
    status = await ctx.wait_task(step, await ctx.pve.configure(st.node, st.vmid, {"delete": ",".join(keys)},
                                                               digest=st.config.get("digest")))
    if status != "OK" and not status.startswith("WARNINGS"):
        raise TemporaryError(f"VM {st.vmid}: unplugging {m.nic} ended {status}")


STEPS = {NIC: _nic, IP_FILTER: _ip_filter, GUEST: _guest, UNPLUG: _unplug}


class MemberKind:
    def __init__(self, kind: str):
        self.KIND = kind

    async def observe(self, ctx: JobContext) -> World:
        return await _observe(ctx, self.KIND)

    def plan(self, job: Job, world: World) -> list[Step]:
        return plan(self.KIND, world)

    async def apply(self, ctx: JobContext, world: World, step: Step) -> None:
        fn = STEPS.get(step.name)
        if fn is None:
            raise PermanentError(f"{self.KIND}: unknown step {step.name}")
        await fn(ctx, world, step)
        if step.name == NIC:  # what the guest shows is read again after the NIC is there
            world.vm = await ctx.pve.vm_state(world.vm.node, world.vm.vmid) if world.vm else None

    async def verify(self, ctx: JobContext) -> dict[str, Any] | None:
        w = await _observe(ctx, self.KIND)
        if w.skip:
            return None
        left = plan(self.KIND, w)
        if left:
            raise TemporaryError("verify: the server's NIC on the network is not as wanted yet: "
                                 + ", ".join(s.name for s in left))
        return {"server_id": ctx.job.args.get("server_id")}

    async def record(self, conn: Any, ctx: JobContext, seen: dict[str, Any] | None) -> None:
        if seen is None:
            return
        nid, sid = ctx.job.resource_id or "", str(seen["server_id"])
        if self.KIND == NETWORK_DETACH:
            await net_store.member_delete(conn, nid, sid)
        else:
            member = await net_store.member_get(conn, nid, sid)
            if member is not None and member.state == "attaching":
                await net_store.member_set_state(conn, nid, sid, "attached")

    async def record_failure(self, conn: Any, ctx: JobContext, error: dict[str, Any]) -> None:
        return None  # the network stays as it is; the job carries the reason (the member stays attaching)


ATTACH = MemberKind(NETWORK_ATTACH)
DETACH = MemberKind(NETWORK_DETACH)
JOB_KINDS = (ATTACH, DETACH)
