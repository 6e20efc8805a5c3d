"""The hypervisor adapter: z9's narrow, domain-level interface to one Proxmox VE cluster.

This is the only module that imports proxmoxer. proxmoxer is synchronous (requests), so every
call runs in a thread of this client's own pool. Every foreign error (proxmoxer's
``ResourceException``, requests' transport errors) is translated into z9's typed errors in
:func:`translate` — the single boundary — following ``shared/design/proxmox-api.md``:

- connection errors and timeouts → :class:`OutcomeUnknown` (temporary; the request may still
  be performed)
- 595/596/502/503/504, config flock timeouts
  (``can't lock file … - got timeout``), ``checksum mismatch`` → :class:`TemporaryError`
- ``VM is locked (<lock>)`` → :class:`VmLocked` (a :class:`Snooze`: waiting on the world)
- ``Configuration file '…' does not exist`` → :class:`VmMissing`
- ``… already exists`` on create/clone → :class:`VmidTaken`
- 400 ``Parameter verification failed.`` and 501 → :class:`PermanentError`
- anything else → :class:`TemporaryError` (retries are safe: every step is idempotent)

Tasks: mutations return a UPID at once; :meth:`ProxmoxClient.wait_task` polls the UPID's node
about once a second until the task has stopped, tolerating a few ``no such task`` answers and
read timeouts, and judges ``exitstatus`` (``OK`` and ``WARNINGS: n`` are success).
"""
from __future__ import annotations

import asyncio
import contextvars
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable
from urllib.parse import urlsplit

import requests
from opentelemetry.trace import SpanKind
from proxmoxer import ProxmoxAPI
from proxmoxer.core import ResourceException

from z9.common import metrics, tracing
from z9.common.errors import PermanentError, Snooze, TemporaryError
from z9.common.settings import RegionSettings
from z9.common.tags import normalize_tags

log = logging.getLogger("z9.proxmox")

UPID_RE = re.compile(
    r"UPID:(?P<node>[a-zA-Z0-9._-]+):(?P<pid>[0-9A-F]{8}):(?P<pstart>[0-9A-F]{8,9}):"
    r"(?P<starttime>[0-9A-F]{8}):(?P<type>[^:]*):(?P<id>[^:]*):(?P<user>[^:]+):"
)


#: Every Proxmox endpoint this adapter calls (``"METHOD /path/template"``, the ``endpoint``
#: argument of ``ProxmoxClient._call``): metric series are pre-created for each.
ENDPOINTS = (
    "GET /cluster/resources", "GET /cluster/nextid",
    "GET /nodes/{node}/qemu/{vmid}/config", "GET /nodes/{node}/qemu/{vmid}/status/current",
    "GET /nodes/{node}/tasks/{upid}/status", "GET /nodes/{node}/tasks/{upid}/log",
    "POST /nodes/{node}/qemu/{vmid}/clone", "POST /nodes/{node}/qemu/{vmid}/config",
    "PUT /nodes/{node}/qemu/{vmid}/resize", "POST /nodes/{node}/qemu/{vmid}/status/start",
    "POST /nodes/{node}/qemu/{vmid}/status/shutdown", "POST /nodes/{node}/qemu/{vmid}/status/stop",
    "DELETE /nodes/{node}/qemu/{vmid}",
    "GET /cluster/firewall/options", "GET /nodes/{node}/qemu/{vmid}/firewall/options",
    "PUT /nodes/{node}/qemu/{vmid}/firewall/options", "POST /nodes/{node}/qemu/{vmid}/firewall/ipset",
    "GET /nodes/{node}/qemu/{vmid}/firewall/ipset/{name}", "POST /nodes/{node}/qemu/{vmid}/firewall/ipset/{name}",
    "DELETE /nodes/{node}/qemu/{vmid}/firewall/ipset/{name}/{cidr}", "PUT /nodes/{node}/qemu/{vmid}/cloudinit",
    "GET /nodes/{node}/storage/{storage}/content", "POST /nodes/{node}/storage/{storage}/upload",
    "DELETE /nodes/{node}/storage/{storage}/content/{volume}", "POST /nodes/{node}/qemu/{vmid}/agent/exec",
    "GET /nodes/{node}/qemu/{vmid}/agent/exec-status",
)


class VmMissing(TemporaryError):
    """The VM's config file does not exist on that node (gone, moved, or never made)."""


class OutcomeUnknown(TemporaryError):
    """The request got no answer (timeout, connection dropped): it may or may not have been
    performed — and may still be (proxmox-api.md, Tasks: "observe again, never send blindly")."""


class VmidTaken(TemporaryError):
    """create/clone found the requested vmid taken (``already exists``): pick another."""


class EntryExists(PermanentError):
    """400 ``… already exists`` from an IP set (the set, or the entry): what was asked is there."""


class EntryMissing(PermanentError):
    """``no such IPSet '<name>'`` (500) or ``no such IP/Network`` (400): it is not there."""


class VmLocked(Snooze):
    """The VM holds a config lock (``clone``, ``backup``, …) set by another task."""


class _TaskFailure:
    """Fields of a failed hypervisor task: its UPID, ``exitstatus`` and last log lines."""

    def __init__(self, message: str, *, upid: str, exitstatus: str, log_tail: list[str]):
        super().__init__(message)  # type: ignore[call-arg]
        self.upid = upid
        self.exitstatus = exitstatus
        self.log_tail = log_tail


class TaskFailed(_TaskFailure, TemporaryError):
    """A hypervisor task stopped with an error ``exitstatus`` that a retry may fix."""


class TaskFailedPermanently(_TaskFailure, PermanentError):
    """A task failure that retrying cannot fix (e.g. ``shrinking disks is not supported``)."""


@dataclass(frozen=True)
class Upid:
    """A parsed UPID (pve-common ``UPID.pm``): node, pid, pstart, starttime, type, id, user."""

    raw: str
    node: str
    type: str
    id: str
    user: str

    @classmethod
    def parse(cls, raw: str) -> "Upid":
        """Raises PermanentError when ``raw`` is not a UPID."""
        m = UPID_RE.fullmatch(raw or "")
        if not m:
            raise PermanentError(f"not a UPID: {raw!r}")
        return cls(raw, m["node"], m["type"], m["id"], m["user"])


@dataclass(frozen=True)
class VmRef:
    """One entry of ``/cluster/resources?type=vm``. ``tags`` and ``lock`` are fresh; ``name``
    and ``status`` come from a stats cache that lags ~10 s (proxmox-api.md)."""

    vmid: int
    node: str
    name: str | None
    status: str | None
    tags: frozenset[str]
    lock: str | None
    template: bool


@dataclass(frozen=True)
class VmState:
    """A VM read on its node: config (with ``digest``), fresh tags, lock and power status."""

    vmid: int
    node: str
    config: dict[str, Any]
    status: str  # running | stopped
    tags: frozenset[str] = field(default_factory=frozenset)

    @property
    def lock(self) -> str | None:
        return self.config.get("lock")

    @property
    def running(self) -> bool:
        return self.status == "running"


_LOCK_TIMEOUT = re.compile(r"can't lock file '[^']*' - got timeout")
_VM_LOCKED = re.compile(r"VM is locked \((?P<lock>[a-z-]+)\)")
_MISSING = re.compile(r"Configuration file '[^']*' does not exist")
_TAKEN = re.compile(r"already exists")
_IPSET_EXISTS = re.compile(r"(address '[^']*'|IPSet '[^']*') already exists")
_IPSET_MISSING = re.compile(r"no such IPSet '[^']*'|no such IP/Network")


def translate(exc: BaseException, what: str) -> Exception:
    """Map a proxmoxer/requests exception raised while doing ``what`` to a z9 error.

    This is the single place where foreign hypervisor errors become TemporaryError,
    PermanentError or Snooze (see the module docstring for the table).
    """
    if isinstance(exc, ResourceException):
        status = exc.status_code
        reason = str(exc.content or exc.status_message or "")
        errors = exc.errors
        msg = f"{what}: {status} {reason}" + (f" {errors}" if errors else "")
        m = _VM_LOCKED.search(reason)
        if m:
            return VmLocked(msg)
        if _LOCK_TIMEOUT.search(reason):
            return TemporaryError(msg)
        if status in (400, 500) and _IPSET_EXISTS.search(msg):
            return EntryExists(msg)
        if status in (400, 500) and _IPSET_MISSING.search(msg):
            return EntryMissing(msg)
        if status == 400:
            return PermanentError(msg)
        if status in (401, 403):
            return TemporaryError(msg + " (check the region's API token and its permissions)")
        if status == 501:
            return PermanentError(msg)
        if _TAKEN.search(reason):
            return VmidTaken(msg)
        if _MISSING.search(reason):
            return VmMissing(msg)
        return TemporaryError(msg)
    if isinstance(exc, (requests.Timeout, TimeoutError)):
        return OutcomeUnknown(f"{what}: timed out ({exc.__class__.__name__})")
    if isinstance(exc, (requests.ConnectionError, ConnectionError, OSError)):
        return OutcomeUnknown(f"{what}: connection failed ({exc.__class__.__name__}: {exc})")
    if isinstance(exc, requests.RequestException):
        return TemporaryError(f"{what}: {exc.__class__.__name__}: {exc}")
    return TemporaryError(f"{what}: unexpected {exc.__class__.__name__}: {exc}")


def _bool(v: bool) -> int:
    # Proxmox booleans are 1/0; Python True would be sent as 'True' and rejected (JSONSchema.pm).
    return 1 if v else 0


class ProxmoxClient:
    """Async, domain-level client of one region's Proxmox VE API.

    Every method raises only z9 errors (TemporaryError — OutcomeUnknown when the request got
    no answer —, PermanentError, Snooze subclasses). ``max_threads`` bounds concurrent requests.
    """

    def __init__(self, region: str, settings: RegionSettings, *, max_threads: int = 32):
        self.region = region
        self.settings = settings
        url = urlsplit(settings.url)
        user, _, token_name = settings.token_id.partition("!")
        self._api = ProxmoxAPI(
            url.hostname,
            port=url.port or 8006,
            user=user,
            token_name=token_name,
            token_value=settings.token_secret.get_secret_value(),
            verify_ssl=settings.verify_ssl,
            timeout=settings.request_timeout_s,
            service="PVE",
        )
        self._pool = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix=f"pve-{region}")
        metrics.init_proxmox(region, ENDPOINTS)

    def close(self) -> None:
        """Stop the client's threads (requests in flight finish in the background)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _call(self, endpoint: str, what: str, fn: Callable[[], Any]) -> Any:
        """Run one proxmoxer call in this client's thread pool; translate its errors.
        ``endpoint`` is ``"METHOD /path/template"`` (one of :data:`ENDPOINTS`; logs, the
        ``z9_proxmox_request*`` metrics and the call's span name)."""
        loop = asyncio.get_running_loop()
        method, _, path = endpoint.partition(" ")
        with metrics.proxmox_request(self.region, endpoint), \
                tracing.span(endpoint, {"http.request.method": method, "url.template": path, "z9.region": self.region},
                             kind=SpanKind.CLIENT) as span:
            try:
                # In a copy of this context, so the thread sees this call's span as current.
                result = await loop.run_in_executor(self._pool, contextvars.copy_context().run, fn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # translated at this single boundary
                log.debug("%s (%s) failed: %r", what, endpoint, exc)
                if isinstance(exc, ResourceException):
                    span.set_attribute("http.response.status_code", exc.status_code)
                raise translate(exc, what) from exc
            span.set_attribute("http.response.status_code", 200)  # proxmoxer raises on any status >= 400
            return result

    # ------------------------------------------------------------------ reads

    async def list_vms(self) -> list[VmRef]:
        """``GET /cluster/resources?type=vm`` → every VM and template of the cluster (a list of
        :class:`VmRef`)."""
        rows = await self._call("GET /cluster/resources", "list VMs",
                                lambda: self._api.cluster.resources.get(type="vm"))
        out = []
        for r in rows or []:
            if r.get("type") not in (None, "qemu"):
                continue
            out.append(VmRef(
                vmid=int(r["vmid"]), node=r["node"], name=r.get("name"), status=r.get("status"),
                tags=normalize_tags(r.get("tags")), lock=r.get("lock") or None,
                template=bool(int(r.get("template") or 0)),
            ))
        return out

    async def find_by_tag(self, tag: str) -> list[VmRef]:
        """Every VM carrying ``tag`` (tags compared as normalised sets)."""
        tag = tag.lower()
        return [v for v in await self.list_vms() if tag in v.tags]

    async def vm_state(self, node: str, vmid: int) -> VmState | None:
        """Config and power status of VM ``vmid`` on ``node``; None when its config does not
        exist there."""
        try:
            cfg = await self._call("GET /nodes/{node}/qemu/{vmid}/config", f"read config of VM {vmid}",
                                   lambda: self._api.nodes(node).qemu(vmid).config.get())
            st = await self._call("GET /nodes/{node}/qemu/{vmid}/status/current",
                                  f"read status of VM {vmid}",
                                  lambda: self._api.nodes(node).qemu(vmid).status.current.get())
        except VmMissing:
            return None
        cfg = dict(cfg or {})
        return VmState(vmid=vmid, node=node, config=cfg, status=(st or {}).get("status", "unknown"),
                       tags=normalize_tags(cfg.get("tags")))

    async def next_id(self) -> int:
        """``GET /cluster/nextid``: the lowest free vmid ≥ 100 (a string on the wire; reserves
        nothing, so a clone may still find it taken)."""
        v = await self._call("GET /cluster/nextid", "get next free vmid",
                             lambda: self._api.cluster.nextid.get())
        return int(v)

    async def task_status(self, node: str, upid: str) -> dict[str, Any]:
        """``GET /nodes/{node}/tasks/{upid}/status`` → ``{status: running|stopped, exitstatus?, …}``;
        an unknown UPID raises PermanentError (400 ``no such task``)."""
        return await self._call("GET /nodes/{node}/tasks/{upid}/status", f"read task {upid}",
                                lambda: self._api.nodes(node).tasks(upid).status.get())

    async def task_log_tail(self, node: str, upid: str, lines: int = 20) -> list[str]:
        """The last ``lines`` lines of a task's log (best effort: [] when unreadable)."""
        try:
            rows = await self._call("GET /nodes/{node}/tasks/{upid}/log", f"read log of task {upid}",
                                    lambda: self._api.nodes(node).tasks(upid).log.get(start=0, limit=500))
        except (TemporaryError, PermanentError):
            return []
        return [str(r.get("t", "")) for r in (rows or [])][-lines:]

    # ------------------------------------------------------------------ mutations (return UPIDs)

    async def clone(self, node: str, template_vmid: int, *, newid: int, name: str,
                    description: str) -> str:
        """Full clone of ``template_vmid`` to ``newid`` on the same node → UPID. The target holds
        ``lock: clone`` until the task ends and inherits the source's tags. Raises VmidTaken
        (``config file already exists``), OutcomeUnknown (no answer: it may have happened)."""
        return await self._call(
            "POST /nodes/{node}/qemu/{vmid}/clone", f"clone VM {template_vmid} to {newid}",
            lambda: self._api.nodes(node).qemu(template_vmid).clone.post(
                newid=newid, name=name, description=description, full=_bool(True)))

    async def configure(self, node: str, vmid: int, params: dict[str, Any], *, digest: str | None) -> str:
        """``POST …/config`` (asynchronous: returns a ``qmconfig`` UPID). ``digest`` makes the write
        fail with ``checksum mismatch`` if the config changed since it was read."""
        data = dict(params)
        if digest:
            data["digest"] = digest
        return await self._call("POST /nodes/{node}/qemu/{vmid}/config", f"configure VM {vmid}",
                                lambda: self._api.nodes(node).qemu(vmid).config.post(**data))

    async def resize(self, node: str, vmid: int, disk: str, size_gib: int) -> str | None:
        """``PUT …/resize`` to an absolute ``size_gib`` GiB; returns the task's UPID (PVE ≥ 8)."""
        return await self._call("PUT /nodes/{node}/qemu/{vmid}/resize", f"resize {disk} of VM {vmid}",
                                lambda: self._api.nodes(node).qemu(vmid).resize.put(disk=disk, size=f"{size_gib}G"))

    async def start(self, node: str, vmid: int) -> str:
        """``POST …/status/start`` → UPID. On a running VM the *task* fails (``already running``)."""
        return await self._call("POST /nodes/{node}/qemu/{vmid}/status/start", f"start VM {vmid}",
                                lambda: self._api.nodes(node).qemu(vmid).status.start.post())

    async def shutdown(self, node: str, vmid: int, *, timeout_s: int = 60) -> str:
        """ACPI shutdown, forced off after ``timeout_s`` seconds (``forceStop=1``)."""
        return await self._call("POST /nodes/{node}/qemu/{vmid}/status/shutdown", f"shut down VM {vmid}",
                                lambda: self._api.nodes(node).qemu(vmid).status.shutdown.post(
                                    timeout=timeout_s, forceStop=_bool(True)))

    async def stop(self, node: str, vmid: int) -> str:
        """``POST …/status/stop`` (hard stop) → UPID; a no-op task on a stopped VM."""
        return await self._call("POST /nodes/{node}/qemu/{vmid}/status/stop", f"stop VM {vmid}",
                                lambda: self._api.nodes(node).qemu(vmid).status.stop.post())

    async def destroy(self, node: str, vmid: int) -> str:
        """``DELETE /nodes/{node}/qemu/{vmid}`` with ``purge=1`` and
        ``destroy-unreferenced-disks=1``. A running VM is refused (``VM n is running``)."""
        return await self._call("DELETE /nodes/{node}/qemu/{vmid}", f"destroy VM {vmid}",
                                lambda: self._api.nodes(node).qemu(vmid).delete(
                                    **{"purge": 1, "destroy-unreferenced-disks": 1}))

    # ------------------------------------------------------------------ firewall, IP sets, cloud-init

    async def cluster_firewall_options(self) -> dict[str, Any]:
        """``GET /cluster/firewall/options`` (``enable`` 0/1 …): whether the datacenter firewall,
        and so any VM's IP filter, is in force at all."""
        return dict(await self._call("GET /cluster/firewall/options", "read cluster firewall options",
                                     lambda: self._api.cluster.firewall.options.get()) or {})

    async def firewall_options(self, node: str, vmid: int) -> dict[str, Any]:
        """``GET …/firewall/options`` of VM ``vmid`` (``enable``, ``ipfilter`` …, 0/1)."""
        return dict(await self._call("GET /nodes/{node}/qemu/{vmid}/firewall/options",
                                     f"read firewall options of VM {vmid}",
                                     lambda: self._api.nodes(node).qemu(vmid).firewall.options.get()) or {})

    async def set_firewall_options(self, node: str, vmid: int, **options: bool) -> None:
        """``PUT …/firewall/options`` (booleans sent as 1/0)."""
        data = {k: _bool(v) for k, v in options.items()}
        await self._call("PUT /nodes/{node}/qemu/{vmid}/firewall/options", f"set firewall options of VM {vmid}",
                         lambda: self._api.nodes(node).qemu(vmid).firewall.options.put(**data))

    async def ipset_entries(self, node: str, vmid: int, name: str) -> list[dict[str, Any]] | None:
        """The entries (``{cidr, comment?, nomatch?}``) of VM ``vmid``'s IP set ``name``; None
        when the set does not exist."""
        try:
            rows = await self._call("GET /nodes/{node}/qemu/{vmid}/firewall/ipset/{name}",
                                    f"read IP set {name} of VM {vmid}",
                                    lambda: self._api.nodes(node).qemu(vmid).firewall.ipset(name).get())
        except EntryMissing:
            return None
        return [dict(r) for r in rows or []]

    async def ipset_create(self, node: str, vmid: int, name: str, *, comment: str) -> bool:
        """Create IP set ``name`` on VM ``vmid``; False when it already existed."""
        try:
            await self._call("POST /nodes/{node}/qemu/{vmid}/firewall/ipset", f"create IP set {name} of VM {vmid}",
                             lambda: self._api.nodes(node).qemu(vmid).firewall.ipset.post(name=name, comment=comment))
        except EntryExists:
            return False
        return True

    async def ipset_add(self, node: str, vmid: int, name: str, cidr: str, *, comment: str) -> bool:
        """Add ``cidr`` to IP set ``name`` of VM ``vmid``; False when it was there already."""
        try:
            await self._call("POST /nodes/{node}/qemu/{vmid}/firewall/ipset/{name}",
                             f"add {cidr} to IP set {name} of VM {vmid}",
                             lambda: self._api.nodes(node).qemu(vmid).firewall.ipset(name).post(
                                 cidr=cidr, comment=comment))
        except EntryExists:
            return False
        return True

    async def ipset_remove(self, node: str, vmid: int, name: str, cidr: str) -> None:
        """Remove ``cidr`` from IP set ``name`` of VM ``vmid`` (absent entry or set: done)."""
        try:
            await self._call("DELETE /nodes/{node}/qemu/{vmid}/firewall/ipset/{name}/{cidr}",
                             f"remove {cidr} from IP set {name} of VM {vmid}",
                             lambda: self._api.nodes(node).qemu(vmid).firewall.ipset(name)(cidr).delete())
        except EntryMissing:
            return

    async def cloudinit_regenerate(self, node: str, vmid: int) -> None:
        """``PUT …/cloudinit``: rebuild the cloud-init drive from the config now (the guest
        reads it at its next boot)."""
        await self._call("PUT /nodes/{node}/qemu/{vmid}/cloudinit", f"regenerate cloud-init drive of VM {vmid}",
                         lambda: self._api.nodes(node).qemu(vmid).cloudinit.put())

    # ------------------------------------------------------------------ storage (bootstrap ISOs)

    async def storage_isos(self, node: str, storage: str) -> list[str]:
        """The volids of the ISO images ``node`` sees on ``storage``."""
        rows = await self._call("GET /nodes/{node}/storage/{storage}/content", f"list ISOs on {storage}",
                                lambda: self._api.nodes(node).storage(storage).content.get(content="iso"))
        return [str(r.get("volid")) for r in rows or []]

    async def upload_iso(self, node: str, storage: str, filename: str, data: bytes) -> str:
        """``POST …/storage/{storage}/upload`` (multipart, ``content=iso``) with its SHA-256 checksum:
        the ``imgcopy`` task verifies it (``checksum mismatch``) before the file exists. Returns the
        task's UPID (it names the node that received the upload)."""
        import hashlib
        import io

        digest = hashlib.sha256(data).hexdigest()

        def send() -> Any:
            f = io.BytesIO(data)
            f.name = filename
            return self._api.nodes(node).storage(storage).upload.post(
                content="iso", filename=f, checksum=digest, **{"checksum-algorithm": "sha256"})

        return await self._call("POST /nodes/{node}/storage/{storage}/upload", f"upload {filename} to {storage}", send)

    async def delete_volume(self, node: str, storage: str, volid: str) -> str | None:
        """``DELETE …/storage/{storage}/content/{volume}`` → the ``imgdel`` UPID (or None)."""
        return await self._call("DELETE /nodes/{node}/storage/{storage}/content/{volume}", f"delete {volid}",
                                lambda: self._api.nodes(node).storage(storage).content(volid).delete())

    # ------------------------------------------------------------------ the guest agent

    async def agent_exec(self, node: str, vmid: int, argv: list[str], *, timeout_s: float = 60.0,
                         poll_s: float = 0.2) -> tuple[int, str, str]:
        """Run ``argv`` in the guest (``agent/exec``, then ``agent/exec-status`` until it exited):
        ``(exitcode, stdout, stderr)``. Raises TemporaryError while the agent does not answer
        (booting: ``QEMU guest agent is not running``) or when the command outlives ``timeout_s``."""
        res = await self._call("POST /nodes/{node}/qemu/{vmid}/agent/exec", f"exec {argv[0]} in VM {vmid}",
                               lambda: self._api.nodes(node).qemu(vmid).agent.exec.post(command=list(argv)))
        pid = int(res["pid"])
        deadline = time.monotonic() + timeout_s
        while True:
            st = await self._call("GET /nodes/{node}/qemu/{vmid}/agent/exec-status", f"exec-status in VM {vmid}",
                                  lambda: self._api.nodes(node).qemu(vmid).agent("exec-status").get(pid=pid))
            if int(st.get("exited") or 0):
                return int(st.get("exitcode", -1)), str(st.get("out-data") or ""), str(st.get("err-data") or "")
            if time.monotonic() > deadline:
                raise TemporaryError(f"{argv[0]} in VM {vmid} still running after {timeout_s:.0f}s")
            await asyncio.sleep(poll_s)

    # ------------------------------------------------------------------ the task waiter

    async def wait_task(self, upid: str, *, deadline_s: float, poll_s: float = 1.0,
                        on_poll: Callable[[], Awaitable[None]] | None = None,
                        max_unknown: int = 5) -> str:
        """Wait until task ``upid`` has stopped; return its ``exitstatus`` (``OK`` or
        ``WARNINGS: n``).

        Polls ``/nodes/<node of the UPID>/tasks/<upid>/status`` every ``poll_s`` seconds. Up to
        ``max_unknown`` consecutive ``no such task`` answers (normal right after the POST) and
        any number of read timeouts or connection errors are tolerated: the task's fate is
        unknown, not failed. ``on_poll`` runs after each poll the node answered with the task
        still running (the caller counts that as progress and keeps its lease).

        Raises TaskFailed (temporary) or TaskFailedPermanently with the log's last lines when
        the task stopped with an error; TemporaryError when ``deadline_s`` seconds pass with the
        task still running (the caller keeps the UPID and waits on it again next attempt — never
        starts the task a second time). The wait is timed in ``z9_proxmox_task_wait_seconds``.
        """
        up = Upid.parse(upid)
        with metrics.proxmox_task_wait(self.region, up.type) as wait:
            return wait.exitstatus(await self._poll_task(up, deadline_s, poll_s, on_poll, max_unknown, wait))

    async def _poll_task(self, up: Upid, deadline_s: float, poll_s: float,
                         on_poll: Callable[[], Awaitable[None]] | None, max_unknown: int,
                         wait: metrics.TaskWait) -> str:
        """The polling loop of :meth:`wait_task`; sets ``wait.outcome`` on a failed task or the
        deadline."""
        upid = up.raw
        deadline = time.monotonic() + deadline_s
        unknown = 0
        while True:
            try:
                st = await self.task_status(up.node, upid)
                unknown = 0
            except PermanentError as e:
                if "no such task" not in str(e):
                    raise
                unknown += 1
                if unknown > max_unknown:
                    raise TemporaryError(f"task {upid}: node {up.node} keeps answering 'no such task'") from e
                st = None
            except TemporaryError as e:
                log.info("task %s: status unknown (%s); polling again", upid, e)
                st = None
            if st and st.get("status") == "stopped":
                exitstatus = str(st.get("exitstatus") or "unexpected status")
                if exitstatus == "OK" or exitstatus.startswith("WARNINGS:"):
                    return exitstatus
                wait.outcome = "failed"
                tail = await self.task_log_tail(up.node, upid)
                raise task_failure(upid, up.type, exitstatus, tail)
            if st and on_poll is not None:  # progress only when the node answered for the task
                await on_poll()
            if time.monotonic() >= deadline:
                wait.outcome = "deadline"
                raise TemporaryError(
                    f"task {upid} still running after {deadline_s:.0f}s; will wait on the same task again")
            await asyncio.sleep(poll_s)


def task_failure(upid: str, task_type: str, exitstatus: str, tail: list[str]) -> TaskFailed | TaskFailedPermanently:
    """Classify a failed task by its ``exitstatus``: lock timeouts, a locked VM and a dead worker
    (``unexpected status``) are temporary; so is any other failure by default, because every
    step is idempotent and attempts are bounded."""
    msg = f"task {task_type} ({upid}) failed: {exitstatus}"
    if _VM_LOCKED.search(exitstatus):
        return TaskFailed(msg, upid=upid, exitstatus=exitstatus, log_tail=tail)
    if "shrinking disks is not supported" in exitstatus:
        return TaskFailedPermanently(msg, upid=upid, exitstatus=exitstatus, log_tail=tail)
    return TaskFailed(msg, upid=upid, exitstatus=exitstatus, log_tail=tail)
