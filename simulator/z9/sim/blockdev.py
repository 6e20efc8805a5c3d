"""The guest's block devices: what ``lsblk`` and ``/dev/disk/by-id`` show inside a simulated VM.

Derived from the VM's live config (the keys QEMU has plugged: not ``[PENDING]``), so a disk hot-plugged
by a config write (qemu-server QemuServer.pm ``vmconfig_hotplug_pending`` → ``qemu_deviceadd``) appears at
once and a hot-unplugged one (``vmconfig_delete_or_detach_drive`` → ``qemu_devicedel``) is gone at once.

Names, as the Linux kernel gives them to QEMU's devices:
- ``virtioN`` (virtio-blk): ``/dev/vdX``; ``/dev/disk/by-id/virtio-<serial>`` only when the drive has a
  ``serial=`` (udev's ``60-persistent-storage.rules``: ``KERNEL=="vd*", ATTRS{serial}=="?*"``).
- ``scsiN`` (scsi-hd behind virtio-scsi), ``sataN``/``ideN`` (libata): ``/dev/sdX``. A SCSI disk's by-id
  name is ``scsi-0QEMU_QEMU_HARDDISK_<serial>``; without a ``serial=`` QEMU's device id is the drive's id,
  ``drive-scsiN`` (qemu-server ``print_drivedevice_full``: ``drive=drive-scsiN,id=scsiN``), and so is the
  ``SERIAL`` lsblk shows. ATA disks: ``ata-QEMU_HARDDISK_<serial or QM0000N>`` (QEMU's ide default serial).
- CD-ROMs (``media=cdrom``): ``/dev/srN``, type ``rom``.
- Letters: at a boot in bus order (ide, sata, scsi; virtio apart); a disk plugged later takes the lowest
  free letter, an unplugged disk frees its own (the kernel's ``sd_index_ida``) — so the device name of a
  disk says nothing stable about it, as on a real guest: find a disk by its serial.

Partitions and filesystems are not modelled (a fresh volume is a bare disk).

``lsblk`` options: ``-J``/``--json``, ``-b``/``--bytes``, ``-d``/``--nodeps``, ``-n``/``--noheadings``,
``-p``/``--paths``, ``-o``/``--output`` with NAME, PATH, SIZE, TYPE, SERIAL, MODEL, RO, RM, MOUNTPOINT(S)
(default ``NAME,MAJ:MIN,RM,SIZE,RO,TYPE,MOUNTPOINTS``), and device arguments (``lsblk /dev/sdb``;
an unknown one: ``lsblk: /dev/sdz: not a block device``, exit 32). ``ls /dev/disk/by-id`` and
``readlink -f /dev/disk/by-id/<name>`` answer from the same model.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from urllib.parse import unquote

from .guest import ExecContext, ExecResult, Guest, command

BUS_ORDER = ("ide", "sata", "scsi")
DRIVE_RE = re.compile(r"(ide|sata|scsi|virtio)(\d+)")


@dataclass(frozen=True)
class BlockDevice:
    key: str  # the config key (scsi1)
    name: str  # sdb
    size: int  # bytes
    type: str  # disk | rom
    serial: str | None
    model: str
    by_id: str | None  # the /dev/disk/by-id/ link name


def _size(value: str) -> int:
    from .disks import parse_size

    m = re.search(r"(?:^|,)size=([^,]+)", value)
    return (parse_size(m.group(1)) or 0) if m else 0


def _letters(i: int) -> str:
    """0 → a, 25 → z, 26 → aa (the kernel's sd_format_disk_name)."""
    out = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        out = chr(ord("a") + r) + out
    return out


def _drives(config: dict[str, str]) -> list[tuple[str, str, str]]:
    """(key, bus, value) of the plugged drives, in boot probe order."""
    rows = []
    for k, v in config.items():
        m = DRIVE_RE.fullmatch(k)
        if m and v.split(",", 1)[0] not in ("", "none"):
            rows.append((m.group(1), int(m.group(2)), k, v))
    rows.sort(key=lambda r: ((BUS_ORDER.index(r[0]) if r[0] in BUS_ORDER else 9), r[1]))
    return [(k, bus, v) for bus, _, k, v in rows]


def devices(g: Guest, config: dict[str, str]) -> list[BlockDevice]:
    """The guest's block devices now; keeps ``g.block`` (drive identity → kernel name, cleared at each power-on) across calls so
    that a disk keeps its name while plugged and a new one takes the lowest free name."""
    state = g.block  # identity -> kernel name (this boot; Guests.power_on clears it)
    drives = _drives(config)
    ident = {k: f"{k}={v.split(',', 1)[0]}" for k, _, v in drives}
    for stale in [i for i in state if i not in ident.values()]:
        del state[stale]  # unplugged: its name is free again
    out = []
    for k, bus, v in drives:
        cdrom = "media=cdrom" in v
        ident_k = ident[k]
        if ident_k not in state:
            prefix = "sr" if cdrom else ("vd" if bus == "virtio" else "sd")
            taken = set(state.values())
            n = 0
            while True:
                name = f"sr{n}" if prefix == "sr" else f"{prefix}{_letters(n)}"
                if name not in taken:
                    break
                n += 1
            state[ident_k] = name
        name = state[ident_k]
        m = re.search(r"(?:^|,)serial=([^,]+)", v)
        serial = unquote(m.group(1))[:20] if m else None
        if cdrom:
            out.append(BlockDevice(k, name, 0, "rom", None, "QEMU DVD-ROM", None))
        elif bus == "virtio":
            out.append(BlockDevice(k, name, _size(v), "disk", serial, "", f"virtio-{serial}" if serial else None))
        elif bus == "scsi":
            shown = serial or f"drive-{k}"
            out.append(BlockDevice(k, name, _size(v), "disk", shown, "QEMU HARDDISK",
                                   f"scsi-0QEMU_QEMU_HARDDISK_{shown}"))
        else:
            shown = serial or f"QM{int(k[len(bus):]) + 1:05d}"
            out.append(BlockDevice(k, name, _size(v), "disk", shown, "QEMU HARDDISK", f"ata-QEMU_HARDDISK_{shown}"))
    return sorted(out, key=lambda d: (d.type != "disk", len(d.name), d.name))


def _human(n: int) -> str:
    for unit, div in (("T", 1024**4), ("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if n >= div:
            v = n / div
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.1f}{unit}"
    return f"{n}B"


COLUMNS = {"NAME", "PATH", "SIZE", "TYPE", "SERIAL", "MODEL", "RO", "RM", "MAJ:MIN", "MOUNTPOINT", "MOUNTPOINTS"}


@command("lsblk")
def _lsblk(ctx: ExecContext) -> ExecResult:
    args = list(ctx.argv[1:])
    as_json = as_bytes = paths = noheadings = False
    cols = ["NAME", "MAJ:MIN", "RM", "SIZE", "RO", "TYPE", "MOUNTPOINTS"]
    wanted: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--output="):
            cols = a.split("=", 1)[1].upper().split(",")
        elif a in ("-o", "--output"):
            if i + 1 >= len(args):
                return ExecResult(1, err="lsblk: option requires an argument -- 'o'\n")
            cols = args[i + 1].upper().split(",")
            i += 1
        elif a.startswith("--"):
            flag = {"--json": "J", "--bytes": "b", "--nodeps": "d", "--noheadings": "n", "--paths": "p"}.get(a)
            if flag is None:
                return ExecResult(1, err=f"lsblk: unrecognized option '{a}'\n")
            as_json |= flag == "J"
            as_bytes |= flag == "b"
            noheadings |= flag == "n"
            paths |= flag == "p"
        elif a.startswith("-") and len(a) > 1:
            for f in a[1:]:
                if f not in "Jbdnpo":
                    return ExecResult(1, err=f"lsblk: invalid option -- '{f}'\n")
                as_json |= f == "J"
                as_bytes |= f == "b"
                noheadings |= f == "n"
                paths |= f == "p"
        else:
            wanted.append(a)
        i += 1
    bad = [c for c in cols if c not in COLUMNS]
    if bad:
        return ExecResult(1, err=f"lsblk: unknown column: {bad[0]}\n")
    devs = devices(ctx.guest, ctx.config)
    if wanted:
        byname = {f"/dev/{d.name}": d for d in devs}
        for w in wanted:
            if w not in byname:
                return ExecResult(32, err=f"lsblk: {w}: not a block device\n")
        devs = [byname[w] for w in wanted]

    def value(d: BlockDevice, c: str):
        major = 11 if d.type == "rom" else (252 if d.name.startswith("vd") else 8)
        return {"NAME": f"/dev/{d.name}" if paths else d.name, "PATH": f"/dev/{d.name}",
                "SIZE": d.size if as_bytes else _human(d.size),
                "TYPE": d.type, "SERIAL": d.serial, "MODEL": d.model or None, "RO": d.type == "rom",
                "RM": d.type == "rom", "MAJ:MIN": f"{major}:{devs.index(d) * 16}", "MOUNTPOINT": None,
                "MOUNTPOINTS": [None]}[c]

    if as_json:
        rows = [{c.lower(): value(d, c) for c in cols} for d in devs]
        return ExecResult(0, out=json.dumps({"blockdevices": rows}, indent=3) + "\n")
    lines = [] if noheadings else [" ".join(cols)]
    for d in devs:
        cells = []
        for c in cols:
            v = value(d, c)
            v = "" if v is None or v == [None] else ("1" if v is True else "0" if v is False else v)
            cells.append(str(v))
        lines.append(" ".join(cells).rstrip())
    return ExecResult(0, out="\n".join(lines) + "\n")


def _by_id(ctx: ExecContext) -> dict[str, str]:
    return {d.by_id: f"/dev/{d.name}" for d in devices(ctx.guest, ctx.config) if d.by_id}


@command("ls")
def _ls(ctx: ExecContext) -> ExecResult:
    args = [a for a in ctx.argv[1:] if not a.startswith("-")]
    if args and args[0].rstrip("/") == "/dev/disk/by-id":
        links = _by_id(ctx)
        if "-l" in ctx.argv[1:] or "-la" in ctx.argv[1:]:
            return ExecResult(0, out="".join(f"lrwxrwxrwx 1 root root 9 {k} -> ../../{v[5:]}\n"
                                             for k, v in sorted(links.items())))
        return ExecResult(0, out="".join(f"{k}\n" for k in sorted(links)))
    paths = args or ["."]
    files = ctx.guest.files()
    out, err, code = [], "", 0
    for p in paths:
        if p in files:
            out.append(p)
            continue
        prefix = p.rstrip("/") + "/"
        names = sorted({f[len(prefix):].split("/", 1)[0] for f in files if f.startswith(prefix)})
        if not names:
            err += f"ls: cannot access '{p}': No such file or directory\n"
            code = 2
        out += names
    return ExecResult(code, out="".join(f"{n}\n" for n in out), err=err)


@command("readlink")
def _readlink(ctx: ExecContext) -> ExecResult:
    args = [a for a in ctx.argv[1:] if not a.startswith("-")]
    links = _by_id(ctx)
    out = []
    for a in args:
        name = a.rsplit("/", 1)[-1]
        if a.startswith("/dev/disk/by-id/") and name in links:
            out.append(links[name])
        elif a.startswith("/dev/") and "/dev/disk/" not in a:
            out.append(a)
        else:
            return ExecResult(1)
    return ExecResult(0, out="".join(f"{o}\n" for o in out))
