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
    src.config.put(ide3="isos:iso/seed-fixed.iso,media=cdrom")  # after PVE's drive (ide2): the seed NoCloud takes
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
    """A next issue's handler, written from simulator/z9/sim/guest.py's docstring only: a long command whose
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


def test_volume_names_outside_the_storage_layout_are_refused(sim, pve, wait):
    """``PVE::Storage::path`` → ``parse_volname`` before any work: no imgdel task for a name in a
    sub-directory, without a content directory or with the wrong extension (requests already folds ``..``
    segments of a URL, so a traversal reaches the simulator as one of these)."""
    st = pve.nodes("pve1").storage("local")
    for volume in ("nope", "iso/sub/x.iso", "iso/x.txt", "template/iso/x.iso"):
        r = raw(sim, "DELETE", f"/nodes/pve1/storage/local/content/{volume}")
        assert (r.status_code, r.json()["message"]) == (500, f"unable to parse directory volume name '{volume}'\n")
        r = raw(sim, "GET", f"/nodes/pve1/storage/local/content/local:{volume}")
        assert (r.status_code, r.json()["message"]) == (500, f"unable to parse directory volume name '{volume}'\n")
    assert not [t for t in pve.nodes("pve1").tasks.get() if t["type"] == "imgdel"]
    e = err(lambda: st.content("iso/missing.iso").get())
    assert (e.status_code, e.content) == (500, "volume 'local:iso/missing.iso' does not exist")
    # a well-formed missing name still gets its task (a warning, as Plugin::free_image)
    assert wait(st.content("iso/missing.iso").delete())["exitstatus"] == "WARNINGS: 1"


def test_json_bodies_with_objects_or_arrays_where_the_schema_wants_otherwise_are_refused(sim, pve, wait):
    """A JSON body is typed: an object or array for a string/boolean parameter, or an object for
    ``command`` (an array of strings), fails PVE's check_type instead of running its Python repr."""
    clone(pve, wait, 101)
    vm = pve.nodes("pve1").qemu(101)
    wait(vm.status.start.post())
    until(lambda: vm.agent.ping.post())
    path = "/nodes/pve1/qemu/101/agent"
    cases = [
        (f"{path}/exec", {"command": {"a": 1}}, {"command": "type check ('array') failed"}),
        (f"{path}/exec", {"command": ["echo", {"a": 1}]}, {"command": "type check ('string') failed - got HASH"}),
        (f"{path}/file-write", {"file": ["/a"], "content": "x"}, {"file": "type check ('string') failed - got ARRAY"}),
        (f"{path}/file-write", {"file": "/a", "content": "x", "encode": {"x": 1}},
         {"encode": "type check ('boolean') failed - got HASH"}),
    ]
    for url, body, errors in cases:
        r = raw(sim, "POST", url, json=body)
        assert (r.status_code, r.json().get("errors")) == (400, errors), (body, r.text)
    r = raw(sim, "POST", f"{path}/exec", json={"command": ["echo", "hi"]})
    assert r.status_code == 200 and "pid" in r.json()["data"]


def test_ipset_add_normalises_a_host_prefix(pve):
    """pve-firewall create_ip runs parse_ip_or_cidr before its duplicate check: '/32' and '/128' are
    dropped, so 10.0.0.5/32 is stored as 10.0.0.5 and is a duplicate of it; the entry's own path is
    the bare address (a '/32' path finds nothing)."""
    fw = pve.nodes("pve1").qemu(101).firewall
    fw.ipset.post(name="ipfilter-net0")
    s = fw.ipset("ipfilter-net0")
    s.post(cidr="10.0.0.5/32")
    s.post(cidr="2001:db8::1/128")
    s.post(cidr="10.0.1.0/24")
    assert [e["cidr"] for e in s.get()] == ["10.0.1.0/24", "2001:db8::1", "10.0.0.5"]
    e = err(lambda: s.post(cidr="10.0.0.5"))
    assert e.errors == {"cidr": "address '10.0.0.5' already exists"}
    e = err(lambda: s.post(cidr="2001:db8::1/128"))
    assert e.errors == {"cidr": "address '2001:db8::1' already exists"}
    assert err(lambda: s("10.0.0.5/32").get()).errors == {"cidr": "no such IP/Network"}
    s("10.0.0.5/32").delete()  # nothing by that name: OK, nothing removed
    assert len(s.get()) == 3
    s("10.0.0.5").delete()
    assert [e["cidr"] for e in s.get()] == ["10.0.1.0/24", "2001:db8::1"]


def test_admin_settings_refuse_bad_values_whole(sim, admin):
    """PUT /_sim/config and POST /_sim/flock answer 400 for bad input (they raised: 500 with a
    traceback), and a bad value applies nothing (no half-applied settings)."""
    before = admin("put", "/config", json={})
    for body in ({"guest_boot_s": "abc"}, {"task_seconds": [1]}, {"cloud_init_s": 0.5, "task_default_s": "x"},
                 {"guest_boot_s": -1}, {"guest_boot": 1}):
        r = requests.put(f"{sim.admin_url}/config", json=body, verify=False, timeout=10)
        assert r.status_code == 400 and "bad config" in r.json()["error"], (body, r.text)
    assert admin("put", "/config", json={}) == before
    for body in ({}, {"vmid": "x"}, {"vmid": 100, "seconds": "long"}):
        r = requests.post(f"{sim.admin_url}/flock", json=body, verify=False, timeout=10)
        assert r.status_code == 400, (body, r.text)


def test_reboot_after_the_attached_iso_was_deleted_leaves_the_vm_stopped(pve, wait, tmp_path):
    """qm reboot = stop + a new start (qmeventd). Deleting the seed ISO a running VM still references
    (CAPMOX deletes it after cloud-init) and then rebooting: the reboot task is OK, the start fails
    ``volume '…' does not exist`` in its own qmstart task, and the VM is stopped — not booted without it."""
    iso = build_nocloud_iso("#cloud-config\n", "instance-id: r-1\n")
    vm = boot_with_iso(pve, wait, tmp_path, iso)
    until(lambda: vm.agent.ping.post())
    assert wait(pve.nodes("pve1").storage("local").content("iso/seed-101.iso").delete())["exitstatus"] == "OK"
    assert wait(vm.status.reboot.post())["exitstatus"] == "OK"
    assert vm.status.current.get()["status"] == "stopped"
    starts = [t["upid"] for t in pve.nodes("pve1").tasks.get(vmid=101, source="all") if t["type"] == "qmstart"]
    assert sorted(wait(u)["exitstatus"] for u in starts) == ["OK", "volume 'local:iso/seed-101.iso' does not exist"]
    e = err(lambda: vm.agent.ping.post())
    assert e.content == "VM 101 is not running"


def test_file_write_and_read_of_paths_a_file_cannot_have(pve, wait):
    """qemu-ga open(2) errors: an empty path, a directory (also one implied by a file below it), a path
    below a file. Before, each was stored as a file ('' or '/etc/' became readable files)."""
    clone(pve, wait, 101)
    vm = pve.nodes("pve1").qemu(101)
    wait(vm.status.start.post())
    until(lambda: vm.agent.ping.post())
    vm.agent("file-write").post(file="/etc/app/app.conf", content="x")
    fw = vm.agent("file-write")
    for path, why in (("", "No such file or directory"), ("/etc/", "Is a directory"), ("/etc/app", "Is a directory"),
                      ("/", "Is a directory"), ("/etc/app/app.conf/x", "Not a directory")):
        e = err(lambda: fw.post(file=path, content="y"))
        assert (e.status_code, e.content) == (
            500, f"VM 101 qmp command 'guest-file-open' failed - failed to open file '{path}' (mode: 'wb'): {why}")
    e = err(lambda: vm.agent("file-read").get(file="/etc/app"))
    assert e.content == "VM 101 qmp command 'guest-file-read' failed - failed to read file: Is a directory"
    assert vm.agent("file-read").get(file="/etc/app/app.conf")["content"] == "x"
    fw.post(file="relative.txt", content="ok")  # qemu-ga opens it relative to its cwd: allowed


def test_shell_redirections_and_pipes(pve, wait):
    """'echo 0 > /tmp/f; cat /tmp/f' printed '0 > /tmp/f' and wrote nothing, and 'a | b' passed '|' as an
    argument: the simulator's sh now redirects and pipes, and refuses what it does not model."""
    clone(pve, wait, 101)
    vm = pve.nodes("pve1").qemu(101)
    wait(vm.status.start.post())
    until(lambda: vm.agent.ping.post())

    def sh(script: str) -> dict:
        return agent_exec(vm, ["sh", "-c", script])

    assert sh("echo 0 > /tmp/f; echo 1 >> /tmp/f; cat /tmp/f") == {"exited": 1, "exitcode": 0, "out-data": "0\n1\n"}
    assert sh("echo hello | cat") == {"exited": 1, "exitcode": 0, "out-data": "hello\n"}
    assert sh("cat < /tmp/f | cat > /tmp/g && cat /tmp/g")["out-data"] == "0\n1\n"
    r = sh("cat /nope 2>/dev/null || echo missing")
    assert r == {"exited": 1, "exitcode": 0, "out-data": "missing\n"}
    r = sh("cat /nope 2>&1")
    assert r == {"exited": 1, "exitcode": 1, "out-data": "cat: /nope: No such file or directory\n"}
    r = sh("cat /nope 2> /tmp/err; cat /tmp/err")
    assert r["out-data"] == "cat: /nope: No such file or directory\n" and "err-data" not in r
    assert sh("echo 'a > b | c'")["out-data"] == "a > b | c\n"  # quoted: no redirection
    assert sh("echo x >/dev/null") == {"exited": 1, "exitcode": 0}
    r = sh("sleep 1 &")
    assert r["exitcode"] == 2 and "not supported" in r["err-data"]
    r = sh("echo >")
    assert r["exitcode"] == 2 and "Syntax error" in r["err-data"]
    assert vm.agent("file-read").get(file="/tmp/f")["content"] == "0\n1\n"


def test_cicustom_needs_snippets_the_api_cannot_write(pve, wait):
    """qemu-server reads cicustom files from snippets volumes; the API cannot upload snippets, so a VM
    with cicustom cannot start (nor regenerate or dump its drive) — before, cicustom was ignored and
    the VM booted from the generated user-data."""
    clone(pve, wait, 101)
    vm = pve.nodes("pve1").qemu(101)
    vm.config.put(cicustom="user=local:snippets/user-101.yaml")
    st = wait(vm.status.start.post())
    assert st["exitstatus"] == "can't open '/var/lib/vz/snippets/user-101.yaml' - No such file or directory"
    assert vm.status.current.get()["status"] == "stopped"
    vm.config.put(cicustom="user=local:iso/seed.iso,network=isos:snippets/n.yaml")
    e = err(lambda: vm.cloudinit.put())
    assert (e.status_code, e.content) == (500, "local:iso/seed.iso is not in the snippets directory")
    e = err(lambda: vm.cloudinit.dump.get(type="user"))
    assert e.content == "local:iso/seed.iso is not in the snippets directory"
    vm.config.put(delete="cicustom")
    assert wait(vm.status.start.post())["exitstatus"] == "OK"


def test_upload_needs_a_multipart_body_of_known_length(sim):
    """pve-http-server streams uploads: another Content-Type or a chunked body (no Content-Length) is
    refused before the handler (they reached it: 'missing temporary file name' or an accepted upload)."""
    url = "/nodes/pve1/storage/local/upload"
    r = raw(sim, "POST", url, json={"content": "iso", "filename": "a.iso"})
    assert (r.status_code, r.json()["message"]) == (501, "upload 'Content-Type 'application/json' not implemented\n")
    body = (b"--xx\r\nContent-Disposition: form-data; name=\"content\"\r\n\r\niso\r\n--xx\r\nContent-Disposition: "
            b"form-data; name=\"filename\"; filename=\"c.iso\"\r\nContent-Type: application/octet-stream\r\n\r\n"
            b"data\r\n--xx--\r\n")
    r = raw(sim, "POST", url, data=iter([body]), headers={"Content-Type": "multipart/form-data; boundary=xx"})
    assert (r.status_code, r.json()["message"]) == (501, "upload without content length header not supported\n")
    r = raw(sim, "POST", url, data=body, headers={"Content-Type": "multipart/form-data; boundary=xx"})
    assert r.status_code == 200 and ":imgcopy:" in r.json()["data"]


def test_thin_pool_volume_names(sim, pve, wait):
    """A VM disk on local-lvm is a valid volume (its /dev path); a name outside LvmThin's layout is refused."""
    clone(pve, wait, 101)
    disk = next(d for d in pve.nodes("pve1").storage("local-lvm").content.get(vmid=101) if "disk" in d["volid"])
    info = pve.nodes("pve1").storage("local-lvm").content(disk["volid"]).get()
    assert info["path"] == "/dev/pve/" + disk["volid"].split(":", 1)[1] and info["size"] == disk["size"]
    r = raw(sim, "GET", "/nodes/pve1/storage/local-lvm/content/local-lvm:iso/x.iso")
    assert (r.status_code, r.json()["message"]) == (500, "unable to parse lvm volume name 'iso/x.iso'\n")
    r = raw(sim, "GET", "/nodes/pve1/storage/local-lvm/content/local-lvm:vm-999-disk-0")
    assert (r.status_code, r.json()["message"]) == (500, "volume 'local-lvm:vm-999-disk-0' does not exist\n")
