"""Issue 9: storage uploads, the QEMU guest agent and a guest that boots from what was sent — through
proxmoxer over HTTPS, as z9 calls the simulator. The ISOs are built with z9's own NoCloud builder."""

from __future__ import annotations

import base64
import hashlib
import json
import time

import pytest
import requests
import yaml
from proxmoxer import ResourceException

from z9.common.nocloud import build_nocloud_iso, read_nocloud_iso
from z9.sim.guest import ExecResult, command

from tests.support import poll_sync

from .conftest import GUEST_BOOT_S

USER_DATA = """#cloud-config
hostname: web-1
write_files:
  - path: /etc/z9/hello.txt
    content: hello from z9
  - path: /etc/z9/blob.bin
    encoding: b64
    content: AAEC/w==
runcmd:
  - [sh, -c, "echo ran > /dev/null"]
"""


def err(call) -> ResourceException:
    with pytest.raises(ResourceException) as e:
        call()
    return e.value


def clone(pve, wait, newid=101, name="web-1", node="pve1", template=9000):
    # template 9000 is on local-lvm: PVE refuses a clone with target= to another node ("VM uses
    # local storage"), so a VM on another node is cloned on pve1 and migrated (offline) there
    assert wait(pve.nodes("pve1").qemu(template).clone.post(newid=newid, name=name, full=1))["exitstatus"] == "OK"
    if node != "pve1":
        assert wait(pve.nodes("pve1").qemu(newid).migrate.post(target=node))["exitstatus"] == "OK"


def upload(pve, tmp_path, iso: bytes, name="seed-101.iso", node="pve1", storage="local", **kw) -> str:
    path = tmp_path / name
    path.write_bytes(iso)
    with open(path, "rb") as f:
        return pve.nodes(node).storage(storage).upload.post(content="iso", filename=f, **kw)


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def until(fn, timeout=10.0, every=0.05):
    """Poll fn() until it returns a truthy value (a ResourceException counts as not yet), or raise
    after timeout naming the last answer."""
    last: list = [None]

    def answer():
        try:
            last[0] = fn()
        except ResourceException as e:
            last[0] = e
            return None
        return last[0]
    try:
        return poll_sync(answer, timeout, "an answer", interval_s=every)
    except AssertionError:
        raise AssertionError(f"timed out; last: {last[0]!r}") from None


def agent_exec(vm, argv, timeout=10.0, **kw) -> dict:
    pid = vm.agent.exec.post(command=argv, **kw)["pid"]
    return until(lambda: (lambda st: st if st["exited"] else None)(vm.agent("exec-status").get(pid=pid)), timeout)


def ci_status(vm) -> dict:
    return json.loads(agent_exec(vm, ["cloud-init", "status", "--format", "json"])["out-data"])


# ---- the NoCloud builder -------------------------------------------------------------------------
def test_nocloud_iso_is_deterministic_and_readable():
    a = build_nocloud_iso(USER_DATA, "instance-id: srv-1\n", "version: 2\n")
    time.sleep(1.05)
    assert build_nocloud_iso(USER_DATA, "instance-id: srv-1\n", "version: 2\n") == a
    assert build_nocloud_iso(USER_DATA, "instance-id: srv-2\n", "version: 2\n") != a
    label, files = read_nocloud_iso(a)
    assert label == "cidata" and files == {"user-data": USER_DATA.encode(), "meta-data": b"instance-id: srv-1\n",
                                           "network-config": b"version: 2\n"}
    assert "network-config" not in read_nocloud_iso(build_nocloud_iso("#cloud-config\n", "instance-id: x\n"))[1]


# ---- test 1: upload --------------------------------------------------------------------------------
def test_upload_with_checksum_listed_and_wrong_checksum(pve, wait, tmp_path, admin):
    iso = build_nocloud_iso(USER_DATA, "instance-id: srv-1\n")
    upid = upload(pve, tmp_path, iso, checksum=sha256(iso), **{"checksum-algorithm": "sha256"})
    assert upid.split(":")[5] == "imgcopy" and upid.split(":")[1] == "pve1"
    st = wait(upid)
    assert st["exitstatus"] == "OK"
    log = [line["t"] for line in pve.nodes("pve1").tasks(upid).log.get()]
    assert "calculating checksum...OK, checksum verified" in log and log[-1] == "TASK OK"
    assert "target file: /var/lib/vz/template/iso/seed-101.iso" in log
    content = pve.nodes("pve1").storage("local").content.get(content="iso")
    assert [(c["volid"], c["size"], c["format"]) for c in content] == [("local:iso/seed-101.iso", len(iso), "iso")]
    assert pve.nodes("pve2").storage("local").content.get(content="iso") == []  # node-local
    # a wrong checksum fails the task with PVE's text and writes nothing
    other = build_nocloud_iso(USER_DATA, "instance-id: srv-2\n")
    st = wait(upload(pve, tmp_path, other, name="seed-102.iso", checksum="0" * 64, **{"checksum-algorithm": "sha256"}))
    assert st["exitstatus"] == f"checksum mismatch: got '{sha256(other)}' != expect '{'0' * 64}'"
    assert [c["volid"] for c in pve.nodes("pve1").storage("local").content.get()] == ["local:iso/seed-101.iso"]
    # an existing file is overwritten
    assert wait(upload(pve, tmp_path, other))["exitstatus"] == "OK"
    assert pve.nodes("pve1").storage("local").content.get()[0]["size"] == len(other)
    assert admin("get", "/state")["storage"]["local@pve1"][0]["sha256"] == sha256(other)


def test_upload_refusals(pve, wait, tmp_path):
    iso = build_nocloud_iso(USER_DATA, "instance-id: x\n")
    e = err(lambda: upload(pve, tmp_path, iso, name="seed.txt"))
    assert e.status_code == 400 and e.errors == {"filename": "wrong file extension"}
    e = err(lambda: upload(pve, tmp_path, iso, storage="local-lvm"))
    assert (e.status_code, e.content) == (500, "can't upload to storage type 'lvmthin'")
    e = err(lambda: upload(pve, tmp_path, iso, storage="nope"))
    assert (e.status_code, e.content) == (500, "storage 'nope' does not exist")
    e = err(lambda: upload(pve, tmp_path, iso, checksum="abc"))
    assert e.status_code == 400 and e.errors == {"checksum-algorithm": "missing property - 'checksum' requires this property"}
    e = err(lambda: upload(pve, tmp_path, iso, **{"checksum-algorithm": "crc32", "checksum": "1"}))
    assert e.status_code == 400 and "checksum-algorithm" in e.errors
    path = tmp_path / "x.iso"
    path.write_bytes(iso)
    with open(path, "rb") as f:
        e = err(lambda: pve.nodes("pve1").storage("local").upload.post(content="images", filename=f))
    assert e.status_code == 400 and "content" in e.errors
    # the name is normalised
    assert wait(upload(pve, tmp_path, iso, name="my seed (1).iso"))["exitstatus"] == "OK"
    assert pve.nodes("pve1").storage("local").content.get()[0]["volid"] == "local:iso/my_seed__1_.iso"


def test_upload_through_another_nodes_api(pve, pve_at, wait, tmp_path, admin):
    """pve-storage 9: upload has no proxyto, the worker runs on the node that received the file and
    scp's it to the named node: the UPID names the receiving node (community.proxmox#222)."""
    iso = build_nocloud_iso(USER_DATA, "instance-id: x\n")
    upid = upload(pve, tmp_path, iso, node="pve2")  # received by pve1, names pve2
    assert upid.split(":")[1] == "pve1"
    e = err(lambda: pve.nodes("pve2").tasks(upid).status.get())
    assert e.status_code == 400 and e.errors == {"upid": "no such task"}
    assert wait(upid)["exitstatus"] == "OK"
    log = [line["t"] for line in pve.nodes("pve1").tasks(upid).log.get()]
    assert "target node: pve2" in log and any(t.startswith("command: /usr/bin/scp ") for t in log)
    assert [c["volid"] for c in pve.nodes("pve2").storage("local").content.get()] == ["local:iso/seed-101.iso"]
    assert pve.nodes("pve1").storage("local").content.get() == []
    # through pve2's own API: a task of pve2, a plain cp
    upid = upload(pve_at("pve2"), tmp_path, iso, name="seed-b.iso", node="pve2")
    assert upid.split(":")[1] == "pve2" and wait(upid)["exitstatus"] == "OK"
    # a shared storage is seen by every node
    assert wait(upload(pve, tmp_path, iso, storage="isos"))["exitstatus"] == "OK"
    assert [c["volid"] for c in pve.nodes("pve3").storage("isos").content.get()] == ["isos:iso/seed-101.iso"]
    # a VM on pve3 cannot start from pve2's local ISO; from the shared one it can
    clone(pve, wait, 101, node="pve3")
    pve.nodes("pve3").qemu(101).config.put(ide0="local:iso/seed-101.iso,media=cdrom")
    st = wait(pve.nodes("pve3").qemu(101).status.start.post())
    assert st["exitstatus"] == "volume 'local:iso/seed-101.iso' does not exist"
    pve.nodes("pve3").qemu(101).config.put(ide0="isos:iso/seed-101.iso,media=cdrom")
    assert wait(pve.nodes("pve3").qemu(101).status.start.post())["exitstatus"] == "OK"
    # the failure CAPMOX#112 reported on PVE 8.1, as a fault
    from z9.sim.storage import capmox_112_exitstatus

    admin("post", "/faults", json={"path": "/upload$", "action": "fail_task", "exitstatus": capmox_112_exitstatus()})
    st = wait(upload(pve, tmp_path, iso, name="seed-c.iso", node="pve3"))
    assert st["exitstatus"].startswith('import failed: /usr/bin/scp: stat local "/var/tmp/pveupload-')
    assert pve.nodes("pve3").storage("local").content.get() == []


def test_storage_list_and_delete(pve, wait, tmp_path):
    stores = {s["storage"]: s for s in pve.nodes("pve1").storage.get()}
    assert set(stores) == {"local", "local-lvm", "isos", "ceph-vm"} and stores["isos"]["shared"] == 1
    assert [s["storage"] for s in pve.nodes("pve1").storage.get(content="iso")] == ["local", "isos"]
    assert [s["storage"] for s in pve.nodes("pve1").storage.get(target="pve2")] == ["isos", "ceph-vm"]
    iso = build_nocloud_iso(USER_DATA, "instance-id: x\n")
    wait(upload(pve, tmp_path, iso))
    clone(pve, wait, 101)
    images = pve.nodes("pve1").storage("local-lvm").content.get(vmid=101)
    assert {i["volid"] for i in images} == {"local-lvm:vm-101-disk-0", "local-lvm:vm-101-cloudinit"}
    upid = pve.nodes("pve1").storage("local").content("iso/seed-101.iso").delete()
    assert upid.split(":")[5:7] == ["imgdel", "local"] and wait(upid)["exitstatus"] == "OK"
    assert pve.nodes("pve1").storage("local").content.get() == []
    upid = pve.nodes("pve1").storage("local").content("local:iso/seed-101.iso").delete()
    assert wait(upid)["exitstatus"] == "WARNINGS: 1"  # a missing file: Plugin::free_image only warns
    log = [line["t"] for line in pve.nodes("pve1").tasks(upid).log.get()]
    assert "WARN: disk image '/var/lib/vz/template/iso/seed-101.iso' does not exist" in log
    wait(upload(pve, tmp_path, iso))
    assert pve.nodes("pve1").storage("local").content("local:iso/seed-101.iso").delete(delay=5) is None
    assert pve.nodes("pve1").storage("local").content.get() == []
    e = err(lambda: pve.nodes("pve1").storage("local").content("isos:iso/seed-101.iso").delete())
    assert e.status_code == 400 and e.errors == {"volume": "storage ID mismatch (isos != local)\n"}
    e = err(lambda: pve.nodes("pve1").storage("local").content("iso/x.iso").delete(delay=31))
    assert e.status_code == 400 and e.errors == {"delay": "value must have a maximum value of 30"}


def test_upload_faults_corrupt_and_abort(pve, wait, tmp_path, admin):
    iso = build_nocloud_iso(USER_DATA, "instance-id: x\n")
    admin("post", "/faults", json={"path": "/upload$", "action": "corrupt"})
    st = wait(upload(pve, tmp_path, iso, checksum=sha256(iso), **{"checksum-algorithm": "sha256"}))
    assert st["exitstatus"].startswith("checksum mismatch: got '") and sha256(iso) in st["exitstatus"]
    admin("post", "/faults", json={"path": "/upload$", "action": "abort"})
    with pytest.raises(requests.exceptions.ConnectionError):
        upload(pve, tmp_path, iso)
    assert pve.nodes("pve1").storage("local").content.get() == []
    assert not [t for t in admin("get", "/state")["tasks"] if t["type"] == "imgcopy" and t["exitstatus"] == "OK"]


# ---- test 2: a VM that boots from the uploaded ISO -----------------------------------------------
def boot_with_iso(pve, wait, tmp_path, iso: bytes, vmid=101):
    """The ISO on ide3 (/dev/sr1, after PVE's drive on ide2, /dev/sr0): the seed NoCloud takes."""
    assert wait(upload(pve, tmp_path, iso, name=f"seed-{vmid}.iso"))["exitstatus"] == "OK"
    clone(pve, wait, vmid)
    vm = pve.nodes("pve1").qemu(vmid)
    vm.config.put(ide3=f"local:iso/seed-{vmid}.iso,media=cdrom")
    assert wait(vm.status.start.post())["exitstatus"] == "OK"
    return vm


@pytest.fixture
def slow_boot(admin):
    """A boot delay long enough to observe the agent before it answers, even on a loaded machine."""
    # (PVE's agent ping waits 3 s for a booting guest's agent: shorter here, so that the boot outlasts it)
    admin("put", "/config", json={"guest_boot_s": 2.0, "agent_timeout_s": 0.5})
    yield 2.0
    admin("put", "/config", json={"guest_boot_s": GUEST_BOOT_S, "agent_timeout_s": 3.0})


def test_vm_boots_from_the_uploaded_iso(pve, wait, tmp_path, admin, slow_boot):
    iso = build_nocloud_iso(USER_DATA, "instance-id: srv-1\nlocal-hostname: web-1\n")
    vm = boot_with_iso(pve, wait, tmp_path, iso)
    started = time.monotonic()
    e = err(lambda: vm.agent.ping.post())
    assert (e.status_code, e.content) == (500, "QEMU guest agent is not running")
    until(lambda: vm.agent.ping.post() == {"result": {}})
    assert time.monotonic() - started >= slow_boot - 0.5  # the boot delay
    assert vm.agent("get-osinfo").get()["result"]["id"] == "debian"
    first = ci_status(vm)
    assert first["status"] in ("running", "done") and first["datasource"] == "nocloud"
    until(lambda: ci_status(vm)["status"] == "done")
    assert vm.agent("file-read").get(file="/etc/z9/hello.txt") == {"content": "hello from z9"}
    assert vm.agent("file-read").get(file="/etc/z9/blob.bin", decode=0)["content"] == "AAEC/w=="
    assert vm.agent("file-read").get(file="/etc/z9/hello.txt", offset=6, count=4) == {"content": "from",
                                                                                      "truncated": 1}
    out = agent_exec(vm, ["cloud-init", "status"])
    assert out == {"exited": 1, "exitcode": 0, "out-data": "status: done\n"}
    assert agent_exec(vm, ["hostname"])["out-data"] == "web-1\n"
    guest = admin("get", "/guests/101")
    assert guest["instance_id"] == "srv-1" and guest["host_key"].startswith("SHA256:")
    assert "ide3:local:iso/seed-101.iso" == guest["inputs"]["source"]
    fp = agent_exec(vm, ["ssh-keygen", "-lf", "/etc/ssh/ssh_host_ed25519_key.pub"])["out-data"]
    assert guest["host_key"] in fp
    # no network-config in the ISO: DHCP on the first NIC
    eth0 = [i for i in vm.agent("network-get-interfaces").get()["result"] if i["name"] == "eth0"][0]
    assert eth0["hardware-address"] == vm.config.get()["net0"].split(",")[0].split("=")[1].lower()
    assert eth0["ip-addresses"][0]["ip-address"].startswith("10.")


def test_iso_after_pve_drive_wins_and_fixed_instance_id_keeps_network(pve, wait, tmp_path, admin):
    """The ISO on ide3 (/dev/sr1) wins over PVE's drive on ide2 (/dev/sr0): NoCloud sorts the devices in
    reverse; with a fixed instance-id a new network-config is not applied (NoCloud semantics), a new
    instance-id is a new instance."""
    net = "version: 2\nethernets:\n  nic0:\n    match:\n      macaddress: '{mac}'\n    set-name: eth0\n" \
          "    addresses: ['{ip}']\n"
    clone(pve, wait, 101)
    vm = pve.nodes("pve1").qemu(101)
    mac = vm.config.get()["net0"].split(",")[0].split("=")[1]
    vm.config.put(ipconfig0="ip=198.51.100.9/24")  # PVE's drive: ignored, the ISO wins
    wait(upload(pve, tmp_path, build_nocloud_iso("#cloud-config\n", "instance-id: fixed\n",
                                                 net.format(mac=mac.lower(), ip="203.0.113.10/24"))))
    vm.config.put(ide3="local:iso/seed-101.iso,media=cdrom")
    wait(vm.status.start.post())
    until(lambda: vm.agent.ping.post())
    def addrs():
        return {a["ip-address"] for i in vm.agent("network-get-interfaces").get()["result"] for a in i["ip-addresses"]}

    assert "203.0.113.10" in addrs() and "198.51.100.9" not in addrs()
    key = admin("get", "/guests/101")["host_key"]
    wait(upload(pve, tmp_path, build_nocloud_iso("#cloud-config\n", "instance-id: fixed\n",
                                                 net.format(mac=mac, ip="203.0.113.11/24"))))
    wait(vm.status.reboot.post())
    until(lambda: vm.agent.ping.post())
    assert "203.0.113.10" in addrs() and "203.0.113.11" not in addrs()  # same instance: not applied
    assert admin("get", "/guests/101")["host_key"] == key
    wait(upload(pve, tmp_path, build_nocloud_iso("#cloud-config\n", "instance-id: second\n",
                                                 net.format(mac=mac, ip="203.0.113.11/24"))))
    wait(vm.status.reboot.post())
    until(lambda: vm.agent.ping.post())
    assert "203.0.113.11" in addrs() and "203.0.113.10" not in addrs()
    assert admin("get", "/guests/101")["host_key"] != key


# ---- test 3: ipconfig0 on a running VM --------------------------------------------------------------
def test_ipconfig_change_reaches_the_guest_only_at_reboot(pve, wait, admin):
    clone(pve, wait, 101)
    vm = pve.nodes("pve1").qemu(101)
    vm.config.put(ipconfig0="ip=203.0.113.10/24,gw=203.0.113.1", ciuser="debian")
    wait(vm.status.start.post())
    until(lambda: ci_status(vm)["status"] == "done")

    def addrs():
        return {a["ip-address"] for i in vm.agent("network-get-interfaces").get()["result"] if i["name"] == "eth0"
                for a in i["ip-addresses"]}

    assert "203.0.113.10" in addrs()
    key = admin("get", "/guests/101")["host_key"]
    vm.config.put(ipconfig0="ip=203.0.113.20/24,gw=203.0.113.1")
    vm.cloudinit.put()  # even a regenerated drive is read only at the next boot
    time.sleep(0.5)
    assert "203.0.113.10" in addrs() and "203.0.113.20" not in addrs()
    assert admin("get", "/guests/101")["host_key"] == key
    wait(vm.status.reboot.post())
    until(lambda: "203.0.113.20" in addrs())
    assert "203.0.113.10" not in addrs()
    assert admin("get", "/guests/101")["host_key"] != key
    assert admin("get", "/guests/101")["boots"] == 2


# ---- the agent's errors and limits -----------------------------------------------------------------
def test_agent_errors(pve, wait, admin):
    clone(pve, wait, 101)
    vm = pve.nodes("pve1").qemu(101)
    e = err(lambda: vm.agent.ping.post())
    assert (e.status_code, e.content) == (500, "VM 101 is not running")
    vm.config.put(delete="agent")
    e = err(lambda: vm.agent("network-get-interfaces").get())
    assert (e.status_code, e.content) == (500, "No QEMU guest agent configured")
    vm.config.put(agent="0")  # agent off: the key exists, the guest-ping fails (Agent.pm)
    assert err(lambda: vm.agent.ping.post()).content == "VM 101 is not running"
    wait(vm.status.start.post())
    time.sleep(0.6)
    assert err(lambda: vm.agent.ping.post()).content == "QEMU guest agent is not running"
    vm.config.put(agent="enabled=1,fstrim_cloned_disks=1")  # enabled after start: no virtio port yet
    assert err(lambda: vm.agent.ping.post()).content == "QEMU guest agent is not running"
    wait(vm.status.stop.post())
    wait(vm.status.start.post())
    until(lambda: vm.agent.ping.post())
    e = err(lambda: pve.nodes("pve1").qemu(4242).agent.ping.post())
    assert e.content == "Configuration file 'nodes/pve1/qemu-server/4242.conf' does not exist"
    e = err(lambda: vm.agent("file-read").get(file="/nope"))
    assert e.content == ("VM 101 qmp command 'guest-file-open' failed - failed to open file '/nope' (mode: 'r'): "
                         "No such file or directory")


def test_exec_file_write_limits_and_unknown_command(pve, wait, admin, sim):
    admin("post", "/vms", json={"vmid": 150, "node": "pve2", "running": True, "config": {
        "name": "box", "agent": "1", "net0": "virtio=BC:24:11:15:00:00,bridge=vmbr0"}})
    vm = pve.nodes("pve2").qemu(150)
    # qemu-ga spawns the program itself (no shell): one the guest lacks is guest-exec's error, no pid
    e = err(lambda: vm.agent.exec.post(command=["/usr/bin/frobnicate", "--now"]))
    # (glib's message quotes the name with “”: UTF-8 in the HTTP status line, which clients read as latin-1)
    assert (e.status_code, e.content.encode("latin-1").decode("utf-8")) == (
        500, "VM 150 qmp command 'guest-exec' failed - Guest agent command failed, error was 'Failed to execute "
             "child process “/usr/bin/frobnicate” (No such file or directory)'")
    # one string with spaces is one file name (a raw request: proxmoxer would split it)
    r = requests.post(f"{sim.url}/api2/json/nodes/pve2/qemu/150/agent/exec", verify=False, timeout=10,
                      headers=sim.auth_header, data={"command": "echo two words"})
    assert r.status_code == 500 and "Failed to execute child process “echo two words”" in \
        r.reason.encode("latin-1").decode("utf-8"), r.reason
    # through a shell, the shell's own answer
    r = agent_exec(vm, ["sh", "-c", "/usr/bin/frobnicate --now"])
    assert r == {"exited": 1, "exitcode": 127, "err-data": "/bin/sh: 1: /usr/bin/frobnicate: not found\n"}
    pid = vm.agent.exec.post(command=["true"])["pid"]
    assert vm.agent("exec-status").get(pid=pid)["exitcode"] == 0
    e = err(lambda: vm.agent("exec-status").get(pid=pid))  # reported once, then forgotten (qemu-ga)
    assert e.content == "VM 150 qmp command 'guest-exec-status' failed - Invalid parameter 'pid'"
    assert agent_exec(vm, "echo two words")["out-data"] == "two words\n"  # proxmoxer splits a string on spaces
    r = agent_exec(vm, ["sh", "-c", "test -f /tmp/a && echo yes || echo no; cat /tmp/a"])
    assert r["exitcode"] == 1 and r["out-data"] == "no\n" and "No such file" in r["err-data"]
    vm.agent("file-write").post(file="/tmp/a", content="line\n")
    assert agent_exec(vm, ["sh", "-c", "test -f /tmp/a && cat /tmp/a"])["out-data"] == "line\n"
    assert agent_exec(vm, ["cat"], **{"input-data": "piped"})["out-data"] == "piped"
    vm.agent("file-write").post(file="/tmp/b", content=base64.b64encode(b"\x00\x01").decode(), encode=0)
    assert vm.agent("file-read").get(file="/tmp/b", decode=0)["content"] == "AAE="
    vm.agent("file-write").post(file="/tmp/max", content="x" * 61440)
    e = err(lambda: vm.agent("file-write").post(file="/tmp/big", content="x" * 61441))
    assert e.status_code == 400 and e.errors == {"content": "value may only be 61440 characters long"}
    # a body over 512 KiB: 501 before anything else
    r = requests.post(f"{sim.url}/api2/json/nodes/pve2/qemu/150/agent/exec", verify=False, timeout=10,
                      headers=sim.auth_header, data={"command": "cat", "input-data": "y" * (600 * 1024)})
    assert (r.status_code, r.reason) == (501, "for data too large")
    # files persist across a reboot; the agent's processes do not
    pid = vm.agent.exec.post(command=["true"])["pid"]
    wait(vm.status.reboot.post())
    until(lambda: vm.agent.ping.post())
    assert vm.agent("file-read").get(file="/tmp/a")["content"] == "line\n"
    assert err(lambda: vm.agent("exec-status").get(pid=pid)).content.endswith("Invalid parameter 'pid'")


def test_address_configured_inside_the_guest(pve, wait, admin):
    admin("post", "/vms", json={"vmid": 555, "node": "pve3", "running": True, "config": {
        "name": "foreign", "agent": "1", "net0": "virtio=BC:24:11:55:55:55,bridge=vmbr0",
        "ide2": "local-lvm:vm-555-cloudinit,media=cdrom", "ipconfig0": "ip=203.0.113.10/24,gw=203.0.113.1"}})
    vm = pve.nodes("pve3").qemu(555)

    def eth0():
        return [(a["ip-address"], a["prefix"]) for i in vm.agent("network-get-interfaces").get()["result"]
                if i["name"] == "eth0" for a in i["ip-addresses"] if a["ip-address-type"] == "ipv4"]

    assert eth0() == [("203.0.113.10", 24)]  # booted from its PVE drive
    admin("post", "/guests/555/addresses", json={"iface": "eth0", "address": "203.0.113.77/32"})
    assert eth0() == [("203.0.113.10", 24), ("203.0.113.77", 32)]
    assert agent_exec(vm, ["ip", "addr", "add", "203.0.113.78/32", "dev", "eth0"])["exitcode"] == 0
    r = agent_exec(vm, ["ip", "addr", "add", "203.0.113.78/32", "dev", "eth0"])
    assert (r["exitcode"], r["err-data"]) == (2, "RTNETLINK answers: File exists\n")
    assert ("203.0.113.78", 32) in eth0()
    assert agent_exec(vm, ["ip", "addr", "del", "203.0.113.77/32", "dev", "eth0"])["exitcode"] == 0
    wait(vm.status.reboot.post())  # addresses configured inside are gone after a reboot
    until(lambda: eth0() == [("203.0.113.10", 24)])


# ---- faults ------------------------------------------------------------------------------------------
def test_guest_faults(pve, wait, admin):
    clone(pve, wait, 101, name="dead-agent")
    clone(pve, wait, 102, name="bad-init")
    admin("post", "/guest-faults", json={"kind": "agent_never_starts", "name": "dead-agent"})
    admin("post", "/guest-faults", json={"kind": "cloud_init_fails", "vmid": 102,
                                         "message": "Failed to run module scripts_user"})
    for vmid in (101, 102):
        wait(pve.nodes("pve1").qemu(vmid).status.start.post())
    ok = pve.nodes("pve1").qemu(102)
    until(lambda: ok.agent.ping.post())
    time.sleep(0.5)
    assert err(lambda: pve.nodes("pve1").qemu(101).agent.ping.post()).content == "QEMU guest agent is not running"
    st = until(lambda: (lambda s: s if s["status"] != "running" else None)(ci_status(ok)))
    assert st["status"] == "error" and st["errors"] == ["Failed to run module scripts_user"]
    r = agent_exec(ok, ["cloud-init", "status"])
    assert (r["exitcode"], r["out-data"]) == (1, "status: error\n")
    assert len(admin("get", "/guest-faults")) == 2
    assert admin("delete", "/guest-faults") == {"deleted": 2}
    assert requests.post(pve_admin_url(pve) + "/guest-faults", json={"kind": "nope", "vmid": 1},
                         verify=False, timeout=5).status_code == 400


def pve_admin_url(pve) -> str:
    return pve._store["base_url"].replace("/api2/json", "/_sim")


def test_cloud_init_status_wait_and_user_data_errors(pve, wait, tmp_path):
    iso = build_nocloud_iso("#cloud-config\nruncmd:\n  - [\"false\"]\nwrite_files: [{path: /x, content: y}]\n",
                            "instance-id: a\n")
    vm = boot_with_iso(pve, wait, tmp_path, iso)
    until(lambda: vm.agent.ping.post())
    r = agent_exec(vm, ["cloud-init", "status", "--wait", "--format", "json"], timeout=5)
    st = json.loads(r["out-data"])
    assert r["exitcode"] == 1 and st["status"] == "error"
    assert st["errors"] == ["Failed to run module scripts_user (scripts in /var/lib/cloud/instance/scripts)"]
    assert vm.agent("file-read").get(file="/x")["content"] == "y"


# ---- a command handler registered by a later issue ------------------------------------------------
def test_registered_command_handler(pve, wait, admin, sim):
    calls = []

    @command("z9-test-tool")
    def tool(ctx):
        calls.append(ctx.argv)
        data = ctx.guest.read_file(ctx.argv[1])
        if data is None:
            return ExecResult(1, err=f"cannot open {ctx.argv[1]}\n")
        ctx.guest.model("z9-test-tool")["loaded"] = data.decode()
        return ExecResult(0, out="ok\n", seconds=2.0, on_exit=lambda: ctx.guest.write_file("/run/done", "1"))

    sim.cluster.guests.register("z9-local", lambda ctx: ExecResult(3, out=ctx.config.get("name", "")))
    admin("post", "/vms", json={"vmid": 150, "node": "pve2", "running": True, "config": {"name": "box", "agent": "1"}})
    vm = pve.nodes("pve2").qemu(150)
    vm.agent("file-write").post(file="/etc/tool.cfg", content="cfg")
    pid = vm.agent.exec.post(command=["/usr/local/bin/z9-test-tool", "/etc/tool.cfg"])["pid"]
    assert vm.agent("exec-status").get(pid=pid) == {"exited": 0}
    assert err(lambda: vm.agent("file-read").get(file="/run/done")).status_code == 500  # not yet
    assert until(lambda: vm.agent("exec-status").get(pid=pid).get("exited"))
    assert vm.agent("file-read").get(file="/run/done")["content"] == "1"
    assert admin("get", "/guests/150")["models"] == {"z9-test-tool": {"loaded": "cfg"}}
    assert agent_exec(vm, ["z9-local"]) == {"exited": 1, "exitcode": 3, "out-data": "box"}


# ---- test 5: destroy ---------------------------------------------------------------------------------
def test_destroy_removes_guest_state_and_reused_vmid_starts_from_nothing(pve, wait, admin, tmp_path):
    iso = build_nocloud_iso(USER_DATA, "instance-id: srv-1\n")
    vm = boot_with_iso(pve, wait, tmp_path, iso)
    until(lambda: ci_status(vm)["status"] == "done")
    vm.agent("file-write").post(file="/root/mine", content="secret")
    wait(vm.status.stop.post())
    assert wait(vm.delete())["exitstatus"] == "OK"
    assert requests.get(f"{pve_admin_url(pve)}/guests/101", verify=False, timeout=5).status_code == 404
    assert "101" not in admin("get", "/state")["guests"]
    clone(pve, wait, 101)  # the same vmid, no ISO attached
    wait(vm.status.start.post())
    until(lambda: vm.agent.ping.post())
    assert err(lambda: vm.agent("file-read").get(file="/root/mine")).content.endswith("No such file or directory")
    assert err(lambda: vm.agent("file-read").get(file="/etc/z9/hello.txt")).status_code == 500
    g = admin("get", "/guests/101")
    assert g["boots"] == 1 and g["instance_id"] != "srv-1"


# ---- test 4: the schema rejects what PVE rejects -------------------------------------------------
@pytest.mark.parametrize("call,field", [
    (lambda pve: pve.nodes("pve1").qemu(100).agent.exec.post(command=["true"], bogus=1), "bogus"),
    (lambda pve: pve.nodes("pve1").qemu(100).agent.exec.post(), "command"),
    (lambda pve: pve.nodes("pve1").qemu(100).agent("exec-status").get(pid="x"), "pid"),
    (lambda pve: pve.nodes("pve1").qemu(100).agent("file-read").get(file="/a", count=0), "count"),
    (lambda pve: pve.nodes("pve1").qemu(100).agent("file-read").get(file="/a", decode="yes"), "decode"),
    (lambda pve: pve.nodes("pve1").qemu(100).agent("file-read").get(), "file"),
    (lambda pve: pve.nodes("pve1").qemu(100).agent("file-write").post(file="/a", content="x" * 61441), "content"),
    (lambda pve: pve.nodes("pve1").qemu(100).agent.ping.post(extra=1), "extra"),
    (lambda pve: pve.nodes("pve1").qemu(100).agent("network-get-interfaces").get(x=1), "x"),
    (lambda pve: pve.nodes("pve1").qemu(100).agent.exec.post(command=["true"], **{"input-data": "x" * 65537}),
     "input-data"),
    (lambda pve: pve.nodes("pve1").storage.get(content="iso", enabled="maybe"), "enabled"),
    (lambda pve: pve.nodes("pve1").storage("local").content.get(vmid=99), "vmid"),
    (lambda pve: pve.nodes("pve1").storage("bad!id").content.get(), "storage"),
    (lambda pve: pve.nodes("pve1").storage("local").content("iso/a.iso").delete(delay=0), "delay"),
    (lambda pve: pve.nodes("pve1").qemu(100).cloudinit.dump.get(type="user", more=1), "more"),
    (lambda pve: pve.nodes("pve1").qemu(100).firewall.ipset("x" * 65).get(), "name"),
])
def test_new_endpoints_reject_what_the_schema_rejects(pve, call, field):
    e = err(lambda: call(pve))
    assert e.status_code == 400 and field in e.errors, e.errors


def test_upload_rejects_unknown_parameter_and_tmpfilename(pve, tmp_path, sim):
    iso = build_nocloud_iso("#cloud-config\n", "instance-id: x\n")
    e = err(lambda: upload(pve, tmp_path, iso, colour="red"))
    assert e.status_code == 400 and "colour" in e.errors
    e = err(lambda: upload(pve, tmp_path, iso, tmpfilename="/var/tmp/pveupload-abc"))
    assert (e.status_code, e.content) == (400, "'tmpfilename' query parameter is not allowed for file uploads")
    # a file name over 255 characters (the file part's name: no local file can have it, so send it raw)
    r = requests.post(f"https://127.0.0.1:{sim.port}/api2/json/nodes/pve1/storage/local/upload",
                      headers={"Authorization": f"PVEAPIToken=root@pam!z9={sim.token_secret}"},
                      data={"content": "iso"}, files={"filename": ("x" * 252 + ".iso", iso)},
                      verify=str(sim.cert_path), timeout=10)
    assert r.status_code == 400 and r.json()["errors"] == {"filename": "value may only be 255 characters long"}
    # no file part: proxmoxer then sends a form-encoded body, which pve-http-server refuses on this path
    e = err(lambda: pve.nodes("pve1").storage("local").upload.post(content="iso", filename="plain.iso"))
    assert (e.status_code, e.content) == (501, "upload 'Content-Type 'application/x-www-form-urlencoded' not "
                                               "implemented")
    # a multipart body without a file part reaches the handler, which has no temporary file
    r = requests.post(f"https://127.0.0.1:{sim.port}/api2/json/nodes/pve1/storage/local/upload",
                      headers={"Authorization": f"PVEAPIToken=root@pam!z9={sim.token_secret}"},
                      files={"content": (None, "iso"), "filename": (None, "plain.iso")}, verify=str(sim.cert_path),
                      timeout=10)
    assert (r.status_code, r.json()["message"]) == (500, "missing temporary file name\n")


def test_upload_with_a_ticket_needs_no_csrf_token(sim, wait, pve):
    base = f"{sim.url}/api2/json"
    t = requests.post(f"{base}/access/ticket", data={"username": "root@pam", "password": sim.config.password},
                      verify=False, timeout=10).json()["data"]
    cookies = {"PVEAuthCookie": t["ticket"]}
    iso = build_nocloud_iso("#cloud-config\n", "instance-id: t\n")
    r = requests.post(f"{base}/nodes/pve1/storage/local/upload", cookies=cookies, verify=False, timeout=10,
                      data={"content": "iso"}, files={"filename": ("t.iso", iso)})
    assert r.status_code == 200 and wait(r.json()["data"])["exitstatus"] == "OK"
    r = requests.post(f"{base}/nodes/pve1/qemu/100/agent/ping", cookies=cookies, verify=False, timeout=10)
    assert (r.status_code, r.reason) == (401, "Permission denied - invalid csrf token")


def test_large_answers_are_gzipped_for_clients_that_accept_it(sim, pve):
    base = f"{sim.url}/api2/json"
    for accept in ("gzip, deflate", "identity"):
        r = requests.get(f"{base}/cluster/resources", headers={**sim.auth_header, "Accept-Encoding": accept},
                         verify=False, timeout=10, stream=True)
        assert r.headers.get("Content-Encoding") == ("gzip" if accept != "identity" else None)
        assert len(json.loads(r.content)["data"]) > 3  # requests decodes transparently
    r = requests.get(f"{base}/nodes/pve1/qemu/100/config", headers={**sim.auth_header, "Accept-Encoding": "gzip"},
                     verify=False, timeout=10)
    assert r.headers.get("Content-Encoding") is None  # under 1 KiB: sent as is


def ended(status: dict) -> dict | None:
    return status if status["status"] != "running" else None


# A guest's DNS is what Debian's renderer makes of its network-config (cloud-init's ENI renderer:
# dns-nameservers, through resolvconf into /etc/resolv.conf): a static network naming none leaves
# the guest without a nameserver; v1's global "type: nameserver" (PVE's form) and a subnet's
# dns_nameservers give them; PVE's own drive falls back to the node's resolv.conf (get_dns_conf); a
# network-config Debian's renderer refuses fails cloud-init.
@pytest.mark.parametrize("dns,expect", [
    (None, []),
    ({"type": "nameserver", "address": ["198.51.100.53", "198.51.100.54"]}, ["198.51.100.53", "198.51.100.54"]),
    ("subnet", ["198.51.100.55"]),
])
def test_a_guests_dns_is_what_its_network_config_names(pve, wait, tmp_path, admin, dns, expect):
    clone(pve, wait, 101)
    vm = pve.nodes("pve1").qemu(101)
    mac = vm.config.get()["net0"].split(",")[0].split("=")[1].lower()
    subnet = {"type": "static", "address": "172.16.0.9/16", "gateway": "172.16.0.1"}
    if dns == "subnet":
        subnet["dns_nameservers"] = ["198.51.100.55"]
    config = [{"type": "physical", "name": "eth0", "mac_address": mac, "subnets": [subnet]}]
    if isinstance(dns, dict):
        config.append(dns)
    net = yaml.safe_dump({"version": 1, "config": config})
    wait(upload(pve, tmp_path, build_nocloud_iso("#cloud-config\nhostname: dns-1\n", "instance-id: dns-1\n", net)))
    vm.config.put(ide3="local:iso/seed-101.iso,media=cdrom")
    wait(vm.status.start.post())
    st = until(lambda: ended(ci_status(vm)), timeout=30)
    assert st["status"] == "done", st
    resolv = vm.agent("file-read").get(file="/etc/resolv.conf")["content"]
    assert [ln.split()[1] for ln in resolv.splitlines() if ln.startswith("nameserver ")] == expect, resolv


def test_pve_drives_dns_and_a_network_config_debian_refuses(pve, wait, tmp_path, admin):
    clone(pve, wait, 101)
    vm = pve.nodes("pve1").qemu(101)
    vm.config.put(ipconfig0="ip=198.51.100.9/24,gw=198.51.100.1", nameserver="198.51.100.53")
    wait(vm.status.start.post())
    until(lambda: ci_status(vm)["status"] == "done")
    assert "nameserver 198.51.100.53\n" in vm.agent("file-read").get(file="/etc/resolv.conf")["content"]
    clone(pve, wait, 102, name="web-2")
    vm2 = pve.nodes("pve1").qemu(102)
    vm2.config.put(ipconfig0="ip=198.51.100.10/24")  # no nameserver: the node's resolv.conf's (get_dns_conf)
    wait(vm2.status.start.post())
    until(lambda: ci_status(vm2)["status"] == "done")
    assert "nameserver " in vm2.agent("file-read").get(file="/etc/resolv.conf")["content"]
    clone(pve, wait, 103, name="web-3")
    vm3 = pve.nodes("pve1").qemu(103)
    mac = vm3.config.get()["net0"].split(",")[0].split("=")[1].lower()
    bad = yaml.safe_dump({"version": 1, "config": [{"type": "physical", "name": "eth0", "mac_address": mac,
                                                     "subnets": [{"type": "static", "address": "nope"}]}]})
    wait(upload(pve, tmp_path, build_nocloud_iso("#cloud-config\nhostname: bad\n", "instance-id: bad\n", bad), name="seed-103.iso"))
    vm3.config.put(ide3="local:iso/seed-103.iso,media=cdrom")
    wait(vm3.status.start.post())
    st = until(lambda: ended(ci_status(vm3)), timeout=30)
    assert st["status"] == "error" and any("Failed to apply network config" in e and "nope" in e
                                           for e in st["errors"]), st


# qemu-server Agent.pm assert_agent_available → qga_check_running: a guest-ping with a 3 s timeout.
# An agent with its port but not answering (the guest still booting) is "not running" only after
# that timeout; one that comes up within it is answered as soon as it does; a VM whose agent was
# enabled after its start (no port) is refused at once.
def test_agent_not_running_after_pves_ping_timeout(pve, wait, admin):
    clone(pve, wait, 101)
    vm = pve.nodes("pve1").qemu(101)
    admin("put", "/config", json={"guest_boot_s": 30.0, "agent_timeout_s": 3.0})
    try:
        wait(vm.status.start.post())
        t0 = time.monotonic()
        e = err(lambda: vm.agent.ping.post())
        took = time.monotonic() - t0
        assert (e.status_code, e.content) == (500, "QEMU guest agent is not running")
        assert took >= 2.9, took
        admin("put", "/config", json={"guest_boot_s": 1.0})
        wait(vm.status.stop.post())
        wait(vm.status.start.post())
        t0 = time.monotonic()
        assert vm.agent.ping.post() == {"result": {}}  # up within the ping's timeout: answered then
        assert time.monotonic() - t0 < 2.9
        wait(vm.status.stop.post())
        vm.config.put(agent="0")
        wait(vm.status.start.post())
        vm.config.put(agent="1")  # enabled after the start: no port, refused at once
        t0 = time.monotonic()
        assert err(lambda: vm.agent.ping.post()).content == "QEMU guest agent is not running"
        assert time.monotonic() - t0 < 1.0
    finally:
        admin("put", "/config", json={"guest_boot_s": GUEST_BOOT_S})
