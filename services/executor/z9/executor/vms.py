"""The VM machinery of every resource kind that owns VMs (a server owns one; a load balancer or
a Kubernetes cluster owns N): each VM is a *member* of its owner, described by a :class:`VmSpec`.

Identity is tags, never the vmid or the name (proxmox-api.md, "Where peers broke" 3 and 4: a vmid
is reused the moment a VM is destroyed, names can be changed): ``z9-id-<owner>`` says whose VM it
is, ``z9-member-<member>`` which of its VMs (a VM carrying the owner's tag and no member tag is
member ``main``: servers' VMs made before members existed), ``z9-role-customer`` that it is a
customer VM.

Per member (the phases of a kind's module call these, in order):

observe  :func:`observe_member` — the template named by the spec's image, known by its config's
         name (``/cluster/resources`` names lag; not visible yet is waited for), and the member's
         VM by tag (candidates from the executor process's shared, short-lived ``/cluster/resources``
         snapshot, each confirmed by its own config: :func:`find_vms`); failing that, a clone of ours not tagged yet (:func:`find_own_clones`), or a
         clone request that may still land (``vm_clone_requests``).
plan     :func:`plan_member` (pure) — clone → wait_clone → configure → resize_disk → start,
         keeping only what is missing; the empty plan for a converged, running VM.
apply    :func:`apply_member_step` — each step re-reads the VM and acts only if still needed. The
         clone ladder: the request is recorded (vmid, node) *before* the POST and its answer
         (UPID) right after; unanswered, it stays uncertain for ``uncertain_window_s`` whoever
         sent it, so a lost answer, a killed or frozen sender never leads to a second clone.
verify   :func:`verify_member` — observe again; the plan must be empty.

Removal (every VM of an owner): :func:`observe_removal`, :func:`plan_removal` (the deletion
guard on every VM found), :func:`apply_removal_step`, :func:`verify_removed`. The guard itself —
may z9 touch this VM — is :mod:`z9.executor.guard`, which the kinds and this module call before
every change to a VM.
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass, field, replace
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Mapping, Protocol
from urllib.parse import quote

from z9 import resources
from z9.common import store
from z9.common.errors import PermanentError, Snooze, TemporaryError
from z9.common.tags import (MEMBER_PREFIX, customer_vm_tags, format_tags, identity_tag, normalize_tags,
                            platform_roles)

from .context import Drift, JobContext, Step, StepKind, StepKinds
from .guard import (MAIN, carries_marker, guard, guard_own_clone, guard_suspect, marker, refuse_if_locked,
                    refuse_platform)
from .proxmox import (CloneNeedsSharedStorage, DigestMismatch, OutcomeUnknown, TaskFailed, Upid, VmidTaken, VmLocked,
                      VmRef, VmState)

log = logging.getLogger("z9.executor.vms")

CLONE_TRIES = 5
DISK_KEYS = tuple(f"{bus}{i}" for bus in ("scsi", "virtio", "sata", "ide") for i in range(6))
_SIZE_RE = re.compile(r"(?:^|,)size=(\d+(?:\.\d+)?)([KMGT]?)(?:,|$)")
_UNIT_GIB = {"K": 1 / (1024 * 1024), "M": 1 / 1024, "G": 1.0, "T": 1024.0, "": 1 / (1024 ** 3)}


# ================================================================ the spec

@dataclass(frozen=True)
class VmSpec:
    """One VM of ``owner`` (a resource id): member ``member``, Proxmox name ``name``, cloned from
    the template named ``image``. ``config`` adds or overrides desired config keys (e.g. a
    cloud-init ``ipconfig0`` with an address, ``nameserver``)."""

    owner: str
    member: str
    name: str
    image: str
    cores: int
    memory_mib: int
    disk_gib: int
    ssh_keys: tuple[str, ...] = ()
    # the VM carries only its own identity: cloud-init values the spec does not set (the template's
    # sshkeys, ciuser, …) are deleted, and so is every CD-ROM holding media other than the VM's own
    # cloud-init drive (a template's seed ISO) — see :meth:`foreign_keys`
    only_own_identity: bool = False
    config: Mapping[str, str] = field(default_factory=dict)
    node: str | None = None  # clone onto this node (default: the template's); members spread over nodes
    # The addresses the VM may send from on ``nic`` (its own static address, a VIP it may hold):
    # non-empty → the Proxmox IP filter is put on before it starts (:func:`firewall_drift`), so its
    # guest cannot take an address it was not given. Empty: no filter of the machinery's (a DHCP
    # guest — its lease is unknown; or a server whose addresses' jobs filter it). Entries other types
    # declare (``VmParts.ipset_entries``: a server's floating addresses) stay beside these.
    ip_filter: tuple[str, ...] = ()
    nic: str = "net0"
    # The VM firewall z9 writes on this VM (explicit policies, the kind's platform rules), on before
    # the VM first starts: never a default z9 did not write (pve-firewall's policy_in default DROP).
    firewall: FirewallSpec | None = None

    @property
    def tags(self) -> frozenset[str]:
        return customer_vm_tags(self.owner, self.member)

    @property
    def marker(self) -> str:
        return marker(self.owner, self.member)

    def desired_config(self) -> dict[str, Any]:
        """The config keys z9 owns on this VM, in Proxmox's stored form."""
        cfg: dict[str, Any] = {
            "name": self.name,
            "cores": int(self.cores),
            "memory": str(int(self.memory_mib)),
            "tags": format_tags(self.tags),
            "ipconfig0": "ip=dhcp",
            # Proxmox refuses to destroy a protected VM ("protection mode enabled"): a destroy
            # request of someone else's that lands late on a reused vmid cannot remove this VM.
            # Only the removal lifts it, right before its own destroy.
            "protection": "1",
        }
        if self.ssh_keys:
            cfg["sshkeys"] = encode_ssh_keys(list(self.ssh_keys))
        cfg.update(self.config)
        return cfg

    def foreign_keys(self, current: Mapping[str, Any], vmid: int) -> list[str]:
        """The config keys of ``current`` that a VM with :attr:`only_own_identity` must not keep — in
        the namespaces the machinery manages (cloud-init values, ``ipconfigN``), what neither the spec
        nor any type's declared part (``VmParts.config``) holds: the
        template's cloud-init values the request did not ask for (a clone copies every key: the
        template builder's ``sshkeys`` would be authorized on the customer's VM, its ``ciuser`` be
        the user) and its seed media (PVE clones a CD-ROM's ISO as it is: cloud-init's NoCloud would
        take it as the seed — the last ``cidata`` device — with its hostname, keys and
        instance-id). The VM's own cloud-init drive (``vm-<vmid>-cloudinit``) stays."""
        if not self.only_own_identity:
            return []
        desired = self.desired_config()
        out = []
        for k, v in current.items():
            if k in desired or resources.config_owner(k, v) is not None:
                continue  # the spec's, or a part another type declares (VmParts)
            if k in CI_VALUE_KEYS or _IPCONFIG_RE.fullmatch(k):
                out.append(k)
            elif _DRIVE_RE.fullmatch(k) and "media=cdrom" in str(v):
                volid = str(v).split(",", 1)[0]
                own = _OWN_CI_RE.search(volid)
                if volid not in ("none", "cdrom") and not (own and int(own.group(1)) == vmid):
                    out.append(k)
        return sorted(out)


# cloud-init values of a PVE config (qemu-server Cloudinit.pm reads them into the drive); citype and
# ciupgrade describe the image, not an identity, and stay
CI_VALUE_KEYS = ("cicustom", "cipassword", "ciuser", "nameserver", "searchdomain", "sshkeys")
_IPCONFIG_RE = re.compile(r"ipconfig\d+")
_DRIVE_RE = re.compile(r"(ide|sata|scsi|virtio)\d+")
_OWN_CI_RE = re.compile(r"vm-(\d+)-cloudinit")


def dns_label(prefix: str, suffix: str) -> str:
    """``<prefix>-<suffix>`` as one DNS label — a hostname and a Proxmox VM name (qemu-server
    ``name``: format ``dns-name``) — at most 63 characters (RFC 1035 §2.3.4; Linux HOST_NAME_MAX is
    64): ``prefix`` is cut to fit, its trailing hyphens dropped, so ``suffix`` (what tells the VMs
    of one owner apart) stays whole. Both parts are labels already (the API's name patterns)."""
    room = 63 - len(suffix) - 1
    return f"{prefix[:room].rstrip('-')}-{suffix}"


def agent_configured(config: Mapping[str, Any]) -> bool:
    """The config enables the QEMU guest agent (``agent: [enabled=]1[,...]``)."""
    first = str(config.get("agent") or "0").split(",", 1)[0]
    return first.partition("=")[2] == "1" if first.startswith("enabled=") else first == "1"


def member_of(vm: VmState) -> str:
    """The member a VM of an owner is (``main`` without a member tag)."""
    names = [t[len(MEMBER_PREFIX):] for t in vm.tags if t.startswith(MEMBER_PREFIX)]
    return names[0] if len(names) == 1 else MAIN if not names else ",".join(sorted(names))


# ================================================================ finding VMs

async def find_vms(ctx: JobContext, owner: str, member: str | None = None, *,
                   fresh_negative: bool = True) -> list[VmState]:
    """Every VM carrying ``owner``'s identity tag (of ``member`` when given), each confirmed on
    its node (fresh config and tags).

    The candidates come from the executor process's shared ``/cluster/resources`` snapshot
    (:class:`~z9.executor.proxmox.ClusterView`, at most ``resources_snapshot_s`` old, with this
    process's own newer reads laid over it), never from a listing of this job's own. What a
    snapshot can get wrong is settled so:

    - a candidate is only ever taken after its own config on its node confirms the tag;
    - a candidate its node disagrees about (gone, moved, tag removed) makes one new listing
      requested after that read; a disagreement left raises TemporaryError, as before;
    - "no such VM" is only answered from a listing requested after this attempt was claimed
      (``fresh_negative``), unless the caller has an authority of its own for the negative: a
      create's clone ledger (``vm_clone_requests``) names every VM z9 ever cloned for the member,
      each read on its node (:func:`observe_member`). Such a caller (``fresh_negative=False``)
      takes an older snapshot too (``resources_snapshot_create_s``): it only names candidates.
    """
    tag = identity_tag(owner)
    not_before: float | None = None
    for again in (False, True):
        snap = await ctx.pve.snapshot(not_before=not_before, for_create=not fresh_negative)
        out, disagree = [], None
        for ref in snap.tagged(tag):
            st = await ctx.pve.vm_state(ref.node, ref.vmid)
            if st is None:
                disagree = f"VM {ref.vmid} carrying {tag} vanished from {ref.node} while observing"
                break
            if tag not in st.tags:
                # The cluster list said tagged, the node says not (a write in between): look again.
                disagree = f"VM {ref.vmid}: cluster list and node disagree about tag {tag}"
                break
            if member is None or member_of(st) == member:
                out.append(st)
        if disagree is None:
            if out or not fresh_negative or snap.started >= ctx.claimed_at:
                return out
            not_before = ctx.claimed_at  # a negative answer needs a listing newer than the claim
        elif again:
            raise TemporaryError(disagree)
        else:
            not_before = time.monotonic()  # newer than the read that disagreed
    return out


async def find_one_vm(ctx: JobContext, owner: str, member: str = MAIN, *,
                      fresh_negative: bool = True) -> VmState | None:
    """The VM of (``owner``, ``member``) or None (see :func:`find_vms` for ``fresh_negative``).
    Raises PermanentError when several VMs carry that identity (a manual clone of a customer VM
    inherits its tags)."""
    vms = await find_vms(ctx, owner, member, fresh_negative=fresh_negative)
    if len(vms) > 1:
        where = ", ".join(f"{v.vmid} on {v.node}" for v in vms)
        raise PermanentError(f"{len(vms)} VMs carry {identity_tag(owner)} ({where}); "
                             "an operator must remove the extra ones")
    return vms[0] if vms else None


async def find_template_on(ctx: JobContext, image: str, node: str) -> VmState | None:
    """A template named ``image`` whose config is on ``node`` (an operator's one template per node),
    from the process's snapshot (templates change rarely; each candidate is read on its node), or
    None — without asking for a newer listing: the caller has a template elsewhere to fall back on."""
    snap = await ctx.pve.snapshot(for_create=True)
    for ref in sorted(snap.templates(), key=lambda v: (v.name != image, v.vmid)):
        if ref.node != node:
            continue
        st = await ctx.pve.vm_state(ref.node, ref.vmid, status=False)
        if st is not None and st.config.get("name") == image and str(st.config.get("template", "0")) == "1":
            return st
    return None


async def find_template(ctx: JobContext, image: str) -> VmState | None:
    """The template whose config is named ``image`` now. ``/cluster/resources`` has the template
    flag fresh but names from a stats cache that lags (proxmox-api.md): it only orders the
    candidates — the templates it lists under that name are read first — and each one's config on
    its node decides. None when no template has that name (yet) in a listing newer than the job's
    claim: the first look takes the process's snapshot up to ``resources_snapshot_create_s`` old
    (templates change rarely, and each candidate is read on its node), and only "none" there asks
    for a newer one."""
    snap = await ctx.pve.snapshot(for_create=True)
    while True:
        refs = sorted(snap.templates(), key=lambda v: (v.name != image, v.vmid))
        for ref in refs:
            st = await ctx.pve.vm_state(ref.node, ref.vmid, status=False)  # a template's config says it all
            if st is not None and st.config.get("name") == image and str(st.config.get("template", "0")) == "1":
                return st
        if snap.started >= ctx.claimed_at:
            return None
        snap = await ctx.pve.snapshot(not_before=ctx.claimed_at)


async def clone_requests(ctx: JobContext, owner: str, member: str | None = None) -> list[store.CloneRequest]:
    """Every clone request recorded for ``owner`` (of ``member`` when given; one query)."""
    return await store.vm_clone_requests(ctx.pool, owner, member)


async def find_own_clones(ctx: JobContext, owner: str, requests: list[store.CloneRequest],
                          exclude: set[int]) -> list[VmState]:
    """VMs that a clone request of ``owner`` made (vmid in ``requests``) but that are not tagged
    yet: recognised by the member's marker in their description — or, still under ``lock:
    clone`` (no description yet), only while *our* request may be the clone running there: its
    answer is not recorded yet (uncertain), or it was answered with a UPID whose task still runs.
    A locked VM at a vmid we asked for whose request was refused, failed or whose task has ended
    is someone else's clone; so is a VM carrying another resource's identity."""
    mine, out = identity_tag(owner), []
    for m in requests:
        if m.vmid in exclude:
            continue
        st = await ctx.pve.vm_state(m.node, m.vmid)
        if st is None and m.upid and (src := Upid.parse(m.upid).node) != m.node:
            # a clone with target=: PVE keeps its "lock: clone" config on the source node (the
            # UPID's) while it runs and renames it to the target at the end (Qemu.pm clone_vm)
            st = await ctx.pve.vm_state(src, m.vmid)
        if st is None or any(t.startswith("z9-id-") and t != mine for t in st.tags):
            continue
        if carries_marker(st.config.get("description"), owner, m.member):
            out.append(st)
        elif st.lock == "clone":
            if await _clone_in_flight(ctx, m):
                out.append(st)
                continue
            # Our task may have ended between the two reads: then the VM carries our marker now.
            again = await ctx.pve.vm_state(m.node, m.vmid)
            if again is not None and carries_marker(again.config.get("description"), owner, m.member):
                out.append(again)
    return out


async def _clone_in_flight(ctx: JobContext, m: store.CloneRequest) -> bool:
    """Whether our request ``m`` may be the clone running at its vmid now."""
    if m.uncertain_since is not None:
        return True  # no answer recorded: it may be ours
    if not m.upid:
        return False  # answered with an error: nothing of ours runs there
    try:
        return (await ctx.pve.task_status(m.node, m.upid)).get("status") == "running"
    except PermanentError:
        return False  # the node does not know our task (any more): not ours


def clone_uncertain_since(requests: list[store.CloneRequest]) -> float | None:
    """Epoch seconds of the latest request in ``requests`` without a recorded answer (it may
    still be performed), or None."""
    times = [m.uncertain_since for m in requests if m.uncertain_since is not None]
    return max(times) if times else None


def create_uncertain_left_s(ctx: JobContext, requests: list[store.CloneRequest]) -> float:
    """How long a create request in ``requests`` without a recorded answer may still be performed
    (``uncertain_window_s`` from when it was last known in flight), 0 when none may."""
    since = clone_uncertain_since(requests)
    return 0.0 if since is None else max(0.0, since + ctx.settings.uncertain_window_s - ctx.clock.time())


async def create_adopted(ctx: JobContext, owner: str, vmid: int,
                         requests: list[store.CloneRequest]) -> list[store.CloneRequest]:
    """VM ``vmid``, made by a create of ``owner``'s whose answer was lost, is found and taken as
    ours (it carries our marker or identity): that request's outcome is known now — recorded as
    answered, so that nothing waits out its window any more (a final delete after the create
    adopted its clone). Returns ``requests`` as they stand after."""
    out = []
    for m in requests:
        if m.vmid == vmid and m.uncertain_since is not None:
            await store.vm_clone_answered(ctx.pool, owner, m.member, m.vmid, None)
            m = replace(m, uncertain_since=None)
        out.append(m)
    return out


async def send_create(ctx: JobContext, owner: str, member: str, vmid: int, node: str,
                      send: Callable[[], Awaitable[str]],
                      refused: tuple[type[BaseException], ...] = (VmidTaken,)) -> str:
    """Send one request that creates VM ``vmid`` on ``node`` for ``owner``'s ``member`` — a clone, a
    volume's anchor ``POST /nodes/{n}/qemu``: every VM create goes through this one ledger
    (``vm_clone_requests``). The request is recorded *before* it is sent (fenced by the lease) and
    its answer right after: an answer lost (timeout, connection dropped: OutcomeUnknown), or a
    sender killed in between, leaves it uncertain for ``uncertain_window_s`` — the next attempt
    finds the VM it may still make by the recorded vmid, and makes no other meanwhile
    (:func:`create_uncertain_left_s`). ``refused``: answers that say nothing was made (the vmid
    taken…): the request is forgotten. Any other error is an answer (nothing in flight); the vmid
    stays recorded, so a deletion still looks there. Returns the task's UPID."""
    await store.vm_clone_sent(ctx.pool, ctx.lease, owner, member, vmid, node)
    try:
        upid = await send()
    except refused:
        await store.vm_clone_refused(ctx.pool, owner, member, vmid)
        raise
    except (OutcomeUnknown, asyncio.CancelledError):
        # The answer is lost: the request stays unanswered; it was in flight until now (a sender
        # that dies here leaves it uncertain from when it was recorded).
        try:
            await store.vm_clone_lost(ctx.pool, owner, member, vmid)
        except Exception as e:  # database gone: it stays uncertain from sent_at
            log.warning("job %s: could not mark the create request of VM %s lost: %s", ctx.job.id, vmid, e)
        raise
    except Exception:
        await store.vm_clone_answered(ctx.pool, owner, member, vmid, None)
        raise
    await store.vm_clone_answered(ctx.pool, owner, member, vmid, upid)
    return upid


async def find_suspect(ctx: JobContext, recorded: tuple[int, str] | None, ours: list[VmState]) -> VmState | None:
    """The VM at the (vmid, node) the database last recorded, when it is not one of ``ours``: a
    row can be stale and point at someone else's VM — or at a platform VM."""
    if recorded is None or any(v.vmid == recorded[0] for v in ours):
        return None
    return await ctx.pve.vm_state(recorded[1], recorded[0])


async def ensure_running(ctx: JobContext, step: Step, vm: VmState) -> None:
    """Start ``vm`` unless it runs, and wait for the task. A start task failing with ``VM n
    already running`` means someone else started it: done (proxmox-api.md, Endpoints)."""
    if vm.running:
        return
    await ctx.fence()
    upid = await ctx.pve.start(vm.node, vm.vmid)
    try:
        await ctx.wait_task(step, upid)
    except TaskFailed as e:
        if "already running" in e.exitstatus:
            return
        if "VM is locked" in e.exitstatus:
            # another task locked the VM (qemu-server QemuServer.pm vm_start: check_lock inside the
            # qmstart worker): waiting on the world, as when a read shows the lock
            raise VmLocked(f"VM {vm.vmid}: {e.exitstatus}; waiting for the other task") from e
        raise
    except TemporaryError as e:
        if "already running" not in str(e):
            raise


# ================================================================ config helpers

def boot_disk(config: dict[str, Any]) -> tuple[str, float] | None:
    """``(key, size in GiB)`` of the first data disk (not a cloud-init drive or CD-ROM)."""
    for key in DISK_KEYS:
        val = config.get(key)
        if not isinstance(val, str) or "media=cdrom" in val or "cloudinit" in val:
            continue
        m = _SIZE_RE.search(val)
        if m:
            return key, float(m.group(1)) * _UNIT_GIB[m.group(2)]
    return None


def encode_ssh_keys(keys: list[str]) -> str:
    """Proxmox's ``sshkeys`` value: the keys joined by newlines, URL-encoded with every space
    and newline percent-encoded (proxmox-api.md, "Cloud-init")."""
    return quote("\n".join(keys) + "\n", safe="")


def config_diff(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """The desired keys whose current value differs (tags compared as normalised sets)."""
    out = {}
    for k, v in desired.items():
        cur = current.get(k)
        if k == "tags":
            # tags other types declare as their part (VmParts.tags: an address's z9-addr-…) are kept,
            # never compared
            keep = {t for t in normalize_tags(cur) if resources.declared_tag(t)}
            if normalize_tags(cur) - keep != normalize_tags(v):
                out[k] = format_tags(normalize_tags(v) | keep)
        elif str(cur) != str(v):
            out[k] = v
    return out


def spec_diff(spec: VmSpec, current: dict[str, Any]) -> dict[str, Any]:
    """What the configure step writes: the desired keys that differ and, for a VM whose firewall z9
    keeps, its NIC through the firewall (``firewall=1``, the rest of the NIC as it is: its MAC and
    bridge are the clone's) — in the same write, ahead of the firewall step."""
    diff = config_diff(current, spec.desired_config())
    if spec.firewall is not None or spec.ip_filter:
        nic = nic_with_firewall(str(current.get(spec.nic, "")))
        if nic is not None:
            diff[spec.nic] = nic
    return diff


#: config keys a running VM takes only at its next boot (PVE's default ``hotplug`` is
#: ``network,disk,usb``: qemu-server vmconfig_hotplug_pending keeps cores and memory pending; the
#: cloud-init drive is read by the guest at boot)
NEXT_BOOT_KEYS = frozenset({"cores", "memory", "sockets", "ipconfig0", "nameserver", "sshkeys", "searchdomain",
                            "ciuser", "cipassword"})


def _like(value: Any, want: Any) -> Any:
    """``value`` (a config string) in the type of ``want`` (an int stays an int): drift compares as PVE stores."""
    if value is not None and isinstance(want, int) and str(value).isdigit():
        return int(value)
    return value


def config_drift(spec: VmSpec, vm: VmState) -> list[Drift]:
    """Pure: the configure step's drift — each key :func:`spec_diff` would write (tags as the sets
    compared, other types' declared tags aside; the NIC's firewall flag), and each foreign key it
    would delete (want None)."""
    desired, cur = spec.desired_config(), vm.config
    out = []
    for k in spec_diff(spec, cur):
        if k == "tags":
            have = {t for t in normalize_tags(cur.get(k)) if not resources.declared_tag(t)}
            out.append(Drift("config.tags", sorted(normalize_tags(desired[k])), sorted(have)))
        elif k == spec.nic and k not in desired:
            fw = [p for p in str(cur.get(k, "")).split(",") if p.startswith("firewall=")]
            out.append(Drift(f"config.{k}.firewall", "1", fw[0].partition("=")[2] if fw else None))
        else:
            out.append(Drift(f"config.{k}", desired[k], _like(cur.get(k), desired[k])))
    out += [Drift(f"config.{k}", None, cur.get(k)) for k in spec.foreign_keys(cur, vm.vmid)]
    return out


def configure_why(vm: VmState, drift: list[Drift]) -> str:
    """Why the configure step runs, and what of it a running VM takes only at its next boot."""
    keys = [d.path.split(".")[1] for d in drift]
    why = "write " + ", ".join(dict.fromkeys(keys))
    later = sorted({k for k in keys if k in NEXT_BOOT_KEYS})
    if vm.running and later:
        why += f" ({', '.join(later)}: pending until the VM's next boot, no restart here)"
    return why


def nic_with_firewall(net: str) -> str | None:
    """The NIC's value with ``firewall=1`` (qemu-server ``net[n]``), None when it has it (or no NIC)."""
    if not net or "firewall=1" in net.split(","):
        return None
    return ",".join([*(p for p in net.split(",") if not p.startswith("firewall=")), "firewall=1"])


def check_no_shrink(spec: VmSpec, size_gib: float) -> None:
    """PermanentError when the disk (``size_gib`` GiB) is already larger than the spec's:
    Proxmox cannot shrink disks (``shrinking disks is not supported``)."""
    if size_gib > spec.disk_gib + 1e-9:
        raise PermanentError(f"disk_gib {spec.disk_gib} is smaller than image {spec.image!r}'s disk "
                             f"({size_gib:g} GiB); disks cannot shrink")


# ================================================================ one member: observe, plan, apply, verify

@dataclass
class MemberWorld:
    """What observe found for one member."""

    template: VmRef | None
    vm: VmState | None
    template_disk_gib: float | None = None
    # every volume of the template is on a storage its node shares with the member's node: PVE
    # clones it there with target= (no migrate step); observed only for a member on another node
    template_shared: bool = False
    template_config: Mapping[str, Any] | None = None  # the template's config as observe read it
    clone_in_flight_s: float = 0.0  # a clone request without answer may land for this long yet
    firewall_drift: list[str] = field(default_factory=list)  # what of the VM's firewall is not as its spec wants
    firewall_drifts: list[Drift] = field(default_factory=list)  # the same, as drift (a plan's preview)
    private: PrivateAddress | None = None  # the address z9 gave the member on the private network (its job sets it)
    # the VM's config in ``vm`` was read after this attempt's last change of it (or has that change
    # laid over it): the next step needs no new read of the config
    fresh: bool = False
    # the VM's power state and lock in ``vm`` are as this attempt left them (a clone it just waited
    # on is stopped and unlocked; its own config writes and tasks since change neither): a start or
    # a migration needs no ``status/current`` first — the start task refuses a lock another task took
    # (QemuServer.pm vm_start's check_lock: a snooze) and "already running" is done
    power_known: bool = False


async def observe_member(ctx: JobContext, spec: VmSpec) -> MemberWorld:
    """The member's VM (by tag, else an untagged clone of ours) and, when there is none, the
    template. Raises TemporaryError on hypervisor trouble, PermanentError when several VMs carry
    the member's identity."""
    # A negative from the shared snapshot is enough here: the clone ledger read next names every
    # VM z9 ever cloned for this member, and each is read on its node (tagged or not).
    vm = await find_one_vm(ctx, spec.owner, spec.member, fresh_negative=False)
    in_flight = 0.0
    if vm is None:
        # A clone an earlier attempt (or an earlier job) made but did not tag yet — or tagged
        # less than a snapshot's age ago by another executor process.
        requests = await clone_requests(ctx, spec.owner, spec.member)
        clones = await find_own_clones(ctx, spec.owner, requests, set())
        vm = clones[0] if clones else None
        if vm is not None and vm.lock != "clone":  # made (our marker on it): its request is answered
            requests = await create_adopted(ctx, spec.owner, vm.vmid, requests)
        if vm is None and any(m.upid or m.uncertain_since is not None for m in requests):
            # The ledger names a clone that was (or may have been) made, and it is not at the node
            # it recorded: deleted — or moved (a migration, an HA relocation), where only a listing
            # newer than the claim shows it. The older snapshot is no authority for "none" then.
            vm = await find_one_vm(ctx, spec.owner, spec.member)
        since = clone_uncertain_since(requests) if vm is None else None
        if since is not None:
            in_flight = max(0.0, since + ctx.settings.uncertain_window_s - ctx.clock.time())
    template, disk, shared, tpl_config = None, None, False, None
    if vm is None:
        tpl = await find_template(ctx, spec.image)
        if tpl is not None:
            tpl_config = tpl.config
            template = VmRef(vmid=tpl.vmid, node=tpl.node, name=spec.image, status=tpl.status, tags=tpl.tags,
                             lock=tpl.lock, template=True)
            found = boot_disk(tpl.config)
            disk = found[1] if found else None
            if spec.node and spec.node != tpl.node and tpl.vmid not in ctx.pve.local_templates:
                shared = await template_on_shared_storage(ctx, tpl.node, spec.node, tpl.config)
    eff = await effective_firewall(ctx, spec) if vm is not None and vm.lock != "clone" else spec
    fw = await observe_firewall(ctx, eff, vm) if vm is not None and vm.lock != "clone" else None
    findings = _firewall_findings(eff, vm, fw) if vm is not None and vm.lock != "clone" else []
    return MemberWorld(template=template, vm=vm, template_disk_gib=disk, clone_in_flight_s=in_flight,
                       firewall_drift=[t for t, _ in findings], firewall_drifts=[d for _, d in findings],
                       template_shared=shared, template_config=tpl_config)


def template_volume_storages(config: Mapping[str, Any]) -> set[str]:
    """The storages of every volume a config references (disks, the cloud-init drive, an ISO; not
    ``none``/``cdrom``): what qemu-server API2/Qemu.pm clone_vm's $check_storage_access_clone
    requires to be shared for a clone with target= another node."""
    out = set()
    for k, v in config.items():
        if _DRIVE_RE.fullmatch(k):
            volid = str(v).split(",", 1)[0]
            if ":" in volid and volid not in ("none", "cdrom"):
                out.add(volid.split(":", 1)[0])
    return out


async def template_on_shared_storage(ctx: JobContext, node: str, target: str, config: Mapping[str, Any]) -> bool:
    """True when the template on ``node`` can be cloned straight to ``target``: all its volumes are
    on storages the two nodes share (a template on Ceph/NFS: no migrate step is planned)."""
    stores = template_volume_storages(config)
    return bool(stores) and stores <= await ctx.pve.shared_storages(node, target)




@dataclass(frozen=True)
class PrivateAddress:
    """The address z9 chose for one VM on its region's private network (settings
    ``private_network``): its cloud-init ``ipconfig0`` and nameservers, and the one address its IP
    filter lets it send from."""

    ip: str
    prefix: int
    gateway: str | None
    nameservers: tuple[str, ...]

    @property
    def ipconfig0(self) -> str:
        return f"ip={self.ip}/{self.prefix}" + (f",gw={self.gateway}" if self.gateway else "")


def _private_network(ctx: JobContext) -> Any:
    region = ctx.settings.regions.get(ctx.job.region)
    return region.private_network if region is not None else None


def private_address_at(ctx: JobContext, ip: str) -> PrivateAddress | None:
    """The :class:`PrivateAddress` of ``ip`` (a member's, already taken) on the region's private
    network; None when the region has none (any more)."""
    net = _private_network(ctx)
    if net is None:
        return None
    return PrivateAddress(ip=ip, prefix=net.cidr.prefixlen, gateway=str(net.gateway) if net.gateway else None,
                          nameservers=tuple(guest_nameservers(ctx, net.nameservers)))


RESOLV_CONF = "/etc/resolv.conf"  # a guest's resolver: resolvconf writes its network-config's nameservers there


def resolv_nameservers(text: str) -> list[str]:
    """The ``nameserver`` lines of a resolv.conf (resolv.conf(5))."""
    return [ln.split()[1] for ln in text.splitlines() if ln.split()[:1] == ["nameserver"] and len(ln.split()) > 1]


def no_dns(vmid: int) -> str:
    """Why a guest fails verify when its resolv.conf names no nameserver."""
    return (f"the guest of VM {vmid} has no DNS: its {RESOLV_CONF} names no nameserver (its network-config gave "
            "none: set the region's nameservers, Z9_REGIONS[<region>].nameservers)")


def guest_nameservers(ctx: JobContext, own: Any = ()) -> list[str]:
    """The nameservers a guest of the job's region is given (settings ``nameservers``): its
    network's own (``own``), else the region's; [] when the region is unknown here."""
    region = ctx.settings.regions.get(ctx.job.region)
    if region is None:
        return [str(n) for n in own]
    return region.guest_nameservers(own)


async def private_address(ctx: JobContext, owner: str, member: str = MAIN) -> PrivateAddress | None:
    """The member's address on the region's private network, taken for it on first ask (one per
    (owner, member), kept until the member's VM is removed: :func:`release_private_address`, or
    the owner's final delete). None when the region has no private network (its guests take DHCP,
    unfiltered). Raises PermanentError when the network has no free address.

    Chosen by z9 rather than leased by a DHCP server because the address must be known *before*
    the VM first starts: the IP filter holding exactly it is put on in the same plan, ahead of the
    start, so the guest is never on the bridge unfiltered; and it needs no DHCP server, SDN zone or
    IPAM on the cluster (PVE's own DHCP comes with SDN, which z9 does not require)."""
    net = _private_network(ctx)
    if net is None:
        return None
    if ctx.read_only:  # a plan takes no address: the one the member has, or none yet
        ip = (await store.vm_private_addresses_of(ctx.pool, owner)).get(member)
        return private_address_at(ctx, ip) if ip is not None else None
    first, last = net.first_last
    ip = await store.vm_private_address(ctx.pool, owner, member, ctx.job.region, first=first,
                                        count=int(last) - int(first) + 1, excluded=net.excluded,
                                        quarantine_s=net.quarantine_s)
    if ip is None:
        raise PermanentError(f"region {ctx.job.region}: its private network {net.cidr} has no free address left "
                             "(live or quarantined); the operator must widen Z9_REGIONS[…].private_network")
    return private_address_at(ctx, ip)


async def release_private_address(ctx: JobContext, owner: str, member: str) -> None:
    """The member's VM is gone: its private address goes into quarantine (no-op without one)."""
    await store.vm_private_address_release(ctx.pool, owner, member)


def ipfilter_set(nic: str) -> str:
    """The IP set pve-firewall filters a NIC's sources by: ``ipfilter-<nic>`` (Firewall.pm
    ``generate_tap_rules``: ``my $ipfilter_name = "ipfilter-$netid"``)."""
    return f"ipfilter-{nic}"


# The comment of every firewall rule the VM machinery writes: the owner kind's platform rules
# (FirewallSpec.rules). Rules of other types carry the comment prefixes they declare (VmParts.
# firewall_rules); any other rule is an operator's (left alone, wherever it is — whatever its
# comment says: only the exact prefixes are z9's).
PLATFORM_RULE = "z9 platform: "
#: the VM firewall options the machinery writes (with ``ipfilter`` when the spec filters)
MACHINE_OPTIONS = ("enable", "policy_in", "policy_out")


@dataclass(frozen=True)
class FwRule:
    """One rule of a VM's firewall, in the fields PVE stores (pve-firewall ``Rules.pm`` /
    ``Firewall.pm`` ``$rule_properties``): ``type`` in|out, ``action``, ``proto`` (a name of
    /etc/protocols or a number), ``dport`` (a port, ``a:b`` range or a comma list; tcp/udp only),
    ``source``/``dest`` (addresses, CIDRs, comma lists). ``why`` says what it lets through and where
    the port comes from; it is the rule's comment after :data:`PLATFORM_RULE`."""

    direction: str
    action: str
    why: str
    proto: str | None = None
    dport: str | None = None
    source: str | None = None
    dest: str | None = None
    # the comment's prefix: the platform's, or the one another type declares for the rules it adds to
    # this VM (VmParts.firewall_rules; FirewallContribution)
    prefix: str = PLATFORM_RULE

    @property
    def comment(self) -> str:
        return self.prefix + self.why

    def params(self) -> dict[str, str]:
        """The rule as ``POST …/firewall/rules`` takes it (``enable`` explicit: a rule created
        without it is disabled — Rules.pm ``create_rule``)."""
        out = {"type": self.direction, "action": self.action, "enable": "1", "comment": self.comment}
        for k in ("proto", "dport", "source", "dest"):
            v = getattr(self, k)
            if v:
                out[k] = v
        return out


def rule_key(r: Mapping[str, Any]) -> tuple[str, ...]:
    """A rule as compared: its fields as PVE lists them (``pos`` and ``digest`` aside; ``enable``
    absent is 0), so a rule changed out of band in any field compares unequal."""
    return tuple(str(r.get(k) if r.get(k) is not None else "") for k in
                 ("type", "action", "proto", "dport", "sport", "source", "dest", "macro", "iface", "comment")) \
        + (str(int(r.get("enable") or 0)),)


@dataclass(frozen=True)
class FirewallSpec:
    """The VM firewall z9 writes on a VM: explicit ``policy_in``/``policy_out`` (never pve-firewall's
    defaults — ``policy_in`` DROP, ``policy_out`` ACCEPT, Firewall.pm ``generate_tap_rules_direction``)
    and the kind's platform rules, in order, above any rule of an operator's."""

    policy_in: str = "ACCEPT"
    policy_out: str = "ACCEPT"
    rules: tuple[FwRule, ...] = ()


@dataclass
class FirewallState:
    """A VM's firewall as read: its options, its ``ipfilter-<nic>`` set (None: no such set; not read
    when the spec has no filter) and its rules (each with ``pos``; ``digest`` of the list)."""

    options: dict[str, Any]
    entries: list[dict[str, Any]] | None
    rules: list[dict[str, Any]]
    rules_digest: str | None


class FirewallOwner(Protocol):
    """What of a VM's firewall its owner keeps (a :class:`VmSpec`, or a :class:`FirewallPart` of a job
    that converges the firewall alone)."""

    @property
    def owner(self) -> str: ...
    @property
    def member(self) -> str: ...
    @property
    def nic(self) -> str: ...
    @property
    def ip_filter(self) -> tuple[str, ...]: ...
    @property
    def firewall(self) -> FirewallSpec | None: ...


@dataclass(frozen=True)
class FirewallPart:
    """The owner's firewall part of a VM, for a job that keeps it without the rest of the VM's spec
    (a server's power and resize jobs put a changed policy back): ``ip_filter`` empty leaves the
    filter set to the jobs that keep it."""

    owner: str
    firewall: FirewallSpec | None
    member: str = MAIN
    nic: str = "net0"
    ip_filter: tuple[str, ...] = ()


def _mine_entry(spec: FirewallOwner, e: Mapping[str, Any]) -> bool:
    """An entry of the VM's filter set that may stay: one of the spec's addresses, or one another
    type declares (``VmParts.ipset_entries``: an address's)."""
    if e.get("nomatch"):
        return False
    return str(e.get("cidr")) in spec.ip_filter or resources.declared_ipset_entry(e.get("comment"))


def _platform(r: Mapping[str, Any]) -> bool:
    """A rule z9 writes and keeps whole: a platform rule, or one of a type's declared rules (VmParts.
    firewall_rules: a tenant firewall's compiled rules) — rewritten together, in the spec's order."""
    comment = str(r.get("comment") or "")
    return comment.startswith(PLATFORM_RULE) or resources.declared_firewall_rule(comment)


def _rule_owner(comment: str) -> str:
    """Whose rule it is, as people read it: "platform", or "z9 <type>" (the type declaring its prefix)."""
    if comment.startswith(PLATFORM_RULE):
        return "platform"
    owner = next((rt for rt in resources.types() for p in rt.vm_parts.firewall_rules if comment.startswith(p)), None)
    return f"z9 {owner.name.replace('_', ' ')}" if owner is not None else "z9"


def _rules_differ(want: Sequence[FwRule], have: Sequence[Mapping[str, Any]]) -> str:
    """Why the kept rules differ, naming whose (platform rules, a tenant firewall's, a load balancer's):
    "platform rules differ", "z9 firewall rules differ", "platform and z9 firewall rules differ"."""
    def by_owner(rules: list[Mapping[str, Any]]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {}
        for r in rules:
            out.setdefault(_rule_owner(str(r.get("comment") or "")), []).append(rule_key(r))
        return out
    w, h = by_owner([r.params() for r in want]), by_owner([r for r in have if _platform(r)])
    owners = sorted((o for o in {*w, *h} if w.get(o) != h.get(o)), key=lambda o: (o != "platform", o))
    if not owners:  # each owner's rules as they should be, interleaved otherwise
        return "the order of z9's firewall rules differs"
    return f"{' and '.join(owners)} rules differ"


def _contributed_rule(params: Mapping[str, str]) -> FwRule:
    """A rule a type contributes (``FirewallContribution.rules``) as the machinery writes it: its comment
    split at the declared prefix it carries."""
    comment = str(params.get("comment") or "")
    prefix = next((p for rt in resources.types() for p in rt.vm_parts.firewall_rules if comment.startswith(p)), None)
    if prefix is None:
        raise PermanentError(f"a contributed firewall rule's comment {comment!r} carries no declared prefix")
    return FwRule(str(params["type"]), str(params.get("action") or "ACCEPT"), comment[len(prefix):],
                  proto=params.get("proto") or None, dport=params.get("dport") or None,
                  source=params.get("source") or None, dest=params.get("dest") or None, prefix=prefix)


async def effective_firewall(ctx: JobContext, spec: Any) -> Any:
    """``spec`` (a :class:`VmSpec` or :class:`FirewallPart`) with what every type contributes to its VM's
    firewall now (``VmParts.firewall``: a tenant's firewalls on a server): the owner kind's platform rules
    first — no contribution removes them —, then the contributed rules; a policy is DROP when the owner
    kind's or any contribution says so. No contribution: ``spec`` as it is."""
    if spec.firewall is None:
        return spec
    contributions = await resources.vm_firewall(ctx.pool, spec.owner, spec.member)
    if not contributions:
        return spec
    fw = spec.firewall
    policy_in = "DROP" if any(c.policy_in == "DROP" for c in contributions) else fw.policy_in
    policy_out = "DROP" if any(c.policy_out == "DROP" for c in contributions) else fw.policy_out
    # the platform's part of another type first (a load balancer's health checks: when_closed), then
    # the tenant's: no tenant rule is ever above what the platform needs
    ordered = sorted((c for c in contributions if policy_in == "DROP" or not c.when_closed),
                     key=lambda c: not c.when_closed)
    rules = fw.rules + tuple(_contributed_rule(r) for c in ordered for r in c.rules)
    return replace(spec, firewall=FirewallSpec(policy_in=policy_in, policy_out=policy_out, rules=rules))


def firewall_drift(spec: FirewallOwner, vm: VmState, fw: FirewallState | None) -> list[str]:
    """Pure: what of the VM's firewall is not as ``spec`` wants (empty: as wanted), in words. Only
    z9's parts are compared: an operator's rules and options stay as they are."""
    return [text for text, _ in _firewall_findings(spec, vm, fw)]


def firewall_drifts(spec: FirewallOwner, vm: VmState, fw: FirewallState | None) -> list[Drift]:
    """Pure: the same findings as :func:`firewall_drift`, as drift (path, want, have)."""
    return [d for _, d in _firewall_findings(spec, vm, fw)]


def _rule_text(r: Mapping[str, Any]) -> str:
    k = rule_key(r)
    return " ".join(f"{n}={v}" for n, v in zip(("type", "action", "proto", "dport", "sport", "source", "dest",
                                                  "macro", "iface", "comment", "enable"), k) if v)


def _firewall_findings(spec: FirewallOwner, vm: VmState, fw: FirewallState | None) -> list[tuple[str, Drift]]:
    if spec.firewall is None and not spec.ip_filter:
        return []
    if fw is None:
        return [("firewall not read", Drift("firewall", "read", None))]
    out: list[tuple[str, Drift]] = []
    nic = [p for p in str(vm.config.get(spec.nic, "")).split(",") if p.startswith("firewall=")]
    if "firewall=1" not in nic:
        out.append((f"{spec.nic} not through the firewall",
                    Drift(f"config.{spec.nic}.firewall", "1", nic[0].partition("=")[2] if nic else None)))
    o = fw.options
    if spec.firewall is not None:
        if str(o.get("enable", 0)) != "1":
            out.append(("firewall off", Drift("firewall.options.enable", "1", str(o.get("enable", 0)))))
        for k in ("policy_in", "policy_out"):
            if str(o.get(k) or "") != getattr(spec.firewall, k):
                out.append((f"{k} {o.get(k) or '(default)'} not {getattr(spec.firewall, k)}",
                            Drift(f"firewall.options.{k}", getattr(spec.firewall, k), o.get(k))))
        have = [rule_key(r) for r in fw.rules if _platform(r)]
        want = [rule_key(r.params()) for r in spec.firewall.rules]
        if have != want:
            out.append((_rules_differ(spec.firewall.rules, fw.rules),
                        Drift("firewall.rules", [_rule_text(r.params()) for r in spec.firewall.rules],
                              [_rule_text(r) for r in fw.rules if _platform(r)])))
    if spec.ip_filter:
        if str(o.get("ipfilter", 0)) != "1" or (spec.firewall is None and str(o.get("enable", 0)) != "1"):
            out.append(("IP filter off", Drift("firewall.options.ipfilter", "1", str(o.get("ipfilter", 0)))))
        ents = fw.entries
        if ents is None or not set(spec.ip_filter) <= {str(e.get("cidr")) for e in ents} \
                or not all(_mine_entry(spec, e) for e in ents):
            out.append((f"{ipfilter_set(spec.nic)} not {sorted(spec.ip_filter)}",
                        Drift(f"firewall.ipset.{ipfilter_set(spec.nic)}", sorted(spec.ip_filter),
                              None if ents is None else sorted(str(e.get("cidr")) for e in ents))))
    return out


_PROTO_NUMBERS = {"tcp": "6", "udp": "17", "icmp": "1", "ah": "51", "esp": "50", "gre": "47", "vrrp": "112"}


def _port_in(spec: str, port: int) -> bool:
    """``port`` within a rule's ``dport``: ports, ``a:b`` ranges, comma lists (numbers only: a service
    name is not evaluated — :func:`inbound_drop` then answers "not known")."""
    for part in spec.split(","):
        lo, _, hi = part.strip().partition(":")
        if int(lo) <= port <= int(hi or lo):
            return True
    return False


def inbound_drop(options: Mapping[str, Any], rules: list[Mapping[str, Any]], nic: str, src: str, proto: str,
                 port: int | None) -> str | None:
    """What of a VM's firewall drops a new connection from ``src`` (``proto``, destination ``port``)
    arriving on its NIC (its config value ``nic``), as pve-firewall compiles its inbound chain
    (Firewall.pm ``ruleset_create_vm_chain``: the rules in order, the first match decides, then
    ``policy_in``, DROP when unset) — or None when it accepts, or when a rule it would meet first is
    not one this reads exactly (an IP set, alias, macro, service name): a diagnosis that names the
    firewall only when sure. The datacenter firewall's switch is the caller's to check."""
    import ipaddress

    if str(options.get("enable", 0)) != "1" or "firewall=1" not in nic.split(","):
        return None
    addr = ipaddress.ip_address(src)
    for r in sorted(rules, key=lambda r: int(r.get("pos", 0))):
        if str(r.get("enable") or 0) != "1" or r.get("type") == "out":
            continue
        if r.get("type") != "in" or r.get("macro") or r.get("iface") or r.get("dest") or r.get("sport"):
            return None  # a security group, a macro …: not read here
        rp = str(r.get("proto") or "")
        if rp and _PROTO_NUMBERS.get(rp, rp) != _PROTO_NUMBERS.get(proto, proto):
            continue
        try:
            if r.get("dport") and (port is None or not _port_in(str(r["dport"]), port)):
                continue
            if r.get("source"):
                nets = [ipaddress.ip_network(x.strip(), strict=False) for x in str(r["source"]).split(",")]
                if not any(addr.version == n.version and addr in n for n in nets):
                    continue
        except ValueError:
            return None  # an IP set, alias, range or service name: not read here
        if r.get("action") == "ACCEPT":
            return None
        what = f"{r.get('action')} {rp or 'any'}" + (f" port {r['dport']}" if r.get("dport") else "")
        return f"its firewall's rule {r.get('pos')} ({what}" + (f", '{r['comment']}'" if r.get("comment") else "") + ")"
    policy = str(options.get("policy_in") or "DROP")
    return None if policy == "ACCEPT" else f"its firewall's policy_in {policy}"


async def observe_firewall(ctx: JobContext, spec: FirewallOwner, vm: VmState) -> FirewallState | None:
    """The VM's firewall as :func:`firewall_drift` compares it (None when the spec wants none)."""
    if spec.firewall is None and not spec.ip_filter:
        return None
    opts = await ctx.pve.firewall_options(vm.node, vm.vmid)
    entries = await ctx.pve.ipset_entries(vm.node, vm.vmid, ipfilter_set(spec.nic)) if spec.ip_filter else None
    rules, digest = (await ctx.pve.firewall_rules(vm.node, vm.vmid)) if spec.firewall is not None else ([], None)
    return FirewallState(opts, entries, rules, digest)


async def firewall_ok(ctx: JobContext, spec: FirewallOwner, vm: VmState) -> bool:
    """The VM's firewall is as ``spec`` wants it (read now)."""
    return not firewall_drift(spec, vm, await observe_firewall(ctx, spec, vm))


async def nic_through_firewall(ctx: JobContext, vm: VmState, nic: str, step: Step) -> None:
    """``<nic>`` with ``firewall=1`` (qemu-server ``net[n]``: only then does its tap go through
    pve-firewall's bridge), written on the VM's config as read (digest)."""
    net = nic_with_firewall(str(vm.config.get(nic, "")))
    if net is not None:
        await ctx.fence()
        await ctx.wait_task(step, await ctx.pve.configure(vm.node, vm.vmid, {nic: net}, digest=vm.config.get("digest")))


async def _converge_rules(ctx: JobContext, vm: VmState, want: tuple[FwRule, ...],
                          read: tuple[list[dict[str, Any]], str | None] | None = None) -> None:
    """The platform rules exactly ``want``, in order, above the platform rules they replace; an
    operator's rules untouched. The new rules go in first, at the top (PVE inserts a new rule first:
    Rules.pm ``create_rule`` ``unshift``; last first), so no moment — a failed write, a lost lease, a
    pve-firewall compile in between — has fewer ports open than before; then the old ones go, from the
    bottom up, each delete naming the list's digest as read just before (rules are positional: a rule
    moved by anyone in between fails it with 500 "detected modified configuration", a
    :class:`DigestMismatch`). ``read``: the list and digest as just read (else read now)."""
    rules, digest = read if read is not None else await ctx.pve.firewall_rules(vm.node, vm.vmid)
    if [rule_key(r) for r in rules if _platform(r)] == [rule_key(r.params()) for r in want]:
        return
    for r in reversed(want):
        await ctx.fence()
        await ctx.pve.firewall_rule_add(vm.node, vm.vmid, r.params())
    rules, digest = await ctx.pve.firewall_rules(vm.node, vm.vmid)
    while True:
        # the first len(want) platform rules are the ones just added; every later one is replaced
        old = [r for r in rules if _platform(r)][len(want):]
        if not old:
            break
        await ctx.fence()
        await ctx.pve.firewall_rule_delete(vm.node, vm.vmid, int(max(r["pos"] for r in old)), digest=digest)
        rules, digest = await ctx.pve.firewall_rules(vm.node, vm.vmid)


async def _converge_ip_filter(ctx: JobContext, spec: FirewallOwner, vm: VmState,
                              read: FirewallState | None = None) -> None:
    """The filter set holding exactly the spec's addresses (and the entries other types declare):
    missing ones added, extra ones removed. ``read``: the firewall as the caller just read it (its
    set's entries — None: no such set — are not read again)."""
    name = ipfilter_set(spec.nic)
    entries = read.entries if read is not None else await ctx.pve.ipset_entries(vm.node, vm.vmid, name)
    if entries is None:
        await ctx.fence()
        await ctx.pve.ipset_create(vm.node, vm.vmid, name, comment="z9: addresses this VM may send from")
        entries = []
    have = {str(e.get("cidr")) for e in entries}
    for ip in spec.ip_filter:
        if ip not in have:
            await ctx.fence()
            await ctx.pve.ipset_add(vm.node, vm.vmid, name, ip, comment=f"z9 {spec.owner} {spec.member}")
    for e in entries:
        if not _mine_entry(spec, e):
            await ctx.fence()
            await ctx.pve.ipset_remove(vm.node, vm.vmid, name, str(e.get("cidr")))


async def apply_firewall(ctx: JobContext, spec: FirewallOwner, vm: VmState, step: Step,
                         read: FirewallState | None = None) -> None:
    """Put the VM's firewall as ``spec`` wants it, each part re-read: the NIC through the firewall,
    the filter set's entries, the platform rules — all *before* the options switch the firewall (and
    the filter) on with the spec's policies: never a moment with the filter on and the VM's own
    address missing, nor with the firewall on and its rules not there yet. A write PVE refuses for a
    stale digest (someone changed the VM's firewall in between) is done again once on a fresh read.
    ``read``: the firewall as the caller just read it (its set's entries, rules and options are not read
    again; a write refused for a stale digest reads them anew)."""
    await nic_through_firewall(ctx, vm, spec.nic, step)
    if spec.ip_filter:
        await _converge_ip_filter(ctx, spec, vm, read)
    want: dict[str, Any] = {}
    if spec.firewall is not None:
        want = {"enable": 1, "policy_in": spec.firewall.policy_in, "policy_out": spec.firewall.policy_out}
    if spec.ip_filter:
        want.update(enable=1, ipfilter=1)
    for again in (False, True):
        try:
            if spec.firewall is not None:
                await _converge_rules(ctx, vm, spec.firewall.rules,
                                      (read.rules, read.rules_digest) if read is not None and not again else None)
            opts = (read.options if read is not None and not again
                    else await ctx.pve.firewall_options(vm.node, vm.vmid))
            if any(str(opts.get(k, "")) != str(v) for k, v in want.items()):
                await ctx.fence()
                await ctx.pve.set_firewall_options(vm.node, vm.vmid, digest=opts.get("digest"), **want)
            return
        except DigestMismatch:
            if again:
                raise
            log.info("job %s: VM %s's firewall changed while z9 wrote it; once more on a fresh read",
                     ctx.job.id, vm.vmid)


def plan_member(spec: VmSpec, world: MemberWorld, *, region: str = "") -> list[Step]:
    """Pure: the steps still missing. Raises PermanentError (platform-tagged template, disk too
    small), GuardRefusal (the VM carries a platform role), Snooze (VM locked, a lost clone
    request may still land, or no template of that name yet)."""
    if world.vm is None:
        if world.clone_in_flight_s > 0:  # never clone again while the lost request may still land
            raise Snooze(f"an earlier clone request got no answer and may still be performed; "
                         f"waiting up to {world.clone_in_flight_s:.0f}s for it", delay_s=min(world.clone_in_flight_s, 10.0))
        if world.template is None:
            # Not visible yet (an image being imported, a template being renamed): waiting on the
            # world, not a failure (it spends no attempt; snooze_limit_s bounds the wait).
            raise Snooze(f"image {spec.image!r}: no template with that name in region {region} yet; "
                         "waiting for it to appear", delay_s=5.0)
        if platform_roles(world.template.tags):
            raise PermanentError(f"image {spec.image!r}: template {world.template.vmid} carries platform role "
                                 f"{', '.join(sorted(platform_roles(world.template.tags)))}; its clones would "
                                 "inherit it, so z9 does not clone it")
        if world.template_disk_gib is not None:
            check_no_shrink(spec, world.template_disk_gib)
        # a template on storage both nodes share is cloned there with target=: nothing to move
        move = ([MIGRATE.step({"target": spec.node})]
                if spec.node and spec.node != world.template.node and not world.template_shared else [])
        gone = Drift(f"vm.{spec.member}", "exists", None)
        return [CLONE.step().explained(f"no VM carries {identity_tag(spec.owner)} (member {spec.member}): "
                                       f"clone {spec.image!r}", [gone]),
                CONFIGURE.step(), RESIZE_DISK.step(),
                *([FIREWALL.step()] if spec.ip_filter or spec.firewall else []), *move, START.step()]
    vm = world.vm
    refuse_platform(spec.owner, vm)
    if vm.lock == "clone":
        move = [MIGRATE.step({"target": spec.node})] if spec.node and spec.node != vm.node else []
        return [WAIT_CLONE.step({"vmid": vm.vmid}), CONFIGURE.step(), RESIZE_DISK.step(),
                *([FIREWALL.step()] if spec.ip_filter or spec.firewall else []), *move, START.step()]
    refuse_if_locked(vm)
    steps = []
    changed = config_drift(spec, vm)
    if changed:
        steps.append(CONFIGURE.step().explained(configure_why(vm, changed), changed))
    disk = boot_disk(vm.config)
    if disk is None:
        raise PermanentError(f"VM {vm.vmid} has no data disk to size")
    check_no_shrink(spec, disk[1])
    if disk[1] < spec.disk_gib - 1e-9:
        steps.append(RESIZE_DISK.step().explained(f"grow {disk[0]} to {spec.disk_gib} GiB (online)",
                                                  [Drift(f"config.{disk[0]}.size_gib", spec.disk_gib, disk[1])]))
    if world.firewall_drift:
        fixed: list[Drift] = [f for planned in steps for f in planned.drift]
        fixes = [f for f in world.firewall_drifts if f not in fixed]
        steps.append(FIREWALL.step({"drift": world.firewall_drift}).explained(
            "put the VM firewall back as z9 keeps it: " + "; ".join(world.firewall_drift), fixes))
    if not vm.running:
        if spec.node and vm.node != spec.node:  # cloned on the template's node: moved before its first start
            steps.append(MIGRATE.step({"target": spec.node}).explained(
                f"move the stopped VM to {spec.node} before its first start", [Drift(f"node.{spec.member}", spec.node, vm.node)]))
        steps.append(START.step().explained(f"start VM {vm.vmid} (it is {vm.status})",
                                            [Drift(f"power.{spec.member}", "running", vm.status)]))
    return steps


async def _configure(ctx: JobContext, spec: VmSpec, world: MemberWorld, step: Step) -> None:
    try:
        await _configure_once(ctx, spec, world)
    except DigestMismatch:
        # someone wrote the VM's config since it was read: once more on a fresh read (the same
        # attempt), then it is a temporary error like any other
        log.info("job %s: VM config changed while z9 wrote it; once more on a fresh read", ctx.job.id)
        world.fresh = False
        await _configure_once(ctx, spec, world)


async def _configure_once(ctx: JobContext, spec: VmSpec, world: MemberWorld) -> None:
    vm = await _current(ctx, world)
    refuse_platform(spec.owner, vm)  # never rewrite a platform VM's tags
    refuse_if_locked(vm)
    diff = spec_diff(spec, vm.config)
    foreign = spec.foreign_keys(vm.config, vm.vmid)
    if foreign:
        diff["delete"] = ",".join(foreign)
    if diff:
        await ctx.fence()
        # synchronous (PUT): one request, no task to poll (ProxmoxClient.configure_now)
        await ctx.pve.configure_now(vm.node, vm.vmid, diff, digest=vm.config.get("digest"))
        ctx.touch()
        # what the write did, laid over what was read (the digest is stale now): the next
        # step (the disk size) needs no new read; verify reads the VM again
        deleted = set(filter(None, diff.get("delete", "").split(",")))
        cfg = {k: v for k, v in vm.config.items() if k != "digest" and k not in deleted}
        cfg.update({k: v for k, v in diff.items() if k != "delete"})
        world.vm = replace(vm, config=cfg, tags=normalize_tags(cfg.get("tags")))


async def _resize_disk(ctx: JobContext, spec: VmSpec, world: MemberWorld, step: Step) -> None:
    vm = await _current(ctx, world)
    refuse_if_locked(vm)
    disk = boot_disk(vm.config)
    if disk is None:
        raise PermanentError(f"VM {vm.vmid} has no data disk to size")
    check_no_shrink(spec, disk[1])
    if disk[1] < spec.disk_gib - 1e-9:
        step.detail["disk"] = disk[0]
        await ctx.fence()
        upid = await ctx.pve.resize(vm.node, vm.vmid, disk[0], spec.disk_gib)
        if upid:
            await ctx.wait_task(step, upid)
        # only the disk's size changed (the next steps do not read it): the rest of the config as
        # read still holds, but not its digest
        world.vm = replace(vm, config={k: v for k, v in vm.config.items() if k != "digest"})


async def _firewall(ctx: JobContext, spec: VmSpec, world: MemberWorld, step: Step) -> None:
    vm = await _current(ctx, world)
    refuse_platform(spec.owner, vm)
    refuse_if_locked(vm)
    eff = await effective_firewall(ctx, spec)
    fw = await observe_firewall(ctx, eff, vm)
    if firewall_drift(eff, vm, fw):
        await apply_firewall(ctx, eff, vm, step, fw)
        world.fresh = False  # the NIC's firewall flag may have changed the config
    world.firewall_drift = []


async def _migrate(ctx: JobContext, spec: VmSpec, world: MemberWorld, step: Step) -> None:
    vm = await _current(ctx, world, config=False)
    refuse_if_locked(vm)
    if spec.node and vm.node != spec.node and not vm.running:
        # offline migration: PVE copies the local disks and moves the config (QemuMigrate.pm)
        await ctx.fence()
        upid = await ctx.pve.migrate(vm.node, vm.vmid, spec.node)
        world.fresh = False
        await ctx.wait_task(step, upid)
        world.vm = replace(vm, node=spec.node)  # the start step reads it there


async def _start(ctx: JobContext, spec: VmSpec, world: MemberWorld, step: Step) -> None:
    vm = await _current(ctx, world, config=False)
    refuse_if_locked(vm)
    await ensure_running(ctx, step, vm)


async def apply_member_step(ctx: JobContext, spec: VmSpec, world: MemberWorld, step: Step) -> None:
    """Run one step if still needed (each re-reads the VM first) and wait for its task: the step's
    own kind runs it (:data:`MEMBER_STEPS`)."""
    await MEMBER_STEPS.of(step, ctx.job.kind).run(ctx, spec, world, step)


async def verify_member(ctx: JobContext, spec: VmSpec) -> VmState:
    """Observe again; the plan must be empty (else TemporaryError). Returns the member's VM."""
    world = await observe_member(ctx, spec)
    remaining = plan_member(spec, world, region=ctx.job.region)
    if remaining or world.vm is None:
        raise TemporaryError("verify: still to do: " + ", ".join(s.name for s in remaining))
    return world.vm


async def _current(ctx: JobContext, world: MemberWorld, *, config: bool = True) -> VmState:
    """The member's VM as the next step needs it. ``config``: its config, read again unless this
    attempt read it after its last change (``world.fresh``: a clone just read, a configure laid
    over); else (a start, a migration) its power state and lock only, from ``status/current``
    (one request; ``lock`` is there too)."""
    vm = world.vm
    if vm is None:
        raise TemporaryError("no VM to act on yet")
    if config:
        if world.fresh:
            return vm
        st = await ctx.pve.vm_state(vm.node, vm.vmid, status=False)
        if st is None:
            raise TemporaryError(f"VM {vm.vmid} disappeared from {vm.node}")
        world.vm, world.fresh = replace(st, status=vm.status, uptime_s=vm.uptime_s), True
        return world.vm
    if world.power_known:
        return vm
    cur = await ctx.pve.vm_status(vm.node, vm.vmid)
    if cur is None:
        raise TemporaryError(f"VM {vm.vmid} disappeared from {vm.node}")
    cfg = {k: v for k, v in vm.config.items() if k != "lock"}
    if cur.get("lock"):
        cfg["lock"] = cur["lock"]
    up = cur.get("uptime")
    world.vm = replace(vm, config=cfg, status=str(cur.get("status", "unknown")),
                       uptime_s=int(up) if up is not None else None)
    return world.vm


async def _clone(ctx: JobContext, spec: VmSpec, world: MemberWorld, step: Step) -> None:
    """The clone ladder: pick a vmid, record the request, POST, record the answer, wait."""
    tpl = world.template
    assert tpl is not None
    if spec.node and spec.node != tpl.node:
        # one template per node (an operator's choice): clone the one on the member's node
        there = await find_template_on(ctx, spec.image, spec.node)
        if there is not None:
            tpl = VmRef(vmid=there.vmid, node=there.node, name=spec.image, status=there.status, tags=there.tags,
                        lock=there.lock, template=True)
    for _ in range(CLONE_TRIES):
        # nextid hands every parallel create the same lowest free id (it reserves nothing): each
        # process picks in its own lane above it, never an id it asked for moments ago.
        newid = await ctx.pve.pick_vmid()
        # where the clone lands: the member's node straight away when the template's volumes are
        # on shared storage; a template PVE refused so ("VM uses local storage") is cloned on its
        # own node and the migrate step moves the VM before its first start
        node = spec.node or tpl.node
        if tpl.vmid in ctx.pve.local_templates:
            node = tpl.node
        # Recorded *before* it is sent (send_create): until its answer is recorded it is uncertain
        # (the next attempt waits for it and a deletion looks at every vmid ever asked for).
        await ctx.remember(clone={"member": spec.member, "vmid": newid, "node": node, "upid": None})
        await ctx.step_detail(step, vmid=newid, node=node, template=tpl.vmid)
        def clone(newid: int = newid, node: str = node) -> Awaitable[str]:
            return ctx.pve.clone(tpl.node, tpl.vmid, newid=newid, name=spec.name, description=spec.marker,
                                 target=node)
        try:
            upid = await send_create(ctx, spec.owner, spec.member, newid, node, clone,
                                     refused=(VmidTaken, CloneNeedsSharedStorage))
        except VmidTaken:
            # A parallel create won this vmid (a definite answer: nothing was cloned; forgotten).
            # Pick again; never adopt that VM.
            ctx.pve.vmid_taken(newid)
            continue
        except CloneNeedsSharedStorage:
            # Refused before any task (nothing cloned; forgotten): this template is on local
            # storage. Clone on the template's node (the migrate step moves it).
            ctx.pve.local_templates.add(tpl.vmid)
            if world.template_shared:
                # planned without a migrate step (the storages looked shared): plan again, now
                # with it (nothing was cloned; the next observe skips the storage check)
                world.template_shared = False
                raise TemporaryError(f"PVE refused to clone template {tpl.vmid} to node {node} (VM uses "
                                     "local storage) though its storages looked shared; planning a migration")
            continue
        await ctx.remember(clone={"member": spec.member, "vmid": newid, "node": node, "upid": upid})
        try:
            await ctx.wait_task(step, upid)
        except TaskFailed as e:
            if not _lost_clone_race(e.exitstatus, newid):
                raise
            # PVE's newid check before fork_worker is racy (Qemu.pm clone_vm): a parallel clone to
            # the same vmid won after ours got its UPID, and our worker found the config file there
            # (or its flock held) and did nothing. Not ours, not a failure: forget it, pick again.
            log.info("job %s: clone to VM %s lost a race after its UPID (%s); picking another vmid",
                     ctx.job.id, newid, e.exitstatus)
            await store.vm_clone_refused(ctx.pool, spec.owner, spec.member, newid)
            ctx.pve.vmid_taken(newid)
            continue
        # its config (one read: a clone is made stopped — Qemu.pm clone_vm starts nothing — and the
        # start step reads the power state it acts on)
        st = await ctx.pve.vm_state(node, newid, status=False)
        if st is None:
            raise TemporaryError(f"clone task {upid} ended OK but VM {newid} is not on {node}")
        world.vm, world.fresh = replace(st, status="stopped"), True
        world.power_known = not st.lock
        return
    # Contention with other creates is waiting on the world, not a failure of this job.
    raise Snooze(f"every vmid tried was taken by a parallel create ({CLONE_TRIES} tries)", delay_s=1.0)


def _lost_clone_race(exitstatus: str, newid: int) -> bool:
    """Whether a failed clone task's ``exitstatus`` says another clone to ``newid`` was first (its
    config file there, or its flock on that vmid held): nothing of ours was made (Qemu.pm clone_vm
    unlinks its own temporary config on any failure)."""
    return (f"unable to create VM {newid}: config file already exists" in exitstatus
            or f"lock-{newid}.conf' - got timeout" in exitstatus)


async def _wait_clone(ctx: JobContext, spec: VmSpec, world: MemberWorld, step: Step) -> None:
    """Wait for a clone started earlier: on its UPID when one was recorded for that vmid, else
    until the target's ``lock: clone`` goes away; then it must carry the member's marker."""
    vm = world.vm
    assert vm is not None
    req = next((m for m in await clone_requests(ctx, spec.owner, spec.member) if m.vmid == vm.vmid and m.upid),
               None)
    upid = req.upid if req else None
    if upid:
        await ctx.wait_task(step, upid)
        if req is not None and req.node != vm.node:
            vm = world.vm = VmState(vmid=vm.vmid, node=req.node, config=vm.config, status=vm.status, tags=vm.tags)
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
    if st is None or not carries_marker(st.config.get("description"), spec.owner, spec.member):
        raise TemporaryError(f"the clone at VM {vm.vmid} did not produce our VM; observing again")
    # made, our marker on it: a request whose answer was lost is answered now (create_adopted) — a clone
    # still locked when the retry observed it (a slow task) is adopted here, not in observe_member
    await create_adopted(ctx, spec.owner, vm.vmid, await clone_requests(ctx, spec.owner, spec.member))
    world.vm, world.fresh = st, True


# ================================================================ removal: every VM of an owner

@dataclass
class Removal:
    """What a removal found: the owner's tagged VMs, its untagged clones, and suspects (the VM
    the database last recorded, when it is not one of ours)."""

    ours: list[VmState] = field(default_factory=list)
    clones: list[VmState] = field(default_factory=list)
    suspects: list[VmState] = field(default_factory=list)
    superseded: str | None = None


async def observe_removal(ctx: JobContext, owner: str, recorded: list[tuple[int, str]] = ()) -> Removal:
    """Every VM of ``owner`` (all members), its untagged clones, and the recorded (vmid, node)
    that are not among them, as suspects."""
    ours = await find_vms(ctx, owner)
    clones = await find_own_clones(ctx, owner, await clone_requests(ctx, owner), {v.vmid for v in ours})
    suspects = []
    for rec in recorded:
        s = await find_suspect(ctx, rec, ours + clones)
        if s is not None:
            suspects.append(s)
    return Removal(ours=ours, clones=clones, suspects=suspects)


def plan_removal(owner: str, world: Removal) -> list[Step]:
    """Pure: stop/destroy per VM of ours. Raises GuardRefusal (platform role, or not ours),
    Snooze (VM locked)."""
    if world.superseded:
        return []
    for vm in world.suspects:
        guard_suspect(owner, vm)
    steps = []
    for vm in world.ours:
        guard(owner, vm)
        if vm.lock == "destroyed":
            continue  # a destroy is already under way; verify waits for it
        refuse_if_locked(vm)
        if vm.running:
            steps.append(STOP.step({"vmid": vm.vmid, "node": vm.node}))
        steps.append(DESTROY.step({"vmid": vm.vmid, "node": vm.node}))
    for vm in world.clones:  # half-made: cloned, never tagged (the create failed or was cut short)
        refuse_if_locked(vm)
        guard_own_clone(owner, vm)
        detail = {"vmid": vm.vmid, "node": vm.node, "untagged": True}
        if vm.running:
            steps.append(STOP.step(dict(detail)))
        steps.append(DESTROY.step(dict(detail)))
    return steps


async def apply_removal_step(ctx: JobContext, owner: str, step: Step) -> None:
    """Stop or destroy one VM after re-reading it and re-applying the guard; waits for tasks (the
    step's own kind runs it: :data:`REMOVAL_STEPS`)."""
    vmid, node = step.detail["vmid"], step.detail["node"]
    kind = REMOVAL_STEPS.of(step, ctx.job.kind)
    st = await ctx.pve.vm_state(node, vmid)
    if st is None:
        return  # already gone; verify checks by tag
    # Re-check right before acting: the tags (or, for an untagged clone, our marker).
    if step.detail.get("untagged"):
        guard_own_clone(owner, st)
    else:
        guard(owner, st)
    refuse_if_locked(st)
    await kind.run(ctx, st, step)


async def _stop_vm(ctx: JobContext, st: VmState, step: Step) -> None:
    if st.running:
        await ctx.fence()
        await ctx.wait_task(step, await ctx.pve.stop(st.node, st.vmid))


async def _destroy_vm(ctx: JobContext, st: VmState, step: Step) -> None:
    if st.running:
        raise TemporaryError(f"VM {st.vmid} is running again; stopping it first next attempt")
    # destroy_vm frees every disk the VM owns: never one another type keeps on it (a volume's, detached
    # before by its jobs) — the parts declared outlives_vm, through the registry: held (a snooze) until gone
    await resources.refuse_vm_destroy(ctx, st)
    if str(st.config.get("protection", "0")) == "1":
        # Lift our protection on exactly the config the guard just read (digest), then destroy.
        await ctx.fence()
        upid = await ctx.pve.configure(st.node, st.vmid, {"delete": "protection"}, digest=st.config.get("digest"))
        await ctx.wait_task(step, upid)
    await ctx.fence()
    await ctx.wait_task(step, await ctx.pve.destroy(st.node, st.vmid))


async def verify_removed(ctx: JobContext, owner: str) -> None:
    """No VM carries ``owner``'s tag and no untagged clone of ours is left (else TemporaryError);
    waits (Snooze) while a clone request without answer may still land, or a clone of ours still
    runs."""
    requests = await clone_requests(ctx, owner)
    since = clone_uncertain_since(requests)
    if since is not None:
        wait = since + ctx.settings.uncertain_window_s - ctx.clock.time()
        if wait > 0:
            raise Snooze(f"a clone request sent {ctx.clock.time() - since:.0f}s ago got no answer and may still "
                         f"be performed; checking again in {wait:.0f}s", delay_s=min(wait, 30.0))
    # each VM the snapshot names is confirmed on its node; "none left" needs a listing newer than the claim
    left = await find_vms(ctx, owner)
    if left:
        raise TemporaryError("verify: VMs still carry the identity tag: "
                             + ", ".join(f"{v.vmid} on {v.node}" for v in left))
    clones = await find_own_clones(ctx, owner, requests, set())
    running = [v for v in clones if v.lock == "clone"]
    if running:  # a clone of ours is still being made: waiting on the world spends no attempt
        raise Snooze("verify: a clone of ours is still running at "
                     + ", ".join(f"{v.vmid} on {v.node}" for v in running) + "; waiting for it", delay_s=2.0)
    if clones:
        raise TemporaryError("verify: untagged clones of ours remain: "
                             + ", ".join(f"{v.vmid} on {v.node}" for v in clones))


# ================================================================ the steps, as values

#: a member's steps: run(ctx, spec, world, step)
CLONE = StepKind("clone", _clone, why="clone the template: the VM does not exist")
WAIT_CLONE = StepKind("wait_clone", _wait_clone, why="wait for the clone under way")
CONFIGURE = StepKind("configure", _configure, why="write the VM's config as its spec says")
RESIZE_DISK = StepKind("resize_disk", _resize_disk, why="grow the boot disk to the spec's size (online)")
FIREWALL = StepKind("firewall", _firewall, why="put the VM firewall as z9 keeps it")
MIGRATE = StepKind("migrate", _migrate, why="move the stopped VM to its node (offline)")
START = StepKind("start", _start, why="start the VM")
MEMBER_STEPS = StepKinds(CLONE, WAIT_CLONE, CONFIGURE, RESIZE_DISK, FIREWALL, MIGRATE, START)

#: a removal's steps: run(ctx, the VM just re-read and guarded, step)
STOP = StepKind("stop", _stop_vm, disruptive=True, why="stop the VM before its destroy")
DESTROY = StepKind("destroy", _destroy_vm, disruptive=True, why="destroy the VM")
REMOVAL_STEPS = StepKinds(STOP, DESTROY)
