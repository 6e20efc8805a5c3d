"""The PVE firewall as pve-firewall compiles it: the VM rules API (``src/PVE/API2/Firewall/Rules.pm``),
the daemon's 10 s compile cycle (``src/PVE/Service/pve_firewall.pm``) and what a VM's chains let
through (``src/PVE/Firewall.pm``), asked as one question: would a packet from X to Y be delivered?"""
from __future__ import annotations

import hashlib

import pytest
import requests
from proxmoxer import ResourceException

MODIFIED = "detected modified configuration - file changed by other user? Try again."
OUTSIDE = "203.0.113.9"


def err(call) -> ResourceException:
    with pytest.raises(ResourceException) as e:
        call()
    return e.value


def _vm(admin, vmid: int, ip: str, *, firewall: bool = True, node: str = "pve1", ip6: str | None = None) -> None:
    """A running guest (booted long ago) with a static address on net0 behind the firewall bridge."""
    mac = f"BC:24:11:{vmid // 256 % 256:02X}:{vmid % 256:02X}:01"
    ipc = f"ip={ip}/24,gw=203.0.113.1" + (f",ip6={ip6}/64" if ip6 else "")
    admin("post", "/vms", json={"vmid": vmid, "node": node, "running": True, "config": {
        "name": f"g-{vmid}", "agent": "1", "net0": f"virtio={mac},bridge=vmbr0" + (",firewall=1" if firewall else ""),
        "ide2": f"local-lvm:vm-{vmid}-cloudinit,media=cdrom", "ipconfig0": ipc}})


def _ask(admin, src, dst, proto="tcp", port=None, **kw) -> dict:
    params = {"src": str(src), "dst": str(dst), "proto": proto, **{k: str(v) for k, v in kw.items()}}
    if port is not None:
        params["port"] = str(port)
    return admin("get", "/firewall/deliver", params=params)


def _cycle(admin) -> dict:
    return admin("post", "/firewall/clock", json={"next_cycle": True})


@pytest.fixture
def fw_on(pve):
    """The datacenter firewall on (cluster.fw ``enable: 1``); off again after the test."""
    pve.cluster.firewall.options.put(enable=1)
    yield
    pve.cluster.firewall.options.put(enable=0)


def _guard(pve, vmid: int, **options) -> None:
    pve.nodes("pve1").qemu(vmid).firewall.options.put(enable=1, **options)


# ---- the rules API -------------------------------------------------------------------------------
def test_rules_insert_at_the_top_disabled_unless_enabled_and_list_with_pos_and_digest(pve):
    rules = pve.nodes("pve1").qemu(100).firewall.rules
    assert rules.get() == []
    rules.post(type="in", action="ACCEPT", proto="tcp", dport="22", enable=1, comment="z9: ssh")
    # create_rule: `unshift @$rules, $rule` — always first; `pos` is copied into the rule but unused
    rules.post(type="in", action="DROP", proto="udp", source="10.0.0.0/8,192.168.1.1", pos=5)
    got = rules.get()
    assert [r["pos"] for r in got] == [0, 1]
    assert got[0]["action"] == "DROP" and got[0]["enable"] == 0  # `$rule->{enable} = 0 if !defined(...)`
    assert got[0]["ipversion"] == 4 and "pos" in got[0] and got[0]["source"] == "10.0.0.0/8,192.168.1.1"
    assert got[1] == {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "22", "enable": 1,
                      "comment": "z9: ssh", "pos": 1, "digest": got[1]["digest"]}
    # copy_list_with_digest: sha1 over "k:v\n" of each rule's sorted keys (no pos, no digest)
    sha = hashlib.sha1()
    for r in got:
        for k in sorted(set(r) - {"pos", "digest"}):
            sha.update(f"{k}:{r[k]}\n".encode())
    assert {r["digest"] for r in got} == {sha.hexdigest()}
    one = rules(1).get()
    assert one["pos"] == 1 and one["comment"] == "z9: ssh"
    e = err(lambda: rules(2).get())
    assert (e.status_code, e.content) == (500, "no rule at position 2")
    # POST checks no digest (create_rule has no assert_if_modified)
    rules.post(type="out", action="ACCEPT", digest=hashlib.sha1(b"x").hexdigest())
    assert len(rules.get()) == 3


def test_rules_move_update_delete_under_the_digest(pve):
    rules = pve.nodes("pve1").qemu(100).firewall.rules
    for port in ("3", "2", "1"):
        rules.post(type="in", action="ACCEPT", proto="tcp", dport=port, enable=1)
    assert [r["dport"] for r in rules.get()] == ["1", "2", "3"]
    stale = rules.get()[0]["digest"]
    rules(0).put(moveto=2, digest=stale)  # the rule goes before the one at 2 (after removal: last)
    assert [r["dport"] for r in rules.get()] == ["2", "1", "3"]
    e = err(lambda: rules(0).put(moveto=1, digest=stale))
    assert (e.status_code, e.content) == (500, MODIFIED)
    rules(0).put(moveto=9)  # beyond the end: last
    assert [r["dport"] for r in rules.get()] == ["1", "3", "2"]
    # update: given properties set, '' deletes, `delete` removes, verified again
    rules(0).put(dport="80:90", comment="web", source="10.1.0.0/16")
    r = rules(0).get()
    assert (r["dport"], r["comment"], r["source"], r["ipversion"]) == ("80:90", "web", "10.1.0.0/16", 4)
    rules(0).put(delete="comment,source", dport="")
    r = rules(0).get()
    assert "comment" not in r and "source" not in r and "dport" not in r and "ipversion" not in r
    e = err(lambda: rules(0).put(delete="color"))
    assert e.status_code == 400 and e.errors == {"delete": "no such property ('color')"}
    e = err(lambda: rules(0).put(delete="action"))
    assert e.status_code == 400 and e.errors == {"delete": "unable to delete required property 'action'"}
    e = err(lambda: rules(0).put(proto="", dport="22"))
    assert e.status_code == 400 and e.errors == {"proto": "missing property - 'dport' requires this property"}
    e = err(lambda: rules(7).put(comment="x"))
    assert (e.status_code, e.content) == (500, "no rule at position 7")
    digest = rules.get()[0]["digest"]
    e = err(lambda: rules(0).delete(digest=hashlib.sha1(b"").hexdigest()))
    assert (e.status_code, e.content) == (500, MODIFIED)
    rules(0).delete(digest=digest)
    assert [r["dport"] for r in rules.get()] == ["3", "2"]
    e = err(lambda: rules(5).delete())
    assert (e.status_code, e.content) == (500, "no rule at position 5")


@pytest.mark.parametrize("params, errors", [
    ({"proto": "vrrp", "dport": "22"}, {"dport": "protocol 'vrrp' does not support ports"}),
    ({"proto": "112", "sport": "22"}, {"sport": "protocol '112' does not support ports"}),
    ({"dport": "22"}, {"proto": "missing property - 'dport' requires this property"}),
    ({"sport": "22"}, {"proto": "missing property - 'sport' requires this property"}),
    ({"type": "forward"}, {"type": "invalid rule type 'forward' for rule_env 'vm'"}),
    ({"action": "ALLOW"}, {"action": "unknown action 'ALLOW'"}),
    ({"source": "+nope"}, {"source": "no such ipset 'nope'"}),
    ({"dest": "+dc/nope"}, {"dest": "no such ipset 'nope'"}),
    ({"source": "office"}, {"source": "no such alias 'office'"}),
    ({"iface": "eth0"}, {"iface": "value does not match the regex pattern 'net\\d+'"}),
    ({"macro": "Nope"}, {"macro": "unknown macro 'Nope'"}),
    ({"macro": "SSH", "proto": "udp"}, {"proto": "parameter 'proto' already define in macro (value = 'tcp')"}),
    ({"proto": "tcp", "icmp-type": "echo-request"}, {"proto": "missing property - 'icmp-type' requires this property"}),
])
def test_rule_verification_as_pve(pve, params, errors):
    body = {"type": "in", "action": "ACCEPT", **params}
    e = err(lambda: pve.nodes("pve1").qemu(100).firewall.rules.post(**body))
    assert (e.status_code, e.errors) == (400, errors)
    assert pve.nodes("pve1").qemu(100).firewall.rules.get() == []


@pytest.mark.parametrize("params, field, text", [
    ({"proto": "tcp", "dport": "99999"}, "dport", "invalid port '99999'"),
    ({"proto": "tcp", "dport": "90:80"}, "dport", "backwards range '90:80' not allowed, did you mean '80:90'?"),
    ({"proto": "tcp", "dport": "22,,80"}, "dport", "extraneous commas in list"),
    ({"proto": "tcp", "dport": ",".join(str(p) for p in range(1, 17))}, "dport",
     "too many entries in port list (> 15 numbers)"),
    ({"proto": "bogus"}, "proto", "unknown protocol 'bogus'"),
    ({"proto": "999"}, "proto", "unknown protocol '999'"),
    ({"source": "10.0.0.0/8,2001:db8::1"}, "source",
     "detected mixed ipv4/ipv6 addresses in address list '10.0.0.0/8,2001:db8::1'"),
    ({"source": "10.0.0.1-10.0.0.9,10.1.0.1"}, "source", "you can't use a range in a list"),
    ({"dest": "10.0.0.300"}, "dest", "invalid IP address: Invalid quad in IP address 10.0.0.300 - 300"),
    ({"iface": "n"}, "iface", "invalid network interface name 'n'"),  # the format before minLength
])
def test_rule_parameter_formats_as_the_schema(pve, params, field, text):
    e = err(lambda: pve.nodes("pve1").qemu(100).firewall.rules.post(type="in", action="ACCEPT", **params))
    assert e.status_code == 400 and field in e.errors
    assert e.errors[field] in (f"invalid format - {text}\n", text), e.errors


def test_rules_follow_the_vm_file_clone_destroy_and_state(pve, wait, sim, admin):
    assert wait(pve.nodes("pve1").qemu(9000).clone.post(newid=101, name="a", full=1))["exitstatus"] == "OK"
    rules = pve.nodes("pve1").qemu(101).firewall.rules
    rules.post(type="in", action="ACCEPT", proto="tcp", dport="443", enable=1)
    assert wait(pve.nodes("pve1").qemu(101).clone.post(newid=102, name="b", full=1))["exitstatus"] == "OK"
    assert [r["dport"] for r in pve.nodes("pve1").qemu(102).firewall.rules.get()] == ["443"]  # clone_vmfw_conf
    assert admin("get", "/state")["firewall"]["vms"]["101"]["rules"][0]["dport"] == "443"
    from z9.sim.firewall import Firewall

    copy = Firewall()
    copy.load(sim.cluster.firewall.dump())
    assert copy.list_rules(101) == pve.nodes("pve1").qemu(101).firewall.rules.get()
    assert wait(pve.nodes("pve1").qemu(102).delete())["exitstatus"] == "OK"
    assert pve.nodes("pve1").qemu(102).firewall.rules.get() == []  # remove_vmfw_conf
    assert {"name": "rules"} in pve.nodes("pve1").qemu(101).firewall.get()


def test_rules_permissions(sim, admin):
    """Rules.pm: ``rules_modify_permissions`` VM.Config.Network, ``rules_audit_permissions`` VM.Audit,
    on /vms/{vmid}."""
    from proxmoxer import ProxmoxAPI

    def client(privs):
        tok = admin("post", "/tokens", json={"tokenid": "ops@pve!fw", "acl": [{"path": "/vms/100", "privs": privs}],
                                             "user_acl": [{"path": "/", "privs": ["VM.Audit", "VM.Config.Network"]}]})
        user, _, name = tok["tokenid"].partition("!")
        return ProxmoxAPI("127.0.0.1", port=sim.port, user=user, token_name=name, token_value=tok["value"],
                          verify_ssl=False, timeout=10)

    ro = client(["VM.Audit"]).nodes("pve1").qemu(100).firewall.rules
    assert ro.get() == []
    e = err(lambda: ro.post(type="in", action="ACCEPT"))
    assert (e.status_code, e.content) == (403, "Permission check failed (/vms/100, VM.Config.Network)")
    rw = client(["VM.Config.Network"]).nodes("pve1").qemu(100).firewall.rules
    rw.post(type="in", action="ACCEPT")
    e = err(lambda: rw.get())
    assert (e.status_code, e.content) == (403, "Permission check failed (/vms/100, VM.Audit)")


# ---- the compile cycle -----------------------------------------------------------------------------
def test_a_write_is_enforced_only_from_the_daemons_next_cycle(pve, admin, fw_on):
    _vm(admin, 611, "203.0.113.61")
    _cycle(admin)  # the datacenter firewall on is compiled
    assert _ask(admin, OUTSIDE, 611, port=22)["delivered"]  # the VM's firewall is off: not filtered
    _guard(pve, 611)
    clock = admin("get", "/firewall/clock")
    assert clock["manual"] and 0 < clock["next_cycle_in"] <= 10
    # the write is not enforced yet: same cycle
    assert _ask(admin, OUTSIDE, 611, port=22)["reason"] == "VM 611: its firewall is off (enable: 0): not filtered"
    admin("post", "/firewall/clock", json={"advance": clock["next_cycle_in"] / 2})
    assert _ask(admin, OUTSIDE, 611, port=22)["delivered"]
    admin("post", "/firewall/clock", json={"advance": clock["next_cycle_in"]})  # past the boundary
    d = _ask(admin, OUTSIDE, 611, port=22)
    assert not d["delivered"] and d["reason"] == \
        "VM 611 net0 in: no rule matched; policy_in DROP (the default: not set) decided"
    pve.nodes("pve1").qemu(611).firewall.rules.post(type="in", action="ACCEPT", proto="tcp", dport="22", enable=1)
    assert not _ask(admin, OUTSIDE, 611, port=22)["delivered"]
    _cycle(admin)
    assert _ask(admin, OUTSIDE, 611, port=22)["delivered"]
    # the datacenter firewall off: nothing filtered (from the next cycle on)
    pve.cluster.firewall.options.put(enable=0)
    assert not _ask(admin, OUTSIDE, 611, port=80)["delivered"]
    _cycle(admin)
    d = _ask(admin, OUTSIDE, 611, port=80)
    assert d["delivered"] and d["reason"] == "datacenter firewall off (cluster.fw enable: 0): nothing is filtered"


# ---- what the chains let through ---------------------------------------------------------------------
def test_default_and_explicit_policies_and_the_nic_flag(pve, admin, fw_on):
    _vm(admin, 621, "203.0.113.62")
    _vm(admin, 622, "203.0.113.63", firewall=False)
    _guard(pve, 621)
    _guard(pve, 622)
    _cycle(admin)
    assert not _ask(admin, OUTSIDE, 621, port=443)["delivered"]  # policy_in DROP by default
    d = _ask(admin, OUTSIDE, 622, port=443)  # net0 without firewall=1: no tap chain
    assert d["delivered"] and d["reason"] == "VM 622 net0: firewall=0 on the NIC: not filtered"
    # guest to guest: the sender's OUT (policy_out ACCEPT by default), then the receiver's IN
    d = _ask(admin, "203.0.113.62", "203.0.113.63", port=80)
    assert d["delivered"] and d["src_vmid"] == 621 and d["dst_vmid"] == 622
    assert d["steps"][0] == "VM 621 net0 out: no rule matched; policy_out ACCEPT (the default: not set) decided"
    _guard(pve, 621, policy_in="ACCEPT", policy_out="REJECT")
    _cycle(admin)
    assert _ask(admin, OUTSIDE, 621, port=443)["delivered"]
    d = _ask(admin, 621, 622, port=80)
    assert not d["delivered"] and d["reason"] == "VM 621 net0 out: no rule matched; policy_out REJECT decided"
    # replies to what a guest opened pass (conntrack): the question is the first packet; the DHCP
    # exception (ruleset_create_vm_chain) passes a DHCP offer whatever the policy
    _guard(pve, 621, policy_in="DROP")
    _cycle(admin)
    d = _ask(admin, OUTSIDE, 621, proto="udp", port=68, sport=67)
    assert d["delivered"] and d["reason"] == "VM 621 net0 in: DHCP is always let through (dhcp: 1)"
    _guard(pve, 621, dhcp=0)
    _cycle(admin)
    assert not _ask(admin, OUTSIDE, 621, proto="udp", port=68, sport=67)["delivered"]


def test_rules_match_in_order_with_ports_protocols_and_addresses(pve, admin, fw_on):
    _vm(admin, 631, "203.0.113.71")
    _vm(admin, 632, "203.0.113.72")
    _guard(pve, 631)
    fw = pve.nodes("pve1").qemu(631).firewall
    fw.ipset.post(name="peers")
    fw.ipset("peers").post(cidr="198.51.100.0/24")
    fw.ipset("peers").post(cidr="198.51.100.66", nomatch=1)
    rules = fw.rules
    # posted bottom-up (each POST goes first)
    for r in [
        {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "8000:8100,9443", "enable": 1},
        {"type": "in", "action": "ACCEPT", "proto": "112", "source": "203.0.113.72", "enable": 1},
        {"type": "in", "action": "ACCEPT", "proto": "ah", "source": "203.0.113.72", "enable": 1},
        {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "5432", "source": "+peers", "enable": 1},
        {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "6443", "source": "10.0.0.1-10.0.0.9", "enable": 1},
        {"type": "in", "action": "ACCEPT", "proto": "udp", "dport": "53", "sport": "53", "enable": 1},
        {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "25", "enable": 0},  # disabled: skipped
        {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "26", "iface": "net1", "enable": 1},  # another NIC
        {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "27", "source": "2001:db8::/32",
         "enable": 1},  # v6 only
        {"type": "in", "action": "ACCEPT", "proto": "icmp", "enable": 1},
        {"type": "in", "action": "ACCEPT", "macro": "SSH", "enable": 1},
        {"type": "in", "action": "REJECT", "proto": "tcp", "dport": "8080", "enable": 1},  # before the range: decides
    ]:
        rules.post(**r)
    _cycle(admin)
    cases = [
        (OUTSIDE, "tcp", 8080, {}, False, "rule 0: IN REJECT -proto tcp -dport 8080 decided REJECT"),
        (OUTSIDE, "tcp", 8050, {}, True, "rule 11: IN ACCEPT -proto tcp -dport 8000:8100,9443 decided ACCEPT"),
        (OUTSIDE, "tcp", 9443, {}, True, None),
        (OUTSIDE, "tcp", 8200, {}, False, "policy_in DROP"),
        (OUTSIDE, "tcp", 22, {}, True, "rule 1: IN SSH(ACCEPT) decided ACCEPT"),
        (OUTSIDE, "icmp", None, {}, True, "rule 2: IN ACCEPT -proto icmp decided ACCEPT"),
        (OUTSIDE, "tcp", 25, {}, False, "policy_in DROP"),
        (OUTSIDE, "tcp", 26, {}, False, "policy_in DROP"),
        (OUTSIDE, "tcp", 27, {}, False, "policy_in DROP"),
        (OUTSIDE, "udp", 53, {"sport": 53}, True, "rule 6"),
        (OUTSIDE, "udp", 53, {}, False, "policy_in DROP"),  # a client's port is not 53
        ("10.0.0.5", "tcp", 6443, {}, True, "rule 7"),
        ("10.0.0.10", "tcp", 6443, {}, False, "policy_in DROP"),
        ("198.51.100.7", "tcp", 5432, {}, True, "rule 8"),
        ("198.51.100.66", "tcp", 5432, {}, False, "policy_in DROP"),  # nomatch in the set
        ("203.0.113.72", "vrrp", None, {}, True, "rule 10: IN ACCEPT -source 203.0.113.72 -proto 112"),
        ("203.0.113.72", "51", None, {}, True, "rule 9: IN ACCEPT -source 203.0.113.72 -proto ah"),
        (OUTSIDE, "112", None, {}, False, "policy_in DROP"),
    ]
    for src, proto, port, kw, ok, why in cases:
        d = _ask(admin, src, "203.0.113.71", proto=proto, port=port, **kw)
        assert d["delivered"] is ok, (src, proto, port, d)
        if why:
            assert why in d["reason"], (src, proto, port, d)
    # an ipset a rule names is gone: the daemon cannot compile that rule and leaves it out
    rules(8).put(source="+peers")
    fw.ipset("peers").delete(force=1)
    _cycle(admin)
    assert not _ask(admin, "198.51.100.7", 631, port=5432)["delivered"]


def test_the_ip_filter_drops_what_a_guest_sends_from_an_address_it_was_not_given(pve, admin, fw_on):
    _vm(admin, 641, "203.0.113.81")
    _vm(admin, 642, "203.0.113.82")
    admin("post", "/guests/641/addresses", json={"iface": "eth0", "address": "203.0.113.99/32"})
    _guard(pve, 641, ipfilter=1)
    fw = pve.nodes("pve1").qemu(641).firewall
    fw.ipset.post(name="ipfilter-net0")
    fw.ipset("ipfilter-net0").post(cidr="203.0.113.81")
    _cycle(admin)
    assert _ask(admin, "203.0.113.81", 642, port=80)["delivered"]
    d = _ask(admin, "203.0.113.99", 642, port=80)
    assert not d["delivered"] and d["src_vmid"] == 641
    assert d["reason"] == "VM 641 net0 out: the IP filter drops it: 203.0.113.99 is not in ipfilter-net0"


def test_the_question_itself(pve, admin, fw_on, wait):
    _vm(admin, 651, "203.0.113.91")
    _guard(pve, 651)
    _cycle(admin)
    # by vmid or by the address the guest holds; "outside" is any address no guest holds
    assert _ask(admin, OUTSIDE, 651, port=22) == _ask(admin, OUTSIDE, "203.0.113.91", port=22)
    d = _ask(admin, OUTSIDE, "203.0.113.200", port=22)
    assert d == {"delivered": False, "reason": "no running guest holds 203.0.113.200", "src_vmid": None,
                 "dst_vmid": None, "steps": [], "rejected": False}
    assert _ask(admin, OUTSIDE, 999)["reason"] == "no VM 999"
    assert wait(pve.nodes("pve1").qemu(651).status.stop.post())["exitstatus"] == "OK"
    assert _ask(admin, OUTSIDE, 651)["reason"] == "VM 651 is not running (or its guest is not up)"
    assert _ask(admin, OUTSIDE, "203.0.113.91")["reason"] == \
        "VM 651 has 203.0.113.91 configured but is not running (or its guest is not up)"
    for params in ({"src": OUTSIDE}, {"src": "x", "dst": "651"}, {"src": OUTSIDE, "dst": "651", "proto": "nope"},
                   {"src": OUTSIDE, "dst": "651", "port": "70000"}):
        with pytest.raises(requests.HTTPError) as e:
            admin("get", "/firewall/deliver", params=params)
        assert e.value.response.status_code == 400 and "bad question" in e.value.response.json()["error"]
    with pytest.raises(requests.HTTPError) as e:
        admin("post", "/firewall/clock", json={"advance": -1})
    assert e.value.response.status_code == 400


def test_the_firewall_clock_switches_between_real_and_manual(admin):
    before = admin("get", "/firewall/clock")
    assert admin("put", "/config", json={"firewall_clock": "real"})["firewall_clock"] == "real"
    try:
        now = admin("get", "/firewall/clock")
        assert not now["manual"] and now["now"] >= before["now"]  # it goes on from where it was
    finally:
        assert admin("put", "/config", json={"firewall_clock": "manual"})["firewall_clock"] == "manual"
    with pytest.raises(requests.HTTPError) as e:
        admin("put", "/config", json={"firewall_clock": "sundial"})
    assert e.value.response.status_code == 400


# ---- cluster IP sets (cluster.fw [IPSET]; API2/Firewall/IPSet.pm ClusterIPSetList / ClusterIPset) -------
def test_cluster_ip_sets_named_by_a_vm_rule_as_dc(pve, admin, fw_on):
    _vm(admin, 451, "203.0.113.51")
    _vm(admin, 452, "203.0.113.52")
    _vm(admin, 453, "203.0.113.53")
    sets = pve.cluster.firewall.ipset
    rules = pve.nodes("pve1").qemu(451).firewall.rules
    # a rule naming a cluster set that does not exist: refused as verify_rule's check_ipset_ref does
    e = err(lambda: rules.post(type="in", action="ACCEPT", proto="tcp", dport="5432", source="+dc/apps", enable=1))
    assert e.status_code == 400 and e.errors == {"source": "no such ipset 'apps'"}
    sets.post(name="apps", comment="the members of apps")
    e = err(lambda: sets.post(name="apps"))
    assert e.status_code == 400 and "IPSet 'apps' already exists" in str(e.errors)
    sets("apps").post(cidr="203.0.113.52/32")
    assert [x["cidr"] for x in sets("apps").get()] == ["203.0.113.52"]  # /32 dropped, as the parser does
    e = err(lambda: sets("apps").post(cidr="203.0.113.52"))
    assert e.status_code == 400 and "address '203.0.113.52' already exists" in str(e.errors)
    assert [s["name"] for s in sets.get()] == ["apps"]
    rules.post(type="in", action="ACCEPT", proto="tcp", dport="5432", source="+dc/apps", enable=1)
    _guard(pve, 451, policy_in="DROP")
    _cycle(admin)
    assert _ask(admin, 452, 451, "tcp", 5432)["delivered"]
    assert not _ask(admin, 453, 451, "tcp", 5432)["delivered"]
    # a set's entries change what the rule lets in from the next cycle on
    sets("apps").post(cidr="203.0.113.53")
    assert not _ask(admin, 453, 451, "tcp", 5432)["delivered"]
    _cycle(admin)
    assert _ask(admin, 453, 451, "tcp", 5432)["delivered"]
    sets("apps")("203.0.113.53").delete()
    e = err(lambda: sets("apps").delete())
    assert e.status_code == 500 and "IPSet 'apps' is not empty" in str(e.content)
    sets("apps").delete(force=1)
    _cycle(admin)
    # deleted while a rule names it: the rule fails to compile and is left out (policy decides)
    assert not _ask(admin, 452, 451, "tcp", 5432)["delivered"]
    e = err(lambda: sets("apps").get())
    assert e.status_code == 500 and "no such IPSet 'apps'" in str(e.content)


def test_cluster_ip_sets_need_sys_audit_and_sys_modify_on_root(sim, admin):
    tok = admin("post", "/tokens", json={"tokenid": "z9@pve!fw", "privsep": True,
                                         "user_acl": [{"path": "/", "privs": ["Sys.Audit"]}],
                                         "acl": [{"path": "/", "privs": ["Sys.Audit"]}]})
    from proxmoxer import ProxmoxAPI

    api = ProxmoxAPI("127.0.0.1", port=sim.port, user="z9@pve", token_name="fw", token_value=tok["value"],
                     verify_ssl=str(sim.cert_path), timeout=10)
    assert api.cluster.firewall.ipset.get() == []
    e = err(lambda: api.cluster.firewall.ipset.post(name="apps"))
    assert e.status_code == 403 and "Sys.Modify" in str(e.content)
