"""Chaos on load balancer jobs (issue 10): SIGKILL of the executor mid-create of an lb-ha."""
from __future__ import annotations

import hashlib

from z9.common import store

from tests.support import SimAdmin, Services, Stack, wait_until
from tests.integration.load_balancers.test_load_balancers import SERVICE, _appliances, _get, _lb, lb_template, services  # noqa: F401


async def test_sigkill_mid_clone_of_an_lb_ha_leaves_exactly_two_appliances(api: Stack, sim: SimAdmin,
                                                                           services: Services) -> None:
    await sim._req("PUT", "/config", json={"task_seconds": {"qmclone": 4}})
    services.start("scheduler")
    first = services.start("executor")
    before = {v["vmid"] for v in (await sim.state())["vms"]}
    lb, job = await _lb(api, name="kill-create", type="lb-ha", services=[SERVICE],
                        targets=[{"type": "ip", "ip": "198.51.100.240"}])

    async def cloning() -> bool:
        j = await store.job_get(api.pool, job["id"])
        return any(s["name"] == "clone" and s["state"] == "running" for s in j.steps)
    await wait_until(cloning, 60, "a clone under way")
    await first.kill()
    services.start("executor")
    done = await api.wait_job(job["id"], timeout_s=150)
    assert done["status"] == "succeeded", done
    state = await sim.state()
    new = [v for v in state["vms"] if v["vmid"] not in before]
    apps = _appliances(state, lb["id"])
    assert len(apps) == 2 and len(new) == 2, new           # no orphan clone
    assert len({v["node"] for v in apps}) == 2
    cur = await _get(api, lb["id"])
    assert cur["status"] == "active" and cur["spread"] is True
    for v in apps:
        g = (await sim._req("GET", f"/guests/{v['vmid']}"))["models"]["appliance"]
        assert hashlib.sha256(g["haproxy"].encode()).hexdigest() == cur["config_hash"]
        assert int(g.get("reloads", 0)) <= 1, g.get("reloads")


async def test_a_recreated_lb_0_does_not_land_on_lb_1s_node(stack: Stack, sim: SimAdmin) -> None:
    """lb-1 was moved (out of band) onto the template's node, lb-0 is then lost: the repair
    re-creates lb-0 on another node than lb-1's, not on the template's node by default."""
    lb, job = await _lb(stack, name="spread", type="lb-ha", services=[SERVICE])
    assert (await stack.wait_job(job["id"], timeout_s=120))["status"] == "succeeded"
    apps = {v["config"]["name"]: v for v in _appliances(await sim.state(), lb["id"])}
    lb0, lb1 = apps["spread-lb-0"], apps["spread-lb-1"]
    template_node = "pve1"
    assert lb0["node"] == template_node and lb1["node"] != template_node
    # lb-1 migrated onto the template's node; lb-0 destroyed out of band
    await sim._req("DELETE", f"/vms/{lb1['vmid']}")
    await sim._req("POST", "/vms", json={"vmid": lb1["vmid"], "node": template_node, "config": lb1["config"],
                                         "running": True})
    await sim._req("DELETE", f"/vms/{lb0['vmid']}")
    status, out = await stack.call("POST", f"/load-balancers/{lb['id']}/actions/change_algorithm",
                                   json={"type": "least_connections"})
    assert status == 202, out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=120))["status"] == "succeeded"
    apps = _appliances(await sim.state(), lb["id"])
    assert len(apps) == 2 and len({v["node"] for v in apps}) == 2, [(v["config"]["name"], v["node"]) for v in apps]
    assert (await _get(stack, lb["id"]))["spread"] is True


async def test_a_target_server_started_again_is_healthy_again(stack: Stack, sim: SimAdmin) -> None:
    """Stopped through the API: server_stopped; started again (and listening): healthy again,
    not stuck on z9's stale view of its power."""
    from tests.integration.load_balancers.test_load_balancers import _listen, _server
    a = await _server(stack, "back")
    await _listen(sim, a["observed"]["vmid"], 8080)
    lb, job = await _lb(stack, name="restore", services=[SERVICE], targets=[{"type": "server", "server_id": a["id"]}])
    assert (await stack.wait_job(job["id"], timeout_s=120))["status"] == "succeeded"
    status, out = await stack.call("POST", f"/servers/{a['id']}/actions/poweroff")
    assert status == 202 and (await stack.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"

    async def health(want: str) -> dict | None:
        cur = await _get(stack, lb["id"])
        return cur if cur["targets"][0]["health_status"][0]["status"] == want else None
    cur = await wait_until(lambda: health("unhealthy"), stack.settings.lb_health_interval_s + 15, "unhealthy")
    assert cur["targets"][0]["health_status"][0]["reason"] == "server_stopped"
    status, out = await stack.call("POST", f"/servers/{a['id']}/actions/start")
    assert status == 202, out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
    await _listen(sim, a["observed"]["vmid"], 8080)
    cur = await wait_until(lambda: health("healthy"), stack.settings.lb_health_interval_s + 20, "healthy again")
    assert cur["health"] == "healthy"


async def test_a_renamed_load_balancer_keeps_its_appliances(stack: Stack, sim: SimAdmin) -> None:
    """PATCH name (database only), then a configure: the same two VMs, nothing re-cloned."""
    lb, job = await _lb(stack, name="old-name", type="lb-ha", services=[SERVICE])
    assert (await stack.wait_job(job["id"], timeout_s=120))["status"] == "succeeded"
    before = sorted(v["vmid"] for v in _appliances(await sim.state(), lb["id"]))
    status, out = await stack.call("PATCH", f"/load-balancers/{lb['id']}", json={"name": "new-name"})
    assert status == 200, out
    status, out = await stack.call("POST", f"/load-balancers/{lb['id']}/actions/change_algorithm",
                                   json={"type": "least_connections"})
    assert status == 202, out
    done = await stack.wait_job(out["job"]["id"], timeout_s=120)
    assert done["status"] == "succeeded", done
    after = sorted(v["vmid"] for v in _appliances(await sim.state(), lb["id"]))
    assert after == before
    cur = await _get(stack, lb["id"])
    assert cur["status"] == "active" and {m["config_hash"] for m in cur["members"]} == {cur["config_hash"]}


async def test_sigkill_mid_final_delete_of_an_lb_ha(api: Stack, sim: SimAdmin, services: Services) -> None:
    """The executor is killed while an appliance's destroy task runs: after recovery both VMs are
    gone, the load balancer deleted, and its addresses released only after the VMs were gone."""
    services.start("scheduler")
    services.start("reaper")
    first = services.start("executor")
    lb, job = await _lb(api, name="kill-delete", type="lb-ha", services=[SERVICE])
    assert (await api.wait_job(job["id"], timeout_s=120))["status"] == "succeeded"
    await sim._req("PUT", "/config", json={"task_seconds": {"qmdestroy": 4}})
    status, out = await api.call("DELETE", f"/load-balancers/{lb['id']}")
    assert status == 202, out
    assert (await api.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
    await api.pool.execute("UPDATE load_balancers SET delete_after = now() WHERE id = $1", lb["id"])

    async def destroying() -> dict | None:
        rows = await api.pool.fetch("SELECT id, steps FROM jobs WHERE resource_id = $1 AND kind = 'LoadBalancerDelete'",
                                    lb["id"])
        for r in rows:
            j = await store.job_get(api.pool, r["id"])
            if any(s["name"] == "destroy" and s["state"] == "running" for s in j.steps):
                return {"id": r["id"]}
        return None
    final = await wait_until(destroying, 60, "a destroy under way")
    await first.kill()
    services.start("executor")
    done = await api.wait_job(final["id"], timeout_s=120)
    assert done["status"] == "succeeded", done
    assert _appliances(await sim.state(), lb["id"]) == []
    assert (await _get(api, lb["id"]))["status"] == "deleted"
    live = await api.pool.fetchval("SELECT count(*) FROM addresses WHERE load_balancer_id = $1 AND status <> 'deleted'",
                                   lb["id"])
    assert live == 0


async def test_a_hand_edited_keepalived_conf_is_drift(stack: Stack, sim: SimAdmin) -> None:
    """keepalived.conf changed by hand on an appliance (``nopreempt`` taken out: the Octavia failure
    of an appliance pre-empting the VIP): the periodic observe sees it as drift, as it does for
    haproxy.cfg, and the configure it enqueues puts the rendered file back."""
    import aiohttp
    lb, job = await _lb(stack, name="kdrift", type="lb-ha", services=[SERVICE])
    assert (await stack.wait_job(job["id"], timeout_s=120))["status"] == "succeeded"
    lb = await _get(stack, lb["id"])
    m = lb["members"][1]
    srv = sim.server
    auth = {"Authorization": f"PVEAPIToken={srv.token_id}={srv.token_secret}"}
    agent = f"{srv.url}/api2/json/nodes/{m['node']}/qemu/{m['vmid']}/agent"
    async with aiohttp.ClientSession(headers=auth) as http:
        async with http.get(f"{agent}/file-read", params={"file": "/etc/keepalived/keepalived.conf"}, ssl=False) as r:
            assert r.status == 200, await r.text()
            original = (await r.json())["data"]["content"]
        assert "nopreempt" in original
        edited = original.replace("    nopreempt\n", "").replace("priority 99", "priority 150")
        async with http.post(f"{agent}/file-write", data={"file": "/etc/keepalived/keepalived.conf",
                                                          "content": edited}, ssl=False) as r:
            assert r.status == 200, await r.text()

    async def repaired() -> list | None:
        jobs = (await stack.call("GET", f"/jobs?resource_id={lb['id']}"))[1]["jobs"]
        fix = [j for j in jobs if j["kind"] == "LoadBalancerConfigure" and j["status"] == "succeeded"]
        return fix or None
    fix = await wait_until(repaired, stack.settings.lb_health_interval_s + 30, "the keepalived drift repaired")
    reason = await stack.pool.fetchval("SELECT args FROM jobs WHERE id = $1", fix[0]["id"])
    assert "drift on lb-1" in reason["reason"], reason
    async with aiohttp.ClientSession(headers=auth) as http:
        async with http.get(f"{agent}/file-read", params={"file": "/etc/keepalived/keepalived.conf"}, ssl=False) as r:
            assert (await r.json())["data"]["content"] == original


async def test_a_rename_is_not_drift(stack: Stack, sim: SimAdmin) -> None:
    """PATCH name is database only: the periodic observe after it finds no drift (the rendered
    file does not depend on the name), so no configure job and no reload follow a rename."""
    lb, job = await _lb(stack, name="before", services=[SERVICE])
    assert (await stack.wait_job(job["id"], timeout_s=120))["status"] == "succeeded"
    status, out = await stack.call("PATCH", f"/load-balancers/{lb['id']}", json={"name": "after"})
    assert status == 200, out
    patched = await stack.pool.fetchval("SELECT now()")

    async def observed_twice() -> bool:
        n = await stack.pool.fetchval("SELECT count(*) FROM jobs WHERE resource_id = $1 AND kind = "
                                      "'LoadBalancerObserve' AND status = 'succeeded' AND created_at > $2",
                                      lb["id"], patched)
        return n >= 2
    await wait_until(observed_twice, stack.settings.lb_health_interval_s * 3 + 20, "two observes after the rename")
    kinds = [r["kind"] for r in await stack.pool.fetch("SELECT kind FROM jobs WHERE resource_id = $1", lb["id"])]
    assert "LoadBalancerConfigure" not in kinds, kinds
