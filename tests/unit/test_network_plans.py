"""The network kinds' pure plans on hand-built worlds: what the region's SDN apply has left to do, which
pending SDN edits are someone else's, what a network's job waits for, and a member's NIC steps."""
from __future__ import annotations

import ipaddress
from datetime import UTC, datetime

from z9.resources.network import (
    NETWORK_ATTACH,
    NETWORK_CREATE,
    NETWORK_DELETE,
    NETWORK_DETACH,
)
from z9.resources.network.jobs import apply, members, network
from z9.resources.network.model import Member, Network, vnet_id

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def world(**kw: object) -> apply.World:
    base: dict[str, object] = {
        "wanted": apply.Wanted(present={"z9186a0": 100000}, ours={"z9186a0", "z9186a1"}), "zone": "z9net",
        "zone_running": True, "zone_pending": True, "running": {"z9186a0": {"zone": "z9net"}}, "pending": {"z9186a0": {}},
        "pending_zones": {"z9net": {}}, "nodes": {"pve1": "available", "pve2": "available"}, "recorded_token": None}
    base.update(kw)
    return apply.World(**base)  # type: ignore[arg-type]


def test_nothing_to_apply_when_running_config_and_nodes_are_as_wanted() -> None:
    assert apply.plan_world(world()) == []


def test_an_apply_for_a_missing_vnet_a_lagging_node_a_pending_edit_of_ours_or_a_recorded_lock() -> None:
    assert apply.plan_world(world(running={}))
    assert apply.plan_world(world(nodes={"pve1": "available", "pve2": "pending"}))
    assert apply.plan_world(world(pending={"z9186a0": {}, "z9186a1": {"state": "deleted"}}))
    assert apply.plan_world(world(recorded_token="0190-…"))
    assert apply.plan_world(world(zone_running=False))


def test_foreign_edits_are_the_pending_objects_z9_did_not_make() -> None:
    w = world(pending={"z9186a0": {"state": "new"}, "ops1": {"state": "changed"}},
              pending_zones={"z9net": {"state": "new"}, "ops": {"state": "new"}, "old": {}})
    assert apply.foreign_edits(w) == ["zone ops (new)", "vnet ops1 (changed)"]


def net(status: str = "creating") -> Network:
    return Network(id="net_01", tenant_id="ten_01", region="dev-1", name="n", ip_range=ipaddress.IPv4Network("10.0.0.0/24"),
                   vni=100000, vnet=vnet_id(100000), status=status, status_reason=None, status_before_delete=None,
                   delete_after=None, observed=None, observed_at=None, created_at=NOW, updated_at=NOW, deleted_at=None)


def test_vnet_ids_fit_pve_and_follow_the_tag() -> None:
    assert vnet_id(100000) == "z9186a0" and vnet_id(16777215) == "z9ffffff" and len(vnet_id(16777215)) == 8


def test_a_network_waits_until_running_and_available_everywhere_and_its_delete_until_gone() -> None:
    ok = network.SdnView(running={"z9186a0": {}}, pending={"z9186a0": {}}, nodes={"pve1": "available"})
    assert network.plan(NETWORK_CREATE, net(), ok) == []
    late = network.SdnView(running={"z9186a0": {}}, nodes={"pve1": "available", "pve2": "pending"})
    assert [s.name for s in network.plan(NETWORK_CREATE, net(), late)] == [network.AWAIT_APPLY]
    assert network.lagging(late) == {"pve2": "pending"}
    assert network.plan(NETWORK_DELETE, net("destroying"), ok)
    gone = network.SdnView(running={}, pending={"z9186a0": {"state": "deleted"}}, nodes={"pve1": "available"})
    assert network.plan(NETWORK_DELETE, net("destroying"), gone) == []


def vm(config: dict[str, str], running: bool = True) -> members.VmState:
    return members.VmState(vmid=101, node="pve1", config=config, status="running" if running else "stopped")


def member() -> Member:
    return Member(network_id="net_01", server_id="srv_01", tenant_id="ten_01", ip="10.0.0.7/32", nic="net1",
                  state="attaching", created_at=NOW, updated_at=NOW)


def test_attach_plugs_the_nic_filters_it_and_configures_the_guest() -> None:
    w = members.World(net(), member(), vm({"net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0"}), ipset=None,
                      guest_ifaces=[], mtu=1450)
    assert [s.name for s in members.plan(NETWORK_ATTACH, w)] == ["nic", "ip_filter", "guest"]
    nic = "virtio=BC:24:11:00:00:02,bridge=z9186a0,firewall=1,mtu=1450"
    done = members.World(net(), member(), vm({"net1": nic, "ipconfig1": "ip=10.0.0.7/24"}),
                         ipset=[{"cidr": "10.0.0.7"}], mtu=1450,
                         guest_ifaces=[{"ifname": "ens19", "address": "bc:24:11:00:00:02",
                                        "addr_info": [{"local": "10.0.0.7", "prefixlen": 24}]}])
    assert members.plan(NETWORK_ATTACH, done) == []
    assert members.nic_value(nic, "z9186a0", 1450) == nic  # the MAC kept
    stopped = members.World(net(), member(), vm({"net1": nic, "ipconfig1": "ip=10.0.0.7/24"}, running=False),
                            ipset=[{"cidr": "10.0.0.7"}], guest_ifaces=None, mtu=1450)
    assert members.plan(NETWORK_ATTACH, stopped) == []  # cloud-init applies ipconfig1 at its next boot


def test_detach_unplugs_and_drops_the_filter_set() -> None:
    nic = "virtio=BC:24:11:00:00:02,bridge=z9186a0,firewall=1,mtu=1450"
    w = members.World(net(), member(), vm({"net1": nic, "ipconfig1": "ip=10.0.0.7/24"}), ipset=[{"cidr": "10.0.0.7"}])
    assert [s.name for s in members.plan(NETWORK_DETACH, w)] == ["unplug", "ip_filter"]
    assert members.plan(NETWORK_DETACH, members.World(net(), member(), vm({}), ipset=None)) == []
