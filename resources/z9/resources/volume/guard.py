"""The deletion guard for disks, security-critical: z9 destroys a VM, or frees one of its disks, only
when every disk on it belongs to what the job is allowed to destroy.

``destroy_vm`` (qemu-server QemuServer.pm ``destroy_vm`` → ``$remove_owned_drive``) frees every volume a
VM *owns*, and a reassigned disk is owned by the VM it was moved to (pve-storage ``rename_volume``): a
server's VM destroyed with a volume still on it would take the volume's data with it. So:

- :func:`volume_disk` — the type's declared part of a VM (``VmParts.config_value``, ``outlives_vm``): the
  registry's deletion guard (``z9.resources.refuse_vm_destroy``, run before the executor destroys any VM,
  of any type) refuses while the VM holds a disk carrying a volume serial.
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

from .disks import is_volume_serial, parse_disks

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
