"""The guest's cloud-init as the real one: the seed NoCloud picks among several ``cidata`` devices, the
user-data judged by Debian's ``cloud-init schema``, and a failure reported through the guest agent
(``cloud-init status --long``) with nothing of the failed modules applied."""

from __future__ import annotations

from urllib.parse import quote

from z9.common.nocloud import build_nocloud_iso

from .conftest import SSH_KEY
from .test_sim_guest import agent_exec, ci_status, clone, until, upload


def finished(vm) -> dict:
    return until(lambda: (lambda s: s if s["status"] not in ("running", "not-run") else None)(ci_status(vm)))


def test_two_cidata_devices_nocloud_takes_the_last_device_path(pve, wait, tmp_path, admin):
    """DataSourceNoCloud._get_devices sorts the labelled devices in reverse: an ISO on ide0 (/dev/sr0)
    loses to PVE's drive on ide2 (/dev/sr1); on sata0 (/dev/sr1, after ide2's /dev/sr0) it wins."""
    clone(pve, wait, 101, name="web-1")
    vm = pve.nodes("pve1").qemu(101)
    wait(upload(pve, tmp_path, build_nocloud_iso("#cloud-config\nhostname: from-iso\n",
                                                 "instance-id: iso-1\n")))
    vm.config.put(ide0="local:iso/seed-101.iso,media=cdrom")
    wait(vm.status.start.post())
    st = finished(vm)
    guest = admin("get", "/guests/101")
    assert guest["inputs"]["source"] == "ide2:local-lvm:vm-101-cloudinit" and "seed=/dev/sr1" in st["detail"]
    assert guest["hostname"] == "web-1" and guest["instance_id"] != "iso-1"
    wait(vm.status.stop.post())
    vm.config.put(delete="ide0")
    vm.config.put(sata0="local:iso/seed-101.iso,media=cdrom")
    wait(vm.status.start.post())
    st = finished(vm)
    guest = admin("get", "/guests/101")
    assert guest["inputs"]["source"] == "sata0:local:iso/seed-101.iso" and "seed=/dev/sr1" in st["detail"]
    assert (guest["hostname"], guest["instance_id"]) == ("from-iso", "iso-1")
    # an empty CD-ROM drive is a device too: ide0 empty → ide2 is /dev/sr1, sata0 /dev/sr2 (still last)
    wait(vm.status.stop.post())
    vm.config.put(ide0="none,media=cdrom")
    wait(vm.status.start.post())
    assert "seed=/dev/sr2" in finished(vm)["detail"]


def test_a_key_comment_with_yaml_syntax_fails_cloud_init_and_applies_nothing(pve, wait, cloud_init_tool):
    """PVE takes the key (ssh-keygen reads it) and writes it unquoted: the user-data is no YAML,
    cloud-init schema says so, the guest reports error — no key authorized, no hostname set."""
    clone(pve, wait, 101, name="web-1")
    vm = pve.nodes("pve1").qemu(101)
    vm.config.put(sshkeys=quote(SSH_KEY + " a: b: c\n", safe=""))
    wait(vm.status.start.post())
    st = finished(vm)
    assert st["status"] == "error" and "is not valid yaml" in st["errors"][0], st
    r = agent_exec(vm, ["cloud-init", "status", "--long"])
    assert r["exitcode"] == 1 and r["out-data"].startswith("status: error\n"), r
    assert "detail:\nCloud config schema errors: format-l" in r["out-data"] and "is not valid yaml" in r["out-data"]
    assert agent_exec(vm, ["cat", "/home/debian/.ssh/authorized_keys"])["exitcode"] == 1
    assert agent_exec(vm, ["hostname"])["out-data"] != "web-1\n"


def test_schema_errors_drop_what_those_modules_would_do(pve, wait, tmp_path, cloud_init_tool):
    """Valid YAML, invalid cloud-config (``user: laptop`` makes the key a mapping): the schema names
    ssh_authorized_keys; the key is not written, the rest (hostname) is applied; status error."""
    iso = build_nocloud_iso("#cloud-config\nhostname: web-9\nssh_authorized_keys:\n"
                            f"  - {' '.join(SSH_KEY.split()[:2])} user: laptop\n", "instance-id: a\n")
    wait(upload(pve, tmp_path, iso))
    clone(pve, wait, 101)
    vm = pve.nodes("pve1").qemu(101)
    vm.config.put(ide3="local:iso/seed-101.iso,media=cdrom")
    wait(vm.status.start.post())
    st = finished(vm)
    assert st["status"] == "error" and st["errors"] == [
        "Cloud config schema errors: ssh_authorized_keys.0: {'" + " ".join(SSH_KEY.split()[:2])
        + " user': 'laptop'} is not of type 'string'"], st
    assert agent_exec(vm, ["cat", "/home/debian/.ssh/authorized_keys"])["exitcode"] == 1
    assert agent_exec(vm, ["hostname"])["out-data"] == "web-9\n"


def test_valid_user_data_passes_the_real_schema(pve, wait, cloud_init_tool):
    """PVE's own user-data with a key and a user: valid for cloud-init schema, the key authorized."""
    clone(pve, wait, 101, name="web-1")
    vm = pve.nodes("pve1").qemu(101)
    vm.config.put(sshkeys=quote(SSH_KEY + "\n", safe=""), ciuser="debian")
    wait(vm.status.start.post())
    assert finished(vm)["status"] == "done"
    assert agent_exec(vm, ["cat", "/home/debian/.ssh/authorized_keys"])["out-data"] == SSH_KEY + "\n"


def test_a_hostname_longer_than_the_kernel_takes_is_not_set(pve, wait, tmp_path):
    """sethostname(2) takes at most 64 bytes: a 94-character hostname (what z9 once derived for a
    cluster member) is written to /etc/hostname but the guest keeps its hostname; cloud-init only logs it."""
    long = "a" * 63 + "-" + "w" * 27 + "-0"
    iso = build_nocloud_iso(f"#cloud-config\nhostname: {long}\n", "instance-id: long-1\n")
    wait(upload(pve, tmp_path, iso))
    clone(pve, wait, 101)
    vm = pve.nodes("pve1").qemu(101)
    vm.config.put(ide3="local:iso/seed-101.iso,media=cdrom")
    wait(vm.status.start.post())
    assert finished(vm)["status"] == "done"
    assert vm.agent("get-host-name").get()["result"]["host-name"] == "localhost"
    assert agent_exec(vm, ["cat", "/etc/hostname"])["out-data"] == long + "\n"
