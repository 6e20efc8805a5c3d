"""Hostile tests of what issue 14 built in the job engine: the ``blocked`` flag and its
triggers (migration 0010), bounded waits on the services' connections. Real concurrent
connections; each test is the interleaving that broke a property the engine must keep."""
from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from z9.common import store
from z9.common.settings import Settings
from z9.common.store import NewJob
from z9.resources.server import store as server_store

from tests.support import wait_until, waiting_on_a_lock

TTL = 30.0


def _gave_up(caplog: pytest.LogCaptureFixture, service: str) -> int:
    """How many passes of ``service`` (scheduler, reaper) gave up waiting on a lock so far."""
    return sum(1 for r in caplog.records if r.name == f"z9.{service}" and "gave up waiting on a lock" in r.getMessage())


async def _enqueue(db: Any, resource_id: str | None, *, extra: tuple[str, ...] = (), max_attempts: int = 3) -> str:
    job = await store.job_insert(db, NewJob(kind="Noop", region="r1", resource_type="server" if resource_id else None,
                                            resource_id=resource_id, max_attempts=max_attempts, extra_lock_keys=extra))
    return job.id


async def _claim(pool: asyncpg.Pool) -> list[str]:
    return [j.id for j in await store.job_claim(pool, ["r1"], 100, "w", TTL)]


async def _running_holding(pool: asyncpg.Pool, key: str) -> list[str]:
    rows = await pool.fetch("SELECT id FROM jobs WHERE status = 'running' "
                            "AND (resource_id = $1 OR $1 = ANY(extra_lock_keys)) ORDER BY seq", key)
    return [r["id"] for r in rows]


async def test_a_job_committed_after_a_later_job_of_its_key_never_runs_beside_it(pool: asyncpg.Pool) -> None:
    """Per-resource order across transactions: an API request on server S (its job takes seq n,
    still uncommitted) and, at the same moment, POST /v1/addresses assigning an address to S
    (its AddressAssign job holds S as an extra key, seq n+1, which reads S without locking its row)
    commits first. Before: the AddressAssign job was claimed at once (its earlier job was not yet
    visible), and once the server's job committed, it was claimable too — its seq is earlier, so
    no earlier live job held S: two jobs holding S ran at once."""
    async with pool.acquire() as api1:
        t1 = api1.transaction()
        await t1.start()
        server_job = await _enqueue(api1, "srv_s")  # seq n, not committed yet
        assign = asyncio.create_task(_enqueue(pool, "adr_a", extra=("srv_s",)))  # seq n+1
        await wait_until(lambda: waiting_on_a_lock(pool, assign), 20, "the assignment's insert to wait (or end)")
        first = await _claim(pool)
        await t1.commit()
        assign_job = await assign
    second = await _claim(pool)
    assert len(await _running_holding(pool, "srv_s")) <= 1, (first, second)
    # and nothing is lost: the server's job first, then the assignment
    assert first + second == [server_job]
    await store.job_succeed(pool, store.Lease(server_job, "w", 1), [])
    assert await _claim(pool) == [assign_job]


async def test_two_inserts_on_one_resource_commit_in_seq_order(pool: asyncpg.Pool) -> None:
    """The same race on one resource without extra keys (the reaper's final job or a periodic
    job, which lock no resource row, beside an API action): the later-committed job must not be
    claimable while the earlier-committed one runs."""
    async with pool.acquire() as c1:
        t1 = c1.transaction()
        await t1.start()
        a = await _enqueue(c1, "srv_r")
        b_task = asyncio.create_task(_enqueue(pool, "srv_r"))
        await wait_until(lambda: waiting_on_a_lock(pool, b_task), 20, "the second insert to wait (or end)")
        first = await _claim(pool)
        await t1.commit()
        b = await b_task
    second = await _claim(pool)
    assert len(await _running_holding(pool, "srv_r")) <= 1, (first, second)
    assert first + second == [a]
    assert (await pool.fetchval("SELECT blocked FROM jobs WHERE id = $1", b)) is True


async def test_the_scheduler_survives_a_lock_wait_given_up(pool: asyncpg.Pool, db_url: str,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """An API transaction that enqueued a job on resource R stays open (the process frozen, or
    slow) while a job of R, out of attempts, loses its lease: the scheduler's reclaim of it to
    ``failed`` must take R's key lock at commit (migration 0010) and gives up after its
    lock_timeout. Before: that error (not a 'database unavailable' one) ended Scheduler.run — the
    scheduler process died, and with it every lease reclaim and retry promotion of every region.
    Now the pass is retried, and once the transaction ends the job is reclaimed."""
    from z9.scheduler import Scheduler

    dead = await _enqueue(pool, "srv_x", max_attempts=1)
    assert await _claim(pool) == [dead]
    await pool.execute("UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1", dead)
    sched = Scheduler(Settings(database_url=db_url, regions={}, scheduler_interval_s=0.05,
                               scheduler_db_lock_timeout_s=0.3))
    async with pool.acquire() as api:
        tr = api.transaction()
        await tr.start()
        await _enqueue(api, "srv_x")  # holds srv_x's key lock until it ends
        task = asyncio.create_task(sched.run())
        try:
            await wait_until(lambda: _gave_up(caplog, "scheduler") >= 2, 30, "two scheduler passes giving up on the lock")
            assert not task.done(), task.exception()
            await tr.rollback()

            async def ready() -> bool:
                return bool(await pool.fetchval("SELECT status::text FROM jobs WHERE id = $1", dead) == "failed")
            await wait_until(ready, 20, 'await pool.fetchval("SELECT status::text FROM jobs WHERE id = $1", de...')
            assert await pool.fetchval("SELECT status::text FROM jobs WHERE id = $1", dead) == "failed"
            assert not task.done()
        finally:
            sched.stop()
            await asyncio.wait_for(task, 10)


async def test_the_reaper_survives_a_lock_wait_given_up(pool: asyncpg.Pool, db_url: str,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """The reaper enqueues a server's final job when its deletion buffer expires; that insert
    takes the server's key lock, which a transaction that enqueued a job on the same server holds
    to its commit (an API process frozen there). Before: the lock wait given up
    (lock_timeout) ended Reaper.run — the reaper process died. Now the pass is retried and the
    final job is enqueued once the transaction ends."""
    from z9.resources.server import SERVER
    from z9.reaper import Reaper

    tenant = await store.tenant_upsert(pool, "t-break14")
    srv = await server_store.server_insert(pool, tenant_id=tenant, region="r1", name="s1", image="debian-12", cores=1,
                                    memory_mib=512, disk_gib=1, ssh_keys=[])
    assert await store.resource_mark_deleting(pool, SERVER.sql, srv.id, tenant, 0.0) is not None
    reaper = Reaper(Settings(database_url=db_url, regions={}, reaper_interval_s=0.05,
                             scheduler_db_lock_timeout_s=0.3))
    async with pool.acquire() as api:
        tr = api.transaction()
        await tr.start()
        await _enqueue(api, srv.id)  # holds the server's key lock until it ends
        task = asyncio.create_task(reaper.run())
        try:
            await wait_until(lambda: _gave_up(caplog, "reaper") >= 2, 30, "two reaper passes giving up on the lock")
            assert not task.done(), task.exception()
            await tr.rollback()

            async def ready() -> bool:
                return bool(await pool.fetchval("SELECT count(*) FROM jobs WHERE resource_id = $1", srv.id))
            await wait_until(ready, 20, 'await pool.fetchval("SELECT count(*) FROM jobs WHERE resource_id = $1...')
            assert await pool.fetchval("SELECT count(*) FROM jobs WHERE resource_id = $1", srv.id) == 1
            assert not task.done()
        finally:
            reaper.stop()
            await asyncio.wait_for(task, 10)


async def test_a_claim_that_gives_up_on_one_regions_cap_lock_keeps_what_it_claimed(db_url: str) -> None:
    """An executor serving a capped region and another claims region by region, each in its own
    statement or transaction (committed as it goes). When a later region's cap lock could not be
    had within lock_timeout (another executor's claim or finish holds it: frozen, or slow), the
    error threw away the jobs already claimed and committed in the earlier regions: leased to this
    executor, never run, until their leases expired (an attempt lost; a periodic job, with one
    attempt, failed). The claim must hand over every job it committed."""
    from z9.common.db import create_pool

    pool = await create_pool(db_url, min_size=1, max_size=4, bounds={"lock_timeout": "300"})
    try:
        free = (await store.job_insert(pool, NewJob(kind="Noop", region="r2"))).id
        capped = (await store.job_insert(pool, NewJob(kind="Noop", region="r1"))).id
        async with pool.acquire() as other:
            tr = other.transaction()
            await tr.start()
            await other.execute(store.q("job_region_cap_lock"), ["r1"])  # another executor's claim, held
            got: list[str] = []
            try:
                got = [j.id for j in await store.job_claim(pool, ["r2", "r1"], 8, "w", TTL, {"r1": 4})]
            except Exception:
                pass  # a lock wait given up may be raised, as long as nothing claimed is dropped
            await tr.rollback()
        leased = [r["id"] for r in await pool.fetch("SELECT id FROM jobs WHERE lease_owner = 'w'")]
        assert sorted(leased) == sorted(got), f"claimed and committed, never handed over: {set(leased) - set(got)}"
        assert free in leased and capped not in leased
    finally:
        await pool.close()


class _NoClient:
    def close(self) -> None:
        return None


async def test_shutdown_hands_over_every_job_when_one_row_is_locked(pool: asyncpg.Pool, db_url: str) -> None:
    """SIGTERM: the jobs still running after the grace period are handed over (``retry`` due now,
    attempt refunded). One job's row held by another transaction (an API process frozen inside a
    request that locked it) made its hand-over give up after lock_timeout — and that error, not a
    'database unavailable' one, ended the drain: the jobs after it were not handed over (each
    waited out its lease and lost an attempt) and the executor exited with a traceback."""
    from z9.common.db import create_service_pool
    from z9.executor.context import JobContext
    from z9.executor.worker import Executor

    ids = [(await store.job_insert(pool, NewJob(kind="Noop", region="r1"))).id for _ in range(2)]
    ex = Executor(Settings(database_url=db_url, regions={}, shutdown_grace_s=0.1, executor_db_lock_timeout_s=0.3),
                  ["r1"], client_factory=lambda r: _NoClient())  # type: ignore[arg-type,return-value]
    ex.pool = await create_service_pool(ex.settings, application_name="z9-executor", max_size=4)
    try:
        claimed = {j.id: j for j in await store.job_claim(ex.pool, ["r1"], 2, ex.owner, TTL)}
        for jid in ids:  # running, in seq order: the locked one first
            ex.inflight[jid] = (asyncio.create_task(asyncio.Event().wait()),  # runs until cancelled
                                JobContext(claimed[jid], ex.owner, ex.pool, None, ex.settings))  # type: ignore[arg-type]
        async with pool.acquire() as api:
            tr = api.transaction()
            await tr.start()
            await api.execute("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE", ids[0])
            try:
                await ex._drain()
            finally:
                await tr.rollback()
        statuses = [await pool.fetchval("SELECT status::text FROM jobs WHERE id = $1", i) for i in ids]
        assert statuses == ["running", "retry"]  # the locked one's lease will expire; the other went back
    finally:
        await ex.pool.close()
