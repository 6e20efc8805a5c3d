#!/usr/bin/env python3
"""Load balancer configure benchmark (issue 10): one target change on an ``lb-ha`` with 200
targets — rendered, pushed, validated, reloaded and verified on both appliances — target ≤ 2 s
with the simulator's default latencies (``SimConfig()``: tasks 0.2 s, guest boot 1 s).

Everything runs in this process except PostgreSQL: the simulator over HTTPS (its defaults), the
API app on a free port, one executor and the scheduler (z9's own classes), against a fresh
database (``z9_bench_<random>``, created, migrated and dropped here). Setup (not measured):
the appliance template, an ``lb-ha`` with 200 IP targets (its LoadBalancerCreate). Then each
round: ``POST …/actions/add_target`` (round 1) or ``remove_target`` (round 2, …alternating), and
the time until its LoadBalancerConfigure job is ``succeeded``; where the time goes comes from
the job's steps (``push_haproxy`` per appliance: write, ``haproxy -c``, swap and reload) and the
remainder (claim, observe — which reads both running files back —, verify and the health read).

Figures are JSON lines. They mean something only on a quiet machine.

Usage::

    .venv/bin/python bench/lb_configure.py                 # 5 rounds
    .venv/bin/python bench/lb_configure.py --rounds 1      # a smoke run
    Z9_BENCH_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres (default)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from z9.common import store  # noqa: E402
from z9.common.db import connect, create_pool  # noqa: E402
from z9.common.settings import AddressPoolSettings, RegionSettings, Settings  # noqa: E402
from z9.db import migrate  # noqa: E402
from z9.sim.server import SimConfig, start_simulator  # noqa: E402

REGION = "bench"
TEMPLATE = {"vmid": 9100, "node": "pve1", "config": {
    "name": "z9-lb-appliance", "template": "1", "cores": "1", "memory": "1024", "ostype": "l26",
    "scsihw": "virtio-scsi-single", "scsi0": "local-lvm:base-9100-disk-0,size=2G",
    "ide2": "local-lvm:vm-9100-cloudinit,media=cdrom", "boot": "order=scsi0",
    "net0": "virtio=BC:24:11:91:00:00,bridge=vmbr0", "agent": "1", "tags": "z9-image"},
    # the image's disk state (the simulator's appliance model): its NIC is ens18, read by z9 from the guest
    "guest": {"models": {"appliance": {"nic_names": "predictable"}}}}


def _ts(v: str | None) -> float | None:
    return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp() if v else None


async def main(rounds: int, targets: int) -> None:
    from aiohttp import web

    from z9.api.app import create_app
    from z9.executor.worker import Executor
    from z9.scheduler import Scheduler

    admin_url = os.environ.get("Z9_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    name = f"z9_bench_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(admin_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    dsn = admin_url.rsplit("/", 1)[0] + "/" + name
    tmp = Path(tempfile.mkdtemp(prefix="z9-bench-lb-"))
    sim = await start_simulator(SimConfig(region=REGION), cert_dir=tmp)
    services: list[Any] = []
    runner = None
    pool = None
    try:
        conn = await connect(dsn)
        await migrate(conn)
        await conn.close()
        settings = Settings(database_url=dsn, regions={REGION: RegionSettings(
            url=sim.url, token_id=sim.token_id, token_secret=sim.token_secret, verify_ssl=str(sim.cert_path),
            address_pools=[AddressPoolSettings(name="public", cidr="10.99.0.0/24", gateway="10.99.0.1",
                                               range=["10.99.0.10", "10.99.0.250"])])},
            lb_health_interval_s=3600, api_rate_limit_per_s=0)
        pool = await create_pool(dsn, min_size=1, max_size=8)
        runner = web.AppRunner(create_app(settings, pool=pool))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        tenant = await store.tenant_upsert(pool, "bench")
        token = "z9t_" + secrets.token_urlsafe(24)
        await store.api_token_insert(pool, tenant, token)
        for svc in (Executor(settings, [REGION]), Scheduler(settings)):
            services.append((svc, asyncio.create_task(svc.run())))
        base, auth = f"http://127.0.0.1:{port}/v1", {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession(headers=auth) as http:
            async with http.post(f"{sim.url}/_sim/vms", json=TEMPLATE, ssl=False) as r:
                assert r.status == 200, await r.text()

            async def call(method: str, path: str, **kw: Any) -> Any:
                async with http.request(method, base + path, **kw) as r:
                    body = await r.json()
                    assert r.status < 300, body
                    return body

            async def wait(job_id: str, timeout_s: float = 600) -> dict:
                end = time.monotonic() + timeout_s
                while time.monotonic() < end:
                    j = await call("GET", f"/jobs/{job_id}")
                    if j["status"] in ("succeeded", "failed"):
                        return j
                    await asyncio.sleep(0.01)
                raise TimeoutError(job_id)

            body = {"name": "bench", "region": REGION, "type": "lb-ha",
                    "services": [{"protocol": "tcp", "listen_port": 80, "destination_port": 8080}],
                    "targets": [{"type": "ip", "ip": f"10.98.{i // 250}.{i % 250 + 1}"} for i in range(targets)]}
            out = await call("POST", "/load-balancers", json=body)
            lb = out["load_balancer"]["id"]
            created = await wait(out["job"]["id"])
            assert created["status"] == "succeeded", created
            times = []
            for n in range(rounds):
                action = "add_target" if n % 2 == 0 else "remove_target"
                t0 = time.monotonic()
                out = await call("POST", f"/load-balancers/{lb}/actions/{action}",
                                 json={"type": "ip", "ip": "10.97.0.1"})
                job = await wait(out["job"]["id"])
                wall = time.monotonic() - t0
                assert job["status"] == "succeeded", job
                steps = {f"{s['name']}:{s['detail'].get('member')}":
                         round(_ts(s["finished_at"]) - _ts(s["started_at"]), 3)
                         for s in job["steps"] if s.get("started_at") and s.get("finished_at")}
                times.append(wall)
                # the rest, split by the job's own timestamps: created → claimed (NOTIFY, claim),
                # claimed → first step (observe: both appliances' VMs and running files), last step →
                # finished (verify: observe again, VIP and show stat on both, and the record)
                ran = [s for s in job["steps"] if s.get("started_at") and s.get("finished_at")]
                split = {}
                if ran and job.get("started_at") and job.get("finished_at"):
                    split = {"claim_s": round(_ts(job["started_at"]) - _ts(job["created_at"]), 3),
                             "observe_s": round(min(_ts(s["started_at"]) for s in ran) - _ts(job["started_at"]), 3),
                             "verify_s": round(_ts(job["finished_at"]) - max(_ts(s["finished_at"]) for s in ran), 3)}
                print(json.dumps({"bench": "lb_configure", "round": n + 1, "targets": targets, "action": action,
                                  "seconds": round(wall, 3), "steps_s": steps,
                                  "rest_s": round(wall - sum(steps.values()), 3), **split, "target_s": 2.0}),
                      flush=True)
            print(json.dumps({"bench": "lb_configure", "rounds": rounds, "median_s": round(statistics.median(times), 3),
                              "max_s": round(max(times), 3), "target_s": 2.0,
                              "quiet_machine": "figures need a quiet machine"}), flush=True)
    finally:
        for svc, task in services:
            svc.stop()
            try:
                await asyncio.wait_for(task, 30)
            except Exception:  # noqa: BLE001 - best effort on the way out
                task.cancel()
        if runner is not None:
            await runner.cleanup()
        if pool is not None:
            await pool.close()
        await sim.stop()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--targets", type=int, default=200)
    a = ap.parse_args()
    asyncio.run(main(a.rounds, a.targets))
