"""A server's plan (``POST /v1/servers/{id}/actions/plan``): ServerCreate's own observe and plan, read
only, against the Proxmox VE simulator over HTTPS. An untouched server plans in sync every time; a
change made by hand through PVE's API shows as exactly that drift with the step that fixes it;
after the job ran, in sync again. No plan writes to Proxmox (the simulator's request log) nor
takes a row lock or a transaction id (pg_stat_activity, a concurrent ``FOR UPDATE NOWAIT``)."""
from __future__ import annotations

import asyncio
from typing import Any

from proxmoxer import ProxmoxAPI
from z9.common import store
from z9.common.tags import normalize_tags

from tests.support import REGION, SimAdmin, Stack, wait_until


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


async def test_a_plan_takes_no_row_lock_and_no_transaction_id(stack: Stack, sim: SimAdmin) -> None:
    """While a plan waits on Proxmox (a slow answer of the simulator's), its transaction holds no
    transaction id (it wrote and locked nothing) and another session locks the server's row at once."""
    server = await _created(stack)
    # (a wide window: the plan's transaction is open from its first read until its last Proxmox answer)
    await sim.fault(method="GET", path=r"/firewall/options$", action="delay", seconds=30.0, times=1)
    planning = asyncio.ensure_future(_plan(stack, server["id"]))

    async def plan_waiting() -> Any:
        return await stack.pool.fetchrow(
            "SELECT pid, backend_xid, state FROM pg_stat_activity WHERE application_name = 'z9-plan' "
            "AND state = 'idle in transaction'")
    seen = await wait_until(plan_waiting, 60, "the plan's transaction waiting on Proxmox")
    assert seen["backend_xid"] is None
    async with stack.pool.acquire() as conn, conn.transaction():
        locked = await conn.fetchval("SELECT id FROM servers WHERE id = $1 FOR UPDATE NOWAIT", server["id"])
        assert locked == server["id"]
    held = await stack.pool.fetchval("SELECT count(*) FROM pg_locks WHERE pid = $1 AND locktype = 'transactionid'",
                                     seen["pid"])
    assert held == 0
    # ... all of it while the plan's transaction was still open (the same session, still the plan's)
    assert await stack.pool.fetchval("SELECT application_name FROM pg_stat_activity WHERE pid = $1",
                                     seen["pid"]) == "z9-plan"
    assert (await planning)["in_sync"] is True
