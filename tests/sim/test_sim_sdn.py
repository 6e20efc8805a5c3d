"""The simulator's SDN as pve-network has it: zones and VNets (id rules, VXLAN tag uniqueness, the
error texts), pending vs running config, the cluster-wide apply with its PVE 9 lock token, each node's
zone status (and a node whose reload fails), VNet bridges on guests' NICs, and reachability across
networks. Sources: pve-network ``src/PVE/Network/SDN.pm``, ``API2/Network/SDN.pm``,
``API2/Network/SDN/{Zones,Vnets}.pm``, ``SDN/Zones/VxlanPlugin.pm``, ``API2/Network/SDN/Nodes/Zones.pm``
(module docstring of :mod:`z9.sim.sdn`)."""

from __future__ import annotations

import json

import pytest
import requests
from proxmoxer import ProxmoxAPI, ResourceException

from .test_sim_guest import agent_exec, clone, until


def err(call) -> ResourceException:
    with pytest.raises(ResourceException) as e:
        call()
    return e.value


def message(sim, method: str, path: str, **data) -> str:
    """The whole error message of a refused request (PVE >= 9 puts it in the body's ``message``; the
    HTTP reason phrase, all proxmoxer keeps, is its first line)."""
    r = requests.request(method, f"https://127.0.0.1:{sim.port}/api2/json{path}", data=data, verify=False,
                         headers={"Authorization": f"PVEAPIToken=root@pam!z9={sim.token_secret}"}, timeout=10)
    assert r.status_code >= 400, r.text
    return r.json()["message"]


def zone(pve, zid="z9a", **kw):
    pve.cluster.sdn.zones.post(zone=zid, type="vxlan", peers="10.0.0.1,10.0.0.2,10.0.0.3", **kw)


def apply(pve, wait, **kw) -> dict:
    return wait(pve.cluster.sdn.put(**kw))


def test_vnet_ids_tags_and_their_refusals(pve, sim):
    """Ids: ``[a-zA-Z][a-zA-Z0-9]*[a-zA-Z0-9]``, at most 8 characters (schema); a second object of an id:
    ``sdn vnet object ID '<id>' already defined``; VXLAN: ``missing vxlan tag``, a VNI unique across every
    VXLAN zone (VxlanPlugin.pm vnet_update_hook); a VXLAN zone needs peers or a fabric."""
    e = err(lambda: pve.cluster.sdn.zones.post(zone="z9b", type="vxlan"))
    assert e.status_code == 400 and "peers" in e.errors
    zone(pve)
    zone(pve, "z9b")
    assert "sdn zone object ID 'z9a' already defined" in str(err(lambda: zone(pve)))
    assert err(lambda: pve.cluster.sdn.vnets.post(vnet="toolongid", zone="z9a", tag=5)).status_code == 400
    assert err(lambda: pve.cluster.sdn.vnets.post(vnet="9bad", zone="z9a", tag=5)).status_code == 400
    assert message(sim, "POST", "/cluster/sdn/vnets", vnet="n1", zone="z9a") == (
        "create sdn vnet object failed: Parameter verification failed.\ntag: missing vxlan tag\n")
    pve.cluster.sdn.vnets.post(vnet="n1", zone="z9a", tag=100, alias="tenant net")
    e = err(lambda: pve.cluster.sdn.vnets.post(vnet="n1", zone="z9a", tag=101))
    assert "create sdn vnet object failed: sdn vnet object ID 'n1' already defined" in str(e)
    # another zone: still taken (VNIs are unique across every VXLAN zone)
    assert "tag: vxlan tag 100 already exist in vnet n1 in zone z9a" in message(
        sim, "POST", "/cluster/sdn/vnets", vnet="n2", zone="z9b", tag=100)


def test_pending_until_applied_then_running_and_every_node_available(pve, wait, admin):
    """Writes change the pending config only (``?pending=1`` state ``new``); ``PUT /cluster/sdn`` commits
    everything and reloads each node; a node's zones are ``available`` once its reload ran."""
    zone(pve)
    pve.cluster.sdn.vnets.post(vnet="n1", zone="z9a", tag=7)
    pending = {v["vnet"]: v for v in pve.cluster.sdn.vnets.get(pending=1)}
    assert pending["n1"]["state"] == "new" and pending["n1"]["pending"]["tag"] == 7
    assert pve.cluster.sdn.vnets.get(running=1) == []
    assert pve.nodes("pve1").sdn.zones.get() == []
    assert apply(pve, wait)["exitstatus"] == "OK"
    assert [v["vnet"] for v in pve.cluster.sdn.vnets.get(running=1)] == ["n1"]
    assert "state" not in {v["vnet"]: v for v in pve.cluster.sdn.vnets.get(pending=1)}["n1"]
    for node in ("pve1", "pve2", "pve3"):
        until(lambda node=node: pve.nodes(node).sdn.zones.get() == [{"zone": "z9a", "status": "available"}])
    pve.cluster.sdn.vnets("n1").delete()
    assert {v["vnet"]: v for v in pve.cluster.sdn.vnets.get(pending=1)}["n1"]["state"] == "deleted"


def test_global_lock_token_refuses_everyone_else_and_never_expires(pve, wait):
    """PVE 9: ``POST /cluster/sdn/lock`` → a token; every other writer and apply: ``invalid lock token
    provided!``; ``configuration has pending changes`` unless allow-pending; DELETE with the token or force."""
    zone(pve)
    e = err(lambda: pve.cluster.sdn.lock.post())
    assert "configuration has pending changes" in str(e)
    token = pve.cluster.sdn.lock.post(**{"allow-pending": 1})
    assert len(token) == 36 and token[14] == "7"  # a UUIDv7
    e = err(lambda: pve.cluster.sdn.vnets.post(vnet="n1", zone="z9a", tag=7))
    assert e.content == "create sdn vnet object failed: invalid lock token provided!"
    assert "could not commit SDN config: invalid lock token provided!" in str(err(lambda: pve.cluster.sdn.put()))
    assert "could not acquire lock for SDN config: invalid lock token provided!" in str(
        err(lambda: pve.cluster.sdn.lock.post(**{"allow-pending": 1})))
    assert "could not release lock: invalid lock token provided!" in str(
        err(lambda: pve.cluster.sdn.lock.delete(**{"lock-token": "0190-not-it"})))
    pve.cluster.sdn.vnets.post(vnet="n1", zone="z9a", tag=7, **{"lock-token": token})
    assert apply(pve, wait, **{"lock-token": token})["exitstatus"] == "OK"  # release-lock defaults to 1
    pve.cluster.sdn.vnets.post(vnet="n2", zone="z9a", tag=8)  # no lock any more
    token = pve.cluster.sdn.lock.post(**{"allow-pending": 1})
    pve.cluster.sdn.lock.delete(force=1)
    pve.cluster.sdn.vnets.post(vnet="n3", zone="z9a", tag=9)


def test_a_node_whose_reload_fails_leaves_the_apply_ok_and_its_zone_pending(pve, wait, admin):
    """API2/Network/SDN.pm reload: each node's reload is only ``warn``ed ("FIXME … monitor the tasks"):
    the task ends OK, the node's zones lag (``pending``: its local config is older); reloaded again, it
    catches up."""
    admin("post", "/sdn/reload-fault", json={"node": "pve2", "fail": True})
    zone(pve)
    pve.cluster.sdn.vnets.post(vnet="n1", zone="z9a", tag=7)
    assert apply(pve, wait)["exitstatus"] == "OK"
    until(lambda: pve.nodes("pve1").sdn.zones.get() == [{"zone": "z9a", "status": "available"}])
    until(lambda: [t for t in pve.nodes("pve2").tasks.get(typefilter="srvreload") if t.get("status")])
    assert pve.nodes("pve2").sdn.zones.get() == [{"zone": "z9a", "status": "pending"}]
    admin("post", "/sdn/reload-fault", json={"node": "pve2", "fail": False})
    assert apply(pve, wait)["exitstatus"] == "OK"
    until(lambda: pve.nodes("pve2").sdn.zones.get() == [{"zone": "z9a", "status": "available"}])


def _guest(pve, wait, vmid: int, node: str = "pve1"):
    clone(pve, wait, newid=vmid, name=f"g-{vmid}", node=node)
    vm = pve.nodes(node).qemu(vmid)
    assert wait(vm.status.start.post())["exitstatus"] == "OK"
    until(lambda: vm.agent.ping.post() is not None)
    return vm


def _plug(vm, wait, nic: str, vnet: str, cidr: str) -> None:
    assert wait(vm.config.post(**{nic: f"virtio,bridge={vnet},firewall=1,mtu=1450"}))["exitstatus"] == "OK"
    iface = f"ens{18 + int(nic[3:])}"  # qemu-server PCI.pm: net<n> at slot 18 + n
    assert agent_exec(vm, ["ip", "link", "set", "dev", iface, "up", "mtu", "1450"])["exitcode"] == 0
    assert agent_exec(vm, ["ip", "addr", "add", cidr, "dev", iface])["exitcode"] == 0


def test_vnet_bridges_carry_guests_only_between_nics_on_the_same_network(pve, wait, admin):
    """A VNet is a bridge on a node once applied there (a NIC on it before: ``hotplug problem - bridge
    '<b>' does not exist``); two guests reach each other on a network both are on, never across two
    networks that use the same addresses, and nothing outside reaches a VNet."""
    a, b, c = _guest(pve, wait, 301), _guest(pve, wait, 302, node="pve2"), _guest(pve, wait, 303)
    zone(pve)
    for vnet, tag in (("na", 11), ("nb", 12)):
        pve.cluster.sdn.vnets.post(vnet=vnet, zone="z9a", tag=tag)
    e = err(lambda: a.config.put(net1="virtio,bridge=na"))
    assert "hotplug problem - bridge 'na' does not exist" in str(e)
    assert apply(pve, wait)["exitstatus"] == "OK"
    until(lambda: all(pve.nodes(n).sdn.zones.get() == [{"zone": "z9a", "status": "available"}]
                      for n in ("pve1", "pve2")))
    _plug(a, wait, "net1", "na", "10.0.0.2/24")
    _plug(b, wait, "net1", "na", "10.0.0.3/24")
    _plug(c, wait, "net1", "nb", "10.0.0.3/24")  # another network, the same address as b
    _plug(c, wait, "net2", "na", "10.0.0.4/24")  # c is on both
    # a virtio NIC's mtu= is the device MTU the guest's driver starts with (QEMU host_mtu)
    assert wait(a.config.post(net3="virtio,bridge=na,mtu=1400"))["exitstatus"] == "OK"
    rows = json.loads(agent_exec(a, ["ip", "-j", "addr", "show"])["out-data"])
    assert {r["ifname"]: r["mtu"] for r in rows}["ens21"] == 1400

    def deliver(src, dst):
        return admin("get", "/firewall/deliver", params={"src": str(src), "dst": str(dst), "proto": "tcp",
                                                        "port": 22})

    got = deliver(301, "10.0.0.3")
    assert got["delivered"] and got["dst_vmid"] == 302, got  # b on na, never c's 10.0.0.3 on nb
    assert deliver(303, "10.0.0.2")["delivered"]  # c reaches a over na (its net2)
    d = deliver("198.51.100.7", "10.0.0.2")
    assert not d["delivered"] and "private network" in d["reason"]
    assert wait(c.config.post(delete="net2"))["exitstatus"] == "OK"  # c leaves na
    d = deliver(303, "10.0.0.2")
    assert not d["delivered"] and "has no NIC on na" in d["reason"], d


def test_sdn_privileges_as_pve_network_checks_them(pve, sim, admin, wait):
    """API2/Network/SDN.pm: ``PUT /cluster/sdn`` and the lock need ``SDN.Allocate`` on ``/sdn``; Zones.pm
    create ``SDN.Allocate`` on ``/sdn/zones``; Vnets.pm create on ``/sdn/zones/<zone>``; the listings and a
    node's zone status show only what the token may audit (``SDN.Audit``); a NIC on a VNet needs
    ``SDN.Use`` on ``/sdn/zones/<zone>/<vnet>`` (qemu-server check_bridge_access)."""
    def client(tok):
        user, _, name = tok["tokenid"].partition("!")
        return ProxmoxAPI("127.0.0.1", port=sim.port, user=user, token_name=name, token_value=tok["value"],
                          verify_ssl=str(sim.cert_path), timeout=10)

    zone(pve)
    pve.cluster.sdn.vnets.post(vnet="n1", zone="z9a", tag=7)
    assert apply(pve, wait)["exitstatus"] == "OK"
    audit = client(admin("post", "/tokens", json={"tokenid": "root@pam!sdnaudit", "privsep": True,
                                                  "acl": [{"path": "/sdn", "privs": ["SDN.Audit"]}]}))
    assert [v["vnet"] for v in audit.cluster.sdn.vnets.get(running=1)] == ["n1"]
    e = err(lambda: audit.cluster.sdn.put())
    assert e.status_code == 403 and e.content == "Permission check failed (/sdn, SDN.Allocate)"
    assert err(lambda: audit.cluster.sdn.lock.post()).content == "Permission check failed (/sdn, SDN.Allocate)"
    e = err(lambda: audit.cluster.sdn.vnets.post(vnet="n2", zone="z9a", tag=8))
    assert e.content == "Permission check failed (/sdn/zones/z9a, SDN.Allocate)"
    blind = client(admin("post", "/tokens", json={"tokenid": "root@pam!blind", "privsep": True,
                                                  "acl": [{"path": "/vms", "privs": ["VM.Audit"]}]}))
    assert blind.cluster.sdn.vnets.get() == [] and blind.nodes("pve1").sdn.zones.get() == []
    nic = client(admin("post", "/tokens", json={"tokenid": "root@pam!nic", "privsep": True, "acl": [
        {"path": "/vms", "privs": ["VM.Config.Network", "VM.Audit"]}]}))
    clone(pve, wait, newid=310, name="g-310")
    e = err(lambda: nic.nodes("pve1").qemu(310).config.put(net1="virtio,bridge=n1"))
    assert e.status_code == 403 and e.content == "Permission check failed (/sdn/zones/z9a/n1, SDN.Use)"
