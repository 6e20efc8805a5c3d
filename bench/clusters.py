#!/usr/bin/env python3
"""Kubernetes cluster benchmark (issue 11): time from ``POST /v1/clusters`` to ``running`` for a
3 + N cluster against the Proxmox VE simulator **with its default latencies** (``SimConfig``:
tasks 0.2 s, guest boot 1 s, cloud-init 1 s; the kubeadm model's API comes up 1 s after init), and
how it scales from 3 + 2 to 3 + 30 members. Members after cp-0 boot in parallel (one ``join``
step), so the time should grow far slower than the member count: a serial create would add
≈ (clone + upload + boot + cloud-init) per member.

Each size runs in a fresh database (``z9_bench_<random>``) with its own simulator (in this
process, HTTPS on a free port) and ``z9 api``, ``z9 scheduler``, ``z9 executor`` processes
(executor concurrency 8). One JSON line per cluster (``workload: clusters``): ``members``,
``seconds`` (POST to running), ``steps`` (each step's duration, from the job row), ``attempts``,
``uploads`` (imgcopy tasks), ``clones`` (qmclone tasks), ``load1``.

Figures mean something only on a quiet machine (the simulator, PostgreSQL and three z9 processes
share the cores).

Usage::

    .venv/bin/python bench/clusters.py                       # 3+2, 3+10, 3+30, 1 round each
    .venv/bin/python bench/clusters.py --sizes 2 --rounds 1  # a smoke run
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from typing import Any

import aiohttp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from run import DEFAULT_DSN, BenchDB, emit, free_port, server_info  # noqa: E402

REGION = "dev-1"
POOL = {"name": "public", "cidr": "10.64.0.0/16", "gateway": "10.64.0.1", "nameservers": ["10.64.0.1"]}


async def _wait_http(url: str, proc: subprocess.Popen, what: str) -> None:
    async with aiohttp.ClientSession() as s:
        for _ in range(300):
            try:
                async with s.get(url) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if proc.poll() is not None:
                break
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{what} did not come up")


def _ts(s: str | None) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp() if s else 0.0


async def one(admin_dsn: str, rnd: int, workers: int, timeout_s: float) -> dict[str, Any]:
    from z9.common import store
    from z9.common.db import connect
    from z9.common.pki import InstallationKey
    from z9.sim.server import SimConfig, start_simulator

    sim = await start_simulator(SimConfig(region=REGION))  # default latencies
    procs: list[subprocess.Popen] = []
    logs = []
    try:
        async with BenchDB(admin_dsn) as db:
            conn = await connect(db.dsn)
            try:
                tenant = await store.tenant_upsert(conn, f"bench-k8s-{rnd}-{secrets.token_hex(3)}")
                token = "z9t_" + secrets.token_urlsafe(32)
                await store.api_token_insert(conn, tenant, token)
            finally:
                await conn.close()
            port = free_port()
            env = dict(os.environ, Z9_DATABASE_URL=db.dsn, Z9_LOG_LEVEL="WARNING",
                       Z9_INSTALLATION_KEY=InstallationKey.generate(), Z9_EXECUTOR_CONCURRENCY="8", Z9_API_RATE_LIMIT_PER_S="0",
                       Z9_REGIONS=json.dumps({REGION: {"url": sim.url, "token_id": sim.token_id,
                                                       "token_secret": sim.token_secret, "verify_ssl": False,
                                                       "images": ["debian-12"], "address_pools": [POOL],
                                                       "nameservers": ["198.51.100.53"]}}))
            z9 = os.path.join(os.path.dirname(sys.executable), "z9")
            for args in (["api", "--port", str(port)], ["scheduler"], ["executor", "--region", REGION]):
                log = tempfile.TemporaryFile()
                logs.append(log)
                procs.append(subprocess.Popen([z9, *args], env=env, stdout=log, stderr=log))
            base = f"http://127.0.0.1:{port}/v1"
            await _wait_http(f"http://127.0.0.1:{port}/healthz", procs[0], "the API")
            hdr = {"Authorization": f"Bearer {token}"}
            body = {"name": f"bench-{workers}", "region": REGION, "version": "1.33",
                    "control_plane": {"count": 3, "cores": 2, "memory_mib": 4096, "disk_gib": 30},
                    "node_pools": [{"name": "workers", "count": workers, "cores": 2, "memory_mib": 4096,
                                    "disk_gib": 30}]}
            async with aiohttp.ClientSession(headers=hdr) as s:
                t0 = time.monotonic()
                async with s.post(f"{base}/clusters", json=body) as r:
                    out = await r.json()
                    assert r.status == 202, out
                cid, jid = out["cluster"]["id"], out["job"]["id"]
                while True:
                    async with s.get(f"{base}/jobs/{jid}") as r:
                        job = await r.json()
                    if job["status"] in ("succeeded", "failed"):
                        break
                    if time.monotonic() - t0 > timeout_s:
                        raise RuntimeError(f"cluster not running after {timeout_s}s: {job}")
                    await asyncio.sleep(0.1)
                seconds = time.monotonic() - t0
                async with s.get(f"{base}/clusters/{cid}") as r:
                    cluster = (await r.json())["cluster"]
            tasks = dict(sim.cluster.tasks_started)
            return emit("clusters", rnd, n=3 + workers, members=3 + workers, seconds=round(seconds, 2),
                        status=cluster["status"], job_status=job["status"], attempts=job["attempt"],
                        steps={st["name"]: round(_ts(st["finished_at"]) - _ts(st["started_at"]), 2)
                               for st in job["steps"]},
                        uploads=tasks.get("imgcopy"), clones=tasks.get("qmclone"),
                        error=(job.get("error") or {}).get("message") if job["status"] != "succeeded" else None)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        for log in logs:
            log.close()
        await sim.stop()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", default=os.environ.get("Z9_BENCH_DATABASE_URL", DEFAULT_DSN))
    ap.add_argument("--sizes", default="2,10,30", help="worker counts (the control plane is always 3)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900.0)
    args = ap.parse_args()
    await server_info(args.dsn)
    for rnd in range(1, args.rounds + 1):
        for workers in (int(x) for x in args.sizes.split(",")):
            await one(args.dsn, rnd, workers, args.timeout)


if __name__ == "__main__":
    asyncio.run(main())
