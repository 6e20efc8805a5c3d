"""The simulator's VM disks as PVE handles them: allocation from ``STORAGE:SIZE``, hot-plug into a running
VM (the guest sees it: lsblk, /dev/disk/by-id), detach to ``unusedN``, ``delete unusedN`` (the owner frees,
another VM only forgets), ``move_disk`` with ``target-vmid`` (reassign, PVE >= 7.2), online grow, the
storage's content, destroy freeing owned volumes only. Sources in each test's docstring."""

from __future__ import annotations

import json

import pytest
from proxmoxer import ResourceException

from .test_sim_guest import agent_exec, clone, until


def err(call) -> ResourceException:
    with pytest.raises(ResourceException) as e:
        call()
    return e.value


def running_vm(pve, wait, vmid: int):
    clone(pve, wait, newid=vmid, name=f"web-{vmid}")
    vm = pve.nodes("pve1").qemu(vmid)
    assert wait(vm.status.start.post())["exitstatus"] == "OK"
    until(lambda: vm.agent.ping.post() is not None)
    return vm


def lsblk(vm) -> dict[str, dict]:
    out = agent_exec(vm, ["lsblk", "-J", "-b", "-d", "-o", "NAME,SIZE,SERIAL,TYPE"])
    assert out["exitcode"] == 0, out
    return {d["serial"]: d for d in json.loads(out["out-data"])["blockdevices"] if d["type"] == "disk"}


def content(pve, storage="ceph-vm", node="pve1") -> dict[str, dict]:
    return {r["volid"]: r for r in pve.nodes(node).storage(storage).content.get(content="images")}


def test_hotplug_a_new_disk_the_guest_sees_it_by_serial_then_detach_leaves_unused(pve, wait):
    """Qemu.pm $update_vm_api + create_disks: ``ceph-vm:10,serial=…`` allocates vm-<id>-disk-<n> and, the
    disk hotplug feature being on by default (QemuServer.pm parse_hotplug_features), plugs it into the
    running VM (vmconfig_hotplug_pending); the guest's kernel names it and udev links it by serial. A
    ``delete=scsi1`` unplugs it (vmconfig_delete_or_detach_drive → vmconfig_register_unused_drive)."""
    vm = running_vm(pve, wait, 201)
    assert wait(vm.config.post(scsi1="ceph-vm:10,serial=z9v01abc"))["exitstatus"] == "OK"
    cfg = vm.config.get()
    assert cfg["scsi1"] == "ceph-vm:vm-201-disk-0,serial=z9v01abc,size=10G"
    disks = lsblk(vm)
    assert disks["z9v01abc"]["size"] == 10 * 1024**3 and disks["z9v01abc"]["name"] == "sdb"
    assert disks["drive-scsi0"]["name"] == "sda"  # the boot disk without a serial: its drive id
    links = agent_exec(vm, ["ls", "/dev/disk/by-id"])["out-data"].split()
    assert "scsi-0QEMU_QEMU_HARDDISK_z9v01abc" in links
    assert agent_exec(vm, ["readlink", "-f", "/dev/disk/by-id/scsi-0QEMU_QEMU_HARDDISK_z9v01abc"])[
        "out-data"].strip() == "/dev/sdb"
    assert content(pve)["ceph-vm:vm-201-disk-0"]["vmid"] == 201

    assert wait(vm.config.post(delete="scsi1"))["exitstatus"] == "OK"
    cfg = vm.config.get()
    assert "scsi1" not in cfg and cfg["unused0"] == "ceph-vm:vm-201-disk-0"
    assert "z9v01abc" not in lsblk(vm)
    # the volume stays, with its size, while unused
    assert content(pve)["ceph-vm:vm-201-disk-0"]["size"] == 10 * 1024**3


def test_online_grow_the_guest_sees_the_new_size(pve, wait):
    """Qemu.pm resize_vm on a running VM: QMP block_resize, the guest's disk grows at once; a shrink fails
    in the task (``shrinking disks is not supported``)."""
    vm = running_vm(pve, wait, 202)
    assert wait(vm.config.post(scsi1="ceph-vm:4,serial=z9vgrow"))["exitstatus"] == "OK"
    assert wait(vm.resize.put(disk="scsi1", size="6G"))["exitstatus"] == "OK"
    assert lsblk(vm)["z9vgrow"]["size"] == 6 * 1024**3
    assert "shrinking" in wait(vm.resize.put(disk="scsi1", size="5G"))["exitstatus"]


def test_delete_unused_the_owner_frees_the_volume_another_vm_leaves_an_orphan(pve, wait):
    """QemuServer.pm try_deallocate_drive (``delete=unusedN``, applied at once even on a running VM):
    ``vm_is_volid_owner`` → vdisk_free; "If vm is not owner of this disk remove from config" → the
    volume stays on its storage, listed with its owner's vmid (an orphan)."""
    vm = running_vm(pve, wait, 203)
    assert wait(vm.config.post(scsi1="ceph-vm:2"))["exitstatus"] == "OK"
    assert wait(vm.config.post(delete="scsi1"))["exitstatus"] == "OK"
    assert "ceph-vm:vm-203-disk-0" in content(pve)
    vm.config.put(delete="unused0")
    assert "unused0" not in vm.config.get() and "ceph-vm:vm-203-disk-0" not in content(pve)

    # VM 204 references 203's volume (e.g. written by hand): deleting it there frees nothing
    assert wait(vm.config.post(scsi2="ceph-vm:3"))["exitstatus"] == "OK"  # vm-203-disk-0 again
    clone(pve, wait, newid=204, name="other")
    other = pve.nodes("pve1").qemu(204)
    other.config.put(unused0="ceph-vm:vm-203-disk-0")
    other.config.put(delete="unused0")
    assert "ceph-vm:vm-203-disk-0" in content(pve)


def test_move_disk_reassigns_a_volume_to_another_vm_without_copying(pve, wait):
    """Qemu.pm move_vm_disk with ``target-vmid`` (PVE >= 7.2): checks before the task (same node, the
    source stopped unless the disk is ``unusedN``, the target key free), then a ``qmmove`` task renames
    the volume to the target's free name (PVE::Storage::rename_volume) and writes it to the target —
    through $update_vm_api, so a running target hot-plugs it; the drive's ``serial=`` comes along."""
    holder = pve.nodes("pve1").qemu(300)
    upid = pve.nodes("pve1").qemu.post(vmid=300, name="vol-holder", scsihw="virtio-scsi-single",
                                       scsi0="ceph-vm:5,serial=z9vmove", tags="z9-id-vol-x")
    assert wait(upid)["exitstatus"] == "OK"
    assert holder.config.get()["scsi0"] == "ceph-vm:vm-300-disk-0,serial=z9vmove,size=5G"
    web = running_vm(pve, wait, 205)

    e = err(lambda: pve.nodes("pve1").qemu(205).move_disk.post(disk="scsi0", **{"target-vmid": 300,
                                                                              "target-disk": "scsi3"}))
    assert "Cannot move disk to another VM while the source VM is running - detach first" in e.content
    e = err(lambda: holder.move_disk.post(disk="scsi0", **{"target-vmid": 205, "target-disk": "scsi0"}))
    assert e.content == "Target disk key 'scsi0' is already in use for VM '205'"
    e = err(lambda: holder.move_disk.post(disk="scsi0"))
    assert e.status_code == 400 and "either needs to be set" in e.errors["target-vmid"]

    upid = holder.move_disk.post(disk="scsi0", **{"target-vmid": 205, "target-disk": "scsi1"})
    assert ":qmmove:300-scsi0>205-scsi1:" in upid
    assert wait(upid)["exitstatus"] == "OK"
    assert "scsi0" not in holder.config.get()
    assert web.config.get()["scsi1"] == "ceph-vm:vm-205-disk-0,serial=z9vmove,size=5G"
    assert lsblk(web)["z9vmove"]["size"] == 5 * 1024**3
    assert content(pve)["ceph-vm:vm-205-disk-0"]["vmid"] == 205 and "ceph-vm:vm-300-disk-0" not in content(pve)

    # back: unplug on the running VM (unused0), then reassign the unused disk (allowed while running)
    assert wait(web.config.post(delete="scsi1"))["exitstatus"] == "OK"
    assert web.config.get()["unused0"] == "ceph-vm:vm-205-disk-0"
    upid = web.move_disk.post(disk="unused0", **{"target-vmid": 300, "target-disk": "scsi0"})
    assert wait(upid)["exitstatus"] == "OK"
    assert holder.config.get()["scsi0"] == "ceph-vm:vm-300-disk-0,size=5G"  # the serial stayed behind
    assert "unused0" not in web.config.get()

    # both VMs on one node only
    assert wait(pve.nodes("pve1").qemu(205).status.stop.post())["exitstatus"] == "OK"
    assert wait(pve.nodes("pve1").qemu(205).migrate.post(target="pve2"))["exitstatus"] == "OK"
    e = err(lambda: holder.move_disk.post(disk="scsi0", **{"target-vmid": 205, "target-disk": "scsi1"}))
    assert e.content == "Both VMs need to be on the same node (pve1 != pve2)"


def test_destroy_frees_owned_volumes_and_leaves_another_owners(pve, wait):
    """QemuServer.pm destroy_vm ``$remove_owned_drive``: only volumes the VM owns are freed; a volume of
    no config (an orphan: here one a non-owner dropped, try_deallocate_drive) is listed with its owner's
    vmid and freed by its owner's destroy with ``destroy-unreferenced-disks=1`` (``$purge_unreferenced``)."""
    assert wait(pve.nodes("pve1").qemu.post(vmid=301, name="a", scsi0="ceph-vm:1"))["exitstatus"] == "OK"
    assert wait(pve.nodes("pve1").qemu.post(vmid=302, name="b", scsi0="ceph-vm:1",
                                            scsi1="ceph-vm:vm-301-disk-0,size=1G"))["exitstatus"] == "OK"
    assert wait(pve.nodes("pve1").qemu(302).delete())["exitstatus"] == "OK"
    vols = content(pve)
    assert "ceph-vm:vm-302-disk-0" not in vols and vols["ceph-vm:vm-301-disk-0"]["vmid"] == 301

    assert wait(pve.nodes("pve1").qemu.post(vmid=303, name="c", unused0="ceph-vm:vm-399-disk-0"))[
        "exitstatus"] == "OK"
    pve.nodes("pve1").qemu(303).config.put(delete="unused0")  # not 303's: forgotten, not freed
    assert content(pve)["ceph-vm:vm-399-disk-0"]["vmid"] == 399
    assert wait(pve.nodes("pve1").qemu.post(vmid=399, name="owner"))["exitstatus"] == "OK"
    assert wait(pve.nodes("pve1").qemu(399).delete(**{"destroy-unreferenced-disks": 1}))["exitstatus"] == "OK"
    assert wait(pve.nodes("pve1").qemu(301).delete())["exitstatus"] == "OK"
    assert not [v for v in content(pve) if v.startswith(("ceph-vm:vm-30", "ceph-vm:vm-399"))]
