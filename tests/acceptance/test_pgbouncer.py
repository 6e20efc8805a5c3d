"""PgBouncer in transaction mode (issue 13 §2), Debian's ``pgbouncer`` (1.18) in front of the
test's database (``tests/pgcluster.py``):

- what breaks: z9's ``plan_cache_mode`` startup parameter is refused by PgBouncer; without a
  role/database default z9 refuses to run (generic plans); asyncpg's named prepared-statement
  cache collides on a shared server connection;
- what works: ``Z9_DATABASE_POOLER=transaction`` (no startup parameter, ``statement_cache_size=0``)
  with ``ALTER DATABASE … SET plan_cache_mode``; the API, executor, scheduler and reaper run jobs
  with their pooled queries through PgBouncer and their LISTEN connections direct
  (``Z9_DATABASE_DIRECT_URL``), checked on PgBouncer's own ``SHOW SERVERS``.

Skipped without ``pgbouncer`` unless ``Z9_REQUIRE_PGBOUNCER=1`` (``.ci/run`` installs it and sets it).
"""
from __future__ import annotations

import asyncio
import os
from typing import AsyncIterator

import asyncpg
import pytest

from z9.common.db import create_pool, create_service_pool
from z9.common.errors import DatabaseMisconfigured
from z9.common.settings import Settings

from tests.pgcluster import PgBouncer
from tests.support import SimAdmin, api_stack

if PgBouncer.binary() is None:
    if os.environ.get("Z9_REQUIRE_PGBOUNCER") == "1":
        raise RuntimeError("Z9_REQUIRE_PGBOUNCER=1 but pgbouncer is not installed")
    pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)", allow_module_level=True)


async def _start_bouncer(db_url: str, pool_size: int) -> PgBouncer:
    conn = await asyncpg.connect(db_url)
    try:
        port = int(await conn.fetchval("SHOW port"))
        dbname = await conn.fetchval("SELECT current_database()")
        # TCP when the test reached the server by TCP, else its Unix socket folder (embedded).
        host = await conn.fetchval("SELECT host(inet_server_addr())") or (
            await conn.fetchval("SHOW unix_socket_directories")).split(",")[0].strip()
    finally:
        await conn.close()
    return PgBouncer(host=host, port=port, dbname=dbname, default_pool_size=pool_size,
                     extra="admin_users = postgres").start()


@pytest.fixture
async def bouncer(db_url: str) -> AsyncIterator[PgBouncer]:
    """PgBouncer, transaction mode, two server connections for the test database."""
    b = await _start_bouncer(db_url, 2)
    try:
        yield b
    finally:
        b.stop()


async def _custom_plans_by_default(db_url: str) -> None:
    """What the operator runs (README): the database default, so it holds on every server
    connection PgBouncer opens (the test database only; ALTER ROLE would be the cluster's)."""
    conn = await asyncpg.connect(db_url)
    try:
        dbname = await conn.fetchval("SELECT current_database()")
        await conn.execute(f'ALTER DATABASE "{dbname}" SET plan_cache_mode = force_custom_plan')
    finally:
        await conn.close()


async def test_what_breaks_behind_a_transaction_pooler(db_url: str, bouncer: PgBouncer) -> None:
    # 1. The startup parameter z9 sends directly is refused by PgBouncer.
    with pytest.raises(asyncpg.PostgresError, match="unsupported startup parameter: plan_cache_mode"):
        await create_pool(bouncer.url(), min_size=1, max_size=1, pooler="none")
    # 2. Without it, the server's default (auto: generic plans after five runs) is refused too.
    with pytest.raises(DatabaseMisconfigured, match="plan_cache_mode is 'auto'.*ALTER ROLE"):
        await create_pool(bouncer.url(), min_size=1, max_size=1, pooler="transaction")
    # 3. asyncpg's named statement cache: a statement prepared on one server connection is
    #    missing on the next transaction's (asyncpg names are unique per process, so two
    #    processes also collide on the same name).
    await _custom_plans_by_default(db_url)
    a, b, c = [await asyncpg.connect(bouncer.url()) for _ in range(3)]
    try:
        tx_a = a.transaction()
        await tx_a.start()
        await a.fetchval("SELECT 1")  # a holds server connection X
        assert await b.fetchval("SELECT $1::int + 1", 1) == 2  # b prepares on Y
        tx_c = c.transaction()
        await tx_c.start()
        await c.fetchval("SELECT 1")  # c holds Y
        await tx_a.commit()  # X is free: b's next query runs there
        with pytest.raises(asyncpg.InvalidSQLStatementNameError, match="does not exist"):
            await b.fetchval("SELECT $1::int + 1", 2)
        await tx_c.rollback()
    finally:
        for conn in (a, b, c):
            await conn.close()
    # The same sequence with statement_cache_size=0 (what Z9_DATABASE_POOLER=transaction sets).
    a, b, c = [await asyncpg.connect(bouncer.url(), statement_cache_size=0) for _ in range(3)]
    try:
        tx_a = a.transaction()
        await tx_a.start()
        await a.fetchval("SELECT 1")
        assert await b.fetchval("SELECT $1::int + 1", 1) == 2
        tx_c = c.transaction()
        await tx_c.start()
        await c.fetchval("SELECT 1")
        await tx_a.commit()
        assert await b.fetchval("SELECT $1::int + 1", 2) == 3
        await tx_c.rollback()
    finally:
        for conn in (a, b, c):
            await conn.close()


async def test_pooled_queries_through_pgbouncer_in_transaction_mode(db_url: str, bouncer: PgBouncer) -> None:
    await _custom_plans_by_default(db_url)
    pool = await create_pool(bouncer.url(), min_size=4, max_size=8, pooler="transaction")
    try:
        assert await pool.fetchval("SELECT current_setting('plan_cache_mode')") == "force_custom_plan"

        async def one(i: int) -> None:
            # Parameters, a jsonb codec round trip and a transaction, many clients on one backend.
            assert await pool.fetchval("SELECT $1::int * 2", i) == 2 * i
            assert await pool.fetchval("SELECT $1::jsonb", {"i": i}) == {"i": i}
            async with pool.acquire() as conn, conn.transaction():
                assert await conn.fetchval("SELECT $1::text || $2::text", "a", str(i)) == f"a{i}"

        await asyncio.gather(*(one(i) for i in range(300)))
    finally:
        await pool.close()


async def test_the_stack_runs_jobs_through_pgbouncer_with_listen_direct(
        db_url: str, settings: Settings, sim: SimAdmin) -> None:
    await _custom_plans_by_default(db_url)
    b = await _start_bouncer(db_url, 4)
    try:
        s = settings.model_copy(update={"database_url": b.url(), "database_direct_url": db_url,
                                        "database_pooler": "transaction"})
        pool = await create_service_pool(s, application_name="z9-api", min_size=2, max_size=8)
        try:
            async with api_stack(s, pool) as api:
                for name in ("executor", "scheduler", "reaper"):
                    await api.start_service(name)
                made = [await api.create_server(f"pgb-{i}") for i in range(6)]
                for _, job in made:
                    assert (await api.wait_job(job["id"], timeout_s=60))["status"] == "succeeded"
                status, out = await api.call("DELETE", f"/servers/{made[0][0]['id']}")
                assert status == 202, out
                assert (await api.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"

                # LISTEN connections are direct, the rest went through PgBouncer's server connections.
                servers = b.admin("SHOW SERVERS")  # the admin console speaks the simple protocol only
                # remote_pid: the backend of each of PgBouncer's server connections (TCP or socket).
                bouncer_pids = {int(r["remote_pid"]) for r in servers}
                assert bouncer_pids, "PgBouncer holds no server connection: nothing went through it"
                direct = await asyncpg.connect(db_url)
                try:
                    rows = await direct.fetch(
                        "SELECT application_name, pid, query FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()")
                finally:
                    await direct.close()
                listeners = [r for r in rows if r["application_name"].endswith("-listen")]
                assert {r["application_name"] for r in listeners} == {"z9-api-listen", "z9-executor-listen", "z9-scheduler-listen"}, rows
                assert all(r["pid"] not in bouncer_pids for r in listeners), (rows, servers)
                assert any(r["pid"] in bouncer_pids for r in rows), (rows, servers)
        finally:
            await pool.close()
    finally:
        b.stop()


async def test_the_operator_tools_work_behind_pgbouncer(db_url: str, bouncer: PgBouncer) -> None:
    """The README's set-up (``Z9_DATABASE_URL`` through PgBouncer, ``Z9_DATABASE_POOLER=transaction``,
    ``Z9_DATABASE_DIRECT_URL`` to the server): ``z9 token`` and ``z9 quota`` write what they are
    asked for, instead of PgBouncer's "unsupported startup parameter: plan_cache_mode"."""
    import subprocess
    import sys

    await _custom_plans_by_default(db_url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("Z9_")}
    env.update(Z9_DATABASE_URL=bouncer.url(), Z9_DATABASE_POOLER="transaction", Z9_DATABASE_DIRECT_URL=db_url)

    def z9(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "z9", *args], env=env, capture_output=True, text=True, timeout=60)

    out = await asyncio.to_thread(z9, "token", "--tenant", "pooled")
    assert out.returncode == 0, out.stderr
    token = out.stdout.strip()
    out = await asyncio.to_thread(z9, "quota", "--tenant", "pooled", "--servers", "3")
    assert out.returncode == 0, out.stderr
    assert any(line.split()[:2] == ["servers", "3"] for line in out.stdout.splitlines()), out.stdout
    from z9.common import store
    from z9.common.db import connect

    conn = await connect(db_url)
    try:
        tenant_id = await store.api_token_tenant(conn, token)
        assert tenant_id is not None and await conn.fetchval("SELECT name FROM tenants WHERE id = $1",
                                                             tenant_id) == "pooled"
    finally:
        await conn.close()
