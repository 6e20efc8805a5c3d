"""The server type's store: one typed wrapper per named query of its ``queries.sql``, asyncpg's
errors translated as in :mod:`z9.common.store` (the error boundary)."""
from __future__ import annotations

import logging

from typing import Any

from z9.common.ids import new_id
from z9.resources.server.model import Server
from z9.common.sql import q
from z9.common.store import DB, NewJob, translate_errors

log = logging.getLogger("z9.store")


async def server_insert(db: DB, *, tenant_id: str, region: str, name: str, image: str, cores: int,
                        memory_mib: int, disk_gib: int, ssh_keys: list[str]) -> Server:
    """A new ``creating`` server. Raises UniqueViolation (servers_tenant_name_live) when the tenant already has
    a live server of that name."""
    row = await db.fetchrow(q("server_insert"), new_id("srv"), tenant_id, region, name, image,
                            cores, memory_mib, disk_gib, ssh_keys)
    return Server.from_record(row)


async def server_insert_with_job(db: DB, *, tenant_id: str, region: str, name: str, image: str, cores: int,
                                 memory_mib: int, disk_gib: int, ssh_keys: list[str],
                                 job: NewJob) -> tuple[Server, dict[str, Any]]:
    """A new ``creating`` server and its job (``job``: kind, args, max_attempts, trace_context;
    region, tenant and resource come from the server) in one statement, without NOTIFY.
    Returns (server, job brief ``{id, kind, status}``). Raises UniqueViolation (servers_tenant_name_live)
    when the tenant already has a live server of that name (nothing is written)."""
    row = await db.fetchrow(q("server_insert_with_job"), new_id("srv"), tenant_id, region, name, image,
                            cores, memory_mib, disk_gib, ssh_keys, new_id("job"), job.kind, job.args or {},
                            job.max_attempts, job.trace_context, job.actor_token_id, job.request_id)
    return Server.from_record(row), {"id": row["job_id"], "kind": row["job_kind"], "status": row["job_status"]}


async def server_get(db: DB, server_id: str, tenant_id: str | None = None) -> Server | None:
    """The server, scoped to ``tenant_id`` when given; None when absent (or another tenant's)."""
    if tenant_id is None:
        row = await db.fetchrow(q("server_get_any"), server_id)
    else:
        row = await db.fetchrow(q("server_get"), server_id, tenant_id)
    return Server.from_record(row) if row else None


async def server_observed(db: DB, server_id: str, *, vmid: int | None, node: str | None,
                          power_state: str | None) -> Server | None:
    """Write the VM facts verify observed (the status: ``ResourceType.observed``)."""
    row = await db.fetchrow(q("server_observed"), server_id, vmid, node, power_state)
    return Server.from_record(row) if row else None


async def server_last_failed_job_kind(db: DB, server_id: str) -> str | None:
    """The kind of the server's latest failed job (None: none failed)."""
    return await db.fetchval(q("server_last_failed_job_kind"), server_id)


async def server_get_for_update(db: DB, server_id: str, tenant_id: str) -> Server | None:
    """The tenant's server, its row locked until commit (an action's checks and writes)."""
    row = await db.fetchrow(q("server_get_for_update"), server_id, tenant_id)
    return Server.from_record(row) if row else None


async def server_set_sizes(db: DB, server_id: str, *, cores: int, memory_mib: int, disk_gib: int) -> Server:
    row = await db.fetchrow(q("server_set_sizes"), server_id, cores, memory_mib, disk_gib)
    return Server.from_record(row)


async def server_patch(db: DB, server_id: str, tenant_id: str, *, name: str | None,
                       labels: dict[str, str] | None) -> Server | None:
    """Rename / relabel (None: unchanged); None when absent, another tenant's or deleted. Raises
    UniqueViolation (servers_tenant_name_live) for a live name taken."""
    row = await db.fetchrow(q("server_patch"), server_id, tenant_id, name, labels)
    return Server.from_record(row) if row else None


async def job_failed_primary_assign_of_server(db: DB, server_id: str, assign_kind: str) -> list[str]:
    """The failed AddressAssign (``assign_kind``) of the server's primary address, when it is that
    address's latest job (``job_failed_primary_assign_of_server``)."""
    return [r["id"] for r in await db.fetch(q("job_failed_primary_assign_of_server"), server_id, assign_kind)]


translate_errors(globals(), __name__)
