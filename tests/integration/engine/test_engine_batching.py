"""The executor's batched paths against real PostgreSQL: batch finishes stay fenced row by row
(a stale row is rejected and reported to its own job, the others succeed), batch heartbeats
report exactly the lost leases, claims — batch claims and claims inside a finish transaction —
keep per-resource order, and coalesced NOTIFYs still wake an executor after a burst."""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import asyncpg
import pytest

from z9.common import store
from z9.common.errors import LeaseLost
from z9.common.notify import JobNotifier
from z9.common.settings import Settings
from z9.common.store import Lease, NewJob
from z9.executor import jobs as job_kinds
from z9.executor.batching import FinishBatcher
from z9.executor.worker import Executor

from tests.support import wait_until

TTL = 30.0


async def _enqueue(pool: asyncpg.Pool, resource_id: str | None, kind: str = "Noop", region: str = "r1") -> str:
    job = await store.job_insert(pool, NewJob(kind=kind, region=region, resource_type="server" if resource_id else None,
                                              resource_id=resource_id, max_attempts=3))
    return job.id


class _Kind:
    """A job kind recording what ``record`` saw; ``fail_for`` makes record raise for one job."""

    def __init__(self, fail_for: str | None = None):
        self.recorded: list[str] = []
        self.fail_for = fail_for

    async def record(self, conn: Any, ctx: Any, observed: Any) -> None:
        if ctx.job.id == self.fail_for:
            raise RuntimeError("record failed")
        await conn.execute("SELECT 1")  # inside the finish transaction
        self.recorded.append(ctx.job.id)


def _ctx(job: Any, owner: str) -> Any:
    return SimpleNamespace(job=job, lease=Lease(job.id, owner, job.attempt), steps_json=lambda: [{"name": "s"}])


async def _status(pool: asyncpg.Pool, job_id: str) -> tuple[str, str | None, int]:
    r = await pool.fetchrow("SELECT status, lease_owner, attempt FROM jobs WHERE id = $1", job_id)
    return r["status"], r["lease_owner"], r["attempt"]


async def _steal(pool: asyncpg.Pool, job_id: str, new_owner: str) -> None:
    """The job's lease expires, the scheduler reclaims it and another worker claims it."""
    await pool.execute("UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1", job_id)
    reclaimed = await store.lease_reclaim_expired(pool)
    assert [r["id"] for r in reclaimed] == [job_id]
    await pool.execute("UPDATE jobs SET status = 'pending' WHERE id = $1", job_id)
    again = await store.job_claim(pool, ["r1"], 10, new_owner, TTL)
    assert [j.id for j in again] == [job_id] and again[0].attempt == 2


async def test_batch_finish_rejects_the_stale_row_and_finishes_the_others(pool: asyncpg.Pool) -> None:
    ids = [await _enqueue(pool, f"srv_{i}") for i in range(3)]
    claimed = {j.id: j for j in await store.job_claim(pool, ["r1"], 10, "w-old", TTL)}
    assert set(claimed) == set(ids)
    stale = ids[1]
    await _steal(pool, stale, "w-new")

    kind = _Kind()
    batcher = FinishBatcher(pool)
    results = await asyncio.gather(*(batcher.succeed(_ctx(claimed[i], "w-old"), kind, None) for i in ids),
                                   return_exceptions=True)
    assert batcher.flushes == 1  # one transaction for the three
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], LeaseLost) and stale in str(results[1])
    assert sorted(kind.recorded) == sorted([ids[0], ids[2]])  # no record for the lost job
    assert await _status(pool, ids[0]) == ("succeeded", None, 1)
    assert await _status(pool, ids[2]) == ("succeeded", None, 1)
    assert await _status(pool, stale) == ("running", "w-new", 2)  # the new owner's run is untouched
    steps = await pool.fetchval("SELECT steps FROM jobs WHERE id = $1", ids[0])
    assert steps == [{"name": "s"}]


async def test_batch_finish_falls_back_to_one_by_one_when_a_record_fails(pool: asyncpg.Pool) -> None:
    ids = [await _enqueue(pool, f"srv_{i}") for i in range(3)]
    claimed = {j.id: j for j in await store.job_claim(pool, ["r1"], 10, "w", TTL)}
    kind = _Kind(fail_for=ids[0])
    batcher = FinishBatcher(pool)
    results = await asyncio.gather(*(batcher.succeed(_ctx(claimed[i], "w"), kind, None) for i in ids),
                                   return_exceptions=True)
    assert isinstance(results[0], RuntimeError) and results[1:] == [None, None]
    assert await _status(pool, ids[0]) == ("running", "w", 1)  # its finish rolled back, as alone
    assert [await _status(pool, i) for i in ids[1:]] == [("succeeded", None, 1)] * 2


async def test_a_lease_lost_raised_by_record_in_a_batch_answers_every_job(pool: asyncpg.Pool) -> None:
    """A kind's record() raising LeaseLost inside a batch: every job of the batch gets its own
    answer (finished one by one), none waits forever and none is told a lease it still holds is lost."""
    ids = [await _enqueue(pool, f"srv_{i}") for i in range(3)]
    claimed = {j.id: j for j in await store.job_claim(pool, ["r1"], 10, "w", TTL)}

    class _Raises(_Kind):
        async def record(self, conn: Any, ctx: Any, observed: Any) -> None:
            if ctx.job.id == ids[1]:
                raise LeaseLost(f"job {ids[1]}: lost while recording")
            await super().record(conn, ctx, observed)

    batcher = FinishBatcher(pool)
    results = await asyncio.wait_for(asyncio.gather(
        *(batcher.succeed(_ctx(claimed[i], "w"), _Raises(), None) for i in ids), return_exceptions=True), 10)
    assert results[0] is None and results[2] is None, results
    assert isinstance(results[1], LeaseLost)
    assert [(await _status(pool, i))[0] for i in ids] == ["succeeded", "running", "succeeded"]


async def test_an_executor_of_two_regions_does_not_starve_the_second(pool: asyncpg.Pool, db_url: str,
                                                                    probe: _Probe) -> None:
    """Region r1 always has more ready jobs than free slots; a job of r2 is still claimed within
    a few claims (the claim order rotates), not after r1's backlog. Each job holds its slot 5 ms, so
    r1's backlog lasts ≥ 0.75 s however fast the machine (a quiet one drained 300 no-op jobs before
    r2's job was even enqueued)."""
    probe.hold_s = 0.005
    busy = [await _enqueue(pool, None, kind=_Probe.KIND, region="r1") for _ in range(300)]
    ex = Executor(_settings(db_url, 2, poll_s=60.0), ["r1", "r2"], client_factory=lambda r: _NoClient())  # type: ignore[arg-type,return-value]
    task = asyncio.create_task(ex.run())
    try:
        async def r1_under_way() -> bool:
            return bool(await pool.fetchval("SELECT count(*) FROM jobs WHERE id = ANY($1) AND status <> 'pending'", busy))
        await wait_until(r1_under_way, 20, "r1's backlog under way", interval_s=0.01)
        other = await _enqueue(pool, None, kind=_Probe.KIND, region="r2")
        await _wait_done(pool, [other], 30)
        done_r1 = await pool.fetchval("SELECT count(*) FROM jobs WHERE id = ANY($1) AND status = 'succeeded'", busy)
    finally:
        ex.stop()
        await task
    assert done_r1 < len(busy) - 50, f"r2's job waited for {done_r1} of r1's {len(busy)} jobs"


async def test_store_batch_finish_and_heartbeat_report_lost_leases(pool: asyncpg.Pool) -> None:
    ids = [await _enqueue(pool, f"srv_{i}") for i in range(3)]
    jobs = {j.id: j for j in await store.job_claim(pool, ["r1"], 10, "w", TTL)}
    leases = [Lease(i, "w", jobs[i].attempt) for i in ids]
    wrong_attempt = Lease(ids[2], "w", jobs[ids[2]].attempt + 1)
    await pool.execute("UPDATE jobs SET lease_expires_at = now() + interval '1 second' WHERE id = ANY($1)", ids)
    lost = await store.job_heartbeat_many(pool, [leases[0], leases[1], wrong_attempt], 600.0)
    assert lost == [wrong_attempt]
    left = await pool.fetch("SELECT id, lease_expires_at > now() + interval '500 seconds' AS renewed FROM jobs "
                            "WHERE id = ANY($1) ORDER BY id", ids)
    assert {r["id"]: r["renewed"] for r in left} == {ids[0]: True, ids[1]: True, ids[2]: False}

    lost = await store.job_succeed_many(pool, [(leases[0], []), (Lease(ids[1], "other", 1), []), (leases[2], [])])
    assert lost == [Lease(ids[1], "other", 1)]
    assert [(await _status(pool, i))[0] for i in ids] == ["succeeded", "running", "succeeded"]
    # a finished job is not finished again: its lease is gone
    assert await store.job_succeed_many(pool, [(leases[0], [])]) == [leases[0]]
    assert await store.job_heartbeat_many(pool, [leases[0]], TTL) == [leases[0]]


async def test_batch_claim_takes_only_the_earliest_live_job_of_each_resource(pool: asyncpg.Pool) -> None:
    a1 = await _enqueue(pool, "srv_a")
    a2 = await _enqueue(pool, "srv_a")
    b1 = await _enqueue(pool, "srv_b")
    none = await _enqueue(pool, None)
    a3 = await _enqueue(pool, "srv_a")
    got = await store.job_claim(pool, ["r1"], 16, "w", TTL)
    assert [j.id for j in got] == [a1, b1, none]  # seq order, one per resource
    assert await store.job_claim(pool, ["r1"], 16, "w", TTL) == []
    # the next of srv_a becomes claimable only once a1 is finished — also inside the finishing
    # transaction (the executor's claim-in-finish)
    async with pool.acquire() as conn, conn.transaction():
        await store.job_succeed(conn, Lease(a1, "w", 1), [])
        await store.jobs_unblock_now(conn)  # as the executor's batcher does before its claim
        nxt = await store.job_claim(conn, ["r1"], 16, "w", TTL)
    assert [j.id for j in nxt] == [a2]
    await store.job_succeed(pool, Lease(a2, "w", 1), [])
    assert [j.id for j in await store.job_claim(pool, ["r1"], 16, "w", TTL)] == [a3]


async def test_claim_spans_regions_in_order_up_to_the_limit(pool: asyncpg.Pool) -> None:
    r1 = [await _enqueue(pool, None, region="r1") for _ in range(2)]
    r2 = [await _enqueue(pool, None, region="r2") for _ in range(2)]
    got = await store.job_claim(pool, ["r1", "r2"], 3, "w", TTL)
    assert [j.id for j in got] == r1 + r2[:1]


# ---------------------------------------------------------------------------------- executor

class _Probe:
    """A job kind that records, per resource, when each job ran; ``hold_s`` keeps it running."""

    KIND = "BatchProbe"

    def __init__(self) -> None:
        self.runs: list[tuple[str, str, float, float]] = []  # (resource, job, start, end)
        self.started: dict[str, float] = {}
        self.hold_s = 0.0

    async def observe(self, ctx: Any) -> None:
        self.started[ctx.job.id] = time.monotonic()

    def plan(self, job: Any, world: Any) -> list[Any]:
        return []

    async def apply(self, ctx: Any, world: Any, step: Any) -> None:
        return None

    async def verify(self, ctx: Any) -> None:
        await asyncio.sleep(self.hold_s)
        return None

    async def record(self, conn: Any, ctx: Any, observed: Any) -> None:
        self.runs.append((ctx.job.resource_id, ctx.job.id, self.started[ctx.job.id], time.monotonic()))

    async def record_failure(self, conn: Any, ctx: Any, error: dict[str, Any]) -> None:
        return None


class _NoClient:
    def close(self) -> None:
        return None


@pytest.fixture
def probe() -> Any:
    p = _Probe()
    job_kinds.register(p)
    yield p
    job_kinds.REGISTRY.pop(_Probe.KIND, None)


def _settings(db_url: str, concurrency: int, poll_s: float = 60.0) -> Settings:
    return Settings(database_url=db_url, executor_concurrency=concurrency, poll_interval_s=poll_s, regions={})


async def _wait_done(pool: asyncpg.Pool, ids: list[str], timeout_s: float) -> None:
    async def done() -> bool:
        return await pool.fetchval("SELECT count(*) FROM jobs WHERE id = ANY($1) AND status = 'succeeded'",
                                   ids) == len(ids)
    await wait_until(done, timeout_s, f"{len(ids)} jobs to succeed", interval_s=0.02)


async def test_executor_keeps_per_resource_order_with_batched_finishes(pool: asyncpg.Pool, db_url: str,
                                                                      probe: _Probe) -> None:
    ids = []
    for i in range(60):
        ids.append(await _enqueue(pool, f"srv_{i % 4}", kind=_Probe.KIND))
    ex = Executor(_settings(db_url, 8, poll_s=0.5), ["r1"], client_factory=lambda r: _NoClient())  # type: ignore[arg-type,return-value]
    task = asyncio.create_task(ex.run())
    try:
        await _wait_done(pool, ids, 30)
    finally:
        ex.stop()
        await task
    assert ex.finisher is not None and ex.finisher.flushes < len(ids)  # finishes were coalesced
    seq = {r["id"]: r["seq"] for r in await pool.fetch("SELECT id, seq FROM jobs WHERE id = ANY($1)", ids)}
    by_resource: dict[str, list[tuple[str, float, float]]] = {}
    for res, jid, start, end in probe.runs:
        by_resource.setdefault(res, []).append((jid, start, end))
    assert sum(len(v) for v in by_resource.values()) == len(ids)
    for runs in by_resource.values():
        runs.sort(key=lambda r: r[1])
        assert [seq[j] for j, _, _ in runs] == sorted(seq[j] for j, _, _ in runs)  # submission order
        for (_, _, end), (_, start, _) in zip(runs, runs[1:]):
            assert start >= end  # never two at once: the next starts after the previous recorded
    assert not ex.inflight and ex._reserved == 0


async def test_executor_never_runs_more_than_its_concurrency(pool: asyncpg.Pool, db_url: str,
                                                            probe: _Probe) -> None:
    probe.hold_s = 0.02
    ids = [await _enqueue(pool, None, kind=_Probe.KIND) for _ in range(40)]
    ex = Executor(_settings(db_url, 3, poll_s=0.2), ["r1"], client_factory=lambda r: _NoClient())  # type: ignore[arg-type,return-value]
    peak = 0
    task = asyncio.create_task(ex.run())

    async def watch() -> None:
        nonlocal peak
        while True:
            running = sum(1 for t, c in ex.inflight.values() if not c.finished)
            peak = max(peak, running)
            await asyncio.sleep(0.001)

    w = asyncio.create_task(watch())
    try:
        await _wait_done(pool, ids, 30)
        db_peak = await pool.fetchval("SELECT count(*) FROM jobs WHERE status = 'running'")
    finally:
        w.cancel()
        ex.stop()
        await task
    assert 1 <= peak <= 3 and db_peak == 0


async def test_a_burst_of_coalesced_notifies_wakes_the_executor(pool: asyncpg.Pool, db_url: str,
                                                               probe: _Probe) -> None:
    # The poll is 60 s: only notifications can wake the executor within the test's time.
    ex = Executor(_settings(db_url, 4), ["r1"], client_factory=lambda r: _NoClient())  # type: ignore[arg-type,return-value]
    task = asyncio.create_task(ex.run())
    try:
        await wait_until(lambda: ex.listen_healthy, 20, 'ex.listen_healthy', interval_s=0.02)
        assert ex.listen_healthy
        await asyncio.sleep(0.2)  # the catch-up claim after LISTEN has run on an empty table
        notifier = JobNotifier(pool)

        async def producer() -> str:
            jid = (await store.job_insert(pool, NewJob(kind=_Probe.KIND, region="r1"), notify=False)).id
            notifier.notify("r1")
            return jid

        ids = list(await asyncio.gather(*(producer() for _ in range(50))))
        await notifier.flush()
        assert 1 <= notifier.sent < 50  # coalesced
        await _wait_done(pool, ids, 10)
        # a second burst, after the executor went idle again, wakes it again
        ids2 = list(await asyncio.gather(*(producer() for _ in range(20))))
        await notifier.flush()
        await _wait_done(pool, ids2, 10)
    finally:
        ex.stop()
        await task


async def test_notifier_merges_requests_made_while_one_is_in_flight(pool: asyncpg.Pool, db_url: str) -> None:
    got: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(db_url)
    try:
        await listener.add_listener("z9_jobs", lambda _c, _pid, _ch, payload: got.put_nowait(payload))
        notifier = JobNotifier(pool)
        for region in ["r1", "r2", "r1", "r1", "r2"]:
            notifier.notify(region)
        await notifier.flush()
        await wait_until(lambda: got.qsize() >= 2, 20, "both regions' notifications")
        payloads = []
        while not got.empty():
            payloads.append(got.get_nowait())
        assert sorted(set(payloads)) == ["r1", "r2"] and notifier.sent == 1
    finally:
        await listener.close()


class _RecordsNothing:
    """A kind whose record writes nothing: its finishes take the one-statement path."""

    RECORDS_NOTHING = True

    async def record(self, conn: Any, ctx: Any, observed: Any) -> None:
        raise AssertionError("never called on the one-statement path")


async def test_finish_and_next_claim_in_one_statement_stay_fenced(pool: asyncpg.Pool) -> None:
    """Issue 14 (b): jobs whose kinds record nothing finish, and the next jobs are claimed, in one
    statement — fenced row by row (the stale row is reported to its own job and one slot fewer
    is claimed) and in per-resource order (the next job of a finished job's resource is claimed
    in the same statement)."""
    ids = [await _enqueue(pool, f"srv_{i}") for i in range(3)]
    waiting = await _enqueue(pool, "srv_0")  # behind ids[0]: blocked until it ends
    claimed = {j.id: j for j in await store.job_claim(pool, ["r1"], 3, "w-old", TTL)}
    assert set(claimed) == set(ids)
    stale = ids[1]
    await _steal(pool, stale, "w-new")
    later = [await _enqueue(pool, None) for _ in range(5)]

    reservations: list[int] = []
    got: list[Any] = []

    def claim_one(freed: int) -> tuple[int, str | None, str, float, int | None]:
        reservations.append(freed)
        return freed, "r1", "w-old", TTL, None

    def on_claimed(reserved: int, jobs: list[Any]) -> None:
        got.extend(jobs)

    batcher = FinishBatcher(pool, claim_one=claim_one, on_claimed=on_claimed)
    results = await asyncio.gather(*(batcher.succeed(_ctx(claimed[i], "w-old"), _RecordsNothing(), None) for i in ids),
                                   return_exceptions=True)
    assert batcher.flushes == 1 and batcher.one_statement_flushes == 1
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], LeaseLost) and stale in str(results[1])
    assert await _status(pool, ids[0]) == ("succeeded", None, 1)
    assert await _status(pool, stale) == ("running", "w-new", 2)  # the new owner's run is untouched
    assert await pool.fetchval("SELECT steps FROM jobs WHERE id = $1", ids[2]) == [{"name": "s"}]
    # 3 slots reserved, one lease lost: 2 claimed, oldest first — the waiter of srv_0 among them
    assert reservations == [3]
    assert [j.id for j in got] == [waiting, later[0]]
    assert all(j.status == "running" and j.lease_owner == "w-old" and j.attempt == 1 for j in got)


def test_the_one_statement_claim_says_what_job_claim_says() -> None:
    """jobs_finish_and_claim (migration 0022) carries a copy of job_claim: the two must agree."""
    import re
    from pathlib import Path

    from z9.common.sql import q

    def norm(text: str) -> str:
        return re.sub(r"\s+", " ", text).strip()

    mig = (Path(__file__).resolve().parents[3] / "db" / "z9" / "db" / "migrations" / "0022_fair_claim.sql").read_text()
    body = mig[mig.index("CREATE FUNCTION jobs_finish_and_claim"):]
    copy = body[body.index("WITH RECURSIVE tenants"):body.index("SELECT t.got FROM taken t")]
    claim = q("job_claim")
    claim = claim[claim.index("WITH RECURSIVE tenants"):claim.index("SELECT (t.got).*")]
    for placeholder, var in (("{region}", "claim_region"), ("{limit}", "claim_limit"), ("{owner}", "claim_owner"),
                             ("{lease_ttl_s}", "lease_ttl_s"), ("{tenant_cap}", "tenant_cap")):
        claim = claim.replace(placeholder, var)
    # the function runs only without a test clock: {now} is NULL there, and coalesce(NULL, now()) is now()
    claim = (claim.replace("coalesce({now}::timestamptz, now())", "now()").replace("{now}::timestamptz, ", "")
             .replace("{now}::timestamptz", "NULL"))
    assert "{" not in claim
    assert norm(copy) == norm(claim)


def _failed_connects(caplog: pytest.LogCaptureFixture) -> int:
    """The executor's failed connects so far (each then waits to retry)."""
    return sum(1 for r in caplog.records if r.name == "z9.executor" and "database unreachable" in r.getMessage())


async def test_an_executor_stopped_before_it_reached_the_database_exits_cleanly(
        caplog: pytest.LogCaptureFixture) -> None:
    """n14user: SIGTERM while the database is unreachable ended the executor with a traceback
    (the connect retry re-raised once stopping). Now ``run()`` returns at once, without error."""
    from tests.support import free_port

    ex = Executor(_settings(f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere", 2), ["r1"],
                  client_factory=lambda r: _NoClient())  # type: ignore[arg-type,return-value]
    task = asyncio.create_task(ex.run())
    await wait_until(lambda: _failed_connects(caplog), 20, "a failed connect, waiting to retry")
    assert not task.done()
    ex.stop()
    await asyncio.wait_for(task, 3)  # returns (no exception), well before the next retry's delay
