"""VM disks as z9 sees them: a volume's disk found by its identity, never by its slot (the deletion
guard for disks, :func:`z9.resources.volume.guard.guard_disks`, reads them through :func:`parse_disks`).

Identity. A volume's disk carries the volume's **serial** on its drive (``scsi2: ceph-vm:vm-123-disk-1,
serial=z9…,size=10G``): :func:`volume_serial` (20 bytes, the most QEMU/PVE take: QemuServer/Drive.pm
``serial``, "up to 20 bytes long"). The guest sees it too (``lsblk -o SERIAL``,
``/dev/disk/by-id/scsi-0QEMU_QEMU_HARDDISK_<serial>``), so a customer mounts a volume by its id and not
by ``/dev/sdb``. The volume name on the storage is *not* an identity: a reassign renames it to the target's
free ``vm-<vmid>-disk-<n>`` (pve-storage ``rename_volume`` → ``find_free_diskname``), and a drive key is
not either: disks can be reordered by hand. Where the serial is lost — a detached disk is a bare
``unusedN: <volid>`` (QemuServer.pm ``vmconfig_register_unused_drive``) — the job that detached it
recorded the volid it saw under the serial just before (:func:`find_volume_disk` ``volids``), and a
detached volume lives on its own **anchor VM** (a stopped config-only VM tagged with the volume's identity,
member ``volume``): any disk there is the volume's.

Guard (:mod:`z9.resources.volume.guard`). :func:`~z9.resources.volume.guard.guard_disks` refuses (GuardRefusal) to destroy a VM, or free one of its disks, when it
holds a disk that belongs to no volume the job is allowed to destroy: a server's delete refuses while a
volume it was not told to delete is still on the VM (``destroy_vm`` frees every volume the VM owns, and a
reassigned volume is owned by the VM it was moved to), and a volume's delete refuses when its anchor
holds any other disk.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import unquote



DRIVE_RE = re.compile(r"(ide|sata|scsi|virtio|efidisk|tpmstate|unused)(\d+)")
_SIZE_RE = re.compile(r"(?:^|,)size=(\d+(?:\.\d+)?)([KMGT]?)(?:,|$)")
_UNIT_GIB = {"K": 1 / (1024 * 1024), "M": 1 / 1024, "G": 1.0, "T": 1024.0, "": 1 / (1024 ** 3)}
SERIAL_PREFIX = "z9"
MAX_SCSI = 31  # QemuServer/Drive.pm $MAX_SCSI_DISKS


def volume_serial(volume_id: str) -> str:
    """The drive serial of volume ``volume_id`` (``vol_<26 chars>``): ``z9`` and the id's last 18
    characters — 40 bits of its creation time and its 80 random bits — 20 bytes in all."""
    body = volume_id.rsplit("_", 1)[-1].lower()
    if len(body) < 18:
        raise ValueError(f"not a volume id: {volume_id!r}")
    return SERIAL_PREFIX + body[-18:]


def is_volume_serial(serial: str | None) -> bool:
    return bool(serial) and len(serial or "") == 20 and (serial or "").startswith(SERIAL_PREFIX)


@dataclass(frozen=True)
class Disk:
    key: str  # the config key: scsi1, unused0
    volid: str  # ceph-vm:vm-123-disk-1
    serial: str | None
    size_gib: float | None  # None: not in the drive string (an unusedN)

    @property
    def unused(self) -> bool:
        return self.key.startswith("unused")

    @property
    def storage(self) -> str:
        return self.volid.split(":", 1)[0]


def _size_gib(value: str) -> float | None:
    m = _SIZE_RE.search(value)
    return float(m.group(1)) * _UNIT_GIB[m.group(2)] if m else None


def parse_disks(config: Mapping[str, Any]) -> list[Disk]:
    """Every volume-backed disk of a VM config (CD-ROMs, the cloud-init drive and ``none`` left out),
    ``unusedN`` included, sorted by key."""
    out = []
    for k, v in config.items():
        if not DRIVE_RE.fullmatch(k):
            continue
        value = str(v)
        volid, _, opts = value.partition(",")
        if volid in ("", "none", "cdrom") or ":" not in volid or "cloudinit" in volid:
            continue
        if re.search(r"(?:^|,)media=cdrom(?:,|$)", opts):
            continue
        m = re.search(r"(?:^|,)serial=([^,]+)", opts)
        out.append(Disk(k, volid, unquote(m.group(1)) if m else None, _size_gib(value)))
    return sorted(out, key=lambda d: (DRIVE_RE.fullmatch(d.key).group(1), int(DRIVE_RE.fullmatch(d.key).group(2))))  # type: ignore[union-attr]


def find_volume_disk(config: Mapping[str, Any], serial: str, volids: tuple[str, ...] | list[str] = ()) -> Disk | None:
    """The disk of the volume whose serial is ``serial``: a drive carrying it, else an ``unusedN`` (or a
    drive) whose volid is one the job recorded for that volume (``volids``). Never by key."""
    disks = parse_disks(config)
    for d in disks:
        if d.serial == serial:
            return d
    for d in disks:
        if d.volid in volids and not (d.serial is not None and is_volume_serial(d.serial)):
            return d  # by a recorded volid only a disk that carries no other volume's serial
    return None


_OWNER_RE = re.compile(r"(?:^|/)(?:vm|base)-(\d+)-")


def owner_vmid(volid: str) -> int | None:
    """The VM owning image ``volid`` by its name (pve-storage Plugin.pm ``parse_volname``: ``vm-<vmid>-…``,
    ``base-<vmid>-…``; a directory storage's ``<vmid>/vm-<vmid>-disk-0.qcow2``), or None."""
    m = _OWNER_RE.search(volid.split(":", 1)[-1])
    return int(m.group(1)) if m else None


def free_drive_key(config: Mapping[str, Any], pending: Mapping[str, Any] | None = None, bus: str = "scsi",
                   first: int = 1) -> str | None:
    """The lowest free ``<bus>N`` (N ≥ ``first``) of a VM, its pending keys counted; None: all taken."""
    used = set(config) | set(pending or {})
    for n in range(first, MAX_SCSI if bus == "scsi" else 16):
        if f"{bus}{n}" not in used:
            return f"{bus}{n}"
    return None
