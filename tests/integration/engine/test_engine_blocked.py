"""Claims do not walk blocked work (issue 14, migration 0010): a pending job waiting behind an
earlier live job of one of its lock keys is ``blocked`` — out of the claim's index — and becomes
claimable in the transaction that ends its blocker, on every path (finish, lease reclaim,
failure, cancellation, deletion), also when the end races with an insert or with another end."""
from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from z9.common import store
from z9.common.store import Lease, NewJob

from tests.support import wait_until, waiting_on_a_lock

TTL = 30.0


async def _enqueue(db: Any, resource_id: str | None, *, extra: tuple[str, ...] = (), max_attempts: int = 3) -> str:
    job = await store.job_insert(db, NewJob(kind="Noop", region="r1", resource_type="server" if resource_id else None,
                                            resource_id=resource_id, max_attempts=max_attempts, extra_lock_keys=extra))
    return job.id


async def _blocked(pool: asyncpg.Pool, *ids: str) -> list[bool]:
    rows = {r["id"]: r["blocked"] for r in await pool.fetch("SELECT id, blocked FROM jobs WHERE id = ANY($1)", list(ids))}
    return [rows[i] for i in ids]


async def _claim(pool: asyncpg.Pool) -> list[str]:
    return [j.id for j in await store.job_claim(pool, ["r1"], 100, "w", TTL)]


async def test_waiting_jobs_are_blocked_and_each_end_unblocks_the_next(pool: asyncpg.Pool) -> None:
    a1, a2, a3 = [await _enqueue(pool, "srv_a", max_attempts=1) for _ in range(3)]
    w = await _enqueue(pool, "srv_w", extra=("srv_a",))  # waits on srv_a's jobs as an extra key
    b1 = await _enqueue(pool, "srv_b")
    assert await _blocked(pool, a1, a2, a3, w, b1) == [False, True, True, True, False]
    assert await _claim(pool) == [a1, b1]
    # a1 lost: its lease expires and the scheduler fails it (out of attempts) — a2 is next
    await pool.execute("UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1", a1)
    assert [r["status"] for r in await store.lease_reclaim_expired(pool)] == ["failed"]
    assert await _blocked(pool, a2, a3, w) == [False, True, True]
    assert await _claim(pool) == [a2]
    await store.job_succeed(pool, Lease(a2, "w", 1), [])
    assert await _blocked(pool, a3, w) == [False, True]
    # a3 cancelled while pending (a terminal status set by whoever cancels): w is next
    await pool.execute("UPDATE jobs SET status = 'failed', finished_at = now(), "
                       "error = '{\"class\": \"permanent\", \"message\": \"cancelled\"}' WHERE id = $1", a3)
    assert await _blocked(pool, w) == [False]
    assert await _claim(pool) == [w]
    # a live job deleted outright also lets its successor go
    c1, c2 = await _enqueue(pool, "srv_c"), await _enqueue(pool, "srv_c")
    assert await _blocked(pool, c1, c2) == [False, True]
    await pool.execute("DELETE FROM jobs WHERE id = $1", c1)
    assert await _blocked(pool, c2) == [False]


async def test_a_job_inserted_while_its_blocker_ends_is_not_lost(pool: asyncpg.Pool) -> None:
    a1 = await _enqueue(pool, "srv_a")
    assert await _claim(pool) == [a1]
    async with pool.acquire() as ender, pool.acquire() as inserter:
        end = ender.transaction()
        await end.start()
        await store.job_succeed(ender, Lease(a1, "w", 1), [])  # not committed yet
        ins = inserter.transaction()
        await ins.start()
        c = await _enqueue(inserter, "srv_a")  # sees a1 still live: blocked
        committing = asyncio.create_task(end.commit())  # waits for the inserter's key lock
        await wait_until(lambda: waiting_on_a_lock(pool, committing), 20, "the commit to wait on the key lock")
        assert not committing.done()
        await ins.commit()
        await committing
    assert await _blocked(pool, c) == [False]
    assert await _claim(pool) == [c]


async def test_two_blockers_ending_at_once_unblock_their_common_waiter(pool: asyncpg.Pool) -> None:
    a, b = await _enqueue(pool, "srv_a"), await _enqueue(pool, "srv_b")
    w = await _enqueue(pool, "srv_w", extra=("srv_a", "srv_b"))
    assert await _claim(pool) == [a, b]
    assert await _blocked(pool, w) == [True]
    async with pool.acquire() as c1, pool.acquire() as c2:
        t1, t2 = c1.transaction(), c2.transaction()
        await t1.start()
        await t2.start()
        await store.job_succeed(c1, Lease(a, "w", 1), [])
        await store.job_succeed(c2, Lease(b, "w", 1), [])  # each still sees the other live
        await asyncio.gather(t1.commit(), t2.commit())
    assert await _blocked(pool, w) == [False]
    assert await _claim(pool) == [w]


async def test_the_claim_does_not_scan_blocked_jobs(pool: asyncpg.Pool) -> None:
    heads = [await _enqueue(pool, f"srv_{i}") for i in range(50)]
    for _ in range(20):
        await pool.executemany(
            "INSERT INTO jobs (id, kind, region, resource_type, resource_id) "
            "SELECT 'job_' || lpad(to_hex((random() * 1e15)::bigint), 26, '0'), 'Noop', 'r1', 'server', $1",
            [(f"srv_{i}",) for i in range(50)])
    assert set(await _claim(pool)) == set(heads)
    free = await _enqueue(pool, None)
    await pool.execute("ANALYZE jobs")
    async with pool.acquire() as conn:
        tr = conn.transaction()
        await tr.start()  # EXPLAIN ANALYZE runs the claim: rolled back below
        plan = await conn.fetchval("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + store.job_claim_sql("r1", 16, "w2", TTL))
        await tr.rollback()

    def walk(node: dict[str, Any]) -> list[dict[str, Any]]:
        return [node] + [n for c in node.get("Plans", []) for n in walk(c)]

    # the scan of jobs_claimable meets the free job (and, until VACUUM, the stale entries of the 50
    # heads just claimed), never the 1,000 blocked jobs
    scans = [n for n in walk(plan[0]["Plan"]) if n.get("Index Name") == "jobs_claimable"]
    assert await pool.fetchval("SELECT count(*) FROM jobs WHERE status = 'pending' AND NOT blocked") == 1
    assert scans and all(n["Actual Rows"] <= 51 for n in scans), [(n["Node Type"], n["Actual Rows"]) for n in scans]
    assert plan[0]["Plan"]["Actual Rows"] == 1
    assert await _blocked(pool, free) == [False]


async def test_the_scheduler_frees_a_blocked_job_nothing_blocks(pool: asyncpg.Pool, db_url: str) -> None:
    from z9.common.settings import Settings
    from z9.scheduler import Scheduler

    a1, a2 = await _enqueue(pool, "srv_a"), await _enqueue(pool, "srv_a")
    lone = await _enqueue(pool, "srv_l")
    # a flag no trigger would leave (written behind the triggers' back): lone blocked by nothing
    await pool.execute("UPDATE jobs SET blocked = true WHERE id = $1", lone)
    sched = Scheduler(Settings(database_url=db_url, regions={}))
    sched.pool = pool
    counts = await sched.run_once()  # the first pass runs the safety net
    assert counts.unblocked == 1
    assert await _blocked(pool, a1, a2, lone) == [False, True, False]  # a2 still waits on a1
    assert set(await _claim(pool)) == {a1, lone}
