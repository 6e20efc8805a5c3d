"""Address jobs against the Proxmox VE simulator over HTTPS (issue 8 §2): a floating address
assigned, moved and unassigned (exactly one holder by tag and IP-set entry), a foreign VM using
the same IP reported and never touched. Jobs are enqueued through the store here; the API tests
(test_addresses_api.py) go through the routes."""
from __future__ import annotations

from typing import Any

import asyncpg

from z9.common import store
from z9.common.settings import AddressPoolSettings
from z9.common.tags import normalize_tags

from tests.support import SERVICE_SETTINGS, REGION, SimAdmin, Stack
from z9.resources.address import store as address_store
from z9.resources.server import store as server_store

POOL = AddressPoolSettings(name="public", cidr="203.0.113.0/24", gateway="203.0.113.1",
                           range=["203.0.113.10", "203.0.113.250"], nameservers=["203.0.113.53"])


async def _pool(stack: Stack) -> str:
    assert stack.settings.regions[REGION].address_pools == [POOL]
    async with stack.pool.acquire() as conn:
        return (await address_store.address_pools_sync(conn, stack.settings.regions))[f"{REGION}/public"]


async def _job(stack: Stack, kind: str, address_id: str, tenant: str, **args: Any) -> dict:
    extra = tuple(v for k, v in args.items() if k == "server_id")
    async with stack.pool.acquire() as conn, conn.transaction():
        job = await store.job_insert(conn, store.NewJob(kind=kind, region=REGION, tenant_id=tenant,
                                                        resource_type="address", resource_id=address_id,
                                                        args=args))
    return await stack.wait_job(job.id, timeout_s=60)


async def _server(stack: Stack, name: str) -> dict:
    server, job = await stack.create_server(name)
    done = await stack.wait_job(job["id"], timeout_s=60)
    assert done["status"] == "succeeded", done
    return await stack.server(server["id"])


def _holders(state: dict, tag: str, ip: str) -> tuple[list[int], list[int]]:
    tagged = [v["vmid"] for v in state["vms"] if tag in normalize_tags(v["config"].get("tags"))]
    listed = [int(vmid) for vmid, fw in state["firewall"]["vms"].items()
              if any(e["cidr"] == ip for e in fw.get("ipsets", {}).get("ipfilter-net0", []))]
    return sorted(tagged), sorted(listed)


async def test_floating_address_moves_between_servers(stack: Stack, sim: SimAdmin) -> None:
    pid = await _pool(stack)
    a, b = await _server(stack, "a"), await _server(stack, "b")
    tenant = (await server_store.server_get(stack.pool, a["id"])).tenant_id
    adr = await address_store.address_allocate(stack.pool, pool_id=pid, tenant_id=tenant, kind="floating")
    tag, ip = f"z9-addr-{adr.id}", adr.ip_text

    job = await _job(stack, "AddressAssign", adr.id, tenant, server_id=a["id"])
    assert job["status"] == "succeeded", job
    # server a is on DHCP: its VM firewall is on (the server's ACCEPT policies), where a filter set
    # would filter by existing and drop its leased address — the address is tagged, not listed
    assert [s["name"] for s in job["steps"]] == ["tag"]
    assert _holders(await sim.state(), tag, ip) == ([a["observed"]["vmid"]], [])
    row = await address_store.address_get(stack.pool, adr.id)
    assert row.status == "active" and row.observed["holder"]["vmid"] == a["observed"]["vmid"]
    assert row.observed["enforced"] is False   # server a is on DHCP: its IP filter stays off

    job = await _job(stack, "AddressAssign", adr.id, tenant, server_id=b["id"])
    assert job["status"] == "succeeded", job
    assert [s["name"] for s in job["steps"]] == ["untag", "tag"]
    assert _holders(await sim.state(), tag, ip) == ([b["observed"]["vmid"]], [])

    again = await _job(stack, "AddressAssign", adr.id, tenant, server_id=b["id"])
    assert again["status"] == "succeeded" and again["steps"] == []

    job = await _job(stack, "AddressUnassign", adr.id, tenant)
    assert job["status"] == "succeeded", job
    assert _holders(await sim.state(), tag, ip) == ([], [])
    assert (await address_store.address_get(stack.pool, adr.id)).observed["holder"] is None


async def test_foreign_vm_with_the_same_ip_is_reported_and_never_touched(stack: Stack, sim: SimAdmin) -> None:
    pid = await _pool(stack)
    tenant = (await server_store.server_get(stack.pool, (await _server(stack, "a"))["id"])).tenant_id
    adr = await address_store.address_allocate(stack.pool, pool_id=pid, tenant_id=tenant, kind="floating")
    foreign_cfg = {"name": "legacy", "ipconfig0": f"ip={adr.ip_text}/24,gw=203.0.113.1",
                   "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0"}
    await sim._req("POST", "/vms", json={"vmid": 777, "node": "pve2", "config": foreign_cfg, "running": True})
    before = await sim.vm(777)
    job = await _job(stack, "AddressCreate", adr.id, tenant)
    assert job["status"] == "succeeded", job
    row = await address_store.address_get(stack.pool, adr.id)
    assert row.observed["conflicts"] == [{"vmid": 777, "node": "pve2", "name": "legacy",
                                          "why": f"ipconfig0 uses {adr.ip_text}"}]
    assert row.status == "active" and row.status_reason.startswith(f"conflict: {adr.ip_text} is also used")
    after = await sim.vm(777)
    assert after["config"] == before["config"]
    fw = (await sim.state())["firewall"]["vms"].get("777")
    assert not fw or not fw.get("ipsets")


# ---------------------------------------------------------------- SIGKILL mid-move (issue 8, test 4)

import signal  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import AsyncIterator  # noqa: E402

import pytest  # noqa: E402

from z9.common.settings import Settings  # noqa: E402

from tests.support import Services, service_env, wait_until  # noqa: E402

FAST = SERVICE_SETTINGS  # (tests/support.py)


@pytest.fixture
async def services(settings: Settings, tmp_path: Path) -> AsyncIterator[Services]:
    assert settings.regions[REGION].address_pools == [POOL]
    svc = Services(service_env(settings, **FAST), tmp_path)
    try:
        yield svc
    finally:
        svc.close()
        print(svc.logs())


@pytest.mark.parametrize("kill_at", ["untag", "tag"])
async def test_sigkill_mid_move_leaves_exactly_one_holder(api: Stack, sim: SimAdmin, services: Services,
                                                           kill_at: str) -> None:
    pid = await _pool(api)
    services.start("scheduler")
    first = services.start("executor")
    a, b = await _server(api, "a"), await _server(api, "b")
    tenant = (await server_store.server_get(api.pool, a["id"])).tenant_id
    adr = await address_store.address_allocate(api.pool, pool_id=pid, tenant_id=tenant, kind="floating")
    tag, ip = f"z9-addr-{adr.id}", adr.ip_text
    assert (await _job(api, "AddressAssign", adr.id, tenant, server_id=a["id"]))["status"] == "succeeded"

    await sim.configure(task_seconds={"qmconfig": 3.0})   # tag changes are config tasks: a wide window
    async with api.pool.acquire() as conn, conn.transaction():
        move = await store.job_insert(conn, store.NewJob(kind="AddressAssign", region=REGION, tenant_id=tenant,
                                                         resource_type="address", resource_id=adr.id,
                                                         args={"server_id": b["id"]}))

    async def at_step() -> bool:
        j = await store.job_get(api.pool, move.id)
        return any(s["name"] == kill_at and s["state"] == "running" for s in j.steps)
    await wait_until(at_step, 30, f"the move to run its {kill_at} step")
    await first.kill()
    await sim.configure(task_seconds={"qmconfig": 0.05})
    services.start("executor")
    done = await api.wait_job(move.id, timeout_s=60)
    assert done["status"] == "succeeded", done
    assert done["attempt"] >= 2
    assert _holders(await sim.state(), tag, ip) == ([b["observed"]["vmid"]], [])  # (DHCP servers: not listed)
