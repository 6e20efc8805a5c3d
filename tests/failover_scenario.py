"""The failover scenario of issue 13 §1, shared by ``tests/acceptance/test_ha.py`` (reduced) and
``bench/failover.py`` (long form).

A primary and a synchronous standby (``tests.pgcluster``); real ``z9`` processes (api,
scheduler, reaper, executors) whose ``Z9_DATABASE_URL`` names both hosts with
``target_session_attrs=read-write``; server creates submitted through the API before and after
the primary is SIGKILLed (postmaster and backends at once) and the standby promoted.

Figures (``Figures``): jobs lost (a 202'd job that never succeeded), jobs run twice at once (two
running intervals of one resource overlapping, from a trigger's log replicated with everything
else), committed rows that disappeared (a server or job the API answered 202 for, missing on the
new primary), servers with other than one VM, clone tasks beyond one per server (the world's
view of "run twice"), and the seconds from the kill until every
listening service has its LISTEN on the new primary (from the services' own JSON log lines) and
until the first job submitted after the kill succeeded (catch-up claim done).
"""
from __future__ import annotations

import asyncio
import json
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from z9.common import store
from z9.common.db import connect
from z9.common.settings import Settings
from z9.common.tags import identity_tag
from z9.db import migrate

from tests.pgcluster import PgServer, free_port, primary_and_standby, remove_workdir, wait_sync_standby
from tests.support import REGION, Services, SimAdmin, install_job_log, job_log, overlapping, runs, service_env, wait_until

FAST = dict(lease_ttl_s=3, heartbeat_s=0.5, task_poll_s=0.1, poll_interval_s=1, scheduler_interval_s=0.2,
            reaper_interval_s=0.5, backoff_base_s=0.2, backoff_cap_s=1, snooze_s=0.2, uncertain_window_s=1,
            shutdown_grace_s=5, task_deadline_s=120)


@dataclass
class Figures:
    accepted: int = 0
    jobs_lost: int = 0
    jobs_run_twice_at_once: int = 0
    committed_rows_disappeared: int = 0
    servers_without_exactly_one_vm: int = 0
    duplicate_clones: int = 0  # clone tasks the simulator ran beyond one per accepted server
    listen_on_new_primary_s: float = 0.0
    first_new_job_succeeded_s: float = 0.0
    services_on_new_primary: dict[str, str] = field(default_factory=dict)
    detail: list[str] = field(default_factory=list)


def ha_url(primary: PgServer, standby: PgServer, database: str = "z9") -> str:
    return (f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/{database}"
            "?target_session_attrs=read-write")


async def _post_until_accepted(http: aiohttp.ClientSession, base: str, token: str, name: str,
                               deadline_s: float) -> dict[str, Any]:
    """POST a server create, retried with one Idempotency-Key through 503s and resets until 202."""
    key = secrets.token_hex(8)
    body = {"name": name, "region": REGION, "image": "debian-12", "cores": 1, "memory_mib": 512, "disk_gib": 10}
    async def accepted() -> dict[str, Any] | None:
        try:
            async with http.post(f"{base}/servers", json=body, headers={
                    "Authorization": f"Bearer {token}", "Idempotency-Key": key}) as r:
                out = await r.json()
                if r.status == 202:
                    return out
                if r.status != 503:
                    raise AssertionError(f"POST /servers {name}: {r.status} {out}")
        except (aiohttp.ClientError, asyncio.TimeoutError):
            pass
        return None
    return await wait_until(accepted, deadline_s, f"POST /servers {name} to be accepted (202)", interval_s=0.2)


def _listen_lines(log: str, port: int) -> list[float]:
    """Times (epoch s) of the service's 'LISTEN connection on 127.0.0.1:<port>' JSON lines."""
    out = []
    for line in log.splitlines():
        if f"LISTEN connection on 127.0.0.1:{port}" not in line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        out.append(datetime.fromisoformat(rec["ts"].replace("Z", "+00:00")).timestamp())
    return out


async def run(workdir: Path, base_settings: Settings, sim: SimAdmin, *, before: int, after: int,
              executors: int = 2, clone_s: float = 1.0, timeout_s: float = 120) -> Figures:
    """Build the pair, run the scenario (service logs in ``workdir``), tear everything down; the
    figures."""
    primary, standby = primary_and_standby()
    services: Services | None = None
    fig = Figures()
    try:
        wait_sync_standby(primary)
        admin = await asyncpg.connect(primary.url())
        await admin.execute("CREATE DATABASE z9")
        await admin.close()
        conn = await connect(primary.url("z9"))
        await migrate(conn)
        await install_job_log(conn)
        tenant = await store.tenant_upsert(conn, "failover")
        token = "z9t_" + secrets.token_urlsafe(32)
        await store.api_token_insert(conn, tenant, token)
        await conn.close()
        await sim.configure(task_seconds={"qmclone": clone_s})

        settings = base_settings.model_copy(update={"database_url": ha_url(primary, standby)})
        services = Services(service_env(settings, **FAST, log_format="json"), workdir)
        api_port = free_port()
        services.start("api", "--port", str(api_port))
        listening = [services.start("scheduler")]
        metrics_port = free_port()
        listening += [services.start("executor", metrics_port=metrics_port if i == 0 else 0)
                      for i in range(executors)]
        services.start("reaper")
        base = f"http://127.0.0.1:{api_port}/v1"
        for p in listening:
            await p.wait_log(rf"LISTEN connection on 127\.0\.0\.1:{primary.port}", 30)

        accepted: list[dict[str, Any]] = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            for i in range(before):
                accepted.append(await _post_until_accepted(http, base, token, f"pre-{i}", 30))
            # Kill while jobs run: wait until some are running (read from the primary).
            probe = await asyncpg.connect(primary.url("z9"))

            async def ready() -> bool:
                return bool(await probe.fetchval("SELECT count(*) FROM jobs WHERE status = 'running'"))
            await wait_until(ready, 20, 'await probe.fetchval("SELECT count(*) FROM jobs WHERE status = \'runni...')
            await probe.close()
            t_kill = time.time()
            primary.kill()
            standby.promote()
            t_promoted = time.time()
            fig.detail.append(f"promotion took {t_promoted - t_kill:.2f}s")
            late = [asyncio.create_task(_post_until_accepted(http, base, token, f"post-{i}", timeout_s))
                    for i in range(after)]
            late_out = await asyncio.gather(*late)
            accepted += late_out

            # Every service back: LISTEN on the new primary (after the kill).
            for p in listening:
                await p.wait_log(rf"LISTEN connection on 127\.0\.0\.1:{standby.port}", timeout_s)
                times = [t for t in _listen_lines(p.log(), standby.port) if t >= t_kill]
                fig.services_on_new_primary[p.name] = f"{max(0.0, min(times) - t_kill):.2f}s" if times else "?"
            back = [t for p in listening for t in _listen_lines(p.log(), standby.port) if t >= t_kill]
            fig.listen_on_new_primary_s = max(back) - t_kill if back else float("nan")
            async with http.get(f"http://127.0.0.1:{metrics_port}/metrics") as r:
                text = await r.text()
            want = f'z9_database_server_info{{connection="listen",server="127.0.0.1:{standby.port}"}} 1.0'
            if want not in text:
                fig.detail.append("executor metrics do not name the new primary")

            # Every accepted job ends; measure the first post-kill job's success.
            new = await asyncpg.connect(standby.url("z9"))
            try:
                late_ids = {o["job"]["id"] for o in late_out}
                first_ok = None
                deadline = time.monotonic() + timeout_s
                ids = [o["job"]["id"] for o in accepted]
                while time.monotonic() < deadline:
                    rows = await new.fetch("SELECT id, status, finished_at FROM jobs WHERE id = ANY($1)", ids)
                    done = [r for r in rows if r["status"] in ("succeeded", "failed")]
                    ok_late = [r["finished_at"].timestamp() for r in done
                               if r["id"] in late_ids and r["status"] == "succeeded"]
                    if ok_late and first_ok is None:
                        first_ok = min(ok_late)
                    if len(done) == len(ids):
                        break
                    await asyncio.sleep(0.2)
                fig.first_new_job_succeeded_s = (first_ok - t_kill) if first_ok else float("nan")
                fig.accepted = len(accepted)
                jobs = {r["id"]: r["status"] for r in await new.fetch("SELECT id, status FROM jobs WHERE id = ANY($1)", ids)}
                servers = {r["id"] for r in await new.fetch(
                    "SELECT id FROM servers WHERE id = ANY($1)", [o["server"]["id"] for o in accepted])}
                for o in accepted:
                    jid, sid = o["job"]["id"], o["server"]["id"]
                    if jid not in jobs or sid not in servers:
                        fig.committed_rows_disappeared += 1
                        fig.detail.append(f"missing after failover: job {jid in jobs} server {sid in servers}")
                    elif jobs[jid] != "succeeded":
                        fig.jobs_lost += 1
                        fig.detail.append(f"job {jid} ended {jobs[jid]}")
                    vms = await sim.vms_tagged(identity_tag(sid))
                    if len(vms) != 1:
                        fig.servers_without_exactly_one_vm += 1
                        fig.detail.append(f"server {sid}: {len(vms)} VMs")
                fig.jobs_run_twice_at_once = len(overlapping(runs(await job_log(new))))
                clones = (await sim.counters())["tasks_started"].get("qmclone", 0)
                fig.duplicate_clones = max(0, clones - len(accepted))
            finally:
                await new.close()
        return fig
    finally:
        if services is not None:
            for p in services.procs:
                p.signal(15)
            try:  # their last lines in the logs
                await wait_until(lambda: not any(p.alive() for p in services.procs), 5, "the services to exit")
            except AssertionError:
                pass
            fig.detail.append(services.logs()[-6000:] if fig.jobs_lost or fig.committed_rows_disappeared else "")
            services.close()
        standby.stop()
        primary.stop()
        remove_workdir(primary.datadir.parent)


@dataclass
class OldPrimaryFigures:
    """The failover with the old primary back writable and unfenced (issue "Nothing lost…" §3)."""

    accepted: int = 0
    jobs_lost: int = 0  # a 202'd job that did not succeed on the new primary
    jobs_run_twice_at_once: int = 0
    servers_without_exactly_one_vm: int = 0
    duplicate_clones: int = 0
    old_primary_writes: int = 0  # job rows the old primary changed after it came back
    refusals_logged: int = 0  # "refusing database server <old primary>" lines in the services' logs
    first_job_after_reset_s: float = 0.0  # from the connection reset to the first later job's success
    detail: list[str] = field(default_factory=list)


async def run_old_primary_back(workdir: Path, base_settings: Settings, sim: SimAdmin, *, before: int = 2,
                               between: int = 2, after: int = 3, timeout_s: float = 90) -> OldPrimaryFigures:
    """The primary SIGKILLed, the synchronous standby promoted, services on it; then the old primary
    started again, writable, on its old timeline and still waiting for a synchronous standby that
    is gone (nothing fences it), listed *first* in every service's URL (as a two-host URL written
    before the failover lists it); every z9 connection of the new primary reset and one executor
    restarted (a new process: no memory of the timeline). Creates submitted before the kill,
    between, and after the reset; the figures."""
    primary, standby = primary_and_standby()
    services: Services | None = None
    fig = OldPrimaryFigures()
    try:
        wait_sync_standby(primary)
        admin = await asyncpg.connect(primary.url())
        await admin.execute("CREATE DATABASE z9")
        await admin.close()
        conn = await connect(primary.url("z9"))
        await migrate(conn)
        await install_job_log(conn)
        tenant = await store.tenant_upsert(conn, "failover")
        token = "z9t_" + secrets.token_urlsafe(32)
        await store.api_token_insert(conn, tenant, token)
        await conn.close()
        await sim.configure(task_seconds={"qmclone": 0.5})

        settings = base_settings.model_copy(update={"database_url": ha_url(primary, standby)})
        services = Services(service_env(settings, **FAST, database_sync_commit_timeout_s=3, log_format="json"),
                            workdir)
        api_port = free_port()
        services.start("api", "--port", str(api_port))
        services.start("scheduler")
        executors = [services.start("executor") for _ in range(2)]
        services.start("reaper")
        base = f"http://127.0.0.1:{api_port}/v1"
        for p in executors:
            await p.wait_log(rf"LISTEN connection on 127\.0\.0\.1:{primary.port}", 30)

        accepted: list[dict[str, Any]] = []

        async def all_done(db: asyncpg.Connection, ids: list[str]) -> bool:
            rows = await db.fetch("SELECT status FROM jobs WHERE id = ANY($1)", ids)
            return len(rows) == len(ids) and all(r["status"] in ("succeeded", "failed") for r in rows)

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            for i in range(before):
                accepted.append(await _post_until_accepted(http, base, token, f"pre-{i}", 30))
            old = await asyncpg.connect(primary.url("z9"))
            try:
                await wait_until(lambda: all_done(old, [o["job"]["id"] for o in accepted]), timeout_s,
                                 "the first jobs to end")
            finally:
                await old.close()
            primary.kill()
            standby.promote()
            for i in range(between):
                accepted.append(await _post_until_accepted(http, base, token, f"between-{i}", timeout_s))
            new = await asyncpg.connect(standby.url("z9"))
            try:
                await wait_until(lambda: all_done(new, [o["job"]["id"] for o in accepted]), timeout_s,
                                 "the jobs submitted after the failover to end")
                # The old primary comes back writable on its old timeline: nothing fences it.
                primary.start_again()
                t_back = time.time()
                # Every z9 connection of the new primary is reset, and one executor restarted.
                await new.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                  "WHERE application_name LIKE 'z9-%' AND pid <> pg_backend_pid()")
                t_reset = time.time()
                executors[0].signal(15)
                await wait_until(lambda: not executors[0].alive(), 30, "the executor to stop")
                services.start("executor")
                late = await asyncio.gather(*(_post_until_accepted(http, base, token, f"after-{i}", timeout_s)
                                              for i in range(after)))
                accepted += late
                late_ids = [o["job"]["id"] for o in late]
                await wait_until(lambda: all_done(new, late_ids), timeout_s, "the jobs submitted after the reset to end")
                first = await new.fetchval("SELECT min(finished_at) FROM jobs WHERE id = ANY($1)", late_ids)
                fig.first_job_after_reset_s = first.timestamp() - t_reset
                fig.accepted = len(accepted)
                ids = [o["job"]["id"] for o in accepted]
                jobs = {r["id"]: r["status"] for r in await new.fetch("SELECT id, status FROM jobs WHERE id = ANY($1)", ids)}
                for o in accepted:
                    jid, sid = o["job"]["id"], o["server"]["id"]
                    if jobs.get(jid) != "succeeded":
                        fig.jobs_lost += 1
                        fig.detail.append(f"job {jid}: {jobs.get(jid)} on the new primary")
                    vms = await sim.vms_tagged(identity_tag(sid))
                    if len(vms) != 1:
                        fig.servers_without_exactly_one_vm += 1
                        fig.detail.append(f"server {sid}: {len(vms)} VMs")
                fig.jobs_run_twice_at_once = len(overlapping(runs(await job_log(new))))
                clones = (await sim.counters())["tasks_started"].get("qmclone", 0)
                fig.duplicate_clones = max(0, clones - len(accepted))
            finally:
                await new.close()
            # The old primary: nothing of z9 written there since it came back (a read does not wait
            # on synchronous replication).
            old = await asyncpg.connect(primary.url("z9"))
            try:
                fig.old_primary_writes = await old.fetchval(
                    "SELECT count(*) FROM jobs WHERE updated_at >= to_timestamp($1)", t_back)
            finally:
                await old.close()
        fig.refusals_logged = sum(p.log().count(f"refusing database server 127.0.0.1:{primary.port}")
                                  for p in services.procs)
        return fig
    finally:
        if services is not None:
            for p in services.procs:
                p.signal(15)
            try:
                await wait_until(lambda: not any(p.alive() for p in services.procs), 5, "the services to exit")
            except AssertionError:
                pass
            fig.detail.append(services.logs()[-6000:] if fig.jobs_lost or fig.old_primary_writes else "")
            services.close()
        standby.stop()
        primary.stop()
        remove_workdir(primary.datadir.parent)
