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
- ``can't clone VM to node '…' (VM uses local storage)`` → :class:`CloneNeedsSharedStorage`
- ``Configuration file '…' does not exist`` → :class:`VmMissing`
- ``… already exists`` on create/clone → :class:`VmidTaken`
- 400 ``Parameter verification failed.`` and 501 → :class:`PermanentError`
- 403 ``Permission check failed (<path>, <privilege>)`` → :class:`MissingPrivilege` (permanent,
  naming the privilege; also as a task's exitstatus)
- anything else → :class:`TemporaryError` (retries are safe: every step is idempotent)

Tasks: mutations return a UPID at once; :meth:`ProxmoxClient.wait_task` polls the UPID's node
— first after about as long as that type of task took lately (at least ``task_poll_s``), then
about once a second — until the task has stopped, tolerating a few ``no such task`` answers and
read timeouts, and judges ``exitstatus`` (``OK`` and ``WARNINGS: n`` are success).
"""
from __future__ import annotations

import asyncio
import contextvars
import logging
import random
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable
from urllib.parse import urlsplit

import requests
from opentelemetry.trace import SpanKind
import orjson
from proxmoxer import ProxmoxAPI
from proxmoxer.core import ResourceException

from z9 import resources
from z9.common import metrics, tracing
from z9.common.errors import PermanentError, TemporaryError
from z9.common.settings import RegionSettings
from z9.common.tags import normalize_tags

# the adapter's answers and errors, and the cluster view, live beside it (imported here: what
# the adapter raises and returns is importable from it as before)
from .cluster_view import ClusterSnapshot, ClusterView  # noqa: F401
from . import lease_deadline
from .lease_deadline import LeaseHeaderAdapter
from .pve_types import (AgentUnavailable, CloneNeedsSharedStorage, DigestMismatch, EntryExists, EntryMissing,  # noqa: F401
                        ExecStatusLost,
                        MissingPrivilege, OutcomeUnknown, TaskFailed, TaskFailedPermanently, Upid, VmidTaken,
                        VmLocked, VmMissing, VmRef, VmState)

log = logging.getLogger("z9.proxmox")



#: Every Proxmox endpoint this adapter calls (``"METHOD /path/template"``, the ``endpoint``
#: argument of ``ProxmoxClient._call``): metric series are pre-created for each.
ENDPOINTS = (
    "GET /cluster/resources", "GET /cluster/nextid",
    "GET /nodes/{node}/qemu/{vmid}/config", "GET /nodes/{node}/qemu/{vmid}/status/current",
    "GET /nodes/{node}/tasks/{upid}/status", "GET /nodes/{node}/tasks/{upid}/log",
    "POST /nodes/{node}/qemu/{vmid}/clone", "POST /nodes/{node}/qemu/{vmid}/config",
    "PUT /nodes/{node}/qemu/{vmid}/config",
    "PUT /nodes/{node}/qemu/{vmid}/resize", "POST /nodes/{node}/qemu/{vmid}/status/start",
    "POST /nodes/{node}/qemu/{vmid}/status/shutdown", "POST /nodes/{node}/qemu/{vmid}/status/stop",
    "POST /nodes/{node}/qemu/{vmid}/status/reboot", "POST /nodes/{node}/qemu/{vmid}/migrate",
    "GET /nodes/{node}/qemu/{vmid}/pending",
    "DELETE /nodes/{node}/qemu/{vmid}",
    "GET /cluster/firewall/options", "GET /nodes/{node}/qemu/{vmid}/firewall/options",
    "PUT /nodes/{node}/qemu/{vmid}/firewall/options", "POST /nodes/{node}/qemu/{vmid}/firewall/ipset",
    "GET /nodes/{node}/qemu/{vmid}/firewall/ipset/{name}", "POST /nodes/{node}/qemu/{vmid}/firewall/ipset/{name}",
    "DELETE /nodes/{node}/qemu/{vmid}/firewall/ipset/{name}/{cidr}", "PUT /nodes/{node}/qemu/{vmid}/cloudinit",
    "GET /nodes", "POST /nodes/{node}/qemu/{vmid}/agent/ping", "POST /nodes/{node}/qemu/{vmid}/agent/exec",
    "GET /nodes/{node}/qemu/{vmid}/agent/exec-status", "GET /nodes/{node}/qemu/{vmid}/agent/file-read",
    "POST /nodes/{node}/qemu/{vmid}/agent/file-write", "GET /nodes/{node}/qemu/{vmid}/agent/network-get-interfaces",
    "GET /nodes/{node}/storage/{storage}/content", "POST /nodes/{node}/storage/{storage}/upload",
    "DELETE /nodes/{node}/storage/{storage}/content/{volume}",
    "GET /nodes/{node}/qemu/{vmid}/cloudinit/dump", "GET /nodes/{node}/qemu/{vmid}/cloudinit",
    "GET /nodes/{node}/qemu/{vmid}/agent/get-host-name", "GET /nodes/{node}/storage",
    "GET /nodes/{node}/qemu/{vmid}/firewall/rules", "POST /nodes/{node}/qemu/{vmid}/firewall/rules",
    "DELETE /nodes/{node}/qemu/{vmid}/firewall/rules/{pos}", "DELETE /nodes/{node}/qemu/{vmid}/firewall/ipset/{name}",
)


#: the longest wait before a task's first status poll (seconds)
FIRST_POLL_MAX_S = 5.0

#: vmids are handed out per process in lanes (vmid mod VMID_LANES), see ProxmoxClient.pick_vmid.
VMID_LANES = 32
VMID_ASKED_TTL_S = 300.0
#: how long a ``/cluster/nextid`` answer serves as the floor of pick_vmid (seconds): it is only the
#: floor (the candidates above it are checked against the shared snapshot and a clone to a taken id
#: is refused, a definite answer), so one request a process per this long, not one per create
NEXTID_TTL_S = 30.0
VMID_MAX = 999_999_999


_LOCK_TIMEOUT = re.compile(r"can't lock file '[^']*' - got timeout")
_VM_LOCKED = re.compile(r"VM is locked \((?P<lock>[a-z-]+)\)")
_MISSING = re.compile(r"Configuration file '[^']*' does not exist")
_PERMISSION = re.compile(r"Permission check failed \(")
_LOCAL_CLONE = re.compile(r"can't clone VM to node '[^']*' \(VM uses local storage\)")
_TAKEN = re.compile(r"already exists")
_IPSET_EXISTS = re.compile(r"(address '[^']*'|IPSet '[^']*') already exists")
_IPSET_MISSING = re.compile(r"no such IPSet '[^']*'|no such IP/Network")
_MODIFIED = re.compile(r"detected modified configuration - file changed by other user\? Try again\.")


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
        if _LOCAL_CLONE.search(reason):
            return CloneNeedsSharedStorage(msg)
        if _LOCK_TIMEOUT.search(reason):
            return TemporaryError(msg)
        if _MODIFIED.search(reason):
            return DigestMismatch(msg)
        if status in (400, 500) and _IPSET_EXISTS.search(msg):
            return EntryExists(msg)
        if status in (400, 500) and _IPSET_MISSING.search(msg):
            return EntryMissing(msg)
        if status == 400:
            return PermanentError(msg)
        if status == 403 or _PERMISSION.search(reason):
            # pve-access-control RPCEnvironment.pm raise_perm_exc: the token lacks a privilege — no
            # retry grants it (README, operator section: the privileges z9's token needs)
            return MissingPrivilege(f"{what}: the region's API token lacks a privilege: {reason} "
                                    "(README: the privileges z9's Proxmox token needs)")
        if status == 401:
            return TemporaryError(msg + " (check the region's API token)")
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


#: how often one guest-agent call is tried when it fails in passing (ProxmoxClient._agent)
AGENT_TRIES = 5
#: how often ProxmoxClient.agent_exec runs a command again whose outcome was lost
RUN_AGAIN = 3
#: the guest agent did not answer this once ("QEMU guest agent is not running": qemu-server's QMP
#: timeout or an agent restarting) — unlike "No QEMU guest agent configured" or a stopped VM
_AGENT_NOT_RUNNING = re.compile(r"QEMU guest agent is not running")

#: how often one Proxmox call is tried when it fails transiently (not performed), and the backoff
CALL_TRIES = 4
CALL_BACKOFF_S = 0.25
CALL_BACKOFF_CAP_S = 2.0
_NOT_PERFORMED = (502, 503, 504, 595, 596)


def retryable(err: TemporaryError, method: str) -> bool:
    """Whether a call that raised ``err`` may be sent again at once: PVE (or pveproxy in front
    of it) answered that it did not do it — 502/503/504, 595/596 (no connection to the node), a
    config flock not had (``can't lock file … - got timeout``: the worker did nothing) — or the
    call is a read (a read sent twice does no harm, whatever happened to the first). A mutation
    without an answer (:class:`OutcomeUnknown`) is never sent again here: the step that sent it
    decides (a clone's ledger, a task's UPID)."""
    if isinstance(err, (VmLocked, AgentUnavailable, VmMissing, VmidTaken, EntryExists, EntryMissing)):
        return False
    cause = err.__cause__
    if isinstance(cause, ResourceException):
        if cause.status_code in _NOT_PERFORMED:
            return True
        if _LOCK_TIMEOUT.search(str(cause.content or cause.status_message or "")):
            return True
        return method == "GET" and cause.status_code >= 500 and not _AGENT_DOWN.search(str(cause.content or ""))
    return method == "GET"  # a transport error or timeout of a read


# answers of the agent that asking again at once does not change (a qmp error about a pid the agent
# does not know — its process ended and was reported, or the guest restarted — is one)
_AGENT_DOWN = re.compile(r"agent is not running|No QEMU guest agent configured|is not running|No such file|"
                         r"Invalid parameter 'pid'")


class ReadOnlyRefused(PermanentError):
    """A read-only client (a plan's) was asked to send a request that is not a GET: refused unsent."""


#: a command in the guest is a POST (``agent/exec``); a read-only client sends it only for a command
#: its caller says only reads (``agent_exec(..., reads=True)``: ``kubectl get``, ``cat`` a log)
AGENT_EXEC = "POST /nodes/{node}/qemu/{vmid}/agent/exec"
_EXEC_READS: contextvars.ContextVar[bool] = contextvars.ContextVar("z9_exec_reads", default=False)


def _bool(v: bool) -> int:
    # Proxmox booleans are 1/0; Python True would be sent as 'True' and rejected (JSONSchema.pm).
    return 1 if v else 0


class ProxmoxClient:
    """Async, domain-level client of one region's Proxmox VE API.

    Every method raises only z9 errors (TemporaryError — OutcomeUnknown when the request got
    no answer —, PermanentError, Snooze subclasses). ``max_threads`` bounds concurrent requests.
    """

    def __init__(self, region: str, settings: RegionSettings, *, max_threads: int = 32, read_only: bool = False):
        self.region = region
        # a preview's client (the API's, z9.executor.preview): every request but a GET is refused
        # before it is sent (ReadOnlyRefused), whatever code asks for it
        self.read_only = read_only
        self.settings = settings
        url = urlsplit(settings.url)
        user, _, token_name = settings.token_id.partition("!")
        self._api = ProxmoxAPI(
            url.hostname,
            port=url.port or 8006,
            user=user,
            token_name=token_name,
            token_value=settings.require_token_secret(region),
            verify_ssl=settings.verify_ssl,
            timeout=settings.request_timeout_s,
            service="PVE",
        )
        # the last place before a request leaves: the job's lease deadline, its fencing token
        # (z9.executor.lease_deadline)
        self._api._store["session"].mount("https://", LeaseHeaderAdapter())
        self._pool = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix=f"pve-{region}")
        metrics.init_proxmox(region, (*ENDPOINTS, *resources.pve_endpoints()))
        self.view = ClusterView(self._fetch_vms, settings.resources_snapshot_s, region,
                                settings.resources_snapshot_create_s)
        self._vmid_lane = random.SystemRandom().randrange(VMID_LANES)
        self._vmids_asked: dict[int, float] = {}
        self._nextid: tuple[float, int] | None = None  # (read at, /cluster/nextid's answer)
        # how long each type of task took lately (seconds; the first poll of the next one waits so long)
        self._task_s: dict[str, float] = {}
        # how long each learned guest command took lately (seconds): see agent_exec
        self._exec_s: dict[str, float] = {}
        # templates PVE refused to clone to another node ("VM uses local storage"): cloned on their
        # own node and migrated since (a process-long fact: a template's disks do not move)
        self.local_templates: set[int] = set()
        # (node, target) -> (read at, the images storages the two nodes share): see shared_storages
        self._shared: dict[tuple[str, str], tuple[float, frozenset[str]]] = {}

    @property
    def api(self) -> ProxmoxAPI:
        """The proxmoxer handle, for a capability adapter outside this module (a slice's own calls,
        ``resources/z9/resources/<type>/pve.py``): only ever called inside :meth:`call`."""
        return self._api

    async def call(self, endpoint: str, what: str, fn: Callable[[], Any],
                   answers: tuple[type[Exception], ...] = ()) -> Any:
        """This adapter's one error boundary (:meth:`_call`) for a slice's capability adapter:
        ``endpoint`` must be one its type declares (``ResourceType.pve_endpoints``, given
        pre-created metric series like :data:`ENDPOINTS`)."""
        return await self._call(endpoint, what, fn, answers)

    def close(self) -> None:
        """Stop the client's threads (requests in flight finish in the background)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _call(self, endpoint: str, what: str, fn: Callable[[], Any],
                    answers: tuple[type[Exception], ...] = ()) -> Any:
        """:meth:`_call_once`, tried again (at most :data:`CALL_TRIES` times, with backoff) when
        it failed transiently in a way that says the request was not performed (see
        :func:`retryable`): a step is not ended — and an attempt not spent — by a passing 503 or
        flock timeout. A call tried again is not progress: the node did not answer, so the job's
        lease is not kept by it (the stall detection of worker.py sees a hypervisor that answers
        nothing; the tries take far less than ``step_timeout_s``)."""
        method = endpoint.partition(" ")[0]
        delay = CALL_BACKOFF_S
        for tries_left in range(CALL_TRIES - 1, -1, -1):
            try:
                return await self._call_once(endpoint, what, fn, answers)
            except TemporaryError as e:
                if tries_left == 0 or not retryable(e, method):
                    raise
                log.info("%s: %s; trying again in %.2fs (%d more)", what, e, delay, tries_left)
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, CALL_BACKOFF_CAP_S)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _call_once(self, endpoint: str, what: str, fn: Callable[[], Any],
                         answers: tuple[type[Exception], ...] = ()) -> Any:
        """Run one proxmoxer call in this client's thread pool; translate its errors.
        ``endpoint`` is ``"METHOD /path/template"`` (one of :data:`ENDPOINTS`; logs, the
        ``z9_proxmox_request*`` metrics and the call's span name). ``answers``: translated errors
        the caller expects as an answer (a config read of a VM that is gone: ``VmMissing``) —
        raised all the same, but the call's span is not marked failed (the metrics keep the
        status Proxmox answered)."""
        loop = asyncio.get_running_loop()
        method, _, path = endpoint.partition(" ")
        if self.read_only and method != "GET" and not (endpoint == AGENT_EXEC and _EXEC_READS.get()):
            raise ReadOnlyRefused(f"{what}: a read-only client sends no {endpoint} (a plan makes no Proxmox writes)")
        lease_deadline.check(what)  # checked again in the sending thread (LeaseHeaderAdapter)
        with metrics.proxmox_request(self.region, endpoint):
            with tracing.span(endpoint, {"http.request.method": method, "url.template": path, "z9.region": self.region},
                              kind=SpanKind.CLIENT) as span:
                try:
                    # In a copy of this context, so the thread sees this call's span as current.
                    result = await loop.run_in_executor(self._pool, contextvars.copy_context().run, fn)
                except (asyncio.CancelledError, lease_deadline.LeaseExpired):
                    raise  # (refused before it was sent: nothing to translate)
                except Exception as exc:  # translated at this single boundary
                    log.debug("%s (%s) failed: %r", what, endpoint, exc)
                    if isinstance(exc, ResourceException):
                        span.set_attribute("http.response.status_code", exc.status_code)
                    err = translate(exc, what)
                    if not isinstance(err, answers):
                        raise err from exc
                    err.__cause__ = exc
                    span.set_attribute("z9.answer", type(err).__name__)  # expected: not a failed call
                else:
                    span.set_attribute("http.response.status_code", 200)  # proxmoxer raises on any status >= 400
                    return result
            raise err

    # ------------------------------------------------------------------ reads

    def _get_rows(self, path: str, **params: Any) -> list[dict[str, Any]]:
        """``GET path`` through proxmoxer's session (its auth, TLS and timeout), the answer parsed
        with orjson. For the one large answer (``/cluster/resources`` at 10,000 VMs: 3.2 MB):
        proxmoxer's own ``_request`` formats every body into a debug message whether or not it is
        logged, and parses it with ``json`` — together 3× the cost of the request itself.
        Errors are raised as proxmoxer's ``ResourceException``, as ``_request`` does."""
        url = self._api._store["base_url"] + path
        resp = self._api._store["session"].request("GET", url, params=params)
        if resp.status_code >= 400:
            raise ResourceException(resp.status_code, resp.reason, resp.reason,
                                    errors=self._api._store["serializer"].loads_errors(resp))
        return orjson.loads(resp.content)["data"]

    async def _fetch_vms(self) -> list[dict[str, Any]]:
        """``GET /cluster/resources?type=vm``: the raw rows of every VM and template of the
        cluster. Callers use :meth:`list_vms` (the shared snapshot) instead. A read for every job
        of the process (several wait on it): sent for none of them, so no one lease holds it back."""
        with lease_deadline.unbound():
            return await self._call("GET /cluster/resources", "list VMs",
                                    lambda: self._get_rows("/cluster/resources", type="vm")) or []

    async def snapshot(self, *, not_before: float | None = None, for_create: bool = False) -> "ClusterSnapshot":
        """This process's shared ``/cluster/resources`` snapshot (:class:`ClusterView`): at most
        ``resources_snapshot_s`` old (``resources_snapshot_create_s`` with ``for_create``: a
        caller whose "none" has an authority of its own), and requested no earlier than
        ``not_before`` (``time.monotonic()``) when given. Concurrent callers share one request in
        flight."""
        return await self.view.get(not_before, for_create=for_create)

    async def list_vms(self, *, not_before: float | None = None) -> list[VmRef]:
        """Every VM and template of the cluster, from the shared snapshot (see :meth:`snapshot`)
        with this process's newer reads of single VMs laid over it."""
        return (await self.snapshot(not_before=not_before)).refs()

    async def find_by_tag(self, tag: str, *, not_before: float | None = None) -> list[VmRef]:
        """Every VM carrying ``tag`` (tags compared as normalised sets) in the shared snapshot,
        plus every VM this process read *after* the snapshot was requested that carried it then
        (and minus those it read without it). Callers confirm each one by its own config."""
        return (await self.snapshot(not_before=not_before)).tagged(tag.lower())

    async def vm_state(self, node: str, vmid: int, *, status: bool = True) -> VmState | None:
        """Config and power status of VM ``vmid`` on ``node``; None when its config does not
        exist there. What it saw is laid over the shared snapshot (:meth:`ClusterView.saw`).
        ``status=False``: the config only (one request; ``status`` reads ``unknown``) — for a
        caller that needs nothing of the power state (a template, a VM it just cloned)."""
        started = time.monotonic()
        try:
            cfg = await self._call("GET /nodes/{node}/qemu/{vmid}/config", f"read config of VM {vmid}",
                                   lambda: self._api.nodes(node).qemu(vmid).config.get(), answers=(VmMissing,))
            st = None
            if status:
                st = await self._call("GET /nodes/{node}/qemu/{vmid}/status/current",
                                      f"read status of VM {vmid}",
                                      lambda: self._api.nodes(node).qemu(vmid).status.current.get(),
                                      answers=(VmMissing,))
        except VmMissing:
            self.view.saw(vmid, node, None, started)
            return None
        cfg = dict(cfg or {})
        up = (st or {}).get("uptime")
        state = VmState(vmid=vmid, node=node, config=cfg, status=(st or {}).get("status", "unknown"),
                        tags=normalize_tags(cfg.get("tags")), uptime_s=int(up) if up is not None else None)
        self.view.saw(vmid, node, state.tags, started, name=cfg.get("name"),
                      template=str(cfg.get("template", "0")) == "1")
        return state

    async def vm_status(self, node: str, vmid: int) -> dict[str, Any] | None:
        """``status/current`` of VM ``vmid`` on ``node`` (``status``, ``uptime``, ``lock``…); None
        when its config does not exist there."""
        try:
            return dict(await self._call("GET /nodes/{node}/qemu/{vmid}/status/current", f"read status of VM {vmid}",
                                         lambda: self._api.nodes(node).qemu(vmid).status.current.get(),
                                         answers=(VmMissing,)) or {})
        except VmMissing:
            return None

    async def pending(self, node: str, vmid: int) -> dict[str, Any]:
        """``GET …/pending``: the keys of VM ``vmid`` whose change waits for its next start (a
        running VM takes live only what is hot-pluggable: QemuServer.pm vmconfig_hotplug_pending)
        → ``{key: pending value}`` (a pending delete: None)."""
        rows = await self._call("GET /nodes/{node}/qemu/{vmid}/pending", f"read pending changes of VM {vmid}",
                                lambda: self._api.nodes(node).qemu(vmid).pending.get())
        return {str(r["key"]): (None if r.get("delete") else r.get("pending"))
                for r in rows or [] if "pending" in r or r.get("delete")}

    async def shared_storages(self, node: str, target: str, max_age_s: float = 300.0) -> frozenset[str]:
        """The storages holding VM images that ``node`` shares with ``target``: ``GET
        /nodes/{node}/storage?content=images&target=…`` (pve-storage API2/Storage/Status.pm index: with
        a target other than the node, only shared storages both can reach). Kept ``max_age_s`` per
        pair: an operator adds a storage rarely, and a clone PVE refuses is handled anyway."""
        hit = self._shared.get((node, target))
        if hit is not None and time.monotonic() - hit[0] < max_age_s:
            return hit[1]
        rows = await self._call("GET /nodes/{node}/storage", f"list the storages {node} shares with {target}",
                                lambda: self._api.nodes(node).storage.get(content="images", target=target))
        # "shared" is a number on the wire (Storage.pm storage_info: "? 1 : 0"); read "1" too
        found = frozenset(str(r["storage"]) for r in rows or [] if str(r.get("shared", 0)) == "1")
        self._shared[(node, target)] = (time.monotonic(), found)
        return found

    async def next_id(self) -> int:
        """``GET /cluster/nextid``: the lowest free vmid ≥ 100 (a string on the wire; reserves
        nothing, so a clone may still find it taken)."""
        v = await self._call("GET /cluster/nextid", "get next free vmid",
                             lambda: self._api.cluster.nextid.get())
        return int(v)

    async def pick_vmid(self) -> int:
        """A vmid for a new clone: the lowest one ≥ ``/cluster/nextid`` in this process's *lane*
        (vmid ≡ lane mod :data:`VMID_LANES`, the lane drawn at random per client) that is not in
        the latest shared snapshot (``nextid`` is the lowest free id of the whole cluster: the
        lane's ids above it may be taken) and that this process has not asked for in the last
        :data:`VMID_ASKED_TTL_S` seconds.

        ``nextid`` reserves nothing: it hands every racing create the same lowest free id, and
        each collision cost a clone request answered ``already exists`` (3,309 requests for
        ~2,300 creates measured at 10,000 VMs). Within a process the remembered ids keep
        concurrent creates apart; across processes the lanes do, but for two processes that
        drew the same lane (1 in 32 per pair): then each create the pair has in flight in that lane
        collides once before the loser's next pick moves to a new lane. A collision is still only a
        refused request (a definite answer, nothing cloned): the caller picks again, never
        adopting that VM.

        The floor is ``nextid`` read at most :data:`NEXTID_TTL_S` ago (and read again after a
        refusal): it keeps z9 at or above the operator's ``next-id: lower=`` (datacenter.cfg, which
        PVE's nextid honours) and below the ids of the whole cluster's newest guests; which ids
        above it are free the snapshot says, and the clone itself decides."""
        now = time.monotonic()
        if self._nextid is None or now - self._nextid[0] >= NEXTID_TTL_S:
            self._nextid = (now, await self.next_id())
        base = self._nextid[1]
        if len(self._vmids_asked) > 256:
            self._vmids_asked = {v: t for v, t in self._vmids_asked.items() if now - t < VMID_ASKED_TTL_S}
        known = self.view.latest.vmids if self.view.latest is not None else frozenset()
        cand = base + (self._vmid_lane - base) % VMID_LANES
        while cand in known or now - self._vmids_asked.get(cand, float("-inf")) < VMID_ASKED_TTL_S:
            cand += VMID_LANES
        if cand > VMID_MAX:
            raise TemporaryError(f"no free vmid in lane {self._vmid_lane} at or above {base}")
        self._vmids_asked[cand] = now
        return cand

    def vmid_taken(self, vmid: int) -> None:
        """A clone to ``vmid`` (from :meth:`pick_vmid`) was refused as taken: another process
        picks in this lane too, so draw a new lane (two processes collide about once, then part)."""
        self._vmids_asked[vmid] = time.monotonic()
        self._vmid_lane = random.SystemRandom().randrange(VMID_LANES)
        self._nextid = None  # the next pick asks nextid again

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
                    description: str, target: str | None = None) -> str:
        """Full clone of ``template_vmid`` to ``newid`` on the same node → UPID. The target holds
        ``lock: clone`` until the task ends and inherits the source's tags. Raises VmidTaken
        (``config file already exists``), OutcomeUnknown (no answer: it may have happened)."""
        return await self._call(
            "POST /nodes/{node}/qemu/{vmid}/clone", f"clone VM {template_vmid} to {newid}",
            lambda: self._api.nodes(node).qemu(template_vmid).clone.post(
                newid=newid, name=name, description=description, full=_bool(True),
                **({"target": target} if target and target != node else {})))

    async def migrate(self, node: str, vmid: int, target: str) -> str:
        """``POST …/migrate`` of a stopped VM to ``target`` (offline; its local disks are copied,
        ``with-local-disks=1``) → the ``qmigrate`` UPID; the config is on ``target`` once the task
        ended OK (qemu-server API2/Qemu.pm migrate_vm, PVE/QemuMigrate.pm)."""
        return await self._call("POST /nodes/{node}/qemu/{vmid}/migrate", f"migrate VM {vmid} to {target}",
                                lambda: self._api.nodes(node).qemu(vmid).migrate.post(
                                    target=target, **{"with-local-disks": _bool(True)}))

    async def configure(self, node: str, vmid: int, params: dict[str, Any], *, digest: str | None) -> str:
        """``POST …/config`` (asynchronous: returns a ``qmconfig`` UPID). ``digest`` makes the write
        fail with ``checksum mismatch`` if the config changed since it was read."""
        data = dict(params)
        if digest:
            data["digest"] = digest
        return await self._call("POST /nodes/{node}/qemu/{vmid}/config", f"configure VM {vmid}",
                                lambda: self._api.nodes(node).qemu(vmid).config.post(**data))

    async def configure_now(self, node: str, vmid: int, params: dict[str, Any], *, digest: str | None) -> None:
        """``PUT …/config``: the same write as :meth:`configure`, done before the answer (qemu-server
        API2/Qemu.pm ``update_vm`` runs ``$update_vm_api`` with ``$sync``: the same early checks — the
        digest, ``VM is locked (…)`` at once —, then the change under the config flock, waiting for it
        up to 10 s: a timeout is an HTTP 500, tried again as any flock timeout). One request where
        :meth:`configure` takes two (its UPID, then the task's status): for a stopped VM the write is
        only a config file change, nothing worth a task."""
        data = dict(params)
        if digest:
            data["digest"] = digest
        started = time.monotonic()
        await self._call("PUT /nodes/{node}/qemu/{vmid}/config", f"configure VM {vmid}",
                         lambda: self._api.nodes(node).qemu(vmid).config.put(**data))
        if "tags" in params:  # done when answered: this process's listings see the VM's new tags at once
            self.view.saw(vmid, node, normalize_tags(params["tags"]), started, name=params.get("name"))

    async def resize(self, node: str, vmid: int, disk: str, size_gib: int, *, digest: str | None = None) -> str | None:
        """``PUT …/resize`` to an absolute ``size_gib`` GiB; returns the task's UPID (PVE ≥ 8).
        ``digest``: the config's as this attempt read it — the task fails ``checksum mismatch`` when
        another writer (a later attempt) changed it since (qemu-server API2/Qemu.pm resize_vm:
        ``die "checksum mismatch …" if $digest && $digest ne $conf->{digest}``)."""
        data: dict[str, Any] = {"disk": disk, "size": f"{size_gib}G", **({"digest": digest} if digest else {})}
        return await self._call("PUT /nodes/{node}/qemu/{vmid}/resize", f"resize {disk} of VM {vmid}",
                                lambda: self._api.nodes(node).qemu(vmid).resize.put(**data))

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

    async def reboot(self, node: str, vmid: int, *, timeout_s: int = 60) -> str:
        """``POST …/status/reboot``: ACPI shutdown (waiting ``timeout_s``), then a new start (which
        applies pending config changes and regenerates cloud-init) → UPID."""
        return await self._call("POST /nodes/{node}/qemu/{vmid}/status/reboot", f"reboot VM {vmid}",
                                lambda: self._api.nodes(node).qemu(vmid).status.reboot.post(timeout=timeout_s))

    async def destroy(self, node: str, vmid: int) -> str:
        """``DELETE /nodes/{node}/qemu/{vmid}`` with ``purge=1`` and
        ``destroy-unreferenced-disks=1``. A running VM is refused (``VM n is running``)."""
        return await self._call("DELETE /nodes/{node}/qemu/{vmid}", f"destroy VM {vmid}",
                                lambda: self._api.nodes(node).qemu(vmid).delete(
                                    **{"purge": 1, "destroy-unreferenced-disks": 1}))

    # ------------------------------------------------------------------ nodes, guest agent

    async def nodes(self) -> list[str]:
        """``GET /nodes``: the names of the cluster's online nodes, sorted."""
        rows = await self._call("GET /nodes", "list nodes", lambda: self._api.nodes.get())
        return sorted(r["node"] for r in rows or [] if r.get("status", "online") == "online")

    async def _agent(self, endpoint: str, what: str, fn: Callable[[], Any], *, repeatable: bool = True) -> Any:
        """One guest-agent call, tried again within the step (at most :data:`AGENT_TRIES` times, with
        backoff) when it failed in passing: answered ``QEMU guest agent is not running`` (a QMP
        command that timed out — qemu-server PVE/QemuServer.pm vm_qmp_command — or the agent
        restarting: nothing was done), or — when ``repeatable``, a call that may be sent twice (a
        read, a ping, a file written whole) — performed with its answer lost (:class:`OutcomeUnknown`).
        An ``exec`` is not ``repeatable``: its command may have run; the caller decides. Raises
        :class:`AgentUnavailable` when the agent still does not answer (booting, not configured,
        the VM not running) and :class:`ExecStatusLost` for a pid the agent no longer knows."""
        delay = CALL_BACKOFF_S
        for tries_left in range(AGENT_TRIES - 1, -1, -1):
            try:
                return await self._call(endpoint, what, fn)
            except TemporaryError as e:
                text = str(e)
                if "Invalid parameter 'pid'" in text:
                    raise ExecStatusLost(text) from e
                passing = bool(_AGENT_NOT_RUNNING.search(text)) or (repeatable and isinstance(e, OutcomeUnknown))
                if tries_left == 0 or not passing:
                    if re.search(r"agent is not running|No QEMU guest agent configured|is not running", text):
                        raise AgentUnavailable(text) from e
                    if "Failed to execute child process" in text:
                        # qemu-ga's guest-exec could not spawn the program (no such binary in the guest):
                        # the image lacks what z9 runs in it — no retry brings it
                        raise PermanentError(f"{what}: the guest has no such program: {e}") from e
                    raise
                log.info("%s: %s; trying again in %.2fs (%d more)", what, e, delay, tries_left)
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, CALL_BACKOFF_CAP_S)
        raise AssertionError("unreachable")  # pragma: no cover

    async def agent_ping(self, node: str, vmid: int) -> None:
        """Raises AgentUnavailable while the guest agent does not answer."""
        await self._agent("POST /nodes/{node}/qemu/{vmid}/agent/ping", f"ping the agent of VM {vmid}",
                          lambda: self._api.nodes(node).qemu(vmid).agent.ping.post())

    async def agent_exec_start(self, node: str, vmid: int, argv: list[str], stdin: str | None = None) -> int:
        """``agent/exec`` → the guest pid (the command runs on; poll :meth:`agent_exec_status`);
        ``stdin`` is the command's ``input-data``. :meth:`agent_exec` runs a command to its end."""
        data: dict[str, Any] = {"command": list(argv)}
        if stdin is not None:
            data["input-data"] = stdin
        r = await self._agent("POST /nodes/{node}/qemu/{vmid}/agent/exec", f"exec {argv[0]} in VM {vmid}",
                              lambda: self._api.nodes(node).qemu(vmid).agent.exec.post(**data), repeatable=False)
        return int(r["pid"])

    async def agent_exec_status(self, node: str, vmid: int, pid: int) -> dict[str, Any]:
        """``{exited: 0|1, exitcode?, out-data?, err-data?}``."""
        return await self._agent("GET /nodes/{node}/qemu/{vmid}/agent/exec-status",
                                 f"exec status of pid {pid} in VM {vmid}",
                                 lambda: self._api.nodes(node).qemu(vmid).agent("exec-status").get(pid=pid))

    async def agent_file_read(self, node: str, vmid: int, path: str) -> bytes | None:
        """The whole file (None when it does not exist)."""
        out, offset = b"", 0
        while True:
            try:
                r = await self._agent("GET /nodes/{node}/qemu/{vmid}/agent/file-read", f"read {path} in VM {vmid}",
                                      lambda: self._api.nodes(node).qemu(vmid).agent("file-read").get(file=path))
            except TemporaryError as e:
                if "No such file or directory" in str(e):
                    return None
                raise
            out += str(r.get("content", "")).encode("latin-1")
            if not r.get("truncated"):
                return out
            raise TemporaryError(f"{path} in VM {vmid} is larger than one file-read (16 MiB)")

    async def agent_file_write(self, node: str, vmid: int, path: str, data: bytes) -> None:
        """``agent/file-write`` (base64, ``encode=0``: any bytes)."""
        import base64
        content = base64.b64encode(data).decode()
        await self._agent("POST /nodes/{node}/qemu/{vmid}/agent/file-write", f"write {path} in VM {vmid}",
                          lambda: self._api.nodes(node).qemu(vmid).agent("file-write").post(
                              file=path, content=content, encode=_bool(False)))

    async def agent_interfaces(self, node: str, vmid: int) -> list[dict[str, Any]]:
        r = await self._agent("GET /nodes/{node}/qemu/{vmid}/agent/network-get-interfaces",
                              f"interfaces of VM {vmid}",
                              lambda: self._api.nodes(node).qemu(vmid).agent("network-get-interfaces").get())
        return list((r or {}).get("result") or [])

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

    async def set_firewall_options(self, node: str, vmid: int, *, digest: str | None = None,
                                   **options: bool | int | str) -> None:
        """``PUT …/firewall/options`` (booleans sent as 1/0; ``policy_in`` … as given), guarded by
        ``digest`` when given (a stale one: :class:`DigestMismatch`)."""
        data: dict[str, Any] = {k: _bool(v) if isinstance(v, bool) else v for k, v in options.items()}
        if digest:
            data["digest"] = digest
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

    async def ipset_delete(self, node: str, vmid: int, name: str) -> None:
        """Delete IP set ``name`` of VM ``vmid`` with its entries (``force``; absent: done)."""
        try:
            await self._call("DELETE /nodes/{node}/qemu/{vmid}/firewall/ipset/{name}", f"delete IP set {name} of VM {vmid}",
                             lambda: self._api.nodes(node).qemu(vmid).firewall.ipset(name).delete(force=1))
        except EntryMissing:
            return

    async def firewall_rules(self, node: str, vmid: int) -> tuple[list[dict[str, Any]], str | None]:
        """``GET …/firewall/rules``: VM ``vmid``'s rules in order (each with ``pos``) and the list's
        ``digest`` (every rule row carries it: pve-firewall ``copy_list_with_digest``)."""
        rows = [dict(r) for r in await self._call("GET /nodes/{node}/qemu/{vmid}/firewall/rules",
                                                  f"read firewall rules of VM {vmid}",
                                                  lambda: self._api.nodes(node).qemu(vmid).firewall.rules.get()) or []]
        return sorted(rows, key=lambda r: int(r.get("pos", 0))), (str(rows[0]["digest"]) if rows else None)

    async def firewall_rule_add(self, node: str, vmid: int, rule: dict[str, str]) -> None:
        """``POST …/firewall/rules``: ``rule`` inserted first in VM ``vmid``'s list."""
        await self._call("POST /nodes/{node}/qemu/{vmid}/firewall/rules", f"add a firewall rule to VM {vmid}",
                         lambda: self._api.nodes(node).qemu(vmid).firewall.rules.post(**rule))

    async def firewall_rule_delete(self, node: str, vmid: int, pos: int, *, digest: str | None) -> None:
        """``DELETE …/firewall/rules/{pos}`` under the list's ``digest`` (the rule at ``pos`` is the one
        read only while the list is unchanged: a stale digest is :class:`DigestMismatch`)."""
        params = {"digest": digest} if digest else {}
        await self._call("DELETE /nodes/{node}/qemu/{vmid}/firewall/rules/{pos}",
                         f"delete firewall rule {pos} of VM {vmid}",
                         lambda: self._api.nodes(node).qemu(vmid).firewall.rules(pos).delete(**params))

    async def cloudinit_regenerate(self, node: str, vmid: int) -> None:
        """``PUT …/cloudinit``: rebuild the cloud-init drive from the config now (the guest
        reads it at its next boot)."""
        await self._call("PUT /nodes/{node}/qemu/{vmid}/cloudinit", f"regenerate cloud-init drive of VM {vmid}",
                         lambda: self._api.nodes(node).qemu(vmid).cloudinit.put())

    async def cloudinit_dump(self, node: str, vmid: int, kind: str) -> str:
        """``GET …/cloudinit/dump?type=user|network|meta``: that file as PVE generates it from the
        config now (what the drive holds when no cloud-init change is pending)."""
        return str(await self._call("GET /nodes/{node}/qemu/{vmid}/cloudinit/dump", f"dump cloud-init {kind} of VM {vmid}",
                                    lambda: self._api.nodes(node).qemu(vmid).cloudinit.dump.get(type=kind)) or "")

    async def cloudinit_pending(self, node: str, vmid: int) -> list[dict[str, Any]]:
        """``GET …/cloudinit``: the cloud-init keys, with ``pending``/``delete`` where the config
        changed since the drive was last generated."""
        return list(await self._call("GET /nodes/{node}/qemu/{vmid}/cloudinit", f"cloud-init of VM {vmid}",
                                     lambda: self._api.nodes(node).qemu(vmid).cloudinit.get()) or [])

    async def agent_hostname(self, node: str, vmid: int) -> str:
        """``agent/get-host-name``: the guest's hostname. Raises AgentUnavailable while it does not answer."""
        r = await self._agent("GET /nodes/{node}/qemu/{vmid}/agent/get-host-name", f"hostname of VM {vmid}",
                              lambda: self._api.nodes(node).qemu(vmid).agent("get-host-name").get())
        return str(((r or {}).get("result") or {}).get("host-name") or "")

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
                         poll_s: float = 0.2, learn: str | None = None,
                         in_passing: bool = True, reads: bool = False) -> tuple[int, str, str]:
        """Run ``argv`` in the guest (``agent/exec``, then ``agent/exec-status`` until it exited):
        ``(exitcode, stdout, stderr)``. Raises TemporaryError while the agent does not answer
        (booting: ``QEMU guest agent is not running``) or when the command outlives ``timeout_s``.

        Every command run so may run twice (z9's are checks, or written to be idempotent: ``kubectl
        apply``, a token create that takes "already exists" as done): one whose outcome was lost — the
        ``exec`` performed without an answer (:class:`OutcomeUnknown`), or its ``exec-status`` answer
        lost, after which qemu-ga no longer knows the pid (:class:`ExecStatusLost`) — is run again, at
        most :data:`RUN_AGAIN` times, within the step. An agent that answers "not running" once is
        asked again (:meth:`_agent`) unless ``in_passing`` is False (a caller that polls a booting
        guest itself: each poll answers at once).

        ``learn`` names a command whose runs take about as long as each other (a guest's look at
        its cloud-init): its first ``exec-status`` waits about as long as it took lately (as a
        task's first poll does, :meth:`_poll_task`) instead of asking at once — qemu-ga answers
        ``exited: 0`` until the process ends, and each question is a request through pveproxy.

        ``reads``: the command only reads the guest (a read-only client sends only such a one)."""
        token = _EXEC_READS.set(reads)
        try:
            for again in range(RUN_AGAIN, -1, -1):
                try:
                    return await self._agent_exec_once(node, vmid, argv, timeout_s, poll_s, learn, in_passing)
                except (OutcomeUnknown, ExecStatusLost) as e:
                    if again == 0:
                        raise
                    log.info("%s in VM %s: its outcome is lost (%s); running it again", argv[0], vmid, e)
        finally:
            _EXEC_READS.reset(token)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _agent_exec_once(self, node: str, vmid: int, argv: list[str], timeout_s: float, poll_s: float,
                               learn: str | None, in_passing: bool) -> tuple[int, str, str]:
        endpoint, what = AGENT_EXEC, f"exec {argv[0]} in VM {vmid}"

        def post() -> Any:
            return self._api.nodes(node).qemu(vmid).agent.exec.post(command=list(argv))
        res = await (self._agent(endpoint, what, post, repeatable=False) if in_passing
                     else self._call(endpoint, what, post))
        pid = int(res["pid"])
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        first = self.exec_first_poll_s(learn) if learn else 0.0
        if first:
            await asyncio.sleep(min(first, timeout_s))
        seen_running = False
        while True:
            st = await self.agent_exec_status(node, vmid, pid)
            if int(st.get("exited") or 0):
                if learn:
                    self.exec_took(learn, time.monotonic() - t0, seen_running)
                return int(st.get("exitcode", -1)), str(st.get("out-data") or ""), str(st.get("err-data") or "")
            seen_running = True
            if time.monotonic() > deadline:
                raise TemporaryError(f"{argv[0]} in VM {vmid} still running after {timeout_s:.0f}s")
            await asyncio.sleep(poll_s)

    def exec_first_poll_s(self, learn: str) -> float:
        """How long the first ``exec-status`` of a ``learn`` command waits: about as long as it took
        lately (0: not known yet, ask at once), at most FIRST_POLL_MAX_S."""
        return min(self._exec_s.get(learn, 0.0), FIRST_POLL_MAX_S)

    def exec_took(self, learn: str, took: float, seen_running: bool) -> None:
        """Learn from one run of a ``learn`` command: seen running, it took about ``took``; done at
        the first question, maybe less (a shorter first wait is probed next time)."""
        prev = self._exec_s.get(learn, 0.0)
        took = took if seen_running else 0.8 * prev
        self._exec_s[learn] = took if not prev else 0.7 * prev + 0.3 * took

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
        t0 = time.monotonic()
        deadline = t0 + deadline_s
        unknown = 0
        # The first poll waits about as long as this type of task took lately (at least poll_s, at
        # most FIRST_POLL_MAX_S so the lease is renewed in time): a 1 s clone is asked for once,
        # not at once and then again (a poll right after the POST only ever said "running" or
        # "no such task").
        first = min(FIRST_POLL_MAX_S, max(poll_s, self._task_s.get(up.type, 0.0)))
        await asyncio.sleep(first)
        seen_running = False
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
                # learn: a task seen running took about this long; one done at the first poll
                # may have taken less (probe a shorter first wait next time)
                prev = self._task_s.get(up.type, 0.0)
                took = time.monotonic() - t0 if seen_running else 0.8 * prev
                self._task_s[up.type] = took if not prev else 0.7 * prev + 0.3 * took
                exitstatus = str(st.get("exitstatus") or "unexpected status")
                if exitstatus == "OK" or exitstatus.startswith("WARNINGS:"):
                    return exitstatus
                wait.outcome = "failed"
                tail = await self.task_log_tail(up.node, upid)
                raise task_failure(upid, up.type, exitstatus, tail)
            if st:
                seen_running = True
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
    if "shrinking disks is not supported" in exitstatus or _PERMISSION.search(exitstatus):
        # (a privilege checked inside the worker, e.g. resize_vm's Datastore.AllocateSpace)
        return TaskFailedPermanently(msg, upid=upid, exitstatus=exitstatus, log_tail=tail)
    return TaskFailed(msg, upid=upid, exitstatus=exitstatus, log_tail=tail)
