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
