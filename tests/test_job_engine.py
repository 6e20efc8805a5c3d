"""The job table's engine against real PostgreSQL: claims, per-resource order, fencing, lease
reclaim, retries, the reaper — each through the named queries the services use."""
from __future__ import annotations

import asyncio

import asyncpg
import pytest

from z9.common import store
from z9.common.errors import LeaseLost
from z9.common.store import Lease, NewJob
from z9.reaper import Reaper
from z9.scheduler import Scheduler

from tests.support import make_tenant

TTL = 30.0


async def _enqueue(pool: asyncpg.Pool, resource_id: str | None = "srv_x", kind: str = "Noop", region: str = "r1",
                   max_attempts: int = 3) -> str:
    async with pool.acquire() as conn, conn.transaction():
        job = await store.job_insert(conn, NewJob(kind=kind, region=region, resource_type="server" if resource_id else None,
                                                  resource_id=resource_id, max_attempts=max_attempts))
    return job.id


async def test_claim_is_exclusive_and_in_order(pool: asyncpg.Pool) -> None:
    ids = [await _enqueue(pool, resource_id=f"srv_{i}") for i in range(5)]
    a, b = await asyncio.gather(store.job_claim(pool, ["r1"], 3, "w-a", TTL),
                                store.job_claim(pool, ["r1"], 3, "w-b", TTL))
    claimed = [j.id for j in a] + [j.id for j in b]
    assert sorted(claimed) == sorted(ids)  # each exactly once
    for j in a + b:
        assert j.status == "running" and j.attempt == 1 and j.lease_owner in ("w-a", "w-b")
    assert await store.job_claim(pool, ["r1"], 10, "w-c", TTL) == []
    assert await store.job_claim(pool, ["other"], 10, "w-c", TTL) == []


async def test_one_job_per_resource_in_submission_order(pool: asyncpg.Pool) -> None:
    first = await _enqueue(pool, "srv_same")
    second = await _enqueue(pool, "srv_same")
    other = await _enqueue(pool, "srv_other")
    got = await store.job_claim(pool, ["r1"], 10, "w", TTL)
    assert {j.id for j in got} == {first, other}
    job = next(j for j in got if j.id == first)
    lease = Lease(job.id, "w", job.attempt)
    # While the first runs, or waits in retry, the second is not claimable.
    await store.job_retry(pool, lease, [], {"class": "temporary", "message": "x"}, 0.0)
    assert await store.job_claim(pool, ["r1"], 10, "w", TTL) == []
    await pool.execute("UPDATE jobs SET status = 'pending' WHERE id = $1", first)
    again = await store.job_claim(pool, ["r1"], 10, "w", TTL)
    assert [j.id for j in again] == [first] and again[0].attempt == 2
    await store.job_succeed(pool, Lease(first, "w", 2), [])
    assert [j.id for j in await store.job_claim(pool, ["r1"], 10, "w", TTL)] == [second]


async def test_writes_are_fenced(pool: asyncpg.Pool) -> None:
    await _enqueue(pool)
    job = (await store.job_claim(pool, ["r1"], 1, "w-a", TTL))[0]
    mine = Lease(job.id, "w-a", job.attempt)
    await store.job_heartbeat(pool, mine, TTL)
    for wrong in (Lease(job.id, "w-b", job.attempt), Lease(job.id, "w-a", job.attempt + 1)):
        with pytest.raises(LeaseLost):
            await store.job_progress(pool, wrong, [{"name": "x"}], TTL)
        with pytest.raises(LeaseLost):
            await store.job_succeed(pool, wrong, [])
    await store.job_succeed(pool, mine, [])
    with pytest.raises(LeaseLost):  # terminal: nothing more, not even by the owner
        await store.job_heartbeat(pool, mine, TTL)
    row = await store.job_get(pool, job.id)
    assert row.status == "succeeded" and row.finished_at is not None and row.lease_owner is None


async def test_expired_lease_is_reclaimed_and_fenced_out(pool: asyncpg.Pool, settings) -> None:
    await _enqueue(pool, max_attempts=2)
    job = (await store.job_claim(pool, ["r1"], 1, "w-dead", 0.05))[0]
    await asyncio.sleep(0.1)
    sched = Scheduler(settings)
    sched.pool = pool
    counts = await sched.run_once()
    assert counts.reclaimed == 1 and counts.promoted == 1
    row = await store.job_get(pool, job.id)
    assert row.status == "pending" and row.attempt == 1 and "expired" in row.error["message"]
    with pytest.raises(LeaseLost):  # the stalled worker comes back: every write is rejected
        await store.job_succeed(pool, Lease(job.id, "w-dead", 1), [])
    # Second attempt also dies: out of attempts → failed.
    job2 = (await store.job_claim(pool, ["r1"], 1, "w-dead-2", 0.05))[0]
    assert job2.attempt == 2
    await asyncio.sleep(0.1)
    heard: list[str] = []
    listener = await asyncpg.connect(settings.database_url)
    await listener.add_listener("z9_jobs", lambda *a: heard.append(a[3]))
    try:
        counts = await sched.run_once()
        for _ in range(100):  # the failed job frees its resource's next job: executors are woken
            if heard:
                break
            await asyncio.sleep(0.02)
    finally:
        await listener.close()
    assert counts.reclaimed_failed == 1 and heard == ["r1"]
    row = await store.job_get(pool, job.id)
    assert row.status == "failed" and "out of attempts" in row.error["message"]


async def test_reclaim_never_overwrites_a_finished_job(pool: asyncpg.Pool) -> None:
    await _enqueue(pool)
    job = (await store.job_claim(pool, ["r1"], 1, "w", 0.05))[0]
    await asyncio.sleep(0.1)
    lease = Lease(job.id, "w", job.attempt)
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await store.job_succeed(conn, lease, [])  # holds the row lock, not committed yet
        reclaim = asyncio.create_task(store.lease_reclaim_expired(pool))
        await asyncio.sleep(0.2)
        await tx.commit()
    assert await reclaim == []  # skipped the locked row, and would re-check it anyway
    assert (await store.job_get(pool, job.id)).status == "succeeded"


async def test_retry_becomes_pending_when_due(pool: asyncpg.Pool, settings) -> None:
    await _enqueue(pool)
    job = (await store.job_claim(pool, ["r1"], 1, "w", TTL))[0]
    await store.job_retry(pool, Lease(job.id, "w", 1), [], {"class": "temporary", "message": "busy"}, 0.3)
    sched = Scheduler(settings)
    sched.pool = pool
    assert (await sched.run_once()).promoted == 0
    assert 0 < await store.job_retry_next_in(pool) <= 0.3
    await asyncio.sleep(0.35)
    assert (await sched.run_once()).promoted == 1
    assert (await store.job_get(pool, job.id)).status == "pending"


async def test_snooze_gives_the_attempt_back(pool: asyncpg.Pool) -> None:
    await _enqueue(pool)
    job = (await store.job_claim(pool, ["r1"], 1, "w", TTL))[0]
    await store.job_retry(pool, Lease(job.id, "w", 1), [], {"class": "snooze", "message": "locked"}, 0.0,
                          refund_attempt=True)
    assert (await store.job_get(pool, job.id)).attempt == 0


async def test_reaper_turns_expired_buffers_into_delete_jobs(pool: asyncpg.Pool, settings) -> None:
    tenant, _ = await make_tenant(pool, "acme")
    s = await store.server_insert(pool, tenant_id=tenant, region="dev-1", name="a", image="debian-12", cores=1,
                                  memory_mib=1024, disk_gib=4, ssh_keys=[])
    s2 = await store.server_insert(pool, tenant_id=tenant, region="dev-1", name="b", image="debian-12", cores=1,
                                   memory_mib=1024, disk_gib=4, ssh_keys=[])
    await store.server_mark_deleting(pool, s.id, tenant, 0.0)
    await store.server_mark_deleting(pool, s2.id, tenant, 600.0)
    reapers = [Reaper(settings), Reaper(settings)]
    for r in reapers:
        r.pool = pool
    counts = await asyncio.gather(*(r.run_once() for r in reapers))
    assert sorted(counts) == [0, 1]  # two replicas: enqueued once
    jobs = await store.job_list(pool, tenant, resource_id=s.id)
    assert [j.kind for j in jobs] == ["ServerDelete"]
    assert (await store.server_get(pool, s.id)).status == "destroying"
    assert (await store.server_get(pool, s2.id)).status == "deleting"
    assert await store.server_cancel_deletion(pool, s.id, tenant) is None  # too late


async def test_final_delete_out_of_attempts_by_reclaim_leaves_the_server_deletable(pool: asyncpg.Pool, settings) -> None:
    tenant, _ = await make_tenant(pool, "acme")
    s = await store.server_insert(pool, tenant_id=tenant, region="dev-1", name="a", image="debian-12", cores=1,
                                  memory_mib=1024, disk_gib=4, ssh_keys=[])
    await store.server_mark_deleting(pool, s.id, tenant, 0.0)
    reaper = Reaper(settings)
    reaper.pool = pool
    assert await reaper.run_once() == 1
    await pool.execute("UPDATE jobs SET max_attempts = 1 WHERE resource_id = $1", s.id)
    assert len(await store.job_claim(pool, ["dev-1"], 10, "ghost:1:x", 0.05)) == 1  # the worker dies
    await asyncio.sleep(0.1)
    sched = Scheduler(settings)
    sched.pool = pool
    assert (await sched.run_once()).reclaimed_failed == 1
    server = await store.server_get(pool, s.id)
    assert server.status == "failed" and "expired" in server.status_reason
    assert await store.server_mark_deleting(pool, s.id, tenant, 600.0) is not None  # deletable again


async def test_scheduler_prunes_on_its_first_pass_and_keeps_clone_memos_of_live_servers(pool: asyncpg.Pool,
                                                                                     settings) -> None:
    tenant, _ = await make_tenant(pool, "acme")
    live = await store.server_insert(pool, tenant_id=tenant, region="dev-1", name="live", image="debian-12",
                                     cores=1, memory_mib=1024, disk_gib=4, ssh_keys=[])
    old = [await _enqueue(pool, resource_id=None) for _ in range(3)] + [await _enqueue(pool, resource_id=live.id)]
    await pool.execute("UPDATE jobs SET status = 'succeeded', finished_at = now() - interval '30 days', "
                       "memo = CASE WHEN resource_id IS NULL THEN '{}'::jsonb "
                       "ELSE '{\"clones\": [{\"vmid\": 101, \"node\": \"pve1\"}]}'::jsonb END")
    await store.idempotency_insert(pool, tenant, "k", b"x" * 32, 202, {})
    await pool.execute("UPDATE idempotency_keys SET created_at = now() - interval '2 days'")
    sched = Scheduler(settings, prune_every=1)
    sched.pool = pool
    assert (await sched.run_once()).pruned == 3
    assert [r["id"] for r in await pool.fetch("SELECT id FROM jobs")] == [old[-1]]
    assert await pool.fetchval("SELECT count(*) FROM idempotency_keys") == 0
