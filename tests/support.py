"""Test helpers shared by the suite: the simulator's admin API, an in-process stack and its
API client, tenants, database URLs."""
from __future__ import annotations

import asyncio
import secrets
import socket
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg

from z9.common import store
from z9.common.settings import Settings
from z9.sim.server import SimServer

REGION = "dev-1"
TERMINAL = ("succeeded", "failed")
SIM_TIMING: dict[str, Any] = {"task_default_s": 0.05, "task_seconds": {"qmclone": 0.2}, "stats_lag_s": 0.5}


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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

    async def call(self, method: str, path: str, *, token: str | None = None,
                   headers: dict[str, str] | None = None, **kw: Any) -> tuple[int, Any]:
        """``(status, JSON body)`` of one API request (``headers`` add to the token header)."""
        async with self.http.request(method, self.base + path, headers={**self.headers(token), **(headers or {})},
                                     **kw) as r:
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
