"""The firewall type's store: one typed wrapper per named query of its ``queries.sql``, asyncpg's errors
translated as in :mod:`z9.common.store` (the error boundary)."""
from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from z9.common import labels as labels_
from z9.common.labels import Selector
from z9.common.sql import q
from z9.common.store import translate_errors
from z9.resources.firewall.model import Firewall, Member


async def insert(db: Any, *, id: str, tenant_id: str, region: str, name: str, rules: list[dict[str, Any]],
                 applied_to: list[dict[str, Any]], labels: dict[str, str]) -> Firewall:
    return Firewall.from_record(await db.fetchrow(q("firewall_insert"), id, tenant_id, region, name, rules, applied_to,
                                                  labels))


async def get(db: Any, firewall_id: str, tenant_id: str | None = None) -> Firewall | None:
    from z9.resources.firewall import FIREWALL

    return await FIREWALL.get(db, firewall_id, tenant_id)


async def get_for_update(db: Any, firewall_id: str, tenant_id: str) -> Firewall | None:
    row = await db.fetchrow(q("firewall_get_for_update"), firewall_id, tenant_id)
    return Firewall.from_record(row) if row else None


async def get_for_share(db: Any, firewall_id: str, tenant_id: str) -> Firewall | None:
    row = await db.fetchrow(q("firewall_get_for_share"), firewall_id, tenant_id)
    return Firewall.from_record(row) if row else None


async def set_rows(db: Any, firewall_id: str, *, rules: list[dict[str, Any]] | None = None,
                   applied_to: list[dict[str, Any]] | None = None) -> Firewall | None:
    row = await db.fetchrow(q("firewall_set"), firewall_id, rules, applied_to)
    return Firewall.from_record(row) if row else None


async def bump(db: Any, firewall_id: str) -> Firewall:
    return Firewall.from_record(await db.fetchrow(q("firewall_bump"), firewall_id))


async def patch(db: Any, firewall_id: str, tenant_id: str, *, name: str | None,
                labels: dict[str, str] | None) -> Firewall | None:
    row = await db.fetchrow(q("firewall_patch"), firewall_id, tenant_id, name, labels)
    return Firewall.from_record(row) if row else None


async def members(db: Any, firewall_ids: list[str]) -> list[Member]:
    return [Member.from_record(r) for r in await db.fetch(q("firewall_members_of"), firewall_ids)]


async def with_members(db: Any, rows: list[Firewall]) -> list[Firewall]:
    """The rows with their member rows (``Firewall.members``)."""
    got = await members(db, [r.id for r in rows])
    return [replace(r, members=tuple(m for m in got if m.firewall_id == r.id)) for r in rows]


async def member_upsert(db: Any, firewall_id: str, server_id: str, via: str) -> None:
    await db.execute(q("firewall_member_upsert"), firewall_id, server_id, via)


async def member_removing(db: Any, firewall_id: str, server_id: str) -> None:
    await db.execute(q("firewall_member_removing"), firewall_id, server_id)


async def members_pending(db: Any, firewall_id: str) -> None:
    await db.execute(q("firewall_members_pending"), firewall_id)


async def member_applied(db: Any, firewall_id: str, server_id: str, generation: int, *, applied: bool,
                         enforced: bool | None, detail: str | None, at: datetime | None = None) -> None:
    await db.execute(q("firewall_member_applied"), firewall_id, server_id, generation, applied, enforced, detail, at)


async def member_removed(db: Any, firewall_id: str, server_id: str) -> None:
    await db.execute(q("firewall_member_removed"), firewall_id, server_id)


async def member_forget_server(db: Any, server_id: str) -> None:
    await db.execute(q("firewall_member_forget_server"), server_id)


async def member_forget(db: Any, firewall_id: str, server_id: str) -> None:
    await db.execute(q("firewall_member_forget"), firewall_id, server_id)


async def members_with_live_servers(db: Any, firewall_id: str) -> list[str]:
    """The servers of firewall ``firewall_id``'s members not leaving whose server is not being deleted."""
    return [r["server_id"] for r in await db.fetch(q("firewall_members_live_servers"), firewall_id)]


async def holding_server(db: Any, server_id: str) -> list[Firewall]:
    """The not yet deleted firewalls server ``server_id`` is a member of or applied to by id, locked."""
    return [Firewall.from_record(r) for r in await db.fetch(q("firewall_holding_server"), server_id)]


async def of_server(db: Any, server_id: str) -> list[Firewall]:
    return [Firewall.from_record(r) for r in await db.fetch(q("firewall_of_server"), server_id)]


async def count_of_server(db: Any, server_id: str, other_than: str = "") -> int:
    return int(await db.fetchval(q("firewall_count_of_server"), server_id, other_than))


async def selecting(db: Any, tenant_id: str, region: str, server_labels: dict[str, str]) -> list[Firewall]:
    """The live firewalls of the tenant and region one of whose label selectors matches ``server_labels``."""
    out = []
    for r in await db.fetch(q("firewall_selecting"), tenant_id, region):
        fw = Firewall.from_record(r)
        if any(a.get("label_selector") is not None and labels_.parse(a["label_selector"]).matches(server_labels)
               for a in fw.applied_to):
            out.append(fw)
    return out


async def servers_matching(db: Any, tenant_id: str, region: str, selector: Selector) -> list[str]:
    return [r["id"] for r in await db.fetch(q("firewall_servers_matching"), tenant_id, region, *selector.params())]


async def referenced_by(db: Any, firewall_id: str) -> list[str]:
    """The live firewalls whose rules name firewall ``firewall_id``'s members."""
    return [r["id"] for r in await db.fetch(q("firewall_referenced_by"), firewall_id)]


async def list_rows(db: Any, tenant_id: str, *, after: str | None = None, status: str | None = None,
                    limit: int = 100, name: str | None = None, selector: Selector | None = None,
                    include_deleted: bool = True, region: str | None = None) -> list[Firewall]:
    rows = await db.fetch(q("firewall_list"), tenant_id, after, status, limit, name,
                          *(selector or Selector()).params(), include_deleted, region)
    return [Firewall.from_record(r) for r in rows]


async def observed(db: Any, firewall_id: str, observed: dict[str, Any], *, status: str | None,
                   from_statuses: tuple[str, ...]) -> Firewall | None:
    row = await db.fetchrow(q("firewall_observed"), firewall_id, observed, status, list(from_statuses))
    return Firewall.from_record(row) if row else None


translate_errors(globals(), __name__)
