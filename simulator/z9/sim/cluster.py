"""In-memory state and behaviour of a simulated Proxmox VE cluster (qemu VMs, tasks, locks, stats).

Every behaviour here reproduces a fact of ``/work/shared/design/proxmox-api.md`` (cited as "facts:
<section>") or of the Proxmox Perl sources named there. Units: seconds everywhere.

Shapes
------
- VM: ``{vmid, node, config: {key: str}, running: bool}``; ``template`` and ``lock`` live in the config
  (``template: "1"``, ``lock: "clone"``) as in a ``qemu-server/<vmid>.conf`` file.
- Task: UPID ``UPID:<node>:<pid 8 HEX>:<pstart 8 HEX>:<starttime 8 HEX>:<type>:<id>:<user>:``
  (pve-common ``PVE::Tools::upid_encode``; facts: Tasks). ``status`` ``running`` → ``stopped`` with
  ``exitstatus`` ``OK`` / ``WARNINGS: n`` / the error text; the log ends ``TASK OK`` / ``TASK
  WARNINGS: n`` / ``TASK ERROR: <msg>``.
- Errors are :class:`PveError` ``(status, message, errors)``; the HTTP layer turns them into PVE
  replies (message as reason phrase).

Where checks happen (qemu-server ``API2/Qemu.pm``): checks done before ``fork_worker`` are HTTP errors
(missing config, ``VM <id> is running - destroy failed``, clone's ``config file already exists`` and
source lock, config digest/lock for PUT/POST config); checks done by the worker under the config flock
are task failures (start's ``already running`` / template / lock, stop/shutdown/destroy lock, resize's
shrink, every flock timeout of a task). PUT ``/config`` is synchronous: its flock timeout is an HTTP 500.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import itertools
import logging
import random
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import orjson

from .disks import DISK_RE, format_size, parse_size, print_drive
from .errors import PveError, param_error
from . import cloudinit
from .sdn import Sdn
from .firewall import Firewall, FirewallClock
from .guest import Guests, GuestSettings
from . import kubeadm  # noqa: F401  (registers the kubeadm/kubectl command models with the guests)
from . import blockdev  # noqa: F401  (registers lsblk, ls /dev/disk/by-id, readlink with the guests)
from .storage import Storage, node_ip as storage_ip
from .schema import split_list
from .tasks import Task, TaskPlan

log = logging.getLogger("z9.sim")

# facts: Locks - waits of the config flock, seconds
FLOCK_WAIT_S = {"config": 10.0, "start": 10.0, "stop": 10.0, "destroy": 10.0, "create": 5.0, "clone": 1.0}

GiB = 1024**3


def zlib_gzip(data: bytes) -> bytes:
    """gzip framing at level 1 (the cache compresses once per change; size matters less than time)."""
    import gzip as _gzip

    return _gzip.compress(data, compresslevel=1, mtime=0)


def not_exist(node: str, vmid: int) -> PveError:
    # PVE::AbstractConfig::load_config; facts: Endpoints (config)
    return PveError(500, f"Configuration file 'nodes/{node}/qemu-server/{vmid}.conf' does not exist")


def lock_timeout(vmid: int) -> PveError:
    return PveError(500, f"can't lock file '/var/lock/qemu-server/lock-{vmid}.conf' - got timeout")


def normalize_tags(text: str) -> str:
    """facts: Tags - split on ``;`` ``,`` space, lower-case, de-duplicate, sort, ``;``-join."""
    return ";".join(sorted({t.lower() for t in split_list(text)}))


def hash_password(text: str, ostype: str | None = None) -> str:
    r"""qemu-server API2/Qemu.pm $update_vm_api: ``cipassword`` is stored as
    ``PVE::Tools::encrypt_pw`` (pve-common PVE/Tools.pm: ``crypt($pw, "$5$<8-char salt>$")``, SHA-256
    crypt) unless it already is a crypt hash (``/^\$(?:[156]|2[ay])(\$.+){2}/``) or the guest is
    Windows (cloudbase-init wants the plain text)."""
    if re.match(r"^\$(?:[156]|2[ay])(\$.+){2}", text) or (ostype or "").startswith("win"):
        return text
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt as _crypt  # the libc crypt(3) PVE's Perl crypt calls (Python 3.11: still here)
    salt = base64.b64encode(random.randbytes(6), b"./").decode()[:8].replace("+", "X")
    return _crypt.crypt(text, f"$5${salt}$")


def random_mac() -> str:
    return "BC:24:11:" + ":".join(f"{random.randrange(256):02X}" for _ in range(3))


class Generation:
    """A counter bumped by every change of a VM's config or node/power state and of the VM set: the
    key of the encoded ``/cluster/resources`` cache (scale: 10,000 VMs are encoded once per change)."""

    value = 0

    @classmethod
    def bump(cls) -> None:
        cls.value += 1


class TrackedDict(dict):
    """A dict whose mutations bump :class:`Generation` (VM configs, the cluster's VM map)."""

    __slots__ = ()

    def __setitem__(self, k, v):
        Generation.bump()
        super().__setitem__(k, v)

    def __delitem__(self, k):
        Generation.bump()
        super().__delitem__(k)

    def pop(self, *a):
        Generation.bump()
        return super().pop(*a)

    def popitem(self):
        Generation.bump()
        return super().popitem()

    def clear(self):
        Generation.bump()
        super().clear()

    def update(self, *a, **kw):
        Generation.bump()
        super().update(*a, **kw)

    def setdefault(self, k, d=None):
        Generation.bump()
        return super().setdefault(k, d)


@dataclass
class VM:
    vmid: int
    node: str
    config: dict[str, str]
    running: bool = False
    started_at: float | None = None
    # cloud-init keys as of the last regeneration of the drive (PVE's [special:cloudinit]; see cloudinit.py)
    ci_applied: dict[str, str] | None = None
    # the files of PVE's cloud-init drive as last generated (None: no drive, or never generated)
    ci_drive: dict[str, bytes] | None = None
    # the config's [PENDING] section (qemu-server: changes a running VM cannot take live) and its
    # ``delete`` list; applied at the next start (QemuServer.pm vmconfig_apply_pending)
    pending: dict[str, str] = field(default_factory=dict)
    pending_delete: list[str] = field(default_factory=list)
    # the config's [<snapname>] sections: {name: {config, description, snaptime, vmstate, parent}},
    # and ``parent`` (the snapshot the current state derives from)
    snapshots: dict[str, dict] = field(default_factory=dict)
    parent: str | None = None
    # what the VM's disk holds when it is put in place (an image builder's template: the packages it
    # installed, z9.sim.guest.dpkg_status); its guest's disk from then on (clones copy it)
    disk_files: dict[str, bytes] | None = None

    @property
    def template(self) -> bool:
        return self.config.get("template") == "1"

    @property
    def lock(self) -> str | None:
        return self.config.get("lock")

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "config" and not isinstance(value, TrackedDict):
            value = TrackedDict(value)
        if name in ("config", "node", "running"):
            Generation.bump()
        object.__setattr__(self, name, value)

    def digest(self) -> str:
        """sha1 of the rendered config file (PVE: ``digest`` = sha1 of the raw file)."""
        lines = [f"#{line}" for line in self.config.get("description", "").split("\n") if "description" in self.config]
        lines += [f"{k}: {v}" for k, v in sorted(self.config.items()) if k != "description"]
        if self.pending or self.pending_delete:  # the [PENDING] section is part of the file
            lines.append("[PENDING]")
            lines += [f"{k}: {v}" for k, v in sorted(self.pending.items())]
            if self.pending_delete:
                lines.append("delete: " + ",".join(self.pending_delete))
        return hashlib.sha1(("\n".join(lines) + "\n").encode()).hexdigest()

    def with_pending(self) -> dict[str, str]:
        """pve-guest-common AbstractConfig.pm load_current_config without ``current``: the config
        with the pending values laid over it and the pending deletes removed."""
        out = dict(self.config)
        out.update(self.pending)
        for k in self.pending_delete:
            out.pop(k, None)
        return out

    def disk_bytes(self) -> int:
        total = 0
        for k, v in self.config.items():
            if DISK_RE.fullmatch(k) and not k.startswith("unused") and "media=cdrom" not in v:
                m = re.search(r"(?:^|,)size=([^,]+)", v)
                if m:
                    total += parse_size(m.group(1)) or 0
        return total

    def maxmem(self) -> int:
        m = re.match(r"(?:current=)?(\d+)", self.config.get("memory", "512"))
        return int(m.group(1)) * 1024 * 1024 if m else 512 * 1024 * 1024

    def maxcpu(self) -> int:
        return int(self.config.get("cores", "1")) * int(self.config.get("sockets", "1"))

    def to_json(self) -> dict:
        d = {"vmid": self.vmid, "node": self.node, "config": dict(self.config), "running": self.running,
             "template": self.template, "lock": self.lock}
        if self.pending or self.pending_delete:
            d["pending"] = dict(self.pending)
            d["pending_delete"] = list(self.pending_delete)
        return d


class FLock:
    """The per-VM config flock (``/var/lock/qemu-server/lock-<vmid>.conf``), shared or exclusive."""

    def __init__(self) -> None:
        self.readers = 0
        self.writer = False
        self.cond = asyncio.Condition()

    async def acquire(self, vmid: int, *, timeout: float, shared: bool = False) -> None:
        async with self.cond:
            pred = (lambda: not self.writer) if shared else (lambda: not self.writer and self.readers == 0)
            try:
                async with asyncio.timeout(timeout):
                    await self.cond.wait_for(pred)
            except TimeoutError:
                raise lock_timeout(vmid) from None
            if shared:
                self.readers += 1
            else:
                self.writer = True

    async def release(self, *, shared: bool = False) -> None:
        async with self.cond:
            if shared:
                self.readers -= 1
            else:
                self.writer = False
            self.cond.notify_all()

    @contextlib.asynccontextmanager
    async def hold(self, vmid: int, *, timeout: float, shared: bool = False):
        await self.acquire(vmid, timeout=timeout, shared=shared)
        try:
            yield
        finally:
            await self.release(shared=shared)


class Cluster:
    """A Proxmox VE cluster's qemu state. Construct, :meth:`seed`, then ``await start()``.

    ``task_seconds`` maps a task type (``qmclone``...) to its duration, ``task_default_s`` is used for
    the others; ``stats_lag_s`` is the period of the stats cache behind ``/cluster/resources``
    (``name``/``status``; facts: Endpoints); ``task_invisible_s`` is the window after a task's creation
    during which its status answers ``no such task`` (facts: Tasks).
    """

    def __init__(self, nodes: list[str], *, task_seconds: dict[str, float] | None = None,
                 task_default_s: float = 0.2, stats_lag_s: float = 10.0, task_invisible_s: float = 0.0,
                 guest: GuestSettings | None = None, firewall_clock: FirewallClock | None = None):
        self.nodes = list(nodes)
        self.task_seconds = dict(task_seconds or {})
        self._held: dict[str, asyncio.Event] = {}  # task type → released when set (hold_tasks)
        self.task_default_s = task_default_s
        self.stats_lag_s = stats_lag_s
        self.task_invisible_s = task_invisible_s
        self.paused: dict[int, bool] = {}  # vmid -> suspended (qmpstatus paused)
        self.bridges = {"vmbr0"}  # the Linux bridges of every node (/etc/network/interfaces)
        self.reboot_gap_s = 0.05  # between a reboot's stop and qmeventd's start (the VM reads stopped)
        self.clone_race = 0  # admin switch: the next n clones lose PVE's racy newid check (see clone)
        self.vms: dict[int, VM] = TrackedDict()
        self._resources_cache: dict[tuple[str | None, bool], tuple[tuple, bytes]] = {}
        self.tasks: dict[str, Task] = {}
        self.flocks: dict[int, FLock] = {}
        self.stats: dict[int, dict] = {}
        self.stats_refreshed_at = 0.0
        self.tasks_started: dict[str, int] = {}
        self._workers: set[asyncio.Task] = set()
        self.firewall = Firewall(firewall_clock)
        self.sdn = Sdn(self.nodes)
        self.firewall.vm_configs = lambda: {v.vmid: v.config for v in self.vms.values()}
        self.storage = Storage(self)
        self.guests = Guests(self, guest)
        self._stats_loop: asyncio.Task | None = None
        self._pid = itertools.count(random.randrange(100000, 900000))
        self._pstart = int(time.monotonic() * 100) % 10**7 + 10**6

    # ---- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        self.refresh_stats()
        self._stats_loop = asyncio.create_task(self._stats_forever())

    async def stop(self) -> None:
        if self._stats_loop:
            self._stats_loop.cancel()
        self.release_tasks()
        for t in list(self._workers):
            t.cancel()
        await asyncio.gather(*self._workers, *( [self._stats_loop] if self._stats_loop else []),
                             return_exceptions=True)

    async def reset(self, vms: list[VM]) -> None:
        """Cancel running workers, replace all VMs, forget tasks and counters, refresh stats."""
        for t in list(self._workers):
            t.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self.vms = TrackedDict()
        self.firewall.clear()
        self.sdn.clear()
        self.storage.clear()
        self.guests.clear()
        for vm in vms:
            self.add_vm(vm)
        self.tasks.clear()
        self.flocks.clear()
        self.tasks_started.clear()
        self.clone_race = 0
        self.paused.clear()
        self.refresh_stats()

    async def _stats_forever(self) -> None:
        while True:
            await asyncio.sleep(self.stats_lag_s)
            self.refresh_stats()

    def refresh_stats(self) -> None:
        """Snapshot name/status/sizes per vmid, as pvestatd's rrd broadcast (keyed by vmid only)."""
        now = time.time()
        self.stats = {
            vm.vmid: {"name": vm.config.get("name", f"VM {vm.vmid}"),
                      "status": "running" if vm.running else "stopped",
                      "uptime": int(now - vm.started_at) if vm.running and vm.started_at else 0,
                      "maxmem": vm.maxmem(), "maxcpu": vm.maxcpu(), "maxdisk": vm.disk_bytes()}
            for vm in self.vms.values()
        }
        self.stats_refreshed_at = now

    # ---- helpers ---------------------------------------------------------------------------------
    def add_vm(self, vm: VM) -> None:
        """Put a VM in place as if its config file appeared (seed, state file, ``POST /_sim/vms``): its
        cloud-init keys count as applied, and a running VM has the drive it was started with."""
        self.firewall.tick()
        if vm.ci_applied is None:
            vm.ci_applied = cloudinit.ci_values(vm.config)
        if vm.running and vm.ci_drive is None:
            try:
                vm.ci_drive = cloudinit.generate(vm.config, vm.vmid)
            except PveError:  # e.g. cicustom snippets nobody can have written: no drive to boot from
                vm.ci_drive = None
        self.vms[vm.vmid] = vm
        if vm.disk_files:
            self.guests.put_disk(vm.vmid, vm.disk_files)
        if vm.running:
            self.guests.power_on(vm, already_up=True)
        else:
            self.guests.power_off(vm.vmid)

    def flock(self, vmid: int) -> FLock:
        return self.flocks.setdefault(vmid, FLock())

    def check_node(self, node: str) -> None:
        if node not in self.nodes:
            # pveproxy cannot resolve a node that is not a cluster member
            raise PveError(500, f"hostname lookup '{node}' failed - failed to get address info for: "
                                f"{node}: Name or service not known")

    def vm_on(self, node: str, vmid: int) -> VM:
        """The VM whose config is on ``node``; a VM on another node 'does not exist' there (facts)."""
        self.check_node(node)
        vm = self.vms.get(vmid)
        if vm is None or vm.node != node:
            raise not_exist(node, vmid)
        return vm

    def vm_alive(self, vm: VM) -> VM:
        """Re-load inside a worker: the config may be gone meanwhile."""
        cur = self.vms.get(vm.vmid)
        if cur is not vm:
            raise not_exist(vm.node, vm.vmid)
        return vm

    @staticmethod
    def check_lock(vm: VM, skiplock: bool = False) -> None:
        # PVE::AbstractConfig::check_lock; facts: Locks
        if vm.lock and not skiplock:
            raise PveError(500, f"VM is locked ({vm.lock})")

    def duration(self, ttype: str) -> float:
        return self.task_seconds.get(ttype, self.task_default_s)

    async def task_time(self, ttype: str) -> None:
        """A ``ttype`` worker's running time: its duration, then as long as that type is held
        (:meth:`hold_tasks`) — a test looks at a task's in-between state without racing its clock."""
        await asyncio.sleep(self.duration(ttype))
        gate = self._held.get(ttype)
        if gate is not None:
            await gate.wait()

    def hold_tasks(self, ttype: str) -> None:
        """Workers of ``ttype`` (already running or started later) do not end until :meth:`release_tasks`."""
        self._held.setdefault(ttype, asyncio.Event())

    def release_tasks(self, ttype: str | None = None) -> None:
        """Let the held workers of ``ttype`` (None: of every type) end."""
        for t in [ttype] if ttype is not None else list(self._held):
            gate = self._held.pop(t, None)
            if gate is not None:
                gate.set()

    # ---- tasks -----------------------------------------------------------------------------------
    def new_task(self, node: str, ttype: str, tid: str | int, user: str) -> Task:
        pid = next(self._pid)
        self._pstart += random.randrange(1, 50)
        now = int(time.time())
        upid = f"UPID:{node}:{pid:08X}:{self._pstart:08X}:{now:08X}:{ttype}:{tid}:{user}:"
        task = Task(upid=upid, node=node, pid=pid, pstart=self._pstart, starttime=now, type=ttype, id=str(tid),
                    user=user, visible_at=time.monotonic() + self.task_invisible_s)
        self.tasks[upid] = task
        self.tasks_started[ttype] = self.tasks_started.get(ttype, 0) + 1
        return task

    def spawn(self, node: str, ttype: str, tid: str | int, user: str, plan: TaskPlan,
              fail_exitstatus: str | None = None) -> str:
        """Start a worker and return its UPID at once (facts: Tasks - mutations return a UPID).

        ``fail_exitstatus`` (fault ``fail_task``): the task runs for its duration and ends with that
        exitstatus without its effect, unless it starts with ``WARNINGS`` (then the effect happens)."""
        task = self.new_task(node, ttype, tid, user)
        w = asyncio.create_task(self._run_task(task, plan, fail_exitstatus), name=task.upid)
        self._workers.add(w)
        w.add_done_callback(self._workers.discard)
        return task.upid

    async def _run_task(self, task: Task, plan: TaskPlan, fail_exitstatus: str | None) -> None:
        ok = False
        try:
            if fail_exitstatus and not fail_exitstatus.startswith("WARNINGS"):
                await self.task_time(task.type)
                raise PveError(500, fail_exitstatus)
            await plan.run(task)
            ok = True
            if fail_exitstatus:
                n = fail_exitstatus.partition(":")[2].strip() or "1"
                task.lines.append("WARN: simulated warning")
                self._finish(task, f"WARNINGS: {n}", f"TASK WARNINGS: {n}")
            elif task.warnings:
                self._finish(task, f"WARNINGS: {task.warnings}", f"TASK WARNINGS: {task.warnings}")
            else:
                self._finish(task, "OK", "TASK OK")
        except PveError as e:
            msg = e.message.split("\n")[0]
            self._finish(task, msg, f"TASK ERROR: {msg}")
        except asyncio.CancelledError:
            self._finish(task, "unexpected status", "TASK ERROR: interrupted by signal")
            raise
        except Exception as e:  # pragma: no cover - a simulator bug must not hang clients
            log.exception("task %s crashed", task.upid)
            self._finish(task, f"simulator error: {e}", f"TASK ERROR: simulator error: {e}")
        finally:
            if not ok and plan.cleanup:
                plan.cleanup()

    @staticmethod
    def _finish(task: Task, exitstatus: str, last_line: str) -> None:
        task.lines.append(last_line)
        task.status = "stopped"
        task.exitstatus = exitstatus
        task.endtime = int(time.time())

    def get_task(self, node: str, upid: str) -> Task:
        """``GET /nodes/{node}/tasks/{upid}/...`` lookup: unknown, not yet visible or asked on another
        node → 400 ``errors.upid`` (pve-manager API2/Tasks.pm)."""
        self.check_node(node)
        if not re.fullmatch(r"UPID:[^:]+:[0-9A-F]{8}:[0-9A-F]{8,9}:[0-9A-F]{8}:[^:]*:[^:]*:[^:]+:", upid):
            raise param_error({"upid": "unable to parse worker upid"})
        task = self.tasks.get(upid)
        if task is None or task.node != node or time.monotonic() < task.visible_at:
            raise param_error({"upid": "no such task"})
        return task

    def task_log(self, node: str, upid: str, start: int = 0, limit: int = 50) -> tuple[int, list[dict]]:
        """(total lines, the page): pve-manager API2/Tasks.pm read_task_log sets the result
        attribute ``total`` to the log's line count."""
        task = self.get_task(node, upid)
        limit = limit or 50
        return len(task.lines), [{"n": i + 1, "t": t} for i, t in enumerate(task.lines)][start:start + limit]

    # ---- template, suspend/resume ----------------------------------------------------------------
    async def make_template(self, node: str, vmid: int, params: dict[str, str], user: str,
                            fail: str | None = None) -> str:
        """``POST .../template`` (qemu-server API2/Qemu.pm template): a running VM is refused before
        the task ("you can't convert a running VM to a template" - die in the early checks); in a
        ``qmtemplate`` task under the flock each disk becomes ``base-<vmid>-disk-<n>`` and the config
        gets ``template: 1``; a template again: "you can't convert a template to a template"."""
        vm = self.vm_on(node, vmid)

        def load_and_check(v: VM) -> None:
            # Qemu.pm template's $load_and_check, before the task and again in it under the lock
            self.check_lock(v)
            if v.snapshots:
                raise PveError(500, "unable to create template, because VM contains snapshots")
            if v.template:
                raise PveError(500, "you can't convert a template to a template")
            if v.running:
                raise PveError(500, "you can't convert a VM to template if VM is running")

        load_and_check(vm)

        async def run(task: Task) -> None:
            async with self.flock(vmid).hold(vmid, timeout=FLOCK_WAIT_S["config"]):
                v = self.vm_alive(vm)
                load_and_check(v)
                await self.task_time("qmtemplate")
                for k, val in sorted(v.config.items()):
                    if DISK_RE.fullmatch(k) and not k.startswith("unused") and "media=cdrom" not in val:
                        new = re.sub(rf"(^[^:]+:)vm-{vmid}-", rf"\1base-{vmid}-", val)
                        if new != val:
                            task.lines.append(f"  Renamed \"{val.split(',')[0].split(':')[1]}\" to "
                                              f"\"{new.split(',')[0].split(':')[1]}\" in volume group \"pve\"")
                            v.config[k] = new
                v.config["template"] = "1"

        return self.spawn(node, "qmtemplate", vmid, user, TaskPlan(run), fail)

    async def suspend_resume(self, node: str, vmid: int, action: str, params: dict[str, str], user: str,
                             fail: str | None = None) -> str:
        """``POST status/suspend|resume`` (Qemu.pm vm_suspend / vm_resume): both need a running VM
        (``VM <id> not running`` before the task); ``skiplock`` is root's only. Suspend pauses the
        guest (``qmpstatus: paused``, status stays ``running``); resume continues it."""
        if params.get("skiplock") == "1" and user != "root@pam":
            raise param_error({"skiplock": "Only root may use this option."})
        vm = self.vm_on(node, vmid)
        if not vm.running:
            raise PveError(500, f"VM {vmid} not running")
        if action == "suspend" and params.get("todisk") == "1":
            raise PveError(501, "suspend to disk is not modelled by the simulator")

        async def run(task: Task) -> None:
            async with self.flock(vmid).hold(vmid, timeout=FLOCK_WAIT_S["config"]):
                v = self.vm_alive(vm)
                self.check_lock(v, params.get("skiplock") == "1")
                await self.task_time(f"qm{action}")
                self.paused[vmid] = action == "suspend"

        return self.spawn(node, f"qm{action}", vmid, user, TaskPlan(run), fail)

    def cluster_status(self) -> list[dict]:
        """``GET /cluster/status`` (pve-manager API2/ClusterConfig.pm / Cluster.pm): the cluster entry
        and one per node (``local`` marks the node answering: the first)."""
        out: list[dict] = [{"type": "cluster", "id": "cluster", "name": "z9sim", "nodes": len(self.nodes),
                            "quorate": 1, "version": len(self.nodes) + 1}]
        for i, n in enumerate(self.nodes):
            out.append({"type": "node", "id": f"node/{n}", "name": n, "nodeid": i + 1, "online": 1,
                        "local": 1 if i == 0 else 0, "ip": storage_ip(self, n), "level": ""})
        return out

    def node_status(self, node: str) -> dict:
        """``GET /nodes/{node}/status`` (pve-manager API2/Nodes.pm status): the node's load, memory,
        CPU and versions (fixed figures)."""
        self.check_node(node)
        return {"uptime": 86400, "loadavg": ["0.10", "0.05", "0.01"], "cpu": 0.02, "wait": 0.0,
                "cpuinfo": {"cpus": 16, "sockets": 1, "cores": 16, "model": "QEMU Virtual CPU", "mhz": "2400.000",
                            "hvm": "1", "flags": "", "user_hz": 100},
                "memory": {"total": 64 * GiB, "used": 8 * GiB, "free": 56 * GiB},
                "swap": {"total": 0, "used": 0, "free": 0},
                "rootfs": {"total": 100 * GiB, "used": 10 * GiB, "free": 90 * GiB, "avail": 90 * GiB},
                "ksm": {"shared": 0}, "idle": 0, "kversion": "Linux 6.8.12-4-pve #1 SMP PREEMPT_DYNAMIC",
                "pveversion": "pve-manager/9.1.3/z9sim000", "current-kernel": {"sysname": "Linux",
                "release": "6.8.12-4-pve", "version": "#1 SMP PREEMPT_DYNAMIC", "machine": "x86_64"},
                "boot-info": {"mode": "efi", "secureboot": 0}}

    def list_tasks(self, node: str | None, params: dict[str, str]) -> tuple[int, list[dict]]:
        """``GET /nodes/{node}/tasks`` (pve-manager API2/Tasks.pm node_tasks): newest first, filtered
        by ``vmid``, ``typefilter``, ``userfilter`` (substring), ``statusfilter`` (ok, warning,
        error, unknown), ``errors`` (only failed), ``since``/``until`` (start time), ``source``
        (``active``: running only, ``archive``: ended only, ``all``); returns (total, the page
        ``start``/``limit``). ``node`` None: every node (``/cluster/tasks``)."""
        if node is not None:
            self.check_node(node)
        out = []
        source = params.get("source", "archive")
        statuses = set(split_list(params.get("statusfilter", "")))
        for t in sorted(self.tasks.values(), key=lambda t: t.starttime, reverse=True):
            if (node is not None and t.node != node) or time.monotonic() < t.visible_at:
                continue
            if params.get("vmid") and t.id != params["vmid"]:
                continue
            if params.get("typefilter") and t.type != params["typefilter"]:
                continue
            if params.get("userfilter") and params["userfilter"] not in t.user:
                continue
            if params.get("since") and t.starttime < int(params["since"]):
                continue
            if params.get("until") and t.starttime > int(params["until"]):
                continue
            if node is not None and source == "active" and t.status != "running":
                continue
            if node is not None and source == "archive" and t.status == "running":
                continue
            ok = t.exitstatus == "OK"
            warn = (t.exitstatus or "").startswith("WARNINGS")
            kind = "unknown" if t.status == "running" else "ok" if ok else "warning" if warn else "error"
            if statuses and kind not in statuses:
                continue
            if params.get("errors") == "1" and kind != "error":
                continue
            d = t.status_json()
            if t.status == "stopped":
                d["status"] = t.exitstatus
                d["endtime"] = t.endtime
            else:
                d.pop("status")
            out.append(d)
        start = int(params.get("start", 0))
        return len(out), out[start:start + int(params.get("limit", 50) or 50)]

    # ---- read endpoints --------------------------------------------------------------------------
    def nextid(self, vmid: str | None = None) -> str:
        """``GET /cluster/nextid``: lowest free id >= 100 as a JSON string; reserves nothing (facts)."""
        if vmid is not None:
            if int(vmid) in self.vms:
                raise param_error({"vmid": f"VM {int(vmid)} already exists"})
            return str(int(vmid))
        return str(next(i for i in itertools.count(100) if i not in self.vms))

    def get_config(self, node: str, vmid: int, current: bool = False) -> dict:
        """Config with values typed as PVE parses them (:meth:`typed`), plus ``digest``. Without
        ``current`` the pending values are laid over it (AbstractConfig.pm load_current_config);
        ``cipassword`` reads ``**********`` (Qemu.pm vm_config)."""
        vm = self.vm_on(node, vmid)
        out: dict[str, Any] = {}
        for k, v in (vm.config if current else vm.with_pending()).items():
            out[k] = "**********" if k == "cipassword" else self.typed(k, v)
        out["digest"] = vm.digest()
        return out

    _CONF_TYPES: dict[str, str] | None = None
    CONF_ONLY = frozenset({"meta", "parent", "snaptime", "vmstate", "runningmachine", "runningcpu",
                           "running-nets-host-mtu"})

    @classmethod
    def typed(cls, key: str, value: str) -> Any:
        """A config value as the JSON encoder sees it after qemu-server ``PVE/QemuServer.pm``
        parse_vm_config → check_type: a ``boolean`` option becomes the number 1/0 (``1|on|yes|true``,
        ``0|off|no|false``), an ``integer`` ``int($1)``; a ``number`` (``cpulimit``,
        ``migrate_downtime``) is returned as the string it was (``return $value if $value =~ …``), and so
        is every string option (``memory``, ``agent``, ``net0``, …): Perl's JSON encoder writes a scalar
        as it was last used. The types are ``$confdesc``'s, the POST config parameters of the schema."""
        typ = cls._conf_type(key)
        if typ == "boolean":
            if value == "1" or re.fullmatch(r"on|yes|true", value, re.I):
                return 1
            if value == "0" or re.fullmatch(r"off|no|false", value, re.I):
                return 0
        elif typ == "integer" and re.fullmatch(r"\d+", value):
            return int(value)
        return value

    @classmethod
    def _conf_type(cls, key: str) -> str | None:
        if cls._CONF_TYPES is None:
            import importlib.resources
            import json

            # $confdesc is the POST config parameter list of the raw schema tree: a flat name -> type map
            tree = json.loads(importlib.resources.files("z9.sim").joinpath("pve-api-schema.json").read_text())
            types: dict[str, str] = {}

            def walk(n):
                if n["path"] == "/nodes/{node}/qemu/{vmid}/config":
                    for name, p in n["info"]["POST"]["parameters"]["properties"].items():
                        types[re.sub(r"\[n\]$", "", name)] = p.get("type", "string")
                for c in n.get("children") or []:
                    walk(c)

            for n in tree:
                walk(n)
            for k in ("delete", "revert", "digest", "force", "skiplock", "background_delay", "node", "vmid"):
                types.pop(k, None)  # API parameters, not config options
            cls._CONF_TYPES = types
        base = re.sub(r"\d+$", "", key) if key not in cls._CONF_TYPES else key
        return cls._CONF_TYPES.get(base)

    def vm_status(self, vm: VM) -> dict:
        """Fresh status of one VM (``status/current``, ``GET /nodes/{node}/qemu``)."""
        d: dict[str, Any] = {
            "vmid": vm.vmid, "name": vm.config.get("name", f"VM {vm.vmid}"),
            "status": "running" if vm.running else "stopped",
            "qmpstatus": ("paused" if self.paused.get(vm.vmid) else "running") if vm.running else "stopped",
            "uptime": int(time.time() - vm.started_at) if vm.running and vm.started_at else 0,
            "cpus": vm.maxcpu(), "maxmem": vm.maxmem(), "maxdisk": vm.disk_bytes(),
            "mem": vm.maxmem() // 4 if vm.running else 0, "cpu": 0.01 if vm.running else 0,
            "disk": 0, "diskread": 0, "diskwrite": 0, "netin": 0, "netout": 0,
        }
        if vm.running:
            d["pid"] = 10000 + vm.vmid
        if vm.template:
            d["template"] = 1
        if vm.lock:
            d["lock"] = vm.lock
        if vm.config.get("tags"):
            d["tags"] = vm.config["tags"]
        # QemuServer.pm vmstatus: "$d->{serial} = 1 if conf_has_serial($conf)" (serial0..serial3);
        # vcpus, when set, is the count ("$d->{cpus} = $conf->{vcpus} if $conf->{vcpus}")
        if any(vm.config.get(f"serial{i}") for i in range(4)):
            d["serial"] = 1
        if re.fullmatch(r"[1-9]\d*", vm.config.get("vcpus", "")):
            d["cpus"] = int(vm.config["vcpus"])
        return d

    def status_current(self, node: str, vmid: int) -> dict:
        """``status/current`` (Qemu.pm vm_status): vmstatus's row plus ``ha``, ``clipboard`` (``undef``
        — JSON null — when ``vga`` names none), ``spice`` and ``agent: 1`` (Agent.pm get_qga_key
        enabled). The node's list (vmlist) is vmstatus's rows alone: no ``ha``, no ``agent``."""
        vm = self.vm_on(node, vmid)
        d = self.vm_status(vm)
        d["ha"] = {"managed": 0}
        if vga := vm.config.get("vga"):
            # parse_vga: a property string whose default key is 'type'
            opts = dict(kv.split("=", 1) if "=" in kv else ("type", kv) for kv in vga.split(","))
            if opts.get("type", "").startswith(("virtio", "qxl")):  # virtio*, or vga_conf_has_spice's qxl*
                d["spice"] = 1
            d["clipboard"] = opts.get("clipboard")
        if vm.config.get("agent", "").startswith(("1", "enabled=1")):
            d["agent"] = 1
        return d

    def list_qemu(self, node: str) -> list[dict]:
        self.check_node(node)
        return [self.vm_status(vm) for vm in sorted(self.vms.values(), key=lambda v: v.vmid) if vm.node == node]

    def resources_json(self, rtype: str | None = None, gzip: bool = False) -> bytes:
        """The encoded ``{"data": resources(rtype)}`` (gzip-compressed if ``gzip``), cached until a VM,
        the VM set or the stats snapshot changes (:class:`Generation`)."""
        key = (Generation.value, self.stats_refreshed_at)
        hit = self._resources_cache.get((rtype, gzip))
        if hit is not None and hit[0] == key:
            return hit[1]
        if gzip:
            body = zlib_gzip(self.resources_json(rtype))
        else:
            body = orjson.dumps({"data": self.resources(rtype)})
        self._resources_cache[(rtype, gzip)] = (key, body)
        return body

    def resources(self, rtype: str | None = None) -> list[dict]:
        """``GET /cluster/resources``: membership, node, tags, lock and template are fresh; name,
        status and sizes come from the stats snapshot (new VM: no name, status ``unknown``; facts)."""
        out: list[dict] = []
        if rtype in (None, "vm"):
            for vm in sorted(self.vms.values(), key=lambda v: v.vmid):
                e: dict[str, Any] = {"id": f"qemu/{vm.vmid}", "type": "qemu", "vmid": vm.vmid, "node": vm.node,
                                     "template": 1 if vm.template else 0}
                st = self.stats.get(vm.vmid)
                if st:
                    e.update(name=st["name"], status=st["status"], uptime=st["uptime"], maxmem=st["maxmem"],
                             maxcpu=st["maxcpu"], maxdisk=st["maxdisk"], mem=0, cpu=0, disk=0, diskread=0,
                             diskwrite=0, netin=0, netout=0)
                else:
                    e["status"] = "unknown"
                if vm.config.get("tags"):
                    e["tags"] = vm.config["tags"]
                if vm.lock:
                    e["lock"] = vm.lock
                out.append(e)
        if rtype in (None, "node"):
            for n in self.nodes:
                out.append({"id": f"node/{n}", "type": "node", "node": n, "status": "online", "maxcpu": 16,
                            "maxmem": 64 * GiB, "maxdisk": 500 * GiB, "cpu": 0.02, "mem": 8 * GiB, "disk": 10 * GiB,
                            "uptime": 86400, "level": ""})
        if rtype in (None, "storage"):
            # the same storages as /nodes/{node}/storage (storage.py STORAGES): one row per node and
            # storage, a shared one on every node (pve-manager API2/Cluster.pm resources)
            from .storage import STORAGES
            for n in self.nodes:
                for sd in STORAGES:
                    out.append({"id": f"storage/{n}/{sd.id}", "type": "storage", "storage": sd.id, "node": n,
                                "status": "available", "content": ",".join(sd.content), "shared": int(sd.shared),
                                "maxdisk": sd.total, "disk": self.storage.used(sd.id, n), "plugintype": sd.type})
        return out

    # ---- config ----------------------------------------------------------------------------------
    @staticmethod
    def _one_cloudinit(config: dict[str, str], pending: dict[str, str], params: dict[str, str]) -> None:
        """Qemu.pm create_disks: a new cloud-init drive (``<storage>:cloudinit``) where the config,
        its pending changes or this very write already has one (QemuConfig.pm has_cloudinit, the
        drive's own key skipped): ``<key> - cloud-init drive is already attached at '<other>'``."""
        def is_ci(v: str) -> bool:
            volid = str(v).split(",", 1)[0]
            return volid == "cloudinit" or volid.endswith((":cloudinit", "-cloudinit"))

        done: dict[str, str] = {}
        for k in sorted(k for k in params if DISK_RE.fullmatch(k) and not k.startswith("unused")):
            v = str(params[k])
            if v.split(",", 1)[0].endswith(":cloudinit") or v.split(",", 1)[0] == "cloudinit":
                for where in (config, pending, done):
                    other = next((x for x, y in sorted(where.items())
                                  if x != k and DISK_RE.fullmatch(x) and not x.startswith("unused") and is_ci(y)), None)
                    if other is not None:
                        raise PveError(500, f"{k} - cloud-init drive is already attached at '{other}'")
            done[k] = v

    @staticmethod
    def _cloudinit_alloc(vmid: int, key: str, value: str) -> str:
        """qemu-server ``create_disks``: a drive ``<storage>:cloudinit`` allocates the VM's cloud-init
        volume ``<storage>:vm-<vmid>-cloudinit`` and is a CD-ROM; any other value is kept as sent."""
        if not DISK_RE.fullmatch(key) or key.startswith(("unused", "efidisk", "tpmstate")):
            return value
        volid, _, opts = value.partition(",")
        m = re.fullmatch(r"([a-z][a-z0-9\-_.]*[a-z0-9]):cloudinit", volid, re.I)
        if m is None:
            return value
        rest = [o for o in opts.split(",") if o and not o.startswith("media=")]
        return ",".join([f"{m.group(1)}:vm-{vmid}-cloudinit", "media=cdrom", *rest])

    def get_pending(self, node: str, vmid: int) -> list[dict]:
        """``GET .../pending`` (Qemu.pm vm_pending, PVE::GuestHelpers::config_with_pending_array): one
        row per key, ``{key, value}``, with ``pending`` when a change waits and ``delete: 1`` for a
        pending delete; ``cipassword`` masked."""
        vm = self.vm_on(node, vmid)
        rows: list[dict] = []
        for k in sorted(set(vm.config) | set(vm.pending)):
            if k in ("lock",) and k not in vm.config:
                continue
            row: dict[str, Any] = {"key": k}
            # the values as parse_vm_config typed them (check_type, :meth:`typed`), the [PENDING] ones too
            if k in vm.config:
                row["value"] = "**********" if k == "cipassword" else self.typed(k, vm.config[k])
            if k in vm.pending:
                row["pending"] = "********** " if k == "cipassword" else self.typed(k, vm.pending[k])
            if k in vm.pending_delete:
                row["delete"] = 1
            rows.append(row)
        rows.append({"key": "digest", "value": vm.digest()})
        return rows

    # QemuServer.pm $fast_plug_option (+ every cloud-init option): applied at once on a running VM
    FAST_PLUG = frozenset({"description", "hookscript", "lock", "migrate_downtime", "migrate_speed", "name",
                           "onboot", "protection", "shares", "startup", "tags", "vmstatestorage", "cicustom",
                           "cipassword", "citype", "ciuser", "ciupgrade", "nameserver", "searchdomain", "sshkeys"})

    @staticmethod
    def hotplug_features(vm: VM) -> set[str]:
        """QemuServer.pm parse_hotplug_features: ``0`` none, ``1`` (or unset) the default
        ``network,disk,usb``."""
        raw = vm.config.get("hotplug", "1")
        if raw == "0":
            return set()
        if raw == "1":
            raw = "network,disk,usb"
        return set(split_list(raw))

    def _hotpluggable(self, vm: VM, key: str, value: str | None) -> bool:
        """QemuServer.pm vmconfig_hotplug_pending: whether a change of ``key`` on a running VM is
        applied live (else it stays in [PENDING] until the next start). ``cores``/``sockets`` never
        are (only ``vcpus`` with the cpu feature); ``memory`` needs the memory feature; a NIC the
        network feature; a disk the disk feature and a hot-pluggable bus (not ide/sata/efidisk/
        tpmstate) - a CD-ROM's medium changes live."""
        feats = self.hotplug_features(vm)
        if key in self.FAST_PLUG or re.fullmatch(r"ipconfig\d+", key):
            return True
        # vmconfig_hotplug_pending's branches: balloon, cpuunits, cpulimit and hotplug apply live;
        # ``agent`` is none of them (nor a fast-plug option): "skip", it stays pending until a restart
        if key in ("balloon", "cpuunits", "cpulimit", "hotplug"):
            return True
        if key == "vcpus":
            return "cpu" in feats
        if key == "memory":
            return "memory" in feats
        if re.fullmatch(r"net\d+", key):
            return "network" in feats
        if DISK_RE.fullmatch(key) and not key.startswith("unused"):
            cur = vm.config.get(key, "")
            if value is not None and "media=cdrom" in value and "cloudinit" not in value and "media=cdrom" in cur:
                return True  # vmconfig_update_disk: a CD-ROM's medium is changed through QMP
            if "cloudinit" in (value or "") or "cloudinit" in cur:
                return False  # the cloud-init drive is (re)generated with the pending changes
            if value is not None and cur and cur.split(",", 1)[0] == value.split(",", 1)[0]:
                # vmconfig_update_disk: the same volume with another aio, discard, iothread, queues,
                # product, cache, ssd, vendor or ro is "skip" (pending: QEMU applies them at start)
                def opts(v: str) -> dict[str, str]:
                    return dict(o.partition("=")[::2] for o in v.split(",")[1:] if o)
                a, b = opts(cur), opts(value)
                if any(a.get(o) != b.get(o) for o in ("aio", "discard", "iothread", "queues", "product", "cache",
                                                      "ssd", "vendor", "ro")):
                    return False
            return "disk" in feats and not re.match(r"(efidisk|ide|sata|tpmstate)\d", key)
        if key.startswith("unused"):
            return True
        return False

    def _alloc_disk(self, vm: VM, key: str, value: str, task: "Task | None") -> str:
        """Qemu.pm create_disks: a drive ``<storage>:<size in GiB>`` allocates a new volume
        ``<storage>:vm-<vmid>-disk-<n>`` (the lowest n not used by the VM) with ``size=<n>G``."""
        m = re.fullmatch(r"([a-z][a-z0-9\-_.]*[a-z0-9]):(\d+(?:\.\d+)?)(,.*)?", value, re.I)
        if not DISK_RE.fullmatch(key) or key.startswith("unused") or m is None:
            return value
        sdef = self.storage.definition(m.group(1))
        if "images" not in sdef.content:
            raise PveError(500, f"storage '{sdef.id}' does not support content-type 'images'")
        # PVE::Storage::vdisk_alloc -> find_free_diskname: the storage's volumes (every config's,
        # orphans) and this VM's pending ones
        name = self.storage.free_disk_name(sdef.id, vm.node, vm.vmid,
                                           [v for v in vm.pending.values() if v.startswith(f"{sdef.id}:")])
        if task is not None:
            task.lines.append(f"  Logical volume \"{name}\" created.")
        return print_drive(f"{m.group(1)}:{name}", m.group(3) or "", size=format_size(int(float(m.group(2)) * GiB)))

    def _unused(self, vm: VM, old: str) -> None:
        """vmconfig_register_unused_drive: a detached disk's volume stays, as ``unused<n>``."""
        volid = old.split(",", 1)[0]
        if "media=cdrom" in old or "cloudinit" in volid or volid in ("none", "") or ":" not in volid:
            return
        if volid in vm.config.values():
            return
        m = re.search(r"(?:^|,)size=([^,]+)", old)
        if m:
            self.storage.sizes[volid] = parse_size(m.group(1)) or 0
        n = next(i for i in itertools.count() if f"unused{i}" not in vm.config)
        vm.config[f"unused{n}"] = volid

    def _deallocate(self, vm: VM, key: str, value: str, task: "Task | None") -> None:
        """QemuServer.pm try_deallocate_drive of ``unusedN`` (``delete=unusedN``): the owner frees the
        volume (PVE::Storage::vdisk_free), any other VM only drops it from its config ("If vm is not
        owner of this disk remove from config"): it stays on its storage, an orphan."""
        from .storage import owner_of

        volid = value.split(",", 1)[0]
        if ":" not in volid:
            return
        if owner_of(volid.split(":", 1)[1]) == vm.vmid:
            self.storage.sizes.pop(volid, None)
            if task is not None:
                task.lines.append(f"  Logical volume \"{volid.split(':', 1)[1]}\" successfully removed.")
        else:
            self.storage.orphan_add(volid, vm.node, self.volume_size(vm, key), vm.vmid)

    def volume_size(self, vm: VM, key: str) -> int:
        """The size of the volume ``vm.config[key]`` names: its ``size=``, else (an ``unusedN``) what
        the storage knows of it."""
        val = vm.config.get(key) or vm.pending.get(key) or ""
        m = re.search(r"(?:^|,)size=([^,]+)", val)
        if m:
            return parse_size(m.group(1)) or 0
        return self.storage.sizes.get(val.split(",", 1)[0], 4 * 1024 * 1024)

    def _apply_pending(self, vm: VM) -> None:
        """QemuServer.pm vmconfig_apply_pending (a start, or a config write to a stopped VM): every
        pending delete and value goes into the config."""
        for k in vm.pending_delete:
            old = vm.config.pop(k, None)
            if old is not None and DISK_RE.fullmatch(k) and not k.startswith("unused"):
                self._unused(vm, old)
        vm.pending_delete = []
        for k, v in list(vm.pending.items()):
            old = vm.config.get(k)
            vm.config[k] = v
            if old is not None and old != v and DISK_RE.fullmatch(k) and not k.startswith("unused") \
                    and old.split(",", 1)[0] != v.split(",", 1)[0]:
                self._unused(vm, old)
        vm.pending = {}
        Generation.bump()

    def _apply_config(self, vm: VM, params: dict[str, str], task: "Task | None" = None) -> None:
        """Qemu.pm $update_vm_api's updatefn: every change is written to [PENDING] first; a stopped
        VM then gets all pending changes applied (vmconfig_apply_pending), a running one only the
        hot-pluggable ones (vmconfig_hotplug_pending) - the rest waits for the next start."""
        self.firewall.tick()  # pve-firewall compiles the NICs (firewall=1) as of its last cycle
        deletes = split_list(params.get("delete", ""))
        self._one_cloudinit(vm.config, vm.pending, params)
        if params.get("boot"):
            # Qemu.pm $update_vm_api: every device of the new boot order must exist (config, pending
            # or this write) and not be deleted by it
            m = re.search(r"(?:^|,)order=([^,]+)", params["boot"])
            for dev in split_list(m.group(1)) if m else []:
                exists = dev in vm.config or dev in vm.pending or dev in params
                if not exists or dev in deletes:
                    raise PveError(500, f"invalid bootorder: device '{dev}' does not exist'")
        for k in deletes:
            k = "ide2" if k == "cdrom" else k
            if re.fullmatch(r"unused\d+", k) and k in vm.config:
                # Qemu.pm $update_vm_api: an unused disk is deleted at once, running VM or not
                # (check_protection, then try_deallocate_drive and write_config)
                if vm.config.get("protection") == "1":
                    raise PveError(500, f"can't remove unused disk '{vm.config[k]}' - protection mode enabled")
                self._deallocate(vm, k, vm.config[k], task)
                vm.config.pop(k)
                continue
            if k in vm.pending:
                vm.pending.pop(k)
            if k in vm.config and k not in vm.pending_delete:
                vm.pending_delete.append(k)
        for k, v in params.items():
            if k in ("delete", "digest", "skiplock", "force", "revert", "background_delay", "node", "vmid",
                     "skip_cloud_init", "import-working-storage"):
                continue
            if k == "tags":
                v = normalize_tags(v)
                if not v:
                    if "tags" in vm.config and "tags" not in vm.pending_delete:
                        vm.pending_delete.append("tags")
                    vm.pending.pop("tags", None)
                    continue
            if k == "cipassword":
                v = hash_password(v, vm.config.get("ostype"))
            if re.fullmatch(r"net\d+", k) and not re.match(r"[\w-]+=[0-9A-Fa-f:]{17}(,|$)", v):
                # QemuServer::Network parse_net: a NIC without a MAC gets one (random_ether_addr)
                model, _, rest = v.partition(",")
                v = f"{model.split('=')[0]}={random_mac()}" + (f",{rest}" if rest else "")
            v = self._cloudinit_alloc(vm.vmid, k, v)
            v = self._alloc_disk(vm, k, v, task)
            if k in vm.pending_delete:
                vm.pending_delete.remove(k)
            vm.pending[k] = v
        if not vm.running:
            self._apply_pending(vm)
            return
        for k, v in list(vm.pending.items()):
            m = re.search(r"(?:^|,)bridge=([^,]+)", v) if re.fullmatch(r"net\d+", k) else None
            if m and self._hotpluggable(vm, k, v) and m.group(1) not in self.node_bridges(vm.node):
                # qemu-server vm_deviceplug → PVE::Network tap_plug (pve-common Network.pm
                # $read_bridge_mtu): the NIC is not plugged, the change stays pending
                raise PveError(500, f"hotplug problem - bridge '{m.group(1)}' does not exist")
        nics_before = {k for k in vm.config if re.fullmatch(r"net\d+", k)}
        for k in list(vm.pending_delete):
            if self._hotpluggable(vm, k, None):
                vm.pending_delete.remove(k)
                old = vm.config.pop(k, None)
                if old is not None and DISK_RE.fullmatch(k) and not k.startswith("unused"):
                    self._unused(vm, old)
        for k, v in list(vm.pending.items()):
            if self._hotpluggable(vm, k, v):
                old = vm.config.get(k)
                vm.config[k] = vm.pending.pop(k)
                if old is not None and DISK_RE.fullmatch(k) and not k.startswith("unused") \
                        and old.split(",", 1)[0] != v.split(",", 1)[0]:
                    self._unused(vm, old)
            elif vm.config.get(k) == v:
                vm.pending.pop(k)  # Qemu.pm: "remove pending changes when nothing changed"
        if nics_before != {k for k in vm.config if re.fullmatch(r"net\d+", k)}:
            self.guests.nics_changed(vm)  # a hot-(un)plugged virtio NIC appears in (leaves) the guest
        Generation.bump()

    def _check_config_params(self, params: dict[str, str], user: str) -> None:
        """Qemu.pm $update_vm_api, before any config is read: ``skiplock`` is root's only (an API
        token is not ``root@pam``), nothing to do is an error, ``delete`` names known options."""
        if params.get("skiplock") == "1" and user != "root@pam":
            raise param_error({"skiplock": "Only root may use this option."})
        meta = ("node", "vmid", "digest", "background_delay", "skip_cloud_init", "import-working-storage",
                "skiplock", "delete", "revert", "force")
        if not params.get("delete") and not params.get("revert") and not any(k not in meta for k in params):
            raise PveError(500, "no options specified")
        for k in split_list(params.get("delete", "")):
            k = "ide2" if k == "cdrom" else k
            if k in params:
                raise param_error({"delete": f"you can't use '-{k}' and -delete {k}' at the same time"})
            # QemuServer.pm option_exists: $confdesc, which also has the options json_config_properties
            # leaves out of the API parameters (meta, parent, snaptime, vmstate, running*)
            if self._conf_type(k) is None and k not in self.CONF_ONLY and not re.fullmatch(r"unused\d+", k):
                raise param_error({"delete": f"unknown option '{k}'"})
        # update_vm_api checks sshkeys before the config is loaded (pve-common
        # PVE::Tools::validate_ssh_public_keys)
        cloudinit.validate_ssh_public_keys(params.get("sshkeys"))

    def _check_config_write(self, vm: VM, params: dict[str, str]) -> None:
        # Qemu.pm $load_and_check_config: digest, then PVE::AbstractConfig::check_lock
        digest = params.get("digest")
        if digest and digest != vm.digest():
            raise PveError(500, "checksum mismatch (file change by other user?)")
        self.check_lock(vm, params.get("skiplock") == "1")

    async def put_config(self, node: str, vmid: int, params: dict[str, str], user: str = "root@pam") -> None:
        """``PUT .../config``: synchronous; waits up to 10 s for the flock (HTTP 500 on timeout)."""
        self._check_config_params(params, user)
        vm = self.vm_on(node, vmid)
        # qemu-server API2/Qemu.pm $update_vm_api: "$load_and_check_config->(0); # early checks
        # before forking/locking" - digest and PVE::AbstractConfig::check_lock answer at once (a VM
        # under "lock: clone" is refused "VM is locked (clone)" without waiting for the flock)
        self._check_config_write(vm, params)
        async with self.flock(vmid).hold(vmid, timeout=FLOCK_WAIT_S["config"]):
            vm = self.vm_alive(vm)
            self._check_config_write(vm, params)
            self._apply_config(vm, params)

    async def post_config(self, node: str, vmid: int, params: dict[str, str], user: str,
                          fail: str | None = None) -> str:
        """``POST .../config``: checks now (HTTP errors), applies in a ``qmconfig`` task."""
        self._check_config_params(params, user)
        vm = self.vm_on(node, vmid)
        # Qemu.pm $update_vm_api: the early checks load the config without the flock
        self._check_config_write(vm, params)

        async def run(task: Task) -> None:
            async with self.flock(vmid).hold(vmid, timeout=FLOCK_WAIT_S["config"]):
                await self.task_time("qmconfig")
                v = self.vm_alive(vm)
                self._check_config_write(v, {k: x for k, x in params.items() if k != "digest"})
                task.lines.append(f"update VM {vmid}: " + " ".join(
                    f"-{k} {'<hidden>' if k == 'cipassword' else x}" for k, x in sorted(params.items())
                    if k not in ("node", "vmid", "digest")))
                self._apply_config(v, params, task)

        return self.spawn(node, "qmconfig", vmid, user, TaskPlan(run), fail)

    async def regenerate_cloudinit(self, node: str, vmid: int) -> None:
        """``PUT …/cloudinit`` (``cloudinit_update``): under the flock, after ``check_lock``, regenerate the
        drive if the VM has one (a running VM gets the new medium; its guest reads it at its next boot)."""
        vm = self.vm_on(node, vmid)
        async with self.flock(vmid).hold(vmid, timeout=FLOCK_WAIT_S["config"]):
            vm = self.vm_alive(vm)
            self.check_lock(vm)
            self.apply_cloudinit(vm)

    @staticmethod
    def apply_cloudinit(vm: VM) -> None:
        """``apply_cloudinit_config``: regenerate the drive from the config (no drive: nothing to do)."""
        files = cloudinit.generate(vm.config, vm.vmid)
        if files is None:
            return
        vm.ci_drive = files
        vm.ci_applied = cloudinit.ci_values(vm.config)

    def cloudinit_pending(self, node: str, vmid: int) -> list[dict]:
        vm = self.vm_on(node, vmid)
        return cloudinit.pending(vm.config, vm.ci_applied or {})

    def cloudinit_dump(self, node: str, vmid: int, kind: str) -> str:
        vm = self.vm_on(node, vmid)
        return cloudinit.dump(vm.config, vmid, kind)

    def node_bridges(self, node: str) -> set[str]:
        """The bridges ``node`` has: ``vmbr0`` (:attr:`bridges`) and the SDN VNets its last network
        reload brought up (:meth:`z9.sim.sdn.Sdn.bridges`)."""
        return set(self.bridges) | set(self.sdn.bridges(node))

    def check_bridges(self, vm: VM, task: Task) -> None:
        """At start: QEMU's ``pve-bridge`` script plugs each NIC's tap into its bridge (pve-common
        PVE/Network.pm ``$read_bridge_mtu``: ``bridge '<b>' does not exist``); QEMU exits and the
        start task fails. Every node has ``vmbr0`` and the VNets it reloaded (:meth:`node_bridges`)."""
        have = self.node_bridges(vm.node)
        for k, val in sorted(vm.config.items()):
            if not re.fullmatch(r"net\d+", k):
                continue
            m = re.search(r"(?:^|,)bridge=([^,]+)", val)
            if m and m.group(1) not in have:
                task.lines.append(f"bridge '{m.group(1)}' does not exist")
                task.lines.append(f"kvm: -netdev type=tap,id={k},ifname=tap{vm.vmid}i{k[3:]},"
                                  "script=/usr/libexec/qemu-server/pve-bridge,downscript=/usr/libexec/qemu-server/"
                                  "pve-bridgedown,vhost=on: network script /usr/libexec/qemu-server/pve-bridge "
                                  "failed with status 512")
                raise PveError(500, "start failed: QEMU exited with code 1")

    def check_volumes(self, vm: VM) -> None:
        """At start: every ISO a drive references must exist on a storage the VM's node sees."""
        for k, val in sorted(vm.config.items()):
            if DISK_RE.fullmatch(k) and not k.startswith("unused"):
                volid = val.split(",", 1)[0]
                if re.fullmatch(r"[a-z][a-z0-9\-_.]*[a-z0-9]:iso/.+", volid) and \
                        self.storage.volume(volid, vm.node) is None:
                    raise PveError(500, f"volume '{volid}' does not exist")

    # ---- create / clone / destroy ----------------------------------------------------------------
    def _taken_for_create(self, vmid: int) -> None:
        if vmid in self.vms:
            other = self.vms[vmid]
            raise PveError(500, f"unable to create VM {vmid} - VM {vmid} already exists on node '{other.node}'")

    async def create(self, node: str, params: dict[str, str], user: str, fail: str | None = None) -> str:
        """``POST /nodes/{node}/qemu``: config holds only ``lock: create`` until the task ends."""
        self.check_node(node)
        vmid = int(params["vmid"])
        cloudinit.validate_ssh_public_keys(params.get("sshkeys"))  # create_vm, before the fork
        self._taken_for_create(vmid)
        placeholder = VM(vmid, node, {"lock": "create"})
        self.vms[vmid] = placeholder

        async def run(task: Task) -> None:
            async with self.flock(vmid).hold(vmid, timeout=FLOCK_WAIT_S["create"]):
                await self.task_time("qmcreate")
                self._one_cloudinit({}, {}, params)
                conf: dict[str, str] = {}
                disk_n = 0
                for k, v in params.items():
                    if k in ("node", "vmid", "start", "unique", "archive", "force", "pool", "storage", "live-restore"):
                        continue
                    if DISK_RE.fullmatch(k) and (m := re.fullmatch(r"([\w-]+):(\d+(?:\.\d+)?)(,.*)?", v)):
                        name = f"vm-{vmid}-disk-{disk_n}"
                        disk_n += 1
                        task.lines.append(f"  Logical volume \"{name}\" created.")
                        v = print_drive(f"{m.group(1)}:{name}", m.group(3) or "",
                                        size=format_size(int(float(m.group(2)) * GiB)))
                    if k == "tags":
                        v = normalize_tags(v)
                    conf[k] = self._cloudinit_alloc(vmid, k, v)
                for k, v in list(conf.items()):
                    if re.fullmatch(r"net\d+", k) and not re.match(r"\w+=[0-9A-Fa-f:]{17}", v):
                        model, _, rest = v.partition(",")
                        conf[k] = f"{model.split('=')[0]}={random_mac()}" + (f",{rest}" if rest else "")
                conf.setdefault("smbios1", f"uuid={uuid.uuid4()}")
                conf.setdefault("vmgenid", str(uuid.uuid4()))
                placeholder.config = conf
                placeholder.ci_applied = cloudinit.ci_values(conf)
                if params.get("start") == "1":
                    self.apply_cloudinit(placeholder)
                    placeholder.running, placeholder.started_at = True, time.time()
                    self.guests.power_on(placeholder)

        def cleanup() -> None:
            if self.vms.get(vmid) is placeholder:
                del self.vms[vmid]

        return self.spawn(node, "qmcreate", vmid, user, TaskPlan(run, cleanup), fail)

    async def clone(self, node: str, vmid: int, params: dict[str, str], user: str, fail: str | None = None) -> str:
        """``POST .../clone``: task ``qmclone`` with id = **source** vmid. The target config holds only
        ``lock: clone`` until the task ends, then the source's config (disks renamed
        ``vm-<newid>-disk-N``, new MACs/uuid, new name, tags inherited, ``template`` dropped). Taken
        newid → 500 ``unable to create VM <id>: config file already exists`` (facts: Endpoints)."""
        src = self.vm_on(node, vmid)
        newid = int(params["newid"])
        # qemu-server PVE/API2/Qemu.pm clone_vm: a target naming the local node is no target
        target = params.get("target") or None
        if target in (node, "localhost"):
            target = None
        storage = params.get("storage") or None
        # Qemu.pm clone_vm $load_and_check, run once before fork_worker ("early checks before
        # forking/locking"): every failure below is an HTTP 500/400 and no task is made.
        if target:
            self.check_node(target)
        if storage:
            sdef = self._storage_def(storage)
            if "images" not in sdef.content:
                raise param_error({"storage": f"storage '{storage}' does not support vm images"})
            if target and not sdef.shared:
                raise PveError(500, f"can't clone to non-shared storage '{storage}'")
        self.check_lock(src)
        full = params.get("full", "0" if src.template else "1") == "1"
        if storage and not full:
            raise PveError(500, "parameter 'storage' not allowed for linked clones")
        # Qemu.pm $check_storage_access_clone: any drive (a CD-ROM, the cloud-init drive too) on a
        # storage that is not shared makes the VM "local"; the target storage does not change that
        if target and not self.vm_is_shared(src):
            raise PveError(500, f"can't clone VM to node '{target}' (VM uses local storage)")
        if newid in self.vms:
            raise PveError(500, f"unable to create VM {newid}: config file already exists")
        if not full and not src.template:
            raise PveError(500, "Linked clone feature is not supported for drive 'scsi0'")
        racing = False
        if self.clone_race > 0:
            # PVE's newid check is racy: Qemu.pm clone_vm runs "$load_and_check->(); # early checks
            # before forking/locking" without the target's flock, so two clones to one newid can
            # both pass it and both get a UPID; the second worker to take the flock finds the
            # config file and dies "unable to create VM <newid>: config file already exists". The
            # admin switch (clone_race: n) makes the next n clones lose so, deterministically, to a
            # parallel clone of the same source by another client (root@pam, named race-winner-<id>)
            self.clone_race -= 1
            await self.clone(node, vmid, {"newid": str(newid), "full": "1", "name": f"race-winner-{newid}"},
                             "root@pam")
            racing = True
        # the temporary config "lock: clone" is written by the worker, under the target's flock, on
        # the *source* node and renamed into the target node's directory only when the worker is
        # done (Qemu.pm clone_vm: $load_and_check again, file_set_contents of config_file($newid),
        # then rename to config_file($newid, $target)). Until the worker writes it nothing holds
        # the newid: two clones to one newid sent at once both pass the check above, both get a
        # UPID, and the second worker finds the file: its task fails (no admin switch needed).
        placeholder = VM(newid, node, {"lock": "clone"})

        async def run(task: Task) -> None:
            async with self.flock(vmid).hold(vmid, timeout=FLOCK_WAIT_S["clone"], shared=not src.running):
                async with self.flock(newid).hold(newid, timeout=FLOCK_WAIT_S["clone"]):
                    if racing or self.vms.get(newid, placeholder) is not placeholder:
                        raise PveError(500, f"unable to create VM {newid}: config file already exists")
                    self.vms[newid] = placeholder
                    source = self.vm_alive(src)
                    self.check_lock(source)
                    conf: dict[str, str] = {}
                    disk_n = 0
                    for k, v in sorted(source.config.items()):
                        if k in ("template", "lock") or k.startswith("unused"):
                            continue
                        if DISK_RE.fullmatch(k):
                            volid, _, opts = v.partition(",")
                            if "media=cdrom" in opts and "cloudinit" not in volid:
                                conf[k] = v
                                continue
                            store = volid.split(":", 1)[0]
                            if storage and full:  # Qemu.pm clone_disk: dest_info storage
                                store = storage
                            if "cloudinit" in volid:
                                conf[k] = f"{store}:vm-{newid}-cloudinit" + (f",{opts}" if opts else "")
                                continue
                            name = f"vm-{newid}-disk-{disk_n}"
                            disk_n += 1
                            kind = "full" if full else "linked"
                            task.lines.append(f"create {kind} clone of drive {k} ({volid})")
                            if not full and self._storage_def(store).type != "lvmthin":
                                # the linked clone's volume name as the storage plugin returns it:
                                # pve-storage RBDPlugin.pm clone_image "$basename/$name" (ZFS the
                                # same); LvmThinPlugin.pm clone_image only "$name" — a thin snapshot
                                # of the base LV whose relation the volume id does not track (its
                                # header note: the base may be deleted without affecting the clone)
                                name = f"{volid.split(':', 1)[1]}/{name}"
                            conf[k] = f"{store}:{name}" + (f",{opts}" if opts else "")
                        elif re.fullmatch(r"net\d+", k):
                            model, _, rest = v.partition(",")
                            conf[k] = f"{model.split('=')[0]}={random_mac()}" + (f",{rest}" if rest else "")
                        elif k == "smbios1":
                            conf[k] = re.sub(r"uuid=[^,]+", f"uuid={uuid.uuid4()}", v)
                        elif k == "vmgenid":
                            conf[k] = str(uuid.uuid4())
                        else:
                            conf[k] = v
                    conf["name"] = params.get("name") or f"Copy-of-VM-{source.config.get('name', vmid)}"
                    if params.get("description") is not None:
                        conf["description"] = params["description"]
                    await self.task_time("qmclone")
                    if self.vms.get(newid) is not placeholder:
                        raise PveError(500, f"unable to create VM {newid}: config file already exists")
                    placeholder.config = conf
                    placeholder.ci_applied = cloudinit.ci_values(conf)
                    if target:  # Qemu.pm clone_vm: "Failed to move config to node" - rename at the end
                        placeholder.node = target
                    self.firewall.clone(vmid, newid)
                    self.guests.clone_disk(vmid, newid)

        def cleanup() -> None:
            if self.vms.get(newid) is placeholder:
                del self.vms[newid]

        return self.spawn(node, "qmclone", vmid, user, TaskPlan(run, cleanup), fail)

    def _storage_def(self, sid: str):
        """pve-storage ``storage_check_enabled``: an unknown storage is a 500 naming it."""
        return self.storage.definition(sid)

    def vm_is_shared(self, vm: VM) -> bool:
        """qemu-server API2/Qemu.pm ``$check_storage_access_clone``: every volume the config
        references (disks and CD-ROMs, ``none``/``cdrom`` aside) is on a shared storage."""
        for k, val in vm.config.items():
            if not DISK_RE.fullmatch(k) or k.startswith("unused"):
                continue
            volid = val.split(",", 1)[0]
            if volid in ("none", "cdrom", "") or ":" not in volid:
                continue
            try:
                if not self.storage.definition(volid.split(":", 1)[0]).shared:
                    return False
            except PveError:
                return False
        return True


    async def destroy(self, node: str, vmid: int, params: dict[str, str], user: str,
                      fail: str | None = None) -> str:
        """``DELETE /nodes/{n}/qemu/{vmid}``: running → 500 ``VM <id> is running - destroy failed``;
        during the task the config holds only ``lock: destroyed``; the vmid is free once it ends."""
        vm = self.vm_on(node, vmid)
        if vm.config.get("protection") == "1":
            raise PveError(500, f"can't remove VM {vmid} - protection mode enabled")
        if vm.running:
            raise PveError(500, f"VM {vmid} is running - destroy failed")

        async def run(task: Task) -> None:
            async with self.flock(vmid).hold(vmid, timeout=FLOCK_WAIT_S["destroy"]):
                v = self.vm_alive(vm)
                self.check_lock(v, params.get("skiplock") == "1")
                if v.running:
                    raise PveError(500, f"VM {vmid} is running - destroy failed")
                from .storage import owner_of

                for k, val in sorted(v.config.items()):
                    if DISK_RE.fullmatch(k) and ("media=cdrom" not in val or "cloudinit" in val):
                        volid = val.split(",")[0]
                        name = volid.split(":")[-1]
                        if "cloudinit" not in volid and owner_of(name) not in (None, vmid):
                            # QemuServer.pm destroy_vm $remove_owned_drive: "return if ... ($owner
                            # != $vmid)" - another VM's volume stays on its storage
                            self.storage.orphan_add(volid, v.node, self.volume_size(v, k), vmid)
                            continue
                        self.storage.sizes.pop(volid, None)
                        task.lines.append(f"  Logical volume \"{name}\" successfully removed.")
                if params.get("destroy-unreferenced-disks") == "1":
                    # destroy_vm $purge_unreferenced: every vm-<vmid>-* image of every storage
                    for volid in self.storage.orphans_of(vmid, v.node):
                        self.storage.orphan_pop(volid, v.node)
                        self.storage.sizes.pop(volid, None)
                        task.lines.append(f"  Logical volume \"{volid.split(':')[-1]}\" successfully removed.")
                v.config = {"lock": "destroyed"}
                await self.task_time("qmdestroy")
                if self.vms.get(vmid) is v:
                    del self.vms[vmid]
                    self.firewall.remove(vmid)
                    self.guests.remove(vmid)
                if params.get("purge") == "1":
                    task.lines.append(f"purging VM {vmid} from related configurations..")

        return self.spawn(node, "qmdestroy", vmid, user, TaskPlan(run), fail)

    # ---- power -----------------------------------------------------------------------------------
    async def power(self, node: str, vmid: int, action: str, params: dict[str, str], user: str,
                    fail: str | None = None) -> str:
        """``POST status/start|stop|shutdown`` → UPID. Start on a running VM: the task fails ``VM <id>
        already running``; stop/shutdown of a stopped VM: task OK; templates cannot start."""
        vm = self.vm_on(node, vmid)
        ttype = {"start": "qmstart", "stop": "qmstop", "shutdown": "qmshutdown", "reboot": "qmreboot",
                 "reset": "qmreset", "suspend": "qmsuspend", "resume": "qmresume"}[action]
        if action in ("reboot", "reset") and not vm.running:
            # qemu-server API2/Qemu.pm vm_reboot / vm_reset: `die "VM $vmid not running\n" if
            # !check_running($vmid)` before fork_worker: an HTTP 500, no task
            raise PveError(500, f"VM {vmid} not running")

        async def run(task: Task) -> None:
            async with self.flock(vmid).hold(vmid, timeout=FLOCK_WAIT_S["start"]):
                v = self.vm_alive(vm)
                self.check_lock(v, params.get("skiplock") == "1")
                if action == "start":
                    if v.template:
                        raise PveError(500, "you can't start a vm if it's a template")
                    if v.running:
                        raise PveError(500, f"VM {vmid} already running")
                    self.check_volumes(v)
                    await self.task_time(ttype)
                    self.check_bridges(v, task)
                    self._apply_pending(v)  # QemuServer.pm vm_start_nolock: vmconfig_apply_pending
                    self.apply_cloudinit(v)
                    v.running, v.started_at = True, time.time()
                    self.guests.power_on(v)
                elif action in ("stop", "shutdown"):
                    if not v.running:
                        return
                    await self.task_time(ttype)
                    v.running, v.started_at = False, None
                    self.paused.pop(vmid, None)
                    self.guests.power_off(vmid)
                else:
                    if not v.running:
                        raise PveError(500, f"VM {vmid} not running")
                    await self.task_time(ttype)
                    if action == "reboot":
                        # qemu-server PVE/QemuServer.pm vm_reboot: create_reboot_request, then
                        # _do_vm_stop - the qmreboot task only stops the VM and ends. qmeventd sees
                        # the stop with the reboot request and runs `qm start` in a qmstart task of
                        # its own (root@pam), which starts a new QEMU process (cloud-init and
                        # pending changes apply there): the VM reads "stopped" in between.
                        v.running, v.started_at = False, None
                        self.guests.power_off(vmid)

                        async def qmeventd_start(t: Task) -> None:
                            await asyncio.sleep(self.reboot_gap_s)
                            async with self.flock(vmid).hold(vmid, timeout=FLOCK_WAIT_S["start"]):
                                cur = self.vm_alive(v)
                                if cur.running:
                                    raise PveError(500, f"VM {vmid} already running")
                                self.check_volumes(cur)
                                await self.task_time("qmstart")
                                self._apply_pending(cur)
                                self.apply_cloudinit(cur)
                                cur.running, cur.started_at = True, time.time()
                                self.guests.power_on(cur)

                        self.spawn(v.node, "qmstart", vmid, "root@pam", TaskPlan(qmeventd_start))
                        return
                    elif action == "reset":  # same QEMU process: the guest reboots from the current media
                        self.guests.power_on(v)

        return self.spawn(node, ttype, vmid, user, TaskPlan(run), fail)

    async def resize(self, node: str, vmid: int, params: dict[str, str], user: str,
                     fail: str | None = None, may_allocate: Callable[[str], None] | None = None) -> str:
        """``PUT .../resize`` → ``resize`` task (PVE >= 8.? returns a UPID). ``+5G`` relative, ``20G``
        absolute; shrinking → task error ``shrinking disks is not supported``."""
        vm = self.vm_on(node, vmid)

        async def run(task: Task) -> None:
            async with self.flock(vmid).hold(vmid, timeout=FLOCK_WAIT_S["config"]):
                v = self.vm_alive(vm)
                digest = params.get("digest")
                if digest and digest != v.digest():
                    raise PveError(500, "checksum mismatch (file change by other user?)")
                self.check_lock(v, params.get("skiplock") == "1")
                disk = params["disk"]
                value = v.config.get(disk)
                if value is None:
                    raise PveError(500, f"disk '{disk}' does not exist")
                if "media=cdrom" in value:
                    raise PveError(500, "you can't resize a cdrom")
                if may_allocate is not None and ":" in value.split(",", 1)[0]:
                    may_allocate(value.split(",", 1)[0].split(":", 1)[0])
                m = re.search(r"(?:^|,)size=([^,]+)", value)
                old = parse_size(m.group(1)) if m else 0
                size = params["size"]
                rel = size.startswith("+")
                amount = parse_size(size.lstrip("+"))
                if amount is None:
                    raise PveError(500, f"invalid size '{size}'")
                new = old + amount if rel else amount
                if new < old:
                    raise PveError(500, "shrinking disks is not supported")
                await self.task_time("resize")
                if new == old:
                    return
                task.lines.append(f"  Size of logical volume changed from {format_size(old)} to {format_size(new)}.")
                if m:
                    v.config[disk] = value[:m.start(1)] + format_size(new) + value[m.end(1):]
                else:
                    v.config[disk] = f"{value},size={format_size(new)}"

        return self.spawn(node, "resize", vmid, user, TaskPlan(run), fail)

    # ---- move_disk: reassign to another VM, or move to another storage ----------------------------
    def _check_reassign(self, vmid: int, params: dict[str, str]) -> tuple[VM, VM, str, str]:
        """qemu-server API2/Qemu.pm move_vm_disk ``$load_and_check_reassign_configs`` (run before
        fork_worker, and again in the worker under both config locks): both VMs exist on one node,
        neither locked nor a template, the digests, the source disk exists and has a volume (not a
        CD-ROM), the target key is free, the source VM is stopped unless the disk is ``unusedN``."""
        target_vmid = int(params["target-vmid"])
        disk = params["disk"]
        target_disk = params.get("target-disk") or disk
        if vmid not in self.vms:
            raise PveError(500, f"could not find VM {vmid}")
        if target_vmid not in self.vms:
            raise PveError(500, f"could not find target VM {target_vmid}")
        src, dst = self.vms[vmid], self.vms[target_vmid]
        if src.node != dst.node:
            raise PveError(500, f"Both VMs need to be on the same node ({src.node} != {dst.node})")
        self.check_lock(src)
        self.check_lock(dst)
        if src.template or dst.template:
            raise PveError(500, "Can't move disks from or to template VMs")
        if params.get("digest") and params["digest"] != src.digest():
            raise PveError(500, f"VM {vmid}: checksum mismatch (file change by other user?)")
        if params.get("target-digest") and params["target-digest"] != dst.digest():
            raise PveError(500, f"VM {target_vmid}: checksum mismatch (file change by other user?)")
        if disk not in src.config:
            raise PveError(500, f"Disk '{disk}' for VM '{vmid}' does not exist")
        if target_disk in dst.config:
            raise PveError(500, f"Target disk key '{target_disk}' is already in use for VM '{target_vmid}'")
        value = src.config[disk]
        volid = value.split(",", 1)[0]
        if volid in ("", "none"):
            raise PveError(500, f"disk '{disk}' has no associated volume")
        if "media=cdrom" in value or "cloudinit" in volid:
            raise PveError(500, "CD drive contents can't be moved to another VM")
        if ":" not in volid:
            raise PveError(500, f"Volume '{volid}' not managed by PVE")
        if src.running and not re.fullmatch(r"unused\d+", disk):
            raise PveError(500, "Cannot move disk to another VM while the source VM is running - detach first")
        return src, dst, disk, target_disk

    async def move_disk(self, node: str, vmid: int, params: dict[str, str], user: str,
                        fail: str | None = None) -> str:
        """``POST .../move_disk`` (qemu-server API2/Qemu.pm move_vm_disk, PVE >= 7.2 for
        ``target-vmid``). With ``target-vmid``: a ``qmmove`` task (id ``<vmid>-<disk>><target>-<key>``)
        renames the volume to the target's lowest free ``vm-<target>-disk-<n>`` (PVE::Storage::
        rename_volume -> find_free_diskname; no data is copied), removes the disk from the source's
        config (and its boot order) and writes it to the target: an ``unusedN`` key as the bare
        volume, any other key through $update_vm_api - the drive's options (``serial=``, ``size=``)
        kept, hot-plugged into a running target. With ``storage``: the volume is copied to that
        storage and the old one kept as ``unusedN`` (``delete=1``: freed). Both or neither: 400."""
        has_t, has_s = bool(params.get("target-vmid")), bool(params.get("storage"))
        if has_t and has_s:
            msg = "either set 'storage' or 'target-vmid', but not both"
            raise param_error({"target-vmid": msg, "storage": msg})
        if not has_t and not has_s:
            msg = "both 'storage' and 'target-vmid' missing, either needs to be set"
            raise param_error({"target-vmid": msg, "storage": msg})
        self.vm_on(node, vmid)
        if has_s:
            return await self._move_to_storage(node, vmid, params, user, fail)
        target_vmid = int(params["target-vmid"])
        if target_vmid == vmid:
            raise param_error({"target-vmid": "must be different than source VMID to reassign disk"})
        _, _, disk, target_disk = self._check_reassign(vmid, params)

        async def run(task: Task) -> None:
            async with self.flock(vmid).hold(vmid, timeout=FLOCK_WAIT_S["config"]):
                async with self.flock(target_vmid).hold(target_vmid, timeout=FLOCK_WAIT_S["config"]):
                    src, dst, _, _ = self._check_reassign(vmid, params)
                    task.lines.append(f"reassign disk '{disk}' from VM '{vmid}' as '{target_disk}' to VM '{target_vmid}'")
                    value = src.config[disk]
                    volid, _, opts = value.partition(",")
                    sid, _, volname = volid.partition(":")
                    await self.task_time("qmmove")
                    new_name = self.storage.free_disk_name(sid, src.node, target_vmid)
                    new_volid = f"{sid}:{new_name}"
                    task.lines.append(f"  Renamed \"{volname}\" to \"{new_name}\" in volume group")
                    if volid in self.storage.sizes:
                        self.storage.sizes[new_volid] = self.storage.sizes.pop(volid)
                    m = re.search(r"(?:^|,)size=([^,]+)", value)
                    if m:
                        self.storage.sizes[new_volid] = parse_size(m.group(1)) or 0
                    boot = src.config.get("boot", "")
                    bm = re.search(r"(?:^|,)order=([^,]+)", boot)
                    if bm and disk in split_list(bm.group(1)):
                        task.lines.append(f"removing disk '{disk}' from boot order config")
                        order = ";".join(d for d in split_list(bm.group(1)) if d != disk)
                        src.config["boot"] = boot[:bm.start(1)] + order + boot[bm.end(1):] if order else \
                            re.sub(r"(?:^|,)order=[^,]*", "", boot).strip(",")
                        if not src.config["boot"]:
                            src.config.pop("boot")
                    src.config.pop(disk)
                    task.lines.append(f"removing disk '{disk}' from VM '{vmid}' config")
                    if re.fullmatch(r"unused\d+", target_disk):
                        dst.config[target_disk] = new_volid
                    else:
                        if re.fullmatch(r"unused\d+", disk):  # a bare volume: create_disks sizes it
                            size = self.storage.sizes.get(new_volid)
                            drive = print_drive(new_volid, "", **({"size": format_size(size)} if size else {}))
                        else:
                            drive = print_drive(new_volid, opts)
                        # $update_vm_api (skiplock: under the target's lock already)
                        self._apply_config(dst, {target_disk: drive}, task)
                    Generation.bump()

        tid = f"{vmid}-{disk}>{target_vmid}-{target_disk}"
        return self.spawn(node, "qmmove", tid, user, TaskPlan(run), fail)

    async def _move_to_storage(self, node: str, vmid: int, params: dict[str, str], user: str,
                               fail: str | None) -> str:
        """move_vm_disk with ``storage`` ($load_and_check_move, then $move_updatefn): the disk is
        copied (qemu-img convert, or drive-mirror on a running VM) to a new volume on the target
        storage; the old volume becomes ``unusedN``, or is freed with ``delete=1``."""
        disk, storeid = params["disk"], params["storage"]

        def check() -> VM:
            vm = self.vm_on(node, vmid)
            self.check_lock(vm)
            if params.get("digest") and params["digest"] != vm.digest():
                raise PveError(500, "checksum mismatch (file change by other user?)")
            if disk not in vm.config:
                raise PveError(500, f"disk '{disk}' does not exist")
            value = vm.config[disk]
            if "media=cdrom" in value:
                raise PveError(500, f"you can't move a cdrom")
            sdef = self.storage.definition(storeid)
            if "images" not in sdef.content:
                raise PveError(500, f"storage '{storeid}' does not support content-type 'images'")
            if value.split(",", 1)[0].split(":", 1)[0] == storeid:
                raise PveError(500, f"you can't move to the same storage with same format")
            return vm

        check()

        async def run(task: Task) -> None:
            async with self.flock(vmid).hold(vmid, timeout=FLOCK_WAIT_S["config"]):
                vm = check()
                value = vm.config[disk]
                volid, _, opts = value.partition(",")
                name = self.storage.free_disk_name(storeid, vm.node, vmid)
                task.lines.append(f"create full clone of drive {disk} ({volid})")
                await self.task_time("qmmove")
                vm.config[disk] = f"{storeid}:{name}" + (f",{opts}" if opts else "")
                if params.get("delete") == "1":
                    task.lines.append(f"  Logical volume \"{volid.split(':', 1)[1]}\" successfully removed.")
                else:
                    self._unused(vm, value)

        return self.spawn(node, "qmmove", vmid, user, TaskPlan(run), fail)

    # ---- snapshots -------------------------------------------------------------------------------
    def snapshot_list(self, node: str, vmid: int) -> list[dict]:
        """``GET .../snapshot`` (qemu-server API2/Qemu.pm snapshot_list): one row per snapshot, then
        ``current`` ("You are here!", its parent, running, the config's digest)."""
        vm = self.vm_on(node, vmid)
        rows: list[dict] = []
        for name, d in vm.snapshots.items():
            item = {"name": name, "snaptime": d["snaptime"], "vmstate": 0, "description": d["description"]}
            if d.get("parent"):
                item["parent"] = d["parent"]
            rows.append(item)
        cur: dict[str, Any] = {"name": "current", "digest": vm.digest(), "running": 1 if vm.running else 0,
                               "description": "You are here!"}
        if vm.parent:
            cur["parent"] = vm.parent
        rows.append(cur)
        return rows

    def snapshot_config(self, node: str, vmid: int, name: str) -> dict:
        vm = self.vm_on(node, vmid)
        d = vm.snapshots.get(name)
        if d is None:
            raise PveError(500, f"snapshot '{name}' does not exist")  # AbstractConfig.pm
        # a snapshot section is parsed by the same check_type (QemuServer.pm parse_vm_config)
        return {**{k: self.typed(k, v) for k, v in d["config"].items()}, "snaptime": d["snaptime"],
                "description": d["description"],
                **({"parent": d["parent"]} if d.get("parent") else {})}

    async def snapshot(self, node: str, vmid: int, params: dict[str, str], user: str,
                       fail: str | None = None) -> str:
        """``POST .../snapshot`` (Qemu.pm snapshot; pve-guest-common AbstractConfig.pm snapshot_create):
        ``current``/``pending`` are reserved names (before the task); the ``qmsnapshot`` worker checks
        the lock and the name (``snapshot name '<n>' already used``), holds ``lock: snapshot`` while
        the volumes are snapshotted, then records the section and makes it the current parent. RAM
        (``vmstate``) is not modelled."""
        name = params["snapname"]
        if name == "current":
            raise PveError(500, "unable to use snapshot name 'current' (reserved name)")
        if name.lower() == "pending":
            raise PveError(500, "unable to use snapshot name 'pending' (reserved name)")
        vm = self.vm_on(node, vmid)

        async def run(task: Task) -> None:
            async with self.flock(vmid).hold(vmid, timeout=FLOCK_WAIT_S["config"]):
                v = self.vm_alive(vm)
                self.check_lock(v)
                if name in v.snapshots:
                    raise PveError(500, f"snapshot name '{name}' already used")
                v.config["lock"] = "snapshot"
            try:
                await self.task_time("qmsnapshot")
            finally:
                v.config.pop("lock", None)
            v.snapshots[name] = {"config": {k: x for k, x in v.config.items() if k != "lock"},
                                 "description": params.get("description", ""), "snaptime": int(time.time()),
                                 "parent": v.parent}
            v.parent = name
            Generation.bump()

        return self.spawn(node, "qmsnapshot", vmid, user, TaskPlan(run), fail)

    async def delete_snapshot(self, node: str, vmid: int, name: str, params: dict[str, str], user: str,
                              fail: str | None = None) -> str:
        """``DELETE .../snapshot/{snapname}`` (AbstractConfig.pm snapshot_delete, ``qmdelsnapshot``):
        a missing snapshot fails the task; its children (and the current state) get its parent."""
        vm = self.vm_on(node, vmid)

        async def run(task: Task) -> None:
            async with self.flock(vmid).hold(vmid, timeout=FLOCK_WAIT_S["config"]):
                v = self.vm_alive(vm)
                snap = v.snapshots.get(name)
                if snap is None:
                    raise PveError(500, f"snapshot '{name}' does not exist")
                self.check_lock(v, params.get("force") == "1")
                await self.task_time("qmdelsnapshot")
                for other in v.snapshots.values():
                    if other.get("parent") == name:
                        other["parent"] = snap.get("parent")
                if v.parent == name:
                    v.parent = snap.get("parent")
                del v.snapshots[name]
                Generation.bump()

        return self.spawn(node, "qmdelsnapshot", vmid, user, TaskPlan(run), fail)

    async def rollback(self, node: str, vmid: int, name: str, params: dict[str, str], user: str,
                       fail: str | None = None) -> str:
        """``POST .../snapshot/{snapname}/rollback`` (AbstractConfig.pm snapshot_rollback, ``qmrollback``):
        the VM is stopped, its config is the snapshot's again (its parent the snapshot); ``start=1``
        starts it afterwards."""
        vm = self.vm_on(node, vmid)

        async def run(task: Task) -> None:
            async with self.flock(vmid).hold(vmid, timeout=FLOCK_WAIT_S["config"]):
                v = self.vm_alive(vm)
                snap = v.snapshots.get(name)
                if snap is None:
                    raise PveError(500, f"snapshot '{name}' does not exist")
                self.check_lock(v)
                await self.task_time("qmrollback")
                if v.running:
                    v.running, v.started_at = False, None
                    self.guests.power_off(vmid)
                v.config = dict(snap["config"])
                v.pending, v.pending_delete = {}, []
                v.parent = name
                if params.get("start") == "1":
                    self.apply_cloudinit(v)
                    v.running, v.started_at = True, time.time()
                    self.guests.power_on(v)

        return self.spawn(node, "qmrollback", vmid, user, TaskPlan(run), fail)

    # ---- migrate ---------------------------------------------------------------------------------
    async def migrate(self, node: str, vmid: int, params: dict[str, str], user: str,
                      fail: str | None = None) -> str:
        """``POST .../migrate`` (qemu-server API2/Qemu.pm migrate_vm, PVE/QemuMigrate.pm): checks before
        the task as PVE's migrate_vm (target the local node, unknown node, ``force`` by a token, missing
        config, a lock, a running VM without ``online``), then a ``qmigrate`` task under ``lock:
        migrate`` that copies local disks (offline: always; live: only with ``with-local-disks``) and
        moves the config to the target node. A linked clone's disk on local storage cannot move."""
        target = params.get("target", "")
        if target == node:
            raise param_error({"target": "target is local node."})
        self.check_node(target)
        if params.get("force") == "1" and user != "root@pam":
            raise param_error({"force": "Only root may use this option."})
        vm = self.vm_on(node, vmid)
        self.check_lock(vm)
        online = params.get("online") == "1"
        if vm.running and not online:
            raise PveError(500, "can't migrate running VM without --online")

        async def run(task: Task) -> None:
            async with self.flock(vmid).hold(vmid, timeout=FLOCK_WAIT_S["config"]):
                v = self.vm_alive(vm)
                self.check_lock(v)
                live = v.running
                if not live and online:
                    task.warn("VM isn't running. Doing offline migration instead.")
                task.lines.append(f"starting migration of VM {vmid} to node '{target}' ({storage_ip(self, target)})")
                local = []
                for k, val in sorted(v.config.items()):
                    if not DISK_RE.fullmatch(k):
                        continue
                    volid = val.split(",", 1)[0]
                    if ":" not in volid or volid in ("none", "cdrom"):
                        continue
                    try:
                        shared = self.storage.definition(volid.split(":", 1)[0]).shared
                    except PveError:
                        shared = False
                    if shared:
                        continue
                    volname = volid.split(":", 1)[1]
                    if "/" in volname and volname.startswith("base-"):  # QemuMigrate: linked clone
                        raise PveError(500, f"can't migrate '{volid}' as it's a clone of '{volname.split('/')[0]}'")
                    if "media=cdrom" in val and "cloudinit" not in volid:
                        continue
                    local.append((k, volid))
                if live and local and params.get("with-local-disks") != "1":
                    task.lines.append("ERROR: can't live migrate attached local disks without with-local-disks option")
                    raise PveError(500, "can't migrate VM - check log")
                v.config["lock"] = "migrate"
                try:
                    for k, volid in local:
                        task.lines.append(f"found local disk '{volid}' (attached)")
                    if local:
                        task.lines.append("copying local disk images")
                    await self.task_time("qmigrate")
                    self.vm_alive(v)
                finally:
                    v.config.pop("lock", None)
                v.node = target  # the config file is renamed into the target node's directory
                task.lines.append(f"migration finished successfully (duration 00:00:0{int(self.duration('qmigrate')) % 10})")

        return self.spawn(node, "qmigrate", vmid, user, TaskPlan(run), fail)

    # ---- persistence -----------------------------------------------------------------------------
    def sdn_apply(self, params: dict[str, str], user: str) -> str:
        """``PUT /cluster/sdn`` (pve-network API2/Network/SDN.pm reload): commit everything pending
        (under the lock: a held lock needs its token), release the lock when asked (``release-lock``,
        default 1), then a ``reloadnetworkall`` worker starts one ``srvreload`` task per node (``pvesh
        set /nodes/<n>/network``) and ends without watching them ("FIXME: … monitor the tasks"): a node
        whose reload fails leaves the apply task OK and reports its zones ``pending``."""
        release = str(params.get("release-lock", "1")) not in ("0", "false")
        self.sdn.commit(params.get("lock-token"), release)

        async def run(task: Task) -> None:
            for node in self.nodes:
                task.lines.append(f"{node}: reloading network config")

                async def reload(t: Task, node: str = node) -> None:
                    await self.task_time("srvreload")
                    self.sdn.reload_node(node)

                self.spawn(node, "srvreload", "networking", user, TaskPlan(reload))
            await self.task_time("reloadnetworkall")

        return self.spawn(self.nodes[0], "reloadnetworkall", "", user, TaskPlan(run))

    def dump(self) -> dict:
        """The state file: VMs (with the cloud-init keys of their last regeneration, PVE's
        ``[special:cloudinit]``, and the drive's files), firewall, storage, guests' disks, and what the
        guests' command models share (the kubeadm model's clusters)."""
        def vm_entry(vm: VM) -> dict:
            d = vm.to_json()
            d["ci_applied"] = vm.ci_applied
            if vm.snapshots:
                d["snapshots"], d["parent"] = vm.snapshots, vm.parent
            d["ci_drive"] = None if vm.ci_drive is None else {
                k: base64.b64encode(v).decode() for k, v in vm.ci_drive.items()}
            return d

        return {"vms": [vm_entry(vm) for vm in sorted(self.vms.values(), key=lambda v: v.vmid)
                        if vm.lock not in ("clone", "create", "destroyed")],
                "firewall": self.firewall.dump(), "storage": self.storage.save(), "guests": self.guests.save(),
                "guest_models": self.guests.save_shared()}

    @staticmethod
    def vms_from_dump(data: dict) -> list[VM]:
        vms = []
        for d in data.get("vms", []):
            vm = VM(int(d["vmid"]), d["node"], dict(d["config"]), bool(d.get("running")),
                    time.time() if d.get("running") else None)
            if d.get("ci_applied") is not None:
                vm.ci_applied = dict(d["ci_applied"])
            vm.pending = dict(d.get("pending") or {})
            vm.pending_delete = list(d.get("pending_delete") or [])
            vm.snapshots = dict(d.get("snapshots") or {})
            vm.parent = d.get("parent")
            if d.get("ci_drive") is not None:
                vm.ci_drive = {k: base64.b64decode(v) for k, v in d["ci_drive"].items()}
            vms.append(vm)
        return vms

