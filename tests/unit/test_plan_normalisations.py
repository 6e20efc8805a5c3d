"""No phantom drift: the VM machinery's plan (``z9.executor.vms.plan_member``, what every owner of VMs plans
and previews) compares values in the form PVE keeps them — tags as a lower-case set whatever their order
and separator, the NIC's property string by key (its MAC in any case), disk sizes in K/M/G/T, keys PVE fills
in never — and a real difference is named as drift (path, want, have) on the step that fixes it."""
from __future__ import annotations

from z9.common.tags import format_tags
from z9.executor import vms
from z9.executor.context import Drift
from z9.executor.proxmox import VmState

OWNER = "srv_01jd00000000000000000000aa"
SPEC = vms.VmSpec(owner=OWNER, member=vms.MAIN, name="web-1", image="debian-12", cores=2, memory_mib=2048,
                  disk_gib=10, firewall=None)


def _world(**config: str) -> vms.MemberWorld:
    cfg = {**SPEC.desired_config(), "scsi0": "local-lvm:vm-100-disk-0,size=10G",
           "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0", "digest": "d",
           # what PVE fills in by itself: never compared
           "smbios1": "uuid=6c4f0b7e-0000-4000-8000-000000000001", "vmgenid": "0b0c-0d", "meta": "creation-qemu=9.0.2"}
    cfg.update(config)
    from z9.common.tags import normalize_tags

    vm = VmState(vmid=100, node="pve1", config=cfg, status="running", tags=normalize_tags(cfg.get("tags")))
    return vms.MemberWorld(template=None, vm=vm)


def test_an_untouched_vm_plans_nothing() -> None:
    assert vms.plan_member(SPEC, _world()) == []


def test_tags_in_another_order_case_and_separator_are_no_drift() -> None:
    tags = sorted(SPEC.tags, reverse=True)
    assert vms.plan_member(SPEC, _world(tags=",".join(t.upper() for t in tags))) == []
    assert vms.plan_member(SPEC, _world(tags=" ".join(tags))) == []


def test_property_string_order_mac_case_and_sizes_in_m_are_no_drift() -> None:
    assert vms.plan_member(SPEC, _world(net0="bridge=vmbr0,virtio=bc:24:11:00:00:01",
                                        scsi0="local-lvm:vm-100-disk-0,size=10240M")) == []
    firewalled = vms.VmSpec(**{**SPEC.__dict__, "firewall": vms.FirewallSpec()})
    world = _world(net0="firewall=1,bridge=vmbr0,virtio=bc:24:11:00:00:01")
    world.firewall_drift, world.firewall_drifts = [], []
    assert vms.plan_member(firewalled, world) == []


def test_a_real_difference_is_the_drift_of_the_step_that_fixes_it() -> None:
    steps = vms.plan_member(SPEC, _world(cores="4", tags=format_tags(SPEC.tags - {"z9-role-customer"})))
    assert [s.name for s in steps] == ["configure"]
    assert steps[0].drift == [Drift("config.cores", 2, 4),
                              Drift("config.tags", sorted(SPEC.tags), sorted(SPEC.tags - {"z9-role-customer"}))]
    assert not steps[0].interrupts and "pending until the VM's next boot" in steps[0].why  # running: no hotplug
    smaller = vms.plan_member(SPEC, _world(scsi0="local-lvm:vm-100-disk-0,size=8G"))
    assert [(s.name, s.drift) for s in smaller] == [("resize_disk", [Drift("config.scsi0.size_gib", 10, 8.0)])]


def test_a_stopped_vm_plans_its_start_and_the_removal_steps_interrupt_the_guest() -> None:
    world = _world()
    assert world.vm is not None
    world.vm = VmState(vmid=100, node="pve1", config=world.vm.config, status="stopped", tags=world.vm.tags)
    [start] = vms.plan_member(SPEC, world)
    assert start.name == "start" and start.drift == [Drift("power.main", "running", "stopped")]
    assert not start.interrupts
    assert vms.STOP.disruptive and vms.DESTROY.disruptive
