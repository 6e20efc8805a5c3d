"""The address type's store: one typed wrapper per named query of its ``queries.sql``, asyncpg's
errors translated as in :mod:`z9.common.store` (the error boundary)."""
from __future__ import annotations

import asyncio

import logging

from typing import Any

import asyncpg

from z9.common.errors import PoolConfigError
from z9.common.labels import Selector
from z9.common.ids import new_id
from z9.resources.address.model import Address
from z9.common.sql import q
from z9.common.store import DB, NewJob, translate_errors

log = logging.getLogger("z9.store")

# How long an allocation that found every free row of its pool held by allocations in flight
# waits for them (they commit: exhausted; one rolls back: its row is free again), in steps.
IN_FLIGHT_WAITS_S = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.3)


async def address_pools_sync(conn: asyncpg.Connection, regions: dict[str, Any]) -> dict[str, str]:
    """Write the address pools of ``regions`` (``{region: RegionSettings}``) to ``address_pools``
    and their allocatable IPs to ``address_pool_ips``, in one transaction under an advisory lock
    (API processes starting together sync one after the other). A pool left out of its region's
    settings is disabled, not deleted. Returns ``{"region/name": pool id}``.

    Raises :class:`PoolConfigError` naming both pools when the database refuses a pool as
    overlapping another enabled pool of its region (``address_pools_no_overlap``)."""
    ids: dict[str, str] = {}
    async with conn.transaction():
        await conn.execute(q("address_pools_sync_wait"))  # a peer's sync is waited for, not given up on
        await conn.execute(q("address_pools_sync_lock"))
        for region, rs in sorted(regions.items()):
            await conn.execute(q("address_pools_retire_region"), region)
            for pool in rs.address_pools:
                first, last = pool.first_last
                try:
                    async with conn.transaction():
                        pid = await conn.fetchval(
                            q("address_pool_upsert"), new_id("apl"), region, pool.name, pool.family,
                            pool.cidr, pool.gateway, first, last, list(pool.reserved), pool.bridge,
                            pool.vlan, list(pool.nameservers), pool.quarantine_s)
                except asyncpg.ExclusionViolationError:
                    others = await conn.fetch(q("address_pool_overlapping"), region, pool.cidr, pool.name)
                    names = ", ".join(f"{r['name']!r} ({r['cidr']})" for r in others) or "another pool"
                    raise PoolConfigError(
                        f"address pool {pool.name!r} ({pool.cidr}) of region {region} overlaps "
                        f"address pool {names}: pools of one region must not overlap") from None
                await conn.execute(q("address_pool_ips_prune"), pid)
                await conn.execute(q("address_pool_ips_fill"), pid)
                ids[f"{region}/{pool.name}"] = pid
    return ids


async def address_pool_list(db: DB, region: str | None = None) -> list[dict[str, Any]]:
    """The enabled pools (of ``region``), with ``size`` (allocatable IPs) and ``used``."""
    return [dict(r) for r in await db.fetch(q("address_pool_list"), region)]


async def address_pool_pick(db: DB, region: str, family: int, name: str | None) -> list[dict[str, Any]]:
    """Candidate pools for an allocation (see the query); the first is the one to use when
    ``name`` is given or the first is named ``public`` or it is the only one."""
    return [dict(r) for r in await db.fetch(q("address_pool_pick"), region, family, name)]


async def _allocating(db: DB, attempt: Any, pool_id: str | None, region: str | None = None,
                      family: int | None = None, name: str | None = None) -> Any:
    """``attempt()`` (an allocating statement taking the lowest free row with SKIP LOCKED), again
    while it finds nothing but the pool still has free rows that allocations in flight hold: a
    request refused as ``pool_exhausted`` only because a competitor that later rolled back held
    the last free IP for a moment was a false answer. Gives up (None) once the pool has no such
    row, or after ``IN_FLIGHT_WAITS_S``."""
    got = await attempt()
    for delay in IN_FLIGHT_WAITS_S:
        if got is not None or not await db.fetchval(q("address_pool_in_flight"), pool_id, region, family, name):
            return got
        await asyncio.sleep(delay)
        got = await attempt()
    return got


async def address_allocate(db: DB, *, pool_id: str, tenant_id: str, kind: str, name: str | None = None,
                           dns_ptr: str | None = None, protect_delete: bool = False,
                           auto_delete: bool = False, server_id: str | None = None,
                           address_id: str | None = None) -> Address | None:
    """A new ``creating`` address holding the lowest free IP of ``pool_id`` (one statement; call
    it in the transaction that also inserts the job using it). None: the pool has no free IP.
    Raises asyncpg.UniqueViolationError when the name is taken, or the server already has a
    primary address of that family (``addresses_primary_per_server``)."""
    aid = address_id or new_id("adr")
    row = await _allocating(db, lambda: db.fetchrow(q("address_allocate"), aid, pool_id, tenant_id, kind, name,
                                                    dns_ptr, protect_delete, auto_delete, server_id), pool_id)
    return Address.from_record(row) if row else None


async def address_release(db: DB, address_id: str) -> list[Any]:
    """Give the address's IP back to its pool, quarantined; returns the released rows
    (``ip``, ``reusable_after``)."""
    return list(await db.fetch(q("address_release"), address_id))


async def address_get(db: DB, address_id: str, tenant_id: str | None = None) -> Address | None:
    """The address, scoped to ``tenant_id`` when given; None when absent (or another tenant's)."""
    row = await db.fetchrow(q("address_get"), address_id, tenant_id)
    return Address.from_record(row) if row else None


async def address_list(db: DB, tenant_id: str, *, after: str | None = None, status: str | None = None,
                       region: str | None = None, server_id: str | None = None, limit: int = 100,
                       name: str | None = None, selector: Selector | None = None,
                       include_deleted: bool = True) -> list[Address]:
    """Up to ``limit`` addresses of the tenant ordered by id, after id ``after``, filtered."""
    rows = await db.fetch(q("address_list"), tenant_id, after, status, region, name,
                          *(selector or Selector()).params(), server_id, limit, include_deleted)
    return [Address.from_record(r) for r in rows]


async def address_observed(db: DB, address_id: str, observed: dict[str, Any], *, status: str | None = None,
                           from_statuses: tuple[str, ...] = (), reason: str | None = None) -> Address | None:
    """Write what verify saw; move to ``status`` only from one of ``from_statuses``; the reason
    becomes ``reason`` (a conflict) — a deletion's reason is kept when there is none."""
    row = await db.fetchrow(q("address_observed"), address_id, observed, status, list(from_statuses), reason)
    return Address.from_record(row) if row else None


async def address_deleted(db: DB, address_id: str, observed: dict[str, Any] | None = None) -> list[Any]:
    """``destroying`` → ``deleted`` and its IP back to the pool, quarantined (one statement);
    returns the released IPs (none when the address was not ``destroying``)."""
    return [r["ip"] for r in await db.fetch(q("address_deleted"), address_id, observed)]


async def address_pool_nameservers(db: DB, pool_id: str) -> list[str]:
    """The pool's nameservers, in order, as text."""
    return list(await db.fetchval(q("address_pool_nameservers"), pool_id) or [])


async def addresses_release_for_server(db: DB, server_id: str) -> dict[str, str]:
    """A server's final delete (after verify saw its VM gone, in its finishing transaction):
    ``{address id: "deleted" | "unassigned"}`` — auto-delete primaries deleted with their IPs
    quarantined, every other address of the server unassigned."""
    return {r["id"]: r["outcome"] for r in await db.fetch(q("addresses_release_for_server"), server_id)}


async def address_ip_held_by_other_tenant(db: DB, region: str, ip: str, tenant_id: str) -> bool:
    """A live address of ``region`` holding ``ip`` belongs to a tenant other than ``tenant_id``."""
    return bool(await db.fetchval(q("address_ip_held_by_other_tenant"), region, ip, tenant_id))


async def address_ip_holders(db: DB, ips: list[str]) -> dict[str, list[dict[str, Any]]]:
    """``{ip: [{"tenant_id", "kind", "region"}, ...]}``: the live addresses of every region holding
    any of ``ips`` (an IP may be held once per region)."""
    if not ips:
        return {}
    out: dict[str, list[dict[str, Any]]] = {}
    for r in await db.fetch(q("address_ip_holders"), sorted(set(ips))):
        out.setdefault(r["ip"], []).append({"tenant_id": r["tenant_id"], "kind": r["kind"], "region": r["region"]})
    return out


async def address_allocate_with_job(db: DB, *, region: str, family: int, pool: str | None, tenant_id: str,
                                    kind: str, job: NewJob, name: str | None = None, dns_ptr: str | None = None,
                                    protect_delete: bool = False, auto_delete: bool = False,
                                    server_id: str | None = None) -> tuple[Address, dict[str, Any]] | None:
    """The lowest free IP of the region's pool (named ``pool``; unnamed: ``public``, or the only
    pool of ``family``) as a new ``creating`` address and its job (``job``: kind, args,
    max_attempts, trace_context, extra_lock_keys; region, tenant and resource come from the
    address) in one statement, without NOTIFY. None: no such pool, or no free IP (nothing
    written; :func:`address_pool_pick` tells which). Raises asyncpg.UniqueViolationError (a live
    name of the tenant, a second primary)."""
    aid, jid = new_id("adr"), new_id("job")
    row = await _allocating(db, lambda: db.fetchrow(
        q("address_allocate_with_job"), aid, region, tenant_id, kind, name, dns_ptr, protect_delete, auto_delete,
        server_id, jid, job.kind, job.args or {}, job.max_attempts, job.trace_context, list(job.extra_lock_keys),
        family, pool, job.actor_token_id, job.request_id), None, region, family, pool)
    if row is None:
        return None
    return Address.from_record(row), {"id": row["job_id"], "kind": row["job_kind"], "status": row["job_status"]}


async def address_owner(db: DB, address_id: str) -> tuple[str | None, str | None]:
    """``(load balancer id, cluster id)`` the address belongs to (None, None: its tenant's own)."""
    row = await db.fetchrow(q("address_owner"), address_id)
    return (row["load_balancer_id"], row["cluster_id"]) if row else (None, None)


async def address_get_for_update(db: DB, address_id: str, tenant_id: str) -> Address | None:
    """The tenant's address, its row locked until commit (an action's checks and writes)."""
    row = await db.fetchrow(q("address_get_for_update"), address_id, tenant_id)
    return Address.from_record(row) if row else None


async def address_set_server(db: DB, address_id: str, server_id: str | None) -> Address | None:
    """Record the server the address should be on (None: none); None when it is being deleted.
    Raises asyncpg.UniqueViolationError when that server already has a primary of the family."""
    row = await db.fetchrow(q("address_set_server"), address_id, server_id)
    return Address.from_record(row) if row else None


async def address_patch(db: DB, address_id: str, tenant_id: str, *, name: tuple[str | None] | None = None,
                        dns_ptr: tuple[str | None] | None = None, protect_delete: bool | None = None,
                        auto_delete: bool | None = None, labels: dict[str, str] | None = None) -> Address | None:
    """Change the given fields (``name``/``dns_ptr`` as a 1-tuple, so None can be set); None when
    the address is absent, another tenant's, or deleted. Raises asyncpg.UniqueViolationError for a
    live name taken."""
    row = await db.fetchrow(q("address_patch"), address_id, tenant_id, name is not None, name[0] if name else None,
                            dns_ptr is not None, dns_ptr[0] if dns_ptr else None, protect_delete, auto_delete, labels)
    return Address.from_record(row) if row else None


async def address_make_primary(db: DB, address_id: str, server_id: str) -> Address | None:
    """An unassigned live address becomes ``server_id``'s primary; None otherwise. Raises
    asyncpg.UniqueViolationError when the server has a primary of that family already."""
    row = await db.fetchrow(q("address_make_primary"), address_id, server_id)
    return Address.from_record(row) if row else None


translate_errors(globals(), __name__)
