#!/usr/bin/env python3
"""z9 queue benchmarks: the shared workloads W1–W6 of ``/work/shared/bench/WORKLOADS.md``, plus
the NOTIFY burst (commit latency of 64 concurrent single-job inserts, in-transaction NOTIFY vs
coalesced) and the ``EXPLAIN (ANALYZE, BUFFERS)`` of every hot query on a 5M-row table.

Every figure is one JSON object per line on stdout: the shared fields
``{"lib", "version", "run", "workload", "n", "concurrency", "jobs_per_s", "seconds", "p50_ms",
"p90_ms", "p99_ms", "max_ms", "client_cpu_us_per_job"}`` plus ``load1`` (1-minute load average
when the figure was taken), ``at`` (UTC) and workload-specific extras. ``run`` is the round
number, and ``"median"`` on the line summarising the rounds. Plans are printed as
``{"workload": "explain", "query", "plan"}`` lines.

Each workload runs in a database of its own (``z9_bench_<random>``), created, migrated and
dropped by this script. PostgreSQL's own settings are printed, never changed.

Usage::

    .venv/bin/python bench/run.py                          # everything, 5 rounds
    .venv/bin/python bench/run.py -w W3,W4 --rounds 3 --concurrency 16
    .venv/bin/python bench/run.py -w W5 --history 5000000
    .venv/bin/python bench/run.py -w NOTIFY,PLAN
"""
from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import random
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from typing import Any

import asyncpg

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from z9.common import store  # noqa: E402
from z9.common.db import connect, create_pool  # noqa: E402
from z9.common.store import NewJob  # noqa: E402
from z9.db import migrate  # noqa: E402

import noop  # noqa: E402

VERSION = "0.1.0"
REGION = "bench"
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
ALL = ["W1", "W2", "W3", "W4", "W5", "W6", "NOTIFY", "PLAN", "BLOCKED", "TRACING"]


# ---------------------------------------------------------------------------------- output

def load1() -> float:
    return os.getloadavg()[0]


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def emit(workload: str, run: Any, **fields: Any) -> dict[str, Any]:
    line = {"lib": "z9", "version": VERSION, "run": run, "workload": workload, "n": None,
            "concurrency": None, "jobs_per_s": None, "seconds": None, "p50_ms": None, "p90_ms": None,
            "p99_ms": None, "max_ms": None, "client_cpu_us_per_job": None}
    line.update(fields)
    line.setdefault("load1", round(load1(), 2))
    line.setdefault("at", now_iso())
    print(json.dumps(line), flush=True)
    return line


def emit_median(workload: str, rounds: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """One line with the median of every numeric figure over the rounds."""
    out: dict[str, Any] = {}
    for k in ("jobs_per_s", "seconds", "p50_ms", "p90_ms", "p99_ms", "max_ms", "client_cpu_us_per_job",
              "requests_per_s", "errors", "commit_p50_ms", "commit_p99_ms", "notifies_sent",
              "api_cpu_us_per_request", "round_trips_per_job", "commits_per_job", "claim_buffers",
              "claim_p50_ms", "claim_p99_ms", "server_cpu_us_per_job", "client_user_us_per_job",
              "client_sys_us_per_job", "client_steady_cpu_us_per_job", "instructions_per_job"):
        vals = [r[k] for r in rounds if isinstance(r.get(k), (int, float))]
        if vals:
            out[k] = round(statistics.median(vals), 3)
    first = rounds[0]
    for k in ("n", "concurrency", "mode", "endpoint", "history_rows", "plan_cache_mode", "blocked_jobs",
              "blocked_resources"):
        if k in first:
            out[k] = first[k]
    out["rounds"] = len(rounds)
    out["load1_range"] = [min(r["load1"] for r in rounds), max(r["load1"] for r in rounds)]
    out.update(extra)
    return emit(workload, "median", **out)


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def ms(v: float) -> float:
    return round(v * 1000, 3)


# ---------------------------------------------------------------------------------- databases

def with_db(dsn: str, name: str) -> str:
    base, _, _ = dsn.rpartition("/")
    return f"{base}/{name}"


class BenchDB:
    """A fresh, migrated ``z9_bench_*`` database; dropped on exit."""

    def __init__(self, admin_dsn: str):
        self.admin_dsn = admin_dsn
        self.name = f"z9_bench_{secrets.token_hex(4)}"
        self.dsn = with_db(admin_dsn, self.name)

    async def __aenter__(self) -> "BenchDB":
        admin = await asyncpg.connect(self.admin_dsn)
        try:
            await admin.execute(f'CREATE DATABASE "{self.name}"')
        finally:
            await admin.close()
        conn = await connect(self.dsn)
        try:
            await migrate(conn)
        finally:
            await conn.close()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        admin = await asyncpg.connect(self.admin_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        finally:
            await admin.close()


async def checkpoint(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CHECKPOINT")
    finally:
        await conn.close()


async def reset_jobs(dsn: str) -> None:
    """Remove the benchmark's live and finished no-op jobs (keeps any history rows)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("DELETE FROM jobs WHERE kind = $1 AND created_at > now() - interval '1 hour'", noop.KIND)
        await conn.execute("VACUUM ANALYZE jobs")
    finally:
        await conn.close()


def job() -> NewJob:
    return NewJob(kind=noop.KIND, region=REGION, args={}, max_attempts=1)


async def enqueue_batch(dsn: str, n: int) -> None:
    pool = await create_pool(dsn, min_size=1, max_size=2)
    try:
        for i in range(0, n, 1000):
            async with pool.acquire() as conn, conn.transaction():
                await store.job_insert_many(conn, [job() for _ in range(min(1000, n - i))], notify=False)
    finally:
        await pool.close()


# ---------------------------------------------------------------------------------- executor child

class Child:
    """The executor in its own process (``executor_child.py``)."""

    def __init__(self, dsn: str, concurrency: int, plan_cache_mode: str = "-", log_level: str = "INFO",
                 handler_times: bool = False, env_extra: dict[str, str] | None = None):
        env = dict(os.environ, Z9_LOG_LEVEL=log_level, **(env_extra or {}))
        if handler_times:
            env["Z9_BENCH_HANDLER_TIMES"] = "1"
        self.log = tempfile.TemporaryFile()
        self.user_s: float | None = None  # its user and system CPU seconds since go (stop())
        self.sys_s: float | None = None
        self.steady_s: float | None = None  # CPU per job from the first job to the last (noop.STEADY)
        self.instructions: int | None = None  # under callgrind: from the first job to stop
        # Z9_BENCH_CALLGRIND=<dir>: under callgrind, instructions counted from the first job to stop
        self.callgrind_dir = env.get("Z9_BENCH_CALLGRIND") or None
        prefix = (["valgrind", "--tool=callgrind", "--instr-atstart=no",
                   f"--callgrind-out-file={self.callgrind_dir}/cg.%p"] if self.callgrind_dir else [])
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, os.path.join(HERE, "executor_child.py"), dsn, str(concurrency), plan_cache_mode],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env, text=True)

    def go(self) -> None:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def wait_started(self) -> None:
        assert self.proc.stdout
        line = self.proc.stdout.readline()
        if line.strip() != "started":
            raise RuntimeError(f"executor child did not start: {line!r}\n{self.stderr()}")

    def stop(self) -> float:
        """Stop it; returns its CPU seconds since ``go`` (``round_trips``: its statements)."""
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        self.proc.wait(timeout=60)
        try:
            out = json.loads(line)
            self.round_trips = int(out.get("round_trips", 0))
            self.user_s, self.sys_s = out.get("user_s"), out.get("sys_s")
            self.steady_s = out.get("steady_cpu_s_per_job")
            self.instructions = self._callgrind_instructions()
            self.handler_started = {k: float(v) for k, v in out.get("handler_started", {}).items()}
            return float(out["cpu_s"])
        except (ValueError, KeyError) as e:
            raise RuntimeError(f"executor child failed: {line!r}\n{self.stderr()}") from e

    def _callgrind_instructions(self) -> int | None:
        """Instructions callgrind counted from the first job's handler to stop (its dump named
        ``z9-drain``), or None when not under callgrind."""
        if not self.callgrind_dir:
            return None
        base = os.path.join(self.callgrind_dir, f"cg.{self.proc.pid}")
        for path in sorted(glob.glob(base + ".*")) + [base]:
            if not os.path.exists(path):
                continue
            with open(path) as f:
                text = f.read()
            if "z9-drain" in text:
                m = re.search(r"^(?:summary|totals): (\d+)", text, re.MULTILINE)
                return int(m.group(1)) if m else None
        return None

    def stderr(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-4000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


async def wait_drained(conn: asyncpg.Connection, timeout_s: float, poll_s: float = 0.02) -> int:
    """Until no benchmark job is live (partial index on live jobs: cheap at any history size).
    Returns the number of polls (each one transaction of this connection)."""
    deadline = time.monotonic() + timeout_s
    polls = 0
    while True:
        polls += 1
        live = await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM jobs WHERE status IN ('pending', 'running', 'retry') AND kind = $1)",
            noop.KIND)
        if not live:
            return polls
        if time.monotonic() > deadline:
            raise TimeoutError("drain did not finish in time")
        await asyncio.sleep(poll_s)


# ---------------------------------------------------------------------------------- W1, W2

async def w1(dsn: str, n: int, rnd: int) -> dict[str, Any]:
    await reset_jobs(dsn)
    pool = await create_pool(dsn, min_size=1, max_size=2)
    try:
        await checkpoint(dsn)
        cpu0, t0 = time.process_time(), time.perf_counter()
        for _ in range(n):
            await store.job_insert(pool, job())
        secs, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        await pool.close()
    return emit("enqueue_single", rnd, n=n, concurrency=1, jobs_per_s=round(n / secs, 1),
                seconds=round(secs, 3), client_cpu_us_per_job=round(cpu / n * 1e6, 1))


async def w2(dsn: str, n: int, rnd: int) -> dict[str, Any]:
    await reset_jobs(dsn)
    pool = await create_pool(dsn, min_size=1, max_size=2)
    try:
        await checkpoint(dsn)
        cpu0, t0 = time.process_time(), time.perf_counter()
        for i in range(0, n, 1000):
            async with pool.acquire() as conn, conn.transaction():
                await store.job_insert_many(conn, [job() for _ in range(min(1000, n - i))])
        secs, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        await pool.close()
    return emit("enqueue_batch", rnd, n=n, concurrency=1, jobs_per_s=round(n / secs, 1),
                seconds=round(secs, 3), client_cpu_us_per_job=round(cpu / n * 1e6, 1))


# ---------------------------------------------------------------------------------- W3 / W5

async def drain_round(dsn: str, n: int, conc: int, rnd: int, workload: str, plan_cache_mode: str,
                      executor_dsn: str | None = None, child_env: dict[str, str] | None = None,
                      **extra: Any) -> dict[str, Any]:
    """One drain of ``n`` no-op jobs by an executor child of concurrency ``conc``; ``executor_dsn``:
    the child's ``Z9_DATABASE_URL`` when not ``dsn`` (e.g. through PgBouncer: the child then takes
    ``Z9_DATABASE_DIRECT_URL``/``Z9_DATABASE_POOLER`` from the environment)."""
    await reset_jobs(dsn)
    await enqueue_batch(dsn, n)
    child = Child(executor_dsn or dsn, conc, plan_cache_mode, env_extra=child_env)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("ANALYZE jobs")
        claim_buffers = await claim_buffers_of(conn, conc)
        await conn.execute("CHECKPOINT")
        await asyncio.sleep(0.2)
        commits0 = await db_commits(conn)
        t0_wall = time.time()
        t0 = time.perf_counter()
        child.go()
        await asyncio.get_running_loop().run_in_executor(None, child.wait_started)
        polls = await wait_drained(conn, timeout_s=600)
        wall = time.perf_counter() - t0
        server_cpu = await backends_cpu_s(conn)
        cpu = child.stop()
        # the executor's commits: the database's, less this connection's own (the drain polls, and
        # the statistics snapshot reads; pg_stat_database lags up to 0.5 s, hence the pause)
        await asyncio.sleep(0.7)
        commits = await db_commits(conn) - commits0 - polls - 1
        last = await conn.fetchval("SELECT extract(epoch FROM max(finished_at)) FROM jobs WHERE kind = $1 "
                                   "AND created_at > now() - interval '1 hour'", noop.KIND)
        done = await conn.fetchval("SELECT count(*) FROM jobs WHERE kind = $1 AND status = 'succeeded' "
                                   "AND created_at > now() - interval '1 hour'", noop.KIND)
        if done != n:
            raise RuntimeError(f"{workload}: {done} of {n} jobs succeeded\n{child.stderr()}")
    finally:
        child.kill()
        await conn.close()
    secs = min(wall, float(last) - t0_wall) if last else wall
    return emit(workload, rnd, n=n, concurrency=conc, jobs_per_s=round(n / secs, 1), seconds=round(secs, 3),
                client_cpu_us_per_job=round(cpu / n * 1e6, 1), plan_cache_mode=plan_cache_mode,
                round_trips_per_job=round(child.round_trips / n, 2), commits_per_job=round(commits / n, 2),
                claim_buffers=claim_buffers,
                client_user_us_per_job=round(child.user_s / n * 1e6, 1) if child.user_s is not None else None,
                client_sys_us_per_job=round(child.sys_s / n * 1e6, 1) if child.sys_s is not None else None,
                client_steady_cpu_us_per_job=round(child.steady_s * 1e6, 1) if child.steady_s is not None else None,
                instructions_per_job=round(child.instructions / (n - 1)) if child.instructions else None,
                server_cpu_us_per_job=round(server_cpu / n * 1e6, 1) if server_cpu is not None else None,
                **extra)


async def backends_cpu_s(conn: asyncpg.Connection) -> float | None:
    """CPU seconds (user + system, from /proc) of every client backend of this database but
    ``conn``'s — the executor's connections, read before it stops: PostgreSQL's own work for the
    drain (planning included; their connection start-up too, a few ms each). None when the
    server's processes cannot be read (not local, or not permitted). Unlike throughput, this
    hardly depends on what else the machine runs."""
    pids = [r["pid"] for r in await conn.fetch(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND backend_type = 'client backend'")]
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    try:
        for pid in pids:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    except (OSError, IndexError, ValueError):
        return None
    return total


async def db_commits(conn: asyncpg.Connection) -> int:
    """Transactions committed in this database so far (``pg_stat_database``; a fresh snapshot)."""
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    return int(await conn.fetchval("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"))


async def claim_buffers_of(conn: asyncpg.Connection, limit: int) -> int:
    """Shared buffers (hit + read) one claim of ``limit`` jobs touches, from its
    ``EXPLAIN (ANALYZE, BUFFERS)`` — run in a transaction rolled back, so nothing is claimed."""
    tr = conn.transaction()
    await tr.start()
    try:
        if hasattr(store, "job_claim_sql"):  # bench/ab.py may run this harness on older code
            plan = await conn.fetchval("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
                                       + store.job_claim_sql(REGION, limit, "explain", 30.0))
        else:
            plan = await conn.fetchval("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + store.q("job_claim"),
                                       REGION, limit, "explain", 30.0)
    finally:
        await tr.rollback()
    if isinstance(plan, str):
        plan = json.loads(plan)
    top = plan[0]["Plan"]
    return int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0))


async def insert_blocked(dsn: str, resources: int, jobs: int) -> float:
    """The blocked-work set-up of the BLOCKED workload: ``resources`` running jobs (leases held
    by another executor for an hour) and ``jobs`` pending jobs queued behind them, evenly over those
    resources, all in the benchmark's region and ahead (lower seq) of the drained no-op jobs.
    Returns seconds taken."""
    conn = await asyncpg.connect(dsn)
    try:
        t0 = time.perf_counter()
        await conn.execute("""
            INSERT INTO jobs (id, kind, region, resource_type, resource_id, status, attempt, lease_owner,
                              lease_expires_at, started_at)
            SELECT 'job_' || lpad('b' || i::text, 26, '0'), 'ServerCreate', $2, 'server',
                   'srv_' || lpad(i::text, 26, '0'), 'running', 1, 'elsewhere', now() + interval '1 hour', now()
            FROM generate_series(1, $1) AS i""", resources, REGION)
        per = max(jobs // resources, 1)
        for lo in range(0, resources, 100):  # 100 resources a transaction: one key lock each (0010)
            await conn.execute("""
                INSERT INTO jobs (id, kind, region, resource_type, resource_id)
                SELECT 'job_' || lpad('w' || r::text || 'x' || k::text, 26, '0'), 'ServerCreate', $4, 'server',
                       'srv_' || lpad(r::text, 26, '0')
                FROM generate_series($1::int, $2::int) AS r, generate_series(1, $3::int) AS k""",
                lo + 1, min(lo + 100, resources), per, REGION)
        await conn.execute("VACUUM ANALYZE jobs")
        return time.perf_counter() - t0
    finally:
        await conn.close()


async def insert_history(dsn: str, rows: int) -> float:
    """``rows`` terminal jobs (90 % succeeded, 10 % failed) in one INSERT … SELECT generate_series;
    each belongs to one of rows/5 server resources. Returns seconds taken."""
    conn = await asyncpg.connect(dsn)
    try:
        t0 = time.perf_counter()
        await conn.execute("""
            INSERT INTO jobs (id, kind, region, resource_type, resource_id, args, status, attempt,
                              max_attempts, run_after, steps, error, created_at, started_at,
                              finished_at, updated_at)
            SELECT 'job_' || lpad(i::text, 26, '0'), 'ServerCreate', $2, 'server',
                   'srv_' || lpad((i % greatest($1 / 5, 1))::text, 26, '0'), '{}', 
                   CASE WHEN i % 10 = 0 THEN 'failed' ELSE 'succeeded' END::job_status, 1, 10,
                   t, '[]', CASE WHEN i % 10 = 0 THEN '{"class": "permanent", "message": "x"}'::jsonb END,
                   t, t, t + interval '1 second', t + interval '1 second'
            FROM generate_series(1, $1) AS i,
                 LATERAL (SELECT now() - interval '3 days' + i * interval '10 ms' AS t) AS ts
        """, rows, REGION)
        await conn.execute("VACUUM ANALYZE jobs")
        return time.perf_counter() - t0
    finally:
        await conn.close()


# ---------------------------------------------------------------------------------- W4

async def w4(dsn: str, rnd: int, count: int = 200, plan_cache_mode: str = "-") -> dict[str, Any]:
    await reset_jobs(dsn)
    child = Child(dsn, 1, plan_cache_mode, handler_times=True)
    pool = await create_pool(dsn, min_size=1, max_size=2)
    try:
        child.go()
        await asyncio.get_running_loop().run_in_executor(None, child.wait_started)
        await asyncio.sleep(2.0)
        rng = random.Random(4000 + rnd)
        before: dict[str, float] = {}
        for _ in range(count):
            t = time.time()
            j = await store.job_insert(pool, job())
            before[j.id] = t
            await asyncio.sleep(0.150 + rng.uniform(0, 0.100))
        async with pool.acquire() as conn:
            await wait_drained(conn, timeout_s=60)
            rows = await conn.fetch("SELECT id, extract(epoch FROM started_at) AS s FROM jobs WHERE id = ANY($1)",
                                    list(before))
        cpu = child.stop()
    finally:
        child.kill()
        await pool.close()
    # WORKLOADS.md: to the handler's start (after the claim committed), as the peers measure;
    # the claim transaction's start (started_at) kept beside it as claim_p50/p99_ms.
    lat = [child.handler_started[i] - t for i, t in before.items()]
    claim = [float(r["s"]) - before[r["id"]] for r in rows]
    return emit("latency", rnd, n=count, concurrency=1, p50_ms=ms(pct(lat, 50)), p90_ms=ms(pct(lat, 90)),
                p99_ms=ms(pct(lat, 99)), max_ms=ms(max(lat)), client_cpu_us_per_job=round(cpu / count * 1e6, 1),
                claim_p50_ms=ms(pct(claim, 50)), claim_p99_ms=ms(pct(claim, 99)), measured_to="handler_start",
                plan_cache_mode=plan_cache_mode)


# ---------------------------------------------------------------------------------- NOTIFY burst

async def notify_burst(dsn: str, rnd: int, mode: str, workers: int = 64, per_worker: int = 40) -> dict[str, Any]:
    """``workers`` concurrent producers, each enqueueing ``per_worker`` single jobs (one
    transaction each). ``mode``: ``in_txn`` (NOTIFY inside each insert's transaction) or
    ``coalesced`` (no NOTIFY in the transaction; the process's JobNotifier sends one NOTIFY per
    burst after commit). Figure: commit latency (the enqueue call's duration) p50/p99."""
    from z9.common.notify import JobNotifier

    await reset_jobs(dsn)
    pool = await create_pool(dsn, min_size=workers, max_size=workers + 1)
    notifier = JobNotifier(pool)
    listener = await asyncpg.connect(dsn)
    got = 0

    def on_notify(*_: Any) -> None:
        nonlocal got
        got += 1

    await listener.add_listener("z9_jobs", on_notify)
    lat: list[float] = []

    async def producer() -> None:
        for _ in range(per_worker):
            t = time.perf_counter()
            if mode == "in_txn":
                await store.job_insert(pool, job(), notify=True)
            else:
                await store.job_insert(pool, job(), notify=False)
                notifier.notify(REGION)
            lat.append(time.perf_counter() - t)

    async def warm_up() -> None:  # every pooled connection has prepared both statements
        async with pool.acquire() as conn:
            await store.job_insert(conn, job(), notify=True)
            await store.job_insert(conn, job(), notify=False)
            await asyncio.sleep(0.05)

    try:
        await asyncio.gather(*(warm_up() for _ in range(workers)))
        await checkpoint(dsn)
        got = 0
        t0 = time.perf_counter()
        await asyncio.gather(*(producer() for _ in range(workers)))
        secs = time.perf_counter() - t0
        await notifier.flush()
        await asyncio.sleep(0.2)
    finally:
        await listener.close()
        await pool.close()
    n = workers * per_worker
    return emit("notify_burst", rnd, n=n, concurrency=workers, mode=mode, jobs_per_s=round(n / secs, 1),
                seconds=round(secs, 3), p50_ms=ms(pct(lat, 50)), p90_ms=ms(pct(lat, 90)), p99_ms=ms(pct(lat, 99)),
                max_ms=ms(max(lat)), commit_p50_ms=ms(pct(lat, 50)), commit_p99_ms=ms(pct(lat, 99)),
                notifies_sent=got)


# ---------------------------------------------------------------------------------- EXPLAIN

async def explain_hot_queries(dsn: str, label: str) -> None:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of claim, finish (single and batch), heartbeat (single and
    batch), insert, promote and reclaim, each inside a rolled-back transaction, with a few
    live jobs in the table. Printed as JSON lines."""
    from z9.common.sql import q

    conn = await connect(dsn)
    try:
        await conn.execute("SET plan_cache_mode = force_custom_plan")
        async with conn.transaction():
            ids = [j.id for j in await store.job_insert_many(conn, [job() for _ in range(100)], notify=False)]
        claimed = await store.job_claim(conn, [REGION], 4, "explain:owner", 30.0)
        c = claimed[0]
        lease = (c.id, c.lease_owner, c.attempt)
        arr = ([j.id for j in claimed], [j.lease_owner for j in claimed], [j.attempt for j in claimed])
        plans = [
            ("claim", store.job_claim_sql(REGION, 16, "explain:other", 30.0), ()),
            ("insert", q("job_insert"), ("job_" + "z" * 26, noop.KIND, REGION, None, None, None, {}, 1, None)),
            ("finish_single", q("job_succeed"), (*lease, [])),
            ("heartbeat_single", q("job_heartbeat"), (*lease, 30.0, None)),
        ]
        plans.append(("finish_batch", q("job_succeed_many"), arr + (["[]"] * len(claimed),)))
        plans.append(("heartbeat_batch", q("job_heartbeat_many"), arr + (30.0, None)))
        plans += [
            ("promote", q("job_retry_due"), (1000, None)),
            ("reclaim", q("lease_reclaim_expired"), (1000, None)),
            ("prune", q("job_prune_finished"), (7 * 86400.0, 1000, None)),
        ]
        for name, sql, args in plans:
            tr = conn.transaction()
            await tr.start()
            try:
                rows = await conn.fetch("EXPLAIN (ANALYZE, BUFFERS) " + sql, *args)
            except Exception as e:  # print what failed rather than hide the other plans
                rows = [{"QUERY PLAN": f"error: {e!r}"}]
            finally:
                await tr.rollback()
            plan = "\n".join(r["QUERY PLAN"] for r in rows)
            m = re.search(r"Execution Time: ([0-9.]+) ms", plan)
            print(json.dumps({"lib": "z9", "workload": "explain", "table": label, "query": name,
                              "execution_ms": float(m.group(1)) if m else None, "plan": plan,
                              "load1": round(load1(), 2), "at": now_iso()}), flush=True)
        await conn.execute("DELETE FROM jobs WHERE id = ANY($1)", ids)
    finally:
        await conn.close()


# ---------------------------------------------------------------------------------- W6

WRK_POST = r"""
local counter = 0
local prefix = "%s"
function setup(thread)
  thread:set("tid", tostring(math.random(1, 1000000000)))
end
request = function()
  counter = counter + 1
  local body = '{"name":"' .. prefix .. "-" .. tid .. "-" .. counter ..
    '","region":"bench","image":"debian-12","cores":1,"memory_mib":512,"disk_gib":1}'
  return wrk.format("POST", "/v1/servers", {["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer %s"}, body)
end
"""

WRK_GET = r"""
request = function()
  return wrk.format("GET", "/v1/jobs/%s", {["Authorization"] = "Bearer %s"})
end
"""

WRK_DONE = r"""
done = function(summary, latency, requests)
  io.write(string.format("JSON{\"requests\":%d,\"p50_us\":%d,\"p90_us\":%d,\"p99_us\":%d,\"max_us\":%d," ..
    "\"connect\":%d,\"read\":%d,\"write\":%d,\"timeout\":%d,\"status\":%d,\"duration_us\":%d}\n",
    summary.requests, latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    summary.errors.connect, summary.errors.read, summary.errors.write, summary.errors.timeout,
    summary.errors.status, summary.duration))
end
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def w6(dsn: str, rnd: int, duration_s: int, connections: int) -> list[dict[str, Any]]:
    if shutil.which("wrk") is None:
        raise SystemExit("W6 needs wrk (apt-get install -y wrk)")
    conn = await connect(dsn)
    try:
        tenant = await store.tenant_upsert(conn, f"bench-{rnd}-{secrets.token_hex(3)}")
        token = "z9t_" + secrets.token_urlsafe(32)
        await store.api_token_insert(conn, tenant, token)
        j = await store.job_insert(conn, NewJob(kind="ServerCreate", region=REGION, tenant_id=tenant,
                                                resource_type="server", resource_id="srv_" + "0" * 26,
                                                args={}), notify=False)
    finally:
        await conn.close()
    port = free_port()
    env = dict(os.environ, Z9_DATABASE_URL=dsn, Z9_LOG_LEVEL="WARNING", Z9_API_RATE_LIMIT_PER_S="0",
               Z9_REGIONS=json.dumps({REGION: {"url": "https://127.0.0.1:9", "token_secret": "x",
                                               "images": ["debian-12"]}}))
    z9 = os.path.join(os.path.dirname(sys.executable), "z9")
    log = tempfile.TemporaryFile()
    api = subprocess.Popen([z9, "api", "--port", str(port)], env=env, stdout=log, stderr=log)
    out: list[dict[str, Any]] = []
    try:
        import aiohttp

        async with aiohttp.ClientSession() as s:
            for _ in range(100):
                try:
                    async with s.get(f"http://127.0.0.1:{port}/healthz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
        for endpoint, script in (("POST /v1/servers", WRK_POST % (f"r{rnd}", token)),
                                 ("GET /v1/jobs/{id}", WRK_GET % (j.id, token))):
            with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
                f.write(script + WRK_DONE)
            api_cpu0 = _proc_cpu(api.pid)
            res = await asyncio.to_thread(
                subprocess.run, ["wrk", "-t2", f"-c{connections}", f"-d{duration_s}s", "--timeout", "5s",
                                 "-s", f.name, f"http://127.0.0.1:{port}"], capture_output=True, text=True)
            api_cpu = _proc_cpu(api.pid) - api_cpu0
            os.unlink(f.name)
            m = re.search(r"JSON(\{.*\})", res.stdout)
            if not m:
                raise RuntimeError(f"wrk failed: {res.stdout}\n{res.stderr}")
            d = json.loads(m.group(1))
            errors = d["connect"] + d["read"] + d["write"] + d["timeout"] + d["status"]
            secs = d["duration_us"] / 1e6
            out.append(emit("api", rnd, n=d["requests"], concurrency=connections, endpoint=endpoint,
                            requests_per_s=round(d["requests"] / secs, 1), jobs_per_s=None, seconds=round(secs, 3),
                            p50_ms=d["p50_us"] / 1000, p90_ms=d["p90_us"] / 1000, p99_ms=d["p99_us"] / 1000,
                            max_ms=d["max_us"] / 1000, errors=errors,
                            api_cpu_us_per_request=round(api_cpu / max(d["requests"], 1) * 1e6, 1)))
    finally:
        api.terminate()
        try:
            api.wait(timeout=10)
        except subprocess.TimeoutExpired:
            api.kill()
    return out


def _proc_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------- main

async def server_info(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        info = {k: await conn.fetchval(f"SHOW {k}") for k in (
            "server_version", "fsync", "synchronous_commit", "shared_buffers", "wal_level", "max_connections")}
    finally:
        await conn.close()
    up = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(json.dumps({"lib": "z9", "workload": "environment", "postgres": info, "uptime": up,
                      "cpus": os.cpu_count(), "python": sys.version.split()[0], "at": now_iso()}), flush=True)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", default=os.environ.get("Z9_BENCH_DSN", DEFAULT_DSN),
                    help="an admin connection (creates and drops z9_bench_* databases)")
    ap.add_argument("-w", "--workloads", default=",".join(ALL), help=f"comma-separated, of {','.join(ALL)}")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=20000, help="jobs per W1/W2/W3/W5 round")
    ap.add_argument("--concurrency", default="1,4,16", help="W3/W5 executor concurrencies")
    ap.add_argument("--history", type=int, default=5_000_000, help="W5 terminal rows")
    ap.add_argument("--blocked-jobs", type=int, default=100_000, help="BLOCKED: pending jobs behind busy resources")
    ap.add_argument("--blocked-resources", type=int, default=2_000, help="BLOCKED: resources with a running job")
    ap.add_argument("--latency-jobs", type=int, default=200)
    ap.add_argument("--api-seconds", type=int, default=20)
    ap.add_argument("--api-connections", type=int, default=64)
    ap.add_argument("--plan-cache-mode", default="-",
                    help="executor connections: '-' = z9's setting, 'default' = PostgreSQL's (auto), "
                         "or auto|force_custom_plan|force_generic_plan")
    args = ap.parse_args()
    wanted = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]
    concs = [int(c) for c in args.concurrency.split(",")]
    await server_info(args.dsn)
    rounds = range(1, args.rounds + 1)
    w3_medians: dict[int, float] = {}

    if "W1" in wanted:
        async with BenchDB(args.dsn) as db:
            emit_median("enqueue_single", [await w1(db.dsn, args.n, r) for r in rounds])
    if "W2" in wanted:
        async with BenchDB(args.dsn) as db:
            emit_median("enqueue_batch", [await w2(db.dsn, args.n, r) for r in rounds])
    if "W3" in wanted:
        async with BenchDB(args.dsn) as db:
            for c in concs:
                res = [await drain_round(db.dsn, args.n, c, r, "drain", args.plan_cache_mode) for r in rounds]
                w3_medians[c] = emit_median("drain", res)["jobs_per_s"]
    if "W4" in wanted:
        async with BenchDB(args.dsn) as db:
            emit_median("latency", [await w4(db.dsn, r, args.latency_jobs, args.plan_cache_mode) for r in rounds])
    if "W5" in wanted:
        usage = shutil.disk_usage("/work")
        print(json.dumps({"lib": "z9", "workload": "disk", "free_gib": round(usage.free / 2**30, 1)}), flush=True)
        async with BenchDB(args.dsn) as db:
            secs = await insert_history(db.dsn, args.history)
            print(json.dumps({"lib": "z9", "workload": "history_insert", "rows": args.history,
                              "seconds": round(secs, 1), "at": now_iso()}), flush=True)
            await explain_hot_queries(db.dsn, f"{args.history} terminal rows")
            for c in concs:
                res = [await drain_round(db.dsn, args.n, c, r, "history", args.plan_cache_mode,
                                         history_rows=args.history) for r in rounds]
                extra = {}
                if c in w3_medians:
                    extra["ratio_to_w3"] = round(statistics.median(x["jobs_per_s"] for x in res) / w3_medians[c], 3)
                emit_median("history", res, **extra)
    if "BLOCKED" in wanted:
        # Issue 14: drain(C) with --blocked-jobs pending jobs queued behind --blocked-resources
        # running ones, against drain(C) on an otherwise empty table, rounds interleaved (one
        # database each, so neither's table carries the other's dead rows).
        async with BenchDB(args.dsn) as empty, BenchDB(args.dsn) as blocked:
            secs = await insert_blocked(blocked.dsn, args.blocked_resources, args.blocked_jobs)
            print(json.dumps({"lib": "z9", "workload": "blocked_insert", "resources": args.blocked_resources,
                              "jobs": args.blocked_jobs, "seconds": round(secs, 1), "at": now_iso()}), flush=True)
            for c in concs:
                base: list[dict[str, Any]] = []
                res: list[dict[str, Any]] = []
                for r in rounds:
                    base.append(await drain_round(empty.dsn, args.n, c, r, "blocked_baseline", args.plan_cache_mode))
                    res.append(await drain_round(blocked.dsn, args.n, c, r, "blocked", args.plan_cache_mode,
                                                 blocked_jobs=args.blocked_jobs,
                                                 blocked_resources=args.blocked_resources))
                emit_median("blocked_baseline", base)
                ratios = [b["jobs_per_s"] / a["jobs_per_s"] for a, b in zip(base, res)]
                emit_median("blocked", res, ratio_to_empty=round(statistics.median(ratios), 3),
                            ratios=[round(x, 3) for x in ratios])
    if "TRACING" in wanted:
        # Issue 14: drain(C) as deployed — tracing on, OTLP/HTTP export to a local receiver (in this
        # process: it parses every request, as a collector would) — against tracing off, rounds
        # interleaved; spans_per_job = spans the receiver got per job.
        from aiohttp import web

        received = {"spans": 0, "requests": 0}

        async def handle(request: web.Request) -> web.Response:
            from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
                ExportTraceServiceRequest, ExportTraceServiceResponse)
            msg = ExportTraceServiceRequest.FromString(await request.read())
            received["requests"] += 1
            received["spans"] += sum(len(ss.spans) for rs in msg.resource_spans for ss in rs.scope_spans)
            return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                                content_type="application/x-protobuf")

        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/v1/traces", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        on_env = {"Z9_BENCH_TRACING": "1", "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"}
        try:
            async with BenchDB(args.dsn) as db:
                for c in concs:
                    off: list[dict[str, Any]] = []
                    on: list[dict[str, Any]] = []
                    for r in rounds:
                        off.append(await drain_round(db.dsn, args.n, c, r, "tracing_off", args.plan_cache_mode))
                        before = received["spans"]
                        line = await drain_round(db.dsn, args.n, c, r, "tracing_on", args.plan_cache_mode,
                                                 child_env=on_env)
                        await asyncio.sleep(1.0)  # the last export request
                        line["spans_per_job"] = round((received["spans"] - before) / args.n, 2)
                        emit("tracing_on_spans", r, concurrency=c, n=args.n, spans_per_job=line["spans_per_job"])
                        on.append(line)
                    emit_median("tracing_off", off)
                    ratios = [b["jobs_per_s"] / a["jobs_per_s"] for a, b in zip(off, on)]
                    emit_median("tracing_on", on, ratio_to_off=round(statistics.median(ratios), 3),
                                ratios=[round(x, 3) for x in ratios],
                                spans_per_job=statistics.median(x["spans_per_job"] for x in on))
        finally:
            await runner.cleanup()
    if "W6" in wanted:
        async with BenchDB(args.dsn) as db:
            per: dict[str, list[dict[str, Any]]] = {}
            for r in rounds:
                for line in await w6(db.dsn, r, args.api_seconds, args.api_connections):
                    per.setdefault(line["endpoint"], []).append(line)
            for lines in per.values():
                emit_median("api", lines)
    if "NOTIFY" in wanted:
        async with BenchDB(args.dsn) as db:
            for mode in ("in_txn", "coalesced"):
                emit_median("notify_burst", [await notify_burst(db.dsn, r, mode) for r in rounds])
    if "PLAN" in wanted:
        # Drain at concurrency 16 with PostgreSQL's default plan cache (auto: generic plans after
        # five executions) against force_custom_plan, on a table holding history.
        async with BenchDB(args.dsn) as db:
            await insert_history(db.dsn, min(args.history, 1_000_000))
            for mode in ("default", "force_custom_plan", "force_generic_plan"):
                res = [await drain_round(db.dsn, args.n, max(concs), r, "plan_cache", mode,
                                         history_rows=min(args.history, 1_000_000)) for r in rounds]
                emit_median("plan_cache", res)


if __name__ == "__main__":
    asyncio.run(main())
