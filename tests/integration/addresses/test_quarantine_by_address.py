"""A released IP stays unallocatable for its quarantine whatever the operator does to the pools'
configuration meanwhile: the pool renamed (a new pool row over the same range), replaced by one
with another range over it, split in two, merged — then synced again as `z9 migrate` does. The
quarantine is the address's (``address_quarantine``, by region and IP), not the pool row's."""
from __future__ import annotations

import json
import subprocess
import sys

import asyncpg
import pytest

from tests.support import REGION, make_tenant, service_env
from tests.integration.addresses.test_address_pools import PUBLIC, region_with
from z9.common.db import connect
from z9.common.settings import Settings
from z9.resources.address import store as address_store


async def _release_one(conn: asyncpg.Connection, tenant: str, pid: str) -> str:
    a = await address_store.address_allocate(conn, pool_id=pid, tenant_id=tenant, kind="floating")
    await conn.execute("UPDATE addresses SET status = 'deleted', deleted_at = now() WHERE id = $1", a.id)
    await address_store.address_release(conn, a.id)
    return a.ip_text


@pytest.mark.parametrize("pools", [
    [dict(PUBLIC, name="public-2", range=["198.51.100.10", "198.51.100.12"])],                 # renamed
    [dict(PUBLIC, name="wide", cidr="198.51.100.0/23", gateway="198.51.100.1",
          range=["198.51.100.10", "198.51.101.10"])],                                          # replaced, wider
    [dict(PUBLIC, name="low", cidr="198.51.100.0/25", gateway="198.51.100.1", range=["198.51.100.10", "198.51.100.11"]),
     dict(PUBLIC, name="high", cidr="198.51.100.128/25", gateway="198.51.100.129",
          range=["198.51.100.130", "198.51.100.131"])],                                        # split
], ids=["renamed", "replaced", "split"])
async def test_a_pool_replaced_mid_quarantine_keeps_the_quarantine(pool: asyncpg.Pool, pools: list[dict]) -> None:
    tenant, _ = await make_tenant(pool, "acme")
    async with pool.acquire() as conn:
        ids = await address_store.address_pools_sync(conn, {REGION: region_with(
            dict(PUBLIC, range=["198.51.100.10", "198.51.100.12"]))})
        released = await _release_one(conn, tenant, ids[f"{REGION}/public"])
        assert released == "198.51.100.10"
        ids = await address_store.address_pools_sync(conn, {REGION: region_with(*pools)})
        first = ids[f"{REGION}/{pools[0]['name']}"]
        got = await address_store.address_allocate(conn, pool_id=first, tenant_id=tenant, kind="floating")
        assert got is not None and got.ip_text != released, got          # the next one, not the released one
        left = await conn.fetchval("SELECT extract(epoch FROM reusable_after - now()) FROM address_pool_ips"
                                   " WHERE pool_id = $1 AND host(ip) = $2", first, released)
        assert 3500 < left <= 3600
        # back to the old configuration and forth again: still quarantined
        await address_store.address_pools_sync(conn, {REGION: region_with(dict(PUBLIC, range=["198.51.100.10", "198.51.100.12"]))})
        again = await address_store.address_pools_sync(conn, {REGION: region_with(*pools)})
        while (a := await address_store.address_allocate(conn, pool_id=again[f"{REGION}/{pools[0]['name']}"], tenant_id=tenant,
                                                 kind="floating")) is not None:
            assert a.ip_text != released
        # the quarantine over (the clock moved past it): handed out again
        await conn.execute("UPDATE address_quarantine SET reusable_after = now() - interval '1 s'")
        await conn.execute("UPDATE address_pool_ips SET reusable_after = now() - interval '1 s'"
                           " WHERE reusable_after IS NOT NULL")
        await address_store.address_pools_sync(conn, {REGION: region_with(dict(PUBLIC, name="public-3",
                                                                       range=["198.51.100.10", "198.51.100.10"]))})
        [p3] = await address_store.address_pool_list(conn, REGION)
        back = await address_store.address_allocate(conn, pool_id=p3["id"], tenant_id=tenant, kind="floating")
        assert back is not None and back.ip_text == released


async def test_merged_pools_keep_both_quarantines(pool: asyncpg.Pool) -> None:
    tenant, _ = await make_tenant(pool, "acme")
    low = dict(PUBLIC, name="low", cidr="198.51.100.0/25", gateway="198.51.100.1", range=["198.51.100.10", "198.51.100.11"])
    high = dict(PUBLIC, name="high", cidr="198.51.100.128/25", gateway="198.51.100.129",
                range=["198.51.100.130", "198.51.100.131"])
    async with pool.acquire() as conn:
        ids = await address_store.address_pools_sync(conn, {REGION: region_with(low, high)})
        gone = {await _release_one(conn, tenant, ids[f"{REGION}/low"]),
                await _release_one(conn, tenant, ids[f"{REGION}/high"])}
        merged = await address_store.address_pools_sync(conn, {REGION: region_with(dict(PUBLIC, name="all", range=[
            "198.51.100.10", "198.51.100.131"]))})
        got = []
        while (a := await address_store.address_allocate(conn, pool_id=merged[f"{REGION}/all"], tenant_id=tenant,
                                                 kind="floating")) is not None:
            got.append(a.ip_text)
        assert len(got) == 120 and not gone & set(got), gone


def test_z9_migrate_after_a_rename_keeps_the_quarantine(db_url: str) -> None:
    """The operator's path: Z9_REGIONS renamed, then `z9 migrate` (which syncs the pools)."""
    import asyncio

    async def release() -> str:
        conn = await connect(db_url, application_name="z9-test")
        try:
            tenant, _ = await make_tenant(conn, "acme")  # type: ignore[arg-type]
            ids = await address_store.address_pools_sync(conn, {REGION: region_with(dict(PUBLIC, range=["198.51.100.10", "198.51.100.11"]))})
            return await _release_one(conn, tenant, ids[f"{REGION}/public"])
        finally:
            await conn.close()

    released = asyncio.run(release())
    env = service_env(Settings(database_url=db_url))
    env["Z9_REGIONS"] = json.dumps({REGION: {"url": "https://127.0.0.1:1", "token_secret": "x", "address_pools": [
        {"name": "renamed", "cidr": "198.51.100.0/24", "gateway": "198.51.100.1",
         "range": ["198.51.100.10", "198.51.100.11"]}]}})
    out = subprocess.run([sys.executable, "-m", "z9", "migrate"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr

    async def allocatable() -> list[str]:
        conn = await connect(db_url, application_name="z9-test")
        try:
            rows = await conn.fetch("SELECT host(i.ip) AS ip FROM address_pool_ips i JOIN address_pools p ON p.id = i.pool_id"
                                    " WHERE p.name = 'renamed' AND i.address_id IS NULL"
                                    " AND (i.reusable_after IS NULL OR i.reusable_after <= now())")
            return sorted(r["ip"] for r in rows)
        finally:
            await conn.close()
    assert asyncio.run(allocatable()) == ["198.51.100.11"], released
