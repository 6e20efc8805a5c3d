"""A template on the shared images storage (``ceph-vm``, type rbd) is cloned to another node at once.

pve-storage ``src/PVE/Storage/Plugin.pm`` parse_config: a storage whose type is in
``@SHARED_STORAGE`` ('iscsi', 'nfs', 'cifs', 'rbd', 'cephfs', …) gets ``shared => 1``; qemu-server
``src/PVE/API2/Qemu.pm`` clone_vm: ``$check_storage_access_clone`` lets a ``target=`` clone through
only when every volume of the source is on a shared storage, and the worker renames the new config
into the target node's directory at the end. The test puts the template there through
``POST /_sim/vms`` (a config naming ``ceph-vm:`` volumes), as an operator's template on Ceph.
"""

from __future__ import annotations

SHARED_TPL = {"vmid": 9200, "node": "pve1", "config": {
    "name": "debian-12-ceph", "template": "1", "cores": "1", "memory": "1024", "ostype": "l26",
    "scsihw": "virtio-scsi-single", "scsi0": "ceph-vm:base-9200-disk-0,size=2G",
    "ide2": "ceph-vm:vm-9200-cloudinit,media=cdrom", "boot": "order=scsi0",
    "net0": "virtio=BC:24:11:92:00:00,bridge=vmbr0", "agent": "1"}}


def test_ceph_vm_is_a_shared_images_storage_on_every_node(pve, admin):
    admin("post", "/vms", json=SHARED_TPL)
    for node in ("pve1", "pve2", "pve3"):
        st = {s["storage"]: s for s in pve.nodes(node).storage.get(content="images")}
        assert st["ceph-vm"]["shared"] == 1 and st["ceph-vm"]["type"] == "rbd" and st["local-lvm"]["shared"] == 0
        # one pool for the cluster: every node sees the template's volumes and the same usage
        vols = {v["volid"] for v in pve.nodes(node).storage("ceph-vm").content.get()}
        assert vols == {"ceph-vm:base-9200-disk-0", "ceph-vm:vm-9200-cloudinit"}
        assert st["ceph-vm"]["used"] == 2 * 1024**3 + 4 * 1024**2
    # Storage/Status.pm index with target=: only storages the target node shares
    assert "ceph-vm" in [s["storage"] for s in pve.nodes("pve1").storage.get(target="pve2")]
    rows = [r for r in pve.cluster.resources.get(type="storage") if r["storage"] == "ceph-vm"]
    assert sorted(r["node"] for r in rows) == ["pve1", "pve2", "pve3"] and {r["plugintype"] for r in rows} == {"rbd"}


def test_a_template_on_shared_storage_is_cloned_to_another_node(pve, admin, wait):
    admin("post", "/vms", json=SHARED_TPL)
    upid = pve.nodes("pve1").qemu(9200).clone.post(newid=160, name="web-2", full=1, target="pve2")
    assert upid.split(":")[1] == "pve1"  # the worker runs on the source node
    assert wait(upid)["exitstatus"] == "OK"
    cfg = pve.nodes("pve2").qemu(160).config.get()
    assert cfg["scsi0"] == "ceph-vm:vm-160-disk-0,size=2G" and cfg["ide2"].startswith("ceph-vm:vm-160-cloudinit")
    assert admin("get", "/state")["counters"]["tasks_started"].get("qmigrate", 0) == 0
    # the clone's disk is on the pool every node sees
    assert "ceph-vm:vm-160-disk-0" in {v["volid"] for v in pve.nodes("pve3").storage("ceph-vm").content.get()}


LOCAL_TPL = {"vmid": 9201, "node": "pve1", "config": {
    "name": "debian-12-lvm", "template": "1", "cores": "1", "memory": "1024", "ostype": "l26",
    "scsihw": "virtio-scsi-single", "scsi0": "local-lvm:base-9201-disk-0,size=2G",
    "ide2": "local-lvm:vm-9201-cloudinit,media=cdrom", "boot": "order=scsi0",
    "net0": "virtio=BC:24:11:92:01:00,bridge=vmbr0", "agent": "1"}}


def test_linked_clones_and_their_base_volumes_in_the_storage_content(pve, admin, wait):
    """A linked clone's disk and its template's base volume as the storage lists them. pve-storage
    RBDPlugin.pm clone_image names the clone "<base>/<name>" and list_images shows it so, with
    rbd's "parent" ("<base>@__base__"); LvmThinPlugin.pm clone_image names it "vm-<vmid>-disk-N"
    only (the file's header note: LVM thin does not track the relation) and list_images lists every
    (vm|base)-<owner>- LV — the template's base volume owned by the template."""
    admin("post", "/vms", json=SHARED_TPL)
    admin("post", "/vms", json=LOCAL_TPL)
    assert wait(pve.nodes("pve1").qemu(9200).clone.post(newid=170, name="rbd-linked", full=0))["exitstatus"] == "OK"
    assert wait(pve.nodes("pve1").qemu(9201).clone.post(newid=171, name="lvm-linked", full=0))["exitstatus"] == "OK"
    assert pve.nodes("pve1").qemu(170).config.get()["scsi0"].startswith("ceph-vm:base-9200-disk-0/vm-170-disk-0,")
    assert pve.nodes("pve1").qemu(171).config.get()["scsi0"].startswith("local-lvm:vm-171-disk-0,")
    rbd = {v["volid"]: v for v in pve.nodes("pve2").storage("ceph-vm").content.get(content="images")}
    assert rbd["ceph-vm:base-9200-disk-0"]["vmid"] == 9200 and "parent" not in rbd["ceph-vm:base-9200-disk-0"]
    clone = rbd["ceph-vm:base-9200-disk-0/vm-170-disk-0"]
    assert (clone["vmid"], clone["parent"], clone["name"], clone["format"]) == (170, "base-9200-disk-0@__base__",
                                                                               "vm-170-disk-0", "raw")
    lvm = {v["volid"]: v for v in pve.nodes("pve1").storage("local-lvm").content.get(content="images")}
    assert lvm["local-lvm:base-9201-disk-0"]["vmid"] == 9201
    assert lvm["local-lvm:vm-171-disk-0"]["vmid"] == 171 and "parent" not in lvm["local-lvm:vm-171-disk-0"]
    assert {v["volid"] for v in pve.nodes("pve1").storage("ceph-vm").content.get(vmid=170)} == {
        "ceph-vm:base-9200-disk-0/vm-170-disk-0", "ceph-vm:vm-170-cloudinit"}
