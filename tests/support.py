"""Test helpers shared by the suite: the simulator's admin API, an in-process stack and its
API client, tenants, database URLs."""
from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg

from z9.common import store
from z9.common.clock import SYSTEM
from z9.common.settings import Settings
from z9.sim.server import SimServer

REGION = "dev-1"
TERMINAL = ("succeeded", "failed")
SIM_TIMING: dict[str, Any] = {"task_default_s": 0.05, "task_seconds": {"qmclone": 0.2}, "stats_lag_s": 0.5,
                              "auth_delay_s": 0.0,  # PVE delays a 401 by 3 s; the tests do not wait for it
                              # a guest boots and runs cloud-init in 0.2 s each (the simulator's default: 1 s
                              # each, which every server create of the suite waited out); a test about a
                              # slow guest configures its own
                              "guest_boot_s": 0.2, "cloud_init_s": 0.2,
                              # pve-firewall's 10 s compile cycle moves only when a test steps it
                              # (SimAdmin.firewall_cycle): what a test asks never races the cycle
                              "firewall_clock": "manual"}


def with_database(url: str, database: str) -> str:
    """``url`` pointing at ``database`` instead (keeps host, socket dir and credentials)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, parts.fragment))


class SimAdmin:
    """The simulator's admin API (``/_sim``) from tests."""

    def __init__(self, server: SimServer):
        self.server = server
        self.url = server.admin_url
        self.allow_rejections = False  # set by tests that send invalid requests on purpose

    async def _req(self, method: str, path: str, **kw: Any) -> Any:
        async with aiohttp.ClientSession() as s:
            async with s.request(method, self.url + path, ssl=False, **kw) as r:
                assert r.status < 400, f"{method} {path}: {r.status} {await r.text()}"
                return await r.json()

    async def state(self) -> dict[str, Any]:
        return await self._req("GET", "/state")

    async def vms_tagged(self, tag: str) -> list[dict[str, Any]]:
        from z9.common.tags import normalize_tags

        return [v for v in (await self.state())["vms"] if tag in normalize_tags(v["config"].get("tags"))]

    async def vm(self, vmid: int) -> dict[str, Any] | None:
        return next((v for v in (await self.state())["vms"] if v["vmid"] == vmid), None)

    async def set_config(self, vmid: int, **changes: Any) -> None:
        """Change a VM's config out of band (the admin API replaces the VM as given)."""
        vm = await self.vm(vmid)
        await self._req("POST", "/vms", json={"vmid": vmid, "node": vm["node"], "running": vm["running"],
                                              "config": dict(vm["config"], **changes)})

    async def fault(self, **spec: Any) -> str:
        return (await self._req("POST", "/faults", json=spec))["id"]

    async def faults(self) -> list[dict[str, Any]]:
        """The fault rules still in force, each with its ``hits`` so far (a ``delay`` hit: a request
        the simulator is holding now, or has held)."""
        return await self._req("GET", "/faults")

    async def delete_fault(self, fault_id: str) -> None:
        """The rule :meth:`fault` added fires no more."""
        await self._req("DELETE", f"/faults/{fault_id}")

    async def configure(self, **cfg: Any) -> None:
        await self._req("PUT", "/config", json=cfg)

    async def hold_tasks(self, task_type: str) -> None:
        """Tasks of ``task_type`` (``qmclone``…) keep running past their duration until
        :meth:`release_tasks`: a test looks at a task's in-between state however slow the machine."""
        await self._req("POST", "/tasks/hold", json={"type": task_type})

    async def release_tasks(self, task_type: str | None = None) -> None:
        await self._req("POST", "/tasks/release", json={} if task_type is None else {"type": task_type})

    async def delete_vm(self, vmid: int) -> None:
        await self._req("DELETE", f"/vms/{vmid}")

    async def deliver(self, src: str | int, dst: str | int, proto: str = "tcp", port: int | None = None,
                      sport: int | None = None) -> dict[str, Any]:
        """Would the first packet of a new connection from ``src`` (an address — a guest's or any
        other, e.g. ``203.0.113.9`` for "outside" — or a vmid) to ``dst`` (a vmid, or an address a
        guest holds) with ``proto`` (``tcp``, ``udp``, ``icmp``, ``vrrp``/``112``, ``ah``/``51`` …)
        and destination ``port`` be delivered, by what pve-firewall last compiled? →
        ``{"delivered": bool, "reason": str, "src_vmid", "dst_vmid", "steps": [str], "rejected": bool}`` (the reason
        names the VM, NIC, direction and the rule or policy that decided)."""
        params = {"src": str(src), "dst": str(dst), "proto": proto}
        if port is not None:
            params["port"] = str(port)
        if sport is not None:
            params["sport"] = str(sport)
        return await self._req("GET", "/firewall/deliver", params=params)

    async def firewall_cycle(self) -> dict[str, Any]:
        """Step the simulator's firewall clock to pve-firewall's next compile (its 10 s cycle): what
        was written through the PVE API before is enforced from now on."""
        return await self._req("POST", "/firewall/clock", json={"next_cycle": True})

    async def firewall_clock(self, advance: float = 0.0) -> dict[str, Any]:
        """Move the firewall clock by ``advance`` seconds → ``{now, manual, cycle, compiled_at, next_cycle_in}``."""
        return await self._req("POST", "/firewall/clock", json={"advance": advance})

    async def counters(self) -> dict[str, Any]:
        return (await self.state())["counters"]

    async def requests(self, lease: str | None = None) -> list[dict[str, Any]]:
        """The simulator's request log (``{at, method, path, status, lease}``, oldest first); with
        ``lease``, the requests whose fencing token (``X-Z9-Lease: <job>/<attempt>/<owner>``)
        contains that text."""
        return await self._req("GET", "/requests", params={} if lease is None else {"lease": lease})

    async def mutations(self) -> int:
        """How many non-GET requests the simulator answered successfully — but ``agent/exec``: a
        command in the guest is a POST, and verify's (``cloud-init status``) only reads."""
        c = await self.counters()
        return sum(r["count"] for r in c["requests"] if r["method"] != "GET" and r["status"] == 200
                   and not r["path"].endswith("/agent/exec"))


from tests.ports import free_port, free_ports  # noqa: E402,F401  (where the tests take ports from)


@dataclass
class Stack:
    """An in-process z9 stack and an API client authenticated as one tenant."""

    settings: Settings
    pool: asyncpg.Pool
    base: str
    token: str
    tenant_id: str
    http: aiohttp.ClientSession
    services: dict[str, Any] = field(default_factory=dict)
    tasks: dict[str, asyncio.Task] = field(default_factory=dict)
    app: Any = None  # the aiohttp application serving ``base``
    metrics_url: str = ""  # the API's /metrics, on a listener of its own (never under ``base``)
    clock: Any = SYSTEM  # what the API and the services read time through (a test's TestClock)

    def headers(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.token}"}

    async def call(self, method: str, path: str, *, token: str | None = None,
                   headers: dict[str, str] | None = None, **kw: Any) -> tuple[int, Any]:
        """``(status, JSON body)`` of one API request (``headers`` add to the token header)."""
        async with self.http.request(method, self.base + path, headers={**self.headers(token), **(headers or {})},
                                     **kw) as r:
            return r.status, await r.json()

    async def create_server(self, name: str = "web-1", **over: Any) -> tuple[dict, dict]:
        body = {"name": name, "region": REGION, "image": "debian-12", "cores": 2, "memory_mib": 2048,
                "disk_gib": 10, "ssh_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIMQ+ctuWvPKZcSiB0avvBJbVNptRfvJ+8krZNKKKLvo alice@example"]}
        body.update(over)
        status, out = await self.call("POST", "/servers", json=body)
        assert status == 202, out
        return out["server"], out["job"]

    async def job(self, job_id: str) -> dict[str, Any]:
        status, out = await self.call("GET", f"/jobs/{job_id}")
        assert status == 200, out
        return out

    async def server(self, server_id: str) -> dict[str, Any]:
        status, out = await self.call("GET", f"/servers/{server_id}")
        assert status == 200, out
        return out["server"]

    async def wait_job(self, job_id: str, timeout_s: float = 30, seen: list | None = None) -> dict[str, Any]:
        """Poll the job until it is terminal (the seeds' wait_for_job, faster)."""
        last: dict[str, Any] = {}

        async def terminal() -> dict[str, Any] | None:
            job = last["job"] = await self.job(job_id)
            if seen is not None and (not seen or seen[-1] != job["status"]):
                seen.append(job["status"])
            return job if job["status"] in TERMINAL else None
        try:
            return await wait_until(terminal, timeout_s, f"job {job_id} terminal")
        except AssertionError:
            raise AssertionError(f"job {job_id} not terminal after {timeout_s}s: {last.get('job')}") from None

    async def start_service(self, name: str) -> None:
        from z9.executor.worker import Executor
        from z9.reaper import Reaper
        from z9.scheduler import Scheduler

        svc = {"executor": lambda: Executor(self.settings, [REGION], clock=self.clock),
               "scheduler": lambda: Scheduler(self.settings, clock=self.clock),
               "reaper": lambda: Reaper(self.settings, clock=self.clock)}[name]()
        self.services[name] = svc
        self.tasks[name] = asyncio.create_task(svc.run(), name=f"svc-{name}")

    async def stop_service(self, name: str) -> None:
        svc, task = self.services.pop(name), self.tasks.pop(name)
        svc.stop()
        await asyncio.wait_for(task, 30)

    def reconfigure(self, **changes: Any) -> Settings:
        """Services started from now on get a copy of the settings with ``changes`` (settings
        are frozen: the running ones, and the API, keep theirs)."""
        self.settings = self.settings.model_copy(update=changes)
        return self.settings

    async def restart_service(self, name: str, **changes: Any) -> None:
        """Stop service ``name`` and start it again with the settings changed by ``changes``
        (an operator's restart with a new configuration)."""
        await self.stop_service(name)
        self.reconfigure(**changes)
        await self.start_service(name)


async def make_tenant(pool: asyncpg.Pool, name: str) -> tuple[str, str]:
    tenant = await store.tenant_upsert(pool, name)
    token = "z9t_" + secrets.token_urlsafe(24)
    await store.api_token_insert(pool, tenant, token)
    return tenant, token


# ---------------------------------------------------------------- polling

async def wait_until(predicate: Any, timeout_s: float, what: str, interval_s: float = 0.05) -> Any:
    """Poll ``predicate()`` (sync or async) until it returns something truthy; return that.
    Raises AssertionError naming ``what`` after ``timeout_s`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        got = predicate()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(interval_s)


def poll_sync(predicate: Any, timeout_s: float, what: str, interval_s: float = 0.05) -> Any:
    """:func:`wait_until` for code outside an event loop (simulator clients, process helpers):
    ``predicate()`` until truthy, returned; AssertionError naming ``what`` after ``timeout_s``."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


async def waiting_on_a_lock(db: Any, task: asyncio.Task | None = None) -> bool:
    """Whether a session of ``db``'s database waits on a lock now (or ``task`` is done already):
    what a test awaits instead of sleeping while another transaction runs into a lock."""
    if task is not None and task.done():
        return True
    return bool(await db.fetchval("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                  "AND wait_event_type = 'Lock'"))


# ---------------------------------------------------------------- real service processes

def service_env(settings: Settings, **overrides: Any) -> dict[str, str]:
    """Environment for a ``z9 <service>`` subprocess: the database and regions of ``settings``
    plus ``overrides`` given as setting names (``lease_ttl_s=2`` → ``Z9_LEASE_TTL_S=2``)."""
    regions = {name: {"url": r.url, "token_id": r.token_id, "token_secret": r.token_secret.get_secret_value(),
                      "verify_ssl": r.verify_ssl, "images": r.images,
                      "address_pools": [p.model_dump(mode="json") for p in r.address_pools],
                      "nameservers": [str(n) for n in r.nameservers], "kubernetes_images": r.kubernetes_images,
                      **({"sdn": r.sdn.model_dump(mode="json")} if r.sdn is not None else {})}
               for name, r in settings.regions.items()}
    env = {k: v for k, v in os.environ.items() if not k.startswith("Z9_")}
    env.update(Z9_DATABASE_URL=settings.require_database_url(), Z9_REGIONS=json.dumps(regions), Z9_LOG_LEVEL="INFO")
    env.update({f"Z9_{k.upper()}": str(v) for k, v in overrides.items()})
    return env


class ServiceProcess:
    """One real ``z9 <args>`` process (``python -m z9``), stdout and stderr appended to
    ``log_path``. Signals go to this process only, by its pid."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_path: Path):
        self.name = name
        self.log_path = log_path
        self._out = open(log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "z9", *args], env=env, stdout=self._out,
                                     stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            self.proc.send_signal(sig)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def wait_log(self, pattern: str, timeout_s: float = 20) -> re.Match:
        """The first match of regex ``pattern`` in the log, polled until ``timeout_s``."""
        rx = re.compile(pattern)

        def found() -> re.Match | None:
            m = rx.search(self.log())
            if m is None and not self.alive():
                raise AssertionError(f"{self.name} exited ({self.proc.returncode}) before logging "
                                     f"{pattern!r}:\n{self.log()[-3000:]}")
            return m
        return await wait_until(found, timeout_s, f"{self.name} to log {pattern!r}")

    async def wait_exit(self, timeout_s: float = 20) -> int:
        await wait_until(lambda: not self.alive(), timeout_s, f"{self.name} (pid {self.pid}) to exit")
        return self.proc.returncode

    async def kill(self) -> None:
        """SIGKILL and reap."""
        self.signal(signal.SIGKILL)
        await self.wait_exit(10)

    def close(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait(10)
        self._out.close()


class Services:
    """Real z9 service processes of one test, all killed at teardown. ``start`` gives each its
    own log file; ``env`` is the base environment (see :func:`service_env`)."""

    def __init__(self, env: dict[str, str], log_dir: Path):
        self.env = env
        self.log_dir = log_dir
        self.procs: list[ServiceProcess] = []

    def start(self, service: str, *args: str, **overrides: Any) -> ServiceProcess:
        """Start ``z9 <service> <args>``; ``overrides`` as in :func:`service_env`."""
        env = dict(self.env, **{f"Z9_{k.upper()}": str(v) for k, v in overrides.items()})
        name = f"{service}-{len(self.procs)}"
        if service == "executor" and "--region" not in args:
            args = ("--region", REGION, *args)
        p = ServiceProcess(name, [service, *args], env, self.log_dir / f"{name}.log")
        self.procs.append(p)
        return p

    async def executor_owner(self, p: ServiceProcess, timeout_s: float = 20) -> str:
        """The lease owner of executor ``p`` (once it serves)."""
        return (await p.wait_log(r"executor (\S+) serving regions", timeout_s)).group(1)

    def close(self) -> None:
        for p in self.procs:
            p.close()

    def logs(self) -> str:
        return "\n".join(f"===== {p.name} (pid {p.pid}, rc {p.proc.poll()})\n{p.log()[-8000:]}" for p in self.procs)


# ---------------------------------------------------------------- job history (a trigger in the test database)

JOB_LOG_DDL = """
CREATE TABLE test_job_log (
    seq bigserial PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    tx_at timestamptz NOT NULL DEFAULT now(),
    job_id text NOT NULL, resource_id text, kind text, status text, attempt int, lease_owner text,
    run_after timestamptz, error jsonb);
CREATE FUNCTION test_job_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.status IS DISTINCT FROM OLD.status OR NEW.attempt IS DISTINCT FROM OLD.attempt
       OR NEW.lease_owner IS DISTINCT FROM OLD.lease_owner THEN
        INSERT INTO test_job_log (job_id, resource_id, kind, status, attempt, lease_owner, run_after, error)
        VALUES (NEW.id, NEW.resource_id, NEW.kind, NEW.status::text, NEW.attempt, NEW.lease_owner, NEW.run_after,
                NEW.error);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER test_job_log AFTER INSERT OR UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION test_job_log();
"""


async def install_job_log(db: Any) -> None:
    """Record every state change of every job (status, attempt, lease owner) with its time, in
    the test's own database (table ``test_job_log``)."""
    await db.execute(JOB_LOG_DDL)


async def job_log(db: Any, job_id: str | None = None) -> list[dict[str, Any]]:
    """The recorded changes, oldest first (of one job, or all)."""
    rows = await db.fetch("SELECT * FROM test_job_log WHERE $1::text IS NULL OR job_id = $1 ORDER BY seq", job_id)
    return [dict(r) for r in rows]


@dataclass
class Run:
    """One attempt of a job as the database saw it: from its claim until it left ``running``."""

    job_id: str
    resource_id: str | None
    attempt: int
    owner: str
    start: Any
    end: Any = None  # None: still running
    ended_as: str | None = None


def runs(log: list[dict[str, Any]]) -> list[Run]:
    """The running intervals in a :func:`job_log`."""
    out: list[Run] = []
    open_: dict[str, Run] = {}
    for e in log:
        cur = open_.get(e["job_id"])
        if cur is not None and (e["status"] != "running" or e["lease_owner"] != cur.owner
                                or e["attempt"] != cur.attempt):
            cur.end, cur.ended_as = e["at"], e["status"]
            del open_[e["job_id"]]
        if e["status"] == "running" and e["job_id"] not in open_:
            r = Run(e["job_id"], e["resource_id"], e["attempt"], e["lease_owner"], e["at"])
            open_[e["job_id"]] = r
            out.append(r)
    return out


def overlapping(rs: list[Run]) -> list[tuple[Run, Run]]:
    """Pairs of runs of one resource (or one job) that were running at the same time."""
    bad = []
    by_key: dict[str, list[Run]] = {}
    for r in rs:
        by_key.setdefault(r.resource_id or r.job_id, []).append(r)
    for group in by_key.values():
        group.sort(key=lambda r: r.start)
        for a, b in zip(group, group[1:]):
            if a.end is None or b.start < a.end:
                bad.append((a, b))
    return bad


@asynccontextmanager
async def api_stack(settings: Settings, pool: asyncpg.Pool, *, clock: Any = SYSTEM) -> AsyncIterator[Stack]:
    """The API app served on a free local port, with a tenant ``acme`` and a client for it; the
    services a test starts on the Stack are stopped on the way out. Everything reads time
    through ``clock``."""
    from aiohttp import web

    from z9.api.app import create_app, create_metrics_app

    from z9.api.middleware import Runner

    runner = Runner(create_app(settings, pool=pool, clock=clock))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    metrics_runner = web.AppRunner(create_metrics_app())
    await metrics_runner.setup()
    metrics_port = free_port()
    await web.TCPSite(metrics_runner, "127.0.0.1", metrics_port).start()
    tenant, token = await make_tenant(pool, "acme")
    async with aiohttp.ClientSession() as http:
        stack = Stack(settings, pool, f"http://127.0.0.1:{port}/v1", token, tenant, http, app=runner.app,
                      metrics_url=f"http://127.0.0.1:{metrics_port}/metrics", clock=clock)
        try:
            yield stack
        finally:
            for name in list(stack.services):
                await stack.stop_service(name)
            await metrics_runner.cleanup()
            await runner.cleanup()


# Fast engine settings for real service processes (seconds): as the in-process stack's
# (tests/conftest.py make_settings) where a process can use them — the default 1 s guest poll noticed
# each boot up to 1 s late. The `services` fixture (tests/conftest.py) starts processes with them.
SERVICE_SETTINGS: dict[str, Any] = dict(
    lease_ttl_s=2, heartbeat_s=0.25, task_poll_s=0.1, poll_interval_s=1, scheduler_interval_s=0.5,
    reaper_interval_s=0.25, backoff_base_s=0.2, backoff_cap_s=1, snooze_s=0.2, uncertain_window_s=1,
    shutdown_grace_s=5, task_deadline_s=60, server_guest_poll_s=0.1, drift_interval_s=0)

