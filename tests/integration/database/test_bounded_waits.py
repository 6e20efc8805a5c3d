"""Hostile tests of the bounded waits issue 14 put on z9's connections: a legitimate
operation that takes long, or waits on a peer doing legitimate work, must not fail because of a
bound meant for stuck transactions."""
from __future__ import annotations

import asyncio
import secrets
from typing import Any, AsyncIterator

import asyncpg
import pytest

from tests.support import with_database
from z9 import db as z9db
from z9.common.db import create_service_pool
from z9.common.settings import AddressPoolSettings, RegionSettings, Settings
from z9.resources.address import store as address_store


@pytest.fixture
async def empty_db(pg_url: str) -> AsyncIterator[str]:
    name = f"z9_test_{secrets.token_hex(6)}"
    admin = await asyncpg.connect(pg_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def test_a_long_migration_is_not_cut_by_the_services_statement_timeout(
        pg_url: str, empty_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Behind PgBouncer the bounded waits are set with ``ALTER ROLE … SET`` (docs/settings.md), so
    ``z9 migrate``'s direct connection, same role, inherits statement_timeout (60 s by default): a
    migration longer than that (an index or an UPDATE over a few million jobs, as migration 0010
    does) failed every time it was run. A migration is as long as its data; it must run to its end."""
    admin = await asyncpg.connect(pg_url)
    try:
        await admin.execute(f"ALTER DATABASE \"{empty_db}\" SET statement_timeout = '300ms'")
        await admin.execute(f"ALTER DATABASE \"{empty_db}\" SET idle_in_transaction_session_timeout = '300ms'")
    finally:
        await admin.close()
    real = z9db.list_migrations()
    slow = z9db.Migration(9999, "slow", "SELECT pg_sleep(0.8);")
    monkeypatch.setattr(z9db, "list_migrations", lambda: [*real, slow])
    conn = await asyncpg.connect(with_database(pg_url, empty_db))
    try:
        assert (await z9db.migrate(conn))[-1] == 9999
        # the session keeps the database's bounds for whatever it runs next
        assert await conn.fetchval("SHOW statement_timeout") == "300ms"
    finally:
        await conn.close()


async def test_an_api_process_starting_while_another_syncs_the_pools_waits_for_it(db_url: str) -> None:
    """API processes starting together sync the address pools one after the other (an advisory
    lock). A sync of large pools (up to 65,536 rows each) can take longer than the API's
    lock_timeout (5 s): the next process's startup then failed with a lock wait given up, and
    the process exited. Waiting on a peer's sync is legitimate (statement_timeout bounds it)."""
    pools = [AddressPoolSettings(name="public", cidr="203.0.113.0/24", gateway="203.0.113.1",
                                 range=["203.0.113.10", "203.0.113.250"])]
    settings = Settings(database_url=db_url, regions={"r1": RegionSettings(
        url="https://127.0.0.1:8006", token_id="t@pve!x", token_secret="s", address_pools=pools)},
        api_db_lock_timeout_s=0.3)
    api = await create_service_pool(settings, application_name="z9-api", min_size=1, max_size=2)
    peer = await create_service_pool(settings, application_name="z9-api", min_size=1, max_size=1)
    try:
        async with peer.acquire() as other:
            tr = other.transaction()
            await tr.start()
            await other.execute("SELECT pg_advisory_xact_lock(hashtextextended('z9-address-pools-sync', 0))")

            async def start() -> Any:
                async with api.acquire() as conn:
                    return await address_store.address_pools_sync(conn, settings.regions)

            starting = asyncio.create_task(start())
            await asyncio.sleep(1.0)  # the peer's sync takes longer than the lock_timeout
            await tr.commit()
            assert set(await starting) == {"r1/public"}
        async with api.acquire() as conn:
            assert await conn.fetchval("SHOW lock_timeout") == "300ms"  # the pooled session is unchanged
    finally:
        await api.close()
        await peer.close()
