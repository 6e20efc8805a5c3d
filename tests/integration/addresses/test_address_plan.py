"""An address's plan (``POST /v1/addresses/{id}/actions/plan``): its assignment job's own observe and plan,
read only, against the Proxmox VE simulator over HTTPS. Untouched, it plans in sync every time; its tag
taken off the server's VM by hand through PVE's API shows as exactly that drift with the step that puts
it back; after the job ran, in sync again; no plan writes to Proxmox (the simulator's request log)."""
from __future__ import annotations

import asyncio
from typing import Any

from proxmoxer import ProxmoxAPI
from z9.common import store
from z9.common.tags import normalize_tags

from tests.support import REGION, SimAdmin, Stack


def _pve(sim: SimAdmin) -> ProxmoxAPI:
    return ProxmoxAPI("127.0.0.1", port=sim.server.port, user="root@pam", token_name="z9",
                      token_value=sim.server.token_secret, verify_ssl=str(sim.server.cert_path))


async def _plan(stack: Stack, aid: str) -> dict[str, Any]:
    status, body = await stack.call("POST", f"/addresses/{aid}/actions/plan")
    assert status == 200, body
    return body


async def _assigned(stack: Stack) -> tuple[dict[str, Any], dict[str, Any]]:
    server, job = await stack.create_server("adr-host")
    assert (await stack.wait_job(job["id"], timeout_s=90))["status"] == "succeeded"
    status, out = await stack.call("POST", "/addresses", json={"region": REGION, "server_id": server["id"]})
    assert status == 202, out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=90))["status"] == "succeeded"
    return await stack.server(server["id"]), out["address"]


async def test_untouched_address_plans_in_sync_ten_times_without_a_write(stack: Stack, sim: SimAdmin) -> None:
    _, adr = await _assigned(stack)
    seen = len(await sim.requests())
    for _ in range(10):
        assert await _plan(stack, adr["id"]) == {"in_sync": True, "job_kind": "AddressAssign", "drift": [],
                                                 "steps": [], "blocked_by": [], "waiting": None}
    assert [r for r in (await sim.requests())[seen:] if r["method"] != "GET"] == []


async def test_tag_taken_off_by_hand_is_the_drift_and_the_job_puts_it_back(stack: Stack, sim: SimAdmin) -> None:
    server, adr = await _assigned(stack)
    vmid, node = server["observed"]["vmid"], server["observed"]["node"]
    tags = normalize_tags((await sim.vm(vmid))["config"]["tags"])
    mine = f"z9-addr-{adr['id']}"
    assert mine in tags
    await asyncio.to_thread(lambda: _pve(sim).nodes(node).qemu(vmid).config.put(
        tags=";".join(sorted(tags - {mine}))))
    seen = len(await sim.requests())
    plan = await _plan(stack, adr["id"])
    assert plan["drift"] == [{"path": "on", "want": server["id"], "have": None}]
    assert [(s["name"], s["disruptive"]) for s in plan["steps"]] == [("tag", False)]
    assert [r for r in (await sim.requests())[seen:] if r["method"] != "GET"] == []
    async with stack.pool.acquire() as conn, conn.transaction():
        job = await store.job_insert(conn, store.NewJob(kind="AddressAssign", region=REGION, tenant_id=stack.tenant_id,
                                                         resource_type="address", resource_id=adr["id"],
                                                         args={"server_id": server["id"]},
                                                         extra_lock_keys=(server["id"],)))
    assert (await stack.wait_job(job.id, timeout_s=90))["status"] == "succeeded"
    assert (await _plan(stack, adr["id"]))["in_sync"] is True
