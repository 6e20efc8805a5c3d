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

from tests.support import REGION, SimAdmin, Stack

POOL = AddressPoolSettings(name="public", cidr="203.0.113.0/24", gateway="203.0.113.1",
                           range=["203.0.113.10", "203.0.113.250"], nameservers=["203.0.113.53"])


async def _pool(stack: Stack) -> str:
    stack.settings.regions[REGION].address_pools = [POOL]
    async with stack.pool.acquire() as conn:
        return (await store.address_pools_sync(conn, stack.settings.regions))[f"{REGION}/public"]


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
    tenant = (await store.server_get(stack.pool, a["id"])).tenant_id
    adr = await store.address_allocate(stack.pool, pool_id=pid, tenant_id=tenant, kind="floating")
    tag, ip = f"z9-addr-{adr.id}", adr.ip_text

    job = await _job(stack, "AddressAssign", adr.id, tenant, server_id=a["id"])
    assert job["status"] == "succeeded", job
    assert [s["name"] for s in job["steps"]] == ["tag", "create_ipset", "add_entry"]
    assert _holders(await sim.state(), tag, ip) == ([a["observed"]["vmid"]], [a["observed"]["vmid"]])
    row = await store.address_get(stack.pool, adr.id)
    assert row.status == "active" and row.observed["holder"]["vmid"] == a["observed"]["vmid"]
    assert row.observed["enforced"] is False   # server a is on DHCP: its IP filter stays off

    job = await _job(stack, "AddressAssign", adr.id, tenant, server_id=b["id"])
    assert job["status"] == "succeeded", job
    assert [s["name"] for s in job["steps"]] == ["remove_entry", "untag", "tag", "create_ipset", "add_entry"]
    assert _holders(await sim.state(), tag, ip) == ([b["observed"]["vmid"]], [b["observed"]["vmid"]])

    again = await _job(stack, "AddressAssign", adr.id, tenant, server_id=b["id"])
    assert again["status"] == "succeeded" and again["steps"] == []

    job = await _job(stack, "AddressUnassign", adr.id, tenant)
    assert job["status"] == "succeeded", job
    assert _holders(await sim.state(), tag, ip) == ([], [])
    assert (await store.address_get(stack.pool, adr.id)).observed["holder"] is None


async def test_foreign_vm_with_the_same_ip_is_reported_and_never_touched(stack: Stack, sim: SimAdmin) -> None:
    pid = await _pool(stack)
    tenant = (await store.server_get(stack.pool, (await _server(stack, "a"))["id"])).tenant_id
    adr = await store.address_allocate(stack.pool, pool_id=pid, tenant_id=tenant, kind="floating")
    foreign_cfg = {"name": "legacy", "ipconfig0": f"ip={adr.ip_text}/24,gw=203.0.113.1",
                   "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0"}
    await sim._req("POST", "/vms", json={"vmid": 777, "node": "pve2", "config": foreign_cfg, "running": True})
    before = await sim.vm(777)
    job = await _job(stack, "AddressCreate", adr.id, tenant)
    assert job["status"] == "succeeded", job
    row = await store.address_get(stack.pool, adr.id)
    assert row.observed["conflicts"] == [{"vmid": 777, "node": "pve2", "name": "legacy",
                                          "why": f"ipconfig0 uses {adr.ip_text}"}]
    assert row.status == "active" and row.status_reason.startswith(f"conflict: {adr.ip_text} is also used")
    after = await sim.vm(777)
    assert after["config"] == before["config"]
    fw = (await sim.state())["firewall"]["vms"].get("777")
    assert not fw or not fw.get("ipsets")
