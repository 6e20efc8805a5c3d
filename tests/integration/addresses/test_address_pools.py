"""Address pools and the allocation core against real PostgreSQL (issue 8 §2, tests 1–2 at the
database level): pools from the settings in a table, overlapping pools refused by the settings,
by the database itself (``address_pools_no_overlap``) and at start-up naming both pools; the
lowest free IP, never one IP twice under concurrency, exhaustion, quarantine of released IPs."""
from __future__ import annotations

import asyncio
import ipaddress
import json
import subprocess
import sys

import asyncpg
import pytest
from pydantic import ValidationError

from tests.support import REGION, make_tenant, service_env
from z9.common import store
from z9.common.db import connect
from z9.common.errors import PoolConfigError
from z9.common.settings import AddressPoolSettings, RegionSettings, Settings
from z9.resources.address import store as address_store


def region_with(*pools: dict) -> RegionSettings:
    return RegionSettings(url="https://127.0.0.1:1", token_secret="x",
                          address_pools=[AddressPoolSettings(**p) for p in pools])


PUBLIC = {"name": "public", "cidr": "198.51.100.0/24", "gateway": "198.51.100.1",
          "range": ["198.51.100.1", "198.51.100.254"], "reserved": []}


def test_settings_refuse_overlapping_pools_naming_both() -> None:
    with pytest.raises(ValidationError) as e:
        region_with({"name": "a", "cidr": "10.0.0.0/24"}, {"name": "b", "cidr": "10.0.0.128/25"})
    assert "address pools 'a' (10.0.0.0/24) and 'b' (10.0.0.128/25) overlap" in str(e.value)


@pytest.mark.parametrize("pool, text", [
    ({"name": "a", "cidr": "10.0.0.1/24"}, "is not a network address"),
    ({"name": "a", "cidr": "10.0.0.0/24", "gateway": "10.0.1.1"}, "gateway 10.0.1.1 is not inside"),
    ({"name": "a", "cidr": "10.0.0.0/8"}, "holds more than 65536 addresses"),
    ({"name": "a", "cidr": "10.0.0.0/24", "range": ["10.0.0.9", "10.0.0.2"]}, "range starts after it ends"),
    ({"name": "a", "cidr": "10.0.0.0/24", "nameservers": ["2001:db8::1"]}, "is not IPv4"),
    ({"name": "A", "cidr": "10.0.0.0/24"}, "name"),
])
def test_settings_refuse_bad_pools(pool: dict, text: str) -> None:
    with pytest.raises(ValidationError) as e:
        AddressPoolSettings(**pool)
    assert text in str(e.value)


def test_default_range_is_every_host_address() -> None:
    p = AddressPoolSettings(name="p", cidr="192.0.2.0/24")
    assert [str(x) for x in p.first_last] == ["192.0.2.1", "192.0.2.254"]
    assert p.family == 4 and AddressPoolSettings(name="q", cidr="2001:db8::/120").family == 6


async def test_sync_writes_pools_and_their_ips(pool: asyncpg.Pool) -> None:
    regions = {REGION: region_with(dict(PUBLIC, reserved=["198.51.100.53"]))}
    async with pool.acquire() as conn:
        ids = await address_store.address_pools_sync(conn, regions)
        again = await address_store.address_pools_sync(conn, regions)   # idempotent: same pool row
    assert ids == again and list(ids) == [f"{REGION}/public"]
    [p] = await address_store.address_pool_list(pool, REGION)
    assert (p["name"], str(p["cidr"]), p["size"], p["used"]) == ("public", "198.51.100.0/24", 252, 0)
    ips = {str(r["ip"]) for r in await pool.fetch("SELECT host(ip) AS ip FROM address_pool_ips")}
    assert "198.51.100.1" not in ips and "198.51.100.53" not in ips and "198.51.100.2" in ips

    # shrinking the range drops free rows; a pool left out of the settings is disabled, not deleted
    async with pool.acquire() as conn:
        await address_store.address_pools_sync(conn, {REGION: region_with(dict(PUBLIC, range=["198.51.100.2", "198.51.100.11"]))})
        assert (await address_store.address_pool_list(conn, REGION))[0]["size"] == 10
        await address_store.address_pools_sync(conn, {REGION: region_with()})
        assert await address_store.address_pool_list(conn, REGION) == []
        assert await conn.fetchval("SELECT count(*) FROM address_pools WHERE disabled_at IS NOT NULL") == 1
        # ... and no longer counts in the overlap rule: a new pool may take its network
        await address_store.address_pools_sync(conn, {REGION: region_with(dict(PUBLIC, name="public-2"))})
        assert [p["name"] for p in await address_store.address_pool_list(conn, REGION)] == ["public-2"]


async def test_database_refuses_overlapping_pools(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        await address_store.address_pools_sync(conn, {REGION: region_with(PUBLIC)})
        with pytest.raises(asyncpg.ExclusionViolationError):
            await conn.execute(
                "INSERT INTO address_pools (id, region, name, family, cidr, first_ip, last_ip, bridge)"
                " VALUES ('apl_00000000000000000000000000', $1, 'other', 4, '198.51.100.128/25',"
                " '198.51.100.129', '198.51.100.130', 'vmbr0')", REGION)
        # the same network in another region is fine
        await address_store.address_pools_sync(conn, {"other-1": region_with(PUBLIC)})
        # settings validation bypassed (as a hand-edited table would be): the sync names both pools
        bad = RegionSettings.model_construct(address_pools=[
            AddressPoolSettings(**PUBLIC), AddressPoolSettings(name="inner", cidr="198.51.100.64/26")])
        with pytest.raises(PoolConfigError) as e:
            await address_store.address_pools_sync(conn, {REGION: bad})
    assert str(e.value) == ("address pool 'inner' (198.51.100.64/26) of region dev-1 overlaps address pool "
                            "'public' (198.51.100.0/24): pools of one region must not overlap")
    # nothing of the failed sync was written
    assert [p["name"] for p in await address_store.address_pool_list(pool, REGION)] == ["public"]


def test_start_up_refuses_overlapping_pools_naming_both(db_url: str) -> None:
    """Test 2: `z9 migrate` and `z9 api` refuse to start; the message names both pools."""
    regions = {REGION: {"url": "https://127.0.0.1:1", "token_secret": "x", "address_pools": [
        {"name": "public", "cidr": "198.51.100.0/24"}, {"name": "dmz", "cidr": "198.51.100.192/26"}]}}
    env = service_env(Settings(database_url=db_url))
    env["Z9_REGIONS"] = json.dumps(regions)
    for cmd in (["migrate"], ["api", "--port", "0"]):
        out = subprocess.run([sys.executable, "-m", "z9", *cmd], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, (cmd, out.stdout, out.stderr)
        assert "address pools 'public' (198.51.100.0/24) and 'dmz' (198.51.100.192/26) overlap" in out.stderr


# ---------------------------------------------------------------- allocation

async def _pool_id(conn: asyncpg.Connection, **over: object) -> str:
    ids = await address_store.address_pools_sync(conn, {REGION: region_with(dict(PUBLIC, **over))})
    return ids[f"{REGION}/public"]


async def test_allocates_lowest_free_ip_and_quarantines_released_ones(pool: asyncpg.Pool) -> None:
    tenant, _ = await make_tenant(pool, "acme")
    async with pool.acquire() as conn:
        pid = await _pool_id(conn, range=["198.51.100.10", "198.51.100.13"], reserved=["198.51.100.11"])
        got = [await address_store.address_allocate(conn, pool_id=pid, tenant_id=tenant, kind="floating") for _ in range(4)]
        assert [a.ip_text for a in got[:3]] == ["198.51.100.10", "198.51.100.12", "198.51.100.13"]
        assert got[3] is None                                   # exhausted
        first = got[0]
        assert (first.pool_name, first.prefix, str(first.gateway), first.status) == ("public", 24, "198.51.100.1", "creating")

        # released: quarantined for the pool's quarantine (1 h by default), then handed out again
        await conn.execute("UPDATE addresses SET status = 'deleted', deleted_at = now() WHERE id = $1", first.id)
        [rel] = await address_store.address_release(conn, first.id)
        assert str(rel["ip"]) == "198.51.100.10"
        left = await conn.fetchval("SELECT extract(epoch FROM reusable_after - now()) FROM address_pool_ips"
                                   " WHERE host(ip) = '198.51.100.10'")
        assert 3590 < left <= 3600
        assert await address_store.address_allocate(conn, pool_id=pid, tenant_id=tenant, kind="floating") is None
        await conn.execute("UPDATE address_pool_ips SET reusable_after = now() - interval '1 s'"
                           " WHERE host(ip) = '198.51.100.10'")
        again = await address_store.address_allocate(conn, pool_id=pid, tenant_id=tenant, kind="floating")
        assert again is not None and again.ip_text == "198.51.100.10" and again.id != first.id


async def test_unique_index_is_the_last_line(pool: asyncpg.Pool) -> None:
    """Whatever an allocator does, two live addresses of a region never share an IP."""
    tenant, _ = await make_tenant(pool, "acme")
    async with pool.acquire() as conn:
        pid = await _pool_id(conn)
        a = await address_store.address_allocate(conn, pool_id=pid, tenant_id=tenant, kind="floating")
        with pytest.raises(asyncpg.UniqueViolationError) as e:
            await conn.execute(
                "INSERT INTO addresses (id, tenant_id, region, pool_id, pool_name, prefix, ip, family, kind)"
                " VALUES ('adr_00000000000000000000000000', $1, $2, $3, 'public', 24, $4, 4, 'floating')",
                tenant, REGION, pid, a.ip)
        assert e.value.constraint_name == "addresses_ip_live"


async def test_concurrent_allocations_never_give_an_ip_twice(pool: asyncpg.Pool, db_url: str) -> None:
    """300 allocations from a pool of 254 usable IPs, 16 connections, each in its own
    transaction: 254 distinct IPs, 46 find the pool exhausted, never one IP twice."""
    tenant, _ = await make_tenant(pool, "acme")
    async with pool.acquire() as conn:
        pid = await _pool_id(conn, cidr="10.20.0.0/23", gateway="10.20.1.1",
                             range=["10.20.0.1", "10.20.0.254"])
    conns = [await connect(db_url) for _ in range(16)]   # (with the jsonb codecs the row models need)
    try:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(300):
            queue.put_nowait(i)
        results: list[str | None] = []

        async def worker(c: asyncpg.Connection) -> None:
            while not queue.empty():
                queue.get_nowait()
                async with c.transaction():
                    a = await address_store.address_allocate(c, pool_id=pid, tenant_id=tenant, kind="floating")
                    await asyncio.sleep(0.001)   # hold the transaction open a little: overlap
                results.append(a.ip_text if a else None)

        await asyncio.gather(*(worker(c) for c in conns))
    finally:
        for c in conns:
            await c.close()
    ips = [r for r in results if r is not None]
    assert len(results) == 300 and len(ips) == 254 and results.count(None) == 46
    assert len(set(ips)) == 254
    assert {ipaddress.ip_address(i) for i in ips} == {ipaddress.ip_address("10.20.0.0") + n for n in range(1, 255)}
    assert await pool.fetchval("SELECT count(DISTINCT ip) FROM addresses WHERE status <> 'deleted'") == 254


async def test_pool_choice(pool: asyncpg.Pool) -> None:
    """Unnamed: the pool named public, else the region's only pool of the family; named: that one."""
    tenant, _ = await make_tenant(pool, "acme")
    job = store.NewJob(kind="AddressCreate", region=REGION)
    async with pool.acquire() as conn:
        await address_store.address_pools_sync(conn, {REGION: region_with(
            {"name": "private", "cidr": "10.9.0.0/24"}, PUBLIC, {"name": "v6", "cidr": "2001:db8::/120"})})
        alloc = lambda **kw: address_store.address_allocate_with_job(conn, region=REGION, tenant_id=tenant,  # noqa: E731
                                                             kind="floating", job=job, **kw)
        assert (await alloc(family=4, pool=None))[0].pool_name == "public"
        assert (await alloc(family=4, pool="private"))[0].ip_text == "10.9.0.1"
        assert (await alloc(family=6, pool=None))[0].ip_text == "2001:db8::1"
        assert await alloc(family=4, pool="nope") is None
        await address_store.address_pools_sync(conn, {REGION: region_with(
            {"name": "private", "cidr": "10.9.0.0/24"}, {"name": "dmz", "cidr": "10.8.0.0/24"})})
        assert await alloc(family=4, pool=None) is None            # which one? the API asks (422)
        assert (await alloc(family=4, pool="dmz"))[0].ip_text == "10.8.0.1"


async def test_pool_renamed_while_an_address_is_live_never_hands_its_ip_out(pool: asyncpg.Pool) -> None:
    """An operator renames the region's pool (same network) while an address of the old one is
    live: the renamed pool gets rows for the same IPs; the live address's IP is skipped (it was
    handed out again and the insert hit addresses_ip_live: every allocation failed)."""
    tenant, _ = await make_tenant(pool, "acme")
    async with pool.acquire() as conn:
        old = await _pool_id(conn, range=["198.51.100.10", "198.51.100.12"])
        live = await address_store.address_allocate(conn, pool_id=old, tenant_id=tenant, kind="floating")
        assert live.ip_text == "198.51.100.10"
        ids = await address_store.address_pools_sync(conn, {REGION: region_with(
            dict(PUBLIC, name="public-v4", range=["198.51.100.10", "198.51.100.12"]))})
        new = ids[f"{REGION}/public-v4"]
        got = await address_store.address_allocate(conn, pool_id=new, tenant_id=tenant, kind="floating")
        assert got is not None and got.ip_text == "198.51.100.11"


async def test_ip_reserved_while_live_is_not_handed_out_after_its_release(pool: asyncpg.Pool) -> None:
    """An IP the settings reserve (or move out of the range) while an address holds it keeps its
    row until the release; after the quarantine it must not come back as allocatable."""
    tenant, _ = await make_tenant(pool, "acme")
    async with pool.acquire() as conn:
        pid = await _pool_id(conn, range=["198.51.100.10", "198.51.100.12"])
        live = await address_store.address_allocate(conn, pool_id=pid, tenant_id=tenant, kind="floating")
        top = [await address_store.address_allocate(conn, pool_id=pid, tenant_id=tenant, kind="floating") for _ in range(2)]
        assert [a.ip_text for a in [live, *top]] == ["198.51.100.10", "198.51.100.11", "198.51.100.12"]
        # .10 reserved and .12 out of the range, both while live
        await _pool_id(conn, range=["198.51.100.10", "198.51.100.11"], reserved=["198.51.100.10"])
        for a in (live, top[1]):
            await conn.execute("UPDATE addresses SET status = 'deleted', deleted_at = now() WHERE id = $1", a.id)
            await address_store.address_release(conn, a.id)
        await conn.execute("UPDATE address_pool_ips SET reusable_after = now() - interval '1 s' WHERE address_id IS NULL")
        assert await address_store.address_allocate(conn, pool_id=pid, tenant_id=tenant, kind="floating") is None
