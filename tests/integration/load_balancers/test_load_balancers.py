"""Load balancers through the API (issue 10), against real PostgreSQL and the simulator over HTTPS
(its appliance model: HAProxy grammar, reload, show stat from the world, keepalived's VIP).
Assertions are on the world (VMs, files in the guests, interfaces) and on what GET shows."""
from __future__ import annotations

import hashlib
from typing import Any

import aiohttp
import pytest

from z9.common.tags import normalize_tags

from tests.guest_tools import require_guest_tools
from tests.support import SERVICE_SETTINGS, REGION, SimAdmin, Stack, wait_until

# the operator-provided appliance template (HAProxy, keepalived, the guest agent), put in place
# the way an operator imports one: a template VM named as the region's lb_image setting
LB_TEMPLATE = {"vmid": 9100, "node": "pve1", "config": {
    "name": "z9-lb-appliance", "template": "1", "cores": "1", "memory": "1024", "ostype": "l26",
    "scsihw": "virtio-scsi-single", "scsi0": "local-lvm:base-9100-disk-0,size=2G",
    "ide2": "local-lvm:vm-9100-cloudinit,media=cdrom", "boot": "order=scsi0",
    "net0": "virtio=BC:24:11:91:00:00,bridge=vmbr0", "serial0": "socket", "vga": "serial0", "agent": "1",
    "tags": "z9-image"},
    # the image's own disk state (the simulator's appliance model): its NIC keeps the predictable name
    # ens18, as on a Proxmox virtio guest, so z9 must read the interface from the guest
    "guest": {"models": {"appliance": {"nic_names": "predictable"}}}}


@pytest.fixture(autouse=True)
async def lb_template(sim: SimAdmin) -> None:
    require_guest_tools()  # the appliance judges every file with the real haproxy and keepalived
    await sim._req("POST", "/vms", json=LB_TEMPLATE)


SERVICE = {"protocol": "tcp", "listen_port": 80, "destination_port": 8080,
           "health_check": {"protocol": "tcp", "port": 8080, "interval_s": 3, "timeout_s": 2, "retries": 2}}


async def _server(stack: Stack, name: str) -> dict:
    server, job = await stack.create_server(name, public_ipv4=True)
    assert (await stack.wait_job(job["id"], timeout_s=90))["status"] == "succeeded"

    async def settled() -> Any:
        s = await stack.server(server["id"])
        return s if s["public_ipv4"] else None
    return await wait_until(settled, 30, "the server's address")


async def _listen(sim: SimAdmin, vmid: int, port: int) -> None:
    async with aiohttp.ClientSession() as http:
        async def booted() -> bool:
            async with http.post(f"{sim.url}/guests/{vmid}/listen", json={"port": port}, ssl=False) as r:
                return r.status == 200
        await wait_until(booted, 20, f"VM {vmid} has a guest")


async def _lb(stack: Stack, **body: Any) -> tuple[dict, dict]:
    status, out = await stack.call("POST", "/load-balancers", json={"region": REGION, **body})
    assert status == 202, out
    return out["load_balancer"], out["job"]


async def _get(stack: Stack, lb_id: str) -> dict:
    status, out = await stack.call("GET", f"/load-balancers/{lb_id}")
    assert status == 200, out
    return out["load_balancer"]


async def _guest_file(sim: SimAdmin, vmid: int) -> dict:
    return await sim._req("GET", f"/guests/{vmid}")


def _appliances(state: dict, lb_id: str) -> list[dict]:
    return sorted((v for v in state["vms"] if f"z9-id-{lb_id}" in normalize_tags(v["config"].get("tags"))),
                  key=lambda v: v["config"]["name"])


async def test_lb_ha_two_server_targets(stack: Stack, sim: SimAdmin) -> None:
    """Test 1, then 2 (a target stopped through the API) and 6 (a target deleted to the end)."""
    a = await _server(stack, "web-a")
    b = await _server(stack, "web-b")
    for s in (a, b):
        await _listen(sim, s["observed"]["vmid"], 8080)
    lb, job = await _lb(stack, name="front", type="lb-ha", services=[SERVICE],
                        targets=[{"type": "server", "server_id": a["id"]}, {"type": "server", "server_id": b["id"]}])
    assert lb["status"] == "creating" and lb["health"] == "unknown"
    assert all(h["reason"] == "initial" for t in lb["targets"] for h in t["health_status"])
    done = await stack.wait_job(job["id"], timeout_s=120)
    assert done["status"] == "succeeded", done
    lb = await _get(stack, lb["id"])
    assert lb["status"] == "active"
    apps = _appliances(await sim.state(), lb["id"])
    assert [v["config"]["name"] for v in apps] == ["front-lb-0", "front-lb-1"]
    assert len({v["node"] for v in apps}) == 2 and lb["spread"] is True   # different nodes
    for i, v in enumerate(apps):
        tags = normalize_tags(v["config"]["tags"])
        assert {"z9-role-customer", f"z9-id-{lb['id']}", f"z9-member-lb-{i}"} <= tags
    hashes = set()
    vip = lb["public_net"]["ipv4"]["ip"]
    holders = []
    for v in apps:
        g = await _guest_file(sim, v["vmid"])
        assert "/etc/haproxy/haproxy.cfg" in g["files"]
        ips = [x["ip-address"] for i in g["interfaces"] for x in i["ip-addresses"]]
        holders += [v["vmid"]] if vip in ips else []
    for m in lb["members"]:
        hashes.add(m["config_hash"])
    assert len(hashes) == 1 and lb["config_hash"] in hashes        # the same hash on both
    assert len(holders) == 1                                       # the VIP on exactly one
    assert [m["holds_vip"] for m in lb["members"]].count(True) == 1
    assert lb["health"] == "healthy", lb
    assert all(h["status"] == "healthy" for t in lb["targets"] for h in t["health_status"])

    # 2: stop a target through the API (the power action): unhealthy / server_stopped within one
    # health interval, the load balancer degraded
    status, out = await stack.call("POST", f"/servers/{a['id']}/actions/poweroff")
    assert status == 202 and out["job"]["kind"] == "ServerStop", out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
    assert (await stack.server(a["id"]))["status"] == "stopped"

    async def degraded() -> dict | None:
        cur = await _get(stack, lb["id"])
        return cur if cur["health"] == "degraded" else None
    cur = await wait_until(degraded, stack.settings.lb_health_interval_s + 15, "health degraded")
    ta = next(t for t in cur["targets"] if t.get("server_id") == a["id"])
    assert ta["health_status"] == [{"listen_port": 80, "status": "unhealthy", "reason": "server_stopped", "detail": None}]

    # 6: delete that server to the end (its buffer ends now): the config no longer names it,
    # and the configure job was enqueued in the transaction that finished the server
    status, out = await stack.call("DELETE", f"/servers/{a['id']}")
    assert status == 202, out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
    async with stack.pool.acquire() as c:
        await c.execute("UPDATE servers SET delete_after = now() WHERE id = $1", a["id"])

    async def reconfigured() -> list | None:
        if (await stack.server(a["id"]))["status"] != "deleted":  # the final delete has not finished
            return None
        jobs = (await stack.call("GET", f"/jobs?resource_id={lb['id']}"))[1]["jobs"]
        conf = [j for j in jobs if j["kind"] == "LoadBalancerConfigure"]
        return conf if conf and all(j["status"] in ("succeeded", "failed") for j in conf) else None
    conf = await wait_until(reconfigured, 90, "the load balancer reconfigured after the server's delete")
    assert all(j["status"] == "succeeded" for j in conf), conf
    server_job = [j for j in (await stack.call("GET", f"/jobs?resource_id={a['id']}"))[1]["jobs"]
                  if j["kind"] == "ServerDelete"][0]
    async with stack.pool.acquire() as c:   # enqueued in the transaction that finished the server
        fin = await c.fetchval("SELECT finished_at FROM jobs WHERE id = $1", server_job["id"])
        created = await c.fetch("SELECT created_at FROM jobs WHERE id = ANY($1)", [j["id"] for j in conf])
        deleted_at = await c.fetchval("SELECT deleted_at FROM servers WHERE id = $1", a["id"])
        # one of them (a periodic observe may have enqueued another just before, seeing the VM
        # stopped) has the now() of the transaction that finished the server
        assert fin is not None and deleted_at in [r["created_at"] for r in created], (deleted_at, created)
    for v in _appliances(await sim.state(), lb["id"]):
        g = await sim._req("GET", f"/guests/{v['vmid']}")
        cfg = g["models"]["appliance"]["haproxy"]
        assert a["id"] not in cfg and b["id"] in cfg
    cur = await _get(stack, lb["id"])
    ta = next(t for t in cur["targets"] if t.get("server_id") == a["id"])
    assert ta["health_status"][0]["status"] == "unused" and ta["health_status"][0]["reason"] == "server_deleted"


async def test_rejected_config_fails_permanently(stack: Stack, sim: SimAdmin) -> None:
    """Test 4: a config HAProxy rejects: the job fails permanently with HAProxy's message; the
    running config is untouched."""
    lb, job = await _lb(stack, name="rej", type="lb-small", services=[SERVICE],
                        targets=[{"type": "ip", "ip": "198.51.100.240"}])
    assert (await stack.wait_job(job["id"], timeout_s=120))["status"] == "succeeded"
    before = await _get(stack, lb["id"])
    vm = _appliances(await sim.state(), lb["id"])[0]
    running = (await sim._req("GET", f"/guests/{vm['vmid']}"))["models"]["appliance"]["haproxy"]
    assert hashlib.sha256(running.encode()).hexdigest() == before["config_hash"]
    # the push is corrupted on the appliance's disk (a line HAProxy does not know appended): the
    # appliance's real haproxy -c refuses it
    await sim._req("POST", "/appliance-faults", json={"contains": "198.51.100.241", "inject": "    x on\n"})
    status, out = await stack.call("POST", f"/load-balancers/{lb['id']}/actions/add_target",
                                   json={"type": "ip", "ip": "198.51.100.241"})
    assert status == 202, out
    failed = await stack.wait_job(out["job"]["id"], timeout_s=60)
    assert failed["status"] == "failed" and failed["attempt"] == 1, failed
    assert "unknown keyword 'x' in 'backend' section" in failed["error"]["message"], failed
    assert "/etc/haproxy/haproxy.cfg.new" in failed["error"]["message"]   # the appliance's file, named
    after = (await sim._req("GET", f"/guests/{vm['vmid']}"))["models"]["appliance"]["haproxy"]
    assert after == running
    cur = await _get(stack, lb["id"])
    assert cur["status"] == "failed" and "unknown keyword 'x' in 'backend' section" in cur["status_reason"], cur
    assert cur["config_hash"] == before["config_hash"]                 # still what the appliance runs
    await sim._req("DELETE", "/appliance-faults")
    # the cause gone, a re-run of the failed job applies the action: active again
    status, out = await stack.call("POST", f"/jobs/{failed['id']}/actions/rerun")
    assert status == 202 and out["job"]["kind"] == "LoadBalancerConfigure", out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
    cur = await _get(stack, lb["id"])
    assert cur["status"] == "active" and cur["config_hash"] != before["config_hash"], cur
    assert "198.51.100.241" in (await sim._req("GET", f"/guests/{vm['vmid']}"))["models"]["appliance"]["haproxy"]


async def test_a_cancelled_configure_is_applied_by_the_drift_repair(stack: Stack, sim: SimAdmin) -> None:
    """Cancelling a pending LoadBalancerConfigure does not undo its action (the row is the
    desired state): the load balancer stays active and the action is applied all the same — here
    by the job before it, whose verify renders the row as it is now (else the periodic observe's
    drift repair would)."""
    lb, job = await _lb(stack, name="cc", type="lb-small", services=[SERVICE],
                        targets=[{"type": "ip", "ip": "198.51.100.240"}])
    assert (await stack.wait_job(job["id"], timeout_s=120))["status"] == "succeeded"
    lb = await _get(stack, lb["id"])
    vmid = lb["members"][0]["vmid"]
    # hold the first action's push so that the second action's job waits behind it (pending)
    await sim._req("POST", "/faults", json={"method": "POST", "path": f"/qemu/{vmid}/agent/file-write",
                                            "action": "delay", "seconds": 4, "times": 1})
    status, first = await stack.call("POST", f"/load-balancers/{lb['id']}/actions/add_target",
                                     json={"type": "ip", "ip": "198.51.100.241"})
    assert status == 202, first
    status, second = await stack.call("POST", f"/load-balancers/{lb['id']}/actions/add_target",
                                      json={"type": "ip", "ip": "198.51.100.242"})
    assert status == 202, second
    status, out = await stack.call("POST", f"/jobs/{second['job']['id']}/actions/cancel")
    assert status == 200 and out["job"]["error"]["class"] == "cancelled", out
    assert (await stack.wait_job(first["job"]["id"], timeout_s=60))["status"] == "succeeded"
    assert (await _get(stack, lb["id"]))["status"] == "active"

    async def applied() -> bool:
        cfg = (await sim._req("GET", f"/guests/{vmid}"))["models"]["appliance"]["haproxy"]
        return "198.51.100.242" in cfg
    await wait_until(applied, stack.settings.lb_health_interval_s + 30, "the cancelled action applied")

    async def settled() -> dict | None:
        cur = await _get(stack, lb["id"])
        cfg = (await sim._req("GET", f"/guests/{vmid}"))["models"]["appliance"]["haproxy"]
        return cur if cur["status"] == "active" and cur["config_hash"] == hashlib.sha256(cfg.encode()).hexdigest() \
            else None
    await wait_until(settled, 30, "the load balancer active with the new hash")


async def test_action_preconditions(stack: Stack, sim: SimAdmin) -> None:
    lb, _ = await _lb(stack, name="pre", services=[SERVICE], targets=[{"type": "ip", "ip": "198.51.100.240"}])
    base = f"/load-balancers/{lb['id']}/actions"
    status, out = await stack.call("POST", f"{base}/add_target", json={"type": "ip", "ip": "198.51.100.240"})
    assert status == 409 and out["error"]["code"] == "target_already_defined", out
    status, out = await stack.call("POST", f"{base}/add_service", json={**SERVICE})
    assert status == 409 and out["error"]["code"] == "source_port_already_used", out
    status, out = await stack.call("POST", f"{base}/remove_target", json={"type": "ip", "ip": "203.0.113.9"})
    assert status == 409 and out["error"]["code"] == "target_not_found", out
    status, out = await stack.call("POST", f"{base}/delete_service", json={"listen_port": 81})
    assert status == 409 and out["error"]["code"] == "service_not_found", out
    status, out = await stack.call("POST", "/load-balancers", json={"region": REGION, "name": "pre"})
    assert status == 409 and out["error"]["code"] == "uniqueness_error", out
    status, out = await stack.call("POST", "/load-balancers", json={"region": REGION, "name": "x",
                                                                      "services": [SERVICE, SERVICE]})
    assert status == 422, out
    # the VIP is the load balancer's: not deleted on its own
    vip = lb["public_net"]["ipv4"]["address_id"]
    status, out = await stack.call("DELETE", f"/addresses/{vip}")
    assert status == 409 and out["error"]["code"] == "load_balancer_address", out
    for action, body in (("assign", {"server_id": "srv_01jd3x5v8q2m6n4p7r9s1t3w5y"}), ("unassign", {})):
        status, out = await stack.call("POST", f"/addresses/{vip}/actions/{action}", json=body)
        assert status == 409 and out["error"]["code"] == "load_balancer_address", (action, out)
    status, out = await stack.call("POST", f"{base}/change_algorithm", json={"type": "least_connections"})
    assert status == 202 and out["load_balancer"]["algorithm"] == "least_connections", out


async def _pve(sim: SimAdmin, method: str, path: str, data: dict | None = None) -> Any:
    """An out-of-band request to the simulated PVE API, as an operator's tool would send it."""
    srv = sim.server
    auth = {"Authorization": f"PVEAPIToken={srv.token_id}={srv.token_secret}"}
    async with aiohttp.ClientSession() as http:
        async with http.request(method, f"{srv.url}/api2/json{path}", headers=auth, data=data, ssl=False) as r:
            assert r.status == 200, await r.text()
            return (await r.json())["data"]


async def test_vip_moves_when_its_holder_stops(stack: Stack, sim: SimAdmin) -> None:
    """Test 5: the VIP holder is stopped out of band: the other appliance takes the VIP; the load
    balancer reports it (the periodic observe job)."""
    lb, job = await _lb(stack, name="ha", type="lb-ha", services=[SERVICE],
                        targets=[{"type": "ip", "ip": "198.51.100.240"}])
    assert (await stack.wait_job(job["id"], timeout_s=120))["status"] == "succeeded"
    lb = await _get(stack, lb["id"])
    holder = next(m for m in lb["members"] if m["holds_vip"])
    other = next(m for m in lb["members"] if not m["holds_vip"])
    await _pve(sim, "POST", f"/nodes/{holder['node']}/qemu/{holder['vmid']}/status/stop")

    async def moved() -> dict | None:
        cur = await _get(stack, lb["id"])
        ms = {m["name"]: m for m in cur["members"]}
        return cur if ms[other["name"]]["holds_vip"] and not ms[holder["name"]]["running"] else None
    await wait_until(moved, stack.settings.lb_health_interval_s + 20, "the VIP on the other appliance")
    g = await sim._req("GET", f"/guests/{other['vmid']}")
    assert lb["public_net"]["ipv4"]["ip"] in [x["ip-address"] for i in g["interfaces"] for x in i["ip-addresses"]]

    # the periodic observe saw an appliance down (lost redundancy) and enqueued a configure job,
    # which starts it again; with nopreempt the VIP stays where it is
    async def repaired() -> dict | None:
        cur = await _get(stack, lb["id"])
        ms = {m["name"]: m for m in cur["members"]}
        return cur if ms[holder["name"]]["running"] and ms[holder["name"]]["config_hash"] else None
    cur = await wait_until(repaired, stack.settings.lb_health_interval_s + 60, "the stopped appliance started again")
    ms = {m["name"]: m for m in cur["members"]}
    assert ms[other["name"]]["holds_vip"] and not ms[holder["name"]]["holds_vip"]
    jobs = (await stack.call("GET", f"/jobs?resource_id={lb['id']}"))[1]["jobs"]
    assert any(j["kind"] == "LoadBalancerConfigure" and j["status"] == "succeeded" for j in jobs)


async def test_delete_cancel_delete(stack: Stack, sim: SimAdmin) -> None:
    """Test 7: delete with a buffer (appliances stopped, VIP kept), cancel (started again), then
    delete to the end: appliances destroyed by the guarded removal, then the VIP and appliance
    addresses released — only after the VMs are gone."""
    lb, job = await _lb(stack, name="gone", type="lb-small", services=[SERVICE],
                        targets=[{"type": "ip", "ip": "198.51.100.240"}])
    assert (await stack.wait_job(job["id"], timeout_s=120))["status"] == "succeeded"
    status, out = await stack.call("DELETE", f"/load-balancers/{lb['id']}")
    assert status == 202 and out["job"]["kind"] == "LoadBalancerStop", out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
    apps = _appliances(await sim.state(), lb["id"])
    assert apps and all(not v["running"] for v in apps)
    async with stack.pool.acquire() as c:
        live = await c.fetchval("SELECT count(*) FROM addresses WHERE load_balancer_id = $1 AND status <> 'deleted'",
                                lb["id"])
    assert live == 2                                     # VIP and lb-0 kept during the buffer
    status, out = await stack.call("POST", f"/load-balancers/{lb['id']}/actions/cancel-deletion")
    assert status == 202 and out["job"]["kind"] == "LoadBalancerStart", out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=90))["status"] == "succeeded"
    assert all(v["running"] for v in _appliances(await sim.state(), lb["id"]))
    assert (await _get(stack, lb["id"]))["status"] == "active"

    status, out = await stack.call("DELETE", f"/load-balancers/{lb['id']}")
    assert status == 202, out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"

    # the guard first: an appliance that (out of band) carries a platform role is never destroyed,
    # and nothing is released — the final delete fails permanently, naming the guard
    vm = _appliances(await sim.state(), lb["id"])[0]
    tags = normalize_tags(vm["config"]["tags"])
    await _pve(sim, "PUT", f"/nodes/{vm['node']}/qemu/{vm['vmid']}/config",
               data={"tags": ";".join(sorted(tags | {"z9-role-platform"}))})
    async with stack.pool.acquire() as c:
        await c.execute("UPDATE load_balancers SET delete_after = now() WHERE id = $1", lb["id"])

    async def refused() -> dict | None:
        jobs = (await stack.call("GET", f"/jobs?resource_id={lb['id']}"))[1]["jobs"]
        final = [j for j in jobs if j["kind"] == "LoadBalancerDelete"]
        return final[0] if final and final[0]["status"] == "failed" else None
    final = await wait_until(refused, 60, "the final delete refused by the guard")
    assert "deletion guard refused" in final["error"]["message"], final
    assert [v["vmid"] for v in _appliances(await sim.state(), lb["id"])] == [vm["vmid"]]
    async with stack.pool.acquire() as c:
        live = await c.fetchval("SELECT count(*) FROM addresses WHERE load_balancer_id = $1 AND status <> 'deleted'",
                                lb["id"])
    assert live == 2 and (await _get(stack, lb["id"]))["status"] == "failed"
    # the operator takes the role off; delete again, to the end
    await _pve(sim, "PUT", f"/nodes/{vm['node']}/qemu/{vm['vmid']}/config", data={"tags": ";".join(sorted(tags))})
    status, out = await stack.call("DELETE", f"/load-balancers/{lb['id']}")
    assert status == 202, out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
    async with stack.pool.acquire() as c:
        await c.execute("UPDATE load_balancers SET delete_after = now() WHERE id = $1", lb["id"])

    async def deleted() -> dict | None:
        cur = await _get(stack, lb["id"])
        return cur if cur["status"] == "deleted" else None
    await wait_until(deleted, 90, "the load balancer deleted")
    assert _appliances(await sim.state(), lb["id"]) == []
    async with stack.pool.acquire() as c:
        rows = await c.fetch("SELECT a.status::text, a.deleted_at, i.reusable_after FROM addresses a "
                             "JOIN address_pool_ips i ON i.ip = a.ip WHERE a.load_balancer_id = $1", lb["id"])
        fin = await c.fetchval("SELECT finished_at FROM jobs WHERE resource_id = $1 AND kind = 'LoadBalancerDelete' "
                               "AND status = 'succeeded'",
                               lb["id"])
    assert len(rows) == 2 and all(r["status"] == "deleted" and r["reusable_after"] is not None for r in rows)
    assert all(r["deleted_at"] <= fin for r in rows)     # released in the delete's finishing transaction


# ---------------------------------------------------------------- SIGKILL mid-push (test 3)

import signal  # noqa: E402,F401
from pathlib import Path  # noqa: E402
from typing import AsyncIterator  # noqa: E402

from z9.common import store  # noqa: E402
from z9.common.settings import Settings  # noqa: E402

from tests.support import Services, service_env  # noqa: E402

FAST = dict(SERVICE_SETTINGS, lb_health_interval_s=3600)  # (tests/support.py) health polled by the tests


@pytest.fixture
async def services(settings: Settings, tmp_path: Path) -> AsyncIterator[Services]:
    svc = Services(service_env(settings, **FAST), tmp_path)
    try:
        yield svc
    finally:
        svc.close()
        print(svc.logs())


async def test_add_target_survives_sigkill_mid_push(api: Stack, sim: SimAdmin, services: Services) -> None:
    """Test 3: the executor is SIGKILLed while lb-1's push is under way (its file-write held by the
    simulator), lb-0 already pushed. After recovery both appliances run the new hash, and the
    pushes that took effect after the crash are at most one per appliance (none on lb-0)."""
    services.start("scheduler")
    first = services.start("executor")
    lb, job = await _lb(api, name="crash", type="lb-ha", services=[SERVICE],
                        targets=[{"type": "ip", "ip": "198.51.100.240"}])
    assert (await api.wait_job(job["id"], timeout_s=120))["status"] == "succeeded"
    lb = await _get(api, lb["id"])
    vm = {m["name"]: m["vmid"] for m in lb["members"]}
    await sim._req("POST", "/faults", json={"method": "POST", "path": f"/qemu/{vm['lb-1']}/agent/file-write",
                                            "action": "delay", "seconds": 8, "times": 1})
    status, out = await api.call("POST", f"/load-balancers/{lb['id']}/actions/add_target",
                                 json={"type": "ip", "ip": "198.51.100.241"})
    assert status == 202, out
    jid = out["job"]["id"]

    async def mid_push() -> bool:
        j = await store.job_get(api.pool, jid)
        states = {(s["name"], s["detail"].get("member")): s["state"] for s in j.steps}
        return states.get(("push_haproxy", "lb-0")) == "done" and states.get(("push_haproxy", "lb-1")) == "running"
    await wait_until(mid_push, 60, "lb-0 pushed and lb-1's push under way")

    async def reloads() -> dict[str, int]:
        return {m: int((await sim._req("GET", f"/guests/{v}"))["models"]["appliance"].get("reloads", 0))
                for m, v in vm.items()}
    before = await reloads()
    await first.kill()
    services.start("executor")
    done = await api.wait_job(jid, timeout_s=90)
    assert done["status"] == "succeeded", done
    assert done["attempt"] >= 2
    after = await reloads()
    assert after["lb-0"] == before["lb-0"]                 # lb-0 was not pushed again
    assert after["lb-1"] - before["lb-1"] <= 1             # lb-1 at most once
    lb = await _get(api, lb["id"])
    assert {m["config_hash"] for m in lb["members"]} == {lb["config_hash"]}
    for v in vm.values():
        running = (await sim._req("GET", f"/guests/{v}"))["models"]["appliance"]["haproxy"]
        assert "198.51.100.241" in running
        assert hashlib.sha256(running.encode()).hexdigest() == lb["config_hash"]


async def test_drift_is_found_and_repaired(stack: Stack, sim: SimAdmin) -> None:
    """A running config changed by hand (out of band, through the agent): the periodic observe job
    sees the drift and enqueues a configure job in its finishing transaction, which puts the
    rendered file back."""
    lb, job = await _lb(stack, name="drift", type="lb-small", services=[SERVICE],
                        targets=[{"type": "ip", "ip": "198.51.100.240"}])
    assert (await stack.wait_job(job["id"], timeout_s=120))["status"] == "succeeded"
    lb = await _get(stack, lb["id"])
    m = lb["members"][0]
    g = await sim._req("GET", f"/guests/{m['vmid']}")
    edited = g["models"]["appliance"]["haproxy"].replace("balance roundrobin", "balance leastconn")
    srv = sim.server
    auth = {"Authorization": f"PVEAPIToken={srv.token_id}={srv.token_secret}"}
    agent = f"{srv.url}/api2/json/nodes/{m['node']}/qemu/{m['vmid']}/agent"
    async with aiohttp.ClientSession(headers=auth) as http:
        async with http.post(f"{agent}/file-write", data={"file": "/etc/haproxy/haproxy.cfg", "content": edited},
                             ssl=False) as r:
            assert r.status == 200, await r.text()
        async with http.post(f"{agent}/exec", data=[("command", "systemctl"), ("command", "reload"),
                                                    ("command", "haproxy")], ssl=False) as r:
            assert r.status == 200, await r.text()

    async def repaired() -> list | None:
        jobs = (await stack.call("GET", f"/jobs?resource_id={lb['id']}"))[1]["jobs"]
        fix = [j for j in jobs if j["kind"] == "LoadBalancerConfigure" and j["status"] == "succeeded"]
        return fix or None
    fix = await wait_until(repaired, stack.settings.lb_health_interval_s + 30, "the drift repaired")
    async with stack.pool.acquire() as c:
        assert "drift on lb-0" in (await c.fetchval("SELECT args FROM jobs WHERE id = $1", fix[0]["id"]))["reason"]
    running = (await sim._req("GET", f"/guests/{m['vmid']}"))["models"]["appliance"]["haproxy"]
    assert hashlib.sha256(running.encode()).hexdigest() == lb["config_hash"]


async def test_server_target_preconditions(api: Stack) -> None:
    """409 missing_ipv4 (no address the appliances can reach), server_deleting; 422 unknown server
    (the API alone: no job needs to run)."""
    lb, _ = await _lb(api, name="pre2", services=[SERVICE])
    base = f"/load-balancers/{lb['id']}/actions/add_target"
    server, _ = await api.create_server("no-ip")
    status, out = await api.call("POST", base, json={"type": "server", "server_id": server["id"]})
    assert status == 409 and out["error"]["code"] == "missing_ipv4", out
    status, out = await api.call("DELETE", f"/servers/{server['id']}")
    assert status == 202, out
    status, out = await api.call("POST", base, json={"type": "server", "server_id": server["id"]})
    assert status == 409 and out["error"]["code"] == "resource_deleting", out
    status, out = await api.call("POST", base, json={"type": "server", "server_id": "srv_01jd3x5v8q2m6n4p7r9s1t3w5y"})
    assert status == 422, out
    status, out = await api.call("POST", "/load-balancers", json={
        "region": REGION, "name": "pre3", "targets": [{"type": "server", "server_id": server["id"]}]})
    assert status == 409 and out["error"]["code"] == "resource_deleting", out
    # region_mismatch: a server of another region (its row moved there: the test stack has one region)
    other, _ = await api.create_server("elsewhere")
    await api.pool.execute("UPDATE servers SET region = 'other-1' WHERE id = $1", other["id"])
    status, out = await api.call("POST", base, json={"type": "server", "server_id": other["id"]})
    assert status == 409 and out["error"]["code"] == "region_mismatch", out
    assert "other-1" in out["error"]["message"] and REGION in out["error"]["message"]
    status, out = await api.call("DELETE", f"/load-balancers/{lb['id']}")
    assert status == 202, out
    status, out = await api.call("POST", base, json={"type": "ip", "ip": "203.0.113.250"})
    assert status == 409 and out["error"]["code"] == "resource_deleting", out
    # the type's limits: 500 targets, 16 services (and the installation's: targets × services,
    # checks per second; tests/integration/load_balancers/test_lb_target_rules.py)
    full, _ = await _lb(api, name="full", targets=[{"type": "ip", "ip": f"198.51.100.{i % 250 + 1}"} for i in range(250)]
                        + [{"type": "ip", "ip": f"192.0.2.{i % 250 + 1}"} for i in range(250)],
                        services=[SERVICE])
    status, out = await api.call("POST", f"/load-balancers/{full['id']}/actions/add_target",
                                 json={"type": "ip", "ip": "203.0.113.250"})
    assert status == 409 and out["error"]["code"] == "resource_limit_exceeded", out
    many, _ = await _lb(api, name="many", services=[{**SERVICE, "listen_port": 1000 + p} for p in range(16)])
    status, out = await api.call("POST", f"/load-balancers/{many['id']}/actions/add_service",
                                 json={**SERVICE, "listen_port": 2000})
    assert status == 409 and out["error"]["code"] == "resource_limit_exceeded", out
    status, out = await api.call("POST", "/load-balancers", json={
        "region": REGION, "name": "too-many", "targets": [{"type": "ip", "ip": f"10.0.{i // 250}.{i % 250 + 1}"}
                                                          for i in range(501)]})
    assert status == 422 and out["error"]["details"][0]["field"] == "targets", out


async def test_a_config_larger_than_one_file_write(stack: Stack, sim: SimAdmin) -> None:
    """500 targets × 4 services render a file far above PVE's 61,440-character file-write limit:
    it is written in parts joined in the guest, checked, swapped and read back whole."""
    # checks every 15 s: 2,000 targets × services stay within Z9_LB_MAX_CHECKS_PER_S (200)
    slow = {**SERVICE["health_check"], "interval_s": 15}
    services = [{**SERVICE, "listen_port": p, "destination_port": 8000 + p, "health_check": slow}
                for p in (80, 81, 82, 83)]
    targets = [{"type": "ip", "ip": f"198.51.100.{i % 250 + 1}"} for i in range(250)] + \
              [{"type": "ip", "ip": f"192.0.2.{i % 250 + 1}"} for i in range(250)]
    lb, job = await _lb(stack, name="big", services=services, targets=targets)
    done = await stack.wait_job(job["id"], timeout_s=120)
    assert done["status"] == "succeeded", done
    lb = await _get(stack, lb["id"])
    vm = _appliances(await sim.state(), lb["id"])[0]
    g = await sim._req("GET", f"/guests/{vm['vmid']}")
    running = g["models"]["appliance"]["haproxy"]
    assert len(running) > 100_000 and running.count("    server ") == 2000
    assert hashlib.sha256(running.encode()).hexdigest() == lb["config_hash"]
    assert not [f for f in g["files"] if ".part" in f or f.endswith(".tmp")]   # the parts are gone


async def test_labels_patch_and_label_selector(api: Stack) -> None:
    """Labels at create and through PATCH (database only, no job); GET /v1/load-balancers filters
    on them with label_selector like every resource type."""
    a, _ = await _lb(api, name="lab-a", labels={"env": "prod", "tier": "web"})
    b, _ = await _lb(api, name="lab-b")
    assert a["labels"] == {"env": "prod", "tier": "web"} and b["labels"] == {}
    status, out = await api.call("PATCH", f"/load-balancers/{b['id']}", json={"labels": {"env": "dev"}})
    assert status == 200 and out["load_balancer"]["labels"] == {"env": "dev"}, out
    status, out = await api.call("PATCH", f"/load-balancers/{b['id']}", json={"name": "lab-b2"})
    assert status == 200 and out["load_balancer"]["name"] == "lab-b2" and out["load_balancer"]["labels"] == {"env": "dev"}

    async def ids(query: str) -> list[str]:
        status, out = await api.call("GET", f"/load-balancers?{query}")
        assert status == 200, (query, out)
        return [x["id"] for x in out["load_balancers"]]
    assert await ids("label_selector=env%3Dprod") == [a["id"]]
    assert await ids("label_selector=env%20in%20(prod,dev)") == [a["id"], b["id"]]
    assert await ids("label_selector=!tier") == [b["id"]]
    status, out = await api.call("GET", "/load-balancers?label_selector=env%20notin%20(x)")
    assert status == 422 and out["error"]["details"][0]["field"] == "label_selector"
    status, out = await api.call("PATCH", f"/load-balancers/{b['id']}", json={"name": "lab-a"})
    assert status == 409 and out["error"]["code"] == "uniqueness_error", out
    status, out = await api.call("PATCH", f"/load-balancers/{b['id']}", json={})
    assert status == 422, out
    status, out = await api.call("PATCH", f"/load-balancers/{b['id']}", json={"labels": {"-bad": "x"}})
    assert status == 422, out
    status, out = await api.call("PATCH", "/load-balancers/lb_01jd3x5v8q2m6n4p7r9s1t3w5y", json={"name": "x"})
    assert status == 404, out
    jobs = (await api.call("GET", f"/jobs?resource_id={b['id']}"))[1]["jobs"]
    assert [j["kind"] for j in jobs] == ["LoadBalancerCreate"]          # PATCH made no job


async def test_addresses_of_a_load_balancer_count_against_the_quota(api: Stack) -> None:
    """The VIP and each appliance's address are the tenant's addresses: an lb-ha needs 3 of the
    addresses quota, an lb-small 2; over it 403 quota_exceeded and nothing is allocated."""
    await store.tenant_quota_set(api.pool, api.tenant_id, {"addresses": 2})
    status, out = await api.call("POST", "/load-balancers", json={"region": REGION, "name": "q-ha", "type": "lb-ha"})
    assert status == 403 and out["error"]["code"] == "quota_exceeded", out
    assert out["error"]["details"] == [{"limit": "addresses", "quota": 2, "used": 0, "requested": 3}]
    async with api.pool.acquire() as c:
        assert await c.fetchval("SELECT count(*) FROM addresses WHERE tenant_id = $1", api.tenant_id) == 0
    lb, _ = await _lb(api, name="q-small", type="lb-small")
    status, out = await api.call("POST", "/addresses", json={"region": REGION, "name": "one-more"})
    assert status == 403 and out["error"]["details"][0]["used"] == 2, out
    # deleting the load balancer keeps its addresses during the buffer (they still count)
    status, out = await api.call("DELETE", f"/load-balancers/{lb['id']}")
    assert status == 202, out
    status, out = await api.call("POST", "/load-balancers", json={"region": REGION, "name": "q-2"})
    assert status == 403 and out["error"]["details"][0]["used"] == 2, out


async def test_load_balancers_count_against_their_own_quota(api: Stack) -> None:
    """Each load balancer is two VMs and their checks on the shared hypervisor, whatever its
    addresses: a quota of its own (``load_balancers``) bounds how many a tenant has; one being
    deleted still counts (it can be restored); ``GET /v1/quota`` shows it."""
    await store.tenant_quota_set(api.pool, api.tenant_id, {"load_balancers": 1})
    lb, _ = await _lb(api, name="only-one", type="lb-small")
    status, out = await api.call("POST", "/load-balancers", json={"region": REGION, "name": "second"})
    assert status == 403 and out["error"]["code"] == "quota_exceeded", out
    assert out["error"]["details"] == [{"limit": "load_balancers", "quota": 1, "used": 1, "requested": 1}]
    status, out = await api.call("DELETE", f"/load-balancers/{lb['id']}")
    assert status == 202, out
    status, out = await api.call("POST", "/load-balancers", json={"region": REGION, "name": "second"})
    assert status == 403, out
    status, quota = await api.call("GET", "/quota")
    assert status == 200 and quota["quotas"]["load_balancers"] == {"limit": 1, "used": 1}, quota


async def test_cancel_and_rerun_of_load_balancer_jobs(api: Stack) -> None:
    """Job actions on load balancer jobs (the API alone: no executor runs them). A cancelled
    create leaves the load balancer failed (deletable, its create re-runnable); the deletion's
    own jobs are not re-run (delete again instead)."""
    lb, job = await _lb(api, name="cr", services=[SERVICE])
    # a configure queued behind the create, cancelled: the create is still to run (still creating)
    status, out = await api.call("POST", f"/load-balancers/{lb['id']}/actions/add_target",
                                 json={"type": "ip", "ip": "198.51.100.240"})
    assert status == 202, out
    status, out = await api.call("POST", f"/jobs/{out['job']['id']}/actions/cancel")
    assert status == 200, out
    assert (await _get(api, lb["id"]))["status"] == "creating"
    # and the other way round on a second one: its create cancelled, the configure behind it
    # converges the load balancer (creates the appliances): still creating
    lb2, job2 = await _lb(api, name="cr2", services=[SERVICE])
    status, out = await api.call("POST", f"/load-balancers/{lb2['id']}/actions/change_algorithm",
                                 json={"type": "least_connections"})
    assert status == 202, out
    status, _ = await api.call("POST", f"/jobs/{job2['id']}/actions/cancel")
    assert status == 200 and (await _get(api, lb2["id"]))["status"] == "creating"
    # the create cancelled with nothing behind it: failed
    status, out = await api.call("POST", f"/jobs/{job['id']}/actions/cancel")
    assert status == 200 and out["job"]["error"]["class"] == "cancelled", out
    cur = await _get(api, lb["id"])
    assert cur["status"] == "failed" and "cancelled" in cur["status_reason"], cur
    status, out = await api.call("POST", f"/jobs/{job['id']}/actions/rerun")
    assert status == 202 and out["job"]["kind"] == "LoadBalancerCreate", out
    rerun = out["job"]["id"]
    status, out = await api.call("POST", f"/jobs/{rerun}/actions/cancel")
    assert status == 200, out
    # a failed create (its create never succeeded) is deleted at once: its final job, no buffer
    status, out = await api.call("DELETE", f"/load-balancers/{lb['id']}")
    assert status == 202 and out["job"]["kind"] == "LoadBalancerDelete", out
    status, out = await api.call("POST", f"/jobs/{rerun}/actions/rerun")    # the load balancer is being destroyed
    assert status == 409 and out["error"]["code"] == "resource_deleting", out
    # a buffered deletion's own job (lb2 is still creating: its deletion has a buffer) is not re-run
    status, out = await api.call("DELETE", f"/load-balancers/{lb2['id']}")
    assert status == 202 and out["job"]["kind"] == "LoadBalancerStop", out
    stop = out["job"]["id"]
    status, out = await api.call("POST", f"/jobs/{stop}/actions/cancel")
    assert status == 200, out
    status, out = await api.call("POST", f"/jobs/{stop}/actions/rerun")
    assert status == 409 and out["error"]["code"] == "job_not_rerunnable", out
