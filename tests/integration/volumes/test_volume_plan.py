"""A volume's plan (``POST /v1/volumes/{id}/actions/plan``): its reconciler's own observe and plan, read
only, against the Proxmox VE simulator over HTTPS. Untouched, it plans in sync every time; its drive
unplugged by hand through PVE's API shows as exactly that drift with the steps that put it back; after
the volume's job ran, in sync again. No plan writes to Proxmox (the simulator's request log)."""
from __future__ import annotations

import asyncio
from typing import Any

from proxmoxer import ProxmoxAPI
from z9.common import store

from tests.support import REGION, SimAdmin, Stack


def _pve(sim: SimAdmin) -> ProxmoxAPI:
    return ProxmoxAPI("127.0.0.1", port=sim.server.port, user="root@pam", token_name="z9",
                      token_value=sim.server.token_secret, verify_ssl=str(sim.server.cert_path))


async def _plan(stack: Stack, vid: str) -> dict[str, Any]:
    status, body = await stack.call("POST", f"/volumes/{vid}/actions/plan")
    assert status == 200, body
    return body


async def _attached(stack: Stack) -> tuple[dict[str, Any], dict[str, Any]]:
    server, job = await stack.create_server("vol-host")
    assert (await stack.wait_job(job["id"], timeout_s=90))["status"] == "succeeded"
    status, out = await stack.call("POST", "/volumes", json={"name": "data", "region": REGION, "size_gib": 4,
                                                              "server_id": server["id"]})
    assert status == 202, out
    for j in out["jobs"]:
        assert (await stack.wait_job(j["id"], timeout_s=90))["status"] == "succeeded"
    status, v = await stack.call("GET", f"/volumes/{out['volume']['id']}")
    assert status == 200 and v["volume"]["status"] == "attached", v
    return await stack.server(server["id"]), v["volume"]


async def test_untouched_volume_plans_in_sync_ten_times_without_a_write(stack: Stack, sim: SimAdmin) -> None:
    _, vol = await _attached(stack)
    seen = len(await sim.requests())
    for _ in range(10):
        assert await _plan(stack, vol["id"]) == {"in_sync": True, "job_kind": "VolumeAttach", "drift": [],
                                                 "steps": [], "blocked_by": [], "waiting": None}
    assert [r for r in (await sim.requests())[seen:] if r["method"] != "GET"] == []


async def test_drive_unplugged_by_hand_is_the_drift_and_the_job_plugs_it_back(stack: Stack, sim: SimAdmin) -> None:
    server, vol = await _attached(stack)
    vmid, node, key = server["observed"]["vmid"], server["observed"]["node"], vol["observed"]["disk"]
    await asyncio.to_thread(lambda: _pve(sim).nodes(node).qemu(vmid).config.put(delete=key))  # → unusedN
    seen = len(await sim.requests())
    plan = await _plan(stack, vol["id"])
    assert plan["drift"] == [{"path": "attached_to", "want": server["id"], "have": None}]
    assert [(s["name"], s["disruptive"]) for s in plan["steps"]] == [("detach", False), ("label", False),
                                                                       ("attach", False)]
    assert [r for r in (await sim.requests())[seen:] if r["method"] != "GET"] == []
    async with stack.pool.acquire() as conn, conn.transaction():
        job = await store.job_insert(conn, store.NewJob(kind="VolumeAttach", region=REGION, tenant_id=stack.tenant_id,
                                                         resource_type="volume", resource_id=vol["id"],
                                                         args={"server_id": server["id"]}))
    assert (await stack.wait_job(job.id, timeout_s=90))["status"] == "succeeded"
    assert (await _plan(stack, vol["id"]))["in_sync"] is True
