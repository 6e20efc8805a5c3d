"""Disk sizes and disk keys as PVE writes them (pve-common PVE::JSONSchema parse_size/format_size,
qemu-server's drive keys): a leaf module the cluster and the storage both use."""
from __future__ import annotations

import re


def parse_size(text: str) -> int | None:
    """PVE::JSONSchema::parse_size: ``<n>[KMGT]`` → bytes."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT])?", text)
    if not m:
        return None
    mult = {None: 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}[m.group(2)]
    return int(float(m.group(1)) * mult)


def format_size(size: int) -> str:
    """PVE::JSONSchema::format_size: largest unit that divides exactly."""
    size = int(size)
    for unit, div in (("T", 1024**4), ("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if size % div == 0:
            return f"{size // div}{unit}"
    return str(size)


DISK_RE = re.compile(r"(ide|scsi|sata|virtio|efidisk|tpmstate|unused)\d+")


def print_drive(volid: str, opts: str, **override: str) -> str:
    """QemuServer::Drive print_drive → pve-common JSONSchema.pm print_property_string: the volume (the
    default key) first, then every other option sorted by key."""
    kv = dict(o.split("=", 1) if "=" in o else (o, "") for o in opts.split(",") if o)
    kv.update(override)
    return ",".join([volid, *(f"{k}={v}" for k, v in sorted(kv.items()))])
