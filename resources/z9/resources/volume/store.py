"""The volume type's store: one typed wrapper per named query of its ``queries.sql``, asyncpg's
errors translated as in :mod:`z9.common.store` (the error boundary)."""
from __future__ import annotations

from typing import Any

from z9.common.labels import Selector
from z9.common.sql import q
from z9.common.store import translate_errors

import z9.resources.volume as _volume
from z9.resources.volume import Volume


async def insert(db: Any, *, id: str, tenant_id: str, region: str, name: str, size_gib: int, storage: str,
                 server_id: str | None, labels: dict[str, str]) -> Volume:
    return Volume.from_record(await db.fetchrow(q("volume_insert"), id, tenant_id, region, name, size_gib, storage,
                                                server_id, labels))


async def get(db: Any, volume_id: str, tenant_id: str | None = None) -> Volume | None:
    return await _volume.VOLUME.get(db, volume_id, tenant_id)


async def get_for_update(db: Any, volume_id: str, tenant_id: str) -> Volume | None:
    row = await db.fetchrow(q("volume_get_for_update"), volume_id, tenant_id)
    return Volume.from_record(row) if row else None


async def list_rows(db: Any, tenant_id: str, *, after: str | None = None, status: str | None = None,
                    limit: int = 100, name: str | None = None, selector: Selector | None = None,
                    include_deleted: bool = True, region: str | None = None,
                    server_id: str | None = None) -> list[Volume]:
    rows = await db.fetch(q("volume_list"), tenant_id, after, status, limit, name,
                          *(selector or Selector()).params(), include_deleted, region, server_id)
    return [Volume.from_record(r) for r in rows]


async def set_server(db: Any, volume_id: str, server_id: str | None) -> Volume | None:
    row = await db.fetchrow(q("volume_set_server"), volume_id, server_id)
    return Volume.from_record(row) if row else None


async def set_size(db: Any, volume_id: str, size_gib: int) -> Volume | None:
    row = await db.fetchrow(q("volume_set_size"), volume_id, size_gib)
    return Volume.from_record(row) if row else None


async def patch(db: Any, volume_id: str, tenant_id: str, *, name: str | None,
                labels: dict[str, str] | None) -> Volume | None:
    row = await db.fetchrow(q("volume_patch"), volume_id, tenant_id, name, labels)
    return Volume.from_record(row) if row else None


async def observed(db: Any, volume_id: str, observed: dict[str, Any], *, status: str | None,
                   from_statuses: tuple[str, ...]) -> Volume | None:
    row = await db.fetchrow(q("volume_observed"), volume_id, observed, status, list(from_statuses))
    return Volume.from_record(row) if row else None


async def of_server(db: Any, server_id: str) -> list[Volume]:
    return [Volume.from_record(r) for r in await db.fetch(q("volume_of_server"), server_id)]


async def last_seen_on(db: Any, server_id: str) -> list[Volume]:
    """The live volumes meant for no server whose disk was last seen on ``server_id`` (locked FOR UPDATE)."""
    return [Volume.from_record(r) for r in await db.fetch(q("volume_last_seen_on_server"), server_id)]


async def add_disk_volid(db: Any, volume_id: str, volid: str) -> None:
    await db.execute(q("volume_add_disk_volid"), volume_id, volid)


async def disks_of_region(db: Any, region: str) -> dict[str, str]:
    """Every volid recorded for a volume of ``region`` not deleted → that volume's id."""
    return {volid: r["id"] for r in await db.fetch(q("volume_disks_of_region"), region) for volid in r["disk_volids"]}


async def count_of_server(db: Any, server_id: str, other_than: str = "") -> int:
    return int(await db.fetchval(q("volume_count_of_server"), server_id, other_than))


async def detached_by_deletion_of(db: Any, server_id: str, tenant_id: str, detach_kind: str) -> list[Volume]:
    """The volumes server ``server_id``'s deletion detached, unchanged since (locked FOR UPDATE)."""
    return [Volume.from_record(r) for r in await db.fetch(q("volume_detached_by_deletion_of"), server_id, tenant_id,
                                                          detach_kind)]


translate_errors(globals(), __name__)
