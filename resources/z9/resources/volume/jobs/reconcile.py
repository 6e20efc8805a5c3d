"""A volume's reconciler: its world, the pure plan and the idempotent steps (create, attach, detach,
resize, delete).

Where a volume's disk lives (see :mod:`z9.resources.volume.disks` for identity):

- **detached**: on the volume's *anchor*, a stopped config-only VM (no NIC, never started) tagged
  ``z9-id-<vol>``, ``z9-member-volume``, ``z9-role-customer``, holding the disk as ``scsi0`` with the
  volume's serial. Created with the disk in one ``POST /nodes/{node}/qemu`` (``scsi0=<storage>:<GiB>,
  serial=…``: Qemu.pm create_disks → vdisk_alloc), through the create ledger every VM create goes through
  (:func:`z9.executor.vms.send_create`, ``vm_clone_requests``): recorded before it is sent, a create whose
  answer was lost may still be performed for ``uncertain_window_s`` — no other anchor is made meanwhile,
  and a late one is adopted by its recorded vmid.
- **attached**: on the server's VM, at the lowest free ``scsiN`` (N ≥ 1), moved there from the anchor by
  ``move_disk target-vmid`` (a reassign: no copy, hot-plugged into a running server). PVE reassigns only
  between VMs of one node: the anchor is migrated (offline, config only on shared storage) to the
  server's node first.
- **detaching**: a running server cannot give a drive away ("Cannot move disk to another VM while the
  source VM is running - detach first"): it is unplugged first (``delete=scsiN`` → ``unusedN``, the serial
  lost), then the ``unusedN`` is reassigned to the anchor and the anchor's drive labelled with the serial
  again. A stopped server's drive is reassigned as it is. The step that unplugs records the volid it
  unplugged before sending, so a resumed job finds the bare ``unusedN`` by it.

Plan (pure, :func:`plan`) from the intent (row: size, the server it should be on, or the final delete)
and the world (:class:`VolumeWorld`): steps ``create``, ``unplug``, ``detach``, ``label``,
``move_anchor``, ``attach``, ``resize``, ``destroy`` in that order, each only if missing. Every step
(:func:`apply_step`) observes again before acting and does nothing when its effect is already there, so a
job killed at any point resumes from what exists: a reassign is one PVE task (the disk leaves one config
and enters the other under both config locks), so a disk is never on two VMs, and no ``unusedN`` is left
behind (a detach ends on the anchor).

The deletion guard: ``destroy`` re-reads the anchor and destroys it only if it carries the volume's
identity and role tags (:func:`z9.executor.vms.guard`) and holds no disk but this volume's
(:func:`z9.resources.volume.guard.guard_disks`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from z9.common.errors import PermanentError, Snooze, TemporaryError
from z9.common.tags import customer_vm_tags, format_tags

from z9.executor.context import Drift, Step
from z9.resources.volume.disks import Disk, find_volume_disk, free_drive_key, parse_disks, volume_serial
from z9.resources.volume.guard import guard_disks
from z9.executor.proxmox import VmidTaken, VmState
from z9.resources.volume.pve import DiskOps
from z9.executor.vms import guard, refuse_if_locked

log = logging.getLogger("z9.resources.volume")

ANCHOR_MEMBER = "volume"
ANCHOR_KEY = "scsi0"
CREATE_TRIES = 5


@dataclass(frozen=True)
class VolumeIntent:
    """What the row says: the volume, its size, its storage and node preference, the server it should
    be attached to (None: detached), or ``delete`` (the final delete: disk and anchor go)."""

    volume_id: str
    name: str
    size_gib: int
    storage: str
    server_id: str | None = None
    delete: bool = False
    node: str | None = None  # where to create the anchor (None: the target server's, else the first)
    # a verify once saw the volume's disk (the row's observed names its volid): a disk found nowhere now
    # is lost, never made again — a new blank disk would silently stand in for the customer's data
    had_disk: bool = False
    # every volid z9 recorded for the disk (the row's ``disk_volids``: where a verify last saw it, and what
    # steps acted on since): a bare unusedN of one of them is its disk — an operator unplugged the drive
    # (``delete=scsiN`` drops the serial), or an unplug whose job failed before the reassign
    volids: tuple[str, ...] = ()

    @property
    def serial(self) -> str:
        return volume_serial(self.volume_id)


@dataclass(frozen=True)
class Placed:
    """The VM holding the volume's disk now, and the disk there."""

    vm: VmState
    disk: Disk
    server_id: str | None  # None: the anchor


@dataclass
class VolumeWorld:
    anchor: VmState | None = None
    placed: Placed | None = None
    target: VmState | None = None  # the VM of intent.server_id (found by its tag), if any
    creating: VmState | None = None  # a VM our recorded create made, still locked (lock: create)
    extra_anchors: list[VmState] = field(default_factory=list)  # copies of the anchor z9 reports, never touches
    # how long a create of ours whose answer was lost may still be performed (the create ledger's window):
    # while no anchor is found, no other is made
    create_uncertain_s: float = 0.0
    notes: list[str] = field(default_factory=list)


# ================================================================ observe

FindVm = Callable[[str], Awaitable[VmState | None]]  # owner id -> its main VM (by tag), or None


def recorded(steps: list[dict[str, Any]], name: str, key: str) -> list[Any]:
    """The values of ``key`` recorded in the details of earlier steps called ``name`` (a job's last
    attempt's steps: the vmids a create picked, the volids an unplug saw)."""
    return [s.get("detail", {}).get(key) for s in steps or [] if s.get("name") == name
            and s.get("detail", {}).get(key) is not None]


async def observe(ops: DiskOps, intent: VolumeIntent, *, find_anchor: FindVm, find_server: FindVm,
                  known_servers: list[str], last_steps: list[dict[str, Any]] | None = None,
                  created: tuple[tuple[int, str], ...] = (), create_uncertain_s: float = 0.0) -> VolumeWorld:
    """The anchor (by tag, else at a vmid a create of ours asked for: the job's steps and the create
    ledger's ``created`` (vmid, node)), the VM holding the disk (by the disk's serial: the anchor, the
    target server, or a server the row last knew it on — ``known_servers``; by a recorded volid for a
    bare ``unusedN``), the target server's VM, a create of ours still running, and how long one whose
    answer was lost may still land (``create_uncertain_s``)."""
    w = VolumeWorld(create_uncertain_s=create_uncertain_s)
    serial = intent.serial
    # the volids the volume's disk had when a step of ours took it off a server (each plan carries them
    # on, so the record outlives the attempt that made it: a replan keeps it in its detach step)
    volids = [*recorded(last_steps or [], "unplug", "volid"), *recorded(last_steps or [], "detach", "volid"),
              *intent.volids]
    w.anchor = await find_anchor(intent.volume_id)
    if w.anchor is None:
        asked = [(int(s["detail"]["vmid"]), s["detail"]["node"]) for s in last_steps or [] if s.get("name") == "create"
                 and s.get("detail", {}).get("vmid") is not None and s["detail"].get("node")]
        for rec, node in dict.fromkeys([*asked, *created]):
            st = await ops.vm_state(node, int(rec))
            if st is None:
                continue
            if st.lock == "create":
                w.creating = st
            elif st.tags >= customer_vm_tags(intent.volume_id, ANCHOR_MEMBER):
                # the anchor our own recorded create made: the job's record is an authority of its own
                # for it (as a server's clone ledger is), so it is found at once, not only once the
                # process's /cluster/resources snapshot lists it (that listing may predate the create)
                w.anchor = st
                break
    if w.anchor is not None:
        d = find_volume_disk(w.anchor.config, serial, volids) or next(iter(parse_disks(w.anchor.config)), None)
        if d is not None:
            w.placed = Placed(w.anchor, d, None)
    servers = [s for s in dict.fromkeys([*( [intent.server_id] if intent.server_id else []), *known_servers]) if s]
    for sid in servers:
        vm = await find_server(sid)
        if vm is None:
            continue
        if sid == intent.server_id:
            w.target = vm
        if w.placed is None:
            d = find_volume_disk(vm.config, serial, volids)
            if d is not None:
                w.placed = Placed(vm, d, sid)
    return w


def anchor_of(found: list[VmState], intent: VolumeIntent) -> tuple[VmState, list[VmState]]:
    """Pure: of several VMs carrying the volume's anchor identity (an operator cloned the anchor: the clone
    inherits its tags, and a full clone copies its disk, serial and all), the one holding the volume's
    disk — by a volid z9 recorded for it first (a copy's disk has a new name), else by its serial — and
    the others, which z9 reports and never touches. PermanentError when that does not single one out."""
    for holds in (lambda v: any(d.volid in intent.volids for d in parse_disks(v.config)),
                  lambda v: find_volume_disk(v.config, intent.serial) is not None):
        keep = [v for v in found if holds(v)]
        if len(keep) == 1:
            return keep[0], [v for v in found if v is not keep[0]]
    where = ", ".join(f"{v.vmid} on {v.node}" for v in found)
    raise PermanentError(f"volume {intent.volume_id}: {len(found)} VMs carry its anchor's identity ({where}) and "
                         "none alone holds its disk; an operator must remove the extra ones")


# ================================================================ plan (pure)

#: how long a volume waits before it looks again for the VM of the server it is meant for (a snooze:
#: bounded by Z9_SNOOZE_LIMIT_S, no attempt spent)
WAIT_FOR_SERVER_S = 5.0


def plan(intent: VolumeIntent, w: VolumeWorld) -> list[Step]:
    """Pure: the steps still missing, in order. Raises Snooze (a create of ours still running, a VM
    locked), PermanentError (the disk is lost, the target VM gone, a shrink), GuardRefusal."""
    if w.creating is not None and w.anchor is None:
        raise Snooze(f"volume {intent.volume_id}: VM {w.creating.vmid} is still being created", delay_s=2.0)
    if w.anchor is None and w.create_uncertain_s > 0:
        # PVE may still perform a create whose answer was lost (the ledger's window): making another now
        # would give the volume two anchors and two disks with one serial
        raise Snooze(f"volume {intent.volume_id}: a create of its anchor got no answer and may still be performed; "
                     f"checking again, another is made only after {w.create_uncertain_s:.0f}s",
                     delay_s=min(w.create_uncertain_s, 2.0))
    steps: list[Step] = []
    placed = w.placed
    if w.anchor is not None:
        refuse_if_locked(w.anchor)
    if placed is not None and placed.vm is not w.anchor:
        refuse_if_locked(placed.vm)

    if intent.delete:
        if placed is not None and placed.server_id is not None:
            steps += _detach_steps(placed)
        if w.anchor is not None:
            guard(intent.volume_id, w.anchor)
            if placed is None or placed.server_id is None:
                # a disk on the anchor without the serial (a detach cut short before its label) is the
                # volume's: the anchor holds nothing else; labelled first so the guard can tell
                if placed is not None and placed.disk.serial != intent.serial:
                    steps.append(Step("label", {"vmid": w.anchor.vmid, "node": w.anchor.node}))
                else:
                    guard_disks(w.anchor.vmid, w.anchor.node, w.anchor.config, allowed_serials={intent.serial},
                                allowed_volids=set())
            steps.append(Step("destroy", {"vmid": w.anchor.vmid, "node": w.anchor.node}))
        return steps

    if w.anchor is None and placed is None:
        if intent.had_disk:
            raise PermanentError(f"volume {intent.volume_id}: its disk (serial {intent.serial}) is on no VM z9 can "
                                 "find — not its anchor, not a server it was meant for; it is not made again "
                                 "empty. An operator must find the disk (or delete the volume)")
        steps.append(Step("create", {"storage": intent.storage, "size_gib": intent.size_gib}).explained(
            f"make the volume's disk ({intent.size_gib} GiB on {intent.storage}) on a new anchor VM",
            [Drift("disk", "exists", None)]))
    elif w.anchor is None:
        steps.append(Step("create", {"storage": intent.storage, "size_gib": 0, "empty": True}).explained(
            "make the volume's anchor VM (empty: the disk is on a server)", [Drift("anchor", "exists", None)]))
    elif placed is None:
        raise PermanentError(f"volume {intent.volume_id}: its disk is on no VM z9 can find (anchor VM "
                             f"{w.anchor.vmid} on {w.anchor.node} holds none, nor does any server it was on)")
    elif placed.disk.size_gib is not None and placed.disk.size_gib > intent.size_gib + 1e-9:
        raise PermanentError(f"volume {intent.volume_id}: its disk is {placed.disk.size_gib:g} GiB, larger "
                             f"than the {intent.size_gib} GiB asked for: volumes never shrink")

    on_anchor = placed is None or placed.server_id is None
    where = attached_to(placed)
    moved = [Drift("attached_to", intent.server_id, where)] if where != intent.server_id else []
    if placed is not None and placed.server_id is not None and (
            placed.server_id != intent.server_id or placed.disk.unused):
        steps += _detach_steps(placed, moved)
        on_anchor = True
    elif on_anchor and placed is not None and placed.disk.serial != intent.serial:
        steps.append(Step("label", {}).explained(f"label the disk with the volume's serial {intent.serial}",
                                                 [Drift("disk.serial", intent.serial, placed.disk.serial)]))
    if intent.server_id is not None and on_anchor:
        if w.target is None:  # (its create still cloning): waiting on the world spends no attempt
            raise Snooze(f"volume {intent.volume_id}: the VM of server {intent.server_id} is not there yet; "
                         "attaching when it is", delay_s=WAIT_FOR_SERVER_S)
        anchor_node = w.anchor.node if w.anchor is not None else None
        if anchor_node is not None and anchor_node != w.target.node:
            steps.append(Step("move_anchor", {"target": w.target.node}).explained(
                f"move the (stopped, config-only) anchor VM to {w.target.node}, the server's node"))
        steps.append(Step("attach", {"server_id": intent.server_id}).explained(
            f"reassign the disk to server {intent.server_id}'s VM {w.target.vmid}"
            + (" (hot-plugged: the guest sees a new disk)" if w.target.running else ""), moved))
    # a new disk is made at its size; a bare unusedN's size is read again once it is on the anchor
    if placed is not None and placed.disk.size_gib is not None and placed.disk.size_gib < intent.size_gib - 1e-9:
        steps.append(Step("resize", {"size_gib": intent.size_gib}).explained(
            f"grow the disk to {intent.size_gib} GiB (online)",
            [Drift("size_gib", intent.size_gib, _gib(placed.disk.size_gib))]))
    return steps


def attached_to(placed: Placed | None) -> str | None:
    """The server whose VM has the volume's disk plugged (None: on the anchor, nowhere, or a bare
    ``unusedN`` of a server: unplugged, the guest does not see it)."""
    return placed.server_id if placed is not None and not placed.disk.unused else None


def _detach_steps(placed: Placed, moved: list[Drift] | None = None) -> list[Step]:
    vm, disk, moved = placed.vm, placed.disk, moved or []
    out = []
    where = {"server_id": placed.server_id, "vmid": vm.vmid, "node": vm.node, "volid": disk.volid}
    if vm.running and not disk.unused:
        out.append(Step("unplug", dict(where)).explained(
            f"hot-unplug {disk.key} from server {placed.server_id}'s running VM {vm.vmid}", moved, disruptive=True))
    out.append(Step("detach", dict(where)).explained(
        f"reassign the disk ({disk.key} of VM {vm.vmid}) to the volume's anchor VM",
        [] if out else moved))
    out.append(Step("label", {}).explained("label the disk on the anchor with the volume's serial"))
    return out


# ================================================================ apply (one idempotent step)

@dataclass
class StepEnv:
    """What a step needs besides the client: re-observation, the task waiter, the fence, recording."""

    ops: DiskOps
    observe: Callable[[], Awaitable[VolumeWorld]]
    wait_task: Callable[[Step, str], Awaitable[str]]
    fence: Callable[[], Awaitable[None]]
    record: Callable[..., Awaitable[None]]  # record(step, **detail): before acting
    nodes: Callable[[], Awaitable[list[str]]]
    # send_create(vmid, node, send) -> UPID: the create ledger every VM create goes through
    # (z9.executor.vms.send_create); None: sent as it is (the reconciler's own tests)
    send_create: Callable[[int, str, Callable[[], Awaitable[str]]], Awaitable[str]] | None = None


def anchor_config(intent: VolumeIntent, *, with_disk: bool) -> dict[str, Any]:
    """The anchor VM's create parameters: stopped, never started, no NIC, its identity in the tags.
    No ``scsihw``: the SCSI controller's model matters only to a running VM (the disk is hot-plugged
    on the server's own controller), and qemu-server's create_vm checks it as VM.Config.HWType
    (API2/Qemu.pm ``$hwtypeoptions``), a privilege the README's role does not need otherwise."""
    cfg: dict[str, Any] = {
        "name": f"vol-{intent.volume_id.replace('_', '-')}"[:63],
        "tags": format_tags(customer_vm_tags(intent.volume_id, ANCHOR_MEMBER)),
        "description": f"z9 volume {intent.volume_id} ({intent.name}); holds the volume's disk while it is "
                       "detached. Do not start or delete by hand.",
        "memory": 64, "cores": 1, "onboot": 0,
    }
    if with_disk:
        cfg[ANCHOR_KEY] = f"{intent.storage}:{intent.size_gib},serial={intent.serial}"
    return cfg


async def apply_step(env: StepEnv, intent: VolumeIntent, step: Step) -> None:
    w = await env.observe()
    fn = _STEPS.get(step.name)
    if fn is None:
        raise PermanentError(f"volume: unknown step {step.name!r}")
    await fn(env, intent, step, w)


async def _create(env: StepEnv, intent: VolumeIntent, step: Step, w: VolumeWorld) -> None:
    if w.anchor is not None:
        return
    if w.creating is not None:
        raise Snooze(f"VM {w.creating.vmid} is still being created", delay_s=2.0)
    node = intent.node or (w.target.node if w.target is not None else None) or (await env.nodes())[0]
    if w.placed is not None:  # the disk is on a server: an empty anchor next to it
        node = w.placed.vm.node
    params = anchor_config(intent, with_disk=not step.detail.get("empty"))
    for _ in range(CREATE_TRIES):
        vmid = await env.ops.pick_vmid()
        await env.record(step, vmid=vmid, node=node)  # before the POST: a lost answer is found by it
        await env.fence()

        def send(vmid: int = vmid, node: str = node) -> Awaitable[str]:
            return env.ops.create_vm(node, vmid, params)
        try:
            upid = await (env.send_create(vmid, node, send) if env.send_create is not None else send())
        except VmidTaken:
            continue
        await env.wait_task(step, upid)
        return
    raise TemporaryError(f"volume {intent.volume_id}: {CREATE_TRIES} vmids taken in a row")


def _anchor(w: VolumeWorld, intent: VolumeIntent) -> VmState:
    if w.anchor is None:
        raise TemporaryError(f"volume {intent.volume_id}: its anchor VM is not found (yet)")
    guard(intent.volume_id, w.anchor)
    refuse_if_locked(w.anchor)
    return w.anchor


async def _move_anchor(env: StepEnv, intent: VolumeIntent, step: Step, w: VolumeWorld) -> None:
    anchor = _anchor(w, intent)
    target = step.detail["target"] if w.target is None else w.target.node
    if anchor.node == target or (w.placed is not None and w.placed.server_id is not None):
        return
    await env.fence()
    await env.wait_task(step, await env.ops.migrate(anchor.node, anchor.vmid, target))


async def _label(env: StepEnv, intent: VolumeIntent, step: Step, w: VolumeWorld) -> None:
    anchor = _anchor(w, intent)
    if w.placed is None or w.placed.vm.vmid != anchor.vmid or w.placed.disk.serial == intent.serial:
        return
    d = w.placed.disk
    drive = f"{d.volid},serial={intent.serial}" + (f",size={d.size_gib:g}G" if d.size_gib else "")
    params: dict[str, Any] = {ANCHOR_KEY if d.unused else d.key: drive}
    if d.unused:
        params["delete"] = d.key
        if ANCHOR_KEY in anchor.config and ANCHOR_KEY != d.key:
            raise PermanentError(f"anchor VM {anchor.vmid} has {ANCHOR_KEY} taken by another disk")
    await env.fence()
    await env.wait_task(step, await env.ops.configure(anchor.node, anchor.vmid, params,
                                                      digest=anchor.config.get("digest")))


async def _unplug(env: StepEnv, intent: VolumeIntent, step: Step, w: VolumeWorld) -> None:
    p = w.placed
    if p is None or p.server_id is None or p.disk.unused or not p.vm.running:
        return  # already unplugged, or a stopped VM: its drive is reassigned as it is
    refuse_if_locked(p.vm)
    await env.record(step, volid=p.disk.volid, key=p.disk.key)  # the bare unusedN is found by it
    await env.fence()
    await env.wait_task(step, await env.ops.configure(p.vm.node, p.vm.vmid, {"delete": p.disk.key},
                                                      digest=p.vm.config.get("digest")))
    after = await env.ops.vm_state(p.vm.node, p.vm.vmid, status=False)
    if after is not None and p.disk.key in after.config and after.config[p.disk.key].startswith(p.disk.volid):
        raise PermanentError(f"VM {p.vm.vmid} did not unplug {p.disk.key} (its hotplug option lacks 'disk'?): "
                             "stop the server to detach the volume")


async def _detach(env: StepEnv, intent: VolumeIntent, step: Step, w: VolumeWorld) -> None:
    p = w.placed
    if p is None or p.server_id is None:
        return  # on the anchor already
    anchor = _anchor(w, intent)
    if p.vm.running and not p.disk.unused:
        raise TemporaryError(f"{p.disk.key} of VM {p.vm.vmid} is still plugged; unplugging first next attempt")
    if anchor.node != p.vm.node:
        await env.fence()
        await env.wait_task(step, await env.ops.migrate(anchor.node, anchor.vmid, p.vm.node))
        anchor = (await env.observe()).anchor or anchor
    key = ANCHOR_KEY if ANCHOR_KEY not in anchor.config else free_drive_key(anchor.config)
    if key is None:
        raise PermanentError(f"anchor VM {anchor.vmid} has no free disk key")
    await env.record(step, volid=p.disk.volid, key=p.disk.key)
    await env.fence()
    await env.wait_task(step, await env.ops.reassign(p.vm.node, p.vm.vmid, p.disk.key, anchor.vmid, key,
                                                     digest=p.vm.config.get("digest"),
                                                     target_digest=anchor.config.get("digest")))


async def _attach(env: StepEnv, intent: VolumeIntent, step: Step, w: VolumeWorld) -> None:
    p = w.placed
    if p is not None and p.server_id == intent.server_id and not p.disk.unused:
        return  # there already
    anchor = _anchor(w, intent)
    if p is None or p.server_id is not None:
        raise TemporaryError(f"volume {intent.volume_id}: its disk is not on its anchor; planning again")
    target = w.target
    if target is None:
        raise Snooze(f"volume {intent.volume_id}: the VM of server {intent.server_id} is not there yet; "
                     "attaching when it is", delay_s=WAIT_FOR_SERVER_S)
    refuse_if_locked(target)
    if target.node != anchor.node:
        raise TemporaryError(f"anchor VM {anchor.vmid} is on {anchor.node}, the server on {target.node}; "
                             "moving it first next attempt")
    key = free_drive_key(target.config)
    if key is None:
        raise PermanentError(f"server {intent.server_id}: no free SCSI slot for another disk")
    await env.record(step, vmid=target.vmid, node=target.node, key=key)
    await env.fence()
    await env.wait_task(step, await env.ops.reassign(anchor.node, anchor.vmid, p.disk.key, target.vmid, key,
                                                     digest=anchor.config.get("digest"),
                                                     target_digest=target.config.get("digest")))
    # the disk's name on the server (pve-storage rename_volume picks it): recorded at once, so that an
    # operator's unplug before the next verify still leaves a disk z9 knows (the deletion guard, a detach)
    after = await env.ops.vm_state(target.node, target.vmid, status=False)
    d = find_volume_disk(after.config, intent.serial) if after is not None else None
    if d is not None:
        await env.record(step, vmid=target.vmid, node=target.node, key=d.key, volid=d.volid)


async def _resize(env: StepEnv, intent: VolumeIntent, step: Step, w: VolumeWorld) -> None:
    p = w.placed
    if p is None:
        raise TemporaryError(f"volume {intent.volume_id}: its disk is not found; planning again")
    if p.disk.unused:
        raise TemporaryError(f"volume {intent.volume_id}: its disk is detached half-way; detaching first")
    if p.disk.size_gib is not None and p.disk.size_gib >= intent.size_gib - 1e-9:
        return
    refuse_if_locked(p.vm)
    await env.fence()
    upid = await env.ops.resize(p.vm.node, p.vm.vmid, p.disk.key, intent.size_gib,
                                digest=p.vm.config.get("digest"))
    if upid:
        await env.wait_task(step, upid)


async def _destroy(env: StepEnv, intent: VolumeIntent, step: Step, w: VolumeWorld) -> None:
    anchor = w.anchor
    if anchor is None:
        return
    if w.placed is not None and w.placed.server_id is not None:
        raise TemporaryError(f"volume {intent.volume_id}: its disk is still on server {w.placed.server_id}")
    # the deletion guard, on what was just read: the volume's tags, and no disk but the volume's
    guard(intent.volume_id, anchor)
    refuse_if_locked(anchor)
    guard_disks(anchor.vmid, anchor.node, anchor.config, allowed_serials={intent.serial}, allowed_volids=set())
    if anchor.running:
        raise PermanentError(f"anchor VM {anchor.vmid} is running: someone started it by hand")
    await env.fence()
    await env.wait_task(step, await env.ops.destroy(anchor.node, anchor.vmid))


_STEPS: dict[str, Callable[[StepEnv, VolumeIntent, Step, VolumeWorld], Awaitable[None]]] = {
    "create": _create, "unplug": _unplug, "detach": _detach, "label": _label, "move_anchor": _move_anchor,
    "attach": _attach, "resize": _resize, "destroy": _destroy,
}


def _gib(size: float) -> int | float:
    """A size in GiB as JSON shows it: a whole number as an integer (``size=10G`` and a size read back
    in bytes are both 10), a fraction as it is."""
    return int(size) if float(size).is_integer() else size


def observed(intent: VolumeIntent, w: VolumeWorld) -> dict[str, Any]:
    """What verify records: where the disk is, its key and size, the anchor."""
    p = w.placed
    return {
        "anchor": None if w.anchor is None else {"vmid": w.anchor.vmid, "node": w.anchor.node},
        "server_id": None if p is None else p.server_id,
        "vmid": None if p is None else p.vm.vmid, "node": None if p is None else p.vm.node,
        "disk": None if p is None else p.disk.key, "volid": None if p is None else p.disk.volid,
        "size_gib": None if p is None or p.disk.size_gib is None else _gib(p.disk.size_gib), "serial": intent.serial,
        "device": f"/dev/disk/by-id/scsi-0QEMU_QEMU_HARDDISK_{intent.serial}",
        **({"extra_anchors": [{"vmid": v.vmid, "node": v.node} for v in w.extra_anchors]} if w.extra_anchors
           else {}),
    }
