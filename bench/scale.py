#!/usr/bin/env python3
"""A region of 10,000 VMs (issue 13 §4): server creates spread over R regions, each region one
``z9 sim`` seeded with N customer-shaped VMs over M nodes and served by E executor processes —
jobs/s, Proxmox requests per job, executor CPU per job and job latency, compared with the same run
at a small region size (``--compare-vms``, default 100). Goal: the cost per job does not depend on
the region's size (≤ 1.2× at 10,000 VMs).

Each size runs in a fresh database (``z9_bench_<random>``, created, migrated and dropped here) with
its own simulators (``z9 sim --seed-vms N``, the simulator's default latencies: 1 s per task, guest
boot 1 s, stats lag 10 s), one ``z9 api``, one ``z9 scheduler`` and E ``z9 executor --region R``
per region (separate processes, as in production). The creates go through ``POST /v1/servers``
(all of them sent first, as fast as the API takes them), and the clock runs from the first POST to
the last job finished. Figures per size (one JSON line each, then one ``compare`` line):

- ``jobs_per_s``: creates / (last finish − first POST);
- ``pve_requests_per_job`` (and ``lists_per_job``, ``clone_requests_per_job``): the simulators'
  request counters (every request z9 sent, all regions) / creates;
- ``executor_cpu_ms_per_job``: user + system CPU of every executor process / creates;
- ``p50/p99_run_s``: a job's run time (first claim → finished), ``p99_latency_s`` (created →
  finished), from the job rows; ``failed``: jobs not succeeded (must be 0); ``duplicates``:
  servers with other than exactly one VM (must be 0);
- ``load1`` before and after: the figures mean something only on a quiet machine (the
  simulators, executors, API and PostgreSQL share its cores).

``--region-cap K`` sets the region settings' cap on concurrent jobs (``max_concurrent_jobs``,
enforced in the claim across all the region's executors); without it a region runs up to E ×
``--concurrency`` jobs at once. ``peak_running_per_region``: the most running jobs (unexpired
leases) of any one region, sampled from the job table every 0.2 s while the creates drain
(≤ K with a cap).

Usage::

    .venv/bin/python bench/scale.py                  # 10 regions × 10,000 VMs / 10 nodes, 2,000 creates, vs 100 VMs
    .venv/bin/python bench/scale.py --regions 2 --vms 2000 --creates 60 --executors 2   # a smoke run
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from run import DEFAULT_DSN, BenchDB, _proc_cpu, load1, now_iso, pct  # noqa: E402

Z9 = os.path.join(os.path.dirname(sys.executable), "z9")
SECRET = "bench-" + secrets.token_hex(8)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Procs:
    """Child processes (each in its own process group), their logs, stopped in reverse order."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "wb")
        p = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((name, p))
        return p

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        for _, p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for name, p in reversed(self.procs):
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


async def start_sim(procs: Procs, region: str, vms: int, nodes: int) -> dict[str, Any]:
    """One ``z9 sim`` for ``region``; returns its region settings (url, token, CA)."""
    secret_file = procs.tmp / "sim-secret"
    secret_file.write_text(SECRET)
    port = free_port()
    cert_dir = procs.tmp / f"cert-{region}"
    env = dict(os.environ)
    procs.start(f"sim-{region}", [Z9, "sim", "--port", str(port), "--region", region,
                                  "--nodes", ",".join(f"pve{i + 1}" for i in range(nodes)),
                                  "--seed-vms", str(vms), "--cert-dir", str(cert_dir),
                                  "--token-secret-file", str(secret_file)], env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if "url=" in procs.log(f"sim-{region}"):
            break
        await asyncio.sleep(0.2)
    else:
        raise RuntimeError(f"simulator {region} did not start: {procs.log(f'sim-{region}')[-2000:]}")
    line = next(x for x in procs.log(f"sim-{region}").splitlines() if "url=" in x)
    cert = line.split(" cert=", 1)[1].split()[0]
    return {"url": f"https://127.0.0.1:{port}", "token_id": "root@pam!z9", "token_secret": SECRET,
            "verify_ssl": cert, "images": ["debian-12"]}


# /_sim/state of a 10,000-VM simulator on a loaded machine can take minutes (aiohttp's default: 5)
STATE_TIMEOUT = aiohttp.ClientTimeout(total=1800)


def breakdown(counters: list[dict[str, Any]], creates: int) -> dict[str, float]:
    """``{"METHOD /path/template": requests per create}`` over every simulator, most first (the
    ``/_sim/…`` admin calls are not requests z9 sent and are not counted by the simulator)."""
    per: dict[str, int] = {}
    for c in counters:
        for x in c["requests"]:
            key = f"{x['method']} {x['path']}"
            per[key] = per.get(key, 0) + int(x["count"])
    return {k: round(v / max(creates, 1), 2) for k, v in sorted(per.items(), key=lambda kv: (-kv[1], kv[0]))}


async def sim_counters(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession(timeout=STATE_TIMEOUT) as s:
        async with s.get(url + "/_sim/counters", ssl=False) as r:
            return await r.json()


def region_cap_supported() -> bool:
    from z9.common.settings import RegionSettings

    return "max_concurrent_jobs" in RegionSettings.model_fields


async def run_size(admin_dsn: str, args: argparse.Namespace, vms: int) -> dict[str, Any]:
    regions = [f"r{i + 1:02d}" for i in range(args.regions)]
    with tempfile.TemporaryDirectory(prefix="z9-scale-") as tmp:
        procs = Procs(Path(tmp))
        try:
            async with BenchDB(admin_dsn) as db:
                region_cfg = {}
                for r in regions:
                    region_cfg[r] = await start_sim(procs, r, vms, args.nodes)
                    if args.region_cap and region_cap_supported():
                        region_cfg[r]["max_concurrent_jobs"] = args.region_cap
                    if args.snapshot_s is not None:
                        region_cfg[r]["resources_snapshot_s"] = args.snapshot_s
                env = dict(os.environ, Z9_DATABASE_URL=db.dsn, Z9_LOG_LEVEL="WARNING", Z9_API_RATE_LIMIT_PER_S="0",
                           Z9_REGIONS=json.dumps(region_cfg), Z9_EXECUTOR_CONCURRENCY=str(args.concurrency),
                           Z9_METRICS_PORT="0")
                conn = await asyncpg.connect(db.dsn)
                try:
                    from z9.common import store

                    tenant = await store.tenant_upsert(conn, f"bench-scale-{secrets.token_hex(3)}")
                    token = "z9t_" + secrets.token_urlsafe(32)
                    await store.api_token_insert(conn, tenant, token)
                finally:
                    await conn.close()
                port = free_port()
                procs.start("api", [Z9, "api", "--port", str(port)], env)
                procs.start("scheduler", [Z9, "scheduler"], env)
                executors = [procs.start(f"executor-{r}-{k}", [Z9, "executor", "--region", r], env)
                             for r in regions for k in range(args.executors)]
                base = f"http://127.0.0.1:{port}/v1"
                async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as http:
                    for _ in range(300):
                        try:
                            async with http.get(f"http://127.0.0.1:{port}/healthz") as resp:
                                if resp.status == 200:
                                    break
                        except aiohttp.ClientError:
                            pass
                        await asyncio.sleep(0.1)
                    await asyncio.sleep(2.0)  # executors connected and listening
                    cpu0 = {p.pid: _proc_cpu(p.pid) for p in executors}
                    sims = [p for name, p in procs.procs if name.startswith("sim-")]
                    sim_cpu0 = {p.pid: _proc_cpu(p.pid) for p in sims}
                    load_before = load1()
                    t0 = time.time()
                    sem = asyncio.Semaphore(16)

                    async def create(i: int) -> str:
                        body = {"name": f"s-{i:05d}", "region": regions[i % len(regions)], "image": "debian-12",
                                "cores": 1, "memory_mib": 1024, "disk_gib": 10}
                        async with sem:
                            for _ in range(20):
                                async with http.post(f"{base}/servers", json=body) as resp:
                                    if resp.status == 202:
                                        return (await resp.json())["server"]["id"]
                                    if resp.status not in (429, 503):
                                        raise RuntimeError(f"POST /servers: {resp.status} {await resp.text()}")
                                await asyncio.sleep(0.5)
                        raise RuntimeError("POST /servers kept answering 429/503")

                    server_ids = await asyncio.gather(*(create(i) for i in range(args.creates)))
                conn = await asyncpg.connect(db.dsn)
                try:
                    deadline = time.monotonic() + args.timeout
                    peak_running = 0
                    while True:
                        left = await conn.fetchval(
                            "SELECT count(*) FROM jobs WHERE kind = 'ServerCreate' AND status NOT IN ('succeeded', 'failed')")
                        peak_running = max(peak_running, await conn.fetchval(
                            "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM jobs WHERE status = 'running' "
                            "AND lease_expires_at > now() GROUP BY region) AS per_region"))
                        if left == 0 or time.monotonic() > deadline:
                            break
                        await asyncio.sleep(0.2)
                    cpu = sum(_proc_cpu(p.pid) - cpu0[p.pid] for p in executors)
                    sim_cpu = sum(_proc_cpu(p.pid) - sim_cpu0[p.pid] for p in sims)
                    rows = await conn.fetch(
                        "SELECT status, extract(epoch FROM created_at) AS c, extract(epoch FROM started_at) AS s, "
                        "extract(epoch FROM finished_at) AS f FROM jobs WHERE kind = 'ServerCreate'")
                finally:
                    await conn.close()
                load_after = load1()
                done = [r for r in rows if r["f"] is not None]
                end = max((float(r["f"]) for r in done), default=time.time())
                counters = [await sim_counters(region_cfg[r]["url"]) for r in regions]
                dup = 0  # servers with other than exactly one VM carrying their identity tag
                from z9.common.tags import identity_tag, normalize_tags

                # (the tags from the API's own listing, fresh in /cluster/resources, read after the
                # counters; /_sim/state would evaluate every seeded guest's boot: minutes at 10,000)
                async with aiohttp.ClientSession(timeout=STATE_TIMEOUT) as s:
                    for k, r in enumerate(regions):
                        cfg = region_cfg[r]
                        auth = {"Authorization": f"PVEAPIToken={cfg['token_id']}={cfg['token_secret']}"}
                        async with s.get(cfg["url"] + "/api2/json/cluster/resources?type=vm", ssl=False,
                                         headers=auth) as resp:
                            listed = (await resp.json())["data"]
                        per: dict[str, int] = {}
                        for v in listed:
                            for t in normalize_tags(v.get("tags")):
                                per[t] = per.get(t, 0) + 1
                        mine = server_ids[k::len(regions)]
                        dup += sum(1 for sid in mine if per.get(identity_tag(sid), 0) != 1)

                def reqs(pred: Any) -> int:
                    return sum(x["count"] for c in counters for x in c["requests"] if pred(x))

                n = len(rows)
                total = reqs(lambda x: True)
                run_s = [float(r["f"]) - float(r["s"]) for r in done if r["s"] is not None]
                lat_s = [float(r["f"]) - float(r["c"]) for r in done]
                line = {
                    "lib": "z9", "workload": "scale_creates", "regions": args.regions, "vms_per_region": vms,
                    "nodes": args.nodes, "executors_per_region": args.executors, "concurrency": args.concurrency,
                    "region_cap": args.region_cap if region_cap_supported() else None, "snapshot_s": args.snapshot_s,
                    "peak_running_per_region": peak_running,
                    "creates": n, "failed": sum(1 for r in rows if r["status"] != "succeeded"), "duplicates": dup,
                    "seconds": round(end - t0, 2), "jobs_per_s": round(len(done) / max(end - t0, 1e-9), 2),
                    "pve_requests_per_job": round(total / max(n, 1), 2),
                    # the per-create breakdown: every endpoint's requests / creates
                    "pve_requests_per_job_by_endpoint": breakdown(counters, n),
                    "lists_per_job": round(reqs(lambda x: x["path"] == "/cluster/resources") / max(n, 1), 3),
                    "clone_requests_per_job": round(reqs(lambda x: x["method"] == "POST" and x["path"].endswith("/clone"))
                                                    / max(n, 1), 3),
                    "executor_cpu_ms_per_job": round(cpu * 1000 / max(n, 1), 1),
                    "simulator_cpu_ms_per_job": round(sim_cpu * 1000 / max(n, 1), 1),
                    "p50_run_s": round(pct(run_s, 50), 2) if run_s else None,
                    "p99_run_s": round(pct(run_s, 99), 2) if run_s else None,
                    "p99_latency_s": round(pct(lat_s, 99), 2) if lat_s else None,
                    "load1_before": round(load_before, 2), "load1_after": round(load_after, 2), "at": now_iso(),
                }
                print(json.dumps(line), flush=True)
                return line
        finally:
            procs.stop()


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", default=os.environ.get("Z9_BENCH_DSN", DEFAULT_DSN))
    p.add_argument("--regions", type=int, default=10)
    p.add_argument("--vms", type=int, default=10_000, help="seeded VMs per region")
    p.add_argument("--compare-vms", type=int, default=100, help="the small region size to compare with (0: none)")
    p.add_argument("--nodes", type=int, default=10)
    p.add_argument("--creates", type=int, default=2000)
    p.add_argument("--executors", type=int, default=2, help="executor processes per region")
    p.add_argument("--concurrency", type=int, default=8, help="jobs at once per executor process")
    p.add_argument("--region-cap", type=int, default=None,
                   help="per-region cap on concurrent jobs across executors (max_concurrent_jobs)")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--snapshot-s", type=float, default=None,
                   help="the regions' resources_snapshot_s (default: the setting's default)")
    p.add_argument("--own-server", choices=("auto", "yes", "no"), default="auto",
                   help="run on a PostgreSQL of the benchmark's own (Debian's initdb, a temp folder, "
                        "max_connections sized to the run): 'auto' when the server at --dsn allows too "
                        "few connections for regions × executors × (concurrency + 6)")
    args = p.parse_args()
    own = await maybe_own_server(args)
    try:
        await _main(args)
    finally:
        if own is not None:
            own.stop()
            from pgcluster import remove_workdir

            remove_workdir(own.datadir.parent)


def connections_needed(args: argparse.Namespace) -> int:
    """Every executor's pool (C + 4), its LISTEN connection and a spare; the API, the scheduler and
    the benchmark's own connections."""
    return args.regions * args.executors * (args.concurrency + 6) + 60


async def maybe_own_server(args: argparse.Namespace) -> Any:
    need = connections_needed(args)
    if args.own_server == "no":
        return None
    if args.own_server == "auto":
        conn = await asyncpg.connect(args.dsn)
        try:
            have = int(await conn.fetchval("SHOW max_connections"))
        finally:
            await conn.close()
        if have >= need:
            return None
        print(f"# {args.dsn} allows {have} connections, the run needs about {need}: "
              "starting a PostgreSQL of the benchmark's own", file=sys.stderr, flush=True)
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
    from pgcluster import PgServer, free_port as pg_port, make_workdir, pg_bindir

    bindir = pg_bindir()
    if bindir is None:
        raise SystemExit(f"the run needs about {need} connections and no Debian PostgreSQL binaries "
                         "(initdb) are installed: pass --dsn of a server with max_connections >= that")
    work = make_workdir("z9-scale-pg-")
    # the machine's defaults but for the connections: fsync and synchronous_commit on
    server = PgServer(bindir, work / "data", pg_port(), "scale").initdb(max_connections=str(need + 40))
    server.conf(fsync="on", synchronous_commit="on")  # the last line wins over initdb()'s fsync=off
    server.start()
    args.dsn = server.url()
    return server


async def _main(args: argparse.Namespace) -> None:
    print(json.dumps({"lib": "z9", "workload": "environment", "cpus": os.cpu_count(), "load1": round(load1(), 2),
                      "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
                      "at": now_iso(), "dsn_host": args.dsn.split("@")[-1].split("/")[0]}), flush=True)
    big = await run_size(args.dsn, args, args.vms)
    if args.compare_vms:
        small = await run_size(args.dsn, args, args.compare_vms)
        ratio = {k: round(big[k] / small[k], 2) if small.get(k) else None
                 for k in ("pve_requests_per_job", "executor_cpu_ms_per_job", "simulator_cpu_ms_per_job", "p50_run_s", "p99_run_s", "p99_latency_s")}
        ratio["jobs_per_s"] = round(small["jobs_per_s"] / big["jobs_per_s"], 2) if big["jobs_per_s"] else None
        print(json.dumps({"lib": "z9", "workload": "scale_compare", "big_vms": args.vms, "small_vms": args.compare_vms,
                          "cost_ratio_big_over_small": ratio, "goal": "<= 1.2", "at": now_iso()}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
