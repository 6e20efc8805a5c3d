"""Issue 8 §3: VM firewall options and IP sets, cluster firewall options, cloud-init pending/dump/regenerate
(through proxmoxer over HTTPS; texts from pve-firewall IPSet.pm/VM.pm and qemu-server Cloudinit.pm)."""

from __future__ import annotations

import hashlib

import pytest
from proxmoxer import ResourceException
from urllib.parse import quote

from .conftest import SSH_KEY


def clone(pve, wait, newid=101, name="web-1", node="pve1"):
    # template 9000 is on local-lvm: PVE refuses a clone with target= to another node ("VM uses
    # local storage"), so a VM on another node is cloned on pve1 and migrated (offline) there
    assert wait(pve.nodes("pve1").qemu(9000).clone.post(newid=newid, name=name, full=1))["exitstatus"] == "OK"
    if node != "pve1":
        assert wait(pve.nodes("pve1").qemu(newid).migrate.post(target=node))["exitstatus"] == "OK"


def err(call) -> ResourceException:
    with pytest.raises(ResourceException) as e:
        call()
    return e.value


# ---- firewall ------------------------------------------------------------------------------------
def test_vm_firewall_options_digest_and_delete(pve, wait):
    clone(pve, wait)
    fw = pve.nodes("pve1").qemu(101).firewall
    empty = fw.options.get()
    assert empty == {"digest": hashlib.sha1(b"").hexdigest()}
    fw.options.put(enable=1, ipfilter=1, policy_in="DROP")
    opts = fw.options.get()
    assert opts["enable"] == 1 and opts["ipfilter"] == 1 and opts["policy_in"] == "DROP"
    e = err(lambda: fw.options.put(ipfilter=0, digest=empty["digest"]))
    assert (e.status_code, e.content) == (500, "detected modified configuration - file changed by other user? Try again.")
    fw.options.put(ipfilter=0, digest=opts["digest"])
    e = err(lambda: fw.options.put(delete="bogus"))
    assert e.status_code == 400 and e.errors == {"delete": "no such option 'bogus'"}
    fw.options.put(delete="policy_in,ipfilter")
    assert set(fw.options.get()) == {"enable", "digest"}
    # schema: wrong type, enum, unknown parameter
    e = err(lambda: fw.options.put(enable="yes", policy_out="MAYBE", color="red"))
    assert e.status_code == 400 and set(e.errors) == {"enable", "policy_out", "color"}
    # unknown node fails; the file is keyed by vmid like /etc/pve/firewall/<vmid>.fw
    assert err(lambda: pve.nodes("pve9").qemu(101).firewall.options.get()).status_code == 500


def test_ipset_lifecycle_and_errors(pve, wait):
    clone(pve, wait)
    fw = pve.nodes("pve1").qemu(101).firewall
    assert fw.ipset.get() == []
    fw.ipset.post(name="ipfilter-net0", comment="z9")
    e = err(lambda: fw.ipset.post(name="ipfilter-net0"))
    assert e.status_code == 400 and e.errors == {"name": "IPSet 'ipfilter-net0' already exists"}
    e = err(lambda: fw.ipset.post(name="0bad"))
    assert e.status_code == 400 and "name" in e.errors
    e = err(lambda: fw.ipset.post(name="x" * 65))
    assert e.errors == {"name": "value may only be 64 characters long"}
    listed = fw.ipset.get()
    assert [(s["name"], s["comment"]) for s in listed] == [("ipfilter-net0", "z9")] and len(listed[0]["digest"]) == 40

    s = fw.ipset("ipfilter-net0")
    s.post(cidr="203.0.113.10")
    s.post(cidr="203.0.113.0/28", comment="block", nomatch=1)
    entries = s.get()
    assert [x["cidr"] for x in entries] == ["203.0.113.0/28", "203.0.113.10"]  # new entries go first
    assert entries[0]["nomatch"] == 1 and entries[0]["comment"] == "block"
    e = err(lambda: s.post(cidr="203.0.113.10"))
    assert e.status_code == 400 and e.errors == {"cidr": "address '203.0.113.10' already exists"}
    e = err(lambda: s.post(cidr="0.0.0.0/0"))
    assert e.status_code == 400 and e.errors == {"cidr": "a zero prefix is not allowed in ipset entries"}
    e = err(lambda: s.post(cidr="300.1.1.1"))
    assert e.status_code == 400 and e.errors == {
        "cidr": "invalid format - value does not look like a valid IP address or CIDR network\n"}
    e = err(lambda: s.post(cidr="10.0.0.5/24"))
    assert e.status_code == 400 and e.errors["cidr"].startswith("invalid format - Invalid prefix ")
    e = err(lambda: s.post(cidr="myalias"))
    assert (e.status_code, e.content) == (500, "no such alias 'myalias'")

    # read / update / delete one entry (the cidr's slash is part of the path, as in PVE)
    assert s("203.0.113.0/28").get()["comment"] == "block"
    e = err(lambda: s("198.51.100.1").get())
    assert e.status_code == 400 and e.errors == {"cidr": "no such IP/Network"}
    s("203.0.113.0/28").put(comment="changed")
    assert s("203.0.113.0/28").get() == {"cidr": "203.0.113.0/28", "comment": "changed",
                                         "digest": s.get()[0]["digest"]}
    e = err(lambda: s("203.0.113.0/28").delete(digest="0" * 40))
    assert e.content.startswith("detected modified configuration")
    e = err(lambda: fw.ipset("ipfilter-net0").delete())
    assert (e.status_code, e.content) == (500, "IPSet 'ipfilter-net0' is not empty")
    s("203.0.113.0/28").delete(digest=s.get()[0]["digest"])
    s("198.51.100.1").delete()  # a missing entry: PVE removes nothing and answers OK
    assert [x["cidr"] for x in s.get()] == ["203.0.113.10"]
    fw.ipset("ipfilter-net0").delete(force=1)
    assert fw.ipset.get() == []
    e = err(lambda: fw.ipset("ipfilter-net0").get())
    assert (e.status_code, e.content) == (500, "no such IPSet 'ipfilter-net0'")
    e = err(lambda: fw.ipset("nope").post(cidr="10.0.0.1"))
    assert e.content == "no such IPSet 'nope'"


def test_ipset_rename(pve, wait):
    clone(pve, wait)
    fw = pve.nodes("pve1").qemu(101).firewall
    fw.ipset.post(name="aa")
    fw.ipset.post(name="bb")
    e = err(lambda: fw.ipset.post(name="bb", rename="aa"))
    assert e.errors == {"name": "IPSet 'bb' does already exist"}
    e = err(lambda: fw.ipset.post(name="cc", rename="zz"))
    assert e.errors == {"name": "IPSet 'zz' does not exists"}
    fw.ipset.post(name="cc", rename="aa", comment="renamed")
    assert [(x["name"], x.get("comment")) for x in fw.ipset.get()] == [("bb", None), ("cc", "renamed")]


def test_firewall_travels_with_clone_and_goes_with_destroy(pve, wait, admin):
    fw9000 = pve.nodes("pve1").qemu(9000).firewall
    fw9000.options.put(enable=1)
    fw9000.ipset.post(name="ipfilter-net0")
    fw9000.ipset("ipfilter-net0").post(cidr="192.0.2.7")
    clone(pve, wait, 101, node="pve2")
    fw = pve.nodes("pve2").qemu(101).firewall
    assert [x["cidr"] for x in fw.ipset("ipfilter-net0").get()] == ["192.0.2.7"]  # the template's entry leaks
    assert fw.options.get()["enable"] == 1
    fw.ipset("ipfilter-net0")("192.0.2.7").delete()
    assert fw9000.ipset("ipfilter-net0").get()[0]["cidr"] == "192.0.2.7"  # a copy, not shared
    assert wait(pve.nodes("pve2").qemu(101).delete())["exitstatus"] == "OK"
    assert "101" not in admin("get", "/state")["firewall"]["vms"]
    clone(pve, wait, 101, node="pve2")  # a reused vmid starts from the template's file again
    assert [x["cidr"] for x in pve.nodes("pve2").qemu(101).firewall.ipset("ipfilter-net0").get()] == ["192.0.2.7"]


def test_cluster_firewall_options(pve):
    opts = pve.cluster.firewall.options.get()
    assert opts == {"digest": hashlib.sha1(b"").hexdigest()}
    pve.cluster.firewall.options.put(enable=1, policy_in="DROP", digest=opts["digest"])
    opts = pve.cluster.firewall.options.get()
    assert opts["enable"] == 1 and opts["policy_in"] == "DROP"
    e = err(lambda: pve.cluster.firewall.options.put(policy_forward="REJECT"))
    assert e.status_code == 400 and "policy_forward" in e.errors
    e = err(lambda: pve.cluster.firewall.options.put(enable=0, digest=hashlib.sha1(b"").hexdigest()))
    assert e.content.startswith("detected modified configuration")


# ---- cloud-init ----------------------------------------------------------------------------------
def test_sshkeys_that_ssh_keygen_cannot_read_are_refused(pve, wait):
    """PVE::Tools::validate_ssh_public_keys (create_vm, update_vm): every non-blank line must be read by
    ``ssh-keygen -l -f``, else ``SSH public key validation error`` — PUT, POST and create alike. A
    comment holding YAML syntax is a key ssh-keygen reads: PVE takes it (and writes it unquoted)."""
    clone(pve, wait, 101, name="web-1")
    vm = pve.nodes("pve1").qemu(101)
    bad = quote("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDa8 alice@example\n", safe="")
    for call in (lambda: vm.config.put(sshkeys=bad), lambda: vm.config.post(sshkeys=bad),
                 lambda: pve.nodes("pve1").qemu.post(vmid=150, name="x", sshkeys=bad),
                 lambda: vm.config.put(sshkeys=quote(SSH_KEY + "\nssh-rsa AAAAB3Nza x\n", safe=""))):
        e = err(call)
        assert (e.status_code, e.content) == (500, "SSH public key validation error")
    assert "sshkeys" not in vm.config.get() and 150 not in [v["vmid"] for v in pve.cluster.resources.get(type="vm")]
    vm.config.put(sshkeys=quote(SSH_KEY + " a: b: c\n\n", safe=""))
    assert f"  - {SSH_KEY} a: b: c\n" in vm.cloudinit.dump.get(type="user")


def test_cloudinit_dump_matches_pve_generator(pve, wait):
    clone(pve, wait, 101, name="web-1")
    vm = pve.nodes("pve1").qemu(101)
    vm.config.put(ipconfig0="ip=203.0.113.10/24,gw=203.0.113.1", nameserver="1.1.1.1 9.9.9.9",
                  searchdomain="example.net", ciuser="debian", sshkeys=quote(SSH_KEY + "\n", safe=""))
    mac = vm.config.get()["net0"].split(",")[0].split("=")[1].lower()
    user = vm.cloudinit.dump.get(type="user")
    assert user == ("#cloud-config\nhostname: web-1\nmanage_etc_hosts: true\nfqdn: web-1.example.net\n"
                    f"user: debian\nssh_authorized_keys:\n  - {SSH_KEY}\n"
                    "chpasswd:\n  expire: False\nusers:\n  - default\npackage_upgrade: true\n")
    net = vm.cloudinit.dump.get(type="network")
    assert net == ("version: 1\nconfig:\n    - type: physical\n      name: eth0\n"
                   f"      mac_address: '{mac}'\n      subnets:\n      - type: static\n"
                   "        address: '203.0.113.10'\n        netmask: '255.255.255.0'\n"
                   "        gateway: '203.0.113.1'\n    - type: nameserver\n      address:\n"
                   "      - '1.1.1.1'\n      - '9.9.9.9'\n      search:\n      - 'example.net'\n")
    meta = vm.cloudinit.dump.get(type="meta")
    assert meta == f"instance-id: {hashlib.sha1((user + net).encode()).hexdigest()}\n"
    e = err(lambda: vm.cloudinit.dump.get(type="vendor"))
    assert e.status_code == 400 and "type" in e.errors
    e = err(lambda: vm.cloudinit.dump.get())
    assert e.errors == {"type": "property is missing and it is not optional"}


def test_cloudinit_pending_until_regenerated(pve, wait, admin):
    clone(pve, wait, 101)
    vm = pve.nodes("pve1").qemu(101)
    assert vm.cloudinit.get() == []  # the template has no cloud-init keys
    vm.config.put(ipconfig0="ip=203.0.113.10/24,gw=203.0.113.1", ciuser="debian", cipassword="secret")
    pending = {r["key"]: r for r in vm.cloudinit.get()}
    assert pending["ipconfig0"] == {"key": "ipconfig0", "pending": "ip=203.0.113.10/24,gw=203.0.113.1"}
    assert pending["cipassword"] == {"key": "cipassword", "pending": "**********"}
    vm.cloudinit.put()  # regenerate: nothing pending any more
    rows = {r["key"]: r for r in vm.cloudinit.get()}
    assert rows["ipconfig0"] == {"key": "ipconfig0", "value": "ip=203.0.113.10/24,gw=203.0.113.1"}
    vm.config.put(ipconfig0="ip=203.0.113.11/24,gw=203.0.113.1", delete="ciuser")
    rows = {r["key"]: r for r in vm.cloudinit.get()}
    assert rows["ipconfig0"] == {"key": "ipconfig0", "value": "ip=203.0.113.10/24,gw=203.0.113.1",
                                 "pending": "ip=203.0.113.11/24,gw=203.0.113.1"}
    assert rows["ciuser"] == {"key": "ciuser", "delete": 1}
    # a start regenerates the drive too
    assert wait(vm.status.start.post())["exitstatus"] == "OK"
    assert all("pending" not in r and "delete" not in r for r in vm.cloudinit.get())
    # PUT cloudinit takes the flock and checks the lock
    admin("post", "/vms", json={"vmid": 130, "node": "pve1", "config": {"name": "x", "lock": "backup"}})
    e = err(lambda: pve.nodes("pve1").qemu(130).cloudinit.put())
    assert (e.status_code, e.content) == (500, "VM is locked (backup)")
    e = err(lambda: pve.nodes("pve1").qemu(4242).cloudinit.get())
    assert e.content == "Configuration file 'nodes/pve1/qemu-server/4242.conf' does not exist"


def test_foreign_vm_out_of_band_with_an_address(pve, admin):
    """Issue 8 test 7's foreign VM: untagged, put in place out of band with ipconfig0 (real PVE state)."""
    admin("post", "/vms", json={"vmid": 555, "node": "pve3", "running": True, "config": {
        "name": "someone-else", "net0": "virtio=BC:24:11:55:55:55,bridge=vmbr0",
        "ide2": "local-lvm:vm-555-cloudinit,media=cdrom", "agent": "1",
        "ipconfig0": "ip=203.0.113.10/24,gw=203.0.113.1"}})
    vm = pve.nodes("pve3").qemu(555)
    assert "tags" not in vm.config.get() and vm.config.get()["ipconfig0"].startswith("ip=203.0.113.10/24")
    assert vm.cloudinit.get() == [{"key": "ipconfig0", "value": "ip=203.0.113.10/24,gw=203.0.113.1"}]
    assert "address: '203.0.113.10'" in vm.cloudinit.dump.get(type="network")
    vm.firewall.ipset.post(name="ipfilter-net0")
    vm.firewall.ipset("ipfilter-net0").post(cidr="203.0.113.10")
    assert admin("get", "/state")["firewall"]["vms"]["555"]["ipsets"] == {"ipfilter-net0": [{"cidr": "203.0.113.10"}]}


def test_ipconfig_format_is_validated(pve, wait):
    """pve-qm-ipconfig: CIDR with a prefix of 8..32, gateways are addresses, keys are ip/gw/ip6/gw6."""
    clone(pve, wait, 101)
    vm = pve.nodes("pve1").qemu(101)
    for value, msg in [
        ("ip=203.0.113.10", "format error\nipconfig0.ip: invalid format - value does not look like a valid ipv4 "
                            "network configuration\n"),
        ("ip=203.0.113.10/24,gw=203.0.113.300", "format error\nipconfig0.gw: invalid format - value does not look "
                                                "like a valid IPv4 address\n"),
        ("203.0.113.10/24", "value without key, but schema does not define a default key\n"),
    ]:
        e = err(lambda: vm.config.put(ipconfig0=value))
        assert e.status_code == 400 and e.errors == {"ipconfig0": "invalid format - " + msg}
    vm.config.put(ipconfig0="ip=203.0.113.10/24,gw=203.0.113.1,ip6=auto", ipconfig1="ip=dhcp")
    assert vm.config.get()["ipconfig0"] == "ip=203.0.113.10/24,gw=203.0.113.1,ip6=auto"
