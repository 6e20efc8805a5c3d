#!/usr/bin/env python3
"""Address allocation benchmark (issue 8): ``POST /v1/addresses`` at concurrency 16 against one
pool, from one API process — target ≥ 800 allocations/s, p99 < 50 ms, zero duplicates — and
``POST /v1/servers`` through the same API (target ≥ 1,200 req/s).

Each round runs in a fresh database (``z9_bench_<random>``, created, migrated and dropped here),
with one pool of 65,534 allocatable IPs (a /16) in region ``bench`` and one ``z9 api`` process;
each endpoint gets a 1 s warm-up first (not measured: the API's connection pool grows).
Load comes from ``wrk`` (``apt-get install -y wrk``), like W6 of ``bench/run.py``. After the
allocations the script checks the database: every 202 answer is one address row, and no IP is
held by two live addresses (``duplicates``, must be 0). Figures are JSON lines (the fields of
``bench/run.py``, plus ``requests_per_s``, ``errors``, ``non_2xx``, ``addresses``, ``duplicates``,
``api_cpu_us_per_request``).

The figures mean something only on a quiet machine: on a shared one the API, PostgreSQL and
wrk compete with everything else for the same cores.

Usage::

    .venv/bin/python bench/addresses.py                       # 3 rounds of 20 s each
    .venv/bin/python bench/addresses.py --rounds 1 --duration 3   # a smoke run
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from typing import Any

import asyncpg

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from run import (DEFAULT_DSN, WRK_DONE, WRK_POST, BenchDB, _proc_cpu, emit, emit_median,  # noqa: E402
                 free_port, server_info)

REGION = "bench"
POOL = {"name": "public", "cidr": "10.64.0.0/16", "gateway": "10.64.0.1", "nameservers": ["10.64.0.1"]}

WRK_ADDRESS = r"""
request = function()
  return wrk.format("POST", "/v1/addresses", {["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer %s"}, '{"region":"bench"}')
end
"""

async def _api(dsn: str) -> tuple[subprocess.Popen, int, Any]:
    port = free_port()
    # no per-token rate limit (issue 12's 20/s default): one token drives the whole benchmark
    env = dict(os.environ, Z9_DATABASE_URL=dsn, Z9_LOG_LEVEL="WARNING", Z9_API_RATE_LIMIT_PER_S="0",
               Z9_REGIONS=json.dumps({REGION: {"url": "https://127.0.0.1:9", "token_secret": "x",
                                               "images": ["debian-12"], "address_pools": [POOL]}}))
    z9 = os.path.join(os.path.dirname(sys.executable), "z9")
    log = tempfile.TemporaryFile()
    api = subprocess.Popen([z9, "api", "--port", str(port)], env=env, stdout=log, stderr=log)
    import aiohttp

    async with aiohttp.ClientSession() as s:
        for _ in range(300):
            try:
                async with s.get(f"http://127.0.0.1:{port}/healthz") as r:
                    if r.status == 200:
                        return api, port, log
            except aiohttp.ClientError:
                pass
            if api.poll() is not None:
                break
            await asyncio.sleep(0.1)
    log.seek(0)
    raise RuntimeError(f"the API did not come up: {log.read().decode(errors='replace')[-2000:]}")


async def _wrk(port: int, script: str, connections: int, duration_s: int, api_pid: int) -> tuple[dict, float]:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script + WRK_DONE)
    try:
        cpu0 = _proc_cpu(api_pid)
        res = await asyncio.to_thread(
            subprocess.run, ["wrk", "-t2", f"-c{connections}", f"-d{duration_s}s", "--timeout", "5s",
                             "-s", f.name, f"http://127.0.0.1:{port}"], capture_output=True, text=True)
        cpu = _proc_cpu(api_pid) - cpu0
    finally:
        os.unlink(f.name)
    m = re.search(r"JSON(\{.*\})", res.stdout)
    if not m:
        raise RuntimeError(f"wrk failed: {res.stdout}\n{res.stderr}")
    return json.loads(m.group(1)), cpu


async def round_(admin_dsn: str, rnd: int, connections: int, duration_s: int) -> list[dict[str, Any]]:
    from z9.common import store
    from z9.common.db import connect

    out = []
    async with BenchDB(admin_dsn) as db:
        conn = await connect(db.dsn)
        try:
            tenant = await store.tenant_upsert(conn, f"bench-{rnd}-{secrets.token_hex(3)}")
            token = "z9t_" + secrets.token_urlsafe(32)
            await store.api_token_insert(conn, tenant, token)
        finally:
            await conn.close()
        api, port, log = await _api(db.dsn)
        try:
            for endpoint, script, warm in (
                    ("POST /v1/addresses", WRK_ADDRESS % token, WRK_ADDRESS % token),
                    # server names must not repeat: the warm-up has its own prefix
                    ("POST /v1/servers", WRK_POST % (f"r{rnd}", token), WRK_POST % (f"w{rnd}", token))):
                await _wrk(port, warm, connections, 1, api.pid)  # warm-up (the API's pool grows to 16)
                d, cpu = await _wrk(port, script, connections, duration_s, api.pid)
                secs = d["duration_us"] / 1e6
                extra: dict[str, Any] = {}
                if endpoint == "POST /v1/addresses":
                    c = await asyncpg.connect(db.dsn)
                    try:
                        extra["addresses"] = await c.fetchval("SELECT count(*) FROM addresses")
                        extra["duplicates"] = await c.fetchval(
                            "SELECT count(*) FROM (SELECT ip FROM addresses WHERE status <> 'deleted'"
                            " GROUP BY region, ip HAVING count(*) > 1) d")
                        extra["jobs"] = await c.fetchval("SELECT count(*) FROM jobs WHERE kind = 'AddressCreate'")
                    finally:
                        await c.close()
                errors = d["connect"] + d["read"] + d["write"] + d["timeout"] + d["status"]
                out.append(emit("addresses", rnd, n=d["requests"], concurrency=connections, endpoint=endpoint,
                                requests_per_s=round(d["requests"] / secs, 1), seconds=round(secs, 3),
                                p50_ms=d["p50_us"] / 1000, p90_ms=d["p90_us"] / 1000, p99_ms=d["p99_us"] / 1000,
                                max_ms=d["max_us"] / 1000, errors=errors,
                                api_cpu_us_per_request=round(cpu / max(d["requests"], 1) * 1e6, 1), **extra))
        finally:
            api.terminate()
            try:
                api.wait(timeout=10)
            except subprocess.TimeoutExpired:
                api.kill()
            log.close()
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", default=os.environ.get("Z9_BENCH_DATABASE_URL", DEFAULT_DSN))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--duration", type=int, default=20, help="seconds per endpoint and round")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("bench/addresses.py needs wrk (apt-get install -y wrk)")
    await server_info(args.dsn)
    rounds: list[dict[str, Any]] = []
    for rnd in range(1, args.rounds + 1):
        rounds += await round_(args.dsn, rnd, args.concurrency, args.duration)
    for endpoint in ("POST /v1/addresses", "POST /v1/servers"):
        mine = [r for r in rounds if r["endpoint"] == endpoint]
        extra = {"duplicates": sum(r.get("duplicates", 0) for r in mine)} if "addresses" in endpoint else {}
        emit_median("addresses", mine, **extra)


if __name__ == "__main__":
    asyncio.run(main())
