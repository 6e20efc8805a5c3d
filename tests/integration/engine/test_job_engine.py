"""The job table's engine against real PostgreSQL: claims, per-resource order, fencing, lease
reclaim, retries, the reaper — each through the named queries the services use."""
from __future__ import annotations

from typing import Any

import asyncio

import asyncpg
import pytest

from z9.common import store
from z9.common.clock import TestClock
from z9.resources.server import SERVER
from z9.common.errors import CheckViolation, LeaseLost
from z9.common.store import Lease, NewJob
from z9.reaper import Reaper
from z9.scheduler import Scheduler

from tests.support import make_tenant, wait_until
from z9.resources.server import store as server_store

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


async def test_claim_is_planned_once_per_connection(pool: asyncpg.Pool) -> None:
    """Issue 14: the claim carries no parameters (its values are literals), so under z9's
    force_custom_plan PostgreSQL still plans it once and reuses that plan — for the real LIMIT —
    instead of planning every claim; the values are quoted, never spliced."""
    owner = "host:1:it's\\odd"  # a quote and a backslash in the lease owner
    for i in range(5):
        await _enqueue(pool, resource_id=f"srv_{i}")
    async with pool.acquire() as conn:
        assert await conn.fetchval("SELECT current_setting('plan_cache_mode')") == "force_custom_plan"
        got = []
        for _ in range(6):
            got += await store.job_claim(conn, ["r1"], 1, owner, TTL)
        assert len(got) == 5 and {j.lease_owner for j in got} == {owner}
        sql = store.job_claim_sql("r1", 1, owner, TTL)
        row = await conn.fetchrow("SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                                  "WHERE statement = $1", sql)
        assert row is not None and row["custom_plans"] == 0 and row["generic_plans"] >= 6, row
        plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + sql))
        assert "Index Scan using jobs_claimable" in plan and "Seq Scan on jobs" not in plan, plan
        # the one sort orders the tenants' heads (at most {limit} per tenant), never the pending jobs
        tree = (await conn.fetchval("EXPLAIN (FORMAT JSON) " + sql))[0]["Plan"]

        def walk(node: dict[str, Any]) -> list[dict[str, Any]]:
            return [node] + [n for c in node.get("Plans", []) for n in walk(c)]

        for sort in (n for n in walk(tree) if n["Node Type"] == "Sort"):
            assert not any(n.get("Index Name") == "jobs_claimable" for n in walk(sort)), plan
    with pytest.raises(ValueError):
        store.job_claim_sql("r1", 0, owner, TTL)
    with pytest.raises(ValueError):
        store.job_claim_sql("r1", 1, "a\x00b", TTL)


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


async def _enqueue_locking(pool: asyncpg.Pool, resource_id: str, *also: str) -> str:
    async with pool.acquire() as conn, conn.transaction():
        job = await store.job_insert(conn, NewJob(kind="Noop", region="r1", resource_type="server",
                                                  resource_id=resource_id, extra_lock_keys=also))
    return job.id


async def _claim_ids(pool: asyncpg.Pool) -> set[str]:
    return {j.id for j in await store.job_claim(pool, ["r1"], 10, "w", TTL)}


async def _finish(pool: asyncpg.Pool, *ids: str) -> None:
    for jid in ids:
        job = await store.job_get(pool, jid)
        await store.job_succeed(pool, Lease(jid, "w", job.attempt), [])


async def test_a_job_locking_two_resources_waits_for_earlier_jobs_of_both(pool: asyncpg.Pool) -> None:
    """Lock keys: a job runs only when no earlier live job shares any of its keys — whether the
    key is that job's resource or one of its extra keys — and later jobs of either resource wait
    for it. Waiting only on earlier jobs (a total order) leaves no cycle: every wave below makes
    progress."""
    a1 = await _enqueue_locking(pool, "adr_a")                  # address a
    s1 = await _enqueue_locking(pool, "srv_s")                  # server s
    both = await _enqueue_locking(pool, "adr_a", "srv_s")       # assign a to s
    s2 = await _enqueue_locking(pool, "srv_s")                  # a later job of s
    a2 = await _enqueue_locking(pool, "adr_a", "srv_t")         # move a on to t
    t1 = await _enqueue_locking(pool, "srv_t")                  # t: waits for the move (its extra key)
    u1 = await _enqueue_locking(pool, "srv_u")                  # unrelated
    assert await _claim_ids(pool) == {a1, s1, u1}
    assert await store.resource_count_live_jobs(pool, "srv_t") == 2  # a2 (extra key) and t1
    await _finish(pool, a1)
    assert await _claim_ids(pool) == set()  # `both` still waits for s1
    await _finish(pool, s1, u1)
    assert await _claim_ids(pool) == {both}
    await _finish(pool, both)
    assert await _claim_ids(pool) == {s2, a2}  # s2 (key s) and a2 (keys a, t) share nothing
    await _finish(pool, a2)
    assert await _claim_ids(pool) == {t1}
    await _finish(pool, s2, t1)
    assert await pool.fetchval("SELECT count(*) FROM jobs WHERE status <> 'succeeded'") == 0


async def test_extra_lock_keys_need_a_resource(pool: asyncpg.Pool) -> None:
    with pytest.raises(CheckViolation) as e:  # translated at the store's boundary, naming the constraint
        await store.job_insert(pool, NewJob(kind="Noop", region="r1", extra_lock_keys=("srv_s",)))
    assert e.value.constraint == "jobs_extra_lock_keys_need_resource"


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


async def test_expired_lease_is_reclaimed_and_fenced_out(pool: asyncpg.Pool, settings, clock: TestClock) -> None:
    await _enqueue(pool, max_attempts=2)
    job = (await store.job_claim(pool, ["r1"], 1, "w-dead", TTL, now=clock.db_now()))[0]
    clock.step(TTL + 1)  # the worker stalled past its lease
    sched = Scheduler(settings, clock=clock)
    sched.pool = pool
    counts = await sched.run_once()
    assert counts.reclaimed == 1 and counts.promoted == 1
    row = await store.job_get(pool, job.id)
    assert row.status == "pending" and row.attempt == 1 and "expired" in row.error["message"]
    with pytest.raises(LeaseLost):  # the stalled worker comes back: every write is rejected
        await store.job_succeed(pool, Lease(job.id, "w-dead", 1), [])
    # Second attempt also dies: out of attempts → failed.
    job2 = (await store.job_claim(pool, ["r1"], 1, "w-dead-2", TTL, now=clock.db_now()))[0]
    assert job2.attempt == 2
    clock.step(TTL + 1)
    heard: list[str] = []
    listener = await asyncpg.connect(settings.database_url)
    await listener.add_listener("z9_jobs", lambda *a: heard.append(a[3]))
    try:
        counts = await sched.run_once()
        # the failed job frees its resource's next job: executors are woken
        await wait_until(lambda: heard, 10, "the executors' wake-up (NOTIFY z9_jobs)", interval_s=0.02)
    finally:
        await listener.close()
    assert counts.reclaimed_failed == 1 and heard == ["r1"]
    row = await store.job_get(pool, job.id)
    assert row.status == "failed" and "out of attempts" in row.error["message"]


async def test_reclaim_never_overwrites_a_finished_job(pool: asyncpg.Pool, clock: TestClock) -> None:
    await _enqueue(pool)
    job = (await store.job_claim(pool, ["r1"], 1, "w", TTL, now=clock.db_now()))[0]
    clock.step(TTL + 1)  # its lease has expired, its finish is under way
    lease = Lease(job.id, "w", job.attempt)
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await store.job_succeed(conn, lease, [])  # holds the row lock, not committed yet
        # the reclaim runs while the row is locked: it skips it (SKIP LOCKED; a wait would time out here)
        reclaim = await asyncio.wait_for(store.lease_reclaim_expired(pool, now=clock.db_now()), 20)
        await tx.commit()
    assert reclaim == []  # skipped the locked row, and would re-check it anyway
    assert await store.lease_reclaim_expired(pool, now=clock.db_now()) == []  # finished: nothing to reclaim
    assert (await store.job_get(pool, job.id)).status == "succeeded"


async def test_retry_becomes_pending_when_due(pool: asyncpg.Pool, settings, clock: TestClock) -> None:
    await _enqueue(pool)
    clock.pin()  # from here time stands still but where the test moves it (the job is due already)
    job = (await store.job_claim(pool, ["r1"], 1, "w", TTL, now=clock.db_now()))[0]
    await store.job_retry(pool, Lease(job.id, "w", 1), [], {"class": "temporary", "message": "busy"}, 30.0,
                          now=clock.db_now())
    sched = Scheduler(settings, clock=clock)
    sched.pool = pool
    assert (await sched.run_once()).promoted == 0
    assert await store.job_retry_next_in(pool, now=clock.db_now()) == pytest.approx(30.0)
    clock.step(29.9)
    assert (await sched.run_once()).promoted == 0
    clock.step(0.2)
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
    s = await server_store.server_insert(pool, tenant_id=tenant, region="dev-1", name="a", image="debian-12", cores=1,
                                  memory_mib=1024, disk_gib=4, ssh_keys=[])
    s2 = await server_store.server_insert(pool, tenant_id=tenant, region="dev-1", name="b", image="debian-12", cores=1,
                                   memory_mib=1024, disk_gib=4, ssh_keys=[])
    await SERVER.mark_deleting(pool, s.id, tenant, 0.0)
    await SERVER.mark_deleting(pool, s2.id, tenant, 600.0)
    reapers = [Reaper(settings), Reaper(settings)]
    for r in reapers:
        r.pool = pool
    counts = await asyncio.gather(*(r.run_once() for r in reapers))
    assert sorted(counts) == [0, 1]  # two replicas: enqueued once
    jobs = await store.job_list(pool, tenant, resource_id=s.id)
    assert [j.kind for j in jobs] == ["ServerDelete"]
    assert (await server_store.server_get(pool, s.id)).status == "destroying"
    assert (await server_store.server_get(pool, s2.id)).status == "deleting"
    assert await SERVER.cancel_deletion(pool, s.id, tenant) is None  # too late


async def test_final_delete_out_of_attempts_by_reclaim_leaves_the_server_deletable(pool: asyncpg.Pool, settings,
                                                                                   clock: TestClock) -> None:
    tenant, _ = await make_tenant(pool, "acme")
    s = await server_store.server_insert(pool, tenant_id=tenant, region="dev-1", name="a", image="debian-12", cores=1,
                                  memory_mib=1024, disk_gib=4, ssh_keys=[])
    await SERVER.mark_deleting(pool, s.id, tenant, 0.0)
    reaper = Reaper(settings)
    reaper.pool = pool
    assert await reaper.run_once() == 1
    await pool.execute("UPDATE jobs SET max_attempts = 1 WHERE resource_id = $1", s.id)
    assert len(await store.job_claim(pool, ["dev-1"], 10, "ghost:1:x", TTL, now=clock.db_now())) == 1  # the worker dies
    clock.step(TTL + 1)
    sched = Scheduler(settings, clock=clock)
    sched.pool = pool
    assert (await sched.run_once()).reclaimed_failed == 1
    server = await server_store.server_get(pool, s.id)
    assert server.status == "failed" and "expired" in server.status_reason
    assert await SERVER.mark_deleting(pool, s.id, tenant, 600.0) is not None  # deletable again


async def test_scheduler_prunes_on_its_first_pass_without_looking_at_resources(pool: asyncpg.Pool,
                                                                                settings) -> None:
    """Pruning knows the job table only: what a later job of a live resource needs (its clone
    requests) is kept in vm_clone_requests, which outlives the jobs that wrote it."""
    tenant, _ = await make_tenant(pool, "acme")
    live = await server_store.server_insert(pool, tenant_id=tenant, region="dev-1", name="live", image="debian-12",
                                     cores=1, memory_mib=1024, disk_gib=4, ssh_keys=[])
    old = [await _enqueue(pool, resource_id=None) for _ in range(3)] + [await _enqueue(pool, resource_id=live.id)]
    [job] = [j for j in await store.job_claim(pool, ["r1"], 4, "w", 30.0) if j.resource_id == live.id]
    await store.vm_clone_sent(pool, Lease(job.id, "w", 1), live.id, "main", 101, "pve1")
    await pool.execute("UPDATE jobs SET status = 'succeeded', finished_at = now() - interval '30 days', "
                       "lease_owner = NULL, lease_expires_at = NULL")
    await store.idempotency_insert(pool, tenant, "k", b"x" * 32, 202, {})
    await pool.execute("UPDATE idempotency_keys SET created_at = now() - interval '2 days'")
    sched = Scheduler(settings, prune_every=1)
    sched.pool = pool
    assert (await sched.run_once()).pruned == 4
    assert await pool.fetchval("SELECT count(*) FROM jobs") == 0
    [req] = await store.vm_clone_requests(pool, live.id)
    assert (req.vmid, req.node, req.job_id) == (101, "pve1", job.id) and req.uncertain_since is not None
    assert await pool.fetchval("SELECT count(*) FROM idempotency_keys") == 0


async def test_a_clone_request_is_uncertain_from_when_it_was_last_known_in_flight(pool: asyncpg.Pool) -> None:
    """Unanswered, a request is uncertain from when it was recorded (its sender may have died with
    it in flight) — or from when its sender saw the answer lost (it was in flight until then)."""
    jid = await _enqueue(pool, resource_id="srv_c")
    [job] = await store.job_claim(pool, ["r1"], 1, "w", TTL)
    lease = Lease(jid, "w", job.attempt)
    await store.vm_clone_sent(pool, lease, "srv_c", "main", 101, "pve1")
    await store.vm_clone_sent(pool, lease, "srv_c", "main", 102, "pve1")
    await pool.execute("UPDATE vm_clone_requests SET sent_at = now() - interval '1 hour'")
    await store.vm_clone_lost(pool, "srv_c", "main", 102)
    await store.vm_clone_answered(pool, "srv_c", "main", 101, "UPID:pve1:1")
    a, b = await store.vm_clone_requests(pool, "srv_c")
    now = await pool.fetchval("SELECT extract(epoch FROM now())::float8")
    assert a.vmid == 101 and a.uncertain_since is None and a.upid == "UPID:pve1:1"
    assert b.vmid == 102 and abs(b.uncertain_since - now) < 5  # lost just now, not an hour ago
    with pytest.raises(LeaseLost):  # recording a request is fenced by the sender's lease
        await store.vm_clone_sent(pool, Lease(jid, "other", job.attempt), "srv_c", "main", 103, "pve1")
