"""A load balancer's plan (``POST /v1/load-balancers/{id}/actions/plan``): its configure job's own observe
and plan, read only, against the simulator over HTTPS (its appliance model). Untouched, it plans in sync
every time; haproxy.cfg edited by hand in the appliance (through PVE's guest agent) shows as exactly that
drift with the push that puts the rendered file back; after the job ran, in sync again; no plan writes to
Proxmox (the simulator's request log; the guest agent's file-read is a GET)."""
from __future__ import annotations

import hashlib
from typing import Any

import aiohttp
import pytest
from z9.common import store

from tests.guest_tools import require_guest_tools
from tests.integration.load_balancers.test_load_balancers import LB_TEMPLATE, SERVICE
from tests.support import REGION, SimAdmin, Stack

# the periodic observe repairs drift by itself (its own test): not while these plans look at it
pytestmark = pytest.mark.settings(lb_health_interval_s=3600.0)


@pytest.fixture(autouse=True)
async def lb_template(sim: SimAdmin) -> None:
    require_guest_tools()
    await sim._req("POST", "/vms", json=LB_TEMPLATE)


async def _plan(stack: Stack, lb_id: str) -> dict[str, Any]:
    status, body = await stack.call("POST", f"/load-balancers/{lb_id}/actions/plan")
    assert status == 200, body
    return body


async def _active(stack: Stack) -> dict[str, Any]:
    status, out = await stack.call("POST", "/load-balancers", json={
        "region": REGION, "name": "plan", "type": "lb-small", "services": [SERVICE],
        "targets": [{"type": "ip", "ip": "198.51.100.240"}]})
    assert status == 202, out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=120))["status"] == "succeeded"
    status, got = await stack.call("GET", f"/load-balancers/{out['load_balancer']['id']}")
    assert status == 200, got
    return got["load_balancer"]


async def test_untouched_load_balancer_plans_in_sync_ten_times_without_a_write(stack: Stack, sim: SimAdmin) -> None:
    lb = await _active(stack)
    seen = len(await sim.requests())
    for _ in range(10):
        assert await _plan(stack, lb["id"]) == {"in_sync": True, "job_kind": "LoadBalancerConfigure", "drift": [],
                                                "steps": [], "blocked_by": [], "waiting": None}
    assert [r for r in (await sim.requests())[seen:] if r["method"] != "GET"] == []


async def test_haproxy_cfg_edited_by_hand_is_the_drift_and_the_job_puts_it_back(stack: Stack, sim: SimAdmin) -> None:
    lb = await _active(stack)
    m = lb["members"][0]
    rendered = (await sim._req("GET", f"/guests/{m['vmid']}"))["models"]["appliance"]["haproxy"]
    edited = rendered.replace("balance roundrobin", "balance leastconn")
    assert edited != rendered
    srv = sim.server
    agent = f"{srv.url}/api2/json/nodes/{m['node']}/qemu/{m['vmid']}/agent"
    auth = {"Authorization": f"PVEAPIToken={srv.token_id}={srv.token_secret}"}
    async with aiohttp.ClientSession(headers=auth) as http, \
            http.post(f"{agent}/file-write", data={"file": "/etc/haproxy/haproxy.cfg", "content": edited},
                      ssl=False) as r:
        assert r.status == 200, await r.text()
    seen = len(await sim.requests())
    plan = await _plan(stack, lb["id"])
    sha = lambda text: "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    assert plan["drift"] == [{"path": f"appliances.{m['name']}.haproxy.cfg", "want": sha(rendered), "have": sha(edited)}]
    assert [(s["name"], s["member"], s["disruptive"]) for s in plan["steps"]] == [("push_haproxy", m["name"], False)]
    assert [r for r in (await sim.requests())[seen:] if r["method"] != "GET"] == []
    async with stack.pool.acquire() as conn, conn.transaction():
        job = await store.job_insert(conn, store.NewJob(kind="LoadBalancerConfigure", region=REGION,
                                                         tenant_id=stack.tenant_id, resource_type="load_balancer",
                                                         resource_id=lb["id"], args={}))
    assert (await stack.wait_job(job.id, timeout_s=120))["status"] == "succeeded"
    assert (await _plan(stack, lb["id"]))["in_sync"] is True
