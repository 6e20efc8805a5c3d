"""Attacks on the simulator's issue-9 / issue-8 §3 endpoints (found by review): each test failed before
its fix. Through HTTPS as z9 calls it (proxmoxer, or raw requests where proxmoxer cannot say it)."""

from __future__ import annotations

import hashlib
import time

import pytest
import requests
from proxmoxer import ResourceException

from z9.common.nocloud import build_nocloud_iso

from z9.sim.guest import ExecContext, ExecResult

from .test_sim_guest import agent_exec, boot_with_iso, clone, err, until


def raw(sim, method: str, path: str, **kw) -> requests.Response:
    headers = {"Authorization": f"PVEAPIToken=root@pam!z9={sim.token_secret}", **kw.pop("headers", {})}
    return requests.request(method, f"https://127.0.0.1:{sim.port}/api2/json{path}", headers=headers,
                            verify=str(sim.cert_path), timeout=10, **kw)


def test_client_parameters_named_like_internal_values_are_refused(sim, pve, wait, admin):
    """'@corrupt' / '@file' are the simulator's own request-internal values: a client sending them gets
    PVE's unknown-parameter 400, and the uploaded bytes stay what was sent."""
    data = b"hello world"
    digest = hashlib.sha256(data).hexdigest()
    for kw in ({"params": {"@corrupt": "1"}}, {"data": {"content": "iso", "@corrupt": "1"}}):
        form = {"content": "iso", "checksum-algorithm": "sha256", "checksum": digest}
        form.update(kw.get("data", {}))
        r = raw(sim, "POST", "/nodes/pve1/storage/local/upload", params=kw.get("params"),
                files={"filename": ("a.iso", data)}, data=form)
        assert r.status_code == 400, r.text
        assert r.json()["errors"] == {"@corrupt": "property is not defined in schema and the schema does not "
                                                  "allow additional properties"}
    r = raw(sim, "GET", "/nodes/pve1/tasks", params={"@accept_encoding": "gzip"})
    assert r.status_code == 400 and "@accept_encoding" in r.json()["errors"]
    assert admin("get", "/state")["storage"] == {}
    # the ordinary upload still works and stores the bytes sent
    r = raw(sim, "POST", "/nodes/pve1/storage/local/upload", files={"filename": ("a.iso", data)},
            data={"content": "iso", "checksum-algorithm": "sha256", "checksum": digest})
    assert r.status_code == 200, r.text
    assert wait(r.json()["data"])["exitstatus"] == "OK"
    assert admin("get", "/state")["storage"]["local@pve1"][0]["sha256"] == digest


def _addrs(vm) -> dict[str, set[str]]:
    return {i["name"]: {a["ip-address"] for a in i["ip-addresses"]}
            for i in vm.agent("network-get-interfaces").get()["result"]}


def test_clone_of_a_vm_that_ran_copies_its_disk(pve, wait, admin, tmp_path):
    """PVE's clone copies the disks: the guest files of a VM that ran are on the clone. With PVE's own
    drive the clone is a new instance (new name and MACs → new instance-id → new host key); files
    written to the source after the clone are not on the clone."""
    clone(pve, wait, 101, name="src")
    src = pve.nodes("pve1").qemu(101)
    src.config.put(ipconfig0="ip=10.20.0.5/24,gw=10.20.0.1")
    wait(src.status.start.post())
    until(lambda: src.agent.ping.post())
    src.agent("file-write").post(file="/etc/app.conf", content="v1")
    before = admin("get", "/guests/101")
    assert wait(src.clone.post(newid=102, name="copy", full=1))["exitstatus"] == "OK"
    src.agent("file-write").post(file="/etc/app.conf", content="v2")  # after the clone: not copied
    src.agent("file-write").post(file="/etc/later.conf", content="x")
    dst = pve.nodes("pve1").qemu(102)
    assert admin("get", "/guests/102")["booted"] is False  # a disk, not a running guest
    wait(dst.status.start.post())
    until(lambda: dst.agent.ping.post())
    assert dst.agent("file-read").get(file="/etc/app.conf")["content"] == "v1"
    e = err(lambda: dst.agent("file-read").get(file="/etc/later.conf"))
    assert "No such file or directory" in e.content
    after = admin("get", "/guests/102")
    assert after["instance_id"] != before["instance_id"] and after["host_key"] != before["host_key"]
    assert after["hostname"] == "copy" and after["boots"] == 1
    mac = dst.config.get()["net0"].split(",")[0].split("=")[1].lower()
    eth0 = next(i for i in dst.agent("network-get-interfaces").get()["result"] if i["name"] == "eth0")
    assert eth0["hardware-address"] == mac
    assert "10.20.0.5" in {a["ip-address"] for a in eth0["ip-addresses"]}
    # destroying the source leaves the clone's disk alone
    wait(src.status.stop.post())
    assert wait(src.delete())["exitstatus"] == "OK"
    assert dst.agent("file-read").get(file="/etc/app.conf")["content"] == "v1"


def test_clone_sharing_a_fixed_instance_id_iso_keeps_the_sources_identity(pve, wait, admin, tmp_path):
    """A NoCloud ISO with a fixed instance-id, attached to source and clone (the CD-ROM is not copied,
    it is referenced): the clone is NOT a new instance for cloud-init — it keeps the source's host key
    (the classic cloned-VM pitfall) and reports its own MAC."""
    iso = build_nocloud_iso("#cloud-config\n", "instance-id: fixed-1\n")
    path = tmp_path / "seed-fixed.iso"
    path.write_bytes(iso)
    with open(path, "rb") as f:
        wait(pve.nodes("pve1").storage("isos").upload.post(content="iso", filename=f))
    clone(pve, wait, 101, name="src")
    src = pve.nodes("pve1").qemu(101)
    src.config.put(ide0="isos:iso/seed-fixed.iso,media=cdrom")
    wait(src.status.start.post())
    until(lambda: src.agent.ping.post())
    key = admin("get", "/guests/101")["host_key"]
    assert wait(src.clone.post(newid=102, name="copy", full=1))["exitstatus"] == "OK"
    dst = pve.nodes("pve1").qemu(102)
    wait(dst.status.start.post())
    until(lambda: dst.agent.ping.post())
    g = admin("get", "/guests/102")
    assert g["instance_id"] == "fixed-1" and g["host_key"] == key
    mac = dst.config.get()["net0"].split(",")[0].split("=")[1].lower()
    assert {i["hardware-address"] for i in dst.agent("network-get-interfaces").get()["result"]} >= {mac}


def test_a_cloudinit_drive_given_as_storage_cloudinit_is_allocated(pve, wait, admin):
    """``ide2=local-lvm:cloudinit`` (create or config) allocates ``local-lvm:vm-<vmid>-cloudinit,media=cdrom``
    as qemu-server does; the VM then boots from PVE's drive with its ipconfig0."""
    n = pve.nodes("pve1")
    upid = n.qemu.post(vmid=103, name="fresh", net0="virtio,bridge=vmbr0", agent=1, ide2="local-lvm:cloudinit",
                       ipconfig0="ip=10.9.9.9/24,gw=10.9.9.1", start=1)
    assert wait(upid)["exitstatus"] == "OK"
    vm = n.qemu(103)
    assert vm.config.get()["ide2"] == "local-lvm:vm-103-cloudinit,media=cdrom"
    until(lambda: vm.agent.ping.post())
    assert "10.9.9.9" in _addrs(vm)["eth0"]
    assert "address: '10.9.9.9'" in vm.cloudinit.dump.get(type="network")
    # added later through PUT config on a VM without one
    assert wait(n.qemu.post(vmid=104, name="later", net0="virtio,bridge=vmbr0"))["exitstatus"] == "OK"
    n.qemu(104).config.put(scsi1="local-lvm:cloudinit", ipconfig0="ip=10.9.9.10/24")
    assert n.qemu(104).config.get()["scsi1"] == "local-lvm:vm-104-cloudinit,media=cdrom"
    assert [e for e in n.qemu(104).cloudinit.get() if e["key"] == "ipconfig0"]


def test_state_file_keeps_pending_cloud_init_and_the_drive(tmp_path, sim_thread_factory):
    """A pending ipconfig0 change survives a simulator restart as pending (PVE keeps
    ``[special:cloudinit]`` in the config file), and a running VM boots again from the drive it had —
    not from one regenerated out of the pending keys (which would make it a new instance)."""
    from proxmoxer import ProxmoxAPI

    from z9.sim.server import SimConfig

    state = tmp_path / "state.json"
    config = SimConfig(seed="dev", state_file=state, task_default_s=0.05, nodes=["pve1"], guest_boot_s=0.2,
                       cloud_init_s=0.2)

    def client(st):
        return ProxmoxAPI("127.0.0.1", port=st.server.port, user="root@pam", token_name="z9",
                          token_value=st.server.token_secret, verify_ssl=False, timeout=10)

    def wait(pve, upid):
        until(lambda: pve.nodes("pve1").tasks(upid).status.get()["status"] == "stopped")
        return pve.nodes("pve1").tasks(upid).status.get()

    st = sim_thread_factory(config, tmp_path / "cert")
    try:
        pve = client(st)
        assert wait(pve, pve.nodes("pve1").qemu(9000).clone.post(newid=101, name="r", full=1))["exitstatus"] == "OK"
        vm = pve.nodes("pve1").qemu(101)
        vm.config.put(ipconfig0="ip=10.30.0.5/24")
        wait(pve, vm.status.start.post())
        until(lambda: vm.agent.ping.post())
        key = st.server.cluster.guests.get(101).host_key
        vm.config.put(ipconfig0="ip=10.30.0.6/24")  # pending: not on the drive yet
        pending = vm.cloudinit.get()
        assert {"key": "ipconfig0", "value": "ip=10.30.0.5/24", "pending": "ip=10.30.0.6/24"} in pending
    finally:
        st.close()
    st = sim_thread_factory(config, tmp_path / "cert")
    try:
        pve = client(st)
        vm = pve.nodes("pve1").qemu(101)
        assert vm.cloudinit.get() == pending
        until(lambda: vm.agent.ping.post())
        g = st.server.cluster.guests.get(101)
        assert g.host_key == key  # the same instance
        assert "10.30.0.5" in _addrs(vm)["eth0"] and "10.30.0.6" not in _addrs(vm)["eth0"]
    finally:
        st.close()


def test_a_handler_written_from_the_docstring_composes_in_sh_and_runcmd(sim, pve, wait, tmp_path):
    """A next issue's handler, written from simulator/guest.py's docstring only: a long command whose
    effect appears at its end (on_exit). Run by ``sh -c "a && b"`` or a ``runcmd`` item, the next command
    sees the effect (before, a nested command's on_exit was silently dropped). A handler returning
    something other than an ExecResult fails its command, not the request."""

    def kubeadm(ctx: ExecContext) -> ExecResult:
        if ctx.argv[1:2] != ["init"]:
            return ExecResult(2, err="usage\n")
        ctx.guest.model("kubeadm")["inits"] = ctx.guest.model("kubeadm").get("inits", 0) + 1
        return ExecResult(0, out="init started\n", seconds=0.3,
                          on_exit=lambda: ctx.guest.write_file("/etc/kubernetes/admin.conf", "kubeconfig"))

    sim.cluster.guests.register("z9b-kubeadm", kubeadm)
    sim.cluster.guests.register("z9b-broken", lambda ctx: None)
    iso = build_nocloud_iso("#cloud-config\nruncmd:\n  - [z9b-kubeadm, init]\n  - [cat, /etc/kubernetes/admin.conf]\n",
                            "instance-id: k8s-1\n")
    vm = boot_with_iso(pve, wait, tmp_path, iso)
    until(lambda: vm.agent.ping.post())
    st = agent_exec(vm, ["cloud-init", "status", "--wait", "--format", "json"], timeout=5)
    assert st["exitcode"] == 0, st  # the runcmd 'cat' found the file kubeadm's effect wrote
    assert vm.agent("file-read").get(file="/etc/kubernetes/admin.conf")["content"] == "kubeconfig"
    vm.agent("file-write").post(file="/etc/kubernetes/admin.conf", content="old")
    r = agent_exec(vm, ["sh", "-c", "rm /etc/kubernetes/admin.conf && z9b-kubeadm init && cat /etc/kubernetes/admin.conf"])
    assert r == {"exited": 1, "exitcode": 0, "out-data": "init started\nkubeconfig"}
    r = agent_exec(vm, ["z9b-broken"])
    assert r["exitcode"] == 1 and "not ExecResult" in r["err-data"]
