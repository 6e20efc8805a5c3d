"""Every guest z9 makes sends only from the addresses it was given: a server without a primary
address and a Kubernetes cluster's members get their address from the region's private network,
chosen by z9 (not leased by DHCP), written as the guest's static cloud-init network and as the only
entry of its Proxmox IP filter (the control planes' also the cluster's endpoint, which kube-vip
moves). With the datacenter firewall on, a guest claiming another address is not heard from it
(the simulator drops it: pve-firewall ``ipfilter``, tests/sim/test_sim_ipfilter.py); a second job
finds the filter as it wants it and does nothing for it; a released address is quarantined."""
from __future__ import annotations

import ipaddress
from typing import Any, AsyncIterator

import aiohttp
import asyncpg
import pytest

from z9.common import store
from z9.common.settings import PrivateNetworkSettings, Settings
from z9.common.tags import identity_tag
from z9.sim.appliance import _probe

from tests.support import REGION, SimAdmin, Stack, api_stack, wait_until
from tests.integration.clusters.test_clusters_e2e import create as create_cluster

NET = PrivateNetworkSettings(cidr="172.16.0.0/24", gateway="172.16.0.1", reserved=["172.16.0.2"],
                             nameservers=["172.16.0.53"], quarantine_s=600)


def _private(settings: Settings, net: PrivateNetworkSettings = NET) -> Settings:
    region = settings.regions[REGION].model_copy(update={"private_network": net})
    return settings.model_copy(update={"regions": {REGION: region}, "deletion_buffer_s": 0.5})


@pytest.fixture
async def private(settings: Settings, pool: asyncpg.Pool, sim: SimAdmin) -> AsyncIterator[Stack]:
    """The stack (API, executor, scheduler, reaper) of a region with a private network, the
    datacenter firewall on (every VM's filter in force)."""
    fw = sim.server.cluster.firewall
    fw.cluster_options["enable"] = "1"
    try:
        async with api_stack(_private(settings), pool) as stack:
            for name in ("executor", "scheduler", "reaper"):
                await stack.start_service(name)
            yield stack
    finally:
        fw.cluster_options.pop("enable", None)


async def _claim(sim: SimAdmin, vmid: int, cidr: str, port: int = 8080) -> None:
    """Inside the guest: ``ip addr add <cidr> dev eth0`` and a listener (what a spoofer would do)."""
    async with aiohttp.ClientSession() as http:
        async def booted() -> bool:
            async with http.post(f"{sim.url}/guests/{vmid}/listen", json={"port": port}, ssl=False) as r:
                return r.status == 200
        await wait_until(booted, 30, f"VM {vmid} has a guest")
        async with http.post(f"{sim.url}/guests/{vmid}/addresses", json={"iface": "eth0", "address": cidr},
                             ssl=False) as r:
            assert r.status == 200, await r.text()


def _heard(sim: SimAdmin, ip: str, port: int = 8080) -> bool:
    """A health check (the simulator's HAProxy probe) to ``ip`` finds a guest answering there."""
    return _probe(sim.server.cluster.guests, ip, port, {})[0] == "UP"


def _vm(state: dict, owner: str, member: str | None = None) -> dict:
    out = [v for v in state["vms"] if identity_tag(owner) in str(v["config"].get("tags"))
           and (member is None or f"z9-member-{member}" in str(v["config"].get("tags")))]
    assert len(out) == 1, out
    return out[0]


def _filter(sim: SimAdmin, vm: dict) -> tuple[dict, set[str]]:
    f = sim.server.cluster.firewall.vm(vm["vmid"])
    return f.options, {e["cidr"] for e in f.ipsets.get("ipfilter-net0", [])}


async def test_a_server_without_a_primary_sends_only_from_its_private_address(private: Stack, sim: SimAdmin) -> None:
    server, job = await private.create_server("inside")
    done = await private.wait_job(job["id"], timeout_s=120)
    assert done["status"] == "succeeded", done
    assert "firewall" in [s["name"] for s in done["steps"]]
    vm = _vm(await sim.state(), server["id"])
    mine = await store.vm_private_addresses_of(private.pool, server["id"])
    ip = mine["main"]
    assert ipaddress.ip_address(ip) in NET.cidr and ip not in ("172.16.0.1", "172.16.0.2")  # gateway, reserved
    # its static cloud-init network (no DHCP), the filter holding exactly that address, set before its start
    assert vm["config"]["ipconfig0"] == f"ip={ip}/24,gw=172.16.0.1" and vm["config"]["nameserver"] == "172.16.0.53"
    options, entries = _filter(sim, vm)
    assert options.get("enable") == "1" and options.get("ipfilter") == "1" and entries == {ip}
    assert "firewall=1" in vm["config"]["net0"].split(",")
    # the guest took that address; a second one it gives itself (another guest's) is never heard
    await _claim(sim, vm["vmid"], "172.16.0.77/24")
    assert _heard(sim, ip)
    assert not _heard(sim, "172.16.0.77")
    # observe → plan of the same create again, as its next attempt would: nothing left to do
    from z9.resources.server.jobs import create as server_create
    ctx = await _ctx(private, job["id"])
    world = await server_create.observe(ctx)
    assert not world.firewall_drift and server_create.plan(ctx.job, world) == []
    assert (await store.vm_private_addresses_of(private.pool, server["id"])) == mine  # the same address


async def _ctx(stack: Stack, job_id: str) -> Any:
    """A context to observe a job's world with (observe and plan write nothing: no lease needed)."""
    from z9.executor.context import JobContext

    ex = stack.services["executor"]
    job = await store.job_get(stack.pool, job_id)
    assert job is not None
    return JobContext(job, ex.owner, ex.pool, ex.clients[REGION], ex.settings)


async def test_floating_addresses_join_the_private_servers_filter(private: Stack, sim: SimAdmin) -> None:
    server, job = await private.create_server("floats")
    assert (await private.wait_job(job["id"], timeout_s=120))["status"] == "succeeded"
    status, out = await private.call("POST", "/addresses", json={"region": REGION, "name": "float-1",
                                                                  "server_id": server["id"]})
    assert status == 202, out
    done = await private.wait_job(out["job"]["id"], timeout_s=60)
    assert done["status"] == "succeeded", done
    adr = out["address"]
    vm = _vm(await sim.state(), server["id"])
    ip = (await store.vm_private_addresses_of(private.pool, server["id"]))["main"]
    _, entries = _filter(sim, vm)
    assert entries == {ip, adr["ip"]}
    status, got = await private.call("GET", f"/addresses/{adr['id']}")
    assert got["address"]["observed"]["enforced"] is True  # the filter is on: the VM uses a static address in its set
    await _claim(sim, vm["vmid"], f"{adr['ip']}/32")
    assert _heard(sim, adr["ip"])  # its own floating address is heard …
    await _claim(sim, vm["vmid"], "172.16.0.99/24")
    assert not _heard(sim, "172.16.0.99")  # … another guest's is not
    # the server's own job leaves the address job's entry where it is (nothing to do for its filter)
    from z9.resources.server.jobs import create as server_create
    ctx = await _ctx(private, job["id"])
    world = await server_create.observe(ctx)
    assert not world.firewall_drift and server_create.plan(ctx.job, world) == []


async def test_a_primary_taken_off_leaves_the_server_on_its_private_address(private: Stack, sim: SimAdmin) -> None:
    """Unassigning a server's primary (stopped) puts its cloud-init on its private address, not
    on DHCP, and its filter stays on — holding that address before the primary leaves the set."""
    server, job = await private.create_server("was-public", public_ipv4=True)
    assert (await private.wait_job(job["id"], timeout_s=120))["status"] == "succeeded"

    async def settled() -> Any:
        s = await private.server(server["id"])
        return s if s["public_ipv4"] else None
    s = await wait_until(settled, 30, "the server's address")
    pub = s["public_ipv4"]
    assert await store.vm_private_addresses_of(private.pool, server["id"]) == {}  # a primary: no private one
    status, out = await private.call("POST", f"/servers/{server['id']}/actions/shutdown")
    assert status == 202 and (await private.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
    status, out = await private.call("POST", f"/addresses/{pub['id']}/actions/unassign")
    assert status == 202, out
    done = await private.wait_job(out["job"]["id"], timeout_s=60)
    assert done["status"] == "succeeded", done
    assert [x["name"] for x in done["steps"]] == ["add_private_entry", "remove_entry", "clear_ipconfig", "untag"]
    ip = (await store.vm_private_addresses_of(private.pool, server["id"]))["main"]
    vm = _vm(await sim.state(), server["id"])
    assert vm["config"]["ipconfig0"] == f"ip={ip}/24,gw=172.16.0.1" and vm["config"]["nameserver"] == "172.16.0.53"
    options, entries = _filter(sim, vm)
    assert options.get("enable") == "1" and options.get("ipfilter") == "1" and entries == {ip}
    # assigned back: the primary again (its private address stays the server's)
    status, out = await private.call("POST", f"/addresses/{pub['id']}/actions/assign", json={"server_id": server["id"]})
    assert status == 202 and (await private.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
    vm = _vm(await sim.state(), server["id"])
    assert vm["config"]["ipconfig0"].startswith(f"ip={pub['ip']}/")
    assert _filter(sim, vm)[1] == {ip, pub["ip"]}


async def test_addresses_are_distinct_released_and_quarantined(private: Stack, sim: SimAdmin) -> None:
    a, ja = await private.create_server("a")
    b, jb = await private.create_server("b")
    for j in (ja, jb):
        assert (await private.wait_job(j["id"], timeout_s=120))["status"] == "succeeded"
    ip_a = (await store.vm_private_addresses_of(private.pool, a["id"]))["main"]
    ip_b = (await store.vm_private_addresses_of(private.pool, b["id"]))["main"]
    assert ip_a != ip_b
    status, out = await private.call("DELETE", f"/servers/{a['id']}")
    assert status == 202, out

    async def gone() -> bool:
        return (await private.server(a["id"]))["status"] == "deleted"
    await wait_until(gone, 120, "server a deleted")
    assert await store.vm_private_addresses_of(private.pool, a["id"]) == {}
    c, jc = await private.create_server("c")
    assert (await private.wait_job(jc["id"], timeout_s=120))["status"] == "succeeded"
    ip_c = (await store.vm_private_addresses_of(private.pool, c["id"]))["main"]
    assert ip_c not in (ip_a, ip_b)  # a's address is in quarantine


async def test_cluster_members_send_only_from_their_addresses(private: Stack, sim: SimAdmin) -> None:
    c, job = await create_cluster(private, sim, name="walled", cps=1, workers=1)
    done = await private.wait_job(job["id"], timeout_s=180)
    assert done["status"] == "succeeded", done
    status, got = await private.call("GET", f"/clusters/{c['id']}")
    vip = got["cluster"]["endpoint"]["address"]
    mine = await store.vm_private_addresses_of(private.pool, c["id"])
    assert set(mine) == {"cp-0", "workers-0"} and len(set(mine.values())) == 2
    state = await sim.state()
    for member, ip in mine.items():
        vm = _vm(state, c["id"], member)
        options, entries = _filter(sim, vm)
        assert options.get("ipfilter") == "1" and options.get("enable") == "1", options
        assert entries == ({ip, vip} if member.startswith("cp-") else {ip}), (member, entries)
        guest = sim.server.cluster.guests.get(vm["vmid"])
        assert [a for n in guest.net_applied for a in n["addresses"]] == [f"{ip}/24"]  # static, from the ISO
    # a worker claiming the control plane's endpoint or another member's address is not heard from it
    worker = _vm(state, c["id"], "workers-0")
    await _claim(sim, worker["vmid"], f"{vip}/32", port=7001)
    assert not _heard(sim, vip, 7001)
    await _claim(sim, worker["vmid"], f"{mine['cp-0']}/24", port=7002)
    assert not _heard(sim, mine["cp-0"], 7002)
    assert _heard(sim, mine["workers-0"], 7002)  # its own address is
    # observed again: every member's filter as it wants it, nothing to do
    from z9.resources.cluster.jobs import reconcile as cluster_reconcile
    from z9.resources.cluster.jobs import shared as _cluster
    world = await _cluster.observe(await _ctx(private, job["id"]))
    assert world.unfiltered == [] and cluster_reconcile.plan(world_job := (await _ctx(private, job["id"])).job,
                                                            world) == [], world_job
    # the filter changed behind z9's back (the VIP dropped from cp-0's set): the next reconcile (a
    # scale-up) puts it back, and gives the new worker its own address
    cp = _vm(state, c["id"], "cp-0")
    fw = sim.server.cluster.firewall.vm(cp["vmid"])
    fw.ipsets["ipfilter-net0"] = [e for e in fw.ipsets["ipfilter-net0"] if e["cidr"] != vip]
    status, out = await private.call("POST", f"/clusters/{c['id']}/actions/resize-node-pool",
                                     json={"pool": "workers", "count": 2})
    assert status == 202, out
    again = await private.wait_job(out["job"]["id"], timeout_s=180)
    assert again["status"] == "succeeded", again
    # (without the VIP in its filter cp-0 cannot serve the endpoint: the reconcile saw no API
    # answer and provisioned cp-0 again — init — whose VM plan put the filter back first)
    assert _filter(sim, cp)[1] == {mine["cp-0"], vip}
    # a worker's filter changed: its own step, the API answering meanwhile
    w0 = sim.server.cluster.firewall.vm(worker["vmid"])
    w0.options["ipfilter"] = "0"
    status, out = await private.call("POST", f"/clusters/{c['id']}/actions/resize-node-pool",
                                     json={"pool": "workers", "count": 3})
    assert status == 202, out
    third = await private.wait_job(out["job"]["id"], timeout_s=180)
    assert third["status"] == "succeeded", third
    assert [(s["name"], s["detail"].get("members")) for s in third["steps"]] == [
        ("firewall", ["workers-0"]), ("join", ["workers-2"])], third["steps"]
    assert w0.options["ipfilter"] == "1"
    grown = await store.vm_private_addresses_of(private.pool, c["id"])
    assert _filter(sim, _vm(await sim.state(), c["id"], "workers-2"))[1] == {grown["workers-2"]}
    assert set(grown) == {"cp-0", "workers-0", "workers-1", "workers-2"} and len(set(grown.values())) == 4
    # a scale-down releases the removed member's address
    status, out = await private.call("POST", f"/clusters/{c['id']}/actions/resize-node-pool",
                                     json={"pool": "workers", "count": 1})  # workers-2 and workers-1 go
    assert status == 202, out
    shrunk = await private.wait_job(out["job"]["id"], timeout_s=180)
    assert shrunk["status"] == "succeeded", shrunk
    assert set(await store.vm_private_addresses_of(private.pool, c["id"])) == {"cp-0", "workers-0"}


async def test_a_member_without_its_address_in_its_filter_cannot_join(private: Stack, sim: SimAdmin) -> None:
    """The simulator holds z9 to it: a member whose filter lacks its own address is not heard at all."""
    from z9.sim.kubeadm import source_filtered

    c, job = await create_cluster(private, sim, name="joined", cps=1, workers=1)
    assert (await private.wait_job(job["id"], timeout_s=180))["status"] == "succeeded"
    worker = _vm(await sim.state(), c["id"], "workers-0")
    guest = sim.server.cluster.guests.get(worker["vmid"])
    fw = sim.server.cluster.firewall.vm(worker["vmid"])
    assert source_filtered(guest) is None
    saved = list(fw.ipsets["ipfilter-net0"])
    fw.ipsets["ipfilter-net0"] = [{"cidr": "172.16.0.250"}]
    try:
        assert source_filtered(guest) is not None
    finally:
        fw.ipsets["ipfilter-net0"] = saved


def test_private_network_settings() -> None:
    assert NET.first_last == (ipaddress.ip_address("172.16.0.1"), ipaddress.ip_address("172.16.0.254"))
    assert NET.excluded == [ipaddress.ip_address("172.16.0.1"), ipaddress.ip_address("172.16.0.2")]
    with pytest.raises(ValueError, match="not inside"):
        PrivateNetworkSettings(cidr="172.16.0.0/24", gateway="172.17.0.1")
    with pytest.raises(ValueError, match="more than 65536"):
        PrivateNetworkSettings(cidr="10.0.0.0/8")
    with pytest.raises(ValueError):
        PrivateNetworkSettings(cidr="fd00::/64")


def test_the_private_network_is_no_load_balancer_target(settings: Settings) -> None:
    """Its addresses are handed to guests of every tenant: an ip target there is refused like a
    pool's free IP (rule address_pool)."""
    from z9.resources.load_balancer import ip_target_refusal, target_networks

    nets = target_networks(_private(settings).regions, REGION)
    assert ip_target_refusal("172.16.0.9", "ten_x", None, **nets) == "address_pool"
