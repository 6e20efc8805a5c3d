"""Migrations: the numbered files and the ``db/z9/db/schema.sql`` snapshot produce the same schema;
``migrate()`` is idempotent and safe to run concurrently; the schema enforces the job table's
invariants. Every test creates and drops its own ``z9_test_<hex>`` databases and touches no other."""
from __future__ import annotations

import asyncio
import json
import secrets
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from typing import Any, AsyncIterator

import asyncpg
import pytest

from tests.support import with_database
from z9.common.ids import new_id
from z9.db import describe_schema, list_migrations, migrate, schema_snapshot

@asynccontextmanager
async def fresh_database(pg_url: str) -> AsyncIterator[str]:
    """An empty database ``z9_test_<hex>``, dropped afterwards; yields its URL."""
    name = f"z9_test_{secrets.token_hex(6)}"
    admin = await asyncpg.connect(pg_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield with_database(pg_url, name)
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def test_describe_schema_runs(pg_url: str) -> None:
    async with fresh_database(pg_url) as url:
        conn = await asyncpg.connect(url)
        try:
            await migrate(conn)
            out = await describe_schema(conn)
            assert "jobs.seq bigint NOT NULL IDENTITY a" in out["columns"]
        finally:
            await conn.close()


async def test_migrations_and_snapshot_agree(pg_url: str) -> None:
    async with fresh_database(pg_url) as url_a, fresh_database(pg_url) as url_b:
        a = await asyncpg.connect(url_a)
        b = await asyncpg.connect(url_b)
        try:
            applied = await migrate(a)
            assert applied == [m.version for m in list_migrations()]
            await b.execute(schema_snapshot())
            da, db = await describe_schema(a), await describe_schema(b)
            for key in da:
                assert da[key] == db[key], f"{key} differ between migrations and db/z9/db/schema.sql"
            assert da == db

            # the description is not vacuous: it sees every table, enum, index, function and trigger
            cols = "\n".join(da["columns"])
            for table in ("tenants", "api_tokens", "servers", "jobs", "idempotency_keys",
                          "address_pools", "address_pool_ips", "addresses"):
                assert f"\n{table}." in "\n" + cols, table
            assert "schema_migrations" not in cols
            assert any(e.startswith("job_status pending,running,retry,succeeded,failed") for e in da["enums"])
            assert any("jobs_claimable" in i for i in da["indexes"])
            assert any(f.startswith("jobs_terminal_immutable ") for f in da["functions"])
            assert any("jobs_terminal_immutable" in t for t in da["triggers"])
            assert da["constraints"]
            # migration 0005: the overlap rule, the last line of "never given twice", the table's own rules
            assert any("address_pools EXCLUDE USING gist" in c for c in da["constraints"])
            assert any("addresses_ip_live" in i for i in da["indexes"])
            assert any(t.startswith("CREATE TRIGGER addresses_deletion") for t in da["triggers"])

            # and it notices a difference
            await b.execute("ALTER TABLE jobs ADD COLUMN extra integer")
            assert (await describe_schema(b))["columns"] != da["columns"]
            await b.execute("CREATE INDEX jobs_extra ON jobs (extra)")
            assert (await describe_schema(b))["indexes"] != da["indexes"]
        finally:
            await a.close()
            await b.close()


async def test_migrate_twice_applies_nothing_the_second_time(pg_url: str) -> None:
    async with fresh_database(pg_url) as url:
        conn = await asyncpg.connect(url)
        try:
            first = await migrate(conn)
            assert first and first == sorted(first)
            schema = await describe_schema(conn)
            assert await migrate(conn) == []
            assert await migrate(conn) == []
            assert await describe_schema(conn) == schema
            rows = await conn.fetch("SELECT version, name FROM schema_migrations ORDER BY version")
            assert [(r["version"], r["name"]) for r in rows] == [(m.version, m.name) for m in list_migrations()]
            # the advisory lock is released after each run
            assert await conn.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                       "AND pid = pg_backend_pid()") == 0
        finally:
            await conn.close()


async def test_concurrent_migrations_both_succeed(pg_url: str) -> None:
    async with fresh_database(pg_url) as url:
        c1 = await asyncpg.connect(url)
        c2 = await asyncpg.connect(url)
        c3 = await asyncpg.connect(url)
        try:
            results = await asyncio.wait_for(asyncio.gather(migrate(c1), migrate(c2), migrate(c3)), 30)
            versions = [m.version for m in list_migrations()]
            # exactly one caller applied everything, the others found nothing to do
            assert sorted(results, key=len) == [[], [], versions]
            rows = await c1.fetch("SELECT version, count(*) AS n FROM schema_migrations GROUP BY version "
                                  "ORDER BY version")
            assert [r["version"] for r in rows] == versions
            assert all(r["n"] == 1 for r in rows)
            assert await c1.fetchval("SELECT count(*) FROM schema_migrations") == len(versions)
        finally:
            for c in (c1, c2, c3):
                await c.close()


# ---------------------------------------------------------------------------------- invariants

@pytest.fixture(scope="module")
async def migrated(pg_url: str) -> AsyncIterator[asyncpg.Connection]:
    async with fresh_database(pg_url) as url:
        conn = await asyncpg.connect(url)
        try:
            await migrate(conn)
            yield conn
        finally:
            await conn.close()


NOW = datetime.now(timezone.utc)


async def insert_job(conn: asyncpg.Connection, **cols: Any) -> str:
    cols = {"id": new_id("job"), "kind": "ServerCreate", "region": "dev-1", **cols}
    names = ", ".join(cols)
    # plain asyncpg connection (no json codec): dicts go in as JSON text cast to jsonb
    values = [json.dumps(v) if isinstance(v, dict) else v for v in cols.values()]
    params = ", ".join(f"${i}{'::text::jsonb' if isinstance(v, dict) else ''}"
                       for i, v in enumerate(cols.values(), 1))
    await conn.execute(f"INSERT INTO jobs ({names}) VALUES ({params})", *values)
    return cols["id"]


async def test_valid_rows_are_accepted(migrated: asyncpg.Connection) -> None:
    """The positive controls of the invariant tests below."""
    await insert_job(migrated)
    await insert_job(migrated, status="running", lease_owner="w1", lease_expires_at=NOW, attempt=1)
    await insert_job(migrated, status="retry", error={"class": "temporary", "message": "busy"})
    await insert_job(migrated, status="succeeded", finished_at=NOW)
    await insert_job(migrated, status="failed", finished_at=NOW, error={"class": "permanent", "message": "no"})


async def test_running_needs_a_lease_owner(migrated: asyncpg.Connection) -> None:
    with pytest.raises(asyncpg.CheckViolationError):
        await insert_job(migrated, status="running")
    with pytest.raises(asyncpg.CheckViolationError):
        await insert_job(migrated, status="running", lease_owner="w1")  # no lease_expires_at
    with pytest.raises(asyncpg.CheckViolationError):
        await insert_job(migrated, status="pending", lease_owner="w1", lease_expires_at=NOW)


async def test_terminal_needs_finished_at(migrated: asyncpg.Connection) -> None:
    with pytest.raises(asyncpg.CheckViolationError):
        await insert_job(migrated, status="succeeded")
    with pytest.raises(asyncpg.CheckViolationError):
        await insert_job(migrated, status="failed", error={"class": "permanent", "message": "x"})
    with pytest.raises(asyncpg.CheckViolationError):
        await insert_job(migrated, status="pending", finished_at=NOW)


async def test_failed_needs_an_error(migrated: asyncpg.Connection) -> None:
    with pytest.raises(asyncpg.CheckViolationError):
        await insert_job(migrated, status="failed", finished_at=NOW)
    with pytest.raises(asyncpg.CheckViolationError):
        await insert_job(migrated, status="failed", finished_at=NOW, error={"message": "no class"})


async def test_terminal_jobs_are_never_updated(migrated: asyncpg.Connection) -> None:
    done = await insert_job(migrated, status="succeeded", finished_at=NOW)
    failed = await insert_job(migrated, status="failed", finished_at=NOW,
                              error={"class": "permanent", "message": "no"})
    for jid in (done, failed):
        for stmt in ("UPDATE jobs SET status = 'pending', finished_at = NULL, error = NULL WHERE id = $1",
                     "UPDATE jobs SET updated_at = now() WHERE id = $1",
                     "UPDATE jobs SET steps = '[]' WHERE id = $1"):
            with pytest.raises(asyncpg.CheckViolationError, match="terminal jobs are never changed"):
                await migrated.execute(stmt, jid)
    # a live job may be updated; and terminal jobs may be pruned (deleted)
    live = await insert_job(migrated)
    assert await migrated.execute("UPDATE jobs SET updated_at = now() WHERE id = $1", live) == "UPDATE 1"
    assert await migrated.execute("DELETE FROM jobs WHERE id = $1", done) == "DELETE 1"
