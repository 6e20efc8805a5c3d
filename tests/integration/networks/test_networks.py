"""Private networks through the API, against real PostgreSQL and the Proxmox VE simulator over HTTPS:
the SDN VNet each network is (one batched apply for many creates), servers joining at their create
(two tenants with the same range never reach each other; a server on two networks reaches each peer
only on its network), the 409s (ip_not_available, no_subnet_available, resource_in_use), detach and
delete (the VNet gone after the apply). Assertions are on the world (the simulator's SDN, the VMs'
NICs, what its deliver model lets through) and on the rows."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.support import REGION, SimAdmin, Stack, make_tenant, wait_until

SDN = {"type": "vxlan", "peers": ["192.0.2.11", "192.0.2.12", "192.0.2.13"], "tags": [500, 599]}
pytestmark = pytest.mark.settings(region={"sdn": SDN}, sdn_apply_batch_s=0.5, sdn_reload_wait_s=3.0)


async def sdn_state(sim: SimAdmin) -> dict[str, Any]:
    return await sim._req("GET", "/sdn")


async def applies(sim: SimAdmin) -> int:
    return sum(1 for r in await sim.requests() if r["method"] == "PUT" and r["path"] == "/cluster/sdn")


async def lock_errors(sim: SimAdmin) -> int:
    return sum(1 for r in await sim.requests() if r["status"] >= 400 and "/cluster/sdn" in r["path"])


async def create_network(stack: Stack, name: str, ip_range: str = "10.0.0.0/24", token: str | None = None,
                         expect: int = 202) -> dict[str, Any]:
    status, out = await stack.call("POST", "/networks", json={"name": name, "region": REGION, "ip_range": ip_range},
                                   token=token)
    assert status == expect, out
    return out


async def sdn_jobs(stack: Stack) -> list[tuple[str, str, int, str | None]]:
    rows = await stack.pool.fetch("SELECT id, status::text, attempt, error FROM jobs WHERE kind = 'SdnApply' ORDER BY seq")
    return [(r["id"], r["status"], r["attempt"], str(r["error"])[:300] if r["error"] else None) for r in rows]


async def wait_job(stack: Stack, job_id: str, token: str | None = None, timeout_s: float = 120) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        status, out = await stack.call("GET", f"/jobs/{job_id}", token=token)
        assert status == 200, out
        return out if out["status"] in ("succeeded", "failed") else None
    try:
        return await wait_until(done, timeout_s, f"job {job_id}", interval_s=0.1)
    except AssertionError as e:
        raise AssertionError(f"{e}; the region's SDN apply jobs: {await sdn_jobs(stack)}") from None


async def succeeded(stack: Stack, out: dict[str, Any], token: str | None = None) -> None:
    for j in [out["job"], *out.get("jobs", [])[1:]]:
        got = await wait_job(stack, j["id"], token)
        assert got["status"] == "succeeded", got


@pytest.mark.settings(region={"sdn": SDN}, sdn_apply_batch_s=1.0, sdn_reload_wait_s=3.0)
async def test_twenty_networks_created_at_once_take_at_most_two_applies(stack: Stack, sim: SimAdmin) -> None:
    outs = await asyncio.gather(*(create_network(stack, f"n{i}", "10.0.0.0/24") for i in range(20)))
    await asyncio.gather(*(succeeded(stack, o) for o in outs))
    assert await applies(sim) <= 2, await sim.requests()
    assert await lock_errors(sim) == 0
    st = await sdn_state(sim)
    vnets = {o["network"]["vnet"] for o in outs}
    assert len(vnets) == 20 and vnets <= set(st["running"]["vnets"])
    assert {int(v["tag"]) for v in st["running"]["vnets"].values()} == set(range(500, 520))  # the lowest free tags
    assert all(len(v) <= 8 for v in vnets)
    for o in outs:
        _, got = await stack.call("GET", f"/networks/{o['network']['id']}")
        assert got["network"]["status"] == "available", got
        assert got["network"]["observed"]["mtu"] == 1450
        assert set(got["network"]["observed"]["nodes"].values()) == {"available"}
    alias = {st["running"]["vnets"][o["network"]["vnet"]]["alias"] for o in outs}
    assert alias == {f"n{i}" for i in range(20)}  # the tenant's name is the VNet's alias


async def test_bad_ranges_and_a_region_without_sdn_are_refused(stack: Stack) -> None:
    # the document's pattern: RFC 1918, /16 to /28; the API: no host bits
    for bad, why in (("8.8.8.0/24", "ip_range"), ("10.0.0.0/8", "ip_range"), ("10.0.0.1/24", "host bits set"),
                     ("10.0.0.0/30", "ip_range"), ("not-a-network", "ip_range"), ("172.32.0.0/16", "ip_range")):
        status, out = await stack.call("POST", "/networks", json={"name": "x", "region": REGION, "ip_range": bad})
        assert status == 422 and out["error"]["details"][0]["field"] == "ip_range" and why in out["error"]["message"], out
    status, out = await stack.call("POST", "/networks", json={"name": "x", "region": REGION, "ip_range": "10.0.0.1/24"})
    assert "the network is 10.0.0.0/24" in out["error"]["message"], out


SSH = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIMQ+ctuWvPKZcSiB0avvBJbVNptRfvJ+8krZNKKKLvo alice@example"


async def create_server(stack: Stack, name: str, networks: list[dict[str, Any]], token: str | None = None,
                        expect: int = 202) -> dict[str, Any]:
    body = {"name": name, "region": REGION, "image": "debian-12", "cores": 1, "memory_mib": 1024, "disk_gib": 10,
            "ssh_keys": [SSH], "networks": networks}
    status, out = await stack.call("POST", "/servers", json=body, token=token)
    assert status == expect, out
    return out


async def server_done(stack: Stack, out: dict[str, Any], token: str | None = None) -> dict[str, Any]:
    for j in out["jobs"]:
        got = await wait_job(stack, j["id"], token)
        assert got["status"] == "succeeded", got
    _, srv = await stack.call("GET", f"/servers/{out['server']['id']}", token=token)
    return srv["server"]


async def test_two_tenants_with_the_same_range_never_reach_each_other(stack: Stack, sim: SimAdmin) -> None:
    _, other = await make_tenant(stack.pool, "tenant-b")
    a_net = await create_network(stack, "app", "172.16.10.0/24")
    b_net = await create_network(stack, "app", "172.16.10.0/24", token=other)
    await succeeded(stack, a_net)
    await succeeded(stack, b_net, other)
    a1 = await create_server(stack, "a1", [{"network_id": a_net["network"]["id"], "ip": "172.16.10.5"}])
    a2 = await create_server(stack, "a2", [{"network_id": a_net["network"]["id"]}])
    b1 = await create_server(stack, "b1", [{"network_id": b_net["network"]["id"], "ip": "172.16.10.5"}], token=other)
    assert [j["kind"] for j in a1["jobs"]] == ["ServerCreate", "NetworkAttach"]
    sa1, sa2 = await server_done(stack, a1), await server_done(stack, a2)
    sb1 = await server_done(stack, b1, token=other)
    va1, va2, vb1 = (s["observed"]["vmid"] for s in (sa1, sa2, sb1))
    cfg = (await sim.vm(va1))["config"]
    assert "bridge=" + a_net["network"]["vnet"] in cfg["net1"] and "firewall=1" in cfg["net1"] and "mtu=1450" in cfg["net1"]
    assert cfg["ipconfig1"] == "ip=172.16.10.5/24"
    status, members = await stack.call("GET", f"/networks/{a_net['network']['id']}/members")
    assert {(m["ip"], m["state"]) for m in members["members"]} == {("172.16.10.5", "attached"), ("172.16.10.1", "attached")}
    # a2 reaches a1 on their network; b1 holds the same address on its own network: never reached
    got = await sim.deliver(va2, "172.16.10.5", "tcp", 22)
    assert got["delivered"] and got["dst_vmid"] == va1, got
    got = await sim.deliver(vb1, "172.16.10.1", "tcp", 22)   # a2's address, from tenant b's network
    assert not got["delivered"], got
    got = await sim.deliver(va2, vb1, "tcp", 22)  # b1 by its vmid: only its public NIC, never the network
    assert got.get("dst_vmid") in (vb1, None)
    # the address asked for is taken; and a /28 runs out
    out = await create_server(stack, "a3", [{"network_id": a_net["network"]["id"], "ip": "172.16.10.5"}], expect=409)
    assert out["error"]["code"] == "ip_not_available", out
    small = await create_network(stack, "small", "10.20.0.0/28")
    await succeeded(stack, small)
    status, out = await stack.call("POST", "/servers", json={
        "name": "s-x", "region": REGION, "image": "debian-12", "cores": 1, "memory_mib": 1024, "disk_gib": 10,
        "networks": [{"network_id": small["network"]["id"], "ip": "10.20.0.15"}]})
    assert status == 422 and out["error"]["details"][0]["field"] == "ip", out  # the broadcast address is no host
    # 14 host addresses in a /28: the 15th server asking for one is refused at its request
    for i in range(14):
        await create_server(stack, f"s{i}", [{"network_id": small["network"]["id"]}])
    out = await create_server(stack, "s-full", [{"network_id": small["network"]["id"]}], expect=409)
    assert out["error"]["code"] == "no_subnet_available", out


async def test_a_server_on_two_networks_reaches_each_peer_only_on_its_network(stack: Stack, sim: SimAdmin) -> None:
    front = await create_network(stack, "front", "192.168.1.0/24")
    back = await create_network(stack, "back", "192.168.2.0/24")
    await succeeded(stack, front)
    await succeeded(stack, back)
    fid, bid = front["network"]["id"], back["network"]["id"]
    both = await create_server(stack, "both", [{"network_id": fid}, {"network_id": bid}])
    f1 = await create_server(stack, "f1", [{"network_id": fid}])
    b1 = await create_server(stack, "b1", [{"network_id": bid}])
    v_both, v_f1, v_b1 = [(await server_done(stack, o))["observed"]["vmid"] for o in (both, f1, b1)]
    cfg = (await sim.vm(v_both))["config"]
    assert cfg["ipconfig1"] == "ip=192.168.1.1/24" and cfg["ipconfig2"] == "ip=192.168.2.1/24"
    assert (await sim.deliver(v_both, "192.168.1.2", "tcp", 80))["delivered"]   # f1 on front
    assert (await sim.deliver(v_both, "192.168.2.2", "tcp", 80))["delivered"]   # b1 on back
    assert (await sim.deliver(v_f1, "192.168.1.1", "tcp", 80))["delivered"]     # f1 reaches both on front
    d = await sim.deliver(v_f1, "192.168.2.2", "tcp", 80)                        # f1 never reaches b1
    assert not d["delivered"] and "no NIC on" in d["reason"], d
    d = await sim.deliver(v_b1, "192.168.1.2", "tcp", 80)
    assert not d["delivered"], d


async def guest_addresses(sim: SimAdmin, vmid: int) -> dict[str, list[str]]:
    g = await sim._req("GET", f"/guests/{vmid}")
    return {i["name"]: [a["ip-address"] for a in i["ip-addresses"]] for i in g.get("interfaces", [])}


@pytest.mark.settings(region={"sdn": SDN}, sdn_apply_batch_s=0.3, deletion_buffer_s=0.5)
async def test_attach_detach_and_delete_with_members(stack: Stack, sim: SimAdmin) -> None:
    out = await create_network(stack, "db", "192.168.50.0/24")
    await succeeded(stack, out)
    nid, vnet = out["network"]["id"], out["network"]["vnet"]
    srv = await server_done(stack, await create_server(stack, "db1", []))
    peer = await server_done(stack, await create_server(stack, "db2", [{"network_id": nid, "ip": "192.168.50.9"}]))
    vmid = srv["observed"]["vmid"]
    # attach later: a NIC hot-plugged into the running VM, the address set in the guest at once
    status, got = await stack.call("POST", f"/servers/{srv['id']}/actions/attach_to_network",
                                   json={"network_id": nid, "ip": "192.168.50.7"})
    assert status == 202 and got["job"]["kind"] == "NetworkAttach", got
    assert (await wait_job(stack, got["job"]["id"]))["status"] == "succeeded"
    cfg = (await sim.vm(vmid))["config"]
    assert f"bridge={vnet}" in cfg["net1"] and cfg["ipconfig1"] == "ip=192.168.50.7/24"
    assert "192.168.50.7" in [a for addrs in (await guest_addresses(sim, vmid)).values() for a in addrs]
    # the guest's interface there has the zone's MTU (1450: VXLAN's 50 bytes off the uplink's 1500)
    from z9.executor.proxmox import ProxmoxClient

    pve = ProxmoxClient(REGION, stack.settings.regions[REGION])
    try:
        code, text, _ = await pve.agent_exec(srv["observed"]["node"], vmid, ["ip", "-j", "addr", "show"], poll_s=0.05)
    finally:
        pve.close()
    iface = next(i for i in json.loads(text) if any(a["local"] == "192.168.50.7" for a in i["addr_info"]))
    assert code == 0 and iface["mtu"] == 1450, iface
    assert (await sim.deliver(peer["observed"]["vmid"], "192.168.50.7", "tcp", 5432))["delivered"]
    status, again = await stack.call("POST", f"/servers/{srv['id']}/actions/attach_to_network", json={"network_id": nid})
    assert status == 409 and again["error"]["code"] == "server_already_attached", again
    # a network with members cannot go: 409 naming them
    status, refused = await stack.call("DELETE", f"/networks/{nid}")
    assert status == 409 and refused["error"]["code"] == "resource_in_use", refused
    assert {d["server_id"] for d in refused["error"]["details"]} == {srv["id"], peer["id"]}
    # detach both (the peer through the same action): the NICs leave the VMs, the addresses are free
    for s in (srv, peer):
        status, got = await stack.call("POST", f"/servers/{s['id']}/actions/detach_from_network", json={"network_id": nid})
        assert status == 202, got
        assert (await wait_job(stack, got["job"]["id"]))["status"] == "succeeded"
    cfg = (await sim.vm(vmid))["config"]
    assert "net1" not in cfg and "ipconfig1" not in cfg
    status, members = await stack.call("GET", f"/networks/{nid}/members")
    assert members["members"] == []
    status, gone = await stack.call("DELETE", f"/networks/{nid}")
    assert status == 202, gone

    async def deleted() -> bool:
        status, got = await stack.call("GET", f"/networks/{nid}")
        return status == 200 and got["network"]["status"] == "deleted"
    await wait_until(deleted, 60, "the network deleted")
    st = await sdn_state(sim)
    assert vnet not in st["running"]["vnets"] and vnet not in st["vnets"]  # gone after the apply
