"""Migration 0014 (the jobs table's one-column checks as domains) applied by ``z9 migrate`` while
the real services run on a database at version 13 with jobs in every state: every job still
succeeds exactly once, none waits for its lease to expire, and every service carries on by itself."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from z9.common import store
from z9.common.db import connect
from z9.common.settings import Settings
from z9.common.tags import identity_tag
from z9.db import list_migrations

from tests.support import (REGION, Services, SimAdmin, free_port, install_job_log, job_log, make_tenant,
                           overlapping, runs, service_env, wait_until)
from tests.acceptance.test_engine_fire import FAST, _Client
from z9.resources.address import store as address_store

LEASE_TTL_S = 30.0  # long, so a job stranded under a lease shows as a delay of a whole TTL

# tests.support's job log, reading the row through to_jsonb: a PL/pgSQL function keeps, per
# session, the type each NEW.<field> had when it was first planned, and fails once a column's
# type changes (NEW.attempt: integer, then job_attempt) — the test's own trigger must not.
JOB_LOG_TRIGGER = """
CREATE OR REPLACE FUNCTION test_job_log() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    n jsonb := to_jsonb(NEW);
    o jsonb := CASE WHEN TG_OP = 'UPDATE' THEN to_jsonb(OLD) END;
BEGIN
    IF TG_OP = 'INSERT' OR n->'status' IS DISTINCT FROM o->'status' OR n->'attempt' IS DISTINCT FROM o->'attempt'
       OR n->'lease_owner' IS DISTINCT FROM o->'lease_owner' THEN
        INSERT INTO test_job_log (job_id, resource_id, kind, status, attempt, lease_owner, run_after, error)
        VALUES (n->>'id', n->>'resource_id', n->>'kind', n->>'status', (n->>'attempt')::int, n->>'lease_owner',
                (n->>'run_after')::timestamptz, n->'error');
    END IF;
    RETURN NULL;
END $$;
"""


async def migrate_to(conn: asyncpg.Connection, version: int) -> None:
    """Apply the migrations up to ``version`` as ``z9 migrate`` would."""
    await conn.execute("""CREATE TABLE IF NOT EXISTS schema_migrations (
        version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())""")
    for mig in list_migrations():
        if mig.version <= version:
            async with conn.transaction():
                await conn.execute(mig.sql)
                await conn.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                                   mig.version, mig.name)


async def test_a_session_that_finished_and_claimed_before_0014_still_can_after(pg_url: str) -> None:
    """PL/pgSQL plans a function's expressions once per session, each record field with the type it
    had then: jobs_finish_and_claim reads r.attempt (integer until 0014, job_attempt after), so every
    executor connection that used the one-statement path before the migration failed it for good
    ("type of parameter 21 (job_attempt) does not match that when preparing the plan (integer)")
    — unless the migration makes the function be compiled again."""
    from tests.integration.database.test_migrations import fresh_database

    async with fresh_database(pg_url) as url:
        conn, other = await connect(url), await connect(url)
        try:
            await migrate_to(conn, 13)
            ids = [(await store.job_insert(conn, store.NewJob(kind="Noop", region="r1"))) for _ in range(3)]
            assert len(ids) == 3
            # the statement as the release of migration 13 sent it (eight arguments: still served by
            # the function of migration 0022, whose ninth has a default), and no finish: a claim
            sql = ("SELECT f.finished_id, (f.claimed).* FROM jobs_finish_and_claim($1::text[], $2::text[], "
                   "$3::int[], $4::text[], $5::text, $6::int, $7::text, $8::float8) AS f")

            async def finish_and_claim(job: Any) -> list[Any]:
                fin = [] if job is None else [job]
                rows = await conn.fetch(sql, [j["id"] for j in fin], ["ex"] * len(fin), [j["attempt"] for j in fin],
                                        ["[]"] * len(fin), "r1", 1, "ex", 30.0)
                assert len([r for r in rows if r["finished_id"] is not None]) == len(fin)
                return [r for r in rows if r["finished_id"] is None and r["id"] is not None]

            (job,) = await finish_and_claim(None)
            claimed = await finish_and_claim(job)
            assert len(claimed) == 1
            await migrate_to_14(other)
            (job,) = claimed
            claimed = await finish_and_claim(job)
            assert len(claimed) == 1
        finally:
            await conn.close()
            await other.close()


def from_14() -> list[int]:
    """The migrations a database at 13 gets from ``z9 migrate``: 14 and every later one."""
    from z9.db import list_migrations

    return [m.version for m in list_migrations() if m.version >= 14]


async def migrate_to_14(conn: asyncpg.Connection) -> None:
    from z9.db import migrate

    assert await migrate(conn) == from_14()


async def _pool_at_13(url: str) -> asyncpg.Pool:
    from z9.common.db import create_pool

    conn = await connect(url)
    try:
        await migrate_to(conn, 13)
    finally:
        await conn.close()
    return await create_pool(url, min_size=1, max_size=2)


async def test_a_statement_a_migration_retyped_is_transient_inside_a_transaction(pg_url: str) -> None:
    """After 0014 every statement returning a retyped column was prepared for another result type:
    PostgreSQL refuses it ("cached plan must not change result type"). asyncpg prepares it again by
    itself outside a transaction; inside one it raises InvalidCachedStatementError — nothing ran,
    the transaction is rolled back, and asyncpg has dropped the pool's statement cache: the next
    try works. The store says DatabaseUnavailable (retry), not an unknown error (the scheduler
    exited on it, the API answered 500, the executor spent an attempt)."""
    from tests.integration.database.test_migrations import fresh_database
    from z9.common.errors import DatabaseUnavailable

    async with fresh_database(pg_url) as url:
        pool = await _pool_at_13(url)
        other = await connect(url)
        try:
            async with pool.acquire() as conn, conn.transaction():
                assert await store.lease_reclaim_expired(conn) == []  # prepared, cached
            await migrate_to_14(other)
            with pytest.raises(DatabaseUnavailable):
                async with pool.acquire() as conn, conn.transaction():
                    await store.lease_reclaim_expired(conn)
            async with pool.acquire() as conn, conn.transaction():
                assert await store.lease_reclaim_expired(conn) == []
        finally:
            await other.close()
            await pool.close()


async def test_a_finish_whose_statements_a_migration_retyped_commits_at_once(pg_url: str) -> None:
    """The executor's finish transaction meets the same refusal: it is run again at once (nothing
    was written), not left until its lease expires nor retried as a failed attempt."""
    from types import SimpleNamespace

    from tests.integration.database.test_migrations import fresh_database
    from z9.executor.batching import FinishBatcher

    class Kind:
        recorded: list[str] = []

        async def record(self, conn: Any, ctx: Any, observed: Any) -> None:
            self.recorded.append(ctx.job.id)

    async with fresh_database(pg_url) as url:
        pool = await _pool_at_13(url)
        other = await connect(url)
        try:
            for _ in range(3):
                await store.job_insert(pool, store.NewJob(kind="Noop", region="r1"))
            claimed_in_finish: list[Any] = []
            # a claim that runs on a schema at 13 (today's job_claim needs migration 0022's turns)
            # and returns jobs.* like it: the statement the migration retypes
            legacy_claim = ("UPDATE jobs SET status = 'running', attempt = attempt + 1, lease_owner = 'ex', "
                            "lease_expires_at = now() + interval '30 s', started_at = now(), updated_at = now() "
                            "WHERE id IN (SELECT id FROM jobs WHERE status = 'pending' AND region = 'r1' "
                            "ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING *")

            async def claim_next(conn: Any, freed: int) -> tuple[int, list[Any]]:
                return freed, [store.Job.from_record(r) for r in await conn.fetch(legacy_claim, freed)]

            batcher = FinishBatcher(pool, claim_next=claim_next,
                                    on_claimed=lambda n, jobs: claimed_in_finish.extend(jobs))
            kind = Kind()

            def ctx(job: Any) -> Any:
                return SimpleNamespace(job=job, lease=store.Lease(job.id, "ex", job.attempt), steps_json=lambda: [])

            (first,) = (await claim_next(pool, 1))[1]
            await batcher.succeed(ctx(first), kind, None)  # every statement of the finish prepared
            (second,) = claimed_in_finish
            await migrate_to_14(other)
            await batcher.succeed(ctx(second), kind, None)
            assert set(kind.recorded) == {first.id, second.id}  # (a rolled-back record ran once more)
            rows = await other.fetch("SELECT id, status, attempt FROM jobs ORDER BY seq")
            assert [(r["status"], r["attempt"]) for r in rows] == [("succeeded", 1), ("succeeded", 1), ("running", 1)]
            assert [j.id for j in claimed_in_finish] == [r["id"] for r in rows[1:]]
        finally:
            await other.close()
            await pool.close()


@pytest.mark.skip(reason="today's code cannot serve on a schema at 13: every create reads "
                         "tenant_quotas.load_balancers (migration 0017); 0014 under live sessions is covered "
                         "statement by statement above. A live upgrade of the newest migration under the "
                         "previous release's code needs that release installed beside this one (not here yet)")
async def test_migration_0014_applied_under_live_services(settings: Settings, db_url: str, pg_url: str,
                                                          sim: SimAdmin, tmp_path: Path) -> None:
    # db_url is migrated to the latest version: start over on an empty database of our own
    from tests.integration.database.test_migrations import fresh_database

    async with fresh_database(pg_url) as url:
        conn = await connect(url)
        await migrate_to(conn, 13)
        await address_store.address_pools_sync(conn, settings.regions)
        await install_job_log(conn)
        await conn.execute(JOB_LOG_TRIGGER)
        _, token = await make_tenant(conn, "acme")
        await sim.configure(task_seconds={"qmclone": 0.6})
        port = free_port()
        svc = Services(service_env(settings.model_copy(update={"database_url": url}),
                                   **dict(FAST, lease_ttl_s=LEASE_TTL_S, heartbeat_s=0.5, api_port=port)),
                       tmp_path)
        try:
            procs = [svc.start("api"), svc.start("scheduler"), svc.start("reaper")]
            executors = [svc.start("executor") for _ in range(2)]
            for ex in executors:
                await svc.executor_owner(ex)
            client = _Client(f"http://127.0.0.1:{port}/v1", token)
            await client.wait_up()
            made: list[tuple[dict, dict]] = []
            for i in range(6):  # some finish, some run, some wait when the migration comes
                made.append(await client.create(f"pre-{i}", retry_s=0))
            await wait_until(lambda: _count(conn, "succeeded", 1), 30, "a job to succeed")
            await wait_until(lambda: _count(conn, "running", 1), 30, "a job to be running")

            stop = asyncio.Event()

            async def feed() -> None:  # creates and reads go on while the migration runs
                i = 0
                while not stop.is_set():
                    made.append(await client.create(f"live-{i}"))
                    await client.call("GET", f"/jobs/{made[-1][1]['id']}")
                    i += 1
                    await asyncio.sleep(0.1)

            feeder = asyncio.create_task(feed())
            fed = len(made)
            await wait_until(lambda: len(made) >= fed + 3, 30, "the feed under way before the migration")
            out = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "z9", "migrate"], capture_output=True, text=True,
                env=dict(os.environ, **svc.env), timeout=120)
            assert out.returncode == 0, out.stderr
            assert f"applied migrations: {from_14()}" in out.stdout, out.stdout
            migrated_at = await conn.fetchval("SELECT applied_at FROM schema_migrations WHERE version = 14")
            fed = len(made)
            # the feed goes on against the migrated schema: creates and reads answered by the old version
            await wait_until(lambda: len(made) >= fed + 10, 60, "ten creates after the migration")
            stop.set()
            await feeder
            for i in range(3):  # after the migration
                made.append(await client.create(f"post-{i}"))

            async def settled() -> bool:
                return await conn.fetchval("SELECT count(*) FROM jobs WHERE status NOT IN ('succeeded', 'failed')") == 0

            await wait_until(settled, 120, "every job to finish")
            jobs = await conn.fetch("SELECT id, status, attempt, created_at FROM jobs ORDER BY seq")
            assert {r["status"] for r in jobs} == {"succeeded"}, [dict(r) for r in jobs]
            log = await job_log(conn)
            rs = runs(log)
            assert not overlapping(rs), "two jobs of one resource ran at once"
            # no job waited for a lease to expire: nothing was reclaimed, every job ran once
            assert [r for r in rs if r.attempt > 1] == [], [r for r in rs if r.attempt > 1]
            # a job stranded under a lease runs again only once that lease has expired: a whole TTL
            # (a create itself takes seconds: 11 s seen on a loaded machine, with verify's look into the guest)
            slow = [r for r in rs if r.end is not None and (r.end - r.start).total_seconds() >= LEASE_TTL_S]
            assert not slow, (migrated_at, slow)
            for s, _ in made:
                assert len(await sim.vms_tagged(identity_tag(s["id"]))) == 1, s["id"]
            assert 500 not in client.statuses, client.statuses
            for p in (*procs, *executors):
                assert p.alive(), p.name
                text = p.log()
                assert "Traceback" not in text and " ERROR " not in text, f"{p.name}:\n{text[-4000:]}"
        finally:
            svc.close()
            print(svc.logs())
            await conn.close()


async def _count(conn: asyncpg.Connection, status: str, n: int) -> bool:
    return await conn.fetchval("SELECT count(*) FROM jobs WHERE status = $1", status) >= n
