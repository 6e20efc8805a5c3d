"""The per-region cap on concurrent jobs (``RegionSettings.max_concurrent_jobs``, issue 13 §4)
against real PostgreSQL: claims racing from many connections and executors never run more than
the cap at once (sampled from the job table), every job still finishes, a dead executor's leases
free their slots, claims inside a finish transaction lock several regions without a deadlock, and
a region without a cap is claimed exactly as before (no lock, no count)."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY as PROM

from z9.common import store
from z9.common.clock import TestClock
from z9.common.errors import LockWaitTimeout
from z9.common.settings import RegionSettings, Settings
from z9.common.sql import q
from z9.common.store import Lease, NewJob
from z9.executor import jobs as job_kinds
from z9.executor.worker import Executor
from z9.scheduler import Scheduler

from tests.support import wait_until

TTL = 30.0


async def _enqueue(pool: asyncpg.Pool, n: int, *, kind: str = "Noop", region: str = "r1",
                   resource: str | None = None) -> list[str]:
    return [(await store.job_insert(pool, NewJob(kind=kind, region=region, resource_type="server" if resource else None,
                                                 resource_id=resource, max_attempts=5))).id for _ in range(n)]


async def _running(pool: asyncpg.Pool, region: str = "r1") -> int:
    return await pool.fetchval("SELECT count(*) FROM jobs WHERE status = 'running' AND region = $1", region)


# ---------------------------------------------------------------------------------- the claim

async def test_racing_claims_take_no_more_than_the_cap(pool: asyncpg.Pool, db_url: str) -> None:
    """Twelve claims at once, each on its own connection (half of them inside a transaction that
    stays open a while after its claim, like a finish batch's), each asking for 10: 4 jobs in all."""
    await _enqueue(pool, 50)
    caps = {"r1": 4}
    conns = [await asyncpg.connect(db_url) for _ in range(12)]
    try:
        async def claim(i: int) -> int:
            c = conns[i]
            if i % 2:
                async with c.transaction():
                    got = await store.job_claim(c, ["r1"], 10, f"w{i}", TTL, caps)
                    await asyncio.sleep(0.05)  # the lock is held to commit
                return len(got)
            return len(await store.job_claim(c, ["r1"], 10, f"w{i}", TTL, caps))

        counts = await asyncio.gather(*(claim(i) for i in range(12)))
    finally:
        for c in conns:
            await c.close()
    assert sum(counts) == 4 and await _running(pool) == 4
    held: list[tuple[str, int, int]] = []
    assert await store.job_claim(pool, ["r1"], 10, "w", TTL, caps, lambda *a: held.append(a)) == []
    assert held == [("r1", 4, 4)]  # the cap, not the queue, held it back
    # a finish frees a slot for exactly one more
    job = await pool.fetchrow("SELECT id, lease_owner, attempt FROM jobs WHERE status = 'running' LIMIT 1")
    await store.job_succeed(pool, Lease(job["id"], job["lease_owner"], job["attempt"]), [])
    assert len(await store.job_claim(pool, ["r1"], 10, "w", TTL, caps)) == 1
    assert await _running(pool) == 4


async def test_the_cap_counts_every_executor_and_only_its_own_region(pool: asyncpg.Pool) -> None:
    await _enqueue(pool, 5, region="r1")
    await _enqueue(pool, 5, region="r2")
    got = await store.job_claim(pool, ["r1"], 2, "uncapped-old-executor", TTL)  # no cap: not counted apart
    assert len(got) == 2
    caps = {"r1": 3}
    got = await store.job_claim(pool, ["r1", "r2"], 10, "w", TTL, caps)
    assert sorted(j.region for j in got) == ["r1"] + ["r2"] * 5  # r1: 3 − 2 running; r2: no cap
    held: list[Any] = []
    assert await store.job_claim(pool, ["r1"], 10, "w", TTL, caps, lambda *a: held.append(a)) == []
    assert held == [("r1", 3, 3)]


async def test_a_queue_shorter_than_the_room_is_not_reported_as_held(pool: asyncpg.Pool) -> None:
    await _enqueue(pool, 2)
    held: list[Any] = []
    got = await store.job_claim(pool, ["r1"], 10, "w", TTL, {"r1": 5}, lambda *a: held.append(a))
    assert len(got) == 2 and held == []  # limited by the queue, not the cap
    got = await store.job_claim(pool, ["r1"], 10, "w", TTL, {"r1": 5}, lambda *a: held.append(a))
    assert got == [] and held == []  # below the cap, nothing waiting


async def test_expired_leases_free_their_slots_and_reclaim_hands_the_jobs_on(pool: asyncpg.Pool, db_url: str,
                                                                             clock: TestClock) -> None:
    """A dead executor held the whole cap; once its leases expire the slots are free (before the
    scheduler even reclaims), and the reclaimed jobs are claimed again under the same cap."""
    dead = await _enqueue(pool, 3)
    rest = await _enqueue(pool, 3)
    caps = {"r1": 3}
    got = await store.job_claim(pool, ["r1"], 10, "dead-executor", TTL, caps, now=clock.db_now())
    assert sorted(j.id for j in got) == sorted(dead)
    assert await store.job_claim(pool, ["r1"], 10, "w", TTL, caps, now=clock.db_now()) == []
    clock.step(TTL + 1)  # the dead executor's leases expire
    got = await store.job_claim(pool, ["r1"], 10, "w", TTL, caps, now=clock.db_now())
    assert sorted(j.id for j in got) == sorted(rest)  # 3 slots free, still 3 "running" rows expired
    sched = Scheduler(Settings(database_url=db_url), clock=clock)
    sched.pool = pool
    counts = await sched.run_once()
    assert counts.reclaimed == 3 and counts.promoted == 3
    assert await store.job_claim(pool, ["r1"], 10, "w", TTL, caps, now=clock.db_now()) == []  # the cap is full with `rest`
    for j in got[:2]:
        await store.job_succeed(pool, Lease(j.id, "w", j.attempt), [])
    again = await store.job_claim(pool, ["r1"], 10, "w2", TTL, caps, now=clock.db_now())
    assert len(again) == 2 and {j.id for j in again} <= set(dead) and all(j.attempt == 2 for j in again)


async def test_transactions_claiming_several_capped_regions_do_not_deadlock(pool: asyncpg.Pool, db_url: str) -> None:
    """Two finish-like transactions claim r1 then r2 and r2 then r1: the locks are taken sorted,
    up front, so one waits for the other instead of a cycle."""
    await _enqueue(pool, 10, region="r1")
    await _enqueue(pool, 10, region="r2")
    caps = {"r1": 2, "r2": 3}
    a, b = await asyncpg.connect(db_url), await asyncpg.connect(db_url)
    try:
        async def claim(c: asyncpg.Connection, order: list[str]) -> list[Any]:
            async with c.transaction():
                got = await store.job_claim(c, order, 10, "w", TTL, caps)
                await asyncio.sleep(0.1)
            return got

        ga, gb = await asyncio.wait_for(asyncio.gather(claim(a, ["r1", "r2"]), claim(b, ["r2", "r1"])), 10)
    finally:
        await a.close()
        await b.close()
    assert len(ga) + len(gb) == 5
    assert await _running(pool, "r1") == 2 and await _running(pool, "r2") == 3


async def test_no_cap_takes_no_lock_and_claims_as_before(pool: asyncpg.Pool, db_url: str) -> None:
    """With r1's cap lock held elsewhere: the claim without a cap (or with only another region's)
    goes straight through; a capped one waits on the lock (here: gives up at lock_timeout)."""
    await _enqueue(pool, 6)
    holder = await asyncpg.connect(db_url)
    try:
        tx = holder.transaction()
        await tx.start()
        await holder.execute(q("job_region_cap_lock"), ["r1"])
        got = await asyncio.wait_for(store.job_claim(pool, ["r1"], 2, "w", TTL), 5)
        assert len(got) == 2
        got = await asyncio.wait_for(store.job_claim(pool, ["r1"], 2, "w", TTL, {"r2": 1}), 5)
        assert len(got) == 2
        waiter = await asyncpg.connect(db_url)
        try:
            await waiter.execute("SET lock_timeout = '200ms'")
            with pytest.raises(LockWaitTimeout):
                await store.job_claim(waiter, ["r1"], 2, "w", TTL, {"r1": 10})
        finally:
            await waiter.close()
        await tx.rollback()
    finally:
        await holder.close()
    assert len(await store.job_claim(pool, ["r1"], 10, "w", TTL, {"r1": 10})) == 2


def test_the_setting() -> None:
    r = RegionSettings(url="https://pve:8006", token_secret="s")
    assert r.max_concurrent_jobs is None
    assert RegionSettings(url="https://pve:8006", token_secret="s", max_concurrent_jobs=12).max_concurrent_jobs == 12
    with pytest.raises(ValueError, match="max_concurrent_jobs"):
        RegionSettings(url="https://pve:8006", token_secret="s", max_concurrent_jobs=0)


# ---------------------------------------------------------------------------------- executors

class _Sleeper:
    """A job kind that runs ``hold_s`` seconds and counts how many of its jobs run at once (in
    this process, across every executor of the test)."""

    KIND = "CapSleeper"

    def __init__(self) -> None:
        self.hold_s = 0.15
        self.now = 0
        self.peak = 0
        self.done: set[str] = set()
        self.starts: list[float] = []

    async def observe(self, ctx: Any) -> None:
        self.starts.append(time.monotonic())
        self.now += 1
        self.peak = max(self.peak, self.now)

    def plan(self, job: Any, world: Any) -> list[Any]:
        return []

    async def apply(self, ctx: Any, world: Any, step: Any) -> None:
        return None

    async def verify(self, ctx: Any) -> None:
        await asyncio.sleep(self.hold_s)

    async def record(self, conn: Any, ctx: Any, observed: Any) -> None:
        self.now -= 1
        self.done.add(ctx.job.id)

    async def record_failure(self, conn: Any, ctx: Any, error: dict[str, Any]) -> None:
        self.now -= 1


class _NoClient:
    def close(self) -> None:
        return None


@pytest.fixture
def sleeper() -> Any:
    k = _Sleeper()
    job_kinds.register(k)
    yield k
    job_kinds.REGISTRY.pop(_Sleeper.KIND, None)


def _settings(db_url: str, cap: int | None, concurrency: int, **kw: Any) -> Settings:
    region = RegionSettings(url="https://127.0.0.1:1", token_secret="unused", max_concurrent_jobs=cap)
    return Settings(database_url=db_url, executor_concurrency=concurrency, poll_interval_s=0.2,
                    regions={"r1": region}, **kw)


async def _drive(pool: asyncpg.Pool, executors: list[Executor], ids: list[str], timeout_s: float,
                 live_leases_only: bool = False) -> int:
    """Run the executors until every job of ``ids`` succeeded; the peak of running jobs sampled
    from the table every few milliseconds meanwhile (``live_leases_only``: those whose lease has
    not expired — a dead executor's rows stay 'running' until the scheduler's reclaim)."""
    tasks = [asyncio.create_task(ex.run()) for ex in executors]
    peak = 0

    async def all_succeeded() -> bool:
        nonlocal peak
        row = await pool.fetchrow(
            "SELECT count(*) FILTER (WHERE status = 'running' AND (NOT $2 OR lease_expires_at > now())) AS running,"
            "       count(*) FILTER (WHERE status = 'succeeded') AS ok FROM jobs WHERE id = ANY($1)", ids, live_leases_only)
        peak = max(peak, row["running"])
        return row["ok"] == len(ids)
    try:
        await wait_until(all_succeeded, timeout_s, f"all {len(ids)} jobs to succeed", interval_s=0.005)
    finally:
        for ex in executors:
            ex.stop()
        await asyncio.gather(*tasks)
    return peak


def _waits(region: str = "r1") -> float:
    return PROM.get_sample_value("z9_region_cap_waits_total", {"region": region}) or 0.0


async def test_executors_together_never_exceed_the_cap(pool: asyncpg.Pool, db_url: str, sleeper: _Sleeper,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """3 executors × concurrency 4 (12 slots) against a cap of 5: at most 5 running at any sample,
    the cap reached, every job done, the held-back claims counted and logged."""
    ids = await _enqueue(pool, 40, kind=_Sleeper.KIND)
    executors = [Executor(_settings(db_url, 5, 4), ["r1"], owner=f"ex-{i}",
                          client_factory=lambda r: _NoClient()) for i in range(3)]  # type: ignore[arg-type,return-value]
    waits_before = _waits()
    with caplog.at_level(logging.INFO, logger="z9.executor"):
        peak = await _drive(pool, executors, ids, 60)
    assert peak <= 5 and sleeper.peak <= 5
    assert sleeper.peak == 5  # the cap, not something else, was the limit
    assert sleeper.done == set(ids)
    assert _waits() > waits_before
    assert any("at its cap of 5 concurrent jobs" in r.getMessage() for r in caplog.records)
    assert PROM.get_sample_value("z9_region_cap_jobs", {"region": "r1"}) == 5


async def test_without_a_cap_executors_use_their_whole_concurrency(pool: asyncpg.Pool, db_url: str,
                                                                  sleeper: _Sleeper) -> None:
    ids = await _enqueue(pool, 40, kind=_Sleeper.KIND)
    executors = [Executor(_settings(db_url, None, 4), ["r1"], owner=f"ex-{i}",
                          client_factory=lambda r: _NoClient()) for i in range(3)]  # type: ignore[arg-type,return-value]
    assert all(ex.caps == {} for ex in executors)
    waits_before = _waits()
    peak = await _drive(pool, executors, ids, 60)
    assert sleeper.done == set(ids)
    assert sleeper.peak > 5 and peak > 5  # up to 12
    assert _waits() == waits_before


async def test_a_dead_executors_slots_come_back(pool: asyncpg.Pool, db_url: str, sleeper: _Sleeper) -> None:
    """An executor died holding the whole cap (its jobs 'running', leases ticking): the live ones
    wait; when the leases expire they take the other jobs, and after the scheduler's reclaim the
    dead executor's jobs too — never more than the cap at once, every job done."""
    ids = await _enqueue(pool, 12, kind=_Sleeper.KIND)
    caps = {"r1": 3}
    dead = await store.job_claim(pool, ["r1"], 10, "dead-executor", 1.0, caps)
    claimed_at = time.monotonic()
    assert len(dead) == 3
    executors = [Executor(_settings(db_url, 3, 4), ["r1"], owner=f"ex-{i}",
                          client_factory=lambda r: _NoClient()) for i in range(2)]  # type: ignore[arg-type,return-value]
    sched = Scheduler(Settings(database_url=db_url, scheduler_interval_s=0.3))  # its own loop and pool
    r = asyncio.create_task(sched.run())
    try:
        peak = await _drive(pool, executors, ids, 60, live_leases_only=True)
    finally:
        sched.stop()
        await asyncio.wait_for(r, 30)
    assert peak <= 3 and sleeper.peak <= 3
    assert sleeper.done == set(ids)
    assert min(sleeper.starts) - claimed_at >= 0.8  # nothing ran before the dead leases expired
    attempts = {r["id"]: r["attempt"] for r in await pool.fetch("SELECT id, attempt FROM jobs WHERE id = ANY($1)", ids)}
    assert all(attempts[j.id] == 2 for j in dead)
