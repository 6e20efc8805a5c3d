"""Firewalls (Hetzner Cloud's shape) compiled into each member server's own VM firewall, against the
simulator over HTTPS with pve-firewall's 10 s cycle on a clock the test steps: what a firewall opens is
delivered, what it does not is dropped (``sim.deliver``), the server kind's platform part stays, a member is
``applied`` only after the cycle, and ``enforced: false`` while the datacenter firewall is off."""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from z9.common.clock import TestClock

from tests.support import REGION, SimAdmin, Stack, wait_until

OUTSIDE = "203.0.113.9"
ANYWHERE = ["0.0.0.0/0", "::/0"]
SSH_HTTPS = [{"direction": "in", "protocol": "tcp", "port": "22", "source_ips": ANYWHERE},
             {"direction": "in", "protocol": "tcp", "port": "443", "source_ips": ANYWHERE, "description": "https"}]


@pytest.fixture
async def firewall_on(sim: SimAdmin) -> AsyncIterator[None]:
    fw = sim.server.cluster.firewall
    fw.cluster_options["enable"] = "1"
    await sim.firewall_cycle()
    try:
        yield
    finally:
        fw.cluster_options.pop("enable", None)


async def _server(stack: Stack, name: str, **over: Any) -> dict:
    server, job = await stack.create_server(name, public_ipv4=True, **over)
    assert (await stack.wait_job(job["id"], timeout_s=90))["status"] == "succeeded"

    async def settled() -> Any:
        s = await stack.server(server["id"])
        return s if s["public_ipv4"] and s["observed"] and s["observed"].get("vmid") else None
    return await wait_until(settled, 30, "the server's address")


def _ip(server: dict) -> str:
    v = server["public_ipv4"]
    return str(v["ip"] if isinstance(v, dict) else v)


async def _deliver(sim: SimAdmin, src: str | int, dst: str | int, proto: str = "tcp", port: int | None = None) -> bool:
    return bool((await sim.deliver(src, dst, proto, port))["delivered"])


async def _firewall(stack: Stack, **body: Any) -> tuple[dict, dict]:
    status, out = await stack.call("POST", "/firewalls", json={"region": REGION, **body})
    assert status == 202, out
    return out["firewall"], out["job"]


async def _get(stack: Stack, fid: str) -> dict:
    status, out = await stack.call("GET", f"/firewalls/{fid}")
    assert status == 200, out
    return out["firewall"]


async def _applied(stack: Stack, clock: TestClock, job_id: str) -> dict:
    """Step the clock past pve-firewall's cycle while the job waits for it; the job's end."""
    async def waiting_or_done() -> Any:
        j = await stack.job(job_id)
        if j["status"] in ("succeeded", "failed"):
            return j
        return j if any(s["name"] == "wait_cycle" and s["state"] == "running" for s in j["steps"]) else None
    await wait_until(waiting_or_done, 60, "the job waiting for the firewall cycle")
    clock.step(12)
    return await stack.wait_job(job_id, timeout_s=60)


async def test_a_firewall_on_a_server_opens_its_ports_and_drops_the_rest(
        stack: Stack, sim: SimAdmin, firewall_on: None, clock: TestClock) -> None:
    a = await _server(stack, "fw-a")
    b = await _server(stack, "fw-b")  # no firewall: everything still open
    fw, job = await _firewall(stack, name="web", rules=SSH_HTTPS, applied_to=[{"server_id": a["id"]}])
    assert [m["status"] for m in fw["members"]] == ["pending"]
    done = await _applied(stack, clock, job["id"])
    assert done["status"] == "succeeded", done
    await sim.firewall_cycle()
    got = await _get(stack, fw["id"])
    assert got["status"] == "active", got
    assert [(m["server_id"], m["status"], m["enforced"]) for m in got["members"]] == [(a["id"], "applied", True)], got
    vmid = a["observed"]["vmid"]
    opts = sim.server.cluster.firewall.vm(vmid).options
    assert (opts.get("policy_in"), opts.get("policy_out")) == ("DROP", "ACCEPT"), opts
    for port in (22, 443):
        assert await _deliver(sim, OUTSIDE, _ip(a), "tcp", port)
    assert not await _deliver(sim, OUTSIDE, _ip(a), "tcp", 80)
    assert not await _deliver(sim, OUTSIDE, _ip(a), "udp", 53)
    assert await _deliver(sim, OUTSIDE, _ip(b), "tcp", 80)
    comments = [r.get("comment") for r in sim.server.cluster.firewall.vm(vmid).rules]
    assert comments == [f"z9 firewall {fw['id']}: rule 0", f"z9 firewall {fw['id']}: rule 1: https"], comments


async def test_applied_only_after_the_cycle_and_enforced_from_it(
        stack: Stack, sim: SimAdmin, firewall_on: None, clock: TestClock) -> None:
    a = await _server(stack, "fw-cycle")
    fw, job = await _firewall(stack, name="cycle", rules=SSH_HTTPS, applied_to=[{"server_id": a["id"]}])

    async def waiting() -> Any:
        j = await stack.job(job["id"])
        return j if any(s["name"] == "wait_cycle" and s["state"] == "running" for s in j["steps"]) else None
    await wait_until(waiting, 60, "the job waiting for pve-firewall's cycle")
    # written, not yet compiled: still open, and the member says so
    assert [m["status"] for m in (await _get(stack, fw["id"]))["members"]] == ["pending"]
    assert await _deliver(sim, OUTSIDE, _ip(a), "tcp", 80)
    await sim.firewall_cycle()
    assert not await _deliver(sim, OUTSIDE, _ip(a), "tcp", 80)
    assert [m["status"] for m in (await _get(stack, fw["id"]))["members"]] == ["pending"]
    clock.step(12)
    assert (await stack.wait_job(job["id"], timeout_s=60))["status"] == "succeeded"
    [m] = (await _get(stack, fw["id"]))["members"]
    assert (m["status"], m["enforced"]) == ("applied", True) and m["applied_at"], m


async def test_enforced_false_while_the_datacenter_firewall_is_off(
        stack: Stack, sim: SimAdmin, clock: TestClock) -> None:
    a = await _server(stack, "fw-off")
    fw, job = await _firewall(stack, name="off", rules=SSH_HTTPS, applied_to=[{"server_id": a["id"]}])
    assert (await _applied(stack, clock, job["id"]))["status"] == "succeeded"
    [m] = (await _get(stack, fw["id"]))["members"]
    assert (m["status"], m["enforced"]) == ("applied", False), m
    await sim.firewall_cycle()
    assert await _deliver(sim, OUTSIDE, _ip(a), "tcp", 80)  # nothing is filtered at all


async def test_a_label_selector_takes_matching_servers_and_later_ones(
        stack: Stack, sim: SimAdmin, firewall_on: None, clock: TestClock) -> None:
    web1 = await _server(stack, "web-1", labels={"role": "web"})
    web2 = await _server(stack, "web-2", labels={"role": "web"})
    db = await _server(stack, "db-1", labels={"role": "db"})
    fw, job = await _firewall(stack, name="web", rules=SSH_HTTPS, applied_to=[{"label_selector": "role=web"}])
    assert sorted(m["server_id"] for m in fw["members"]) == sorted([web1["id"], web2["id"]])
    assert (await _applied(stack, clock, job["id"]))["status"] == "succeeded"
    await sim.firewall_cycle()
    for s in (web1, web2):
        assert await _deliver(sim, OUTSIDE, _ip(s), "tcp", 22)
        assert await _deliver(sim, OUTSIDE, _ip(s), "tcp", 443)
        assert not await _deliver(sim, OUTSIDE, _ip(s), "tcp", 80)
    assert await _deliver(sim, OUTSIDE, _ip(db), "tcp", 80)
    got = await _get(stack, fw["id"])
    assert got["applied_to"][0]["applied_to_resources"] == sorted([web1["id"], web2["id"]])

    # a server made later with matching labels: its create writes the firewall before it first starts,
    # and a firewall job after it sees it applied
    server, sjob = await stack.create_server("web-3", public_ipv4=True, labels={"role": "web"})
    fw_jobs = [j for j in (await stack.call("GET", f"/jobs?resource_id={fw['id']}"))[1]["jobs"]
               if j["kind"] == "FirewallApplyToResources"]
    assert len(fw_jobs) == 1, fw_jobs
    assert (await stack.wait_job(sjob["id"], timeout_s=90))["status"] == "succeeded"
    assert (await _applied(stack, clock, fw_jobs[0]["id"]))["status"] == "succeeded"
    web3 = await stack.server(server["id"])
    await sim.firewall_cycle()
    assert not await _deliver(sim, OUTSIDE, _ip(web3), "tcp", 80)
    assert await _deliver(sim, OUTSIDE, _ip(web3), "tcp", 443)
    members = {m["server_id"]: m["status"] for m in (await _get(stack, fw["id"]))["members"]}
    assert members == {web1["id"]: "applied", web2["id"]: "applied", web3["id"]: "applied"}, members

    # taken off: the selector's members leave, their VMs open again (the server kind's ACCEPT)
    status, out = await stack.call("POST", f"/firewalls/{fw['id']}/actions/remove-from-resources",
                                   json={"remove_from": [{"label_selector": "role=web"}]})
    assert status == 202, out
    assert {m["status"] for m in out["firewall"]["members"]} == {"removing"}
    assert (await _applied(stack, clock, out["job"]["id"]))["status"] == "succeeded"
    assert (await _get(stack, fw["id"]))["members"] == []
    await sim.firewall_cycle()
    assert await _deliver(sim, OUTSIDE, _ip(web1), "tcp", 80)
    opts = sim.server.cluster.firewall.vm(web1["observed"]["vmid"]).options
    assert opts.get("policy_in") == "ACCEPT", opts
    status, out = await stack.call("DELETE", f"/firewalls/{fw['id']}")
    assert status == 202, out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
    assert (await _get(stack, fw["id"]))["status"] == "deleted"


async def test_an_empty_rule_set_closes_inbound_and_keeps_the_ip_filter(
        stack: Stack, sim: SimAdmin, firewall_on: None, clock: TestClock) -> None:
    a = await _server(stack, "fw-empty")
    vmid = a["observed"]["vmid"]
    fw, job = await _firewall(stack, name="empty", rules=SSH_HTTPS, applied_to=[{"server_id": a["id"]}])
    assert (await _applied(stack, clock, job["id"]))["status"] == "succeeded"
    before = sim.server.cluster.firewall.vm(vmid)
    ipfilter_before = (before.options.get("ipfilter"), [e["cidr"] for e in before.ipsets.get("ipfilter-net0", [])])
    status, out = await stack.call("POST", f"/firewalls/{fw['id']}/actions/set-rules", json={"rules": []})
    assert status == 202, out
    assert [m["status"] for m in out["firewall"]["members"]] == ["pending"]
    assert (await _applied(stack, clock, out["job"]["id"]))["status"] == "succeeded"
    await sim.firewall_cycle()
    after = sim.server.cluster.firewall.vm(vmid)
    assert [r for r in after.rules if str(r.get("comment", "")).startswith("z9 firewall ")] == []
    assert after.options.get("policy_in") == "DROP"
    # the server's own part stays: its IP filter (what it may send from), on, with its address
    assert (after.options.get("ipfilter"), [e["cidr"] for e in after.ipsets.get("ipfilter-net0", [])]) == ipfilter_before
    assert str(ipfilter_before[0]) == "1" and ipfilter_before[1] == [_ip(a)], ipfilter_before
    for port in (22, 443, 80):
        assert not await _deliver(sim, OUTSIDE, _ip(a), "tcp", port)
    [m] = (await _get(stack, fw["id"]))["members"]
    assert m["status"] == "applied", m


async def test_a_rule_changed_by_hand_is_put_back_by_the_next_job(
        stack: Stack, sim: SimAdmin, firewall_on: None, clock: TestClock) -> None:
    a = await _server(stack, "fw-oob")
    vmid = a["observed"]["vmid"]
    _, job = await _firewall(stack, name="oob", rules=SSH_HTTPS, applied_to=[{"server_id": a["id"]}])
    assert (await _applied(stack, clock, job["id"]))["status"] == "succeeded"
    vmfw = sim.server.cluster.firewall.vm(vmid)
    want = [dict(r) for r in vmfw.rules]
    # by hand: the https rule opened to port 80 instead, the ssh rule deleted, an operator's rule added
    https = next(r for r in vmfw.rules if str(r.get("comment")).endswith("https"))
    https["dport"] = "80"
    vmfw.rules.remove(next(r for r in vmfw.rules if r.get("dport") == "22"))
    vmfw.rules.append({"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "9100", "enable": 1,
                       "comment": "operator: node exporter"})
    vmfw.options["policy_in"] = "ACCEPT"
    await sim.firewall_cycle()
    assert await _deliver(sim, OUTSIDE, _ip(a), "tcp", 80)
    # the server's next job (a reboot) puts the firewall's part back; the operator's rule stays
    status, out = await stack.call("POST", f"/servers/{a['id']}/actions/reboot")
    assert status == 202, out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
    vmfw = sim.server.cluster.firewall.vm(vmid)
    ours = [{k: v for k, v in r.items() if k != "pos"} for r in vmfw.rules
            if str(r.get("comment", "")).startswith("z9 firewall ")]
    assert ours == [{k: v for k, v in r.items() if k != "pos"} for r in want], (ours, want)
    assert any(r.get("comment") == "operator: node exporter" for r in vmfw.rules)
    assert vmfw.options.get("policy_in") == "DROP"
    await sim.firewall_cycle()
    assert not await _deliver(sim, OUTSIDE, _ip(a), "tcp", 80)
    assert await _deliver(sim, OUTSIDE, _ip(a), "tcp", 22)


async def test_a_rule_naming_the_members_of_another_firewall(
        stack: Stack, sim: SimAdmin, firewall_on: None, clock: TestClock) -> None:
    app = await _server(stack, "app-1", labels={"role": "app"})
    db = await _server(stack, "db-1", labels={"role": "db"})
    stranger = await _server(stack, "other-1")
    apps, job = await _firewall(stack, name="apps", rules=SSH_HTTPS, applied_to=[{"label_selector": "role=app"}])
    assert (await _applied(stack, clock, job["id"]))["status"] == "succeeded"
    # the database opens 5432 to the members of "apps" only: one cluster IP set per firewall
    dbs, job = await _firewall(stack, name="dbs", applied_to=[{"server_id": db["id"]}], rules=[
        {"direction": "in", "protocol": "tcp", "port": "5432", "source_firewalls": [apps["id"]]}])
    assert (await _applied(stack, clock, job["id"]))["status"] == "succeeded"
    cluster_fw = sim.server.cluster.firewall
    name = f"z9-{apps['id']}"
    assert [e["cidr"] for e in cluster_fw.cluster_ipsets[name]] == [_ip(app)]
    [rule] = [r for r in cluster_fw.vm(db["observed"]["vmid"]).rules if r.get("dport") == "5432"]
    assert rule["source"] == f"+dc/{name}"
    await sim.firewall_cycle()
    # (the deletion stopped the server's VM: the packet is sent from its address)
    assert await _deliver(sim, _ip(app), _ip(db), "tcp", 5432)
    assert not await _deliver(sim, stranger["observed"]["vmid"], _ip(db), "tcp", 5432)
    assert not await _deliver(sim, OUTSIDE, _ip(db), "tcp", 5432)

    # a new member of "apps" (a server labelled later… here: applied directly) joins the set in the
    # same job as its membership
    status, out = await stack.call("POST", f"/firewalls/{apps['id']}/actions/apply-to-resources",
                                   json={"apply_to": [{"server_id": stranger["id"]}]})
    assert status == 202, out
    assert (await _applied(stack, clock, out["job"]["id"]))["status"] == "succeeded"
    assert sorted(e["cidr"] for e in cluster_fw.cluster_ipsets[name]) == sorted([_ip(app), _ip(stranger)])
    await sim.firewall_cycle()
    assert await _deliver(sim, stranger["observed"]["vmid"], _ip(db), "tcp", 5432)
    # taken off its servers, "apps" still cannot go while "dbs" names it; its set is then empty
    status, out = await stack.call("POST", f"/firewalls/{apps['id']}/actions/remove-from-resources", json={
        "remove_from": [{"label_selector": "role=app"}, {"server_id": stranger["id"]}]})
    assert status == 202, out
    assert (await _applied(stack, clock, out["job"]["id"]))["status"] == "succeeded"
    assert cluster_fw.cluster_ipsets[name] == []
    await sim.firewall_cycle()
    assert not await _deliver(sim, app["observed"]["vmid"], _ip(db), "tcp", 5432)
    status, out = await stack.call("DELETE", f"/firewalls/{apps['id']}")
    assert status == 409 and out["error"]["code"] == "resource_in_use", out
    assert dbs["id"] in out["error"]["message"]


async def test_a_firewall_on_a_load_balancers_target_keeps_its_health_checks(
        stack: Stack, sim: SimAdmin, firewall_on: None, clock: TestClock) -> None:
    from tests.integration.load_balancers.test_load_balancers import (
        LB_TEMPLATE,
        SERVICE,
        _appliances,
        _lb,
        _listen,
    )

    await sim._req("POST", "/vms", json=LB_TEMPLATE)
    t = await _server(stack, "lb-target")
    await _listen(sim, t["observed"]["vmid"], 8080)
    lb, job = await _lb(stack, name="fw-lb", type="lb-small", services=[SERVICE],
                        targets=[{"type": "server", "server_id": t["id"]}])
    assert (await stack.wait_job(job["id"], timeout_s=150))["status"] == "succeeded"
    [app] = _appliances(await sim.state(), lb["id"])
    fw, fjob = await _firewall(stack, name="ssh-only", rules=SSH_HTTPS[:1], applied_to=[{"server_id": t["id"]}])
    assert (await _applied(stack, clock, fjob["id"]))["status"] == "succeeded"
    await sim.firewall_cycle()
    vmfw = sim.server.cluster.firewall.vm(t["observed"]["vmid"])
    comments = [str(r.get("comment")) for r in vmfw.rules]
    # the load balancer's part first, then the tenant's
    assert comments[0].startswith(f"z9 load balancer {lb['id']}: ") and comments[1].startswith("z9 firewall "), comments
    assert await _deliver(sim, app["vmid"], _ip(t), "tcp", 8080)
    assert not await _deliver(sim, OUTSIDE, _ip(t), "tcp", 8080)
    # an empty rule set: inbound closed to all — but the load balancer
    status, out = await stack.call("POST", f"/firewalls/{fw['id']}/actions/set-rules", json={"rules": []})
    assert status == 202, out
    assert (await _applied(stack, clock, out["job"]["id"]))["status"] == "succeeded"
    await sim.firewall_cycle()
    assert await _deliver(sim, app["vmid"], _ip(t), "tcp", 8080)
    assert not await _deliver(sim, OUTSIDE, _ip(t), "tcp", 22)
    status, out = await stack.call("POST", f"/load-balancers/{lb['id']}/actions/change_algorithm",
                                   json={"type": "least_connections"})
    assert status == 202, out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
    status, got = await stack.call("GET", f"/load-balancers/{lb['id']}")
    assert got["load_balancer"]["health"] == "healthy", got
    # taken off: nothing of either is left on the server (its VM open again as the server kind keeps it)
    status, out = await stack.call("POST", f"/firewalls/{fw['id']}/actions/remove-from-resources",
                                   json={"remove_from": [{"server_id": t["id"]}]})
    assert status == 202, out
    assert (await _applied(stack, clock, out["job"]["id"]))["status"] == "succeeded"
    assert [r for r in sim.server.cluster.firewall.vm(t["observed"]["vmid"]).rules
            if str(r.get("comment", "")).startswith("z9 ")] == []


async def test_a_load_balancer_made_after_the_firewall_opens_its_way_to_the_target(
        stack: Stack, sim: SimAdmin, firewall_on: None, clock: TestClock) -> None:
    from tests.integration.load_balancers.test_load_balancers import (
        LB_TEMPLATE,
        SERVICE,
        _appliances,
        _lb,
        _listen,
    )

    await sim._req("POST", "/vms", json=LB_TEMPLATE)
    t = await _server(stack, "lb-later")
    await _listen(sim, t["observed"]["vmid"], 8080)
    _, fjob = await _firewall(stack, name="closed", rules=[], applied_to=[{"server_id": t["id"]}])
    assert (await _applied(stack, clock, fjob["id"]))["status"] == "succeeded"
    lb, job = await _lb(stack, name="fw-later", type="lb-small", services=[SERVICE],
                        targets=[{"type": "server", "server_id": t["id"]}])
    done = await stack.wait_job(job["id"], timeout_s=150)
    assert done["status"] == "succeeded", done
    assert any(s["name"] == "target_firewall" for s in done["steps"]), done["steps"]
    await sim.firewall_cycle()
    [app] = _appliances(await sim.state(), lb["id"])
    assert await _deliver(sim, app["vmid"], _ip(t), "tcp", 8080)
    assert not await _deliver(sim, OUTSIDE, _ip(t), "tcp", 8080)


async def test_labels_changed_later_join_and_leave_a_selector(
        stack: Stack, sim: SimAdmin, firewall_on: None, clock: TestClock) -> None:
    s = await _server(stack, "relabel-1")
    fw, job = await _firewall(stack, name="web", rules=SSH_HTTPS, applied_to=[{"label_selector": "role=web"}])
    assert fw["members"] == []
    assert (await stack.wait_job(job["id"], timeout_s=60))["status"] == "succeeded"
    await sim.firewall_cycle()
    assert await _deliver(sim, OUTSIDE, _ip(s), "tcp", 80)

    async def fw_job(kind: str) -> dict:
        jobs = (await stack.call("GET", f"/jobs?resource_id={fw['id']}"))[1]["jobs"]
        return next(j for j in jobs if j["kind"] == kind and j["status"] not in ("succeeded", "failed"))

    status, out = await stack.call("PATCH", f"/servers/{s['id']}", json={"labels": {"role": "web"}})
    assert status == 200, out
    assert [(m["server_id"], m["status"]) for m in (await _get(stack, fw["id"]))["members"]] == [(s["id"], "pending")]
    assert (await _applied(stack, clock, (await fw_job("FirewallApplyToResources"))["id"]))["status"] == "succeeded"
    await sim.firewall_cycle()
    assert not await _deliver(sim, OUTSIDE, _ip(s), "tcp", 80)
    assert await _deliver(sim, OUTSIDE, _ip(s), "tcp", 443)

    status, out = await stack.call("PATCH", f"/servers/{s['id']}", json={"labels": {"role": "db"}})
    assert status == 200, out
    assert [m["status"] for m in (await _get(stack, fw["id"]))["members"]] == ["removing"]
    assert (await _applied(stack, clock, (await fw_job("FirewallRemoveFromResources"))["id"]))["status"] == "succeeded"
    assert (await _get(stack, fw["id"]))["members"] == []
    await sim.firewall_cycle()
    assert await _deliver(sim, OUTSIDE, _ip(s), "tcp", 80)


async def _firewall_jobs_done(stack: Stack, clock: TestClock, fid: str) -> None:
    """Every job of firewall ``fid`` ended (stepping pve-firewall's cycle while one waits for it)."""
    async def open_job() -> Any:
        jobs = (await stack.call("GET", f"/jobs?resource_id={fid}"))[1]["jobs"]
        return [j for j in jobs if j["status"] not in ("succeeded", "failed")] or "none"
    while (left := await wait_until(open_job, 30, "the firewall's jobs")) != "none":
        assert (await _applied(stack, clock, left[0]["id"]))["status"] == "succeeded"


async def test_a_deleted_server_leaves_the_members_of_sets_and_its_address_is_dropped(
        stack: Stack, sim: SimAdmin, firewall_on: None, clock: TestClock) -> None:
    """A member of "apps" deleted for good: the cluster IP set ``z9-<apps>`` no longer holds its address,
    ``applied_to`` no longer names it, and a new server given that address does not reach the database
    (before: the final delete forgot the member row but queued no job, the set kept the address)."""
    app = await _server(stack, "app-gone")
    db = await _server(stack, "db-kept")
    apps, job = await _firewall(stack, name="apps", rules=SSH_HTTPS, applied_to=[{"server_id": app["id"]}])
    assert (await _applied(stack, clock, job["id"]))["status"] == "succeeded"
    dbs, job = await _firewall(stack, name="dbs", applied_to=[{"server_id": db["id"]}], rules=[
        {"direction": "in", "protocol": "tcp", "port": "5432", "source_firewalls": [apps["id"]]}])
    assert (await _applied(stack, clock, job["id"]))["status"] == "succeeded"
    cluster_fw = sim.server.cluster.firewall
    name = f"z9-{apps['id']}"
    address = _ip(app)
    assert [e["cidr"] for e in cluster_fw.cluster_ipsets[name]] == [address]
    await sim.firewall_cycle()
    assert await _deliver(sim, address, _ip(db), "tcp", 5432)  # the address is let in while a member's

    # its deletion starts: it leaves the set at once (still a member until its final delete)
    status, out = await stack.call("DELETE", f"/servers/{app['id']}")
    assert status == 202, out
    await _firewall_jobs_done(stack, clock, apps["id"])
    assert cluster_fw.cluster_ipsets[name] == []
    await sim.firewall_cycle()
    assert not await _deliver(sim, address, _ip(db), "tcp", 5432)
    # deleted for good (the reaper's final ServerDelete): a member of nothing, named by no applied_to
    clock.step(stack.settings.deletion_buffer_s)

    async def gone() -> bool:
        return (await stack.server(app["id"]))["status"] == "deleted"
    await wait_until(gone, 120, "the server deleted")
    await _firewall_jobs_done(stack, clock, apps["id"])
    assert cluster_fw.cluster_ipsets[name] == []
    after = await _get(stack, apps["id"])
    assert after["applied_to"] == [] and after["members"] == [], after
    await sim.firewall_cycle()
    # whoever holds that address next (another tenant's server) is a stranger to the database
    assert not await _deliver(sim, address, _ip(db), "tcp", 5432)
    # a firewall applied directly to a deleted server is applied to nothing: it can be deleted
    status, out = await stack.call("POST", f"/firewalls/{dbs['id']}/actions/set-rules", json={"rules": []})
    assert status == 202, out
    await _firewall_jobs_done(stack, clock, dbs["id"])
    status, out = await stack.call("DELETE", f"/firewalls/{apps['id']}")
    assert status == 202, out


async def test_a_cancelled_server_deletion_puts_its_address_back_in_the_members_of_set(
        stack: Stack, sim: SimAdmin, firewall_on: None, clock: TestClock) -> None:
    app = await _server(stack, "app-back", labels={"role": "app"})
    db = await _server(stack, "db-back")
    apps, job = await _firewall(stack, name="apps", rules=SSH_HTTPS, applied_to=[{"label_selector": "role=app"}])
    assert (await _applied(stack, clock, job["id"]))["status"] == "succeeded"
    _, job = await _firewall(stack, name="dbs", applied_to=[{"server_id": db["id"]}], rules=[
        {"direction": "in", "protocol": "tcp", "port": "5432", "source_firewalls": [apps["id"]]}])
    assert (await _applied(stack, clock, job["id"]))["status"] == "succeeded"
    cluster_fw = sim.server.cluster.firewall
    name = f"z9-{apps['id']}"
    status, out = await stack.call("DELETE", f"/servers/{app['id']}")
    assert status == 202, out
    await _firewall_jobs_done(stack, clock, apps["id"])
    assert cluster_fw.cluster_ipsets[name] == []
    assert [m["server_id"] for m in (await _get(stack, apps["id"]))["members"]] == [app["id"]]  # still a member
    await sim.firewall_cycle()
    assert not await _deliver(sim, _ip(app), _ip(db), "tcp", 5432)
    status, out = await stack.call("POST", f"/servers/{app['id']}/actions/cancel-deletion")
    assert status == 202, out
    await _firewall_jobs_done(stack, clock, apps["id"])
    assert [e["cidr"] for e in cluster_fw.cluster_ipsets[name]] == [_ip(app)]
    await sim.firewall_cycle()
    # (the deletion stopped the server's VM: the packet is sent from its address)
    assert await _deliver(sim, _ip(app), _ip(db), "tcp", 5432)
