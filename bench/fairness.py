#!/usr/bin/env python3
"""Fairness benchmark (the fair claim, migration 0022): does one tenant's backlog delay another's job?

Real volume creates (``POST /v1/volumes``: a job each, about a second against the
Proxmox VE simulator with its default latencies) through ``z9 api``, ``z9 scheduler`` and one ``z9
executor`` (concurrency ``--concurrency``, 8 by default) on a fresh database (``z9_bench_<random>``)
and an in-process simulator, like ``bench/clusters.py``. Scenarios, each on a fresh stack:

- ``alone``: tenant A creates one volume at a time, 20 times (the next once the previous job
  succeeded): A's latency, POST to the job's ``succeeded`` (long-poll), p50 / p99;
- ``backlog``: tenant B queues 200 creates at once (B's throughput alone: 200 / the time until the
  last succeeded);
- ``backlog+quiet``: B queues its 200, then A does its 20 one at a time: A's latency and B's
  throughput together;
- ``flood``: 10 tenants queue 100 creates each (their throughput alone), and ``flood+quiet``: the
  same with one quiet tenant doing its 20 one at a time.

Targets (the issue): A's p99 with the backlog ≤ 2 × A's p99 alone; B's throughput with A not lower
than alone by more than 10 %; the same for the quiet tenant among 10 flooding ones. One JSON line
per scenario (``workload: fairness``), then a summary line with the ratios. The figures mean
something only on a quiet machine (the simulator, PostgreSQL and three z9 processes share the
cores); ``load1`` is in every line.

Usage::

    .venv/bin/python bench/fairness.py                    # every scenario (about 8 minutes)
    .venv/bin/python bench/fairness.py --quick            # backlog 50, flood 10 × 20, quiet 8 jobs
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
import time
from typing import Any

import aiohttp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from run import DEFAULT_DSN, BenchDB, emit, free_port  # noqa: E402

REGION = "dev-1"


def _pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))]


class Stack:
    """Simulator + api + scheduler + executor on a fresh database; tenants made on demand."""

    def __init__(self, admin_dsn: str, concurrency: int):
        self.admin_dsn, self.concurrency = admin_dsn, concurrency
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Any] = []

    async def __aenter__(self) -> "Stack":
        from z9.sim.server import SimConfig, start_simulator

        self.sim = await start_simulator(SimConfig(region=REGION))  # default latencies
        self.db = BenchDB(self.admin_dsn)
        await self.db.__aenter__()
        port = free_port()
        env = dict(os.environ, Z9_DATABASE_URL=self.db.dsn, Z9_LOG_LEVEL="WARNING",
                   Z9_EXECUTOR_CONCURRENCY=str(self.concurrency), Z9_API_RATE_LIMIT_PER_S="0",
                   Z9_REGIONS=json.dumps({REGION: {"url": self.sim.url, "token_id": self.sim.token_id,
                                                   "token_secret": self.sim.token_secret, "verify_ssl": False,
                                                   "images": ["debian-12"]}}))
        z9 = os.path.join(os.path.dirname(sys.executable), "z9")
        for args in (["api", "--port", str(port)], ["scheduler"], ["executor", "--region", REGION]):
            log = tempfile.TemporaryFile()
            self.logs.append(log)
            self.procs.append(subprocess.Popen([z9, *args], env=env, stdout=log, stderr=log))
        self.base = f"http://127.0.0.1:{port}/v1"
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=90))
        for _ in range(300):
            try:
                async with self.http.get(f"http://127.0.0.1:{port}/healthz") as r:
                    if r.status == 200:
                        return self
            except aiohttp.ClientError:
                pass
            if self.procs[0].poll() is not None:
                break
            await asyncio.sleep(0.1)
        raise RuntimeError("the API did not come up")

    async def __aexit__(self, *exc: Any) -> None:
        await self.http.close()
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        for log in self.logs:
            log.close()
        await self.db.__aexit__(*exc)
        await self.sim.stop()

    async def tenant(self, name: str) -> str:
        from z9.common import store
        from z9.common.db import connect

        conn = await connect(self.db.dsn)
        try:
            tenant = await store.tenant_upsert(conn, name)
            token = "z9t_" + secrets.token_urlsafe(32)
            await store.api_token_insert(conn, tenant, token)
        finally:
            await conn.close()
        return token

    async def create(self, token: str, name: str) -> str:
        async with self.http.post(f"{self.base}/volumes", headers={"Authorization": f"Bearer {token}"},
                                  json={"name": name, "region": REGION, "size_gib": 1}) as r:
            out = await r.json()
            if r.status != 202:
                raise RuntimeError(f"POST /volumes answered {r.status}: {out}")
            return out["job"]["id"]

    async def wait(self, token: str, job_id: str) -> dict[str, Any]:
        while True:
            async with self.http.get(f"{self.base}/jobs/{job_id}?wait_s=30",
                                     headers={"Authorization": f"Bearer {token}"}) as r:
                job = await r.json()
            if job["status"] in ("succeeded", "failed"):
                if job["status"] != "succeeded":
                    raise RuntimeError(f"job {job_id} failed: {job.get('error')}")
                return job

    async def flood(self, token: str, prefix: str, n: int) -> list[str]:
        """Queue ``n`` creates at once (16 requests in flight)."""
        sem = asyncio.Semaphore(16)

        async def one(i: int) -> str:
            async with sem:
                return await self.create(token, f"{prefix}-{i}")
        return list(await asyncio.gather(*(one(i) for i in range(n))))

    async def drained(self, token: str, jobs: list[str]) -> float:
        """Wait until every job of ``jobs`` succeeded (one long-poll at a time: a tenant's jobs end
        about in order); the monotonic time then."""
        for j in jobs:
            await self.wait(token, j)
        return time.monotonic()

    async def quiet(self, token: str, prefix: str, n: int) -> list[float]:
        """One create at a time, ``n`` times: each one's seconds from POST to succeeded."""
        out = []
        for i in range(n):
            t0 = time.monotonic()
            job = await self.create(token, f"{prefix}-{i}")
            await self.wait(token, job)
            out.append(time.monotonic() - t0)
        return out


def _latency(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "p50_ms": round(statistics.median(values) * 1000, 1),
            "p99_ms": round(_pct(values, 99) * 1000, 1), "max_ms": round(max(values) * 1000, 1)}


async def scenario(admin_dsn: str, name: str, concurrency: int, *, flooders: int, flood_n: int,
                   quiet_n: int) -> dict[str, Any]:
    async with Stack(admin_dsn, concurrency) as st:
        tokens = [await st.tenant(f"flood-{i}") for i in range(flooders)]
        quiet = await st.tenant("quiet") if quiet_n else None
        t0 = time.monotonic()
        queued = [await st.flood(tok, f"f{i}", flood_n) for i, tok in enumerate(tokens)] if flooders else []
        drains = [asyncio.create_task(st.drained(tok, jobs)) for tok, jobs in zip(tokens, queued)]
        lat = await st.quiet(quiet, "q", quiet_n) if quiet else []
        ends = await asyncio.gather(*drains)
        fields: dict[str, Any] = {"scenario": name, "concurrency": concurrency, "flooders": flooders,
                                  "flood_jobs": flood_n * flooders}
        if flooders:
            seconds = max(ends) - t0
            fields.update(seconds=round(seconds, 2), jobs_per_s=round(flood_n * flooders / seconds, 2))
        if lat:
            fields.update(_latency(lat))
        return emit("fairness", name, **fields)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", default=DEFAULT_DSN)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="smaller: backlog 50, flood 10 × 20, quiet 8")
    ap.add_argument("--skip-flood", action="store_true", help="only the one-backlog scenarios")
    a = ap.parse_args()
    backlog, flood_n, quiet_n = (50, 20, 8) if a.quick else (200, 100, 20)
    c = a.concurrency
    alone = await scenario(a.dsn, "alone", c, flooders=0, flood_n=0, quiet_n=quiet_n)
    b_alone = await scenario(a.dsn, "backlog", c, flooders=1, flood_n=backlog, quiet_n=0)
    b_with = await scenario(a.dsn, "backlog+quiet", c, flooders=1, flood_n=backlog, quiet_n=quiet_n)
    summary: dict[str, Any] = {
        "quiet_p99_ratio": round(b_with["p99_ms"] / alone["p99_ms"], 2),
        "quiet_p50_ratio": round(b_with["p50_ms"] / alone["p50_ms"], 2),
        "backlog_throughput_ratio": round(b_with["jobs_per_s"] / b_alone["jobs_per_s"], 3)}
    if not a.skip_flood:
        f_alone = await scenario(a.dsn, "flood", c, flooders=10, flood_n=flood_n, quiet_n=0)
        f_with = await scenario(a.dsn, "flood+quiet", c, flooders=10, flood_n=flood_n, quiet_n=quiet_n)
        summary.update(flood_quiet_p99_ratio=round(f_with["p99_ms"] / alone["p99_ms"], 2),
                       flood_quiet_p50_ratio=round(f_with["p50_ms"] / alone["p50_ms"], 2),
                       flood_throughput_ratio=round(f_with["jobs_per_s"] / f_alone["jobs_per_s"], 3))
    summary["targets_met"] = (summary["quiet_p99_ratio"] <= 2.0 and summary["backlog_throughput_ratio"] >= 0.9
                              and summary.get("flood_quiet_p99_ratio", 0) <= 2.0
                              and summary.get("flood_throughput_ratio", 1) >= 0.9)
    emit("fairness", "summary", **summary)


if __name__ == "__main__":
    asyncio.run(main())
