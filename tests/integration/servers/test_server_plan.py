"""A server's plan (``POST /v1/servers/{id}/actions/plan``): ServerCreate's own observe and plan, read
only, against the Proxmox VE simulator over HTTPS. An untouched server plans in sync every time; a
change made by hand through PVE's API shows as exactly that drift with the step that fixes it;
after the job ran, in sync again. No plan writes to Proxmox (the simulator's request log) nor
takes a row lock or a transaction id (pg_stat_activity, a concurrent ``FOR UPDATE NOWAIT``)."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
from proxmoxer import ProxmoxAPI
from z9.common import store
from z9.common.tags import normalize_tags

from tests.support import REGION, SimAdmin, Stack, make_tenant, wait_until


def _pve(sim: SimAdmin) -> ProxmoxAPI:
    return ProxmoxAPI("127.0.0.1", port=sim.server.port, user="root@pam", token_name="z9",
                      token_value=sim.server.token_secret, verify_ssl=str(sim.server.cert_path))


async def _created(stack: Stack) -> dict[str, Any]:
    server, job = await stack.create_server("web-1")
    assert (await stack.wait_job(job["id"]))["status"] == "succeeded"
    return await stack.server(server["id"])


async def _plan(stack: Stack, sid: str, token: str | None = None) -> dict[str, Any]:
    status, body = await stack.call("POST", f"/servers/{sid}/actions/plan", token=token)
    assert status == 200, body
    return body


async def _writes_since(sim: SimAdmin, n: int) -> list[dict[str, Any]]:
    return [r for r in (await sim.requests())[n:] if r["method"] != "GET"]


async def _converge(stack: Stack, sid: str) -> dict[str, Any]:
    """Run the server's converging job (its ServerCreate, as the plan previews it: the row's intent)."""
    args = await store.resource_latest_job_args(stack.pool, sid, "ServerCreate")
    async with stack.pool.acquire() as conn, conn.transaction():
        job = await store.job_insert(conn, store.NewJob(kind="ServerCreate", region=REGION, tenant_id=stack.tenant_id,
                                                         resource_type="server", resource_id=sid, args=args))
    return await stack.wait_job(job.id)


async def test_untouched_server_plans_in_sync_ten_times_without_a_write(stack: Stack, sim: SimAdmin) -> None:
    server = await _created(stack)
    seen = len(await sim.requests())
    for _ in range(10):
        plan = await _plan(stack, server["id"])
        assert plan == {"in_sync": True, "job_kind": "ServerCreate", "drift": [], "steps": [], "blocked_by": [], "waiting": None}
    assert await _writes_since(sim, seen) == []


async def test_cores_changed_by_hand_is_the_drift_and_the_job_fixes_it(stack: Stack, sim: SimAdmin) -> None:
    server = await _created(stack)
    vmid, node = server["observed"]["vmid"], server["observed"]["node"]
    await asyncio.to_thread(lambda: _pve(sim).nodes(node).qemu(vmid).config.put(cores=4))
    seen = len(await sim.requests())
    plan = await _plan(stack, server["id"])
    assert plan["in_sync"] is False and plan["blocked_by"] == []
    assert plan["drift"] == [{"path": "config.cores", "want": 2, "have": 4}]
    assert [(s["name"], s["member"], s["disruptive"]) for s in plan["steps"]] == [("configure", None, False)]
    assert "pending until the VM's next boot" in plan["steps"][0]["why"]  # a running VM: no CPU hotplug
    assert await _writes_since(sim, seen) == []
    assert (await _converge(stack, server["id"]))["status"] == "succeeded"
    assert (await _plan(stack, server["id"]))["in_sync"] is True


async def test_tag_removed_by_hand_is_the_drift(stack: Stack, sim: SimAdmin) -> None:
    server = await _created(stack)
    vmid, node = server["observed"]["vmid"], server["observed"]["node"]
    tags = normalize_tags((await sim.vm(vmid))["config"]["tags"])
    # PVE keeps tags as given (order, case); z9 compares them as a set, lower-case
    left = sorted((t.upper() if t.startswith("z9-id-") else t) for t in tags if t != "z9-role-customer")
    await asyncio.to_thread(lambda: _pve(sim).nodes(node).qemu(vmid).config.put(tags=";".join(reversed(left))))
    plan = await _plan(stack, server["id"])
    assert plan["drift"] == [{"path": "config.tags", "want": sorted(tags), "have": sorted(t.lower() for t in left)}]
    assert [(s["name"], s["disruptive"]) for s in plan["steps"]] == [("configure", False)]
    assert (await _converge(stack, server["id"]))["status"] == "succeeded"
    assert (await _plan(stack, server["id"]))["in_sync"] is True


async def test_tags_reordered_and_upper_cased_are_no_drift(stack: Stack, sim: SimAdmin) -> None:
    server = await _created(stack)
    vmid, node = server["observed"]["vmid"], server["observed"]["node"]
    tags = normalize_tags((await sim.vm(vmid))["config"]["tags"])
    await asyncio.to_thread(lambda: _pve(sim).nodes(node).qemu(vmid).config.put(
        tags=",".join(t.upper() for t in sorted(tags, reverse=True))))
    assert (await _plan(stack, server["id"]))["in_sync"] is True


async def test_a_renamed_server_is_no_drift(stack: Stack, sim: SimAdmin) -> None:
    """A rename is the database's alone (PATCH): the VM keeps the name it was made with."""
    server = await _created(stack)
    status, out = await stack.call("PATCH", f"/servers/{server['id']}", json={"name": "web-renamed"})
    assert status == 200, out
    assert (await _plan(stack, server["id"]))["in_sync"] is True


async def test_stopped_server_plans_no_start(stack: Stack, sim: SimAdmin) -> None:
    server = await _created(stack)
    status, out = await stack.call("POST", f"/servers/{server['id']}/actions/poweroff")
    assert status == 202, out
    assert (await stack.wait_job(out["job"]["id"]))["status"] == "succeeded"
    assert (await _plan(stack, server["id"]))["in_sync"] is True


async def test_read_token_may_plan(stack: Stack, sim: SimAdmin) -> None:
    server = await _created(stack)
    status, out = await stack.call("POST", "/tokens", json={"name": "ro", "scopes": ["read"]})
    assert status == 201, out
    assert (await _plan(stack, server["id"], token=out["secret"]))["in_sync"] is True
    status, body = await stack.call("POST", f"/servers/{server['id']}/actions/reboot", token=out["secret"])
    assert status == 403 and body["error"]["code"] == "insufficient_scope"


async def test_plan_of_a_server_with_a_job_pending_names_it(api: Stack, sim: SimAdmin) -> None:
    server, job = await api.create_server("web-1")  # no executor: the create stays pending
    plan = await _plan(api, server["id"])
    assert plan["blocked_by"] == [{"id": job["id"], "kind": "ServerCreate", "status": "pending"}]
    assert plan["in_sync"] is False and plan["drift"] == [{"path": "vm.main", "want": "exists", "have": None}]
    assert [s["name"] for s in plan["steps"]] == ["clone", "configure", "resize_disk", "firewall", "start"]


async def test_unknown_server_is_404_and_a_deleting_one_409(stack: Stack, sim: SimAdmin) -> None:
    status, body = await stack.call("POST", "/servers/srv_01jd3x5v8q2m6n4p7r9s1t3w5y/actions/plan")
    assert status == 404, body
    server = await _created(stack)
    assert (await stack.call("DELETE", f"/servers/{server['id']}"))[0] == 202
    status, body = await stack.call("POST", f"/servers/{server['id']}/actions/plan")
    assert status == 409 and body["error"]["code"] == "resource_deleting", body


async def _fault_hits(sim: SimAdmin, fault_id: str) -> int:
    return next((f["hits"] for f in await sim.faults() if str(f["id"]) == str(fault_id)), -1)


async def test_a_plan_waiting_on_proxmox_holds_no_connection_and_no_row_lock(stack: Stack, sim: SimAdmin) -> None:
    """While a plan waits on Proxmox (a slow answer of the simulator's), it holds no database
    connection (no z9-plan session in pg_stat_activity: its reads each took one and gave it back) and
    another session locks the server's row at once."""
    server = await _created(stack)
    fault = await sim.fault(method="GET", path=r"/firewall/options$", action="delay", seconds=20.0, times=2)
    planning = asyncio.ensure_future(_plan(stack, server["id"]))
    await wait_until(lambda: _fault_hits(sim, fault), 60, "the plan waiting on Proxmox")
    assert not planning.done()
    assert await stack.pool.fetch("SELECT pid FROM pg_stat_activity WHERE application_name = 'z9-plan'") == []
    async with stack.pool.acquire() as conn, conn.transaction():
        locked = await conn.fetchval("SELECT id FROM servers WHERE id = $1 FOR UPDATE NOWAIT", server["id"])
        assert locked == server["id"]
    assert not planning.done()  # ... all of it while the plan was still waiting
    await sim.delete_fault(fault)
    assert (await planning)["in_sync"] is True


@pytest.mark.settings(api_max_concurrent_plans=2)  # one tenant: at most 1 at once
async def test_plans_past_the_limit_are_429_at_once_and_other_requests_go_on(stack: Stack, sim: SimAdmin) -> None:
    """Plans held by a slow Proxmox take their slots; the next plan, of the same tenant (its share is
    full) or of any tenant (the process is full), is answered 429 too_many_plans with Retry-After at
    once, and an unrelated GET answers while the plans are still held."""
    _, b_token = await make_tenant(stack.pool, "neighbour")
    _, c_token = await make_tenant(stack.pool, "third")
    mine = await _created(stack)
    status, out = await stack.call("POST", "/servers", token=b_token, json={
        "name": "theirs", "region": REGION, "image": "debian-12", "cores": 2, "memory_mib": 2048, "disk_gib": 10})
    assert status == 202, out
    theirs, job_path = out["server"]["id"], f"/jobs/{out['job']['id']}"

    async def created() -> str | None:
        status = (await stack.call("GET", job_path, token=b_token))[1]["status"]
        return status if status in ("succeeded", "failed", "cancelled") else None
    assert await wait_until(created, 60, "the neighbour's server created") == "succeeded"
    vmids = [(await stack.server(mine["id"]))["observed"]["vmid"],
             (await stack.call("GET", f"/servers/{theirs}", token=b_token))[1]["server"]["observed"]["vmid"]]
    fault = await sim.fault(method="GET", path=rf"/qemu/({vmids[0]}|{vmids[1]})/config$", action="delay",
                            seconds=20.0, times=3)
    held = [asyncio.ensure_future(_plan(stack, mine["id"])), asyncio.ensure_future(_plan(stack, theirs, b_token))]

    async def both_held() -> bool:
        return await _fault_hits(sim, fault) == 2
    await wait_until(both_held, 60, "both plans waiting on Proxmox")

    async def refused(sid: str, token: str | None) -> dict[str, Any]:
        async with stack.http.post(f"{stack.base}/servers/{sid}/actions/plan", headers=stack.headers(token)) as r:
            assert r.status == 429, await r.text()
            assert r.headers["Retry-After"] == "1"
            return dict(await r.json())
    assert (await refused(mine["id"], None))["error"]["code"] == "too_many_plans"  # this tenant's share
    body = await refused(mine["id"], c_token)  # the process's limit (checked before the id is looked up)
    assert body["error"]["code"] == "too_many_plans" and "process" in body["error"]["message"]
    status, listed = await stack.call("GET", "/servers")
    assert status == 200 and [s["id"] for s in listed["servers"]] == [mine["id"]]
    assert not any(t.done() for t in held) and await _fault_hits(sim, fault) == 2  # still held meanwhile
    await sim.delete_fault(fault)
    assert [p["in_sync"] for p in await asyncio.gather(*held)] == [True, True]
    assert (await _plan(stack, mine["id"]))["in_sync"] is True  # the slots were given back
