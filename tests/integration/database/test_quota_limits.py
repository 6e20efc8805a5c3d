"""Quotas in the database: migration 0020 moves a tenant's own limits from a column per unit
(``tenant_quotas``) to a row per unit (``tenant_quota_limits``) with every value kept, and while the
previous release serves (it reads and writes ``tenant_quotas``) each table's writes reach the other;
every type's usage query returns exactly the units it declares, and contributions add up."""
from __future__ import annotations

import asyncpg

from tests.integration.database.test_migration_0014_live import migrate_to
from tests.integration.database.test_migrations import fresh_database
from z9 import resources
from z9.common import store
from z9.common.ids import new_id
from z9.db import list_migrations


async def _limits(conn: asyncpg.Connection, tenant: str) -> dict[str, int]:
    return await store.tenant_quota_limits(conn, tenant)


async def test_0020_copies_every_override_and_mirrors_both_releases_writes(pg_url: str) -> None:
    async with fresh_database(pg_url) as url:
        conn = await asyncpg.connect(url)
        try:
            await migrate_to(conn, 19)
            a, b, c = (new_id("ten") for _ in range(3))
            for i, t in enumerate((a, b, c)):
                await conn.execute("INSERT INTO tenants (id, name) VALUES ($1, $2)", t, f"t{i}")
            await conn.execute("INSERT INTO tenant_quotas (tenant_id, servers, cores, memory_mib, addresses, "
                               "load_balancers, volume_gib) VALUES ($1, 1, 2, 3, 4, 5, 6)", a)
            await conn.execute("INSERT INTO tenant_quotas (tenant_id, memory_mib, volume_gib) "
                               "VALUES ($1, 8589934592, 0)", b)  # a bigint one, and a zero (not "unset")
            (mig,) = [m for m in list_migrations() if m.version == 20]
            async with conn.transaction():
                await conn.execute(mig.sql)
            assert await _limits(conn, a) == {"servers": 1, "cores": 2, "memory_mib": 3, "addresses": 4,
                                              "load_balancers": 5, "volume_gib": 6}
            assert await _limits(conn, b) == {"memory_mib": 8589934592, "volume_gib": 0}
            assert await _limits(conn, c) == {}

            # the previous release's `z9 quota` (its tenant_quota_set: a column set, one reset, a new row)
            await conn.execute("UPDATE tenant_quotas SET servers = 9, cores = NULL WHERE tenant_id = $1", a)
            await conn.execute("INSERT INTO tenant_quotas (tenant_id, addresses) VALUES ($1, 7)", c)
            assert (await _limits(conn, a))["servers"] == 9 and "cores" not in await _limits(conn, a)
            assert await _limits(conn, c) == {"addresses": 7}

            # this release's: the previous one's API reads it in its column (capped to an integer's
            # range where the column is one), a reset as NULL; a unit it has no column for stays here
            await store.tenant_quota_set(conn, b, {"servers": 3, "memory_mib": None, "volume_gib": 5,
                                                   "addresses": 2**40})
            await store.tenant_quota_set(conn, b, {"some_new_unit": 4})
            row = await conn.fetchrow("SELECT * FROM tenant_quotas WHERE tenant_id = $1", b)
            assert (row["servers"], row["memory_mib"], row["volume_gib"], row["addresses"]) == (3, None, 5, 2**31 - 1)
            assert await _limits(conn, b) == {"servers": 3, "volume_gib": 5, "addresses": 2**40, "some_new_unit": 4}
            await store.tenant_quota_set(conn, c, {"addresses": None})
            assert (await conn.fetchval("SELECT addresses FROM tenant_quotas WHERE tenant_id = $1", c)) is None
            assert await _limits(conn, c) == {}
        finally:
            await conn.close()


async def test_tenant_quota_set_returns_the_tenants_own_limits(pool: asyncpg.Pool) -> None:
    tenant = await store.tenant_upsert(pool, "quota-rows")
    assert await store.tenant_quota_set(pool, tenant, {"servers": 2, "cores": 8}) == {"servers": 2, "cores": 8}
    assert await store.tenant_quota_set(pool, tenant, {"cores": None, "volume_gib": 0}) == {"servers": 2,
                                                                                           "volume_gib": 0}
    assert await store.tenant_quota_set(pool, tenant, {}) == {"servers": 2, "volume_gib": 0}
    assert await store.tenant_quota_limits(pool, tenant) == {"servers": 2, "volume_gib": 0}


async def test_each_types_usage_query_returns_the_units_it_declares(pool: asyncpg.Pool) -> None:
    """Every registered type's query answers one row with exactly its declared units (0 for a
    tenant with nothing), and the registry's sum covers every quota."""
    tenant = await store.tenant_upsert(pool, "quota-usage")
    counting = [t for t in resources.types() if t.quota_usage is not None]
    assert counting, "no type counts toward a quota"
    for t in counting:
        got = await store.tenant_quota_count(pool, t.quota_usage.query, tenant)
        assert got == dict.fromkeys(t.quota_usage.units, 0), t.name
    assert await resources.quota_usage(pool, tenant) == dict.fromkeys(resources.quota_units(), 0)
