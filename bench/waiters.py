#!/usr/bin/env python3
"""W6 extended: what the job long-poll costs the executor (issue 12: ≤ 5 % on W3 drain(16)).

Three drains of ``--n`` no-op jobs by one executor process at ``--concurrency`` (W3, as in
``bench/run.py``) per round, their order rotated from round to round:

- ``no_notify``: the executor's queries without the ``pg_notify('z9_job_changed', id)`` column
  (the code before the long-poll);
- ``notify``: the queries as shipped, nobody listening;
- ``notify_waiters``: as shipped, with a ``z9 api`` process holding ``--waiters`` open
  ``GET /v1/jobs/{id}?wait_s=30`` requests (re-issued as they time out) on jobs of another
  region that do not change — so that API process receives every notification of the drain
  and looks each up among its waiters, on the same machine as the executor.

Prints one JSON line per drain (``bench/run.py``'s fields, ``workload`` = ``waiters``, ``mode``)
and the medians with ``ratio_to_no_notify`` and ``api_cpu_s`` (CPU seconds of the ``z9 api``
process during the drain, the waiters' opening and closing included). Figures need a quiet machine; ``--n 500 --rounds 1
--waiters 50`` proves the script runs.

Usage::

    .venv/bin/python bench/waiters.py                       # n=20000, 16, 1000 waiters, 3 rounds
    .venv/bin/python bench/waiters.py --n 500 --rounds 1 --waiters 50
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import aiohttp  # noqa: E402

from run import DEFAULT_DSN, BenchDB, drain_round, emit, free_port  # noqa: E402
from z9.common import store  # noqa: E402
from z9.common.db import connect  # noqa: E402
from z9.common.store import NewJob  # noqa: E402

IDLE_REGION = "bench-idle"


async def start_api(dsn: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = dict(os.environ, Z9_DATABASE_URL=dsn, Z9_LOG_LEVEL="WARNING",
               Z9_REGIONS=json.dumps({IDLE_REGION: {"url": "https://127.0.0.1:9", "token_secret": "x"}}))
    z9 = os.path.join(os.path.dirname(sys.executable), "z9")
    api = subprocess.Popen([z9, "api", "--port", str(port)], env=env, stdout=tempfile.TemporaryFile(),
                           stderr=subprocess.STDOUT)
    async with aiohttp.ClientSession() as s:
        for _ in range(200):
            try:
                async with s.get(f"http://127.0.0.1:{port}/healthz") as r:
                    if r.status == 200:
                        return api, port
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    api.kill()
    raise RuntimeError("z9 api did not start")


async def idle_jobs(dsn: str, n: int) -> tuple[str, list[str]]:
    """A tenant's token and ``n`` pending jobs in a region no executor serves."""
    conn = await connect(dsn)
    try:
        tenant = await store.tenant_upsert(conn, f"bench-wait-{secrets.token_hex(3)}")
        token = "z9t_" + secrets.token_urlsafe(32)
        await store.api_token_insert(conn, tenant, token)
        jobs = await store.job_insert_many(conn, [NewJob(kind="BenchIdle", region=IDLE_REGION, tenant_id=tenant)
                                                  for _ in range(n)], notify=False)
    finally:
        await conn.close()
    return token, [j.id for j in jobs]


async def hold_waiters(port: int, token: str, jobs: list[str], stop: asyncio.Event,
                       opened: asyncio.Event) -> int:
    """One long-poll per job, re-issued until ``stop``; returns the answers received."""
    answers = 0
    started = 0
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=120)) as s:
        async def one(job_id: str) -> None:
            nonlocal answers, started
            while not stop.is_set():
                started += 1
                if started == len(jobs):
                    opened.set()
                async with s.get(f"http://127.0.0.1:{port}/v1/jobs/{job_id}?wait_s=30", headers=headers) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"waiter got {r.status}")
                answers += 1

        tasks = [asyncio.create_task(one(j)) for j in jobs]
        await stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return answers


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_drain(dsn: str, args: Any, rnd: int, mode: str, port: int, token: str, jobs: list[str]) -> dict[str, Any]:
    """One drain in ``mode``: no_notify, notify, or notify_waiters (``args.waiters`` long-polls held
    on the idle jobs ``jobs`` through the API on ``port`` for the whole drain)."""
    if mode == "no_notify":
        os.environ["Z9_BENCH_NO_JOB_NOTIFY"] = "1"
        try:
            return await drain_round(dsn, args.n, args.concurrency, rnd, "waiters", "-", mode=mode, waiters=0)
        finally:
            del os.environ["Z9_BENCH_NO_JOB_NOTIFY"]
    if mode == "notify":
        return await drain_round(dsn, args.n, args.concurrency, rnd, "waiters", "-", mode=mode, waiters=0)
    stop, opened = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(hold_waiters(port, token, jobs, stop, opened))
    await asyncio.wait_for(opened.wait(), 60)
    await asyncio.sleep(1.0)  # every request has reached the API and waits
    try:
        return await drain_round(dsn, args.n, args.concurrency, rnd, "waiters", "-", mode=mode,
                                 waiters=args.waiters)
    finally:
        stop.set()
        await holder


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", default=os.environ.get("Z9_BENCH_DSN", DEFAULT_DSN))
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--waiters", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    results: dict[str, list[dict[str, Any]]] = {"no_notify": [], "notify": [], "notify_waiters": []}
    async with BenchDB(args.dsn) as db:
        token, jobs = await idle_jobs(db.dsn, args.waiters)
        api, port = await start_api(db.dsn)
        try:
            for rnd in range(1, args.rounds + 1):
                # the three drains in a rotating order, so that no mode always runs first or last
                # (a drain's position in the round could otherwise pass for its mode's cost)
                modes = ["no_notify", "notify", "notify_waiters"]
                for mode in modes[(rnd - 1) % 3:] + modes[:(rnd - 1) % 3]:
                    cpu0 = _cpu_s(api.pid)
                    results[mode].append(await one_drain(db.dsn, args, rnd, mode, port, token, jobs))
                    results[mode][-1]["api_cpu_s"] = round(_cpu_s(api.pid) - cpu0, 2)
        finally:
            api.terminate()
            api.wait(timeout=10)
    base = statistics.median(r["jobs_per_s"] for r in results["no_notify"])
    for mode, rs in results.items():
        med = statistics.median(r["jobs_per_s"] for r in rs)
        emit("waiters", "median", n=args.n, concurrency=args.concurrency, mode=mode,
             waiters=rs[0]["waiters"], jobs_per_s=round(med, 1),
             client_cpu_us_per_job=round(statistics.median(r["client_cpu_us_per_job"] for r in rs), 1),
             api_cpu_s=round(statistics.median(r["api_cpu_s"] for r in rs), 2),
             ratio_to_no_notify=round(med / base, 3))


if __name__ == "__main__":
    asyncio.run(main())
