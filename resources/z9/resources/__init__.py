"""The resource-type registry: what the scheduler, the reaper, the executor and the API know
about a type of resource (server, address, …), without naming one.

A type is a :class:`ResourceType`: its name (``jobs.resource_type``), id prefix, table, row model,
deletion policy (:class:`Buffered` — a buffer during which the deletion can be cancelled, then a
final job — or :class:`Immediate` — the final job at once), the job that restores it when a
deletion is cancelled, and what a failed job does to it (:meth:`ResourceType.failure_ends_deletion`).
Its slice — the package ``z9.resources.<type>`` (``resources/z9/resources/<type>/``) — builds one
and calls :func:`register`; everything else the type is lives beside it in that folder: its API
operations (``api``: ``API``), its job kinds (``jobs``: one module per kind, each with ``KIND``),
its client commands (``client``: ``KIND``/``register``). This package imports every slice it finds
at the bottom (no list), and the lists of types, id prefixes, kinds, routes, quota units and client commands
are derived from :data:`REGISTRY` (:func:`slice_modules`).

The table keeps the lifecycle columns described in ``db/z9/db/migrations/0004_resource_layer.sql``; the
lifecycle queries are written once (``resource_*`` in ``libs/common/z9/common/queries/resources.sql``) and run through the
wrappers below, which fill in the table.

Deletion (two-phase when buffered)::

    live ──DELETE──> deleting ──buffer expires (reaper: final job)──> destroying ──final job ok──> deleted
     ^                  │ cancel-deletion (restore job)                   │ final job failed / guard refused
     └──────────────────┘                                                 └──> failed (deletable again)

An immediate deletion goes from live to ``destroying`` (and the final job) at once.
"""
from __future__ import annotations

import importlib
import logging
import pkgutil
import re
from dataclasses import dataclass, field
from datetime import datetime
from types import ModuleType
from typing import Any, Awaitable, Callable, Generic, Protocol, TypeVar

from z9.common import store
from z9.common.errors import Snooze
from z9.common.ids import GENERIC_PREFIXES
from z9.common.models import utc_now_iso
from z9.common.store import DB, NewJob

_TABLE_RE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_guard_log = logging.getLogger("z9.executor.vms")  # where the deletion guard's refusals log


class Row(Protocol):
    """What a resource row model offers: built from a record, public JSON, lifecycle fields."""

    id: str
    tenant_id: str
    region: str
    status: str
    status_before_delete: str | None

    @classmethod
    def from_record(cls, r: Any) -> Any: ...

    def public(self) -> dict[str, Any]: ...


R = TypeVar("R", bound=Row)


@dataclass(frozen=True)
class Buffered:
    """Deleting starts a buffer of ``deletion_buffer_s`` (settings) with job ``first_kind`` (e.g.
    stop the VM); the reaper enqueues ``final_kind`` when the buffer expires; cancel-deletion
    enqueues the type's restore job."""

    first_kind: str
    final_kind: str


@dataclass(frozen=True)
class Immediate:
    """Deleting enqueues ``final_kind`` at once (``destroying``); there is nothing to cancel."""

    final_kind: str


@dataclass(frozen=True)
class Periodic:
    """An observe-only job the reaper enqueues for every row in one of ``statuses`` whose
    ``observed_at`` is older than ``interval_setting`` (a Settings field, seconds) and that has no
    live job (a running job's own verify observes it anyway). The job never changes the world;
    its failure never marks the resource failed (it is lowest priority: skipped while any other
    job of the resource is live, one attempt)."""

    kind: str
    interval_setting: str
    statuses: tuple[str, ...]


@dataclass(frozen=True)
class PlanOf:
    """What a plan of a resource previews (``POST /v1/<plural>/{id}/actions/plan``): the job of
    ``kind`` with ``args`` — the type's job that converges the resource to its row's intent — whose
    own observe and plan run read-only (``z9.executor.preview``). ``leave_out``: the names of steps
    that plan makes which are not drift from this row's intent (a stopped server's ``start``: its
    converging job would start it; stopped is what its owner asked for)."""

    kind: str
    args: dict[str, Any]
    leave_out: tuple[str, ...] = ()


_UNIT_RE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class QuotaUnit:
    """A quota a type declares (``ResourceType.quotas``): ``name`` is its key everywhere — ``GET
    /v1/quota``, ``quota_exceeded``'s ``limit``, ``z9 quota --<name>`` (``_`` as ``-``), the
    default ``Z9_QUOTA_<NAME>``, ``tenant_quota_limits.unit``; ``unit`` is how a number of it reads
    in a message ("MiB of memory"); ``example`` the (limit, used) of the OpenAPI example. What
    counts toward it any type's :class:`QuotaUsage` says (its own, and others': a server's cores
    and a cluster member's add up)."""

    name: str
    unit: str
    example: tuple[int | None, int] = (10, 1)


@dataclass(frozen=True)
class QuotaUsage:
    """How a type's rows count toward quotas: ``query``, a named query of its slice's
    ``queries.sql`` taking the tenant id (``$1``) and returning one row with a column per unit
    of ``counts`` (its contribution; rows not yet deleted count); ``counts`` says for each unit
    what of this type is counted, for the documents ("servers' cores")."""

    query: str
    counts: dict[str, str]

    @property
    def units(self) -> tuple[str, ...]:
        return tuple(self.counts)


@dataclass(frozen=True)
class FirewallContribution:
    """What a type adds to one VM's firewall (``VmParts.firewall``): ``rules``, each as ``POST
    …/firewall/rules`` takes it (``type``, ``action``, ``proto``, ``dport``, ``source``, ``dest``) and
    commented with one of the type's declared ``firewall_rules`` prefixes, written after the owner kind's
    platform rules (which no contribution removes); ``policy_in``/``policy_out`` ``DROP`` closes that
    direction but for the rules (None: the owner kind's policy stands). Contributions add up: DROP wins.
    ``when_closed``: the rules are written only while the VM's inbound policy (the sum) is DROP — what a
    VM open to everything needs no rule for (a load balancer's health checks to its target servers)."""

    rules: tuple[dict[str, str], ...] = ()
    policy_in: str | None = None
    policy_out: str | None = None
    when_closed: bool = False


@dataclass(frozen=True)
class VmParts:
    """What a type keeps on VMs — on its own VMs beyond what the VM machinery's spec writes, and on
    VMs other types made (an address on a server's VM, a volume's disk): the ownership contract of a
    VM (docs/architecture.md, "Who owns what on a VM"). The VM machinery (``z9.executor.vms``)
    converges a VM to its owner's spec, keeps every part some type declares, deletes what no one
    declares in the namespaces it manages (cloud-init keys, ``ipconfigN``, z9's tags, IP-set entries
    and firewall rules), and refuses to destroy a VM holding a part declared ``outlives_vm``.

    ``config``: config keys by pattern (``re.fullmatch``); ``config_value(key, value)``: a config
    entry it owns by its value, returning what it is ("volume disk vol…") or None; ``tags``: tag
    prefixes; ``ipset_entries``: the comment prefixes of its entries in a VM's ``ipfilter-netN``
    sets; ``firewall_options``: the VM firewall options it writes; ``firewall_rules``: the comment
    prefixes of the VM firewall rules it writes (each rule z9 writes carries its writer's comment);
    ``outlives_vm``: what it keeps on a VM must survive that VM (a VM holding it is never destroyed);
    ``recorded(ctx, vm)``: what of VM ``vm`` its rows recorded as its parts beyond what the config shows
    by value (a volume's disk by every volid z9 recorded for it: a bare ``unusedN`` an operator's unplug
    left, an image of the VM's vmid on a storage): config key (or image) → what it is, for each part
    found — asked before every destroy with the job's context (its database pool, region, Proxmox client).
    ``firewall(db, owner, member)``: what it adds to the VM firewall of member ``member`` of resource
    ``owner`` now (:class:`FirewallContribution`, None: nothing) — every job that converges that VM's
    firewall asks every type and writes the sum (rules carrying one of its ``firewall_rules`` prefixes,
    and the policies it names in ``firewall_options``)."""

    config: tuple[str, ...] = ()
    config_value: Callable[[str, Any], str | None] | None = None
    tags: tuple[str, ...] = ()
    ipset_entries: tuple[str, ...] = ()
    firewall_options: tuple[str, ...] = ()
    firewall_rules: tuple[str, ...] = ()
    outlives_vm: bool = False
    recorded: Callable[[Any, Any], Awaitable[dict[str, str]]] | None = None
    firewall: Callable[[Any, str, str], Awaitable[FirewallContribution | None]] | None = None

    def owns_config(self, key: str, value: Any) -> str | None:
        """What this part is when config entry ``key: value`` belongs to it, else None."""
        if any(re.fullmatch(p, key) for p in self.config):
            return f"config key {key}"
        return self.config_value(key, value) if self.config_value is not None else None


@dataclass(frozen=True)
class ResourceType(Generic[R]):
    """One type of resource. ``restore(row) -> (kind, args)`` is the job that gives a resource
    back what it had before a cancelled deletion (``Buffered`` only). ``statuses`` is the status
    enum in order (list filters, the OpenAPI document)."""

    name: str
    prefix: str
    table: str
    model: type[R]
    kinds: tuple[str, ...]
    deletion: Buffered | Immediate
    statuses: tuple[str, ...]
    restore: Callable[[R], tuple[str, dict[str, Any]]] | None = None
    # the other resources a job of this row touches, from the row alone (e.g. the server an
    # address is on, or was on before its deletion): every job built by new_job holds them as
    # lock keys — the generic delete, cancel-deletion and the reaper's final job included
    lock_keys: Callable[[R], tuple[str, ...]] | None = None
    # why a failed job of (kind, args) is no longer the row's intent — a later request replaced
    # it (an address assigned elsewhere since): re-running it would undo that request while the
    # row keeps saying otherwise. None: it still is (or the type keeps no such intent).
    stale: Callable[[R, str, dict[str, Any]], str | None] | None = None
    # the args a re-run of a failed job of (kind, args) takes: the row's current intent (a failed
    # server resized since its create failed is created at the new size), not the old request's.
    # None: the job's own args (the type keeps no intent beyond them).
    intent: Callable[[R, str, dict[str, Any]], dict[str, Any]] | None = None
    # the failed jobs of other resources that a re-run of this row's failed (kind) re-runs too,
    # because they failed for want of what that job builds (a server's ServerCreate: the
    # AddressAssign of its primary address, which found no VM): hook(db, row, kind) -> job ids
    rerun_with: Callable[[Any, R, str], Awaitable[list[str]]] | None = None
    status_type: str = ""  # the status column's enum type; default <name>_status
    plural: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # type-specific knowledge (API, jobs)
    periodic: Periodic | None = None
    # what a job cancelled before it ran to its end (POST /v1/jobs/{id}/actions/cancel) leaves on
    # its row, when the generic rule (job_cancelled) does not say it: hook(db, row, kind, reason)
    # -> True when it settled the row
    cancelled: Callable[[Any, R, str, str], Awaitable[bool]] | None = None
    # the 409 codes the table's own rules may raise (a trigger's ``check_violation`` with
    # ``CONSTRAINT = '<table>_<code>'``): a refused deletion answers 409 with that code
    deletion_rules: tuple[str, ...] = ()
    # where the type stands in every list derived from the registry (routes, the OpenAPI
    # document's tags, the client's commands): lower first, then by name
    order: int = 100
    # the slice package holding the type (its api, jobs and client modules); default z9.resources.<name>
    package: str = ""
    # the quotas the type declares, and how its rows count toward quotas (its own or another
    # type's): every list of quota units is derived from these (quota_units())
    quotas: tuple[QuotaUnit, ...] = ()
    quota_usage: QuotaUsage | None = None
    # what the type keeps on VMs, its own and other types' (VmParts): the VM machinery keeps it,
    # and refuses to destroy a VM holding a part that outlives the VM (refuse_vm_destroy)
    vm_parts: VmParts = VmParts()
    # a cancelled deletion's first step, before the row is locked: lock the rows of other types its
    # restore changes (a volume: the server it goes back to), in the order every other request takes
    # them (the server before the volume), so it neither races that row's own deletion nor deadlocks
    # with a request holding it: hook(conn, resource_id, tenant_id)
    lock_before_restore: Callable[[Any, str, str], Awaitable[None]] | None = None
    # the Proxmox endpoints the type's own capability adapter calls through ProxmoxClient.call
    # ("METHOD /path/template"), beyond the client's: their metric series are pre-created
    pve_endpoints: tuple[str, ...] = ()
    # the job a plan of a row previews (PlanOf), from the row and what the database holds of its
    # intent (a read-only connection: hook(db, row)); None: the row has nothing to converge yet
    plan_of: Callable[[Any, R], Awaitable[PlanOf | None]] | None = None

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9]{1,3}", self.prefix) or self.prefix in GENERIC_PREFIXES:
            raise ValueError(f"resource type {self.name}: id prefix {self.prefix!r} is not 2-4 lower-case "
                             f"letters/digits, or is one of the generic {GENERIC_PREFIXES}")
        if not self.status_type:
            object.__setattr__(self, "status_type", f"{self.name}_status")
        for ident in (self.table, self.status_type):
            if not _TABLE_RE.match(ident):
                raise ValueError(f"resource type {self.name}: {ident!r} is not a plain identifier")
        for s in ("deleting", "destroying", "deleted", "failed"):
            if s not in self.statuses:
                raise ValueError(f"resource type {self.name}: status {s!r} missing (lifecycle contract)")
        if isinstance(self.deletion, Buffered) and self.restore is None:
            raise ValueError(f"resource type {self.name}: a buffered deletion needs a restore job")
        if not self.plural:
            object.__setattr__(self, "plural", self.name + "s")
        if not self.package:
            object.__setattr__(self, "package", f"{__name__}.{self.name}")
        for u in (*(q.name for q in self.quotas), *(self.quota_usage.units if self.quota_usage else ())):
            if not _UNIT_RE.match(u):
                raise ValueError(f"resource type {self.name}: quota unit {u!r} is not a plain identifier")

    def slice_module(self, part: str) -> ModuleType | None:
        """The slice's module ``part`` (``api``, ``jobs``, ``client``), None when it has none."""
        name = f"{self.package}.{part}"
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and (name == e.name or name.startswith(e.name + ".")):
                return None  # the slice has no such module (or the type no slice: a test's)
            raise

    @property
    def sql(self) -> tuple[str, str]:
        """What fills in the lifecycle queries: (table, status enum type)."""
        return (self.table, self.status_type)

    @property
    def final_kind(self) -> str:
        return self.deletion.final_kind

    def failure_ends_deletion(self, kind: str, *, refused: bool = False) -> bool:
        """A failed job's effect on a deletion under way: a deletion-guard refusal, or the final
        delete job itself failing, ends it (the resource is ``failed``; its owner may delete it
        again); any other job's failure lets it go on (the reason is kept either way)."""
        return refused or kind == self.final_kind

    def superseded_by(self, kind: str) -> tuple[str, ...]:
        """The kinds whose later job ends a live job of ``kind`` on the same resource between its
        steps (:class:`~z9.common.errors.Cancelled`): an immediate deletion's final job supersedes
        every other job of the resource (a delete must not wait behind a 20-minute create);
        nothing supersedes the final job itself, nor anything of a buffered type (its deletion
        can be cancelled: the work under way is kept)."""
        if isinstance(self.deletion, Immediate) and kind != self.deletion.final_kind:
            return (self.deletion.final_kind,)
        return ()

    def superseded_kinds(self, kind: str) -> tuple[str, ...]:
        """The inverse of :meth:`superseded_by`: the kinds of this type a job of ``kind`` ends."""
        return tuple(k for k in self.kinds if kind in self.superseded_by(k))

    async def supersede_waiting(self, db: DB, rid: str, by_job: str, by_kind: str) -> list[str]:
        """In the transaction that enqueues ``by_job`` (of ``by_kind``): the resource's jobs it
        supersedes that are not running (``pending``, or ``retry`` between attempts) end at once,
        ``failed`` with error class ``cancelled`` naming it, so it waits behind none of them (a
        create in its backoff would otherwise hold the delete for up to ``backoff_cap_s``). A
        running one stops at its next step (the executor's ``check_superseded``). Returns the ids."""
        kinds = self.superseded_kinds(by_kind)
        if not kinds:
            return []
        message = f"cancelled: {self.name} {rid} is being deleted by {by_kind} job {by_job}"
        return await store.jobs_supersede_waiting(db, rid, by_job, list(kinds),
                                                  {"class": "cancelled", "message": message, "by_job": by_job,
                                                   "at": utc_now_iso()})

    # ------------------------------------------------------------ lifecycle (queries written once)

    async def get(self, db: DB, rid: str, tenant_id: str | None = None) -> R | None:
        """The row, scoped to ``tenant_id`` when given; None when absent (or another tenant's)."""
        row = await store.resource_get(db, self.sql, rid, tenant_id)
        return self.model.from_record(row) if row else None

    async def list(self, db: DB, tenant_id: str, *, after: str | None = None, status: str | None = None,
                   limit: int = 100, name: str | None = None, selector: Any = None,
                   include_deleted: bool = True) -> list[R]:
        """Up to ``limit`` rows of the tenant by id, after id ``after``, of one status, of one
        name, matching a label selector (:mod:`z9.common.labels`); the deleted ones only with
        ``include_deleted``."""
        return [self.model.from_record(r)
                for r in await store.resource_list(db, self.sql, tenant_id, after, status, limit, name, selector,
                                                   include_deleted)]

    async def mark_deleting(self, db: DB, rid: str, tenant_id: str, buffer_s: float, *,
                            immediate: bool = False, now: datetime | None = None) -> R | None:
        """Start the deletion (``deleting`` with a buffer, or ``destroying`` when immediate —
        the type's rule, or ``immediate``: a failed create, which holds nothing to keep);
        None when the resource is absent or not in a deletable state. The row stays locked
        until commit."""
        if immediate or isinstance(self.deletion, Immediate):
            row = await store.resource_mark_destroying(db, self.sql, rid, tenant_id)
        else:
            row = await store.resource_mark_deleting(db, self.sql, rid, tenant_id, buffer_s, now=now)
        return self.model.from_record(row) if row else None

    async def cancel_deletion(self, db: DB, rid: str, tenant_id: str, *, now: datetime | None = None) -> R | None:
        """End the buffer early (status back to ``status_before_delete``); None when the
        resource is not ``deleting`` or its buffer has expired."""
        row = await store.resource_cancel_deletion(db, self.sql, rid, tenant_id, now=now)
        return self.model.from_record(row) if row else None

    async def reap_expired(self, db: DB, limit: int, *,
                           now: datetime | None = None) -> list[tuple[R, dict[str, Any] | None]]:
        """Move up to ``limit`` rows whose buffer expired to ``destroying``, each with the trace
        context of its latest job (the deletion request's first job, which the final job
        continues)."""
        return [(self.model.from_record(r), r["deletion_trace_context"])
                for r in await store.resource_reap_expired(db, self.sql, limit, now=now)]

    async def mark_failed(self, db: DB, rid: str, reason: str, *, ends_deletion: bool = False) -> None:
        """The resource carries ``reason``; ``failed`` unless a deletion is under way (which goes
        on) — and even then when ``ends_deletion``."""
        await store.resource_mark_failed(db, self.sql, rid, reason, ends_deletion)

    async def mark_failed_by_job(self, db: DB, rid: str, reason: str, *, kind: str, refused: bool = False) -> None:
        """A failed job's reason on its resource: the one rule for executor and scheduler alike
        (:meth:`failure_ends_deletion`)."""
        if self.periodic is not None and kind == self.periodic.kind:
            return  # an observe-only job's failure says nothing about the resource
        await self.mark_failed(db, rid, reason, ends_deletion=self.failure_ends_deletion(kind, refused=refused))

    async def observed(self, db: DB, rid: str, *, status: str | None = None,
                       from_statuses: tuple[str, ...] = ()) -> R | None:
        """Verify saw the resource now (``observed_at``); it moves to ``status`` only from one of
        ``from_statuses`` (never over the deletion states), clearing its reason."""
        row = await store.resource_observed(db, self.sql, rid, status, list(from_statuses))
        return self.model.from_record(row) if row else None

    async def deleted(self, db: DB, rid: str) -> bool:
        """``destroying`` → ``deleted`` (no-op in any other status: False); its clone requests go."""
        return await store.resource_deleted(db, self.sql, rid)

    async def job_cancelled(self, db: DB, row: R, kind: str, reason: str) -> None:
        """A job of ``kind`` on ``row`` was cancelled before it ran to its end: the type's own
        rule (``cancelled``) first; otherwise the generic one — a row still ``creating`` with no
        job of its own left to move it on (a job queued behind the cancelled create converges it
        too), or a cancelled final delete, ends ``failed``."""
        if self.cancelled is not None and await self.cancelled(db, row, kind, reason):
            return
        stuck = row.status == "creating" and await store.resource_count_own_live_jobs(db, row.id) == 0
        if stuck or kind == self.final_kind:
            await self.mark_failed_by_job(db, row.id, reason, kind=kind)

    def new_job(self, row: R, kind: str, *, args: dict[str, Any] | None = None, max_attempts: int = 10,
                extra_lock_keys: tuple[str, ...] = (), **kw: Any) -> NewJob:
        """A job on ``row`` (region, tenant and resource from it), holding ``extra_lock_keys``
        and the type's own ``lock_keys(row)``."""
        keys = (*extra_lock_keys, *(self.lock_keys(row) if self.lock_keys else ()))
        keys = tuple(dict.fromkeys(k for k in keys if k and k != row.id))
        return NewJob(kind=kind, region=row.region, tenant_id=row.tenant_id, resource_type=self.name,
                      resource_id=row.id, args=args, max_attempts=max_attempts,
                      extra_lock_keys=keys, **kw)


    async def periodic_due(self, db: DB, interval_s: float, limit: int, *, now: datetime | None = None) -> list[R]:
        """Rows due for the periodic observe job (locked, SKIP LOCKED: call in a transaction)."""
        assert self.periodic is not None
        return [self.model.from_record(r) for r in await store.resource_periodic_due(
            db, self.sql, list(self.periodic.statuses), interval_s, limit, now=now)]


REGISTRY: dict[str, ResourceType[Any]] = {}
# (type name) -> hooks run in the transaction that finishes that type's final delete:
# hook(conn, row id, max_attempts) -> list[NewJob] (a dependent type reacting, registered by it)
DEPENDENT_HOOKS: dict[str, list[Callable[..., Awaitable[list[Any]]]]] = {}


def on_final_delete(type_name: str, hook: Callable[..., Awaitable[list[Any]]]) -> None:
    """Register ``hook(conn, resource id, max_attempts) -> [NewJob]`` for when a ``type_name`` resource is
    deleted for good (its final job's finishing transaction): the jobs are inserted there."""
    DEPENDENT_HOOKS.setdefault(type_name, []).append(hook)


async def final_delete_dependents(conn: Any, type_name: str, resource_id: str, max_attempts: int = 10) -> list[Any]:
    """Run the hooks registered for ``type_name`` and insert the jobs they ask for (same
    transaction, without NOTIFY: the executor's poll or the caller's notify picks them up).
    Returns the inserted jobs."""
    return await _insert_dependent_jobs(DEPENDENT_HOOKS.get(type_name, []), conn, resource_id, max_attempts)


async def _insert_dependent_jobs(hooks: list[Callable[..., Awaitable[list[Any]]]], conn: Any,
                                 *args: Any) -> list[Any]:
    """Run ``hooks`` with ``(conn, *args)`` and insert the jobs they ask for (same transaction, without
    NOTIFY: the caller notifies). Returns the inserted jobs."""
    jobs: list[NewJob] = []
    for hook in hooks:
        jobs.extend(await hook(conn, *args))
    if not jobs:
        return []
    return list(await store.job_insert_many(conn, jobs))


# (type name) -> hooks run in the transaction that starts a deletion of that type (DELETE /v1/<plural>/{id}):
# hook(conn, row, options, settings) -> list[NewJob] (a dependent type reacting: a server's volumes are
# detached, or deleted with it when the request says so); ``options`` are the request's query parameters
DELETION_HOOKS: dict[str, list[Callable[..., Awaitable[list[Any]]]]] = {}
# (type name) -> the models of the query parameters those hooks read (the DELETE route declares them)
DELETION_OPTIONS: dict[str, list[type]] = {}


def on_deletion(type_name: str, hook: Callable[..., Awaitable[list[Any]]], options: type | None = None) -> None:
    """Register ``hook(conn, row, options, settings) -> [NewJob]`` for when a deletion of a ``type_name``
    resource starts (in its transaction, after the resource's own job: the jobs are inserted there).
    ``options``: a pydantic model of the query parameters it reads (``DELETE /v1/<plural>/{id}``
    declares them). A hook may raise an ApiError (a 4xx naming the option) to refuse the deletion."""
    DELETION_HOOKS.setdefault(type_name, []).append(hook)
    if options is not None:
        DELETION_OPTIONS.setdefault(type_name, []).append(options)


async def deletion_dependents(conn: Any, type_name: str, row: Any, options: Any, settings: Any) -> list[Any]:
    """Run the hooks registered for ``type_name``'s deletion and insert the jobs they ask for (same
    transaction, without NOTIFY: the caller notifies). Returns the inserted jobs."""
    return await _insert_dependent_jobs(DELETION_HOOKS.get(type_name, []), conn, row, options, settings)


# (type name) -> hooks run in the transaction that cancels a deletion of that type (POST
# /v1/<plural>/{id}/actions/cancel-deletion): hook(conn, row, settings) -> list[NewJob] (a dependent type
# giving back what the deletion's start took: a server's volumes attached again)
RESTORE_HOOKS: dict[str, list[Callable[..., Awaitable[list[Any]]]]] = {}


def on_restore(type_name: str, hook: Callable[..., Awaitable[list[Any]]]) -> None:
    """Register ``hook(conn, row, settings) -> [NewJob]`` for when a deletion of a ``type_name``
    resource is cancelled (in its transaction, after the resource's own restore job)."""
    RESTORE_HOOKS.setdefault(type_name, []).append(hook)


async def restore_dependents(conn: Any, type_name: str, row: Any, settings: Any) -> list[Any]:
    """Run the hooks registered for a cancelled deletion of ``type_name`` and insert the jobs they
    ask for (same transaction, without NOTIFY: the caller notifies). Returns the inserted jobs."""
    return await _insert_dependent_jobs(RESTORE_HOOKS.get(type_name, []), conn, row, settings)


# (type name) -> hooks run in the transaction that creates a resource of that type (POST /v1/<plural>):
# hook(conn, row, spec, settings) -> list[NewJob] (a dependent type reacting to the new resource at once:
# a server joining the networks its request names, a firewall whose label selector matches a new
# server's labels taking it as a member); ``spec`` is the validated create body
CREATE_HOOKS: dict[str, list[Callable[..., Awaitable[list[Any]]]]] = {}


def on_create(type_name: str, hook: Callable[..., Awaitable[list[Any]]]) -> None:
    """Register ``hook(conn, row, spec, settings) -> [NewJob]`` for when a ``type_name`` resource is
    created (in its transaction, after its own job). A hook may raise an ApiError (a 4xx naming the
    field) to refuse the create."""
    CREATE_HOOKS.setdefault(type_name, []).append(hook)


async def create_dependents(conn: Any, type_name: str, row: Any, spec: Any, settings: Any) -> list[Any]:
    """Run the hooks registered for a create of ``type_name`` and insert the jobs they ask for (same
    transaction, without NOTIFY: the caller notifies). Returns the inserted jobs."""
    return await _insert_dependent_jobs(CREATE_HOOKS.get(type_name, []), conn, row, spec, settings)


# (type name) -> hooks run in the transaction that changes a resource's labels (PATCH /v1/<plural>/{id}):
# hook(conn, row, settings) -> list[NewJob] (a firewall's label selector takes or lets go of a server)
RELABEL_HOOKS: dict[str, list[Callable[..., Awaitable[list[Any]]]]] = {}


def on_relabel(type_name: str, hook: Callable[..., Awaitable[list[Any]]]) -> None:
    """Register ``hook(conn, row, settings) -> [NewJob]`` for when a ``type_name`` resource's labels change
    (in that transaction, the row as changed; a hook may raise an ApiError to refuse the change)."""
    RELABEL_HOOKS.setdefault(type_name, []).append(hook)


async def relabel_dependents(conn: Any, type_name: str, row: Any, settings: Any) -> list[Any]:
    """Run the hooks registered for a label change of ``type_name`` and insert the jobs they ask for (same
    transaction, without NOTIFY: the caller notifies). Returns the inserted jobs."""
    return await _insert_dependent_jobs(RELABEL_HOOKS.get(type_name, []), conn, row, settings)


#: how long a destroy held by a part that outlives the VM waits before it looks again (a snooze: no attempt)
HELD_DESTROY_RETRY_S = 30.0


async def refuse_vm_destroy(ctx: Any, vm: Any) -> None:
    """The deletion guard of the declared parts, right before the executor destroys VM ``vm`` (a fresh
    :class:`~z9.executor.proxmox.VmState`; ``ctx`` the job's context): PVE's destroy frees every disk the
    VM owns — in its config, ``unusedN`` included, and with ``destroy-unreferenced-disks`` every image of
    its vmid — so while the VM holds a part some type declares ``outlives_vm`` (by value in its config,
    or by what that type's rows recorded: ``VmParts.recorded``) the destroy waits: a Snooze naming the
    parts (the job in ``retry``, no attempt spent, until ``snooze_limit_s``), logged at warning level,
    until their own jobs have taken them off (a volume's detach, to its anchor)."""
    held: dict[str, str] = {}  # config key (or image) -> what it is
    for rt in types():
        if not rt.vm_parts.outlives_vm:
            continue
        for key, value in (vm.config or {}).items():
            what = rt.vm_parts.owns_config(key, value)
            if what is not None:
                held[key] = f"{key} ({str(value).split(',', 1)[0]}) is {what} of a {rt.name}"
        if rt.vm_parts.recorded is not None:
            held.update(await rt.vm_parts.recorded(ctx, vm))  # its own words name the row
    if held:
        msg = (f"deletion guard: VM {vm.vmid} on {vm.node} is not destroyed while it holds "
               + "; ".join(held[k] for k in sorted(held))
               + " — which outlive the VM; waiting for their own jobs to take them off")
        _guard_log.warning(msg)
        raise Snooze(msg, delay_s=HELD_DESTROY_RETRY_S)


def config_owner(key: str, value: Any) -> ResourceType[Any] | None:
    """The type declaring config entry ``key: value`` as its part on VMs (:class:`VmParts`), or None."""
    return next((rt for rt in types() if rt.vm_parts.owns_config(key, value) is not None), None)


def declared_tag(tag: str) -> bool:
    """Some type declares ``tag`` (by prefix) as its part on VMs."""
    return any(tag.startswith(p) for rt in types() for p in rt.vm_parts.tags)


def declared_ipset_entry(comment: str | None) -> bool:
    """Some type declares the IP-set entry commented ``comment`` (by prefix) as its part."""
    return bool(comment) and any(str(comment).startswith(p) for rt in types() for p in rt.vm_parts.ipset_entries)


def declared_firewall_rule(comment: str | None) -> bool:
    """Some type declares the VM firewall rule commented ``comment`` (by prefix) as its part."""
    return bool(comment) and any(str(comment).startswith(p) for rt in types() for p in rt.vm_parts.firewall_rules)


async def vm_firewall(db: Any, owner: str, member: str) -> list[FirewallContribution]:
    """What every type adds to the firewall of member ``member`` of resource ``owner`` (in registry order)."""
    out = []
    for rt in types():
        if rt.vm_parts.firewall is not None:
            got = await rt.vm_parts.firewall(db, owner, member)
            if got is not None:
                out.append(got)
    return out


def pve_endpoints() -> tuple[str, ...]:
    """Every endpoint the types' own Proxmox adapters declare (no duplicates, in registry order)."""
    return tuple(dict.fromkeys(e for rt in types() for e in rt.pve_endpoints))


def periodic() -> list[ResourceType[Any]]:
    """The types with a periodic observe job."""
    return [t for t in REGISTRY.values() if t.periodic is not None]


def register(rtype: ResourceType[Any]) -> ResourceType[Any]:
    """Add a resource type (its name, prefix and table unique); returns it. :data:`REGISTRY`
    stays in the types' ``order``."""
    for other in REGISTRY.values():
        if other.name != rtype.name and (other.prefix == rtype.prefix or other.table == rtype.table):
            raise ValueError(f"resource types {other.name} and {rtype.name} share a prefix or a table")
        taken = {q.name for q in other.quotas} & {q.name for q in rtype.quotas}
        if other.name != rtype.name and taken:
            raise ValueError(f"resource types {other.name} and {rtype.name} both declare the quota {sorted(taken)}")
    REGISTRY[rtype.name] = rtype
    ordered = sorted(REGISTRY.values(), key=lambda t: (t.order, t.name))
    REGISTRY.clear()
    REGISTRY.update((t.name, t) for t in ordered)
    return rtype


def types() -> list[ResourceType[Any]]:
    """Every registered type, in order."""
    return list(REGISTRY.values())


def prefixes() -> tuple[str, ...]:
    """The id prefixes of the registered types, in order."""
    return tuple(t.prefix for t in REGISTRY.values())


def slice_modules(part: str) -> list[tuple[ResourceType[Any], ModuleType]]:
    """Each registered type's slice module ``part`` (``api``, ``jobs``, ``client``), in order,
    skipping the types without one."""
    found = [(t, t.slice_module(part)) for t in REGISTRY.values()]
    return [(t, m) for t, m in found if m is not None]


def job_modules(rtype: ResourceType[Any]) -> list[Any]:
    """The job kinds of a type's slice: every module of its ``jobs`` package that sets ``KIND``
    (the modules they share set none), and the kinds a module lists in ``JOB_KINDS`` (one
    reconciler under several names: objects, each with its ``KIND`` and phases)."""
    pkg = rtype.slice_module("jobs")
    if pkg is None:
        return []
    mods = [importlib.import_module(f"{pkg.__name__}.{m.name}") for m in pkgutil.iter_modules(pkg.__path__)]
    return ([m for m in mods if isinstance(getattr(m, "KIND", None), str)]
            + [k for m in mods for k in getattr(m, "JOB_KINDS", ())])


def get(name: str | None) -> ResourceType[Any] | None:
    """The registered type called ``name`` (a ``jobs.resource_type``), or None."""
    return REGISTRY.get(name) if name else None


def buffered() -> list[ResourceType[Any]]:
    """The types whose deletion has a buffer (the reaper's work)."""
    return [t for t in REGISTRY.values() if isinstance(t.deletion, Buffered)]


async def mark_failed_by_job(db: DB, resource_type: str | None, resource_id: str | None, reason: str, *,
                             kind: str, refused: bool = False) -> None:
    """A failed job's reason on its resource, whatever its type (no-op for a job without a
    registered resource)."""
    rtype = get(resource_type)
    if rtype is not None and resource_id is not None:
        await rtype.mark_failed_by_job(db, resource_id, reason, kind=kind, refused=refused)


# ------------------------------------------------------------------ quotas (every list derived from here)

def quota_units() -> dict[str, QuotaUnit]:
    """``{name: unit}`` of every quota the registered types declare, in the registry's order (the
    order of ``GET /v1/quota``, ``z9 quota`` and the settings' document). Raises ``ValueError`` when a
    type counts toward a unit no type declares."""
    units = {q.name: q for t in REGISTRY.values() for q in t.quotas}
    for t in REGISTRY.values():
        unknown = [u for u in (t.quota_usage.units if t.quota_usage else ()) if u not in units]
        if unknown:
            raise ValueError(f"resource type {t.name} counts toward quotas no type declares: {unknown}")
    return units


def quota_counted_by(unit: str) -> list[tuple[ResourceType[Any], str]]:
    """The types whose rows count toward ``unit``, each with what of it counts, in order."""
    return [(t, t.quota_usage.counts[unit]) for t in REGISTRY.values()
            if t.quota_usage is not None and unit in t.quota_usage.counts]


def quota_description(unit: str) -> str:
    """What counts toward ``unit`` ("servers' cores and … not yet deleted"), from every type
    counting toward it: the documents' text (``GET /v1/quota``'s shape, docs/settings.md)."""
    return " and ".join(what for _, what in quota_counted_by(unit)) + " not yet deleted"


def unknown_quota_units(names: Any) -> list[str]:
    """The names among ``names`` that are no registered quota (a Z9_QUOTA_* setting's typo)."""
    units = quota_units()
    return [n for n in names if n not in units]


async def quota_usage(db: DB, tenant_id: str, units: Any = None, *, lock: bool = False) -> dict[str, int]:
    """The tenant's use of ``units`` (default: every quota): each type counting toward one of them
    runs its own query (:class:`QuotaUsage`), and the contributions add up. ``lock``: first take
    the tenant's quota lock (held until the transaction ends): each count is then a statement of its
    own after it, which sees what the lock's previous holder committed (``tenant_quota_lock``)."""
    wanted = list(quota_units()) if units is None else list(units)
    unknown = unknown_quota_units(wanted)
    if unknown:
        raise KeyError(f"no such quota: {unknown}")
    if lock:
        await store.tenant_quota_lock(db, tenant_id)
    used = dict.fromkeys(wanted, 0)
    for t in REGISTRY.values():
        if t.quota_usage is None or not set(t.quota_usage.units) & set(wanted):
            continue
        got = await store.tenant_quota_count(db, t.quota_usage.query, tenant_id)
        if set(got) != set(t.quota_usage.units):
            raise ValueError(f"resource type {t.name}: query {t.quota_usage.query} returns {sorted(got)}, "
                             f"not the units it declares {sorted(t.quota_usage.units)}")
        for u in wanted:
            used[u] += got.get(u, 0)
    return used


def _import_slices() -> None:
    """Import every slice under this package's folders (each registers its type): a new type is a
    new folder, named in no list."""
    for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if m.ispkg:
            importlib.import_module(f"{__name__}.{m.name}")


_import_slices()
