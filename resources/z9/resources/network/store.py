"""The network type's store: one typed wrapper per named query of its ``queries.sql``, asyncpg's
errors translated as in :mod:`z9.common.store` (the error boundary)."""
from __future__ import annotations

from typing import Any

import z9.resources.network as _network
from z9.common.labels import Selector
from z9.common.sql import q
from z9.common.store import translate_errors
from z9.resources.network.model import Member, Network


async def insert(db: Any, *, id: str, tenant_id: str, region: str, name: str, ip_range: str,
                 tags: tuple[int, int], labels: dict[str, str]) -> Network | None:
    """The new network with the lowest tag of ``tags`` free in its region (None: none free)."""
    row = await db.fetchrow(q("network_insert"), id, tenant_id, region, name, ip_range, list(tags), labels)
    return Network.from_record(row) if row else None


async def get(db: Any, network_id: str, tenant_id: str | None = None) -> Network | None:
    return await _network.NETWORK.get(db, network_id, tenant_id)


async def get_for_update(db: Any, network_id: str, tenant_id: str) -> Network | None:
    row = await db.fetchrow(q("network_get_for_update"), network_id, tenant_id)
    return Network.from_record(row) if row else None


async def list_rows(db: Any, tenant_id: str, *, after: str | None = None, status: str | None = None,
                    limit: int = 100, name: str | None = None, selector: Selector | None = None,
                    include_deleted: bool = True, region: str | None = None) -> list[Network]:
    rows = await db.fetch(q("network_list"), tenant_id, after, status, limit, name,
                          *(selector or Selector()).params(), include_deleted, region)
    return [Network.from_record(r) for r in rows]


async def patch(db: Any, network_id: str, tenant_id: str, *, name: str | None,
                labels: dict[str, str] | None) -> Network | None:
    row = await db.fetchrow(q("network_patch"), network_id, tenant_id, name, labels)
    return Network.from_record(row) if row else None


async def observed(db: Any, network_id: str, observed: dict[str, Any], *, status: str | None,
                   from_statuses: tuple[str, ...]) -> Network | None:
    row = await db.fetchrow(q("network_observed"), network_id, observed, status, list(from_statuses))
    return Network.from_record(row) if row else None


async def vnets_of_region(db: Any, region: str) -> list[dict[str, Any]]:
    return [dict(r) for r in await db.fetch(q("network_vnets_of_region"), region)]


# ---------------------------------------------------------------- members

async def member_insert(db: Any, network_id: str, server_id: str, tenant_id: str, ip: str | None,
                        first: str, last: str) -> Member | None:
    row = await db.fetchrow(q("network_member_insert"), network_id, server_id, tenant_id, ip, first, last)
    return Member.from_record(row) if row else None


async def member_get(db: Any, network_id: str, server_id: str) -> Member | None:
    row = await db.fetchrow(q("network_member_get"), network_id, server_id)
    return Member.from_record(row) if row else None


async def members_of(db: Any, network_id: str) -> list[Member]:
    return [Member.from_record(r) for r in await db.fetch(q("network_members_of"), network_id)]


async def members_of_server(db: Any, server_id: str) -> list[Member]:
    return [Member.from_record(r) for r in await db.fetch(q("network_members_of_server"), server_id)]


async def member_set_state(db: Any, network_id: str, server_id: str, state: str) -> Member | None:
    row = await db.fetchrow(q("network_member_set_state"), network_id, server_id, state)
    return Member.from_record(row) if row else None


async def member_delete(db: Any, network_id: str, server_id: str) -> Member | None:
    row = await db.fetchrow(q("network_member_delete"), network_id, server_id)
    return Member.from_record(row) if row else None


async def members_of_server_delete(db: Any, server_id: str) -> list[Member]:
    return [Member.from_record(r) for r in await db.fetch(q("network_members_of_server_delete"), server_id)]


# ---------------------------------------------------------------- the region's SDN row

async def sdn_region_lock(db: Any, region: str) -> dict[str, Any]:
    return dict(await db.fetchrow(q("sdn_region_lock"), region))


async def sdn_region_get(db: Any, region: str) -> dict[str, Any] | None:
    row = await db.fetchrow(q("sdn_region_get"), region)
    return dict(row) if row else None


async def sdn_region_set_apply_job(db: Any, region: str, job_id: str | None) -> None:
    await db.fetchrow(q("sdn_region_set_apply_job"), region, job_id)


async def sdn_region_take_apply(db: Any, region: str, job_id: str) -> None:
    await db.fetchrow(q("sdn_region_take_apply"), region, job_id)


async def sdn_region_record_lock(db: Any, region: str, token: str | None, job_id: str | None) -> None:
    await db.fetchrow(q("sdn_region_record_lock"), region, token, job_id)


async def sdn_region_set_condition(db: Any, region: str, condition: dict[str, Any] | None) -> None:
    await db.fetchrow(q("sdn_region_set_condition"), region, condition)


async def sdn_region_applied(db: Any, region: str) -> None:
    await db.fetchrow(q("sdn_region_applied"), region)


async def sdn_apply_last_finished(db: Any, resource_id: str) -> dict[str, Any] | None:
    row = await db.fetchrow(q("sdn_apply_last_finished"), resource_id)
    return dict(row) if row else None


async def sdn_region_conditions(db: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in await db.fetch(q("sdn_region_conditions"))]


translate_errors(globals(), __name__)
