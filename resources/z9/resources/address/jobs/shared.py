"""What the address job kinds share: put an address on exactly one server's VM, or on none.

An address is on a VM when (1) the VM carries the tag ``z9-addr-<address id>`` and (2) the VM's
IP set ``ipfilter-net0`` holds the IP. The tag is how a holder is found — by observe, across the
whole cluster, in one ``/cluster/resources`` call, never by the database's idea of it — and the
IP-set entry is what the Proxmox firewall enforces: with the VM's firewall and ``ipfilter`` on,
the VM may send only from the addresses in that set (a VM on a plain bridge could otherwise
claim any address). Order keeps "tag ⊇ entry" true at every instant, so an interrupted job is
always found again by its tag: the new holder is tagged *before* its entry is added, an old
holder loses its entry *before* its tag.

A *primary* address is also the VM's ``ipconfig0`` (+ ``nameserver``): written by ServerCreate's
configure step for a new server, and by an assignment only on a stopped VM (the guest reads a
cloud-init change at its next boot, as a new instance: the API refuses it on a running server).
A *floating* address is configured by the guest itself (documented); the job only routes it.

Enforcement: the VM's ``ipfilter`` is turned on only when every address the VM uses is in its
set — that is, when the server's VM uses a static address its set holds (``ipconfig0``: its
primary, or its address on the region's private network; read from the VM, not from the
database). A server on DHCP (no primary and no private network
address) would lose its own address to the filter — and its VM firewall is on (the server's own
policies, the VM machinery's), where an ``ipfilter-net0`` set filters by merely existing: its floating
addresses are tagged but not listed, and ``observed.enforced`` says the filter is off. So taking a
primary off a VM (its ``ipconfig0`` back to DHCP) turns the VM's filter off again — the address's
``ipfilter`` switch, and the set deleted; never the VM firewall, whose policies and rules are the
server's — unless the region has a private network: then the VM goes to its address there (the
filter stays on, holding it). What the address keeps on a VM it declares (``VmParts`` on its type).

A VM that is not z9's (no ``z9-id-…`` tag) configured with the same IP (``ipconfigN``), or
carrying the address's tag, is a *conflict*: reported on the address (``observed.conflicts``,
``status_reason``), never touched.
"""
from __future__ import annotations

import ipaddress
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from z9.common.errors import PermanentError, TemporaryError
from z9.common.models import Job
from z9.resources.address.model import Address
from z9.resources.address import ADDRESS
from z9.common.tags import ROLE_CUSTOMER, format_tags, identity_tag, platform_roles

from z9.executor import vms
from z9.executor.context import Drift, JobContext, Step, StepKind, StepKinds
from z9.executor.proxmox import VmLocked, VmRef, VmState
from z9.resources.address import store as address_store
from z9.resources.server import store as server_store

log = logging.getLogger("z9.executor.jobs")

IPSET = vms.ipfilter_set("net0")  # the filter of a server's first NIC, where its addresses are
IPCONFIG_KEY = re.compile(r"ipconfig\d+")
_IPCONFIG_IP = re.compile(r"(?:^|,)ip6?=([0-9a-fA-F.:]+)(?:/\d+)?(?:,|$)")


def address_tag(address_id: str) -> str:
    """``z9-addr-<address id>``: the tag of the VM an address is on."""
    return f"z9-addr-{address_id.lower()}"


def server_of(vm: VmState | VmRef) -> str | None:
    """The server id of a z9 customer VM (its ``z9-id-srv_…`` tag), else None."""
    for t in vm.tags:
        if t.startswith("z9-id-srv_"):
            return t[len("z9-id-"):]
    return None


def is_z9_vm(vm: VmState | VmRef) -> bool:
    return any(t.startswith("z9-id-") for t in vm.tags)


def same_ip(entry: str, ip: str) -> bool:
    """An IP-set entry (``10.0.0.5``, ``10.0.0.5/32``) is exactly this one address."""
    try:
        net = ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return False
    return net.num_addresses == 1 and net.network_address == ipaddress.ip_address(ip)


def config_ips(config: dict[str, Any]) -> dict[str, str]:
    """``{ipconfigN: ip}`` of the static addresses a VM's cloud-init config gives it."""
    out = {}
    for k, v in config.items():
        if IPCONFIG_KEY.fullmatch(k) and isinstance(v, str):
            for m in _IPCONFIG_IP.finditer(v):
                out[k] = m.group(1)
    return out


def ipconfig0(address: Address) -> str:
    """The ``ipconfig0`` value of a primary address (see ``Address.ipconfig0``)."""
    return address.ipconfig0()


@dataclass
class Holder:
    """A VM the address is (partly) on: it carries the tag, or, for the target, maybe not yet."""

    vm: VmState
    entries: list[dict[str, Any]] | None  # the IP set's entries; None: no such set
    firewall: dict[str, Any] = field(default_factory=dict)

    def has_entry(self, ip: str) -> bool:
        return any(same_ip(str(e.get("cidr", "")), ip) for e in self.entries or [])


@dataclass
class World:
    address: Address
    want: str | None                 # the server the address should be on (None: on no VM)
    target: Holder | None            # that server's VM (None: no server wanted, or no VM yet)
    holders: list[Holder]            # z9 VMs carrying the tag, other than the target
    conflicts: list[dict[str, Any]]  # foreign VMs using the IP or carrying the tag (never touched)
    enforce: bool                    # turn the target's IP filter on (see the module docstring)
    nameservers: list[str]
    cluster_firewall: bool | None
    # vmid → the address on the region's private network a primary's old holder goes to (its
    # server's: z9.executor.vms.private_address); none: back to DHCP, its filter off
    private: dict[int, Any] = field(default_factory=dict)


async def _holder(ctx: JobContext, ref: VmRef | VmState, *, firewall: bool = False) -> Holder | None:
    st = ref if isinstance(ref, VmState) else await ctx.pve.vm_state(ref.node, ref.vmid)
    if st is None:
        return None
    entries = await ctx.pve.ipset_entries(st.node, st.vmid, IPSET)
    fw = await ctx.pve.firewall_options(st.node, st.vmid) if firewall else {}
    return Holder(st, entries, fw)


async def observe(ctx: JobContext, want: str | None) -> World:
    """The address (intent), the VMs carrying its tag, the wanted server's VM (by its identity
    tag), and foreign VMs using the IP."""
    address = await address_store.address_get(ctx.pool, ctx.job.resource_id)
    if address is None:
        raise PermanentError(f"address {ctx.job.resource_id} does not exist")
    tag, ip = address_tag(address.id), address.ip_text
    # A listing requested now (shared only with lookups in flight that started after this one):
    # the address's holders move between VMs by this job's own steps, which verify must see, and
    # a foreign VM using the IP is known only from the list.
    refs = await ctx.pve.list_vms(not_before=time.monotonic())
    target: Holder | None = None
    enforce = False
    if want is not None:
        server = await server_store.server_get(ctx.pool, want)
        if server is None or server.status in ("destroying", "deleted"):
            raise PermanentError(f"server {want} is {'gone' if server is None else server.status}; "
                                 f"address {address.id} cannot go on it")
        mine = [r for r in refs if identity_tag(want) in r.tags and not r.template]
        if len(mine) > 1:
            raise PermanentError(f"{len(mine)} VMs carry {identity_tag(want)}; an operator must remove the extra ones")
        if not mine:
            if server.status == "failed":
                # ordered after the server's create (its lock key): that create failed for good,
                # and nothing will make a VM; retrying would only spend attempts while the
                # server's deletion waits behind this job (assign again once it has a VM)
                raise PermanentError(f"server {want} failed and has no VM"
                                     + (f" ({server.status_reason})" if server.status_reason else "")
                                     + f"; address {address.id} cannot go on it")
            raise TemporaryError(f"server {want} has no VM yet; the address goes on it once it exists")
        target = await _holder(ctx, mine[0], firewall=True)
        if target is None:
            raise TemporaryError(f"the VM of server {want} vanished while observing")
        enforce = _enforce(address, server, target)
    holders, conflicts = [], []
    for r in refs:
        if r.template or (target is not None and r.vmid == target.vm.vmid):
            continue
        if tag in r.tags:
            if not is_z9_vm(r) or platform_roles(r.tags):
                conflicts.append({"vmid": r.vmid, "node": r.node, "name": r.name, "why": f"carries tag {tag}"})
                continue
            # (a primary's holder: its firewall options too — the filter goes off with the primary)
            h = await _holder(ctx, r, firewall=address.kind == "primary")
            if h is not None:
                holders.append(h)
        elif not is_z9_vm(r):  # its config's addresses only: no power state (one request, not two)
            st = await ctx.pve.vm_state(r.node, r.vmid, status=False)
            for key, used in config_ips(st.config if st else {}).items():
                if used == ip:
                    conflicts.append({"vmid": r.vmid, "node": r.node, "name": st.config.get("name") if st else None,
                                      "why": f"{key} uses {ip}"})
    pool_ns = vms.guest_nameservers(ctx, await address_store.address_pool_nameservers(ctx.pool, address.pool_id))
    try:
        cluster_fw = bool(int((await ctx.pve.cluster_firewall_options()).get("enable", 0)))
    except (TemporaryError, PermanentError) as e:
        log.debug("cluster firewall options unreadable: %s", e)
        cluster_fw = None
    private: dict[int, Any] = {}
    if address.kind == "primary":
        for h in holders:
            sid = server_of(h.vm)
            p = await vms.private_address(ctx, sid, vms.MAIN) if sid else None
            if p is not None:
                private[h.vm.vmid] = p
    return World(address, want, target, holders, conflicts, enforce, pool_ns, cluster_fw, private)


def _enforce(address: Address, server: Any, target: Holder) -> bool:
    """Whether the target VM's IP filter may be on: the VM uses a primary address (static
    ``ipconfig0``) that its IP set holds — read from the VM, not from the database. A primary
    the database records but the VM does not use (its assignment failed: the server was started
    before it ran) would filter out the DHCP address the VM really has. A primary being assigned
    by this job counts: its ``set_ipconfig`` and entry come before ``enable_ipfilter``."""
    if address.kind == "primary":
        return True
    # the VM's static address — its primary, or the one z9 gave it on the region's private network
    # (z9.executor.vms.private_address) — is in its set: every address it uses is then allowed
    used = config_ips({"ipconfig0": target.vm.config.get("ipconfig0")}).get("ipconfig0")
    return used is not None and target.has_entry(used)


def plan(job: Job, world: World) -> list[Step]:
    """Pure: the steps still missing for the address to be on ``world.want``'s VM only.

    Old holders: (a primary, the region having a private network) ``add_private_entry`` — the
    server's private address —, ``remove_entry``, (a primary on a stopped VM) ``clear_ipconfig``
    (to that private address, else DHCP), (a primary going to DHCP) ``disable_ipfilter`` while
    the filter is on, then ``untag``. Target: ``tag``, ``create_ipset``,
    ``add_entry``, for a primary ``set_ipconfig`` (stopped VM only), then ``enable_ipfilter``
    when enforced. A VM locked by another task is waited on (Snooze)."""
    a = world.address
    ip, tag = a.ip_text, address_tag(a.id)
    steps: list[Step] = []
    for h in world.holders:
        d = {"vmid": h.vm.vmid, "node": h.vm.node}
        private = world.private.get(h.vm.vmid) if a.kind == "primary" else None
        if private is not None and not h.has_entry(private.ip):
            # the server's address on the private network goes into its set before its primary
            # leaves it: the filter stays on, never a moment without the address the VM will use
            if h.entries is None:
                steps.append(CREATE_IPSET.step(dict(d)))
            steps.append(ADD_PRIVATE_ENTRY.step(dict(d, ip=private.ip, server=server_of(h.vm))))
        if h.has_entry(ip):
            steps.append(REMOVE_ENTRY.step(dict(d)))
        if a.kind == "primary" and config_ips({"ipconfig0": h.vm.config.get("ipconfig0")}).get("ipconfig0") == ip:
            # its cloud-init must not keep an address it no longer holds (stopped VM only: the API
            # refuses to take a primary off a running server)
            if h.vm.running:
                raise PermanentError(f"VM {h.vm.vmid} is running: its primary address is taken off only while "
                                     "it is stopped")
            steps.append(CLEAR_IPCONFIG.step(dict(d, **({"ipconfig0": private.ipconfig0} if private else {}),
                                                     **({"nameserver": " ".join(private.nameservers)}
                                                        if private and private.nameservers else {}))))
        if a.kind == "primary" and private is None and (_on(h.firewall.get("ipfilter")) or h.entries is not None):
            # the VM is back on DHCP: its IP filter (turned on for this primary) would drop its
            # own address from the next boot on — and with the VM's firewall on, the set alone
            # filters (pve-firewall Firewall.pm generate_tap_rules: "$options->{ipfilter} ||
            # $vmfw_conf->{ipset}->{ipfilter-net0}"), so the filter goes: its switch off, its set
            # deleted. The VM's firewall stays on with its policies and rules (the server's).
            steps.append(DISABLE_IPFILTER.step(dict(d)))
        steps.append(UNTAG.step(dict(d)))
    t = world.target
    if t is not None:
        d = {"vmid": t.vm.vmid, "node": t.vm.node}
        if ROLE_CUSTOMER not in t.vm.tags or platform_roles(t.vm.tags):
            raise PermanentError(f"VM {t.vm.vmid} of server {world.want} is not a customer VM; "
                                 "z9 puts no address on it")
        if tag not in t.vm.tags:
            steps.append(TAG.step(dict(d)))
        # listed in the VM's filter set only where the VM is filtered (a set that exists filters:
        # Firewall.pm generate_tap_rules): a DHCP server (not enforced, no set) would lose its lease
        if world.enforce or t.entries is not None:
            if t.entries is None:
                steps.append(CREATE_IPSET.step(dict(d)))
            if not t.has_entry(ip):
                steps.append(ADD_ENTRY.step(dict(d)).explained(drift=[Drift(
                    f"firewall.ipset.{IPSET}", ip, sorted(str(e.get("cidr")) for e in t.entries or []))]))
        if a.kind == "primary":
            want = {"ipconfig0": ipconfig0(a)}
            if world.nameservers:
                want["nameserver"] = " ".join(world.nameservers)
            if any(str(t.vm.config.get(k)) != v for k, v in want.items()):
                if t.vm.running:
                    raise PermanentError(f"server {world.want} is running: a primary address is written to "
                                         "cloud-init only on a stopped server (it takes effect at the next boot)")
                steps.append(SET_IPCONFIG.step(dict(d, **want)).explained(drift=[
                    Drift(f"config.{k}", v, t.vm.config.get(k)) for k, v in want.items() if str(t.vm.config.get(k)) != v]))
        if world.enforce and not (_on(t.firewall.get("ipfilter")) and "firewall=1" in str(t.vm.config.get("net0", ""))):
            steps.append(ENABLE_IPFILTER.step(dict(d)).explained(drift=[
                Drift("firewall.options.ipfilter", "1", None if t.firewall.get("ipfilter") is None
                      else str(t.firewall.get("ipfilter")))]))
    where = sorted({*(server_of(h.vm) or f"VM {h.vm.vmid}" for h in world.holders),
                    *([world.want] if t is not None and world.want and tag in t.vm.tags else [])})
    if steps and where != ([world.want] if world.want else []):
        steps[0].explained(drift=[Drift("on", world.want, where[0] if len(where) == 1 else (where or None))])
    for s in steps:
        vm = t.vm if t is not None and s.detail["vmid"] == t.vm.vmid else \
            next(h.vm for h in world.holders if h.vm.vmid == s.detail["vmid"])
        if vm.lock:
            raise VmLocked(f"VM {vm.vmid} is locked ({vm.lock}); waiting for the other task")
    return steps


def _on(v: Any) -> bool:
    return str(v) == "1"


async def _retag(ctx: JobContext, step: Step, node: str, vmid: int, *, add: str | None = None,
                 remove: str | None = None) -> None:
    """Add or remove one tag on the VM's fresh config (digest-checked), waiting for the task. The
    config alone (tags, lock, digest): a tag is written whatever the VM's power state."""
    st = await ctx.pve.vm_state(node, vmid, status=False)
    if st is None:
        raise TemporaryError(f"VM {vmid} disappeared from {node}")
    if st.lock:
        raise VmLocked(f"VM {vmid} is locked ({st.lock}); waiting for the other task")
    tags = set(st.tags)
    if add:
        if add in tags:
            return
        tags.add(add)
    if remove:
        if remove not in tags:
            return
        tags.discard(remove)
    await ctx.fence()
    upid = await ctx.pve.configure(node, vmid, {"tags": format_tags(tags)}, digest=st.config.get("digest"))
    await ctx.wait_task(step, upid)


async def _tag(ctx: JobContext, world: World, step: Step) -> None:
    await _retag(ctx, step, step.detail["node"], step.detail["vmid"], add=address_tag(world.address.id))


async def _untag(ctx: JobContext, world: World, step: Step) -> None:
    await _retag(ctx, step, step.detail["node"], step.detail["vmid"], remove=address_tag(world.address.id))


async def _create_ipset(ctx: JobContext, world: World, step: Step) -> None:
    await ctx.fence()
    await ctx.pve.ipset_create(step.detail["node"], step.detail["vmid"], IPSET,
                               comment="z9: addresses this VM may send from")


async def _add_entry(ctx: JobContext, world: World, step: Step) -> None:
    await ctx.fence()
    await ctx.pve.ipset_add(step.detail["node"], step.detail["vmid"], IPSET, world.address.ip_text,
                            comment=f"z9 address {world.address.id}")


async def _add_private_entry(ctx: JobContext, world: World, step: Step) -> None:
    node, vmid = step.detail["node"], step.detail["vmid"]
    entries = await ctx.pve.ipset_entries(node, vmid, IPSET) or []
    if not any(same_ip(str(e.get("cidr", "")), step.detail["ip"]) for e in entries):
        await ctx.fence()
        # commented as the VM machinery's own entries are (z9.executor.vms.apply_ip_filter)
        await ctx.pve.ipset_add(node, vmid, IPSET, step.detail["ip"], comment=f"z9 {step.detail['server']} main")


async def _remove_entry(ctx: JobContext, world: World, step: Step) -> None:
    node, vmid = step.detail["node"], step.detail["vmid"]
    entries = await ctx.pve.ipset_entries(node, vmid, IPSET) or []
    for e in entries:
        if same_ip(str(e.get("cidr", "")), world.address.ip_text):
            await ctx.fence()
            await ctx.pve.ipset_remove(node, vmid, IPSET, str(e["cidr"]))


async def _set_ipconfig(ctx: JobContext, world: World, step: Step) -> None:
    node, vmid = step.detail["node"], step.detail["vmid"]
    st = await ctx.pve.vm_state(node, vmid)
    if st is None:
        raise TemporaryError(f"VM {vmid} disappeared from {node}")
    if st.running:
        raise PermanentError(f"VM {vmid} is running: its primary address changes only while stopped")
    params = {k: step.detail[k] for k in ("ipconfig0", "nameserver") if k in step.detail}
    await ctx.fence()
    await ctx.wait_task(step, await ctx.pve.configure(node, vmid, params, digest=st.config.get("digest")))
    await ctx.fence()
    await ctx.pve.cloudinit_regenerate(node, vmid)


async def _clear_ipconfig(ctx: JobContext, world: World, step: Step) -> None:
    node, vmid = step.detail["node"], step.detail["vmid"]
    st = await ctx.pve.vm_state(node, vmid)
    if st is None:
        raise TemporaryError(f"VM {vmid} disappeared from {node}")
    if config_ips({"ipconfig0": st.config.get("ipconfig0")}).get("ipconfig0") == world.address.ip_text:
        if st.running:
            raise PermanentError(f"VM {vmid} is running: its primary address is taken off only while stopped")
        # its address on the region's private network when it has one, else DHCP
        params = {"ipconfig0": step.detail.get("ipconfig0", "ip=dhcp")}
        if step.detail.get("nameserver"):
            params["nameserver"] = step.detail["nameserver"]
        await ctx.fence()
        await ctx.wait_task(step, await ctx.pve.configure(node, vmid, params, digest=st.config.get("digest")))


async def _enable_ipfilter(ctx: JobContext, world: World, step: Step) -> None:
    """The filter's switch on (the address's part: ``ipfilter``), the NIC through the firewall (the VM
    machinery's helper); the VM firewall's ``enable`` and policies are the server's (its VM spec)."""
    node, vmid = step.detail["node"], step.detail["vmid"]
    st = await ctx.pve.vm_state(node, vmid, status=False)  # its NIC's config: whatever its power state
    if st is None:
        raise TemporaryError(f"VM {vmid} disappeared from {node}")
    await vms.nic_through_firewall(ctx, st, "net0", step)
    # every other address the VM holds (its tag) listed first: a set deleted when the VM went back to
    # DHCP took their entries with it, and the filter must not drop an address the server was given
    entries = await ctx.pve.ipset_entries(node, vmid, IPSET) or []
    for tag in sorted(t for t in st.tags if t.startswith("z9-addr-") and t != address_tag(world.address.id)):
        # the tag says the address is on this VM (how its holder is found); its entry follows it
        other = await address_store.address_get(ctx.pool, tag[len("z9-addr-"):])
        if other is None or other.status in ("destroying", "deleted") \
                or any(same_ip(str(e.get("cidr", "")), other.ip_text) for e in entries):
            continue
        await ctx.fence()
        await ctx.pve.ipset_add(node, vmid, IPSET, other.ip_text, comment=f"z9 address {other.id}")
    await ctx.fence()
    await ctx.pve.set_firewall_options(node, vmid, ipfilter=True)


async def _disable_ipfilter(ctx: JobContext, world: World, step: Step) -> None:
    """The filter off — its switch, and its set (which filters by existing) with the addresses'
    entries in it — never the VM's firewall: its policies and rules stay in force."""
    node, vmid = step.detail["node"], step.detail["vmid"]
    await ctx.fence()
    await ctx.pve.set_firewall_options(node, vmid, ipfilter=False)
    await ctx.fence()
    await ctx.pve.ipset_delete(node, vmid, IPSET)


# The address's steps, each bound to what runs it (``run(ctx, world, step)``); idempotent: each
# re-reads what it changes, or treats "already so" as done.
# (disruptive: a step that takes an address from a guest — it can no longer send from it — or
# re-addresses it: a cloud-init ipconfig0 written for its next boot)
TAG = StepKind("tag", _tag, why="tag the server's VM with the address (how its holder is found)")
UNTAG = StepKind("untag", _untag, why="take the address's tag off a VM that should not hold it")
CREATE_IPSET = StepKind("create_ipset", _create_ipset, why="create the VM's IP filter set")
ADD_ENTRY = StepKind("add_entry", _add_entry, why="let the VM send from the address (its IP filter set)")
ADD_PRIVATE_ENTRY = StepKind("add_private_entry", _add_private_entry,
                             why="list the old holder's private address in its IP filter before its primary leaves")
REMOVE_ENTRY = StepKind("remove_entry", _remove_entry, disruptive=True,
                        why="take the address out of a VM's IP filter: that guest can no longer send from it")
SET_IPCONFIG = StepKind("set_ipconfig", _set_ipconfig, disruptive=True,
                        why="write the primary address to the stopped VM's cloud-init (re-addressed at its next boot)")
CLEAR_IPCONFIG = StepKind("clear_ipconfig", _clear_ipconfig, disruptive=True,
                          why="take the primary address off the stopped VM's cloud-init (re-addressed at its next boot)")
ENABLE_IPFILTER = StepKind("enable_ipfilter", _enable_ipfilter, why="turn the VM's IP filter on")
DISABLE_IPFILTER = StepKind("disable_ipfilter", _disable_ipfilter, why="turn the VM's IP filter off (back to DHCP)")
STEPS = StepKinds(TAG, UNTAG, CREATE_IPSET, ADD_ENTRY, ADD_PRIVATE_ENTRY, REMOVE_ENTRY, SET_IPCONFIG, CLEAR_IPCONFIG,
                  ENABLE_IPFILTER, DISABLE_IPFILTER)


async def apply(ctx: JobContext, world: World, step: Step) -> None:
    """One step, run by its kind (:data:`STEPS`)."""
    await STEPS.of(step, ctx.job.kind).run(ctx, world, step)


async def verify(ctx: JobContext, want: str | None) -> dict[str, Any]:
    """Observe again: exactly the wanted VM (or none) carries the tag and the entry. Returns what
    was seen (``observed`` of the address)."""
    w = await observe(ctx, want)
    ip = w.address.ip_text
    if w.holders:
        raise TemporaryError("verify: other VMs still carry the address: "
                             + ", ".join(f"{h.vm.vmid} on {h.vm.node}" for h in w.holders))
    t = w.target
    listed = t is not None and (t.has_entry(ip) or (not w.enforce and t.entries is None))
    if t is not None and (address_tag(w.address.id) not in t.vm.tags or not listed):
        raise TemporaryError(f"verify: VM {t.vm.vmid} does not show the address yet (tag and IP-set entry)")
    holder = None
    if t is not None:
        holder = {"server_id": w.want, "vmid": t.vm.vmid, "node": t.vm.node, "tag": True,
                  "ipset_entry": t.has_entry(ip),
                  "ipconfig0": t.vm.config.get("ipconfig0") if w.address.kind == "primary" else None}
    enforced = bool(t is not None and _on(t.firewall.get("enable")) and _on(t.firewall.get("ipfilter"))
                    and w.cluster_firewall)
    return {"holder": holder, "enforced": enforced, "cluster_firewall": w.cluster_firewall,
            "conflicts": w.conflicts,
            # the guest agent's view is advisory only; z9 does not require (or here read) it
            "guest_configured": None}


def conflict_reason(observed: dict[str, Any], ip: str) -> str | None:
    c = observed.get("conflicts") or []
    if not c:
        return None
    where = "; ".join(f"VM {x['vmid']} on {x['node']} ({x['why']})" for x in c)
    return f"conflict: {ip} is also used by a VM z9 does not manage: {where}; z9 leaves it alone"


async def record(conn: asyncpg.Connection, ctx: JobContext, observed: dict[str, Any], *,
                 status_from: tuple[str, ...] = ("creating", "active", "failed")) -> None:
    """What verify saw, on the address; ``creating``/``failed`` → ``active``."""
    address = await address_store.address_get(conn, ctx.job.resource_id)
    reason = conflict_reason(observed, address.ip_text) if address else None
    await address_store.address_observed(conn, ctx.job.resource_id, observed, status="active",
                                 from_statuses=status_from, reason=reason)


async def record_failure(conn: Any, ctx: JobContext, error: dict[str, Any]) -> None:
    """The address carries a failed job's reason (the registry's rule: the final delete failing
    ends a deletion, another job's failure lets it go on)."""
    await ADDRESS.mark_failed_by_job(conn, ctx.job.resource_id, error["message"], kind=ctx.job.kind,
                                     refused=bool(error.get("refused")))
