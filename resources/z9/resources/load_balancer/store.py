"""The load_balancer type's store: one typed wrapper per named query of its ``queries.sql``, asyncpg's
errors translated as in :mod:`z9.common.store` (the error boundary)."""
from __future__ import annotations

import logging

from typing import Any

from z9.common.ids import new_id
from z9.resources.address.model import Address
from z9.resources.load_balancer.model import LoadBalancer
from z9.common.sql import q
from z9.common.store import DB, translate_errors
from z9.resources.address.store import _allocating

log = logging.getLogger("z9.store")


async def lb_insert(db: DB, *, lb_id: str, tenant_id: str, region: str, name: str, type: str, algorithm: str,
                    services: list[dict[str, Any]], targets: list[dict[str, Any]],
                    labels: dict[str, str] | None = None) -> LoadBalancer:
    """A new ``creating`` load balancer (call in the transaction that allocates its addresses and
    inserts its job). Raises UniqueViolation(load_balancers_tenant_name_live)."""
    row = await db.fetchrow(q("lb_insert"), lb_id, tenant_id, region, name, type, algorithm, services, targets,
                            labels or {})
    return LoadBalancer.from_record(row)


async def lb_patch(db: DB, lb_id: str, tenant_id: str, *, name: str | None,
                   labels: dict[str, str] | None) -> LoadBalancer | None:
    """``PATCH``: a new name and/or labels (None: unchanged); None when there is no such load
    balancer not yet deleted. Raises UniqueViolation(load_balancers_tenant_name_live)."""
    row = await db.fetchrow(q("lb_patch"), lb_id, tenant_id, name, labels)
    return LoadBalancer.from_record(row) if row else None


async def lb_address_allocate(db: DB, *, pool_id: str, lb_id: str, member: str | None,
                              tenant_id: str) -> Address | None:
    """An active address of load balancer ``lb_id`` (``member`` None: its VIP) holding the lowest
    free IP of ``pool_id``; None when the pool has no free IP."""
    aid = new_id("adr")
    row = await _allocating(db, lambda: db.fetchrow(q("lb_address_allocate"), aid, pool_id, lb_id, member,
                                                    tenant_id), pool_id)
    return Address.from_record(row) if row else None


async def lb_set_addresses(db: DB, lb_id: str, addresses: dict[str, Any]) -> LoadBalancer:
    return LoadBalancer.from_record(await db.fetchrow(q("lb_set_addresses"), lb_id, addresses))


async def lb_get_for_update(db: DB, lb_id: str, tenant_id: str) -> LoadBalancer | None:
    """The tenant's load balancer, its row locked until commit (an action's checks and writes)."""
    row = await db.fetchrow(q("lb_get_for_update"), lb_id, tenant_id)
    return LoadBalancer.from_record(row) if row else None


async def lb_change(db: DB, lb_id: str, *, services: list[dict[str, Any]], targets: list[dict[str, Any]],
                    algorithm: str) -> LoadBalancer:
    row = await db.fetchrow(q("lb_change"), lb_id, services, targets, algorithm)
    return LoadBalancer.from_record(row)


async def lb_targeting_server(db: DB, server_id: str) -> list[LoadBalancer]:
    """Every live load balancer with ``server_id`` among its targets."""
    return [LoadBalancer.from_record(r) for r in await db.fetch(q("lb_targeting_server"), server_id)]


async def lb_observed(db: DB, lb_id: str, *, observed: dict[str, Any], health: str, health_detail: dict[str, Any],
                      config_hash: str | None, status: str | None = None,
                      from_statuses: tuple[str, ...] = ()) -> LoadBalancer | None:
    row = await db.fetchrow(q("lb_observed"), lb_id, observed, health, health_detail, config_hash, status,
                            list(from_statuses))
    return LoadBalancer.from_record(row) if row else None


async def lb_release_addresses(db: DB, lb_id: str) -> list[str]:
    """A deleted load balancer's addresses: deleted, IPs back to the pool (quarantined)."""
    return [r["ip"] for r in await db.fetch(q("lb_release_addresses"), lb_id)]


async def lb_servers(db: DB, server_ids: list[str]) -> dict[str, dict[str, Any]]:
    """``{server id: {status, power_state, ip, region}}`` of the servers that exist."""
    return {r["id"]: dict(r) for r in await db.fetch(q("lb_servers"), server_ids)}


translate_errors(globals(), __name__)
