"""Every guest reachable exactly as promised, with the datacenter firewall on and pve-firewall's
defaults in force (``policy_in`` DROP when unset): z9 writes each VM's policies and its kind's platform
rules, and the simulator answers "would this packet be delivered?" as pve-firewall compiles them
(tests/sim/test_sim_firewall_rules.py). A server accepts every connection; a load balancer's
appliances accept their listen ports from anywhere and VRRP from their peer only, and reach their
targets; a cluster's members accept kubeadm's ports from each other. An operator's rule is left alone,
a z9 rule changed by hand is put back by the next job of its kind."""
from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest
from z9.common.tags import identity_tag, normalize_tags
from z9.sim.appliance import vip_holders

from tests.integration.load_balancers.test_load_balancers import (
    LB_TEMPLATE,
    SERVICE,
    _appliances,
    _get,
    _lb,
    _listen,
    _pve,
    _server,
)
from tests.integration.security.test_private_network import private  # noqa: F401  (the fixture)
from tests.support import SimAdmin, Stack, make_tenant, wait_until

OUTSIDE = "203.0.113.9"  # no guest's: the internet, as pve-firewall sees a packet from beyond the bridge


@pytest.fixture
async def firewall_on(sim: SimAdmin) -> AsyncIterator[None]:
    """The datacenter firewall on (``cluster.fw`` ``enable: 1``), compiled: every VM's rules in force."""
    fw = sim.server.cluster.firewall
    fw.cluster_options["enable"] = "1"
    await sim.firewall_cycle()
    try:
        yield
    finally:
        fw.cluster_options.pop("enable", None)


async def _deliver(sim: SimAdmin, src: str | int, dst: str | int, proto: str = "tcp", port: int | None = None) -> bool:
    return bool((await sim.deliver(src, dst, proto, port))["delivered"])


async def _why(sim: SimAdmin, src: str | int, dst: str | int, proto: str = "tcp", port: int | None = None) -> str:
    return str((await sim.deliver(src, dst, proto, port))["reason"])


def _ipv4(server: dict[str, Any]) -> str:
    v = server["public_ipv4"]
    return str(v["ip"] if isinstance(v, dict) else v)


def _platform_rules(sim: SimAdmin, vmid: int) -> list[dict[str, Any]]:
    return [r for r in sim.server.cluster.firewall.vm(vmid).to_json().get("rules", [])
            if str(r.get("comment", "")).startswith("z9 platform: ")]


async def test_a_server_is_reachable_on_ssh_from_outside_and_from_another_tenant(
        stack: Stack, sim: SimAdmin, firewall_on: None) -> None:
    mine = await _server(stack, "reachable")
    other_tenant, other_token = await make_tenant(stack.pool, "globex")
    other = dataclasses.replace(stack, token=other_token, tenant_id=other_tenant)
    neighbour = await _server(other, "neighbour")
    await sim.firewall_cycle()
    vmid, ip = mine["observed"]["vmid"], _ipv4(mine)
    opts = sim.server.cluster.firewall.vm(vmid).options
    # explicit, never pve-firewall's default DROP
    assert (opts.get("enable"), opts.get("policy_in"), opts.get("policy_out")) == ("1", "ACCEPT", "ACCEPT"), opts
    assert await _deliver(sim, OUTSIDE, ip, "tcp", 22), await _why(sim, OUTSIDE, ip, "tcp", 22)
    assert await _deliver(sim, neighbour["observed"]["vmid"], ip, "tcp", 22)
    # and the other way: each tenant's server reaches the other's (a public address, both ACCEPT)
    assert await _deliver(sim, vmid, neighbour["observed"]["vmid"], "tcp", 22)


@pytest.mark.parametrize("lb_type", ["lb-small", "lb-ha"])
async def test_a_load_balancer_forwards_to_its_targets_and_opens_nothing_else(
        stack: Stack, sim: SimAdmin, firewall_on: None, lb_type: str) -> None:
    await sim._req("POST", "/vms", json=LB_TEMPLATE)
    a = await _server(stack, f"t-a-{lb_type}")
    b = await _server(stack, f"t-b-{lb_type}")
    for s in (a, b):
        await _listen(sim, s["observed"]["vmid"], 8080)
    lb, job = await _lb(stack, name=f"fw-{lb_type}", type=lb_type, services=[SERVICE],
                        targets=[{"type": "server", "server_id": a["id"]}, {"type": "server", "server_id": b["id"]}])
    done = await stack.wait_job(job["id"], timeout_s=150)
    assert done["status"] == "succeeded", done
    await sim.firewall_cycle()
    lb = await _get(stack, lb["id"])
    vip = lb["public_net"]["ipv4"]["ip"]
    apps = _appliances(await sim.state(), lb["id"])
    # the service's listen port from anywhere, to the VIP and each appliance
    assert await _deliver(sim, OUTSIDE, vip, "tcp", 80), await _why(sim, OUTSIDE, vip, "tcp", 80)
    # a port z9 did not open: dropped, by the appliance's own policy
    for port in (22, 8080, 443):
        assert not await _deliver(sim, OUTSIDE, vip, "tcp", port)
    assert "policy" in (await _why(sim, OUTSIDE, apps[0]["vmid"], "tcp", 22)).lower()
    for v in apps:
        opts = sim.server.cluster.firewall.vm(v["vmid"]).options
        assert (opts.get("enable"), opts.get("policy_in"), opts.get("policy_out")) == ("1", "DROP", "ACCEPT"), opts
        # the appliance reaches its targets' port (the targets' own ACCEPT policy decides)
        for t in (a, b):
            assert await _deliver(sim, v["vmid"], t["observed"]["vmid"], "tcp", 8080)
    if lb_type == "lb-ha":
        # VRRP (112) and its IPsec-AH (51) from the peer appliance only
        x, y = apps
        for proto in ("vrrp", "ah"):
            assert await _deliver(sim, x["vmid"], y["vmid"], proto), await _why(sim, x["vmid"], y["vmid"], proto)
            assert await _deliver(sim, y["vmid"], x["vmid"], proto)
            assert not await _deliver(sim, a["observed"]["vmid"], x["vmid"], proto)
            assert not await _deliver(sim, OUTSIDE, x["vmid"], proto)

    async def refreshed() -> dict | None:
        got = await _get(stack, lb["id"])
        return got if got["health"] == "healthy" and [m["holds_vip"] for m in got["members"]].count(True) == 1 \
            else None

    # a health refresh: the change_algorithm job's verify reads show stat again
    status, out = await stack.call("POST", f"/load-balancers/{lb['id']}/actions/change_algorithm",
                                   json={"type": "least_connections"})
    assert status == 202, out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
    lb = await wait_until(refreshed, 30, "a healthy load balancer, the VIP on exactly one appliance")

    # a target whose own firewall drops the appliance (an operator's rule on it): unhealthy, the
    # reason naming the firewall; the other target stays healthy
    fw_b = sim.server.cluster.firewall.vm(b["observed"]["vmid"])
    fw_b.rules.insert(0, {"type": "in", "action": "DROP", "proto": "tcp", "dport": "8080", "enable": 1,
                          "comment": "operator: maintenance"})
    await sim.firewall_cycle()
    status, out = await stack.call("POST", f"/load-balancers/{lb['id']}/actions/change_algorithm",
                                   json={"type": "round_robin"})
    assert status == 202, out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
    lb = await _get(stack, lb["id"])
    health = {t["server_id"]: t["health_status"] for t in lb["targets"]}
    assert all(h["status"] == "healthy" for h in health[a["id"]]), health
    assert all(h["status"] == "unhealthy" and h["reason"] == "firewall" and "operator: maintenance" in h["detail"]
               for h in health[b["id"]]), health
    # the operator's rule is theirs: a job of the target's kind leaves it alone
    status, out = await stack.call("POST", f"/servers/{b['id']}/actions/reboot")
    assert status == 202, out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
    assert any(r.get("comment") == "operator: maintenance" for r in fw_b.rules)


async def test_lb_ha_holds_its_vip_on_one_member_and_fails_over(stack: Stack, sim: SimAdmin, firewall_on: None) -> None:
    await sim._req("POST", "/vms", json=LB_TEMPLATE)
    lb, job = await _lb(stack, name="fw-ha", type="lb-ha", services=[SERVICE],
                        targets=[{"type": "ip", "ip": "198.51.100.240"}])
    assert (await stack.wait_job(job["id"], timeout_s=150))["status"] == "succeeded"
    await sim.firewall_cycle()

    def holders() -> list[int]:
        return sorted(vmid for vmid, devs in vip_holders(sim.server.cluster.guests).items()
                      if any(c.split("/")[0] == vip for cidrs in devs.values() for c in cidrs))

    got = await _get(stack, lb["id"])
    vip = got["public_net"]["ipv4"]["ip"]
    # VRRP passes between the two appliances (their platform rules): exactly one master
    x, y = _appliances(await sim.state(), lb["id"])
    assert await _deliver(sim, x["vmid"], y["vmid"], "ah") and await _deliver(sim, y["vmid"], x["vmid"], "ah")
    assert len(holders()) == 1, vip_holders(sim.server.cluster.guests)
    holder = next(m for m in got["members"] if m["vmid"] == holders()[0])
    other = next(m for m in got["members"] if m["vmid"] != holder["vmid"])
    await _pve(sim, "POST", f"/nodes/{holder['node']}/qemu/{holder['vmid']}/status/stop")


    async def moved() -> bool:
        return holders() == [other["vmid"]]
    await wait_until(moved, 30, "the VIP on the other appliance")  # the other one takes it


async def test_a_z9_rule_changed_by_hand_is_put_back_an_operators_rule_is_left(
        stack: Stack, sim: SimAdmin, firewall_on: None) -> None:
    await sim._req("POST", "/vms", json=LB_TEMPLATE)
    t = await _server(stack, "oob-target")
    lb, job = await _lb(stack, name="oob", type="lb-small", services=[SERVICE],
                        targets=[{"type": "server", "server_id": t["id"]}])
    assert (await stack.wait_job(job["id"], timeout_s=150))["status"] == "succeeded"
    [app] = _appliances(await sim.state(), lb["id"])
    fw = sim.server.cluster.firewall.vm(app["vmid"])
    want = [dict(r) for r in _platform_rules(sim, app["vmid"])]
    assert [r["dport"] for r in want] == ["80"], want
    # by hand: z9's rule opened to another port, and an operator's own rule added
    ours = next(r for r in fw.rules if str(r.get("comment", "")).startswith("z9 platform: "))
    ours["dport"] = "81"
    fw.rules.append({"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "9100", "enable": 1,
                     "comment": "operator: node exporter"})
    await sim.firewall_cycle()
    vip = (await _get(stack, lb["id"]))["public_net"]["ipv4"]["ip"]
    assert not await _deliver(sim, OUTSIDE, vip, "tcp", 80)
    status, out = await stack.call("POST", f"/load-balancers/{lb['id']}/actions/change_algorithm",
                                   json={"type": "least_connections"})
    assert status == 202, out
    again = await stack.wait_job(out["job"]["id"], timeout_s=60)
    assert again["status"] == "succeeded", again
    assert "firewall" in [s["name"] for s in again["steps"]], again["steps"]
    assert [r["dport"] for r in _platform_rules(sim, app["vmid"])] == ["80"]
    assert any(r.get("comment") == "operator: node exporter" for r in fw.rules)
    await sim.firewall_cycle()
    assert await _deliver(sim, OUTSIDE, vip, "tcp", 80)
    assert await _deliver(sim, OUTSIDE, vip, "tcp", 9100)  # the operator's, as they wrote it


async def test_cluster_members_reach_each_other_on_kubeadm_ports_only(private: Stack, sim: SimAdmin) -> None:  # noqa: F811
    from z9.common import store

    from tests.integration.clusters.test_clusters_e2e import create as create_cluster

    await sim.firewall_cycle()
    c, job = await create_cluster(private, sim, name="walls", cps=3, workers=2)
    done = await private.wait_job(job["id"], timeout_s=300)
    assert done["status"] == "succeeded", done
    # one attempt: the joiners' addresses go into the members' rules once, before they join (never
    # a rewrite per joiner racing the others' on one VM: a stale digest, a verify seeing drift)
    assert done["attempt"] == 1, done
    await sim.firewall_cycle()
    got = (await private.call("GET", f"/clusters/{c['id']}"))[1]["cluster"]
    assert got["status"] == "running" and all(m["ready"] for m in got["members"]), got
    ips = await store.vm_private_addresses_of(private.pool, c["id"])
    vms = {next(t[len("z9-member-"):] for t in normalize_tags(v["config"]["tags"]) if t.startswith("z9-member-")):
           v["vmid"] for v in await sim.vms_tagged(identity_tag(c["id"]))}
    # the customers' kubectl reaches the API server on every control plane (the endpoint, which
    # kube-vip moves between them)
    for cp in ("cp-0", "cp-1", "cp-2"):
        assert await _deliver(sim, OUTSIDE, vms[cp], "tcp", 6443), await sim.deliver(OUTSIDE, vms[cp], "tcp", 6443)
    assert await _deliver(sim, ips["workers-0"], vms["cp-1"], "tcp", 6443)
    assert await _deliver(sim, ips["cp-0"], vms["cp-2"], "tcp", 2380)  # etcd peers
    assert not await _deliver(sim, ips["workers-0"], vms["cp-0"], "tcp", 2379)  # etcd: control planes only
    assert await _deliver(sim, ips["cp-0"], vms["workers-1"], "tcp", 10250)  # kubelet API from the control plane
    assert await _deliver(sim, ips["workers-1"], vms["cp-2"], "udp", 8472)  # the pod network
    assert not await _deliver(sim, OUTSIDE, vms["workers-0"], "tcp", 10250)
    assert not await _deliver(sim, OUTSIDE, vms["cp-0"], "tcp", 22)
    assert not await _deliver(sim, OUTSIDE, vms["workers-0"], "udp", 8472)
