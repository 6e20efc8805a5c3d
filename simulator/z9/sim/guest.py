"""The guest inside a simulated VM: boot, cloud-init, the QEMU guest agent, files and commands.

Everything a guest does is derived from the bytes z9 sent (the VM config, PVE's cloud-init drive, an
uploaded NoCloud ISO, files written and commands run through the agent), never from a flag a test
sets. Faults (``/_sim/guest-faults``) are the only exception, and they model failures, not results.

Lifecycle (one :class:`Guest` per vmid, created at the VM's first start, removed when the VM is destroyed)
-----------------------------------------------------------------------------------------------------------
- **Power on** (``status/start``, the start half of ``status/reboot``, ``status/reset``, create with
  ``start=1``, ``POST /_sim/vms`` with ``running``): the guest takes a snapshot of its CD-ROMs (see
  below) and of ``agent`` in the config (the virtio-serial port exists only if ``agent`` was enabled
  at start), and boots after ``boot_s`` seconds (:class:`GuestSettings`, admin ``PUT /_sim/config``
  ``guest_boot_s``). Stop/shutdown: the guest is down, running commands are gone, files stay.
- **Boot** (evaluated lazily, so 10,000 guests cost nothing until asked): cloud-init takes the seed
  NoCloud takes among the CD-ROMs labelled ``cidata`` — the **last** device path (``/dev/srN``, numbered
  in bus order ``ide0``-``ide3``, ``sata0``-``sata5``, ``scsi0``-``scsi30``; see :meth:`Guests._read_cdroms`):
  PVE's own drive (``<storage>:vm-<vmid>-cloudinit``, files as generated at the last regeneration, see
  :mod:`z9.sim.cloudinit`) or an uploaded ISO (``<storage>:iso/<name>``, parsed from its real bytes with
  pycdlib; an unreadable image has no label and is skipped). No ``cidata`` → cloud-init ``disabled``.
- **Instance-id** (``meta-data``; NoCloud default ``nocloud``): if it differs from the last one seen, this
  boot is a **new instance**: a new SSH host key (``/etc/ssh/ssh_host_ed25519_key.pub``; fingerprint in
  the admin state), the network config is applied, ``users``/``ssh_authorized_keys``, ``write_files``
  and ``runcmd`` run. The same instance-id → none of that (a changed ``network-config`` behind a fixed
  instance-id is **not** applied, as on real NoCloud). ``bootcmd`` and the hostname run on every boot.
- **Network**: ``network-config`` v1 (PVE's) or v2, matched to the VM's NICs by MAC (``netN`` →
  ``ethN``); no network config → DHCP on the first NIC. A DHCP lease is derived from the MAC
  (``10.<mac4>.<mac5>.<mac3 % 250 + 2>/8``). ``agent/network-get-interfaces`` reports ``lo``, the
  addresses applied at the current instance's first boot, plus addresses configured inside since this
  boot (:meth:`Guest.add_address` — the ``ip addr add`` command, or ``POST /_sim/guests/{vmid}/addresses``).
- **cloud-init status** goes ``running`` for ``cloud_init_s`` seconds after boot, then ``done`` —
  or ``error`` with the error text (a failing ``runcmd`` item, the fault ``cloud_init_fails``, or a
  ``#cloud-config`` user-data that Debian's real ``cloud-init schema --config-file`` refuses: its text is
  the error; unparsable YAML applies nothing of the user-data — no keys, no hostname —, a schema error
  drops the keys it names). ``cloud-init status --format json`` / ``--long`` through ``agent/exec``.
  Not checked by a real tool: network-config (22.4's ``schema`` validates cloud-config only; the model
  reads v1/v2 itself), meta-data, script user-data. Where the model is stricter than 22.4: a real 22.4
  guest logs unparsable or schema-invalid user-data as WARNINGs and ends ``done`` (23.4+: ``degraded
  done``, exit 2) with nothing applied; the model says ``error`` so the failure has one shape.
- **Files** (``agent/file-write``/``file-read``, ``write_files``, command handlers) persist per VM across
  reboots and are gone when the VM is destroyed; a new VM at a reused vmid starts from nothing. With a
  ``state_file`` the guests' disks (files, instance-id, host key, applied network, JSON-able models)
  survive a simulator restart; running VMs then boot again.
- **Clone** copies the source's disks, so the clone's guest starts with the source guest's disk state as of
  the clone (files, instance-id, host key, hostname, applied network, JSON-able models; not the run-time
  addresses or processes) — as on PVE. It boots as a new instance only if its cloud-init instance-id
  differs (PVE's drive: it does, the name and MACs differ; a NoCloud ISO with a fixed instance-id shared
  by source and clone: it does not, and the clone keeps the source's host key). A template never ran in
  the simulator, so clones of it start from nothing.

The agent (``/nodes/{node}/qemu/{vmid}/agent/...``; qemu-server ``Agent.pm`` ``assert_agent_available``)
--------------------------------------------------------------------------------------------------------
500 ``No QEMU guest agent configured`` (no ``agent`` key in the config), then 500 ``VM <vmid> is not
running``, then 500 ``QEMU guest agent is not running`` (``agent: 0``, booting, ``agent`` enabled only
after the start, or the fault ``agent_never_starts``). Errors of a guest command are 500 ``VM <vmid> qmp command 'guest-<cmd>'
failed - <desc>`` (QMPClient), e.g. file-read of a missing file, exec-status of an unknown pid (a pid's
final status is reported once, then it is forgotten, as qemu-ga does).

Command handlers (the extension point for HAProxy, kubeadm, kubectl models)
-------------------------------------------------------------------------
``agent/exec`` runs ``command`` (an argv array: ``path`` and ``arg`` of qemu-ga's guest-exec, no shell)
through a registry keyed by the program's base name (``/usr/sbin/haproxy`` → ``haproxy``). A program
the guest does not have — a one-string command is one, its whole text the file name — fails the
spawn: HTTP 500 ``… 'guest-exec' failed - Guest agent command failed, error was 'Failed to execute
child process “<prog>” (No such file or directory)'`` and no pid; inside ``sh -c`` it exits 127
with ``/bin/sh: 1: <prog>: not found`` as dash says. An agent with its port but not answering
(booting, dead) is answered "not running" only after PVE's guest-ping timeout (``agent_timeout_s``,
3 s as ``qga_check_running``), or as soon as it comes up within it.
Register a handler once, for every simulator in the process::

    from z9.sim.guest import command, ExecContext, ExecResult

    @command("haproxy")
    def haproxy(ctx: ExecContext) -> ExecResult:
        # ctx.argv: list[str]; ctx.stdin: bytes; ctx.guest: Guest (files, addresses, model state)
        if ctx.argv[1:3] == ["-c", "-f"]:
            cfg = ctx.guest.read_file(ctx.argv[3])          # None when missing
            if cfg is None:
                return ExecResult(1, err=f"[ALERT] Cannot open configuration file '{ctx.argv[3]}'\\n")
            ctx.guest.model("haproxy")["checked"] = cfg.decode()  # per-VM model state: keep it JSON
            # (it is on the guest's disk: kept across reboots, restarts (state file) and into clones)
            return ExecResult(0, out="Configuration file is valid\\n")
        return ExecResult(2, err="usage: haproxy ...\\n")

or per simulator: ``server.cluster.guests.register("kubectl", handler)`` (wins over the global one).
``ExecResult(exitcode, out="", err="", seconds=0.0, on_exit=None)``: the process reports
``exited: 0`` for ``seconds`` (the simulator's clock), then its result; ``on_exit()`` runs at that moment
(effects that appear when a long command finishes). A handler may call ``ctx.run(["cat", path])`` to
run another command to its end (its ``on_exit`` has run when ``ctx.run`` returns, as in a shell — so
``sh -c "kubeadm init && kubectl get nodes"`` and ``runcmd`` items see each other's effects),
``ctx.guest.write_file(path, data)``, ``ctx.guest.add_address("eth0", "10.0.0.5/24")``, and read the VM's config via ``ctx.config``. Handlers run on the simulator's event loop:
never block. Built-ins: ``cloud-init``, ``sh``/``bash -c`` (``;``, ``&&``, ``||``, ``|``, ``>``, ``>>``, ``<``,
``2>``, ``2>&1``, quoting), ``cat``, ``echo``,
``true``, ``false``, ``test``/``[``, ``mkdir``, ``rm``, ``hostname``, ``ssh-keygen -lf``, ``ip addr add|del``,
``ip -j addr``.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import email.utils
import hashlib
import ipaddress
import json
import logging
import os
import re
import select
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import yaml

from . import cloudinit
from .errors import PveError

if TYPE_CHECKING:  # pragma: no cover
    from .cluster import VM, Cluster

log = logging.getLogger("z9.sim.guest")

OSINFO = {"id": "debian", "kernel-release": "6.1.0-28-amd64",
          "kernel-version": "#1 SMP PREEMPT_DYNAMIC Debian 6.1.119-1 (2024-11-22)", "machine": "x86_64",
          "name": "Debian GNU/Linux", "pretty-name": "Debian GNU/Linux 12 (bookworm)", "version": "12 (bookworm)",
          "version-id": "12"}
CDROM_ORDER = [f"ide{i}" for i in range(4)] + [f"sata{i}" for i in range(6)] + [f"scsi{i}" for i in range(31)]
FILE_READ_MAX = 16 * 1024 * 1024


# ---- command registry -----------------------------------------------------------------------------
@dataclass
class ExecResult:
    """What a command does: exit code, stdout, stderr, how long it runs (seconds), an effect at its end."""

    exitcode: int
    out: str | bytes = ""
    err: str | bytes = ""
    seconds: float = 0.0
    on_exit: Callable[[], None] | None = None
    # the command's result comes from a thread of the simulator (a real tool that takes a while:
    # ``haproxy -c``, ``keepalived -t``): the process runs, ``exited: 0``, until it is done — as on a
    # guest, where qemu-ga's guest-exec returns the pid at once — and the event loop is not held.
    # Only for a command the agent runs itself (``ExecContext.top``); a shell or a boot runs its
    # commands to their end (the result is waited for there).
    later: "concurrent.futures.Future[ExecResult] | None" = None


@dataclass
class ExecContext:
    argv: list[str]
    stdin: bytes
    guest: "Guest"
    config: dict[str, str]
    top: bool = False  # the agent's own exec (its result may come later: ExecResult.later)

    def run(self, argv: list[str], stdin: bytes = b"") -> ExecResult:
        """Run another command in the same guest, to its end: synchronously, its ``seconds`` are not
        waited for and its ``on_exit`` effect has happened when this returns (as in a shell, the next
        command sees it). The returned result keeps ``seconds``; its ``on_exit`` is spent (None)."""
        r = self.guest.guests.run_command(self.guest, argv, stdin, self.config)
        return _finish_now(r)


CommandHandler = Callable[[ExecContext], ExecResult]
COMMANDS: dict[str, CommandHandler] = {}
#: programs a guest has only when its disk holds their Debian package (the image's builder installed
#: it): program name -> package. A guest without the package has no such program (qemu-ga's spawn
#: fails; a shell answers 127) — z9 cannot bring kubeadm to an image that lacks it.
PACKAGED: dict[str, str] = {}
#: dpkg's database of installed packages (dpkg(1), "/var/lib/dpkg/status"): one stanza per package
DPKG_STATUS = "/var/lib/dpkg/status"


def dpkg_status(packages: dict[str, str]) -> bytes:
    """``/var/lib/dpkg/status`` of an image holding ``packages`` (name -> Debian version, as
    pkgs.k8s.io numbers them: ``1.33.5-1.1``): the stanzas dpkg writes (Package, Status, Version)."""
    return "".join(f"Package: {name}\nStatus: install ok installed\nPriority: optional\nArchitecture: amd64\n"
                   f"Version: {version}\n\n" for name, version in sorted(packages.items())).encode()


def installed_version(g: "Guest", package: str) -> str | None:
    """The Debian version of ``package`` installed on the guest's disk (dpkg's status database:
    a stanza with ``Status: install ok installed``), or None."""
    for stanza in _text(g.read_file(DPKG_STATUS) or b"").split("\n\n"):
        fields = dict(ln.split(": ", 1) for ln in stanza.splitlines() if ": " in ln)
        if fields.get("Package") == package and fields.get("Status") == "install ok installed":
            return fields.get("Version")
    return None
#: models that configure addresses inside a guest (keepalived's VIP): fn(guest) -> {iface: [cidr]},
#: reported by network-get-interfaces next to the addresses of :meth:`Guest.add_address`
INTERFACE_PROVIDERS: list[Callable[["Guest"], dict[str, list[str]]]] = []


def command(name: str) -> Callable[[CommandHandler], CommandHandler]:
    """Decorator: register a handler for programs whose base name is ``name`` (every simulator)."""

    def deco(fn: CommandHandler) -> CommandHandler:
        COMMANDS[name] = fn
        return fn

    return deco


def _finish_now(r: ExecResult) -> ExecResult:
    """Run ``r.on_exit`` at once (a nested command ran to its end) and return ``r`` without it."""
    if r.later is not None:  # (a handler deferred only at the top: wait for its thread here)
        r = _settled(r)
    if r.on_exit is not None:
        fn, r.on_exit = r.on_exit, None
        try:
            fn()
        except Exception:  # a handler bug must not take the simulator down (nor the request)
            log.exception("command on_exit failed")
    return r


def _settled(r: ExecResult) -> ExecResult:
    """``r`` with the result of its thread (``r.later``, done or waited for)."""
    assert r.later is not None
    try:
        done = r.later.result()
    except Exception as e:  # a handler bug must not take the simulator down
        done = ExecResult(1, err=f"simulator handler error: {e}\n")
    return ExecResult(done.exitcode, done.out, done.err, r.seconds, r.on_exit)


def _text(b: str | bytes) -> str:
    return b.decode("utf-8", "replace") if isinstance(b, bytes) else b


# ---- guest state ----------------------------------------------------------------------------------
@dataclass
class GuestSettings:
    boot_s: float = 1.0  # from power-on to the agent answering
    cloud_init_s: float = 1.0  # cloud-init runs this long after boot
    # qemu-server Agent.pm qga_check_running: guest-ping with timeout => 3 — how long PVE waits for an
    # agent that has its port but does not answer before "QEMU guest agent is not running"
    agent_timeout_s: float = 3.0


@dataclass
class Proc:
    pid: int
    started: float
    ends: float
    result: ExecResult
    boot_id: int


@dataclass
class Guest:
    """One VM's guest. Public API for command handlers: :meth:`read_file`, :meth:`write_file`,
    :meth:`delete_file`, :meth:`files`, :meth:`add_address`, :meth:`remove_address`,
    :meth:`interfaces`, :meth:`model`, ``vmid``, ``hostname``, ``instance_id``, ``host_key``."""

    guests: "Guests"
    vmid: int
    _files: dict[str, bytes] = field(default_factory=dict)
    instance_id: str | None = None
    host_key: str | None = None  # "SHA256:..." of the ED25519 host key
    hostname: str | None = None
    boots: int = 0
    boot_id: int = 0
    powered: bool = False
    agent_port: bool = False
    boot_at: float | None = None  # monotonic: when the pending boot completes
    booted: bool = False
    inputs: dict | None = None  # the CD-ROM snapshot taken at power-on
    net_applied: list[dict] = field(default_factory=list)  # [{name, mac, addresses: [cidr]}] of this instance
    extra: dict[str, list[str]] = field(default_factory=dict)  # iface -> cidrs configured inside since boot
    ci: dict = field(default_factory=lambda: {"status": "not-run", "errors": [], "datasource": "", "detail": "",
                                              "done_at": None, "last_update": None})
    procs: dict[int, Proc] = field(default_factory=dict)
    next_pid: int = 1000
    models: dict[str, dict] = field(default_factory=dict)
    fault_agent_dead: bool = False
    fault_ci: str | None = None
    schema: Any = None  # the real `cloud-init schema` of the seed's user-data, started at power-on (a Future)
    render: Any = None  # Debian's rendering of the seed's network-config (render_network), started at power-on
    block: dict[str, str] = field(default_factory=dict)  # drive identity -> kernel name (z9.sim.blockdev)

    # -- API for handlers --
    def read_file(self, path: str) -> bytes | None:
        return self._files.get(path)

    def write_file(self, path: str, data: str | bytes, append: bool = False) -> None:
        raw = data.encode() if isinstance(data, str) else bytes(data)
        self._files[path] = (self._files.get(path, b"") + raw) if append else raw

    def delete_file(self, path: str) -> bool:
        return self._files.pop(path, None) is not None

    def files(self) -> dict[str, bytes]:
        return dict(self._files)

    def model(self, name: str) -> dict:
        """A per-VM dict for a command model (kept across reboots, gone with the VM)."""
        return self.models.setdefault(name, {})

    def add_address(self, iface: str, cidr: str) -> None:
        """Configure an address inside the guest (``ip addr add``): reported until the next boot."""
        cidr = str(ipaddress.ip_interface(cidr))
        lst = self.extra.setdefault(iface, [])
        if cidr not in lst:
            lst.append(cidr)

    def remove_address(self, iface: str, cidr: str) -> bool:
        cidr = str(ipaddress.ip_interface(cidr))
        for src in (self.extra.get(iface, []),):
            if cidr in src:
                src.remove(cidr)
                return True
        for n in self.net_applied:
            if n["name"] == iface and cidr in n["addresses"]:
                n["addresses"].remove(cidr)
                return True
        return False

    def interfaces(self) -> list[dict]:
        """``guest-network-get-interfaces`` (QEMU qga schema ``GuestNetworkInterface``)."""
        out = [{"name": "lo", "hardware-address": "00:00:00:00:00:00", "ip-addresses": [
            {"ip-address": "127.0.0.1", "ip-address-type": "ipv4", "prefix": 8},
            {"ip-address": "::1", "ip-address-type": "ipv6", "prefix": 128}],
            "statistics": _stats(0)}]
        extra = {k: list(v) for k, v in self.extra.items()}
        for provider in INTERFACE_PROVIDERS:
            for iface, cidrs in provider(self).items():
                extra.setdefault(iface, []).extend(c for c in cidrs if c not in extra.get(iface, []))
        for i, n in enumerate(self.net_applied):
            addrs = list(n["addresses"]) + [a for a in extra.get(n["name"], []) if a not in n["addresses"]]
            ips = [{"ip-address": str(ipaddress.ip_interface(a).ip),
                    "ip-address-type": "ipv4" if ipaddress.ip_interface(a).version == 4 else "ipv6",
                    "prefix": ipaddress.ip_interface(a).network.prefixlen} for a in addrs]
            ips.append({"ip-address": _link_local(n["mac"]), "ip-address-type": "ipv6", "prefix": 64})
            out.append({"name": n["name"], "hardware-address": n["mac"], "ip-addresses": ips,
                        "statistics": _stats(i + 1)})
        known = {n["name"] for n in self.net_applied}
        for iface, addrs in sorted(extra.items()):
            if iface not in known and addrs:
                out.append({"name": iface, "hardware-address": "00:00:00:00:00:00", "ip-addresses": [
                    {"ip-address": str(ipaddress.ip_interface(a).ip),
                     "ip-address-type": "ipv4" if ipaddress.ip_interface(a).version == 4 else "ipv6",
                     "prefix": ipaddress.ip_interface(a).network.prefixlen} for a in addrs],
                    "statistics": _stats(0)})
        return out

    def summary(self) -> dict:
        return {"vmid": self.vmid, "powered": self.powered, "booted": self.booted, "boots": self.boots,
                "instance_id": self.instance_id, "host_key": self.host_key, "hostname": self.hostname,
                "cloud_init": {k: self.ci[k] for k in ("status", "errors", "datasource")},
                "agent": self.powered and self.booted and self.agent_port and not self.fault_agent_dead}

    def to_json(self) -> dict:
        resolv = _text(self._files.get(RESOLV_CONF, b""))
        return {**self.summary(), "files": sorted(self._files), "interfaces": self.interfaces(),
                "nameservers": [ln.split()[1] for ln in resolv.splitlines()
                                if ln.split()[:1] == ["nameserver"] and len(ln.split()) > 1],
                "extra_addresses": {k: list(v) for k, v in self.extra.items()}, "models": self.models,
                "inputs": None if self.inputs is None else {"source": self.inputs.get("source")}}


def _stats(i: int) -> dict:
    return {"rx-bytes": 1000 * i, "rx-dropped": 0, "rx-errs": 0, "rx-packets": 10 * i, "tx-bytes": 900 * i,
            "tx-dropped": 0, "tx-errs": 0, "tx-packets": 9 * i}


def _link_local(mac: str) -> str:
    b = [int(x, 16) for x in mac.split(":")]
    b[0] ^= 2
    eui = b[:3] + [0xFF, 0xFE] + b[3:]
    groups = [f"{eui[i] << 8 | eui[i + 1]:x}" for i in range(0, 8, 2)]
    return str(ipaddress.IPv6Address("fe80::" + ":".join(groups)))


def _dhcp_lease(mac: str) -> str:
    b = [int(x, 16) for x in mac.split(":")]
    return f"10.{b[4]}.{b[5]}.{b[3] % 250 + 2}/8"


def new_host_key(hostname: str) -> tuple[str, str]:
    """``(public key line, fingerprint)`` of a fresh ED25519 host key (SSH wire format, like ssh-keygen)."""
    raw = os.urandom(32)
    blob = len(b"ssh-ed25519").to_bytes(4, "big") + b"ssh-ed25519" + len(raw).to_bytes(4, "big") + raw
    fp = "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return f"ssh-ed25519 {base64.b64encode(blob).decode()} root@{hostname}\n", fp


# ---- the real cloud-init ----------------------------------------------------------------------------
# Debian's cloud-init 22.4 judges every #cloud-config user-data a guest boots from: ``cloud-init schema
# --config-file F`` (the same schema and YAML loader cloud-init uses at boot). What 22.4 cannot check:
# network-config (its ``schema`` command validates cloud-config only; the model reads network-config v1/v2
# itself, a YAML error is a cloud-init error), meta-data, vendor-data and shell-script user-data.
USER_DATA_PATH = "/var/lib/cloud/instance/user-data.txt"  # where a real guest keeps the user-data it got
_SCHEMA_CACHE: dict[str, tuple[str, str]] = {}
_SCHEMA_POOL: list[concurrent.futures.ThreadPoolExecutor] = []  # made at the first boot that needs it


def _schema_pool() -> concurrent.futures.ThreadPoolExecutor:
    if not _SCHEMA_POOL:
        _SCHEMA_POOL.append(concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="z9-sim-cloud-init"))
    return _SCHEMA_POOL[0]


_SCHEMA_KEY_RE = re.compile(r"(?:^|, )([a-z_][a-z0-9_]*)(?:\.[^:\s]*)?: ")


def cloud_init_binary() -> str | None:
    """Path of Debian's ``cloud-init``, or None (then the model only parses the YAML)."""
    import shutil

    return shutil.which("cloud-init") or next((p for p in ("/usr/bin/cloud-init",) if os.access(p, os.X_OK)), None)


class _WarmCloudInit:
    """Debian's ``cloud-init`` kept running (:mod:`z9.sim.cloud_init_worker`, under cloud-init's own
    interpreter): the same entry point ``/usr/bin/cloud-init`` runs, without a new process and its
    imports (about 0.3 s of CPU) per check. Used only when the binary is cloud-init's own
    console-script wrapper; a worker that cannot start is not tried again for that binary. Up to
    :attr:`KEEP` idle workers are kept (one per concurrent check is started); one that dies, hangs
    past the timeout or answers garbage is killed, and the check goes to a fresh one."""

    KEEP = 2
    #: what the console-script wrapper of cloud-init holds (Debian's: setuptools' easy-install one)
    _WRAPPER_MARKS = ("load_entry_point('cloud-init", 'load_entry_point("cloud-init', "'cloud-init==")

    def __init__(self) -> None:
        self._idle: list[subprocess.Popen[bytes]] = []
        self._lock = threading.Lock()
        self._unusable: set[str] = set()

    @classmethod
    def interpreter(cls, binary: str) -> str | None:
        """The Python running the ``cloud-init`` script, if the script is cloud-init's console-script
        wrapper (its ``#!`` line names that Python); otherwise None (the binary is run as it is)."""
        try:
            with open(binary, "rb") as f:
                head = f.read(4096).decode("utf-8", "replace")
        except OSError:
            return None
        first = head.split("\n", 1)[0]
        argv = first[2:].split() if first.startswith("#!") else []
        if not (argv and len(argv) == 1 and os.path.basename(argv[0]).startswith("python")
                and os.access(argv[0], os.X_OK) and any(m in head for m in cls._WRAPPER_MARKS)):
            return None
        return argv[0]

    def _start(self, python: str, deadline: float) -> subprocess.Popen[bytes] | None:
        proc = subprocess.Popen([python, "-I", str(Path(__file__).with_name("cloud_init_worker.py"))],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                env={**os.environ, "LANG": "C.UTF-8"})
        if (self._read_line(proc, deadline) or {}).get("ready") is not True:
            self._discard(proc)
            return None
        return proc

    @staticmethod
    def _read_line(proc: subprocess.Popen[bytes], deadline: float) -> dict[str, Any] | None:
        """The next JSON line of ``proc`` before ``deadline`` (monotonic); None when it ended, sent
        something else, or the deadline passed (a poll, not select: no limit on the fd's number)."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        buf = b""
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            buf += chunk
        try:
            answer = json.loads(buf)
        except ValueError:
            return None
        return answer if isinstance(answer, dict) else None

    @staticmethod
    def _discard(proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(OSError):
            proc.kill()
        proc.wait()

    def run(self, binary: str, args: list[str], timeout_s: float) -> tuple[int, bytes, bytes] | None:
        """(exit code, stdout, stderr) of ``cloud-init ARGS``; None when no worker answers it (then
        the caller runs the CLI itself). Raises TimeoutExpired when a worker took ``timeout_s``."""
        python = None if binary in self._unusable else self.interpreter(binary)
        if python is None:
            return None
        deadline = time.monotonic() + timeout_s
        for _ in range(2):  # a worker found dead is replaced once
            with self._lock:
                proc = self._idle.pop() if self._idle else None
            if proc is None or proc.poll() is not None:
                proc = self._start(python, deadline)
                if proc is None:
                    # it could not start (its Python lacks the cloud-init distribution, or it did not
                    # come up within the deadline): the CLI, a process per check, from now on
                    self._unusable.add(binary)
                    return None
            try:
                assert proc.stdin is not None
                proc.stdin.write(json.dumps(args).encode() + b"\n")
                proc.stdin.flush()
                answer = self._read_line(proc, deadline)
            except OSError:  # a broken pipe: it died
                answer = None
            if answer is None or answer.get("crashed"):
                self._discard(proc)
                if answer is not None:  # cloud-init raised: its traceback is the CLI's own to print
                    return None
                if time.monotonic() >= deadline:
                    raise subprocess.TimeoutExpired(["cloud-init", *args], timeout_s)
                continue
            with self._lock:
                keep = len(self._idle) < self.KEEP
                if keep:
                    self._idle.append(proc)
            if not keep:
                self._discard(proc)
            try:
                return int(answer["rc"]), base64.b64decode(answer["stdout"]), base64.b64decode(answer["stderr"])
            except (KeyError, TypeError, ValueError):
                return None
        return None


_WARM_CLOUD_INIT = _WarmCloudInit()


def schema_check(user_data: bytes) -> tuple[str, str]:
    """``("valid", "")``, ``("invalid", "Cloud config schema errors: …")`` as ``cloud-init schema
    --config-file`` says (the file named as a guest keeps it), or ``("unavailable", "")`` without the
    tool. Cached by content; thread-safe (runs in the simulator's pool, started at power-on). The
    CLI runs in a warm worker (:class:`_WarmCloudInit`), as a new process when none can start."""
    import tempfile

    digest = hashlib.sha256(user_data).hexdigest()
    if digest in _SCHEMA_CACHE:
        return _SCHEMA_CACHE[digest]
    binary = cloud_init_binary()
    if binary is None:
        return ("unavailable", "")
    with tempfile.NamedTemporaryFile(suffix=".user-data") as f:
        f.write(user_data)
        f.flush()
        args = ["schema", "--config-file", f.name]
        warm = _WARM_CLOUD_INIT.run(binary, args, timeout_s=60)
        if warm is not None:
            returncode, raw_err = warm[0], warm[2]
        else:
            r = subprocess.run([binary, *args], capture_output=True, timeout=60, env={**os.environ, "LANG": "C.UTF-8"})
            returncode, raw_err = r.returncode, r.stderr
        err = raw_err.decode("utf-8", "replace").replace(f.name, USER_DATA_PATH)
    if returncode == 0:
        verdict = ("valid", "")
    else:
        lines = [ln for ln in err.splitlines() if ln.strip() and ln.strip() != "Error:"]
        verdict = ("invalid", "\n".join(lines).strip() or f"cloud-init schema exited {returncode}")
    _SCHEMA_CACHE[digest] = verdict
    return verdict


RESOLV_CONF = "/etc/resolv.conf"
ENI_FILE = "etc/network/interfaces.d/50-cloud-init"  # what Debian's renderer writes (under the target root)
_RENDER_CACHE: dict[str, tuple[str, str]] = {}


def render_network(network_config: bytes) -> tuple[str, str]:
    """Debian's rendering of a NoCloud ``network-config``, by the real tool: ``cloud-init devel
    net-convert --kind yaml --output-kind eni --distro debian`` (cloud-init 22.4: the same
    ``network_state`` parser and ENI renderer the guest's init-local stage runs). ``("ok", <the
    interfaces file>)``, ``("invalid", <cloud-init's error>)``, or ``("unavailable", "")`` without
    the tool. Cached by content; thread-safe (started at power-on, like :func:`schema_check`)."""
    import tempfile

    digest = hashlib.sha256(network_config).hexdigest()
    if digest in _RENDER_CACHE:
        return _RENDER_CACHE[digest]
    binary = cloud_init_binary()
    if binary is None:
        return ("unavailable", "")
    with tempfile.TemporaryDirectory(prefix="z9-sim-net-") as d:
        src = Path(d, "network-config")
        src.write_bytes(network_config)
        args = ["devel", "net-convert", "--network-data", str(src), "--kind", "yaml", "--output-kind", "eni",
                "--distro", "debian", "--directory", str(Path(d, "out"))]
        warm = _WARM_CLOUD_INIT.run(binary, args, timeout_s=60)
        if warm is not None:
            returncode, raw_err = warm[0], warm[2]
        else:
            r = subprocess.run([binary, *args], capture_output=True, timeout=60, check=False,
                               env={**os.environ, "LANG": "C.UTF-8"})
            returncode, raw_err = r.returncode, r.stderr
        out = Path(d, "out", ENI_FILE)
        if returncode == 0 and out.exists():
            verdict = ("ok", out.read_text())
        else:
            lines = [ln for ln in raw_err.decode("utf-8", "replace").splitlines() if ln.strip()]
            verdict = ("invalid", (lines[-1] if lines else f"cloud-init devel net-convert exited {returncode}")
                       .replace(str(src), "network-config"))
    _RENDER_CACHE[digest] = verdict
    return verdict


def eni_dns(eni: str) -> tuple[list[str], list[str]]:
    """``(nameservers, search)`` of a rendered interfaces file: its ``dns-nameservers`` and
    ``dns-search`` lines, in order (ifupdown hands them to resolvconf, which writes resolv.conf)."""
    ns: list[str] = []
    search: list[str] = []
    for line in eni.splitlines():
        key, _, rest = line.strip().partition(" ")
        if key == "dns-nameservers":
            ns += [x for x in rest.split() if x not in ns]
        elif key == "dns-search":
            search += [x for x in rest.split() if x not in search]
    return ns, search


def config_dns(netcfg: Any) -> tuple[list[str], list[str]]:
    """The same read from the YAML itself (the model without the tool): v1 ``type: nameserver``
    entries and subnets' ``dns_nameservers``/``dns_search``; v2 ``nameservers`` of each ethernet."""
    ns: list[str] = []
    search: list[str] = []

    def add(into: list[str], vals: Any) -> None:
        for v in vals if isinstance(vals, list) else [vals] if vals else []:
            if str(v) not in into:
                into.append(str(v))

    if not isinstance(netcfg, dict):
        return ns, search
    if isinstance(netcfg.get("network"), dict):
        netcfg = netcfg["network"]
    if int(netcfg.get("version", 1)) == 1:
        for item in netcfg.get("config") or []:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "nameserver":
                add(ns, item.get("address"))
                add(search, item.get("search"))
            for sub in item.get("subnets") or []:
                if isinstance(sub, dict):
                    add(ns, sub.get("dns_nameservers"))
                    add(search, sub.get("dns_search"))
    else:
        for eth in (netcfg.get("ethernets") or {}).values():
            add(ns, ((eth or {}).get("nameservers") or {}).get("addresses"))
            add(search, ((eth or {}).get("nameservers") or {}).get("search"))
    return ns, search


def resolv_conf(ns: list[str], search: list[str]) -> str:
    """What resolvconf writes from them (at most 3 nameservers: glibc's MAXNS)."""
    return ("# Generated by resolvconf\n" + (f"search {' '.join(search)}\n" if search else "")
            + "".join(f"nameserver {n}\n" for n in ns[:3]))


def schema_error_keys(text: str) -> set[str]:
    """The top-level cloud-config keys ``cloud-init schema`` names in its errors (``hostname: 5 is not
    of type 'string'``, ``ssh_authorized_keys.0: …``): the modules reading them fail."""
    first = text.split("\n", 1)[0].partition("Cloud config schema errors: ")[2]
    return {m.group(1) for m in _SCHEMA_KEY_RE.finditer(first) if not m.group(1).startswith("format")}


# ---- the manager ----------------------------------------------------------------------------------
@dataclass
class GuestFault:
    id: int
    kind: str  # agent_never_starts | cloud_init_fails
    vmid: int | None = None
    name: str | None = None
    message: str | None = None

    def matches(self, vm: "VM") -> bool:
        return (self.vmid is None or self.vmid == vm.vmid) and (self.name is None or self.name == vm.config.get("name"))

    def to_json(self) -> dict:
        return {"id": self.id, "kind": self.kind, "vmid": self.vmid, "name": self.name, "message": self.message}


class Guests:
    """All guests of a cluster (``cluster.guests``) and the command registry of this simulator."""

    def __init__(self, cluster: "Cluster", settings: GuestSettings | None = None):
        self.cluster = cluster
        self.settings = settings or GuestSettings()
        self.guests: dict[int, Guest] = {}
        self.commands: dict[str, CommandHandler] = {}
        self.faults: list[GuestFault] = []
        self._fault_ids = 0

    def register(self, name: str, handler: CommandHandler) -> None:
        """Register a command handler for this simulator only (wins over :func:`command`)."""
        self.commands[name] = handler

    def clear(self) -> None:
        self.guests.clear()
        self.faults.clear()
        self.__dict__.pop("k8s_clusters", None)  # the kubeadm model's clusters (z9.sim.kubeadm)

    # -- persistence (the simulator's state file) --
    def save(self) -> dict:
        return {str(vmid): self.save_one(g) for vmid, g in self.guests.items()}

    def load(self, d: dict) -> None:
        """Guests as saved (disk state only: a running VM boots again, as after a host restart)."""
        self.guests.clear()
        for vmid, v in (d or {}).items():
            self.guests[int(vmid)] = self.load_one(int(vmid), v)

    def save_shared(self) -> dict:
        """What the command models keep across guests (the kubeadm model's clusters: their nodes,
        bootstrap tokens, CA hash, installed pod network), JSON as the state file holds it: a
        restarted simulator answers ``kubectl get nodes`` as before, not as if no cluster existed."""
        return {"k8s_clusters": json.loads(json.dumps(getattr(self, "k8s_clusters", {})))}

    def load_shared(self, d: dict | None) -> None:
        self.__dict__.pop("k8s_clusters", None)
        if (d or {}).get("k8s_clusters"):
            self.k8s_clusters = dict(d["k8s_clusters"])  # type: ignore[attr-defined]

    # -- faults --
    def add_fault(self, kind: str, vmid: int | None = None, name: str | None = None,
                  message: str | None = None) -> GuestFault:
        if kind not in ("agent_never_starts", "cloud_init_fails"):
            raise ValueError(f"unknown guest fault kind {kind!r} (agent_never_starts, cloud_init_fails)")
        if vmid is None and name is None:
            raise ValueError("a guest fault needs vmid or name")
        self._fault_ids += 1
        f = GuestFault(self._fault_ids, kind, vmid, name, message)
        self.faults.append(f)
        for vmid_, g in self.guests.items():  # a guest still booting or running cloud-init is hit too
            vm = self.cluster.vms.get(vmid_)
            if vm is not None and f.matches(vm):
                self._advance(g, vm)
                if kind == "agent_never_starts":
                    g.fault_agent_dead = True
                elif g.ci["status"] in ("running",) or (g.boot_at is not None and not g.booted):
                    g.fault_ci = message or "simulated cloud-init failure"
        return f

    def delete_fault(self, fid: int) -> bool:
        n = len(self.faults)
        self.faults = [f for f in self.faults if f.id != fid]
        return len(self.faults) != n

    # -- lifecycle hooks called by the cluster --
    def get(self, vmid: int) -> Guest | None:
        g = self.guests.get(vmid)
        vm = self.cluster.vms.get(vmid)
        if g is not None and vm is not None:
            self._advance(g, vm)
        return g

    def power_on(self, vm: "VM", already_up: bool = False) -> None:
        """The VM's QEMU process started (or was reset): snapshot the CD-ROMs and the agent port.
        ``already_up``: a VM put in place running (seed, state file, admin) booted long ago."""
        g = self.guests.get(vm.vmid)
        if g is None:
            g = self.guests[vm.vmid] = Guest(self, vm.vmid)
        g.powered = True
        g.booted = False
        g.boot_id += 1
        g.procs.clear()
        g.block.clear()  # the kernel names its disks afresh at each boot
        g.agent_port = agent_enabled(vm.config)
        g.boot_at = time.monotonic() + self.settings.boot_s
        if already_up:
            g.boot_at = time.monotonic() - self.settings.boot_s - self.settings.cloud_init_s
        g.inputs = self._read_cdroms(vm)
        user = (g.inputs.get("files") or {}).get("user-data") or b""
        g.schema = (_schema_pool().submit(schema_check, user)
                    if not already_up and user.startswith(b"#cloud-config") and cloud_init_binary() else None)
        net = (g.inputs.get("files") or {}).get("network-config") or b""
        g.render = (_schema_pool().submit(render_network, net)
                    if not already_up and net and cloud_init_binary() else None)
        g.fault_agent_dead = any(f.kind == "agent_never_starts" and f.matches(vm) for f in self.faults)
        fault = next((f for f in self.faults if f.kind == "cloud_init_fails" and f.matches(vm)), None)
        g.fault_ci = (fault.message or "simulated cloud-init failure") if fault else None

    def power_off(self, vmid: int) -> None:
        g = self.guests.get(vmid)
        if g is None:
            return
        g.powered = g.booted = False
        g.boot_at = None
        g.procs.clear()

    def remove(self, vmid: int) -> None:
        self.guests.pop(vmid, None)

    def clone_disk(self, src: int, dst: int) -> None:
        """A clone's disks are copies of the source's (full: ``qemu-img convert``/drive-mirror; linked:
        the same base): the new VM's guest starts powered off with the source's disk state as of now
        (files, instance-id, host key, hostname, applied network, JSON-able models) and no process,
        no address configured at run time. No source guest (a template, a VM that never ran): nothing."""
        self.guests.pop(dst, None)
        g = self.guests.get(src)
        if g is None:
            return
        saved = self.save_one(g)
        c = self.guests[dst] = self.load_one(dst, saved)
        c.boots = 0

    def save_one(self, g: Guest) -> dict:
        models = {}
        for k, v in g.models.items():
            try:
                models[k] = json.loads(json.dumps(v))
            except (TypeError, ValueError):
                pass  # a model that is not JSON is not kept (state file, clone)
        return {"files": {p: base64.b64encode(b).decode() for p, b in g._files.items()},
                "instance_id": g.instance_id, "host_key": g.host_key, "hostname": g.hostname,
                "boots": g.boots, "net_applied": g.net_applied, "models": models}

    def load_one(self, vmid: int, v: dict) -> Guest:
        g = Guest(self, int(vmid), {p: base64.b64decode(b) for p, b in (v.get("files") or {}).items()},
                  v.get("instance_id"), v.get("host_key"), v.get("hostname"), int(v.get("boots") or 0))
        g.net_applied = json.loads(json.dumps(v.get("net_applied") or []))
        g.models = dict(v.get("models") or {})
        return g

    # -- boot --
    def _read_cdroms(self, vm: "VM") -> dict:
        """The seed NoCloud takes: ``{source, device, files}``; ``{source: None}`` if none.

        cloud-init 22.4 ``cloudinit/sources/DataSourceNoCloud.py`` ``_get_devices``: the devices blkid
        finds (``util.find_devs_with``) that are ``TYPE=vfat`` or ``TYPE=iso9660`` **and** labelled
        ``CIDATA``/``cidata``, then ``devlist.sort(reverse=True)`` — by device path, as strings, highest
        first; ``_get_data`` mounts each in that order and takes the first holding ``user-data`` and
        ``meta-data`` (``pathprefix2dict(required=[...])``; without them: "not a valid seed", next).
        The device paths: every CD-ROM drive of the VM (``media=cdrom``, empty ones too) is a
        ``/dev/srN``, numbered in bus order ``ide0``-``ide3``, ``sata0``-``sata5``, ``scsi0``-``scsi30``
        (the order the guest kernel probes QEMU's IDE, AHCI and SCSI controllers — modelled, not read
        from a kernel). So PVE's own drive on ``ide2`` (``/dev/sr1``) wins over an ISO on ``ide0``
        (``/dev/sr0``), and ``/dev/sr9`` over ``/dev/sr10``."""
        found = []
        n = 0
        for key in CDROM_ORDER:
            val = vm.config.get(key)
            if not val or "media=cdrom" not in val:
                continue
            dev = f"/dev/sr{n}"
            n += 1
            volid = val.split(",", 1)[0]
            if volid in ("none", "cdrom"):
                continue
            if cloudinit.CLOUDINIT_VOL_RE.search(volid):
                if vm.ci_drive is not None:
                    found.append((dev, {"source": f"{key}:{volid}", "device": dev, "files": dict(vm.ci_drive),
                                        "label": "cidata"}))
                continue
            vol = self.cluster.storage.volume(volid, vm.node)
            if vol is None:
                continue
            from z9.common.nocloud import NoCloudError, read_nocloud_iso

            try:
                label, files = read_nocloud_iso(vol.data)
            except NoCloudError:
                continue
            if label in ("cidata", "CIDATA"):  # blkid LABEL= is exact: label.upper() and label.lower()
                found.append((dev, {"source": f"{key}:{volid}", "device": dev, "files": files, "label": label}))
        for _dev, seed in sorted(found, key=lambda f: f[0], reverse=True):
            if "user-data" in seed["files"] and "meta-data" in seed["files"]:
                return seed
        return {"source": None, "files": {}}

    def _advance(self, g: Guest, vm: "VM") -> None:
        now = time.monotonic()
        # the boot waits for the cloud-init schema verdict its thread works on (started at power-on):
        # until then the guest is still booting (agent not up) — never a wait on the event loop,
        # which would hold every other request of the simulator (100 boots at once queue there)
        if g.powered and not g.booted and g.boot_at is not None and now >= g.boot_at \
                and (g.schema is None or g.schema.done()) and (g.render is None or g.render.done()):
            self._boot(g, vm, g.boot_at)
        ci = g.ci
        if ci["status"] == "running" and ci["done_at"] is not None and now >= ci["done_at"]:
            if g.fault_ci:
                ci["errors"].append(g.fault_ci)
            ci["status"] = "error" if ci["errors"] else "done"
            ci["last_update"] = time.time() - (now - ci["done_at"])

    def _boot(self, g: Guest, vm: "VM", at: float) -> None:
        g.booted = True
        g.boots += 1
        g.extra = {}
        inputs = g.inputs or {"source": None, "files": {}}
        files: dict[str, bytes] = inputs.get("files") or {}
        ci = g.ci = {"status": "running", "errors": [], "datasource": "", "detail": "",
                     "done_at": at + self.settings.cloud_init_s, "last_update": time.time()}
        if inputs.get("source") is None:
            ci.update(status="disabled", done_at=None)
            if not g.net_applied:
                g.net_applied = self._network(vm, None)
            g.hostname = g.hostname or vm.config.get("name") or f"VM{vm.vmid}"
            return
        ci["datasource"] = "nocloud"
        ci["detail"] = f"DataSourceNoCloud [seed={inputs.get('device') or '/dev/sr0'}][dsmode=net] ({inputs['source']})"
        try:
            meta = yaml.safe_load(files.get("meta-data", b"") or b"") or {}
            if not isinstance(meta, dict):
                raise ValueError("meta-data is not a mapping")
        except (yaml.YAMLError, ValueError) as e:
            ci["errors"].append(f"Failed loading yaml blob. {e}")
            meta = {}
        iid = str(meta.get("instance-id", "nocloud"))
        user_raw = files.get("user-data", b"")
        cfg: dict = {}
        script: str | None = None
        text = _text(user_raw)
        user_failed = False  # the user-data did not load: none of it (hostname, keys) is applied
        dropped: set[str] = set()  # keys the schema refused: their modules fail
        if text.startswith("#cloud-config"):
            try:
                verdict = g.schema.result(timeout=60) if g.schema is not None else schema_check(user_raw)
            except Exception:  # the tool hung or could not run: judged by PyYAML alone
                log.exception("cloud-init schema failed to run")
                verdict = ("unavailable", "")
            g.schema = None
            try:
                loaded = yaml.safe_load(text)
                if loaded is not None and not isinstance(loaded, dict):
                    raise ValueError("user-data is not a mapping")
                cfg = loaded or {}
            except (yaml.YAMLError, ValueError) as e:
                user_failed = True
                if verdict[0] != "invalid":  # without the real tool: PyYAML's word
                    ci["errors"].append(f"Failed loading yaml blob. Invalid format at line: {e}")
            if verdict[0] == "invalid":
                ci["errors"].append(verdict[1])
                dropped = schema_error_keys(verdict[1])
                for key in dropped:  # those modules fail: what they would do is not done
                    cfg.pop(key, None)
        elif text.startswith("#!"):
            script = text
        new_instance = iid != g.instance_id
        if not new_instance:  # the rendered network config stays; the NICs are the VM's own (a clone's new MACs)
            macs = [n["mac"] for n in self._network(vm, None)]
            for n, mac in zip(g.net_applied, macs):
                n["mac"] = mac
        # no hostname from a user-data that failed (cc_set_hostname has none): the guest keeps its own
        kept = (g.hostname or "localhost") if user_failed or "hostname" in dropped else None
        hostname = str(cfg.get("hostname") or meta.get("local-hostname") or kept or vm.config.get("name")
                       or f"VM{vm.vmid}")
        # cc_set_hostname (22.4 distros/debian.py _write_hostname, distros/__init__.py _apply_hostname):
        # /etc/hostname is written, then `hostname <name>`; sethostname(2) refuses more than
        # HOST_NAME_MAX (64) bytes ("hostname: name too long"), which cloud-init only logs: the
        # running hostname stays what it was
        if len(hostname.encode()) <= 64:
            g.hostname = hostname
        else:
            g.hostname = g.hostname or "localhost"
            g.write_file("/var/log/cloud-init.log", f"WARNING: Failed to non-persistently adjust the system "
                                                    f"hostname to {hostname}\n", append=True)
        g.write_file("/etc/hostname", hostname + "\n")
        for item in cfg.get("bootcmd") or []:
            self._run_item(g, vm, item, ci, "bootcmd")
        if new_instance:
            g.instance_id = iid
            g.write_file("/var/lib/cloud/data/instance-id", iid + "\n")
            pub, fp = new_host_key(hostname)
            g.host_key = fp
            g.write_file("/etc/ssh/ssh_host_ed25519_key.pub", pub)
            net_raw = files.get("network-config")
            try:
                netcfg = yaml.safe_load(net_raw) if net_raw else None
                g.net_applied = self._network(vm, netcfg)
            except (yaml.YAMLError, ValueError, TypeError) as e:
                ci["errors"].append(f"Failed loading network config: {e}")
                g.net_applied = self._network(vm, None)
                netcfg = None
            if net_raw:
                self._dns(g, net_raw, netcfg, ci)
            self._users(g, cfg)
            for wf in cfg.get("write_files") or []:
                try:
                    self._write_file(g, wf)
                except (KeyError, ValueError, TypeError) as e:
                    ci["errors"].append(f"write_files: {e}")
            for item in cfg.get("runcmd") or []:
                self._run_item(g, vm, item, ci, "runcmd")
            if script is not None:
                r = _finish_now(self.run_command(g, ["sh", "-c", script], b"", vm.config))
                if r.exitcode != 0:
                    ci["errors"].append("Failed to run module scripts_user (scripts in "
                                        "/var/lib/cloud/instance/scripts)")
        g.write_file("/var/log/cloud-init-output.log", f"Cloud-init finished at boot {g.boots}\n", append=True)

    @staticmethod
    def _dns(g: Guest, net_raw: bytes, netcfg: Any, ci: dict) -> None:
        """The guest's resolver from its network-config, as a Debian guest gets it: cloud-init's
        ENI renderer writes ``dns-nameservers``/``dns-search`` (on the interface, or on ``lo`` for
        v1's global ``type: nameserver``), ifupdown hands them to resolvconf, which writes
        /etc/resolv.conf (the image carries resolvconf: part of the image contract, like the
        guest agent). No nameserver there: a resolv.conf without one — the guest has no DNS. A
        network-config Debian's renderer refuses fails cloud-init (init-local's
        apply_network_config raises)."""
        try:
            verdict = g.render.result(timeout=60) if g.render is not None else render_network(net_raw)
        except Exception:  # the tool hung or could not run: read from the YAML itself
            log.exception("cloud-init net-convert failed to run")
            verdict = ("unavailable", "")
        g.render = None
        if verdict[0] == "invalid":
            ci["errors"].append(f"Failed to apply network config: {verdict[1]}")
            return
        ns, search = eni_dns(verdict[1]) if verdict[0] == "ok" else config_dns(netcfg)
        g.write_file(RESOLV_CONF, resolv_conf(ns, search))

    def _run_item(self, g: Guest, vm: "VM", item: Any, ci: dict, module: str) -> None:
        argv = [str(x) for x in item] if isinstance(item, list) else ["sh", "-c", str(item)]
        r = _finish_now(self.run_command(g, argv, b"", vm.config))  # boot runs each item to its end
        g.write_file("/var/log/cloud-init-output.log", _text(r.out) + _text(r.err), append=True)
        if r.exitcode != 0:
            ci["errors"].append(f"Failed to run module scripts_user (scripts in /var/lib/cloud/instance/scripts)"
                                if module == "runcmd" else f"{module}: command {argv!r} exited {r.exitcode}")

    @staticmethod
    def _users(g: Guest, cfg: dict) -> None:
        keys = [str(k) for k in cfg.get("ssh_authorized_keys") or []]
        user = cfg.get("user")
        users = [user if isinstance(user, str) else (user or {}).get("name") if isinstance(user, dict) else None]
        for u in cfg.get("users") or []:
            if isinstance(u, dict) and u.get("name"):
                users.append(u["name"])
                ukeys = [str(k) for k in u.get("ssh_authorized_keys") or u.get("ssh-authorized-keys") or []]
                if ukeys:
                    home = "/root" if u["name"] == "root" else f"/home/{u['name']}"
                    g.write_file(f"{home}/.ssh/authorized_keys", "".join(k + "\n" for k in ukeys))
        default = next((u for u in users if u and u != "default"), "debian")
        if keys:
            home = "/root" if default == "root" else f"/home/{default}"
            g.write_file(f"{home}/.ssh/authorized_keys", "".join(k + "\n" for k in keys))

    @staticmethod
    def _write_file(g: Guest, wf: dict) -> None:
        path = wf["path"]
        content = wf.get("content", "")
        enc = str(wf.get("encoding", "")).lower()
        if enc in ("b64", "base64"):
            data = base64.b64decode(content)
        elif enc in ("gz+b64", "gzip+base64", "gz+base64", "gzip+b64"):
            import gzip

            data = gzip.decompress(base64.b64decode(content))
        else:
            data = str(content).encode()
        g.write_file(path, data, append=bool(wf.get("append")))

    @staticmethod
    def _network(vm: "VM", netcfg: Any) -> list[dict]:
        """Addresses per NIC from network-config v1/v2 (matched by MAC), or DHCP on the first NIC."""
        nics = []
        for k in sorted((k for k in vm.config if re.fullmatch(r"net\d+", k)), key=lambda k: int(k[3:])):
            mac = cloudinit.parse_net(vm.config[k]).get("macaddr", "").lower()
            if mac:
                nics.append({"name": f"eth{k[3:]}", "mac": mac, "addresses": []})
        by_mac = {n["mac"]: n for n in nics}
        if not netcfg:
            if nics:
                nics[0]["addresses"].append(_dhcp_lease(nics[0]["mac"]))
            return nics
        if not isinstance(netcfg, dict):
            raise ValueError("network-config is not a mapping")
        if "network" in netcfg and isinstance(netcfg["network"], dict):
            netcfg = netcfg["network"]
        version = int(netcfg.get("version", 1))
        if version == 1:
            for item in netcfg.get("config") or []:
                if item.get("type") != "physical":
                    continue
                nic = by_mac.get(str(item.get("mac_address", "")).lower())
                if nic is None:
                    continue
                if item.get("name"):
                    nic["name"] = str(item["name"])
                for sub in item.get("subnets") or []:
                    t = sub.get("type")
                    if t in ("dhcp", "dhcp4"):
                        nic["addresses"].append(_dhcp_lease(nic["mac"]))
                    elif t in ("static", "static6"):
                        addr = str(sub["address"])
                        if "/" not in addr:
                            mask = sub.get("netmask") or sub.get("prefix") or ("32" if t == "static" else "128")
                            addr = f"{addr}/{mask}"
                        nic["addresses"].append(str(ipaddress.ip_interface(addr)))
        else:
            for name, eth in (netcfg.get("ethernets") or {}).items():
                match = (eth or {}).get("match") or {}
                nic = by_mac.get(str(match.get("macaddress", "")).lower())
                if nic is None:
                    nic = next((n for n in nics if n["name"] == name), None)
                if nic is None:
                    continue
                nic["name"] = str(eth.get("set-name") or name)
                if eth.get("dhcp4"):
                    nic["addresses"].append(_dhcp_lease(nic["mac"]))
                for a in eth.get("addresses") or []:
                    nic["addresses"].append(str(ipaddress.ip_interface(str(a))))
        return nics

    def nics_changed(self, vm: "VM") -> None:
        """A virtio NIC hot-plugged into (or out of) the running guest: the kernel names a new one
        by its PCI slot (qemu-server ``PVE/QemuServer/PCI.pm``: ``net<n>`` at slot 18 + n, so
        ``ens<18+n>`` with systemd's predictable names) and leaves it without an address until
        something configures it; an unplugged NIC's interface is gone."""
        g = self.guests.get(vm.vmid)
        if g is None or not g.booted:
            return
        macs = {}
        for k in (k for k in vm.config if re.fullmatch(r"net\d+", k)):
            mac = cloudinit.parse_net(vm.config[k]).get("macaddr", "").lower()
            if mac:
                macs[mac] = k
        g.net_applied = [n for n in g.net_applied if n["mac"] in macs]
        have = {n["mac"] for n in g.net_applied}
        for mac, k in sorted(macs.items(), key=lambda i: int(i[1][3:])):
            if mac not in have:
                g.net_applied.append({"name": f"ens{18 + int(k[3:])}", "mac": mac, "addresses": []})

    # -- agent --
    def agent(self, vm: "VM") -> Guest:
        """``assert_agent_available`` (qemu-server Agent.pm): the guest whose agent answers, or the PVE
        error. ``No QEMU guest agent configured`` only when the config has no ``agent`` key at all;
        ``agent: 0`` reaches the guest-ping, which fails (no virtio port)."""
        if "agent" not in vm.config:
            raise PveError(500, "No QEMU guest agent configured")
        if not vm.running:
            raise PveError(500, f"VM {vm.vmid} is not running")
        g = self.get(vm.vmid)
        if g is None or not g.powered or not g.booted or not g.agent_port or g.fault_agent_dead:
            raise PveError(500, "QEMU guest agent is not running")
        return g

    def exec(self, vm: "VM", argv: list[str], stdin: bytes) -> int:
        """qemu-ga ``guest-exec`` (qga/commands.c): ``g_spawn_async_with_pipes`` of ``path`` (searched
        in PATH when it has no ``/``) with ``arg`` — no shell. A program the guest does not have
        (a one-string command included: its whole text is the file name) fails the spawn, and
        guest-exec answers the error: PVE's HTTP 500 (``QERR_QGA_COMMAND_FAILED`` with glib's
        ``Failed to execute child process “…” (No such file or directory)``), no pid."""
        g = self.agent(vm)
        if not argv or self._handler(argv[0], g) is None:
            prog = argv[0] if argv else ""
            raise qmp_error(vm.vmid, "exec", "Guest agent command failed, error was 'Failed to execute child "
                                             f"process “{prog}” (No such file or directory)'")
        r = self.run_command(g, argv, stdin, vm.config, top=True)
        pid = g.next_pid
        g.next_pid += 1
        now = time.monotonic()
        g.procs[pid] = Proc(pid, now, now + max(0.0, r.seconds), r, g.boot_id)
        if r.on_exit is not None:
            if r.seconds > 0:
                boot_id = g.boot_id

                def fire() -> None:
                    if g.boot_id == boot_id and g.powered:
                        _finish_now(r)

                asyncio.get_running_loop().call_later(r.seconds, fire)
            else:
                _finish_now(r)
        return pid

    def exec_status(self, vm: "VM", pid: int) -> dict:
        g = self.agent(vm)
        p = g.procs.get(pid)
        if p is None:
            raise qmp_error(vm.vmid, "exec-status", "Invalid parameter 'pid'")
        if time.monotonic() < p.ends or (p.result.later is not None and not p.result.later.done()):
            return {"exited": 0}
        if p.result.later is not None:
            p.result = _settled(p.result)
        del g.procs[pid]
        out: dict[str, Any] = {"exited": 1, "exitcode": p.result.exitcode}
        if p.result.out:
            out["out-data"] = _text(p.result.out)
        if p.result.err:
            out["err-data"] = _text(p.result.err)
        return out

    def _handler(self, prog: str, g: Guest | None = None) -> CommandHandler | None:
        """The program a path names in the guest (its base name: the handlers are the guest's
        binaries, wherever they lie), or None when the guest has no such program (a packaged one,
        :data:`PACKAGED`, only when its package is installed on the guest's disk)."""
        name = prog.rsplit("/", 1)[-1]
        if not name or any(c.isspace() for c in prog):
            return None
        if g is not None and name in PACKAGED and name not in self.commands \
                and installed_version(g, PACKAGED[name]) is None:
            return None
        return self.commands.get(name) or COMMANDS.get(name)

    def put_disk(self, vmid: int, files: dict[str, bytes]) -> None:
        """A VM put in place with a disk already holding ``files`` (an image builder's template:
        what it installed): its clones copy them (:meth:`clone_disk`)."""
        g = self.guests.get(vmid)
        if g is None:
            g = self.guests[vmid] = Guest(self, vmid)
        for path, data in files.items():
            g.write_file(path, data)

    def run_command(self, g: Guest, argv: list[str], stdin: bytes, config: dict[str, str],
                    top: bool = False) -> ExecResult:
        if not argv:
            return ExecResult(127, err="/bin/sh: 1: : not found\n")
        handler = self._handler(argv[0], g)
        name = argv[0].rsplit("/", 1)[-1]
        if handler is None:
            return ExecResult(127, err=f"/bin/sh: 1: {argv[0]}: not found\n")
        try:
            r = handler(ExecContext(list(argv), stdin, g, dict(config), top=top))
        except Exception as e:  # a handler bug must not take the simulator down
            return ExecResult(1, err=f"{name}: simulator handler error: {e}\n")
        if not isinstance(r, ExecResult):
            return ExecResult(1, err=f"{name}: simulator handler error: returned {type(r).__name__}, "
                                     "not ExecResult\n")
        return r

    @staticmethod
    def _is_dir(g: Guest, path: str) -> bool:
        """A directory of the file model: ``/`` or a prefix of a file's path (directories are implicit)."""
        prefix = path.rstrip("/") + "/"
        return path.rstrip("/") == "" or any(p.startswith(prefix) for p in g._files)

    def file_read(self, vm: "VM", path: str, offset: int, count: int) -> tuple[bytes, bool]:
        """qemu-ga ``guest-file-open`` (mode ``r``) + ``guest-file-read``: a directory opens, its read fails."""
        g = self.agent(vm)
        data = g.read_file(path)
        if data is None:
            if path and self._is_dir(g, path):
                raise qmp_error(vm.vmid, "file-read", "failed to read file: Is a directory")
            raise qmp_error(vm.vmid, "file-open", f"failed to open file '{path}' (mode: 'r'): No such file or directory")
        chunk = data[offset:offset + count]
        return chunk, offset + count < len(data)

    def file_write(self, vm: "VM", path: str, data: bytes) -> None:
        """qemu-ga ``guest-file-open`` (mode ``wb``): an empty path, a directory, or a path below a file fail
        with the open(2) error; parent directories are implicit (the model has no mkdir -p failure)."""
        g = self.agent(vm)
        why = None
        if path == "":
            why = "No such file or directory"
        elif path.endswith("/") or self._is_dir(g, path):
            why = "Is a directory"
        else:
            parts = path.split("/")
            if any(g.read_file("/".join(parts[:i])) is not None for i in range(1, len(parts))):
                why = "Not a directory"
        if why:
            raise qmp_error(vm.vmid, "file-open", f"failed to open file '{path}' (mode: 'wb'): {why}")
        g.write_file(path, data)


def qmp_error(vmid: int, cmd: str, desc: str) -> PveError:
    return PveError(500, f"VM {vmid} qmp command 'guest-{cmd}' failed - {desc}")


def agent_enabled(config: dict[str, str]) -> bool:
    """``agent: [enabled=]1[,...]``."""
    first = (config.get("agent") or "0").split(",", 1)[0]
    return first.partition("=")[2] == "1" if first.startswith("enabled=") else first == "1"


# What the guest's kernel sees of the VM's hardware (kubeadm's NumCPU and Mem preflight read these).
# The kernel's image, its early reservations and the firmware's holes are not in sysinfo's Totalram
# (``MemTotal``): a Debian 12 VM of 2048 MiB reports about 1950 MiB. The model keeps this much out.
KERNEL_RESERVED_MIB = 96


def guest_cpus(config: dict[str, str]) -> int:
    """The guest's online CPUs: qemu-server (QemuServer.pm ``config_to_command``) starts
    ``vcpus`` of ``sockets * cores`` (``vcpus`` unset: all of them); ``cores`` and ``sockets``
    default to 1."""
    def num(key: str, default: int) -> int:
        m = re.match(r"\d+", config.get(key) or "")
        return int(m.group(0)) if m and int(m.group(0)) > 0 else default

    maxcpus = num("sockets", 1) * num("cores", 1)
    return min(num("vcpus", maxcpus), maxcpus)


def guest_ram_mb(config: dict[str, str]) -> int:
    """sysinfo's Totalram in MB as kubeadm computes it (``Totalram * Unit / 1024 / 1024``): the VM's
    ``memory`` (``[current=]<MiB>``, qemu-server's default 512; Memory.pm ``get_current_memory``)
    less what the kernel keeps (:data:`KERNEL_RESERVED_MIB`)."""
    m = re.match(r"(?:current=)?(\d+)", config.get("memory") or "")
    return max(0, (int(m.group(1)) if m else 512) - KERNEL_RESERVED_MIB)


# ---- built-in commands ----------------------------------------------------------------------------
def _ci_status_json(g: Guest) -> dict:
    ci = g.ci
    status = ci["status"]
    last = ci.get("last_update") or time.time()
    return {"boot_status_code": "enabled-by-generator" if status != "disabled" else "disabled-by-generator",
            "datasource": ci["datasource"], "detail": ci["detail"] or ("Cloud-init enabled by systemd generator"
                                                                       if status != "disabled" else
                                                                       "Cloud-init disabled by cloud-init-generator"),
            "errors": list(ci["errors"]), "extended_status": status,
            "last_update": email.utils.formatdate(last, usegmt=False).replace("-0000", "+0000"),
            "recoverable_errors": {}, "status": status}


@command("cloud-init")
def _cloud_init(ctx: ExecContext) -> ExecResult:
    args = ctx.argv[1:]
    g = ctx.guest
    if not args or args[0] not in ("status", "query"):
        return ExecResult(2, err="usage: cloud-init [-h] [--version] [--debug] [--force] {init,modules,single,query,"
                                 "features,analyze,devel,collect-logs,clean,status,schema} ...\n")
    if args[0] == "query":
        if args[1:] == ["instance-id"] or args[1:] == ["instance_id"]:
            return ExecResult(0, out=(g.instance_id or "") + "\n") if g.instance_id else ExecResult(1, err="")
        return ExecResult(1, err="ERROR: Undefined instance-data key\n")
    fmt = "tabular"
    wait = "--wait" in args or "-w" in args
    long = "--long" in args or "-l" in args
    if "--format" in args:
        i = args.index("--format")
        fmt = args[i + 1] if i + 1 < len(args) else ""
        if fmt not in ("json", "yaml", "tabular"):
            return ExecResult(2, err=f"cloud-init status: error: argument --format: invalid choice: '{fmt}'\n")
    seconds = 0.0
    if wait and g.ci["status"] == "running" and g.ci["done_at"] is not None:
        seconds = max(0.0, g.ci["done_at"] - time.monotonic())
        # the result as it will be when cloud-init ends
        status = "error" if (g.ci["errors"] or g.fault_ci) else "done"
        st = {**_ci_status_json(g), "status": status, "extended_status": status,
              "errors": list(g.ci["errors"]) + ([g.fault_ci] if g.fault_ci else [])}
    else:
        st = _ci_status_json(g)
    code = 1 if st["status"] == "error" else 0
    if fmt == "json":
        out = json.dumps(st, indent=1, sort_keys=True) + "\n"
    elif fmt == "yaml":
        out = yaml.safe_dump(st, sort_keys=True)
    else:
        out = ("." * int(seconds * 2) + "\n" if wait and seconds else "") + f"status: {st['status']}\n"
        if long:
            # cloud-init 22.4 cmd/status.py TABULAR_LONG_TMPL; on error the detail is the errors, one a line
            detail = "\n".join(st["errors"]) if st["status"] == "error" and st["errors"] else st["detail"]
            out += (f"boot_status_code: {st['boot_status_code']}\nlast_update: {st['last_update']}\n"
                    f"detail:\n{detail}\n")
    return ExecResult(code, out=out, seconds=seconds)


_FD_REDIRS = ((re.compile(r"(?<![^\s;&|])2>&1"), " \x00E2O "), (re.compile(r"(?<![^\s;&|])2>>"), " \x00EA "),
              (re.compile(r"(?<![^\s;&|])2>"), " \x00EW "), (re.compile(r"(?<![^\s;&|])1>"), " > "))


@dataclass
class _Simple:
    argv: list[str] = field(default_factory=list)
    out: tuple[str, bool] | None = None  # (path, append)
    err: tuple[str, bool] | str | None = None  # (path, append) or "stdout" (2>&1)
    inp: str | None = None


def _split_script(script: str) -> list[tuple[str, list[_Simple]]]:
    """``a | b > f && c 2>/dev/null || d < f ; e`` → [(op, pipeline)], op the connector before it (';'
    first); each simple command has its argv and its redirections (``>``, ``>>``, ``<``, ``2>``, ``2>>``,
    ``2>&1``). Anything else a shell would do (``&``, ``$(…)``, globbing) is not modelled."""
    for rx, rep in _FD_REDIRS:
        script = rx.sub(rep, script)
    lex = shlex.shlex(script.replace("\n", " ; "), posix=True, punctuation_chars=";&|<>")
    lex.whitespace_split = True
    toks = list(lex)
    parts: list[tuple[str, list[_Simple]]] = []
    op, pipe, cur = ";", [], _Simple()
    i = 0

    def close_simple() -> None:
        nonlocal cur
        if not cur.argv and (cur.out or cur.err or cur.inp):
            raise ValueError("redirection without a command")
        if cur.argv:
            pipe.append(cur)
        cur = _Simple()

    while i < len(toks):
        tok = toks[i]
        if tok in (">", ">>", "<", "\x00EW", "\x00EA"):
            if i + 1 >= len(toks) or toks[i + 1] in (";", "&&", "||", "|", ">", ">>", "<"):
                raise ValueError(f"redirection '{tok.replace(chr(0), '')}' without a file")
            target = toks[i + 1]
            if tok == "<":
                cur.inp = target
            elif tok in (">", ">>"):
                cur.out = (target, tok == ">>")
            else:
                cur.err = (target, tok == "\x00EA")
            i += 2
            continue
        if tok == "\x00E2O":
            cur.err = "stdout"
        elif tok == "|":
            if not cur.argv:
                raise ValueError("'|' unexpected")
            close_simple()
        elif tok in (";", "&&", "||"):
            close_simple()
            if pipe:
                parts.append((op, pipe))
            elif tok != ";":
                raise ValueError(f"'{tok}' unexpected")
            op, pipe = tok, []
        elif set(tok) <= set("&|<>;"):
            raise ValueError(f"'{tok}' is not supported by the simulator's shell")
        else:
            cur.argv.append(tok)
        i += 1
    close_simple()
    if pipe:
        parts.append((op, pipe))
    return parts


def _bytes(b: str | bytes) -> bytes:
    return b.encode() if isinstance(b, str) else bytes(b)


@command("sh")
@command("bash")
def _sh(ctx: ExecContext) -> ExecResult:
    """``sh -c SCRIPT`` / ``sh FILE`` / script on stdin: ``;``, ``&&``, ``||``, pipes ``|``, redirections
    ``>``, ``>>``, ``<``, ``2>``, ``2>>``, ``2>&1`` (``/dev/null`` discards), quoting; each command runs to
    its end before the next (its effects are seen)."""
    args = ctx.argv[1:]
    if args[:1] == ["-c"] and len(args) >= 2:
        script = args[1]
    elif not args:
        script = ctx.stdin.decode("utf-8", "replace")
    else:
        data = ctx.guest.read_file(args[0])
        if data is None:
            return ExecResult(127, err=f"{ctx.argv[0]}: 0: cannot open {args[0]}: No such file\n")
        script = data.decode("utf-8", "replace")
    script = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("#"))
    try:
        parts = _split_script(script)
    except ValueError as e:
        return ExecResult(2, err=f"{ctx.argv[0]}: 1: Syntax error: {e}\n")
    g = ctx.guest
    out, err, code, seconds = b"", b"", 0, 0.0

    def write(target: tuple[str, bool], data: bytes) -> None:
        if target[0] != "/dev/null":
            g.write_file(target[0], data, append=target[1])

    for op, pipeline in parts:
        if (op == "&&" and code != 0) or (op == "||" and code == 0):
            continue
        stdin = b""
        for n, cmd in enumerate(pipeline):
            if cmd.inp is not None:
                data = g.read_file(cmd.inp) if cmd.inp != "/dev/null" else b""
                if data is None:
                    err += f"{ctx.argv[0]}: 1: cannot open {cmd.inp}: No such file\n".encode()
                    code, stdin = 2, b""
                    continue
                stdin = data
            for target in (cmd.out, cmd.err if isinstance(cmd.err, tuple) else None):
                if target is not None and target[0] != "/dev/null" and not target[1]:
                    g.write_file(target[0], b"")  # the shell truncates before the command runs
            r = ctx.run(cmd.argv, stdin)
            seconds += r.seconds
            c_out, c_err = _bytes(r.out), _bytes(r.err)
            if cmd.err == "stdout":
                c_out, c_err = c_out + c_err, b""
            elif isinstance(cmd.err, tuple):
                write(cmd.err, c_err)
                c_err = b""
            if cmd.out is not None:
                write(cmd.out, c_out)
                c_out = b""
            err += c_err
            code = r.exitcode
            if n + 1 < len(pipeline):
                stdin = c_out
            else:
                out += c_out
    return ExecResult(code, out, err, seconds)


@command("cat")
def _cat(ctx: ExecContext) -> ExecResult:
    if len(ctx.argv) == 1:
        return ExecResult(0, out=ctx.stdin)
    out, err, code = b"", "", 0
    for p in ctx.argv[1:]:
        data = ctx.guest.read_file(p)
        if data is None:
            err += f"cat: {p}: No such file or directory\n"
            code = 1
        else:
            out += data
    return ExecResult(code, out=out, err=err)


@command("echo")
def _echo(ctx: ExecContext) -> ExecResult:
    args = ctx.argv[1:]
    nl = "\n"
    if args[:1] == ["-n"]:
        args, nl = args[1:], ""
    return ExecResult(0, out=" ".join(args) + nl)


@command("true")
def _true(ctx: ExecContext) -> ExecResult:
    return ExecResult(0)


@command("false")
def _false(ctx: ExecContext) -> ExecResult:
    return ExecResult(1)


@command("test")
@command("[")
def _test(ctx: ExecContext) -> ExecResult:
    args = [a for a in ctx.argv[1:] if a != "]"]
    if len(args) == 2 and args[0] in ("-e", "-f", "-s", "-r"):
        data = ctx.guest.read_file(args[1])
        ok = data is not None and (args[0] != "-s" or len(data) > 0)
        return ExecResult(0 if ok else 1)
    if len(args) == 2 and args[0] == "-d":
        prefix = args[1].rstrip("/") + "/"
        return ExecResult(0 if any(p.startswith(prefix) for p in ctx.guest.files()) else 1)
    if len(args) == 3 and args[1] in ("=", "=="):
        return ExecResult(0 if args[0] == args[2] else 1)
    if len(args) == 3 and args[1] == "!=":
        return ExecResult(0 if args[0] != args[2] else 1)
    return ExecResult(2, err="test: unsupported expression in the simulator\n")


@command("mkdir")
def _mkdir(ctx: ExecContext) -> ExecResult:
    return ExecResult(0)  # directories are implicit in the guest's file model


@command("rm")
def _rm(ctx: ExecContext) -> ExecResult:
    force = any(a.startswith("-") and "f" in a for a in ctx.argv[1:])
    code, err = 0, ""
    for p in (a for a in ctx.argv[1:] if not a.startswith("-")):
        if not ctx.guest.delete_file(p) and not force:
            code, err = 1, err + f"rm: cannot remove '{p}': No such file or directory\n"
    return ExecResult(code, err=err)


@command("hostname")
def _hostname(ctx: ExecContext) -> ExecResult:
    return ExecResult(0, out=(ctx.guest.hostname or "localhost") + "\n")


@command("ssh-keygen")
def _ssh_keygen(ctx: ExecContext) -> ExecResult:
    args = ctx.argv[1:]
    if len(args) == 2 and args[0] == "-lf":
        data = ctx.guest.read_file(args[1])
        if data is None:
            return ExecResult(255, err=f"{args[1]}: No such file or directory\n")
        try:
            kind, b64, *comment = data.decode().split()
            blob = base64.b64decode(b64)
        except (ValueError, UnicodeDecodeError):
            return ExecResult(255, err=f"{args[1]} is not a public key file.\n")
        fp = "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
        return ExecResult(0, out=f"256 {fp} {' '.join(comment) or 'no comment'} (ED25519)\n")
    return ExecResult(1, err="usage: ssh-keygen -lf <file> (only this form is simulated)\n")


def _device_mtu(ctx: ExecContext, mac: str) -> int:
    """The MTU a virtio NIC's driver starts with: the NIC's ``mtu=`` (qemu-server passes it to QEMU as
    ``host_mtu``; Linux virtio_net adopts the device MTU, VIRTIO_NET_F_MTU), else 1500; ``ip link set
    … mtu`` in the guest overrides it."""
    for k, v in ctx.config.items():
        if re.fullmatch(r"net\d+", k) and cloudinit.parse_net(str(v)).get("macaddr", "").lower() == mac.lower():
            m = re.search(r"(?:^|,)mtu=(\d+)", str(v))
            if m and int(m.group(1)) > 1:
                return int(m.group(1))
    return 1500


@command("ip")
def _ip(ctx: ExecContext) -> ExecResult:
    args = ctx.argv[1:]
    as_json = "-j" in args or "-json" in args
    args = [a for a in args if a not in ("-j", "-json", "-4", "-6", "-o", "-br")]
    if args[:1] in (["addr"], ["address"], ["a"]) and args[1:2] in (["add"], ["del"]) and len(args) >= 5 \
            and args[3] == "dev":
        try:
            if args[1] == "add":
                cur = {a for addrs in [ctx.guest.extra.get(args[4], [])] for a in addrs}
                cur |= {a for n in ctx.guest.net_applied if n["name"] == args[4] for a in n["addresses"]}
                if str(ipaddress.ip_interface(args[2])) in cur:
                    return ExecResult(2, err="RTNETLINK answers: File exists\n")
                ctx.guest.add_address(args[4], args[2])
            elif not ctx.guest.remove_address(args[4], args[2]):
                return ExecResult(2, err="RTNETLINK answers: Cannot assign requested address\n")
        except ValueError:
            return ExecResult(1, err=f'Error: any valid prefix is expected rather than "{args[2]}".\n')
        return ExecResult(0)
    if args[:2] == ["link", "set"]:
        # ``ip link set [dev] <iface> [up|down] [mtu <n>]`` (iproute2 iplink.c): an unknown device is
        # "Cannot find device"; the MTU is kept per interface (``ip addr`` shows it)
        rest = args[2:]
        if rest[:1] == ["dev"]:
            rest = rest[1:]
        names = {i["name"] for i in ctx.guest.interfaces()}
        if not rest or rest[0] not in names:
            return ExecResult(1, err=f'Cannot find device "{rest[0] if rest else ""}"\n')
        if "mtu" in rest:
            try:
                ctx.guest.model("ip").setdefault("mtu", {})[rest[0]] = int(rest[rest.index("mtu") + 1])
            except (IndexError, ValueError):
                return ExecResult(1, err="Error: argument is wrong: mtu\n")
        return ExecResult(0)
    if args[:1] in (["addr"], ["address"], ["a"]) and args[1:2] in ([], ["show"]):
        ifaces = ctx.guest.interfaces()
        if as_json:
            mtus = ctx.guest.model("ip").get("mtu", {})
            rows = [{"ifname": i["name"], "address": i["hardware-address"],
                     "mtu": mtus.get(i["name"], _device_mtu(ctx, i["hardware-address"])),
                     "addr_info": [
                {"family": "inet" if a["ip-address-type"] == "ipv4" else "inet6", "local": a["ip-address"],
                 "prefixlen": a["prefix"]} for a in i["ip-addresses"]]} for i in ifaces]
            return ExecResult(0, out=json.dumps(rows) + "\n")
        lines = []
        for n, i in enumerate(ifaces, 1):
            mtu = ctx.guest.model("ip").get("mtu", {}).get(i["name"], _device_mtu(ctx, i["hardware-address"]))
            lines.append(f"{n}: {i['name']}: <UP> mtu {mtu}\n    link/ether {i['hardware-address']}\n")
            for a in i["ip-addresses"]:
                fam = "inet" if a["ip-address-type"] == "ipv4" else "inet6"
                lines.append(f"    {fam} {a['ip-address']}/{a['prefix']}\n")
        return ExecResult(0, out="".join(lines))
    return ExecResult(1, err='Object "' + (args[0] if args else "") + '" is unknown, try "ip help".\n')

