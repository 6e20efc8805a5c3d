"""The guest firewall under faults and hands: a server's policy restored by its next job, a rules
rewrite that never closes an open port, PVE's limits on a rule's source, an operator's rule left
alone whatever its comment, the load balancer's diagnosis naming the firewall only when it is the
cause, a floating address kept in the filter when the primary is replaced, a DHCP cluster's members
kept as well. (Found by a review trying to break the change; each failed on its first version.)"""
from __future__ import annotations

from types import SimpleNamespace

from z9.executor import vms
from z9.resources.cluster.jobs.shared import MemberSpec, member_firewall

from tests.integration.load_balancers.test_load_balancers import (
    LB_TEMPLATE,
    _appliances,
    _get,
    _lb,
    _server,
)
from tests.integration.security.test_guest_firewall import (  # noqa: F401
    OUTSIDE,
    _deliver,
    _ipv4,
    _why,
    firewall_on,
)
from tests.integration.security.test_private_network import private  # noqa: F401
from tests.support import SimAdmin, Stack, wait_until


# 1 ------------------------------------------------------------------------------------------------
async def test_a_servers_next_job_restores_its_firewall_policy(
        stack: Stack, sim: SimAdmin, firewall_on: None) -> None:  # noqa: F811
    """Only ServerCreate runs plan_member (observe_member → FIREWALL); reboot/stop/start/resize never
    look at the VM firewall. A server whose policy_in was changed by hand — or one made before this
    change (enable=1 from its address's ipfilter, no policy_in: pve-firewall's default DROP) — stays
    unreachable through every later server job."""
    s = await _server(stack, "policy-restore")
    vmid, ip = s["observed"]["vmid"], _ipv4(s)
    fw = sim.server.cluster.firewall.vm(vmid)
    fw.options.pop("policy_in", None)   # as the code before this change left every filtered server
    fw.options.pop("policy_out", None)
    await sim.firewall_cycle()
    assert not await _deliver(sim, OUTSIDE, ip, "tcp", 22)
    for action in ("reboot", "poweroff", "start"):
        status, out = await stack.call("POST", f"/servers/{s['id']}/actions/{action}")
        assert status == 202, out
        assert (await stack.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
    await sim.firewall_cycle()
    assert fw.options.get("policy_in") == "ACCEPT", fw.options

    async def reachable() -> bool:  # (its guest booting after the start)
        return await _deliver(sim, OUTSIDE, ip, "tcp", 22)
    await wait_until(reachable, 30, "SSH from outside")


# 2 ------------------------------------------------------------------------------------------------
async def test_a_rules_rewrite_never_closes_a_port_already_open(
        stack: Stack, sim: SimAdmin, firewall_on: None) -> None:  # noqa: F811
    """_converge_rules deletes every platform rule first, then adds the wanted ones one by one: any
    failure (or crash, or just pve-firewall's 10 s compile) in between leaves an appliance with
    policy_in DROP and none of its listen ports. Adding a service must not close the one there."""
    await sim._req("POST", "/vms", json=LB_TEMPLATE)
    lb, job = await _lb(stack, name="rewrite", type="lb-small",
                        services=[{"protocol": "tcp", "listen_port": 80, "destination_port": 8080}],
                        targets=[{"type": "ip", "ip": "198.51.100.240"}])
    assert (await stack.wait_job(job["id"], timeout_s=150))["status"] == "succeeded"
    await sim.firewall_cycle()
    vip = (await _get(stack, lb["id"]))["public_net"]["ipv4"]["ip"]
    assert await _deliver(sim, OUTSIDE, vip, "tcp", 80)
    # a transient failure of the rule POST (a pveproxy restart, a lost connection, a 5xx)
    await sim.fault(method="POST", path=r".*/firewall/rules$", action="error", status=500, times=1000)
    status, out = await stack.call("POST", f"/load-balancers/{lb['id']}/actions/add-service",
                                   json={"protocol": "tcp", "listen_port": 443, "destination_port": 8443})
    assert status == 202, out

    async def hit() -> bool:
        return any(f["hits"] > 0 for f in await sim._req("GET", "/faults"))
    await wait_until(hit, 60, "the rule POST refused once")
    await sim.firewall_cycle()
    try:
        [app] = _appliances(await sim.state(), lb["id"])
        left = [r.get("dport") for r in sim.server.cluster.firewall.vm(app["vmid"]).rules]
        assert await _deliver(sim, OUTSIDE, vip, "tcp", 80), (left, await _why(sim, OUTSIDE, vip, "tcp", 80))
    finally:
        await sim._req("DELETE", "/faults")
        await stack.wait_job(out["job"]["id"], timeout_s=120)


# 3 ------------------------------------------------------------------------------------------------
def _members(n_workers: int) -> tuple[list[MemberSpec], dict[str, str]]:
    ms = [MemberSpec(f"cp-{i}", "control-plane", None, i, 2, 4096, 30) for i in range(3)]
    ms += [MemberSpec(f"workers-{i}", "worker", "workers", i, 2, 4096, 30) for i in range(n_workers)]
    return ms, {m.name: f"172.16.0.{10 + i}" for i, m in enumerate(ms)}


def test_member_rules_fit_pves_source_limit_for_a_cluster_the_api_accepts() -> None:
    """The pod-network rule's ``source`` lists every member's address; pve-firewall's
    ``$rule_properties->{source}`` is ``maxLength => 512`` (400 ``value may only be 512 characters
    long``). A 3 + 40 cluster (the API allows 16 pools x 100) in a 172.16.0.0/24 network breaks it:
    every member's firewall step fails after _converge_rules already deleted its platform rules."""
    ms, addrs = _members(40)
    cluster = SimpleNamespace(id="k8s_01break")
    too_long = {m.name: [len(r.source) for r in member_firewall(cluster, m, addrs).rules
                         if r.source and len(r.source) > 512] for m in ms}
    assert not any(too_long.values()), too_long


# 4 ------------------------------------------------------------------------------------------------
def test_an_operators_rule_commented_z9_is_left_alone() -> None:
    """_stale: any rule whose comment starts "z9 " and no type declares is deleted by the next
    convergence. No type declares any rule prefix today, so this only ever matches operators' rules
    (a comment such as "z9 ops: node exporter" on a z9 guest is natural)."""
    spec = vms.VmSpec(owner="srv_x", member="main", name="x", image="img", cores=1, memory_mib=512, disk_gib=10,
                      firewall=vms.FirewallSpec())
    vm = SimpleNamespace(config={"net0": "virtio=AA:BB:CC:DD:EE:FF,bridge=vmbr0,firewall=1"})
    fw = vms.FirewallState(options={"enable": 1, "policy_in": "ACCEPT", "policy_out": "ACCEPT"}, entries=None,
                           rules=[{"pos": 0, "type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "9100",
                                   "enable": 1, "comment": "z9 ops: node exporter"}], rules_digest="d")
    assert vms.firewall_drift(spec, vm, fw) == []  # an operator's rule: left alone


# 5 ------------------------------------------------------------------------------------------------
def test_inbound_drop_does_not_blame_the_firewall_past_a_security_group_rule() -> None:
    """A VM rule of type ``group`` jumps to a security group (pve-firewall ruleset_generate_vm_rules:
    ``-j GROUP-<name>-IN``): its ACCEPTs decide first. inbound_drop skips it (``type != "in"``) and
    names the DROP below it — reason ``firewall`` when the firewall accepts the appliance."""
    rules = [{"pos": 0, "type": "group", "action": "lbs", "enable": 1},  # [group lbs] IN ACCEPT -source <appliance>
             {"pos": 1, "type": "in", "action": "DROP", "proto": "tcp", "dport": "8080", "enable": 1,
              "comment": "operator: only the LB"}]
    why = vms.inbound_drop({"enable": 1, "policy_in": "ACCEPT"}, rules,
                           "virtio=AA:BB:CC:DD:EE:FF,bridge=vmbr0,firewall=1", "198.51.100.7", "tcp", 8080)
    assert why is None, why


# 6 ------------------------------------------------------------------------------------------------
async def test_a_floating_address_stays_listed_when_the_primary_is_replaced(stack: Stack, sim: SimAdmin) -> None:
    """_disable_ipfilter now deletes the whole ipfilter-net0 set (force) when a primary goes — with the
    floating addresses' entries in it. A new primary then turns the filter on with the set holding only
    itself: the floating address, still on the server (tagged), is filtered out, and nothing re-lists it."""
    from z9.resources.address import store as address_store
    from z9.resources.server import store as server_store

    from tests.integration.addresses.test_address_jobs import _job, _pool

    pid = await _pool(stack)
    s = await _server(stack, "swap-primary")
    vmid = s["observed"]["vmid"]
    fw0 = sim.server.cluster.firewall.vm(vmid)

    async def filtered() -> bool:  # the create's primary AddressAssign done
        return fw0.options.get("ipfilter") == "1" and bool(fw0.ipsets.get("ipfilter-net0"))
    await wait_until(filtered, 30, "the primary's filter on")
    tenant = (await server_store.server_get(stack.pool, s["id"])).tenant_id
    flt = await address_store.address_allocate(stack.pool, pool_id=pid, tenant_id=tenant, kind="floating")
    assert (await _job(stack, "AddressAssign", flt.id, tenant, server_id=s["id"]))["status"] == "succeeded"
    fw = sim.server.cluster.firewall.vm(vmid)
    assert flt.ip_text in {e["cidr"] for e in fw.ipsets.get("ipfilter-net0", [])}
    status, out = await stack.call("POST", f"/servers/{s['id']}/actions/poweroff")
    assert status == 202, out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
    old = s["public_ipv4"]
    old_id = old["id"] if isinstance(old, dict) else (await server_store.server_get(stack.pool, s["id"])).primary_ipv4_id
    done = await _job(stack, "AddressUnassign", old_id, tenant)
    assert done["status"] == "succeeded", done
    new = await address_store.address_allocate(stack.pool, pool_id=pid, tenant_id=tenant, kind="primary")
    done = await _job(stack, "AddressAssign", new.id, tenant, server_id=s["id"])
    assert done["status"] == "succeeded", done
    fw = sim.server.cluster.firewall.vm(vmid)
    listed = {e["cidr"] for e in fw.ipsets.get("ipfilter-net0", [])}
    assert fw.options.get("ipfilter") == "1" and new.ip_text in listed, (fw.options, listed)
    assert flt.ip_text in listed, (f"floating {flt.ip_text} still on VM {vmid} but filtered", listed)


# 7 ------------------------------------------------------------------------------------------------
async def test_an_lb_ha_job_run_twice_plans_no_firewall_step(stack: Stack, sim: SimAdmin, firewall_on: None) -> None:  # noqa: F811
    """Phantom drift: the second job on an unchanged lb-ha must plan nothing for the firewall."""
    await sim._req("POST", "/vms", json=LB_TEMPLATE)
    lb, job = await _lb(stack, name="twice", type="lb-ha",
                        services=[{"protocol": "tcp", "listen_port": 80, "destination_port": 8080}],
                        targets=[{"type": "ip", "ip": "198.51.100.240"}])
    assert (await stack.wait_job(job["id"], timeout_s=150))["status"] == "succeeded"
    for algo in ("least_connections", "round_robin"):
        status, out = await stack.call("POST", f"/load-balancers/{lb['id']}/actions/change_algorithm",
                                       json={"type": algo})
        assert status == 202, out
        done = await stack.wait_job(out["job"]["id"], timeout_s=60)
        assert done["status"] == "succeeded", done
        assert "firewall" not in [s["name"] for s in done["steps"]], done["steps"]


# 8 ------------------------------------------------------------------------------------------------
async def test_a_target_whose_firewall_drops_the_health_check_port_is_blamed_on_the_firewall(
        stack: Stack, sim: SimAdmin, firewall_on: None) -> None:  # noqa: F811
    """explain_by_firewall asks inbound_drop about the service's destination_port only; HAProxy checks
    ``health_check.port`` (render: ``check port``). A target whose own firewall drops the check port
    is DOWN (L4TOUT → timeout), and the diagnosis misses the firewall that causes it."""
    from tests.integration.load_balancers.test_load_balancers import _listen

    await sim._req("POST", "/vms", json=LB_TEMPLATE)
    t = await _server(stack, "hc-port")
    for port in (8080, 8081):
        await _listen(sim, t["observed"]["vmid"], port)
    svc = {"protocol": "tcp", "listen_port": 80, "destination_port": 8080,
           "health_check": {"protocol": "tcp", "port": 8081, "interval_s": 3, "timeout_s": 2, "retries": 2}}
    lb, job = await _lb(stack, name="hcport", type="lb-small", services=[svc],
                        targets=[{"type": "server", "server_id": t["id"]}])
    assert (await stack.wait_job(job["id"], timeout_s=150))["status"] == "succeeded"
    fw = sim.server.cluster.firewall.vm(t["observed"]["vmid"])
    fw.rules.insert(0, {"type": "in", "action": "DROP", "proto": "tcp", "dport": "8081", "enable": 1,
                        "comment": "operator: close the admin port"})
    await sim.firewall_cycle()

    async def down() -> dict | None:
        status, out = await stack.call("POST", f"/load-balancers/{lb['id']}/actions/change_algorithm",
                                       json={"type": "least_connections"})
        assert status == 202, out
        assert (await stack.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
        got = await _get(stack, lb["id"])
        rows = [h for x in got["targets"] for h in x["health_status"]]
        return rows if rows and all(h["status"] == "unhealthy" for h in rows) else None
    rows = await wait_until(down, 60, "the target DOWN")
    assert all(h["reason"] == "firewall" for h in rows), rows


# 9 ------------------------------------------------------------------------------------------------
# 10 -----------------------------------------------------------------------------------------------
def _member_vms(state: dict, cid: str) -> dict[str, int]:
    from z9.common.tags import normalize_tags

    out = {}
    for v in state["vms"]:
        tags = normalize_tags(v["config"].get("tags"))
        if f"z9-id-{cid}" in tags:
            out[next(t[len("z9-member-"):] for t in tags if t.startswith("z9-member-"))] = v["vmid"]
    return out


def _platform_rules_of(sim: SimAdmin, vmid: int) -> list[dict]:
    return [r for r in sim.server.cluster.firewall.vm(vmid).rules
            if str(r.get("comment", "")).startswith("z9 platform: ")]


# 11 -----------------------------------------------------------------------------------------------
async def test_a_dhcp_clusters_member_rule_changed_by_hand_is_put_back(
        stack: Stack, sim: SimAdmin, firewall_on: None) -> None:  # noqa: F811
    """_observe_filters and converge_firewalls skip every member without a private address: in a
    region without a private network the members' platform rules (written at clone) are never
    compared again — a z9 rule changed by hand stays changed through every cluster job."""
    from tests.integration.clusters.test_clusters_e2e import create as create_cluster

    c, job = await create_cluster(stack, sim, name="dhcpwall", cps=1, workers=1)
    assert (await stack.wait_job(job["id"], timeout_s=300))["status"] == "succeeded"
    cp0 = _member_vms(await sim.state(), c["id"])["cp-0"]
    api = next(r for r in _platform_rules_of(sim, cp0) if r.get("dport") == "6443")
    api["action"] = "DROP"   # by hand
    await sim.firewall_cycle()
    status, out = await stack.call("POST", f"/clusters/{c['id']}/actions/resize-node-pool",
                                   json={"pool": "workers", "count": 1})
    assert status == 202, out
    # (the worker, cut off from the API server meanwhile, went NotReady: the job puts cp-0's rule back
    # first, then waits for the worker — which needs pve-firewall's next cycle, a step of the clock)
    async def rule_back() -> bool:
        return [r["action"] for r in _platform_rules_of(sim, cp0) if r.get("dport") == "6443"] == ["ACCEPT"]
    await wait_until(rule_back, 60, "cp-0's rule put back")
    await sim.firewall_cycle()
    done = await stack.wait_job(out["job"]["id"], timeout_s=120)
    assert done["status"] == "succeeded", done
    assert [r["action"] for r in _platform_rules_of(sim, cp0) if r.get("dport") == "6443"] == ["ACCEPT"], \
        (done["steps"], _platform_rules_of(sim, cp0))


# 12 -----------------------------------------------------------------------------------------------
# 13 -----------------------------------------------------------------------------------------------
