"""The deletion guard for disks, security-critical: z9 destroys a VM, or frees one of its disks, only
when every disk on it belongs to what the job is allowed to destroy.

``destroy_vm`` (qemu-server QemuServer.pm ``destroy_vm`` → ``$remove_owned_drive``) frees every volume a
VM *owns*, and a reassigned disk is owned by the VM it was moved to (pve-storage ``rename_volume``): a
server's VM destroyed with a volume still on it would take the volume's data with it. So:

- :func:`volume_disk` and :func:`recorded_disks` — the type's declared part of a VM (``VmParts.config_value``,
  ``VmParts.recorded``, ``outlives_vm``): the registry's deletion guard (``z9.resources.refuse_vm_destroy``,
  run before the executor destroys any VM, of any type) holds the destroy while the VM holds a disk
  carrying a volume serial, or a disk z9 recorded for a volume by its volid — a bare ``unusedN`` (an
  operator's ``delete=scsiN``, a detach of the volume's own cut short) or an image of the VM's vmid on a
  storage that its config no longer names (``destroy-unreferenced-disks`` frees those too).
- :func:`guard_disks` — the volume jobs' own check: a volume's delete refuses when its anchor holds any
  disk other than this volume's; a server deleted with ``delete_volumes`` passes the serials it may take.

A refusal is a permanent :class:`~z9.common.errors.GuardRefusal`, logged at error level like the VM
guard's (``z9.executor.guard``), counted by the executor (``z9_deletion_guard_refusals_total``).
Tests: tests/integration/volumes/test_volume_reconcile.py (the guard on hand-built configs).
"""
from __future__ import annotations

import logging
from typing import Any, Mapping

from z9.common.errors import GuardRefusal

from .disks import is_volume_serial, owner_vmid, parse_disks

log = logging.getLogger("z9.executor.vms")  # where the VM guard's refusals log


def guard_disks(vmid: int, node: str, config: Mapping[str, Any], *, allowed_serials: set[str],
                own_keys: tuple[str, ...] = (), allowed_volids: set[str] | None = None, what: str = "destroy") -> None:
    """Refuse (GuardRefusal, logged at error level) to ``what`` VM ``vmid`` while it holds a disk that
    belongs to no volume of the job: any disk other than ``own_keys`` (the VM's own, e.g. a server's boot
    disk) that carries a z9 volume serial not in ``allowed_serials``, or carries no such serial and is
    not in ``allowed_volids`` (None: such disks — ones z9 did not attach — are the VM's own)."""
    for d in parse_disks(config):
        if d.key in own_keys:
            continue
        if d.serial is not None and is_volume_serial(d.serial):
            if d.serial in allowed_serials:
                continue
            why = f"{d.key} ({d.volid}) is volume disk {d.serial}, not one this job deletes"
        elif allowed_volids is None or d.volid in allowed_volids:
            continue
        else:
            why = f"{d.key} ({d.volid}) belongs to no volume of this job"
        msg = f"deletion guard refused to {what} VM {vmid} on {node}: {why}"
        log.error(msg)
        raise GuardRefusal(msg)


def volume_disk(key: str, value: Any) -> str | None:
    """The volume's part on a VM (its ``VmParts.config_value``): a disk carrying a z9 volume serial is
    that volume's, whichever VM it is on — never destroyed with the VM (the registry's deletion guard of
    declared parts refuses), never deleted by another type's convergence."""
    for d in parse_disks({key: value}):
        if d.serial is not None and is_volume_serial(d.serial):
            return f"volume disk {d.serial}"
    return None


async def recorded_disks(ctx: Any, vm: Any) -> dict[str, str]:
    """The volume's part on VM ``vm`` by what z9 recorded (its ``VmParts.recorded``): each disk of its config
    whose volid z9 recorded for a volume not deleted (``volumes.disk_volids``), serial or not, and each
    such image of the VM's vmid on a storage that the config does not name (listed: PVE's
    ``destroy-unreferenced-disks`` would free it). Config key (or the image's volid) → what it is."""
    from z9.resources.volume import store
    from z9.resources.volume.pve import ProxmoxDisks

    recorded = await store.disks_of_region(ctx.pool, ctx.job.region)
    if not recorded:
        return {}
    held: dict[str, str] = {}
    named = set()
    for d in parse_disks(vm.config or {}):
        named.add(d.volid)
        if d.volid in recorded:
            held[d.key] = f"{d.key} ({d.volid}) is the disk of volume {recorded[d.volid]}"
    owned = {volid: vid for volid, vid in recorded.items() if volid not in named and owner_vmid(volid) == vm.vmid}
    for storage in sorted({volid.split(":", 1)[0] for volid in owned}):
        present = {str(r.get("volid")) for r in await ProxmoxDisks(ctx.pve).images(vm.node, storage, vm.vmid)}
        for volid in sorted(v for v in owned if v in present and v.startswith(storage + ":")):
            held[volid] = (f"{volid} (on its storage, not in its config: PVE's destroy frees it with the VM) is "
                           f"the disk of volume {owned[volid]}")
    return held
