"""Fair share by tenant in the claim (migration 0022) against real PostgreSQL: tenants take turns
(round-robin from the tenant the region served last), each tenant's jobs oldest first, so one
tenant's backlog delays another tenant's pending job by one claim at most, on both claim paths
(the claim statement and the one-statement finish and claim); the per-tenant cap on running jobs
(``Z9_TENANT_MAX_RUNNING_JOBS``, a tenant's own ``running_jobs`` limit) holds under racing claims
and executors, and expired leases stop counting toward it."""
from __future__ import annotations

import asyncio
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY as PROM
from z9.common import metrics, store
from z9.common.clock import TestClock
from z9.common.store import Lease, NewJob
from z9.executor.worker import Executor
from z9.scheduler import Scheduler

from tests.integration.engine import test_region_cap as region_cap
from tests.support import REGION, make_tenant, wait_until

TTL = 30.0
sleeper = region_cap.sleeper  # the fixture: a job kind that holds its slot a while


async def _tenant(pool: asyncpg.Pool, name: str) -> str:
    return (await make_tenant(pool, name))[0]


async def _enqueue(pool: asyncpg.Pool, tenant: str | None, n: int = 1, *, kind: str = "Noop",
                   resource: str | None = None, region: str = "r1") -> list[str]:
    return [(await store.job_insert(pool, NewJob(kind=kind, region=region, tenant_id=tenant,
                                                 resource_type="server" if resource else None,
                                                 resource_id=resource))).id for _ in range(n)]


async def _finish(pool: asyncpg.Pool, job: Any) -> None:
    await store.job_succeed(pool, Lease(job.id, job.lease_owner, job.attempt), [])


async def test_a_backlog_delays_another_tenants_job_by_one_claim_at_most(pool: asyncpg.Pool) -> None:
    """Tenant B queued 60 jobs; 4 slots, all busy with B's. Tenant A submits one job at a time:
    each is taken by the very next claim (the next freed slot), never after B's backlog.
    (Failed before the fair claim: the claim took B's older jobs first, A's job after all 60.)"""
    a, b = await _tenant(pool, "fair-a"), await _tenant(pool, "fair-b")
    await _enqueue(pool, b, 60)
    running = await store.job_claim(pool, ["r1"], 4, "w", TTL)  # full capacity
    assert len(running) == 4
    for _ in range(5):
        (mine,) = await _enqueue(pool, a)
        await _finish(pool, running.pop(0))  # a slot frees
        got = await store.job_claim(pool, ["r1"], 1, "w", TTL)
        assert [j.id for j in got] == [mine]
        running.append(got[0])
        # B's backlog goes on meanwhile: the slot A's job frees is B's again
        await _finish(pool, running.pop())
        (nxt,) = await store.job_claim(pool, ["r1"], 1, "w", TTL)
        assert nxt.tenant_id == b
        running.append(nxt)


async def test_the_one_statement_finish_and_claim_is_fair_at_concurrency_1(pool: asyncpg.Pool) -> None:
    """At concurrency 1 the executor finishes a job and claims the next in one statement
    (jobs_finish_and_claim): the tenant it just served goes after the one waiting."""
    a, b = await _tenant(pool, "one-a"), await _tenant(pool, "one-b")
    await _enqueue(pool, b, 20)
    (job,) = await store.job_claim(pool, ["r1"], 1, "w", TTL)
    order = []
    (mine,) = await _enqueue(pool, a)
    for _ in range(3):
        lost, (job,) = await store.job_finish_and_claim(pool, [(Lease(job.id, "w", job.attempt), [])],
                                                        "r1", 1, "w", TTL)
        assert lost == []
        order.append(job.id)
    assert order[0] == mine  # not after B's 19 other jobs
    assert (await store.job_get(pool, order[1])).tenant_id == b  # type: ignore[union-attr]


async def test_tenants_take_turns_each_oldest_first(pool: asyncpg.Pool) -> None:
    """Three tenants and z9's own jobs (no tenant, the tenant ''), queued one tenant after the
    other: claims of one take them in turn, each tenant's oldest first; a claim of several takes
    every tenant's first before any tenant's second."""
    t = [await _tenant(pool, f"turn-{i}") for i in range(3)]
    queued = {x: await _enqueue(pool, x, 3) for x in (*t, None)}
    keys = sorted(queued, key=lambda x: x or "")  # the turn order: tenant ids, '' first
    got = []
    for _ in range(8):
        got += await store.job_claim(pool, ["r1"], 1, "w", TTL)
    assert [j.tenant_id for j in got] == keys + keys
    for x in queued:
        assert [j.id for j in got if j.tenant_id == x] == queued[x][:2]  # oldest first
    rest = await store.job_claim(pool, ["r1"], 3, "w", TTL)
    in_seq = [j for x in queued for j in queued[x]]  # submission order
    assert [j.id for j in rest] == sorted((queued[x][2] for x in keys[:3]), key=in_seq.index)  # answered in seq order
    assert [j.id for j in await store.job_claim(pool, ["r1"], 5, "w", TTL)] == [queued[keys[3]][2]]


async def test_per_resource_order_holds_across_tenants_turns(pool: asyncpg.Pool) -> None:
    """A tenant's turn never takes a job whose resource has an earlier live job: the turn passes
    to its next claimable job (or the next tenant)."""
    a, b = await _tenant(pool, "res-a"), await _tenant(pool, "res-b")
    a1, a2 = await _enqueue(pool, a, 2, resource="srv_a")
    (a3,) = await _enqueue(pool, a, resource="srv_a2")
    (b1,) = await _enqueue(pool, b, resource="srv_b")
    got = [j.id for j in await store.job_claim(pool, ["r1"], 10, "w", TTL)]
    assert sorted(got) == sorted([a1, a3, b1])  # a2 waits for a1
    assert await store.job_claim(pool, ["r1"], 10, "w", TTL) == []
    await _finish(pool, await store.job_get(pool, a1))
    assert [j.id for j in await store.job_claim(pool, ["r1"], 10, "w", TTL)] == [a2]


async def _running_by_tenant(pool: asyncpg.Pool) -> dict[str | None, int]:
    rows = await pool.fetch("SELECT tenant_id, count(*) AS n FROM jobs WHERE status = 'running' GROUP BY tenant_id")
    return {r["tenant_id"]: r["n"] for r in rows}


async def test_racing_claims_keep_every_tenant_under_its_cap(pool: asyncpg.Pool, db_url: str) -> None:
    """Twelve claims at once on their own connections (half inside a transaction held open after
    its claim, like a finish batch's), each asking for 10, with a default cap of 2 and tenant B's
    own cap of 4: A runs 2, B 4, z9's own jobs (never capped) as many as asked."""
    a, b = await _tenant(pool, "cap-a"), await _tenant(pool, "cap-b")
    await store.tenant_quota_set(pool, b, {"running_jobs": 4})
    await _enqueue(pool, a, 20)
    await _enqueue(pool, b, 20)
    await _enqueue(pool, None, 5)
    conns = [await asyncpg.connect(db_url) for _ in range(12)]
    answered = 0
    all_answered = asyncio.Event()

    def count() -> None:
        nonlocal answered
        answered += 1
        if answered == len(conns):
            all_answered.set()
    try:
        async def claim(i: int) -> int:
            c = conns[i]
            if i % 2:
                async with c.transaction():
                    got = await store.job_claim(c, ["r1"], 10, f"w{i}", TTL, tenant_cap=2)
                    count()
                    await all_answered.wait()  # the tenants' locks are held to commit: past every claim
                return len(got)
            got = await store.job_claim(c, ["r1"], 10, f"w{i}", TTL, tenant_cap=2)
            count()
            return len(got)

        await asyncio.gather(*(claim(i) for i in range(12)))
        # whatever the race left (a claim that met a tenant's lock held skips that tenant): claim again
        for _ in range(3):
            await store.job_claim(pool, ["r1"], 10, "w", TTL, tenant_cap=2)
    finally:
        for c in conns:
            await c.close()
    assert await _running_by_tenant(pool) == {a: 2, b: 4, None: 5}
    # a finish frees one slot of that tenant, for exactly one more of its jobs
    job = await pool.fetchrow("SELECT id, lease_owner, attempt FROM jobs WHERE status = 'running' AND tenant_id = $1 "
                              "LIMIT 1", a)
    await store.job_succeed(pool, Lease(job["id"], job["lease_owner"], job["attempt"]), [])
    got = await store.job_claim(pool, ["r1"], 10, "w", TTL, tenant_cap=2)
    assert [j.tenant_id for j in got] == [a]
    # the tenant's own limit removed: the default applies to B too
    await store.tenant_quota_set(pool, b, {"running_jobs": None})
    assert await store.job_claim(pool, ["r1"], 10, "w", TTL, tenant_cap=2) == []
    assert await store.job_claim(pool, ["r1"], 10, "w", TTL, tenant_cap=5) != []


async def test_expired_leases_stop_counting_toward_the_tenant_cap(pool: asyncpg.Pool) -> None:
    a = await _tenant(pool, "exp-a")
    await _enqueue(pool, a, 5)
    t0 = datetime.now(UTC)
    assert len(await store.job_claim(pool, ["r1"], 5, "dead", 1.0, now=t0, tenant_cap=2)) == 2
    assert await store.job_claim(pool, ["r1"], 5, "w", TTL, now=t0 + timedelta(seconds=0.5), tenant_cap=2) == []
    later = await store.job_claim(pool, ["r1"], 5, "w", TTL, now=t0 + timedelta(seconds=2), tenant_cap=2)
    assert len(later) == 2


async def test_executors_together_keep_each_tenant_under_its_cap(pool: asyncpg.Pool, db_url: str,
                                                                 sleeper: region_cap._Sleeper) -> None:
    """3 executors × concurrency 4 (12 slots), a default cap of 2 per tenant and tenant B's own 3:
    sampled from the job table, A never runs more than 2 at once and B never more than 3, both
    reach their caps, every job succeeds."""
    a, b = await _tenant(pool, "ex-a"), await _tenant(pool, "ex-b")
    await store.tenant_quota_set(pool, b, {"running_jobs": 3})
    ids = await _enqueue(pool, a, 12, kind=region_cap._Sleeper.KIND) + await _enqueue(pool, b, 12, kind=region_cap._Sleeper.KIND)
    executors = [Executor(region_cap._settings(db_url, None, 4, tenant_max_running_jobs=2), ["r1"], owner=f"ex-{i}",
                          client_factory=lambda r: region_cap._NoClient()) for i in range(3)]  # type: ignore[arg-type,return-value]
    tasks = [asyncio.create_task(ex.run()) for ex in executors]
    peak: dict[str | None, int] = {}

    async def all_succeeded() -> bool:
        for k, n in (await _running_by_tenant(pool)).items():
            peak[k] = max(peak.get(k, 0), n)
        return await pool.fetchval("SELECT count(*) FROM jobs WHERE id = ANY($1) AND status = 'succeeded'",
                                   ids) == len(ids)
    try:
        await wait_until(all_succeeded, 90, "all jobs to succeed", interval_s=0.005)
    finally:
        for ex in executors:
            ex.stop()
        await asyncio.gather(*tasks)
    assert sleeper.done == set(ids)
    assert peak == {a: 2, b: 3}, peak


# ---------------------------------------------------------------------------------- who is waiting

@pytest.mark.settings(tenant_metrics_top_n=2, tenant_max_running_jobs=3)
async def test_the_operator_and_the_metrics_see_who_is_waiting(api: Any, settings: Any, clock: TestClock) -> None:
    """Four tenants wait in a region (one with its own cap, one running a job) and z9's own job:
    GET /v1/operator/regions lists them most pending first with their caps and waits; the metrics
    name the top 2 tenants and sum the rest as `_other` — and drop a tenant that left the top."""
    pool = api.pool
    t = [await _tenant(pool, f"wait-{i}") for i in range(4)]
    await store.tenant_quota_set(pool, t[1], {"running_jobs": 7})
    for i, n in enumerate((5, 4, 2, 1)):
        await _enqueue(pool, t[i], n, region=REGION)
    await _enqueue(pool, None, 1, region=REGION)
    (running,) = await store.job_claim(pool, [REGION], 1, "w", TTL, tenant_cap=3)  # z9's own ('' goes first)
    assert running.tenant_id is None
    clock.step(2.0)
    op = "z9t_" + secrets.token_urlsafe(24)
    await store.api_token_insert(pool, api.tenant_id, op, "ops", scopes=["read", "operator"])
    status, out = await api.call("GET", "/operator/regions", token=op)
    assert status == 200, out
    (region,) = [r for r in out["regions"] if r["name"] == REGION]
    rows = {r["tenant"]: r for r in region["tenants"]}
    assert [r["tenant"] for r in region["tenants"]][:2] == [t[0], t[1]]  # most pending first
    assert rows[t[1]]["running_cap"] == 7 and rows[t[0]]["running_cap"] == 3  # its own; the installation's
    assert rows[None]["running"] == 1 and rows[None]["running_cap"] is None and rows[None]["pending"] == 0
    assert all(r["wait_s"] >= 0 and r["waiting_since"] for r in rows.values() if r["pending"])  # the API: now()
    assert region["tenants_more"] == 0

    scheduler = Scheduler(settings, clock=clock)
    scheduler.pool = pool
    await scheduler.refresh_job_metrics()
    series = _tenant_series()
    assert set(series) == {t[0], t[1], metrics.TENANT_OTHER}, series
    pending_total = await pool.fetchval("SELECT count(*) FROM jobs WHERE status = 'pending' AND region = $1", REGION)
    assert sum(n for n, _ in series.values()) == pending_total  # nothing lost in the bucket
    assert all(age >= 2.0 for _, age in series.values())  # the scheduler: the clock's time
    # t[0]'s jobs all claimed: it leaves the metrics (no stale series), t[2] enters the top
    await pool.execute("UPDATE jobs SET status = 'failed', error = '{\"class\": \"cancelled\", \"message\": \"x\"}', "
                       "finished_at = now() WHERE tenant_id = $1 AND status = 'pending'", t[0])
    await scheduler.refresh_job_metrics()
    assert set(_tenant_series()) == {t[1], t[2], metrics.TENANT_OTHER}


def _tenant_series(region: str = REGION) -> dict[str, tuple[float, float]]:
    out: dict[str, list[float]] = {}
    for fam in PROM.collect():
        for s in fam.samples:
            if s.labels.get("region") != region:
                continue
            if s.name == "z9_tenant_jobs_pending":
                out.setdefault(s.labels["tenant"], [0.0, 0.0])[0] = s.value
            elif s.name == "z9_tenant_oldest_pending_age_seconds":
                out.setdefault(s.labels["tenant"], [0.0, 0.0])[1] = s.value
    return {k: (v[0], v[1]) for k, v in out.items()}


async def test_the_claim_probes_what_it_takes_not_every_pending_job(pool: asyncpg.Pool) -> None:
    """With 3,000 pending jobs of one tenant and fresh statistics, the claim of one job reads a few
    dozen buffers: the tenants by a skip scan, the heads by ordered walks, the candidates by
    primary key. (Failed before the candidates were probed by primary key: a hash join over a
    sequential scan of every pending job, 118 buffers to choose one job.)"""
    a = await _tenant(pool, "plan-a")
    await pool.execute("INSERT INTO jobs (id, kind, region, tenant_id) SELECT 'job_' || lpad(to_hex(g), 26, '0'), "
                       "'Noop', 'r1', $1 FROM generate_series(1, 3000) g", a)
    await pool.execute("ANALYZE jobs")
    async with pool.acquire() as conn:
        for _ in range(2):  # the second: the session's first call of jobs_tenant_room reads the catalog
            tr = conn.transaction()
            await tr.start()  # EXPLAIN ANALYZE runs the claim: rolled back below
            plan = await conn.fetchval("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + store.job_claim_sql("r1", 4, "w", TTL))
            await tr.rollback()

    def walk(node: dict[str, Any]) -> list[dict[str, Any]]:
        return [node] + [n for c in node.get("Plans", []) for n in walk(c)]
    nodes = walk(plan[0]["Plan"])
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "jobs"
                and n["Actual Loops"]], plan  # (the extra-keys probe, for jobs with a resource, never runs)
    assert plan[0]["Plan"]["Actual Rows"] == 4
    # choosing (tenants, heads, candidates) reads a few dozen buffers at most; the update of what
    # was chosen (every index of the table) is what it always was
    chosen = [n for n in nodes if n.get("Subplan Name") == "CTE candidates"]  # (heads and tenants inside)
    assert len(chosen) == 1
    buffers = sum(n["Shared Hit Blocks"] + n["Shared Read Blocks"] for n in chosen)
    assert buffers < 60, buffers
