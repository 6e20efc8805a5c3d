"""The job engine under fire (issue 4, correctness tests 1-9): real PostgreSQL, real ``z9``
service processes (executor, scheduler, reaper, api) signalled and killed by pid, and the
Proxmox VE simulator.

Every test records each job's state changes with a trigger in its own database
(``tests.support.install_job_log``), so "never two at once" is checked on the database's own
clock, and "applied once" on the simulator's task and request counters.

The crash storm (4) runs reduced in CI (40 creates, 20 kills); the full form of the issue is
``Z9_CRASH_STORM_CREATES=200 Z9_CRASH_STORM_KILLS=20 pytest tests/acceptance/test_engine_fire.py -k crash_storm``.
"""
from __future__ import annotations

import asyncio
import os
import random
import re
import signal
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from z9.common import store
from z9.common.settings import Settings
from z9.common.tags import identity_tag, normalize_tags

from tests.support import (REGION, SERVICE_SETTINGS, Services, SimAdmin, Stack, free_port, install_job_log, job_log, make_tenant,
                           overlapping, runs, service_env, wait_until, with_database)
from z9.resources.server import store as server_store

# Fast engine settings for the service processes (seconds): the ones every kill test uses.
FAST = SERVICE_SETTINGS  # (tests/support.py)


async def _row(pool: asyncpg.Pool, job_id: str) -> dict[str, Any]:
    return dict(await pool.fetchrow("SELECT * FROM jobs WHERE id = $1", job_id))


async def _tasks(sim: SimAdmin, kind: str | None = None) -> Any:
    started = (await sim.counters())["tasks_started"]
    return started if kind is None else started.get(kind, 0)


async def _mutations_by_path(sim: SimAdmin) -> dict[tuple[str, str], int]:
    """Successful non-GET requests the simulator answered, by (method, path template) — but
    ``agent/exec``: verify's ``cloud-init status`` in the guest is a POST that only reads."""
    out: dict[tuple[str, str], int] = {}
    for r in (await sim.counters())["requests"]:
        if r["method"] != "GET" and r["status"] == 200 and not r["path"].endswith("/agent/exec"):
            out[(r["method"], r["path"])] = out.get((r["method"], r["path"]), 0) + r["count"]
    return out


# 1
async def test_fencing_a_stopped_executor_is_fenced_out_after_reclaim(api: Stack, sim: SimAdmin,
                                                                      services: Services) -> None:
    await install_job_log(api.pool)
    await sim.configure(task_seconds={"qmclone": 4.0})
    services.start("scheduler")
    a = services.start("executor")
    owner_a = await services.executor_owner(a)
    server, job = await api.create_server("fence-1")
    await wait_until(lambda: _tasks(sim, "qmclone"), 20, "the clone task to start")
    row = await _row(api.pool, job["id"])
    assert row["lease_owner"] == owner_a and row["attempt"] == 1, row
    a.signal(signal.SIGSTOP)
    try:
        b = services.start("executor")
        owner_b = await services.executor_owner(b)

        async def taken_by_b() -> bool:
            r = await _row(api.pool, job["id"])
            return r["status"] == "running" and r["lease_owner"] == owner_b

        await wait_until(taken_by_b, 30, "the scheduler to reclaim the job and executor B to claim it")
    finally:
        a.signal(signal.SIGCONT)
    # A resumes while B runs the job: its next fenced write is rejected and it drops the job.
    await a.wait_log(rf"lease of {re.escape(owner_a)} \(attempt 1\) (is lost|may be gone)", 20)
    done = await api.wait_job(job["id"], timeout_s=40)
    assert done["status"] == "succeeded" and done["attempt"] == 2, done
    assert a.alive() and b.alive()

    log = await job_log(api.pool, job["id"])
    rs = runs(log)
    assert [(r.owner, r.attempt) for r in rs] == [(owner_a, 1), (owner_b, 2)], log
    assert not overlapping(rs), rs
    reclaim = next(i for i, e in enumerate(log) if e["status"] == "retry")
    assert f"lease of {owner_a}" in log[reclaim]["error"]["message"], log[reclaim]
    assert all(e["lease_owner"] != owner_a for e in log[reclaim:]), log  # A wrote nothing after
    # The world: one clone, one VM, and every mutation applied once (never by both executors).
    assert await _tasks(sim, "qmclone") == 1
    vms = await sim.vms_tagged(identity_tag(server["id"]))
    assert len(vms) == 1 and vms[0]["running"], vms
    assert all(n == 1 for n in (await _tasks(sim)).values()), await _tasks(sim)
    assert all(n == 1 for n in (await _mutations_by_path(sim)).values()), await _mutations_by_path(sim)


def _expired_at(log: list[dict[str, Any]], owner: str) -> float:
    """The epoch time the lease of ``owner`` expired, as the scheduler's reclaim recorded it."""
    for e in log:
        m = re.search(rf"lease of {re.escape(owner)} expired at (\S+)", ((e["error"] or {}).get("message") or ""))
        if m:
            return datetime.fromisoformat(m.group(1)).timestamp()
    raise AssertionError(f"no reclaim of {owner}'s lease in {log}")


async def test_a_stopped_executor_sends_no_proxmox_call_after_its_lease(api: Stack, sim: SimAdmin,
                                                                       services: Services) -> None:
    """Executor A is SIGSTOPped mid-apply (waiting on its clone task, polling it) until its lease
    has expired, the scheduler reclaimed the job and executor B claimed it; then A wakes. The
    simulator's request log (each request with the fencing token z9 sends, ``X-Z9-Lease``) shows
    no request of A's attempt that came in after the lease's expiry: A's own local deadline
    refused them before its heartbeat or a fenced write could notice the loss."""
    await install_job_log(api.pool)
    await sim.configure(task_seconds={"qmclone": 4.0})
    services.start("scheduler")
    a = services.start("executor", task_poll_s=0.05)
    owner_a = await services.executor_owner(a)
    server, job = await api.create_server("deadline-1")
    await wait_until(lambda: _tasks(sim, "qmclone"), 20, "the clone task to start")
    # A is polling the clone's task: its calls carry its fencing token
    await wait_until(lambda: sim.requests(lease=f"/1/{owner_a}"), 20, "A's first calls")
    a.signal(signal.SIGSTOP)
    try:
        b = services.start("executor")
        owner_b = await services.executor_owner(b)

        async def taken_by_b() -> bool:
            r = await _row(api.pool, job["id"])
            return r["status"] == "running" and r["lease_owner"] == owner_b

        await wait_until(taken_by_b, 30, "the scheduler to reclaim the job and executor B to claim it")
    finally:
        a.signal(signal.SIGCONT)
    await a.wait_log(rf"lease of {re.escape(owner_a)} \(attempt 1\) (is lost|may be gone)", 20)
    done = await api.wait_job(job["id"], timeout_s=40)
    assert done["status"] == "succeeded" and done["attempt"] == 2, done
    expired = _expired_at(await job_log(api.pool, job["id"]), owner_a)
    calls_a = await sim.requests(lease=f"{job['id']}/1/{owner_a}")
    assert calls_a, "A sent its calls with its fencing token"
    late = [c for c in calls_a if c["at"] >= expired]
    assert late == [], f"{len(late)} call(s) of A after its lease expired at {expired}: {late}"
    assert all(c["lease"].startswith(f"{job['id']}/2/{owner_b}")
               for c in await sim.requests(lease=owner_b) if job["id"] in c["lease"])
    assert len(await sim.vms_tagged(identity_tag(server["id"]))) == 1


# 2
async def test_a_long_job_that_reports_progress_is_never_stolen(api: Stack, sim: SimAdmin,
                                                                services: Services) -> None:
    ttl = 1.5
    await install_job_log(api.pool)
    await sim.configure(task_seconds={"qmclone": 10 * ttl})
    sched = services.start("scheduler")
    ex = services.start("executor", lease_ttl_s=ttl, heartbeat_s=0.2)
    owner = await services.executor_owner(ex)
    server, job = await api.create_server("long-1")
    await wait_until(lambda: _tasks(sim, "qmclone"), 20, "the clone task to start")
    services.start("executor", lease_ttl_s=ttl, heartbeat_s=0.2)  # a second one, ready to steal
    leases: set = set()
    while (row := await _row(api.pool, job["id"]))["status"] not in ("succeeded", "failed"):
        assert row["status"] in ("pending", "running"), row  # never reclaimed into retry
        if row["status"] == "running":
            assert row["lease_owner"] == owner and row["attempt"] == 1, row
            leases.add(row["lease_expires_at"])
        await asyncio.sleep(0.1)
    done = await api.wait_job(job["id"])
    assert done["status"] == "succeeded" and done["attempt"] == 1, done
    assert (row["finished_at"] - row["started_at"]).total_seconds() >= 10 * ttl
    assert len(leases) >= 10, leases  # renewed all along, by heartbeats and progress writes
    rs = runs(await job_log(api.pool, job["id"]))
    assert [(r.owner, r.attempt, r.ended_as) for r in rs] == [(owner, 1, "succeeded")], rs
    assert "lease expired" not in sched.log()
    assert await _tasks(sim, "qmclone") == 1
    assert len(await sim.vms_tagged(identity_tag(server["id"]))) == 1


# 3
HOLD_FINISH_DDL = """
CREATE TABLE test_finish_hold (job_id text PRIMARY KEY, seconds float8 NOT NULL);
CREATE FUNCTION test_finish_hold() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE s float8;
BEGIN
    SELECT seconds INTO s FROM test_finish_hold WHERE job_id = NEW.id;
    IF s IS NOT NULL THEN
        PERFORM pg_sleep(s);  -- holding the row lock of the finishing UPDATE, not committed
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER test_finish_hold BEFORE UPDATE ON jobs FOR EACH ROW
    WHEN (OLD.status = 'running' AND NEW.status = 'succeeded') EXECUTE FUNCTION test_finish_hold();
"""


async def test_reclaim_never_overwrites_a_job_that_is_finishing(api: Stack, sim: SimAdmin,
                                                                services: Services) -> None:
    """The executor's finish is held open inside its transaction (a trigger sleeps after it
    took the row) until its lease has expired on every other connection's view; meanwhile the
    scheduler keeps reclaiming (it takes a control job with a dead lease), yet the finishing job
    is not touched and ends ``succeeded`` at attempt 1."""
    pool = api.pool
    await install_job_log(pool)
    await pool.execute(HOLD_FINISH_DDL)
    sched = services.start("scheduler")
    ex = services.start("executor")
    owner = await services.executor_owner(ex)
    server, job = await api.create_server("race-1")
    await pool.execute("INSERT INTO test_finish_hold VALUES ($1, 8)", job["id"])
    db = await pool.fetchval("SELECT current_database()")

    await wait_until(lambda: pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event = 'PgSleep'", db),
        20, "the executor's finish to be held open")
    # Every other view now sees a running job whose lease has run out.
    await wait_until(lambda: pool.fetchval(
        "SELECT status = 'running' AND lease_expires_at < now() FROM jobs WHERE id = $1", job["id"]),
        10, "the finishing job's lease to expire")
    async with pool.acquire() as conn, conn.transaction():
        control = await store.job_insert(conn, store.NewJob(kind="ServerCreate", region="elsewhere"), notify=False)
        await conn.execute("UPDATE jobs SET status = 'running', attempt = 1, lease_owner = 'ghost:1:dead', "
                           "lease_expires_at = now() - interval '1 second', started_at = now() WHERE id = $1",
                           control.id)
    await wait_until(lambda: pool.fetchval("SELECT status <> 'running' FROM jobs WHERE id = $1", control.id),
                     10, "the scheduler to reclaim the control job")
    assert await pool.fetchval(  # the scheduler passed while the finish was still in flight
        "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event = 'PgSleep'", db) == 1
    row = await _row(pool, job["id"])
    assert row["status"] == "running" and row["lease_owner"] == owner, row

    done = await api.wait_job(job["id"], timeout_s=30)
    assert done["status"] == "succeeded" and done["attempt"] == 1 and done["error"] is None, done
    log = await job_log(pool, job["id"])
    assert [e["status"] for e in log] == ["pending", "running", "succeeded"], log
    assert job["id"] not in sched.log() and control.id in sched.log()
    assert (await api.server(server["id"]))["status"] == "running"


# 4
def _attempts_accounted(log: list[dict[str, Any]]) -> tuple[int, int]:
    """For one job's log: assert that every reclaim kept the attempt it ended (counted once,
    never refunded) and that the final attempt is the number of claims minus the refunded ones
    (snoozes, hand-overs). Returns (claims, reclaims)."""
    rs = runs(log)
    reclaims = refunds = 0
    for e_prev, e in zip(log, log[1:]):
        if e_prev["status"] == "running" and e["status"] in ("retry", "failed"):
            msg = (e["error"] or {}).get("message", "")
            if "lease of" in msg and "expired" in msg:
                reclaims += 1
                assert e["attempt"] == e_prev["attempt"], (e_prev, e)
            elif e["attempt"] == e_prev["attempt"] - 1:
                refunds += 1
            else:
                assert e["attempt"] == e_prev["attempt"], (e_prev, e)
    for prev, r in zip(rs, rs[1:]):
        assert r.attempt in (prev.attempt, prev.attempt + 1), rs
    assert log[-1]["attempt"] == len(rs) - refunds, (log, rs)
    return len(rs), reclaims


# a job hit by every kill must still not run out
@pytest.mark.settings(max_attempts=int(os.environ.get("Z9_CRASH_STORM_KILLS", "20")) + 10)
async def test_crash_storm_every_job_succeeds_once(api: Stack, sim: SimAdmin, services: Services) -> None:
    n_creates = int(os.environ.get("Z9_CRASH_STORM_CREATES", "40"))
    n_kills = int(os.environ.get("Z9_CRASH_STORM_KILLS", "20"))
    rng = random.Random(os.environ.get("Z9_CRASH_STORM_SEED"))
    pool = api.pool
    await install_job_log(pool)
    await sim.configure(task_seconds={"qmclone": 2.0}, task_default_s=0.1)
    knobs = dict(lease_ttl_s=1.5, heartbeat_s=0.25)
    services.start("scheduler")
    slots = [services.start("executor", "--concurrency", "2", **knobs) for _ in range(2)]
    # Each slot's lease owner, read from its log once it serves. A restarted executor's Python
    # start (~1-3 s on a loaded machine) overlaps the other slot's turn instead of being waited
    # out in line: the storm alternates slots, so slot i is needed again only after the other
    # slot's kill (the kills, the jobs and what is asserted are the same).
    owners = [asyncio.create_task(services.executor_owner(p, 60)) for p in slots]
    made = await asyncio.gather(*(api.create_server(f"storm-{i}") for i in range(n_creates)))
    job_ids = [j["id"] for _, j in made]

    async def left_none() -> bool:
        return not await left()

    async def _any(*checks: Any) -> bool:
        return any([await c for c in checks])

    async def holds_a_job(owner: str) -> bool:
        return bool(await pool.fetchval("SELECT count(*) FROM jobs WHERE status = 'running' AND lease_owner = $1",
                                        owner))

    async def left() -> int:
        return await pool.fetchval("SELECT count(*) FROM jobs WHERE id = ANY($1) AND status NOT IN "
                                   "('succeeded', 'failed')", job_ids)

    kills = 0
    while kills < n_kills:
        i = kills % 2
        # Keep the storm fed: on a loaded machine an executor's restart takes seconds while the other
        # one works on, and the work ran out after 9 of 20 kills (the assertion below failed).
        if await left() < 4:
            more = await asyncio.gather(*(api.create_server(f"storm-{len(made) + k}") for k in range(8)))
            made.extend(more)
            job_ids.extend(j["id"] for _, j in more)
        owner = await owners[i]
        await wait_until(lambda: _any(holds_a_job(owner), left_none()), 30,
                         f"executor {owner} to hold a job (kill {kills + 1})")
        if not await left():  # the storm outlasted the work: every create finished before the last kill
            break
        await asyncio.sleep(rng.uniform(0.0, 0.6))
        await slots[i].kill()
        kills += 1
        slots[i] = services.start("executor", "--concurrency", "2", **knobs)
        owners[i] = asyncio.create_task(services.executor_owner(slots[i], 60))

    await asyncio.gather(*owners)  # the last restarted executors serve (and finish the work)

    async def all_done() -> bool:
        return await pool.fetchval("SELECT count(*) FROM jobs WHERE id = ANY($1) AND status IN ('succeeded', 'failed')",
                                   job_ids) == len(job_ids)

    await wait_until(all_done, max(120, 3 * len(made)), "every job to finish")
    statuses = {r["id"]: r["status"] for r in await pool.fetch("SELECT id, status FROM jobs WHERE id = ANY($1)", job_ids)}
    assert set(statuses.values()) == {"succeeded"}, {k: v for k, v in statuses.items() if v != "succeeded"}

    full = await job_log(pool)
    total_reclaims = 0
    for jid in job_ids:
        _, reclaims = _attempts_accounted([e for e in full if e["job_id"] == jid])
        total_reclaims += reclaims
    print(f"crash storm: {len(made)} creates, {kills} kills, {total_reclaims} reclaims, "
          f"{len(runs(full))} runs, attempts max {max(e['attempt'] for e in full)}")
    assert kills >= n_kills // 2, kills  # the storm was a storm (the work rarely outlasts fewer kills)
    assert total_reclaims >= kills // 2, total_reclaims  # the kills did take jobs away
    assert not overlapping(runs(full))
    # The world: exactly one VM per server, no orphan clone, one clone task per server.
    state = await sim.state()
    by_server: dict[str, int] = {}
    for vm in state["vms"]:
        for tag in normalize_tags(vm["config"].get("tags")):
            if tag.startswith("z9-id-"):
                by_server[tag] = by_server.get(tag, 0) + 1
    assert by_server == {identity_tag(s["id"]): 1 for s, _ in made}, by_server
    assert len([v for v in state["vms"] if not v["template"]]) == len(made) + 1  # ours and the agent
    assert state["counters"]["tasks_started"]["qmclone"] == len(made)


async def _calls_after_lease(sim: SimAdmin, log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every request the simulator received for a job's attempt after that attempt's lease had
    expired (the expiry the scheduler's reclaim recorded; the attempt's fencing token, X-Z9-Lease)."""
    late = []
    for e in log:
        m = re.search(r"lease of (\S+) expired at (\S+)", ((e["error"] or {}).get("message") or ""))
        if m is None or e["status"] not in ("retry", "failed"):  # the reclaim itself (later rows keep its error)
            continue
        token = f"{e['job_id']}/{e['attempt']}/{m.group(1)}"
        expired = datetime.fromisoformat(m.group(2)).timestamp()
        late += [dict(c, after_s=round(c["at"] - expired, 3))
                 for c in await sim.requests(lease=token) if c["lease"] == token and c["at"] >= expired]
    return late


@pytest.mark.settings(max_attempts=int(os.environ.get("Z9_STOP_STORM_STOPS", "8")) + 10)
async def test_stop_storm_sends_no_proxmox_call_after_a_lease(api: Stack, sim: SimAdmin, services: Services) -> None:
    """Executors SIGSTOPped while they hold jobs, woken once the scheduler has taken every one of
    those jobs back (their leases expired): the figures of the issue "Nothing lost, nothing done
    twice" — jobs, lost, run twice, Proxmox calls after a lease was lost, VMs per server — with the
    calls counted in the simulator's request log by each attempt's fencing token. Long form:
    ``Z9_STOP_STORM_CREATES=200 Z9_STOP_STORM_STOPS=20``."""
    n_creates = int(os.environ.get("Z9_STOP_STORM_CREATES", "16"))
    n_stops = int(os.environ.get("Z9_STOP_STORM_STOPS", "8"))
    pool = api.pool
    await install_job_log(pool)
    await sim.configure(task_seconds={"qmclone": 2.0}, task_default_s=0.1)
    knobs = dict(lease_ttl_s=1.5, heartbeat_s=0.25)
    services.start("scheduler")
    slots = [services.start("executor", "--concurrency", "2", **knobs) for _ in range(2)]
    owners = [await services.executor_owner(p, 60) for p in slots]
    made = list(await asyncio.gather(*(api.create_server(f"stop-{i}") for i in range(n_creates))))
    job_ids = [j["id"] for _, j in made]

    async def left() -> int:
        return await pool.fetchval("SELECT count(*) FROM jobs WHERE id = ANY($1) AND status NOT IN "
                                   "('succeeded', 'failed')", job_ids)

    async def held_by(owner: str) -> int:
        return await pool.fetchval("SELECT count(*) FROM jobs WHERE status = 'running' AND lease_owner = $1", owner)

    stops = 0
    while stops < n_stops:
        i = stops % 2
        if await left() < 4:  # keep the storm fed
            more = await asyncio.gather(*(api.create_server(f"stop-{len(made) + k}") for k in range(6)))
            made.extend(more)
            job_ids.extend(j["id"] for _, j in more)

        async def holds_or_done(owner: str = owners[i]) -> bool:
            return bool(await held_by(owner)) or not await left()

        await wait_until(holds_or_done, 30, f"executor {owners[i]} to hold a job (stop {stops + 1})")
        if not await left():
            break
        slots[i].signal(signal.SIGSTOP)
        try:
            async def taken_back(owner: str = owners[i]) -> bool:
                return not await held_by(owner)

            await wait_until(taken_back, 30, f"the jobs of the stopped {owners[i]} to be taken back")
        finally:
            slots[i].signal(signal.SIGCONT)
        stops += 1

    async def all_done() -> bool:
        return not await left()

    await wait_until(all_done, max(120, 3 * len(made)), "every job to finish")
    statuses = {r["id"]: r["status"] for r in await pool.fetch("SELECT id, status FROM jobs WHERE id = ANY($1)", job_ids)}
    full = await job_log(pool)
    reclaims = sum(1 for e in full if e["status"] in ("retry", "failed")
                   and "expired at" in ((e["error"] or {}).get("message") or ""))
    late = await _calls_after_lease(sim, full)
    state = await sim.state()
    by_server: dict[str, int] = {}
    for vm in state["vms"]:
        for tag in normalize_tags(vm["config"].get("tags")):
            if tag.startswith("z9-id-"):
                by_server[tag] = by_server.get(tag, 0) + 1
    lost = [k for k, v in statuses.items() if v != "succeeded"]
    twice = overlapping(runs(full))
    doubled = {t: n for t, n in by_server.items() if n != 1}
    missing = [s["id"] for s, _ in made if identity_tag(s["id"]) not in by_server]
    print(f"stop storm: {len(made)} jobs, {stops} stops, {reclaims} reclaims, lost {len(lost)}, run twice "
          f"{len(twice)}, Proxmox calls after a lost lease {len(late)}, servers with other than one VM "
          f"{len(doubled) + len(missing)}, clone tasks {state['counters']['tasks_started'].get('qmclone', 0)}")
    assert stops >= n_stops // 2, stops
    assert reclaims >= stops // 2, reclaims  # the stops did take jobs away
    assert lost == [], lost
    assert not twice, twice
    assert late == [], [(c["lease"].split("/", 1)[1], c["method"], c["path"], c["after_s"]) for c in late][:40]
    assert not doubled and not missing, (doubled, missing)
    assert len([v for v in state["vms"] if not v["template"]]) == len(made) + 1  # ours and the agent


# 5
class _Client:
    """The API over HTTP, retrying while the database is down (503) — as a client would."""

    def __init__(self, base: str, token: str):
        self.base, self.token = base, token
        self.statuses: list[int] = []

    async def call(self, method: str, path: str, *, retry_s: float = 0, **kw: Any) -> tuple[int, Any]:
        import aiohttp

        loop = asyncio.get_running_loop()
        deadline = loop.time() + retry_s
        while True:
            try:
                async with aiohttp.ClientSession() as http:
                    async with http.request(method, self.base + path, headers={"Authorization": f"Bearer {self.token}"},
                                            **kw) as r:
                        status, body = r.status, await r.json()
            except aiohttp.ClientConnectionError:
                status, body = 0, None
            self.statuses.append(status)
            if status not in (0, 503) or loop.time() > deadline:
                return status, body
            await asyncio.sleep(0.2)

    async def wait_up(self, timeout_s: float = 20) -> None:
        """Until the API answers ``GET /servers`` with 200 (a started ``z9 api`` process)."""
        async def up() -> bool:
            return (await self.call("GET", "/servers"))[0] == 200

        await wait_until(up, timeout_s, "the API to answer")

    async def create(self, name: str, retry_s: float = 30) -> tuple[dict, dict]:
        status, out = await self.call("POST", "/servers", retry_s=retry_s, json={
            "name": name, "region": REGION, "image": "debian-12", "cores": 1, "memory_mib": 1024, "disk_gib": 4})
        assert status == 202, (status, out)
        return out["server"], out["job"]


async def test_database_restart_every_service_reconnects(settings: Settings, sim: SimAdmin, tmp_path: Path) -> None:
    import shutil
    import tempfile

    from z9.common.db import connect
    from z9.common.embedded_pg import EmbeddedPostgres
    from z9.db import migrate

    parent = Path(tempfile.mkdtemp(prefix="z9-fire-pg-"))
    pg = EmbeddedPostgres(parent / "data", delete=False).start()
    svc: Services | None = None
    try:
        admin = await asyncpg.connect(pg.url("postgres"))
        await admin.execute("CREATE DATABASE z9_fire")
        await admin.close()
        url = with_database(pg.url("postgres"), "z9_fire")
        conn = await connect(url)
        await migrate(conn)
        await install_job_log(conn)
        tenant, token = await make_tenant(conn, "acme")
        await conn.close()

        await sim.configure(task_seconds={"qmclone": 1.5})
        port = free_port()
        # A slow poll of 60 s: after the restart only re-established LISTENs (and their catch-up
        # claims) can wake the executors quickly.
        svc = Services(service_env(settings.model_copy(update={"database_url": url}),
                                   **dict(FAST, poll_interval_s=60, deletion_buffer_s=1.0, api_port=port)), tmp_path)
        apip, sched, reaper = svc.start("api"), svc.start("scheduler"), svc.start("reaper")
        executors = [svc.start("executor") for _ in range(2)]
        for ex in executors:
            await svc.executor_owner(ex)
        client = _Client(f"http://127.0.0.1:{port}/v1", token)
        await client.wait_up()

        before = [await client.create(f"pre-{i}", retry_s=0) for i in range(6)]
        deleted = [s["id"] for s, _ in before[:2]]
        for sid in deleted:  # queued behind their creates (per-resource order)
            status, _ = await client.call("DELETE", f"/servers/{sid}")
            assert status == 202

        async def jobs_running() -> bool:
            c = await asyncpg.connect(url)
            try:
                return await c.fetchval("SELECT count(*) FROM jobs WHERE status = 'running'") >= 2
            finally:
                await c.close()

        await wait_until(jobs_running, 20, "jobs to be running")
        await asyncio.to_thread(pg.stop)  # fast shutdown: every connection is cut (the simulator keeps serving)
        down = asyncio.get_running_loop().time()
        status, _ = await client.call("POST", "/servers", json={"name": "during", "region": REGION,
                                                                "image": "debian-12", "cores": 1, "memory_mib": 1024,
                                                                "disk_gib": 4})
        assert status == 503, status  # refused while the database is away, nothing half-made
        await asyncio.sleep(max(0.0, 2.0 - (asyncio.get_running_loop().time() - down)))  # stay down 2 s
        pg = await asyncio.to_thread(EmbeddedPostgres(parent / "data", delete=False).start)
        assert with_database(pg.url("postgres"), "z9_fire") == url  # same socket: services reconnect as they are

        for ex in executors:  # each executor re-LISTENs (its catch-up claim follows at once)
            await wait_until(lambda: ex.log().count("LISTEN z9_jobs established") >= 2, 30,
                             f"{ex.name} to re-LISTEN")
        after = [await client.create(f"post-{i}") for i in range(4)]

        conn = await connect(url)
        try:
            async def settled() -> bool:
                n = await conn.fetchval("SELECT count(*) FROM jobs WHERE status NOT IN ('succeeded', 'failed')")
                gone = await conn.fetchval("SELECT count(*) FROM servers WHERE id = ANY($1) AND status = 'deleted'",
                                           deleted)
                return n == 0 and gone == len(deleted)

            await wait_until(settled, 90, "every job to finish and the deleted servers to be gone")
            jobs = await conn.fetch("SELECT id, kind, status, resource_id, created_at FROM jobs ORDER BY seq")
            assert {r["status"] for r in jobs} == {"succeeded"}, [dict(r) for r in jobs]
            kinds = sorted(r["kind"] for r in jobs)
            assert kinds == sorted(["ServerCreate"] * 10 + ["ServerStop"] * 2 + ["ServerDelete"] * 2), kinds
            log = await job_log(conn)
            assert not overlapping(runs(log)), "two jobs of one resource ran at once"
            # After the restart, NOTIFY reaches the new LISTEN connections: claimed within a
            # second or two, never after the 60 s poll.
            post_ids = {j["id"] for _, j in after}
            for r in runs(log):
                if r.job_id in post_ids and r.attempt == 1:
                    created = next(j["created_at"] for j in jobs if j["id"] == r.job_id)
                    assert (r.start - created).total_seconds() < 10, r
            live = [s["id"] for s, _ in before[2:]] + [s["id"] for s, _ in after]
            servers = {r["id"]: r["status"] for r in await conn.fetch("SELECT id, status FROM servers")}
        finally:
            await conn.close()
        assert all(servers[s] == "running" for s in live), servers
        for sid in live:
            assert len(await sim.vms_tagged(identity_tag(sid))) == 1, sid
        for sid in deleted:
            assert await sim.vms_tagged(identity_tag(sid)) == [], sid
        assert await _tasks(sim, "qmclone") == 10  # no create cloned twice
        # Every service saw the outage and came back by itself.
        assert 503 in client.statuses and apip.alive()
        for p in (sched, reaper):
            assert "database unreachable" in p.log(), p.log()[-2000:]
        for p in (apip, sched, reaper, *executors):
            assert p.alive(), p.name
    finally:
        if svc is not None:
            svc.close()
            print(svc.logs())
        pg.stop()
        shutil.rmtree(parent, ignore_errors=True)


# 6
async def _metric(port: int, name: str) -> float:
    """The value of the unlabelled sample ``name`` on the service's ``/metrics`` (Z9_METRICS_PORT)."""
    import aiohttp
    from prometheus_client.parser import text_string_to_metric_families

    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as r:
        assert r.status == 200
        text = await r.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and not sample.labels:
                return sample.value
    raise AssertionError(f"no sample {name} on :{port}/metrics")


async def _insert_create_quietly(api: Stack, name: str, due_in_s: float) -> str:
    """A ServerCreate committed *without* NOTIFY (as if its notification were lost), claimable
    only ``due_in_s`` seconds from now; its job id."""
    from z9.api.schemas import ServerCreate

    spec = ServerCreate.model_validate({"name": name, "region": REGION, "image": "debian-12", "cores": 1,
                                        "memory_mib": 1024, "disk_gib": 4})
    async with api.pool.acquire() as conn, conn.transaction():
        server = await server_store.server_insert(conn, tenant_id=api.tenant_id, region=REGION, name=spec.name,
                                           image=spec.image, cores=spec.cores, memory_mib=spec.memory_mib,
                                           disk_gib=spec.disk_gib, ssh_keys=spec.ssh_keys)
        job = await store.job_insert(conn, store.NewJob(kind="ServerCreate", region=REGION, tenant_id=api.tenant_id,
                                                        resource_type="server", resource_id=server.id,
                                                        args=spec.model_dump()), notify=False)
        await conn.execute("UPDATE jobs SET run_after = now() + make_interval(secs => $2) WHERE id = $1",
                           job.id, due_in_s)
    return job.id


async def test_dead_listen_connection_is_reestablished_with_a_catch_up_claim(api: Stack, sim: SimAdmin,
                                                                            services: Services) -> None:
    pool = api.pool
    db = await pool.fetchval("SELECT current_database()")
    port = free_port()
    ex = services.start("executor", poll_interval_s=60, metrics_port=port)  # the slow poll cannot be what claims
    await services.executor_owner(ex)
    await ex.wait_log("LISTEN z9_jobs established")
    assert await _metric(port, "z9_executor_listen_healthy") == 1
    assert await _metric(port, "z9_executor_listen_reconnects_total") == 0
    listen_sql = ("SELECT pid FROM pg_stat_activity WHERE datname = $1 "
                  "AND application_name = 'z9-executor-listen'")
    old_pid = await wait_until(lambda: pool.fetchval(listen_sql, db), 10, "the executor's LISTEN backend")

    # Claimable from 1 s on (so no claim still under way from the executor's start can take it),
    # and nothing tells the executor: a lost NOTIFY, which only the 60 s poll would find.
    quiet = await _insert_create_quietly(api, "quiet-1", due_in_s=1.0)
    await wait_until(lambda: pool.fetchval("SELECT now() > run_after + interval '1 second' FROM jobs WHERE id = $1",
                                           quiet), 10, "the quiet job to be due for a second")
    assert (await _row(pool, quiet))["status"] == "pending"

    killed_at = asyncio.get_running_loop().time()
    assert await pool.fetchval("SELECT pg_terminate_backend($1)", old_pid)
    await wait_until(lambda: pool.fetchval("SELECT status <> 'pending' FROM jobs WHERE id = $1", quiet), 15,
                     "the catch-up claim after the LISTEN connection came back")
    caught_up_in = asyncio.get_running_loop().time() - killed_at
    print(f"claimed {caught_up_in:.2f}s after the LISTEN backend was terminated")
    assert caught_up_in < 15, caught_up_in  # far under the 60 s poll
    new_pid = await wait_until(lambda: pool.fetchval(listen_sql, db), 10, "a new LISTEN backend")
    assert new_pid != old_pid
    # The health is visible in the log: the loss, then the connection established again.
    await ex.wait_log(r"LISTEN connection lost; re-establishing")
    assert ex.log().count("LISTEN z9_jobs established") == 2, ex.log()
    # ... and in the executor's metrics: connected again, one reconnection counted.
    assert await _metric(port, "z9_executor_listen_reconnects_total") == 1
    assert await _metric(port, "z9_executor_listen_healthy") == 1
    assert (await api.wait_job(quiet, timeout_s=30))["status"] == "succeeded"
    # And NOTIFY works on the new connection.
    _, job = await api.create_server("loud-1")
    await wait_until(lambda: pool.fetchval("SELECT status <> 'pending' FROM jobs WHERE id = $1", job["id"]), 15,
                     "a notified job to be claimed")
    assert (await api.wait_job(job["id"]))["status"] == "succeeded"
    assert ex.alive()


# 7
@pytest.mark.settings(max_attempts=4)  # the test's max_attempts
async def test_backoff_follows_the_formula_and_max_attempts_fail_with_the_last_error(
        api: Stack, sim: SimAdmin, services: Services) -> None:
    """Architecture §5 through the real engine: each retry's ``run_after`` is
    ``now + min(cap, base·2^(attempt-1))·jitter`` (jitter within ±25 %), and the last attempt
    fails the job with that attempt's error. (The formula's own edges: tests/unit/test_units.py.)"""
    base, cap, jitter, max_attempts = 0.2, 0.5, 0.25, 4
    pool = api.pool
    await install_job_log(pool)
    for n in range(1, max_attempts + 2):  # one distinct failure per attempt (rules fire in order)
        await sim.fault(method="POST", path=r"/clone$", action="error", status=500, reason=f"simulated outage #{n}",
                        times=1)
    services.start("scheduler")
    services.start("executor", backoff_base_s=base, backoff_cap_s=cap, backoff_jitter=jitter)
    server, job = await api.create_server("unlucky-1")
    done = await api.wait_job(job["id"], timeout_s=30)
    assert done["status"] == "failed" and done["attempt"] == max_attempts, done
    msg = done["error"]["message"]
    assert f"out of attempts ({max_attempts})" in msg and f"simulated outage #{max_attempts}" in msg, msg
    assert done["error"]["class"] == "temporary"
    s = await api.server(server["id"])
    assert s["status"] == "failed" and f"simulated outage #{max_attempts}" in s["status_reason"], s

    retries = [e for e in await job_log(pool, job["id"]) if e["status"] == "retry"]
    assert [e["attempt"] for e in retries] == list(range(1, max_attempts)), retries
    for e in retries:
        n = e["attempt"]
        delay = (e["run_after"] - e["tx_at"]).total_seconds()
        raw = min(cap, base * 2 ** (n - 1))
        assert raw * (1 - jitter) - 1e-3 <= delay <= raw * (1 + jitter) + 1e-3, (n, delay, raw)
        assert f"simulated outage #{n}" in e["error"]["message"]
    assert (retries[-1]["run_after"] - retries[-1]["tx_at"]).total_seconds() >= cap * (1 - jitter) - 1e-3  # capped
    assert await _tasks(sim, "qmclone") == 0


@pytest.mark.settings(max_attempts=2)
async def test_a_vm_lock_held_by_another_task_snoozes_without_spending_attempts(
        api: Stack, sim: SimAdmin, services: Services) -> None:
    pool = api.pool
    await install_job_log(pool)
    services.start("scheduler")
    services.start("executor")
    server, job = await api.create_server("locked-1")
    assert (await api.wait_job(job["id"]))["status"] == "succeeded"
    vmid = (await api.server(server["id"]))["observed"]["vmid"]
    await sim.set_config(vmid, lock="backup")  # a backup task holds the VM
    status, out = await api.call("DELETE", f"/servers/{server['id']}")
    assert status == 202, out
    stop_id = out["job"]["id"]

    async def snoozes() -> list[dict[str, Any]]:
        return [e for e in await job_log(pool, stop_id) if e["status"] == "retry"]

    await wait_until(lambda: _at_least(snoozes, 4), 20, "four snoozes (twice max_attempts)")
    vm = await sim.vm(vmid)
    assert vm["running"], vm  # never touched while locked
    vm = await sim.vm(vmid)
    await sim._req("POST", "/vms", json={"vmid": vmid, "node": vm["node"], "running": vm["running"],
                                         "config": {k: v for k, v in vm["config"].items() if k != "lock"}})
    done = await api.wait_job(stop_id, timeout_s=20)
    assert done["status"] == "succeeded" and done["attempt"] == 1, done
    for e in await snoozes():
        assert e["error"]["class"] == "snooze" and "locked (backup)" in e["error"]["message"], e
        assert e["attempt"] == 0, e  # the attempt given back each time
    assert not (await sim.vm(vmid))["running"]


async def _at_least(fetch: Any, n: int) -> bool:
    return len(await fetch()) >= n


# 8
async def test_sigterm_stops_claiming_and_hands_the_running_job_over(api: Stack, sim: SimAdmin,
                                                                     services: Services) -> None:
    """SIGTERM to a real executor in the middle of a long clone: it claims nothing more (a job
    submitted while it drains goes to the other executor), hands the clone's job over after its
    grace period (attempt given back), exits 0; the other executor finishes the job on the same
    clone task."""
    pool = api.pool
    await install_job_log(pool)
    # The clone runs until released (not for a fixed time): B's start, however slow on a loaded
    # machine, cannot outlast it (A then had nothing running at SIGTERM and exited at once).
    await sim.configure(task_seconds={"qmclone": 1.0})
    await sim.hold_tasks("qmclone")
    services.start("scheduler")
    a = services.start("executor", shutdown_grace_s=2.0)
    owner_a = await services.executor_owner(a)
    server, job = await api.create_server("term-1")
    await wait_until(lambda: _tasks(sim, "qmclone"), 20, "the clone task to start")
    b = services.start("executor")
    owner_b = await services.executor_owner(b)
    await b.wait_log("LISTEN z9_jobs established")

    a.signal(signal.SIGTERM)
    await a.wait_log("stopping: waiting up to")
    _, job2 = await api.create_server("term-2")  # arrives while A drains, with capacity to spare
    assert await a.wait_exit(20) == 0
    assert "handed over" in a.log()
    await sim.release_tasks("qmclone")

    done = await api.wait_job(job["id"], timeout_s=30)
    assert done["status"] == "succeeded" and done["attempt"] == 1, done  # the handed-over attempt given back
    done2 = await api.wait_job(job2["id"], timeout_s=30)
    assert done2["status"] == "succeeded", done2
    rs = runs(await job_log(pool))
    assert [(r.owner, r.ended_as) for r in rs if r.job_id == job["id"]] == [(owner_a, "retry"), (owner_b, "succeeded")]
    assert [r.owner for r in rs if r.job_id == job2["id"]] == [owner_b]  # A claimed nothing after SIGTERM
    assert not overlapping(rs)
    assert await _tasks(sim, "qmclone") == 2  # one per server: B waited on A's clone, never cloned again
    assert len(await sim.vms_tagged(identity_tag(server["id"]))) == 1


async def test_sigterm_lets_a_step_that_ends_within_the_grace_finish_there(api: Stack, sim: SimAdmin,
                                                                           services: Services) -> None:
    pool = api.pool
    await install_job_log(pool)
    await sim.configure(task_seconds={"qmclone": 1.5})
    services.start("scheduler")
    a = services.start("executor", shutdown_grace_s=20.0)
    owner_a = await services.executor_owner(a)
    server, job = await api.create_server("term-3")
    await wait_until(lambda: _tasks(sim, "qmclone"), 20, "the clone task to start")
    a.signal(signal.SIGTERM)
    assert await a.wait_exit(30) == 0
    row = await _row(pool, job["id"])
    assert row["status"] == "succeeded" and row["attempt"] == 1, row
    assert [(r.owner, r.ended_as) for r in runs(await job_log(pool, job["id"]))] == [(owner_a, "succeeded")]
    assert len(await sim.vms_tagged(identity_tag(server["id"]))) == 1


# 9
@pytest.mark.settings(deletion_buffer_s=0.5)
async def test_a_delete_waits_for_the_running_create_of_its_server(api: Stack, sim: SimAdmin,
                                                                   services: Services) -> None:
    """Deletes submitted through the API while their servers' creates run: each waits (pending)
    although two executors have free capacity, then runs; the reaper's final delete comes
    last. No two jobs of one server are ever running at once (the database's own log)."""
    pool = api.pool
    await install_job_log(pool)
    await sim.configure(task_seconds={"qmclone": 2.0})
    services.start("scheduler")
    services.start("reaper")
    for _ in range(2):
        await services.executor_owner(services.start("executor"))
    made = [await api.create_server(f"order-{i}") for i in range(3)]

    async def all_running() -> bool:
        return all([(await _row(pool, j["id"]))["status"] == "running" for _, j in made])

    await wait_until(all_running, 20, "the creates to run")
    stops = {}
    for s, _ in made:
        status, out = await api.call("DELETE", f"/servers/{s['id']}")
        assert status == 202, out
        stops[s["id"]] = out["job"]["id"]
    async def creates_done() -> bool:  # as long as a create runs, its server's delete job waits
        # one statement, one snapshot: a create's finish and its delete's claim commit together
        snap = {r["id"]: dict(r) for r in await pool.fetch(
            "SELECT * FROM jobs WHERE id = ANY($1)", [j["id"] for _, j in made] + list(stops.values()))}
        rows = {s["id"]: (snap[j["id"]], snap[stops[s["id"]]]) for s, j in made}
        for create, stop in rows.values():
            if create["status"] != "succeeded":
                assert stop["status"] == "pending" and stop["attempt"] == 0, (create, stop)
        return all(c["status"] == "succeeded" for c, _ in rows.values())
    await wait_until(creates_done, 30, "the creates to finish")

    for s, _ in made:
        await wait_until(lambda: _server_status_is(api, s["id"], "deleted"), 30, f"server {s['id']} to be deleted")
    for s, create in made:
        jobs = [dict(r) for r in await pool.fetch(
            "SELECT kind, status, started_at, finished_at FROM jobs WHERE resource_id = $1 ORDER BY seq", s["id"])]
        assert [(j["kind"], j["status"]) for j in jobs] == [
            ("ServerCreate", "succeeded"), ("ServerStop", "succeeded"), ("ServerDelete", "succeeded")], jobs
        for before, after in zip(jobs, jobs[1:]):
            assert before["finished_at"] <= after["started_at"], (before, after)
        assert await sim.vms_tagged(identity_tag(s["id"])) == []
    rs = runs(await job_log(pool))
    assert len(rs) >= 9 and not overlapping(rs), overlapping(rs)


async def _server_status_is(api: Stack, server_id: str, status: str) -> bool:
    return (await api.server(server_id))["status"] == status


async def test_a_session_ended_inside_a_transaction_raises_a_transient_error(pg_url: str) -> None:
    """What every service saw mid-pass when the server went down: the session is terminated
    while the connection sits inside a transaction. Whatever asyncpg raises then (often an
    InternalClientError from the COMMIT) must be one of TRANSIENT_DB_ERRORS, which the services
    back off and reconnect on — anything else ended the scheduler process."""
    from z9.common.db import TRANSIENT_DB_ERRORS

    seen = set()
    killer = await asyncpg.connect(pg_url)
    try:
        for _ in range(20):
            conn = await asyncpg.connect(pg_url, server_settings={"application_name": "z9-test-terminated"})
            with pytest.raises(Exception) as ei:
                async with conn.transaction():
                    await conn.fetchval("SELECT 1")
                    await killer.fetchval("SELECT pg_terminate_backend($1)", conn.get_server_pid())
            assert isinstance(ei.value, TRANSIENT_DB_ERRORS), repr(ei.value)
            seen.add(type(ei.value).__name__)
            conn.terminate()
    finally:
        await killer.close()
    print("errors seen:", sorted(seen))
