"""Typed wrappers around the named queries of the generic tables (``queries/<table>.sql``; each
resource type's are its slice's ``store.py``): one function per query.

Every function takes ``db`` — an asyncpg ``Connection`` or ``Pool`` — as its first argument and
returns models (``Job``, ``Server``) or plain values. Fenced job writes take a :class:`Lease` and
raise :class:`~z9.common.errors.LeaseLost` when they match no row.

This module is the PostgreSQL error boundary: every public coroutine below translates asyncpg's
errors (see :func:`_boundary`) — a unique violation becomes
:class:`~z9.common.errors.UniqueViolation` (an exclusion violation
:class:`~z9.common.errors.ExclusionViolation`) naming its constraint, a lost or refused connection one
:class:`~z9.common.errors.DatabaseUnavailable` — so services never catch asyncpg types.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, AsyncIterator, Callable, Iterable, Mapping, Protocol

import asyncpg

from .db import LOCK_WAIT_ERRORS, TRANSIENT_DB_ERRORS
from .errors import (CheckViolation, ConstraintViolation, DatabaseUnavailable, ExclusionViolation, LeaseLost,
                     LockWaitTimeout, UniqueViolation)
from .ids import new_id
from .models import Job
from .labels import Selector
from .requestctx import current_actor, current_request_id
from .sql import NULL, q, ql, qt
from .tracing import current_trace_context

log = logging.getLogger("z9.store")


class DB(Protocol):
    """What the wrappers need: an asyncpg ``Connection`` or ``Pool``."""

    async def fetch(self, query: str, *args: Any) -> list[Any]: ...
    async def fetchrow(self, query: str, *args: Any) -> Any: ...
    async def fetchval(self, query: str, *args: Any) -> Any: ...
    async def execute(self, query: str, *args: Any) -> str: ...


@dataclass(frozen=True)
class Lease:
    """What fences a worker's writes: the job id, this worker's identity and the attempt."""

    job_id: str
    owner: str
    attempt: int


def token_sha256(token: str) -> bytes:
    """SHA-256 of an API token (tokens are 256-bit random, so a fast hash is enough)."""
    return hashlib.sha256(token.encode()).digest()


# ---------------------------------------------------------------- tenants and tokens

async def tenant_upsert(db: DB, name: str) -> str:
    """Create tenant ``name`` if missing; return its id."""
    row = await db.fetchrow(q("tenant_upsert"), new_id("ten"), name)
    return row["id"]


async def tenant_name(db: DB, tenant_id: str) -> str | None:
    """The name of tenant ``tenant_id`` (what people know it by), None when there is none."""
    return await db.fetchval(q("tenant_name"), tenant_id)


async def tenant_id_by_name(db: DB, name: str) -> str | None:
    """The id of the tenant named ``name``, None when there is none."""
    return await db.fetchval(q("tenant_id_by_name"), name)


async def tenant_names(db: DB, tenant_ids: Iterable[str | None]) -> dict[str, str]:
    """{id: name} of the tenants ``tenant_ids`` (None and unknown ids left out)."""
    ids = sorted({t for t in tenant_ids if t is not None})
    return {r["id"]: r["name"] for r in await db.fetch(q("tenant_names"), ids)} if ids else {}


async def api_token_insert(db: DB, tenant_id: str, token: str, name: str = "default", *,
                           scopes: Iterable[str] = ("read", "write"), expires_at: datetime | None = None,
                           created_by: str | None = None) -> str:
    """Store the hash of ``token`` for ``tenant_id`` with ``scopes`` (read, write, operator),
    valid until ``expires_at`` (None: until revoked); return the token's id."""
    return (await api_token_create(db, tenant_id, token, name, scopes=scopes, expires_at=expires_at,
                                   created_by=created_by))["id"]


async def api_token_create(db: DB, tenant_id: str, token: str, name: str, *, scopes: Iterable[str],
                           expires_at: datetime | None = None, created_by: str | None = None) -> Any:
    """Like :func:`api_token_insert`; returns the stored row (id, tenant_id, name, scopes,
    created_at, expires_at, last_used_at, revoked_at, created_by), never the secret."""
    return await db.fetchrow(q("api_token_insert"), new_id("tok"), tenant_id, name, token_sha256(token),
                             sorted(set(scopes)), expires_at, created_by)


async def api_token_auth(db: DB, token: str, *, now: datetime | None = None) -> Any:
    """The valid (known, not revoked, not expired at ``now``: None is the database's now()) token
    ``token``: a row (id, tenant_id, scopes, expires_at), or None."""
    return await db.fetchrow(q("api_token_auth"), token_sha256(token), now)


async def api_token_auth_sha256(db: DB, token_sha256: bytes, *, now: datetime | None = None) -> Any:
    """:func:`api_token_auth` by the token's SHA-256 (a console session knows only that)."""
    return await db.fetchrow(q("api_token_auth"), token_sha256, now)


async def console_session_create(db: DB, session_sha256: bytes, token_id: str, idle_s: float, max_s: float, *,
                                 now: datetime | None = None) -> Any:
    """A console session (only its id's SHA-256 stored) authenticating as ``token_id``, expiring
    after ``min(idle_s, max_s)`` seconds: its ``expires_at``."""
    return await db.fetchval(q("console_session_insert"), session_sha256, token_id, float(idle_s), now, float(max_s))


async def console_session_resolve(db: DB, session_sha256: bytes, idle_s: float, max_s: float, *,
                                  now: datetime | None = None) -> Any:
    """The live (not revoked, not expired) session ``session_sha256``: a row (token_id,
    token_sha256, expires_at), or None; its expiry moves on with use (idle cap, never past
    ``created_at + max_s``)."""
    return await db.fetchrow(q("console_session_resolve"), session_sha256, now, float(idle_s), float(max_s))


async def console_session_revoke(db: DB, session_sha256: bytes, *, now: datetime | None = None) -> str | None:
    """End the session (idempotent): its token's id, or None for an unknown session."""
    return await db.fetchval(q("console_session_revoke"), session_sha256, now)


async def console_session_prune(db: DB, after_s: float, *, now: datetime | None = None) -> int:
    """Delete the console sessions ended (expired or signed out) more than ``after_s`` seconds
    ago; returns how many."""
    return int((await db.execute(q("console_session_prune"), float(after_s), now)).split()[-1])


async def api_token_list(db: DB, tenant_id: str, *, after: str | None = None, include_revoked: bool = False,
                         limit: int = 100) -> list[Any]:
    """The tenant's tokens ordered by id (rows as :func:`api_token_create`'s)."""
    return await db.fetch(q("api_token_list"), tenant_id, after, include_revoked, limit)


async def api_token_revoke(db: DB, token_id: str, tenant_id: str) -> Any:
    """Revoke the tenant's token ``token_id`` (idempotent); its row, or None when the tenant
    has no such token. Every token it created is revoked too (:func:`api_token_revoke_tree`)."""
    row, _ = await api_token_revoke_tree(db, token_id, tenant_id)
    return row


async def api_token_revoke_tree(db: DB, token_id: str, tenant_id: str) -> tuple[Any, list[str]]:
    """Revoke the tenant's token ``token_id`` and every token it created, transitively:
    ``(its row or None, the ids of every token revoked, its own included)``."""
    rows = await db.fetch(q("api_token_revoke"), token_id, tenant_id)
    return next((r for r in rows if r["id"] == token_id), None), [r["id"] for r in rows]


async def api_token_touch(db: DB, token_ids: list[str], coarseness_s: float, *, now: datetime | None = None) -> None:
    """Set ``last_used_at = now`` on the tokens not touched within ``coarseness_s`` seconds."""
    if token_ids:
        await db.execute(q("api_token_touch"), token_ids, coarseness_s, now)


async def api_token_tenant(db: DB, token: str, *, now: datetime | None = None) -> str | None:
    """The tenant id owning ``token``, or None (unknown, revoked or expired at ``now``)."""
    row = await db.fetchrow(q("api_token_tenant"), token_sha256(token), now)
    return row["id"] if row else None


# ---------------------------------------------------------------- idempotency keys

async def idempotency_lock(db: DB, tenant_id: str, key: str) -> None:
    """Transaction-scoped advisory lock on (tenant, key): concurrent requests with one key
    run one after the other."""
    await db.execute(q("idempotency_lock"), f"{tenant_id}/{key}")


async def idempotency_prune(db: DB, retention_s: float, *, now: datetime | None = None) -> int:
    """Forget Idempotency-Keys older than ``retention_s`` seconds; returns how many."""
    return int((await db.execute(q("idempotency_prune"), retention_s, now)).split()[-1])


async def idempotency_get(db: DB, tenant_id: str, key: str) -> Any:
    """The stored answer for (tenant, key): a record (request_sha256, response_status,
    response_body), or None."""
    return await db.fetchrow(q("idempotency_get"), tenant_id, key)


async def idempotency_insert(
    db: DB, tenant_id: str, key: str, request_sha256: bytes, status: int, body: Any
) -> None:
    """Record the answer given for ``key`` (callers hold ``idempotency_lock``)."""
    await db.execute(q("idempotency_insert"), tenant_id, key, request_sha256, status, body)


# ---------------------------------------------------------------- servers


# ---------------------------------------------------------------- resource lifecycle
# Written once for every resource table; ``sql`` is the type's (table, status enum type) from the
# registry (z9.resources.ResourceType.sql), which wraps these with its row model.

SqlTarget = tuple[str, str]


async def resource_get(db: DB, sql: SqlTarget, rid: str, tenant_id: str | None) -> Any:
    return await db.fetchrow(qt("resource_get", *sql), rid, tenant_id)


async def resource_list(db: DB, sql: SqlTarget, tenant_id: str, after: str | None, status: str | None,
                        limit: int, name: str | None = None, selector: Selector | None = None,
                        include_deleted: bool = True) -> list[Any]:
    return await db.fetch(qt("resource_list", *sql), tenant_id, after, status, limit, name,
                          *(selector or Selector()).params(), include_deleted)


async def resource_mark_deleting(db: DB, sql: SqlTarget, rid: str, tenant_id: str, buffer_s: float, *,
                                 now: datetime | None = None) -> Any:
    return await db.fetchrow(qt("resource_mark_deleting", *sql), rid, tenant_id, buffer_s, now)


async def resource_mark_destroying(db: DB, sql: SqlTarget, rid: str, tenant_id: str) -> Any:
    return await db.fetchrow(qt("resource_mark_destroying", *sql), rid, tenant_id)


async def resource_cancel_deletion(db: DB, sql: SqlTarget, rid: str, tenant_id: str, *,
                                   now: datetime | None = None) -> Any:
    return await db.fetchrow(qt("resource_cancel_deletion", *sql), rid, tenant_id, now)


async def resource_reap_expired(db: DB, sql: SqlTarget, limit: int, *, now: datetime | None = None) -> list[Any]:
    return await db.fetch(qt("resource_reap_expired", *sql), limit, now)


async def resource_periodic_due(db: DB, sql: SqlTarget, statuses: list[str], interval_s: float, limit: int, *,
                                now: datetime | None = None) -> list[Any]:
    return await db.fetch(qt("resource_periodic_due", *sql), statuses, float(interval_s), limit, now)


async def resource_observed(db: DB, sql: SqlTarget, rid: str, status: str | None, from_statuses: list[str]) -> Any:
    return await db.fetchrow(qt("resource_observed", *sql), rid, status, from_statuses)


async def resource_deleted(db: DB, sql: SqlTarget, rid: str) -> bool:
    return bool(await db.fetchval(qt("resource_deleted", *sql), rid))


async def resource_mark_failed(db: DB, sql: SqlTarget, rid: str, reason: str, ends_deletion: bool) -> None:
    await db.fetchval(qt("resource_mark_failed", *sql), rid, reason, ends_deletion)


async def resource_drift_due(db: DB, sql: SqlTarget, region: str, statuses: list[str], interval_s: float,
                             limit: int, *, now: datetime | None = None) -> list[Any]:
    """Rows of a type in ``region`` due for a drift check (no live job; unchecked for ``interval_s``)."""
    return list(await db.fetch(qt("resource_drift_due", *sql), region, statuses, interval_s, limit, now))


async def resource_drift_record(db: DB, rid: str, rtype: str, tenant_id: str, region: str, *, in_sync: bool,
                                job_kind: str | None, drift: list[Any], steps: list[Any],
                                now: datetime | None = None) -> None:
    """What a periodic plan found for one resource (``drifted_since`` kept while it stays drifted)."""
    await db.execute(q("resource_drift_record"), rid, rtype, tenant_id, region, in_sync, job_kind, drift, steps, now)


async def resource_drift_unknown(db: DB, rid: str, rtype: str, tenant_id: str, region: str, why: str, *,
                                 now: datetime | None = None) -> None:
    """A periodic plan that could not be made now: checked, its last known state kept."""
    await db.execute(q("resource_drift_unknown"), rid, rtype, tenant_id, region, why, now)


async def resource_drift_summary(db: DB, sql: SqlTarget, rtype: str) -> tuple[int, datetime | None]:
    """(how many of the type's live resources are drifted, since when the oldest)."""
    row = await db.fetchrow(qt("resource_drift_summary", *sql), rtype)
    return int(row["drifted"]), row["since"]


async def resource_drift_drifted(db: DB, sql: SqlTarget, rtype: str, limit: int) -> list[Any]:
    """The type's live drifted resources, drifted longest first."""
    return list(await db.fetch(qt("resource_drift_drifted", *sql), rtype, limit))


async def session_name_local(db: DB, name: str) -> None:
    """Name the session ``name`` in ``pg_stat_activity`` until the transaction ends (``SET LOCAL``)."""
    await db.execute(q("session_name_local"), name)


async def resource_live_jobs(db: DB, resource_id: str) -> list[Any]:
    """The live (pending, running, retry) jobs of ``resource_id`` itself, oldest first: id, kind, status."""
    return list(await db.fetch(q("resource_live_jobs"), resource_id))


async def resource_count_own_live_jobs(db: DB, resource_id: str) -> int:
    """How many live (pending, running, retry) jobs have ``resource_id`` as their resource."""
    return await db.fetchval(q("resource_count_own_live_jobs"), resource_id)


async def resource_create_failed(db: DB, resource_id: str, create_kind: str) -> bool:
    """True when the resource's create job failed and no job of it ever succeeded (nothing of it in use)."""
    return bool(await db.fetchval(q("resource_create_failed"), resource_id, create_kind))


async def resource_latest_job_args(db: DB, resource_id: str, kind: str) -> dict[str, Any] | None:
    """The args of the resource's latest job of ``kind`` (None: no such job kept)."""
    return await db.fetchval(q("resource_latest_job_args"), resource_id, kind)


async def resource_count_live_jobs(db: DB, resource_id: str) -> int:
    """How many live (pending, running, retry) jobs lock ``resource_id`` (as their resource or
    as an extra lock key)."""
    return await db.fetchval(q("resource_count_live_jobs"), resource_id)


# ---------------------------------------------------------------- VM clone requests

@dataclass(frozen=True)
class CloneRequest:
    """A clone request of one member of a resource. ``uncertain_since`` (epoch seconds) while no
    answer was recorded: it may still be performed, whoever sent it."""

    member: str
    vmid: int
    node: str
    job_id: str
    upid: str | None
    sent_at: float
    uncertain_since: float | None


async def vm_clone_sent(db: DB, lease: Lease, resource_id: str, member: str, vmid: int, node: str) -> None:
    """Record a clone request before sending it (fenced by ``lease``). Raises LeaseLost."""
    await _fenced(db, "vm_clone_sent", lease, resource_id, member, vmid, node)


async def vm_clone_answered(db: DB, resource_id: str, member: str, vmid: int, upid: str | None) -> None:
    """The request to ``vmid`` was answered — with the clone task's ``upid``, or with an error
    (None): no longer uncertain."""
    await db.fetchval(q("vm_clone_answered"), resource_id, member, vmid, upid)


async def vm_clone_lost(db: DB, resource_id: str, member: str, vmid: int) -> None:
    """The sender saw the answer to the request to ``vmid`` lost: in flight until now."""
    await db.fetchval(q("vm_clone_lost"), resource_id, member, vmid)


async def vm_clone_refused(db: DB, resource_id: str, member: str, vmid: int) -> None:
    """The request to ``vmid`` was refused (nothing cloned): forget it."""
    await db.execute(q("vm_clone_refused"), resource_id, member, vmid)


async def vm_clone_requests(db: DB, resource_id: str, member: str | None = None) -> list[CloneRequest]:
    """Every clone request recorded for ``resource_id`` (of one ``member`` when given)."""
    return [CloneRequest(r["member"], r["vmid"], r["node"], r["job_id"], r["upid"], r["sent_at"],
                         r["uncertain_since"])
            for r in await db.fetch(q("vm_clone_requests"), resource_id, member)]


# ---------------------------------------------------------------- VM private addresses

async def vm_private_address(pool: asyncpg.Pool, resource_id: str, member: str, region: str, *, first: Any,
                             count: int, excluded: list[Any], quarantine_s: int) -> str | None:
    """The private address of (``resource_id``, ``member``) in ``region``: the one it has, else the
    first free IP of ``count`` from ``first`` (never one of ``excluded``, nor one live or quarantined
    in the region), taken for it now. None: no IP left. Idempotent (one live row per member)."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(q("vm_private_address_lock"), region)
        await conn.execute(q("vm_private_address_forget_expired"), region)
        return await conn.fetchval(q("vm_private_address_allocate"), resource_id, member, region, str(first),
                                   int(count), [str(x) for x in excluded], int(quarantine_s))


async def vm_private_addresses_of(db: DB, resource_id: str) -> dict[str, str]:
    """{member: ip} of the resource's VMs' live private addresses."""
    return {r["member"]: r["ip"] for r in await db.fetch(q("vm_private_addresses_of"), resource_id)}


async def vm_private_address_release(db: DB, resource_id: str, member: str) -> str | None:
    """The member's VM is gone: its private address is quarantined (returns it; None: it had none)."""
    return await db.fetchval(q("vm_private_address_release"), resource_id, member)


# ---------------------------------------------------------------- jobs: producers

@dataclass(frozen=True)
class NewJob:
    """A job to enqueue. ``trace_context`` (W3C ``traceparent``/``tracestate``) defaults to the
    current span's, taken when the NewJob is made: the executor's job span continues that trace."""

    kind: str
    region: str
    tenant_id: str | None = None
    resource_type: str | None = None
    resource_id: str | None = None
    args: dict[str, Any] | None = None
    max_attempts: int = 10
    trace_context: dict[str, Any] | None = field(default_factory=current_trace_context)
    extra_lock_keys: tuple[str, ...] = ()
    """Resources this job touches besides its own: it runs only when no earlier live job of
    any of them (or of its own) is running or waiting."""
    #: the API token and request that asked for the job (``z9.common.requestctx``: taken from
    #: the request being served when the NewJob is made; None for z9's own jobs)
    actor_token_id: str | None = field(default_factory=current_actor)
    request_id: str | None = field(default_factory=current_request_id)


async def job_insert(db: DB, job: NewJob, *, notify: bool = True) -> Job:
    """Insert one job (and NOTIFY its region, delivered at commit; one statement). Call inside
    the transaction that writes the job's intent, or on a pool (its own transaction). With
    ``notify=False`` the caller notifies after commit, e.g. through
    :class:`z9.common.notify.JobNotifier` (coalesced)."""
    row = await db.fetchrow(q("job_insert_notify" if notify else "job_insert"), new_id("job"), job.kind,
                            job.region, job.tenant_id, job.resource_type, job.resource_id, job.args or {},
                            job.max_attempts, job.trace_context, list(job.extra_lock_keys),
                            job.actor_token_id, job.request_id)
    return Job.from_record(row)


async def job_insert_many(db: DB, jobs: list[NewJob], *, notify: bool = True) -> list[Job]:
    """Insert many jobs in one statement; NOTIFY each distinct region once."""
    if not jobs:
        return []
    rows = await db.fetch(
        q("job_insert_many"),
        [new_id("job") for _ in jobs], [j.kind for j in jobs], [j.region for j in jobs],
        [j.tenant_id for j in jobs], [j.resource_type for j in jobs], [j.resource_id for j in jobs],
        [j.args or {} for j in jobs], [j.max_attempts for j in jobs], [j.trace_context for j in jobs],
        [json.dumps(list(j.extra_lock_keys)) for j in jobs],
        [j.actor_token_id for j in jobs], [j.request_id for j in jobs],
    )
    if notify:
        await jobs_notify(db, sorted({j.region for j in jobs}))
    return [Job.from_record(r) for r in rows]


async def jobs_notify(db: DB, regions: Iterable[str]) -> None:
    """``NOTIFY z9_jobs, '<region>'`` for each region (one statement)."""
    regions = list(regions)
    if regions:
        await db.execute(q("jobs_notify"), regions)


async def job_get(db: DB, job_id: str, tenant_id: str | None = None) -> Job | None:
    """The job, scoped to ``tenant_id`` when given; None when absent (or another tenant's)."""
    if tenant_id is None:
        row = await db.fetchrow(q("job_get_any"), job_id)
    else:
        row = await db.fetchrow(q("job_get"), job_id, tenant_id)
    return Job.from_record(row) if row else None


async def job_list(db: DB, tenant_id: str, *, resource_id: str | None = None, after_seq: int | None = None,
                   limit: int = 100, actor_token_id: str | None = None, newest_first: bool = False,
                   status: str | None = None, kind: str | None = None,
                   exclude_kinds: Iterable[str] = ()) -> list[Job]:
    """Up to ``limit`` jobs of the tenant (of one resource; asked for by one token; of one status
    or kind; not of ``exclude_kinds``) in submission order after ``after_seq`` — or, newest first,
    before it."""
    tail = (status, kind, sorted(exclude_kinds))
    if resource_id is not None:
        name = "job_list_for_resource_newest" if newest_first else "job_list_for_resource"
        rows = await db.fetch(q(name), tenant_id, resource_id, after_seq, limit, actor_token_id, *tail)
    else:
        name = "job_list_newest" if newest_first else "job_list"
        rows = await db.fetch(q(name), tenant_id, after_seq, limit, actor_token_id, *tail)
    return [Job.from_record(r) for r in rows]


# ---------------------------------------------------------------- jobs: workers (fenced)

async def jobs_unblock_now(db: DB) -> None:
    """In a transaction that ended jobs with a resource: make the jobs waiting on them claimable
    now rather than at commit (see ``jobs_unblock_now`` in queries/jobs.sql)."""
    await db.execute(q("jobs_unblock_now"))


async def jobs_unblock_missed(db: DB, limit: int = 1000) -> list[Any]:
    """Blocked pending jobs nothing blocks any more → claimable (rows: id, region); see queries/jobs.sql."""
    return await db.fetch(q("jobs_unblock_missed"), limit)


async def job_claim(db: DB, regions: list[str], limit: int, owner: str, lease_ttl_s: float,
                    caps: Mapping[str, int] | None = None, on_held: CapHeld | None = None, *,
                    now: datetime | None = None, tenant_cap: int | None = None) -> list[Job]:
    """Claim up to ``limit`` pending jobs of ``regions`` (``FOR UPDATE SKIP LOCKED``), at most the
    earliest live job of each resource; each gets ``lease_owner = owner`` and attempt + 1.
    Tenants are taken in turn, each one's jobs oldest first (``job_claim`` in queries/jobs.sql).
    One statement per region (in the order given) until ``limit`` jobs are claimed.
    ``caps``: region → most running jobs across all executors (``max_concurrent_jobs``); a
    region without one is claimed as above, at no extra cost (see :func:`_job_claim_capped`).
    ``tenant_cap``: most running jobs of one tenant per region (``tenant_max_running_jobs``; a
    tenant's own ``running_jobs`` limit overrides it; None: none but the tenants' own).
    ``now``: the time jobs are due by and leases run from (None: the database's now())."""
    if caps and any(r in caps for r in regions):
        return await _job_claim_capped(db, regions, limit, owner, lease_ttl_s, caps, on_held, now, tenant_cap)
    out: list[Job] = []
    for region in regions:
        if len(out) >= limit:
            break
        try:
            rows = await db.fetch(job_claim_sql(region, limit - len(out), owner, lease_ttl_s, now, tenant_cap))
        except Exception as e:
            _claim_interrupted(db, out, region, e)
            return out
        out.extend(Job.from_record(r) for r in rows)
    return out


def _claim_interrupted(db: DB, out: list[Job], region: str, exc: Exception) -> None:
    """A claim of several regions failed at ``region``: raise ``exc`` unless the regions before
    it already claimed ``out`` and committed them (on a pool, or a connection outside a
    transaction, each region's claim commits on its own) — those jobs are leased to the caller
    now, and raising would leave them unrun until their leases expired. Then the caller gets
    them (the failed region is asked again at its next claim)."""
    committed = isinstance(db, asyncpg.Pool) or not db.is_in_transaction()  # type: ignore[attr-defined]
    if not out or not committed:
        raise exc
    log.warning("claim of region %s failed (%s: %s); handing over the %d job(s) claimed before it",
                region, type(exc).__name__, exc, len(out))


CapHeld = Callable[[str, int, int], None]
"""``on_held(region, cap, running)``: a capped claim took fewer jobs than it had room for in this
executor because the region was at its cap, while claimable jobs of the region waited."""


async def _job_claim_capped(db: DB, regions: list[str], limit: int, owner: str, lease_ttl_s: float,
                            caps: Mapping[str, int], on_held: CapHeld | None,
                            now: datetime | None = None, tenant_cap: int | None = None) -> list[Job]:
    """:func:`job_claim` with per-region caps. A capped region's claim runs under its advisory
    lock (``job_region_cap_lock``, held to commit): count the region's running jobs with an
    unexpired lease, claim at most ``cap − running`` through the ordinary ``job_claim`` query.
    Serialized per region, so executors claiming at once never exceed the cap together.

    On a pool (or a connection outside a transaction) each capped region gets its own short
    transaction. Inside a caller's transaction (the claim of a finish batch) the locks are held to
    its commit, so every capped region of the call is locked first, in sorted order."""
    out: list[Job] = []
    capped = sorted(r for r in regions if r in caps)
    # a Connection, or a pool's connection proxy (which forwards is_in_transaction)
    in_tx = not isinstance(db, asyncpg.Pool) and db.is_in_transaction()  # type: ignore[attr-defined]
    if in_tx:
        await db.execute(q("job_region_cap_lock"), capped)
    for region in regions:
        if len(out) >= limit:
            break
        want = limit - len(out)
        try:
            if region not in caps:
                got = await job_claim(db, [region], want, owner, lease_ttl_s, now=now, tenant_cap=tenant_cap)
            elif in_tx:
                got = await _claim_under_cap(db, region, caps[region], want, owner, lease_ttl_s, on_held, now,
                                             tenant_cap)
            else:
                async with _transaction(db) as conn:
                    await conn.execute(q("job_region_cap_lock"), [region])
                    got = await _claim_under_cap(conn, region, caps[region], want, owner, lease_ttl_s, on_held,
                                                 now, tenant_cap)
        except Exception as e:  # a cap lock not had within lock_timeout, a lost connection
            _claim_interrupted(db, out, region, e)
            return out
        out.extend(got)
    return out


async def _claim_under_cap(conn: Any, region: str, cap: int, want: int, owner: str, lease_ttl_s: float,
                           on_held: CapHeld | None, now: datetime | None = None,
                           tenant_cap: int | None = None) -> list[Job]:
    """Holding the region's cap lock: claim at most ``min(want, cap − running)`` of its jobs."""
    running = await conn.fetchval(q("job_region_running"), region, now)
    room = min(want, cap - running)
    got = await job_claim(conn, [region], room, owner, lease_ttl_s, now=now, tenant_cap=tenant_cap) if room > 0 else []
    if room < want and len(got) == max(room, 0) and on_held is not None:
        # the cap, not the queue, limited this claim (if anything claimable is left waiting)
        if await conn.fetchval(q("job_region_claimable"), region, now):
            on_held(region, cap, running + len(got))
    return got


@contextlib.asynccontextmanager
async def _transaction(db: DB) -> AsyncIterator[Any]:
    """A transaction on ``db``: a connection of the pool, or the connection itself."""
    if isinstance(db, asyncpg.Pool):
        async with db.acquire() as conn, conn.transaction():
            yield conn
    else:
        async with db.transaction():  # type: ignore[attr-defined]
            yield db


def job_claim_sql(region: str, limit: int, owner: str, lease_ttl_s: float, now: datetime | None = None,
                  tenant_cap: int | None = None) -> str:
    """The claim of one region as a statement without parameters (values as literals, see
    ``job_claim`` in queries/jobs.sql and :func:`z9.common.sql.ql`): planned once per connection for
    its real ``LIMIT`` instead of on every execution. ``now`` None (production) is the literal
    ``NULL``, one text for every claim; a test clock's time makes a statement of its own."""
    if not isinstance(limit, int) or limit < 1:
        raise ValueError(f"claim limit must be a positive int, not {limit!r}")
    return ql("job_claim", region=str(region), limit=limit, owner=str(owner), lease_ttl_s=float(lease_ttl_s),
              now=NULL if now is None else now, tenant_cap=NULL if tenant_cap is None else int(tenant_cap))


async def _fenced(db: DB, name: str, lease: Lease, *args: Any) -> Any:
    row = await db.fetchrow(q(name), lease.job_id, lease.owner, lease.attempt, *args)
    if row is None:
        raise LeaseLost(f"job {lease.job_id}: lease of {lease.owner} (attempt {lease.attempt}) is lost")
    return row


async def job_heartbeat(db: DB, lease: Lease, lease_ttl_s: float, *, now: datetime | None = None) -> None:
    """Extend the lease by ``lease_ttl_s`` seconds from now. Raises LeaseLost."""
    await _fenced(db, "job_heartbeat", lease, lease_ttl_s, now)


async def job_heartbeat_many(db: DB, leases: list[Lease], lease_ttl_s: float, *,
                             now: datetime | None = None) -> list[Lease]:
    """Extend every lease of ``leases`` by ``lease_ttl_s`` seconds in one statement (each row
    fenced like :func:`job_heartbeat`); returns the leases that were *lost* (matched no row)."""
    return (await job_renew_leases(db, leases, lease_ttl_s, now=now))[0]


async def job_renew_leases(db: DB, leases: list[Lease], lease_ttl_s: float, *,
                           now: datetime | None = None) -> tuple[list[Lease], list[Lease]]:
    """:func:`job_heartbeat_many`, answering (the leases lost, the leases extended): a lease held
    but not extended — its row locked by another transaction, skipped — is in neither (its expiry
    stands as it was: an executor's local lease deadline must not move for it)."""
    if not leases:
        return [], []
    rows = await db.fetch(q("job_heartbeat_many"), [l.job_id for l in leases], [l.owner for l in leases],
                          [l.attempt for l in leases], lease_ttl_s, now)
    held = {(r["id"], r["attempt"]) for r in rows}
    renewed = {(r["id"], r["attempt"]) for r in rows if r["renewed"]}
    return ([l for l in leases if (l.job_id, l.attempt) not in held],
            [l for l in leases if (l.job_id, l.attempt) in renewed])


async def job_progress(db: DB, lease: Lease, steps: list[dict[str, Any]], lease_ttl_s: float, *,
                       now: datetime | None = None) -> None:
    """Write the step list and extend the lease. Raises LeaseLost."""
    await _fenced(db, "job_progress", lease, steps, lease_ttl_s, now)


async def job_remember(db: DB, lease: Lease, facts: dict[str, Any], lease_ttl_s: float, *,
                       now: datetime | None = None) -> None:
    """Merge ``facts`` into the job's memo (kept across attempts) and extend the lease.
    Raises LeaseLost."""
    await _fenced(db, "job_remember", lease, facts, lease_ttl_s, now)


async def job_succeed(db: DB, lease: Lease, steps: list[dict[str, Any]]) -> None:
    """``running`` → ``succeeded`` with the final steps. Raises LeaseLost."""
    await _fenced(db, "job_succeed", lease, steps)


async def job_succeed_many(db: DB, finishes: list[tuple[Lease, list[dict[str, Any]]]]) -> list[Lease]:
    """``running`` → ``succeeded`` for many jobs in one statement, each row fenced like
    :func:`job_succeed`; ``finishes`` is ``[(lease, final steps)]``. Returns the leases that
    were *lost* (matched no row: those jobs are not changed). Call inside a transaction when
    results are recorded alongside."""
    if not finishes:
        return []
    rows = await db.fetch(q("job_succeed_many"), [l.job_id for l, _ in finishes], [l.owner for l, _ in finishes],
                          [l.attempt for l, _ in finishes], [json.dumps(s) if s else "[]" for _, s in finishes])
    done = {(r["id"], r["attempt"]) for r in rows}
    return [l for l, _ in finishes if (l.job_id, l.attempt) not in done]


async def job_finish_and_claim(db: DB, finishes: list[tuple[Lease, list[dict[str, Any]]]], region: str | None,
                               limit: int, owner: str, lease_ttl_s: float,
                               tenant_cap: int | None = None) -> tuple[list[Lease], list[Job]]:
    """``running`` → ``succeeded`` for ``finishes`` (``[(lease, final steps)]``, each row fenced like
    :func:`job_succeed`) and, in the same statement and commit, the claim of up to ``limit`` jobs of
    ``region`` (None: no claim) less one per lost lease — for jobs whose kinds record nothing
    (``jobs_finish_and_claim``, migration 0012). Returns (the leases that were lost, the jobs claimed)."""
    rows = await db.fetch(q("job_finish_and_claim"), [l.job_id for l, _ in finishes], [l.owner for l, _ in finishes],
                          [l.attempt for l, _ in finishes], [json.dumps(s) if s else "[]" for _, s in finishes],
                          region, limit if region is not None else 0, owner, lease_ttl_s, tenant_cap)
    done = {(r["finished_id"], r["finished_attempt"]) for r in rows if r["finished_id"] is not None}
    claimed = [Job.from_record(r) for r in rows if r["finished_id"] is None and r["id"] is not None]
    return [l for l, _ in finishes if (l.job_id, l.attempt) not in done], claimed


async def job_retry(db: DB, lease: Lease, steps: list[dict[str, Any]], error: dict[str, Any],
                    delay_s: float, *, refund_attempt: bool = False, now: datetime | None = None) -> datetime:
    """Back to ``retry`` with ``run_after = now + delay_s`` (seconds; the attempt given back when
    ``refund_attempt``); wakes the scheduler. Returns run_after. Raises LeaseLost."""
    row = await _fenced(db, "job_retry", lease, steps, error, delay_s, 1 if refund_attempt else 0, now)
    await db.execute(q("scheduler_notify"))
    return row["run_after"]


async def job_fail(db: DB, lease: Lease, steps: list[dict[str, Any]], error: dict[str, Any]) -> None:
    """``running`` → ``failed`` with ``error`` ``{class, message, at, …}``. Raises LeaseLost."""
    await _fenced(db, "job_fail", lease, steps, error)


# ---------------------------------------------------------------- jobs: scheduler

# ``now`` below: the time the decision is taken at (a test clock's); None is the database's now().

async def job_retry_due(db: DB, limit: int = 1000, *, now: datetime | None = None) -> list[Any]:
    """Move due ``retry`` jobs to ``pending``; returns rows (id, region)."""
    return await db.fetch(q("job_retry_due"), limit, now)


async def job_retry_next_in(db: DB, *, now: datetime | None = None) -> float | None:
    """Seconds (from ``now``) until the earliest ``retry`` job is due; None when none waits."""
    return await db.fetchval(q("job_retry_next_in"), now)


async def lease_reclaim_expired(db: DB, limit: int = 1000, *, now: datetime | None = None) -> list[Any]:
    """Expired leases → ``retry`` (or ``failed`` when out of attempts); rows (id, kind, status,
    region, resource_type, resource_id, error)."""
    return await db.fetch(q("lease_reclaim_expired"), limit, now)


async def job_prune_finished(db: DB, retention_s: float, limit: int = 1000, *, now: datetime | None = None) -> int:
    """Delete up to ``limit`` terminal jobs finished more than ``retention_s`` seconds ago."""
    status = await db.execute(q("job_prune_finished"), retention_s, limit, now)
    return int(status.split()[-1])


# ---------------------------------------------------------------- jobs: metrics (scheduler)

_LIVE_STATUSES = frozenset({"pending", "running", "retry"})


async def job_count_by_status(db: DB, statuses: Iterable[str]) -> list[tuple[str, str, str, int]]:
    """``(kind, region, status, count)`` for every combination present in the job table with a
    status among ``statuses``: index-only scans of the live jobs' partial index and, only when a
    finished status is asked for, of ``jobs_finished``."""
    wanted = set(statuses)
    rows: list[Any] = []
    if wanted & _LIVE_STATUSES:
        rows += await db.fetch(q("job_count_live"))
    if wanted - _LIVE_STATUSES:
        rows += await db.fetch(q("job_count_finished"))
    return [(r["kind"], r["region"], r["status"], r["n"]) for r in rows if r["status"] in wanted]


async def job_oldest_pending_age(db: DB, regions: list[str], *, now: datetime | None = None) -> dict[str, float]:
    """``{region: seconds}`` since the oldest runnable pending job of each region became
    runnable (at ``now``; None: the database's clock); 0.0 when the region has none."""
    return {r["region"]: max(0.0, r["age_s"])
            for r in await db.fetch(q("job_oldest_pending_age"), regions, now)}


# ---------------------------------------------------------------- address pools and addresses


async def job_args_merge(db: DB, job_id: str, args: dict[str, Any]) -> None:
    """Add ``args`` to a still pending job's args (in the transaction that inserted it)."""
    await db.execute(q("job_args_merge"), job_id, args)


# ---------------------------------------------------------------- quotas (migration 0020)
# The units are the type registry's (z9.resources.quota_units); nothing here names one.

async def tenant_quota_limits(db: DB, tenant_id: str) -> dict[str, int]:
    """The tenant's own limits, ``{unit: quota}`` (a unit absent: the settings' default)."""
    return {r["unit"]: int(r["quota"]) for r in await db.fetch(q("tenant_quota_limits_get"), tenant_id)}


async def tenant_quota_set(db: DB, tenant_id: str, values: dict[str, int | None]) -> dict[str, int]:
    """Set the given limits (a None value: back to the default); returns the tenant's own limits
    (one statement)."""
    given = {k: v for k, v in values.items() if v is not None}
    rows = await db.fetch(q("tenant_quota_limits_set"), tenant_id, list(given), list(given.values()),
                          [k for k, v in values.items() if v is None])
    return {r["unit"]: int(r["quota"]) for r in rows}


async def tenant_quota_lock(db: DB, tenant_id: str) -> None:
    """Take the tenant's quota lock (until the transaction ends); count in statements after it."""
    await db.execute(q("tenant_quota_lock"), tenant_id)


async def tenant_quota_count(db: DB, query: str, tenant_id: str) -> dict[str, int]:
    """One type's use of its quotas: its named query ``query`` (one row, a column per unit)."""
    row = await db.fetchrow(q(query), tenant_id)
    return {k: int(v) for k, v in row.items()}


# ---------------------------------------------------------------- job actions (cancel, re-run)

async def job_get_for_update(db: DB, job_id: str, tenant_id: str) -> Job | None:
    """The tenant's job, its row locked until commit."""
    row = await db.fetchrow(q("job_get_for_update"), job_id, tenant_id)
    return Job.from_record(row) if row else None


async def job_cancel(db: DB, job_id: str, tenant_id: str, error: dict[str, Any]) -> Job | None:
    """pending/retry → failed with ``error`` (class ``cancelled``); None when it was in neither."""
    row = await db.fetchrow(q("job_cancel"), job_id, tenant_id, error)
    return Job.from_record(row) if row else None


# ---------------------------------------------------------------- operator views

OPERATOR_RANK = {"retry": 0, "pending": 1, "running": 2}  # any other status: 3 (finished)


def job_operator_position(job: Job) -> tuple[int, int]:
    """Where ``job`` is in ``job_list_operator``'s order: (rank, key)."""
    rank = OPERATOR_RANK.get(job.status, 3)
    return rank, job.seq if rank < 3 else -job.seq


async def job_list_operator(db: DB, *, region: str | None = None, kind: str | None = None, status: str | None = None,
                            tenant_id: str | None = None, limit: int = 100, exclude_kinds: Iterable[str] = (),
                            after: tuple[int, int] | None = None) -> list[Job]:
    """Every tenant's jobs, live ones first (retry, pending, running; oldest first), then the
    finished ones newest first (``job_list_operator``); ``after``: the page starts after the job at
    that position (:func:`job_operator_position` of the previous page's last)."""
    rows = await db.fetch(q("job_list_operator"), region, kind, status, tenant_id, limit, sorted(exclude_kinds),
                          *(after or (None, None)))
    return [Job.from_record(r) for r in rows]


async def job_live_counts_by_region(db: DB) -> list[dict[str, Any]]:
    """``[{region, status, n, oldest}]`` of the live jobs."""
    return [dict(r) for r in await db.fetch(q("job_live_counts_by_region"))]


async def job_live_by_tenant(db: DB, *, now: datetime | None = None) -> list[dict[str, Any]]:
    """``[{region, tenant_id, pending, running, retry, oldest_runnable, running_cap, wait_s}]``: the
    live jobs of every region by tenant, most pending first (``job_live_by_tenant``); ``wait_s``
    is how long the tenant's oldest pending job has waited at ``now`` (None: the database's)."""
    return [dict(r) for r in await db.fetch(q("job_live_by_tenant"), now)]


async def job_list_guard_refusals(db: DB, *, region: str | None = None, limit: int = 100) -> list[Job]:
    """The jobs the deletion guard refused, newest first."""
    return [Job.from_record(r) for r in await db.fetch(q("job_list_guard_refusals"), region, limit)]


# ---------------------------------------------------------------- clusters (issue 11)


async def jobs_supersede_waiting(db: DB, resource_id: str, by_job: str, kinds: list[str],
                                 error: dict[str, Any]) -> list[str]:
    """The resource's pending/retry jobs of ``kinds`` enqueued before ``by_job`` end ``failed``
    with ``error`` (their waiters are unblocked by the jobs triggers at commit); their ids."""
    rows = await db.fetch(q("jobs_supersede_waiting"), resource_id, by_job, kinds, error)
    return [r["id"] for r in rows]


async def job_superseding(db: DB, job_id: str, kinds: list[str]) -> tuple[str, str] | None:
    """``(id, kind)`` of the first job enqueued after ``job_id`` on its resource with one of
    ``kinds``, or None."""
    row = await db.fetchrow(q("job_superseding"), job_id, kinds)
    return (row["id"], row["kind"]) if row else None


# ---------------------------------------------------------------- the error boundary

def _boundary(fn: Any) -> Any:
    """``fn`` with asyncpg's errors translated (see the module docstring)."""
    @functools.wraps(fn)
    async def translated(*args: Any, **kw: Any) -> Any:
        try:
            return await fn(*args, **kw)
        except (DatabaseUnavailable, ConstraintViolation, LockWaitTimeout):
            raise
        except LOCK_WAIT_ERRORS as e:
            raise LockWaitTimeout(f"gave up waiting: {type(e).__name__}: {e}") from e
        except asyncpg.UniqueViolationError as e:
            raise UniqueViolation(e.constraint_name or "unknown", str(e)) from e
        except asyncpg.ExclusionViolationError as e:
            raise ExclusionViolation(e.constraint_name or "unknown", str(e)) from e
        except asyncpg.CheckViolationError as e:
            raise CheckViolation(e.constraint_name or "unknown", str(e)) from e
        except TRANSIENT_DB_ERRORS as e:
            raise DatabaseUnavailable(f"database unavailable: {type(e).__name__}: {e}") from e
    return translated


def translate_errors(namespace: dict[str, Any], module: str) -> None:
    """Put the error boundary around every public coroutine defined in ``module`` (its
    ``globals()``): this store's, and each resource type's store (``z9.resources.<type>.store``)."""
    for name, fn in list(namespace.items()):
        if not name.startswith("_") and inspect.iscoroutinefunction(fn) and fn.__module__ == module:
            namespace[name] = _boundary(fn)


translate_errors(globals(), __name__)
