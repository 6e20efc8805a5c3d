"""The PVE IP filter in the simulator's world: a guest that takes an address it was not given is
not heard from it once its VM's firewall filters (pve-firewall ``ipfilter``: datacenter firewall on,
VM firewall on, ``ipfilter: 1``, the NIC's ``firewall=1``, the address outside ``ipfilter-net0``)."""
from __future__ import annotations

from z9.sim.appliance import _probe


def _vm(admin, vmid: int, ip: str, mac: str) -> None:
    admin("post", "/vms", json={"vmid": vmid, "node": "pve1", "running": True, "config": {
        "name": f"g-{vmid}", "agent": "1", "net0": f"virtio={mac},bridge=vmbr0,firewall=1",
        "ide2": f"local-lvm:vm-{vmid}-cloudinit,media=cdrom", "ipconfig0": f"ip={ip}/24,gw=203.0.113.1"}})


def test_a_guest_claiming_an_address_it_was_not_given_is_filtered(sim, sim_thread, pve, admin) -> None:
    guests = sim.cluster.guests
    _vm(admin, 601, "203.0.113.60", "BC:24:11:60:60:01")  # the spoofer
    admin("post", "/guests/601/addresses", json={"iface": "eth0", "address": "203.0.113.99/32"})
    admin("post", "/guests/601/listen", json={"port": 8080})

    async def probe(ip: str) -> tuple[str, str, str]:
        return _probe(guests, ip, 8080, {})

    # no filter: the guest answers from any address it configured (PVE does not check uniqueness)
    assert sim_thread.run(probe("203.0.113.99"))[:2] == ("UP", "L4OK")
    fw = pve.nodes("pve1").qemu(601).firewall
    fw.ipset.post(name="ipfilter-net0")
    fw.ipset("ipfilter-net0").post(cidr="203.0.113.60")
    fw.options.put(enable=1, ipfilter=1)
    # the VM's filter is on, but the datacenter firewall is off: no VM rule is compiled
    assert sim_thread.run(probe("203.0.113.99"))[:2] == ("UP", "L4OK")
    pve.cluster.firewall.options.put(enable=1)
    # now what it sends from the address it took is dropped; its own still answers
    assert sim_thread.run(probe("203.0.113.99"))[:2] == ("DOWN", "L4TOUT")
    assert sim_thread.run(probe("203.0.113.60"))[:2] == ("UP", "L4OK")
    # the address given to it (in its set) is heard again
    fw.ipset("ipfilter-net0").post(cidr="203.0.113.99")
    assert sim_thread.run(probe("203.0.113.99"))[:2] == ("UP", "L4OK")
    fw.ipset("ipfilter-net0")("203.0.113.99").delete()
    assert sim_thread.run(probe("203.0.113.99"))[:2] == ("DOWN", "L4TOUT")
    pve.cluster.firewall.options.put(enable=0)


def test_the_set_alone_filters_and_only_the_macs_link_local_passes(sim, sim_thread, pve, admin) -> None:
    """pve-firewall compiles the filter when ``ipfilter: 1`` *or* the set ``ipfilter-net0`` exists
    (``generate_tap_rules``), and adds the NIC's MAC-derived link-local address with ``fe80::/10``
    as nomatch (``compile_ipsets``): another link-local address is dropped too."""
    from z9.sim.firewall import mac_to_linklocal

    _vm(admin, 602, "203.0.113.61", "BC:24:11:60:60:02")
    fw, cfg = sim.cluster.firewall, sim.cluster.vms[602].config
    pve.cluster.firewall.options.put(enable=1)
    try:
        p = pve.nodes("pve1").qemu(602).firewall
        p.options.put(enable=1)  # the VM's firewall on, ipfilter off, no set: nothing filtered
        assert not fw.refuses_source(602, cfg, "203.0.113.99")
        p.ipset.post(name="ipfilter-net0")  # the set alone (ipfilter still 0) filters
        assert fw.refuses_source(602, cfg, "203.0.113.99") and fw.refuses_source(602, cfg, "203.0.113.61")
        p.ipset("ipfilter-net0").post(cidr="203.0.113.61")
        assert not fw.refuses_source(602, cfg, "203.0.113.61")
        own = mac_to_linklocal("BC:24:11:60:60:02")
        assert own == "fe80::be24:11ff:fe60:6002"
        assert not fw.refuses_source(602, cfg, own)
        assert fw.refuses_source(602, cfg, "fe80::1")
        p.options.put(enable=0)  # the VM's firewall off: no chain for its tap, nothing filtered
        assert not fw.refuses_source(602, cfg, "203.0.113.99")
    finally:
        pve.cluster.firewall.options.put(enable=0)
