"""The VM machinery (z9.executor.vms) for a kind that owns N VMs: members by tag, the spec's
desired config, the pure plan per member, and the removal plan over every member."""
from __future__ import annotations

import pytest

from z9.common.errors import GuardRefusal, Snooze
from z9.common.ids import new_id
from z9.common.tags import format_tags, identity_tag
from z9.executor import vms
from z9.executor.proxmox import VmRef, VmState


def _vm(vmid: int, tags: str, status: str = "running", **cfg: str) -> VmState:
    config = {"name": "x", "cores": "1", "memory": "1024", "scsi0": "local-lvm:vm-disk-0,size=10G", "tags": tags, **cfg}
    from z9.common.tags import normalize_tags

    return VmState(vmid=vmid, node="pve1", config=config, status=status, tags=normalize_tags(tags))


def _spec(owner: str, member: str, **over) -> vms.VmSpec:
    base = dict(owner=owner, member=member, name=f"lb-{member}", image="debian-12", cores=2, memory_mib=2048,
                disk_gib=10)
    base.update(over)
    return vms.VmSpec(**base)


def test_members_are_told_apart_by_tag_and_legacy_vms_are_main() -> None:
    owner = new_id("lb")
    assert vms.member_of(_vm(101, f"{identity_tag(owner)};z9-member-lb-1;z9-role-customer")) == "lb-1"
    assert vms.member_of(_vm(102, f"{identity_tag(owner)};z9-role-customer")) == "main"


def test_spec_desired_config_carries_owner_member_and_extra_keys() -> None:
    owner = new_id("k8s")
    spec = _spec(owner, "cp-0", config={"ipconfig0": "ip=203.0.113.7/24,gw=203.0.113.1", "nameserver": "1.1.1.1"})
    cfg = spec.desired_config()
    assert cfg["tags"] == format_tags({identity_tag(owner), "z9-member-cp-0", "z9-role-customer"})
    assert cfg["ipconfig0"] == "ip=203.0.113.7/24,gw=203.0.113.1" and cfg["nameserver"] == "1.1.1.1"
    assert cfg["protection"] == "1" and cfg["name"] == "lb-cp-0"
    assert spec.marker != vms.marker(owner) and vms.marker(owner) in spec.marker  # the guard's marker test


def test_plan_per_member_converges_and_waits_on_the_world() -> None:
    owner = new_id("lb")
    spec = _spec(owner, "lb-0")
    tpl = VmRef(vmid=9000, node="pve1", name="debian-12", status="stopped", tags=frozenset(), lock=None, template=True)
    assert [s.name for s in vms.plan_member(spec, vms.MemberWorld(template=tpl, vm=None))] == [
        "clone", "configure", "resize_disk", "start"]
    converged = _vm(105, spec.desired_config()["tags"], **{k: str(v) for k, v in spec.desired_config().items()
                                                           if k != "tags"})
    assert vms.plan_member(spec, vms.MemberWorld(template=None, vm=converged)) == []
    with pytest.raises(Snooze):  # a lost clone request may still land: never clone again meanwhile
        vms.plan_member(spec, vms.MemberWorld(template=tpl, vm=None, clone_in_flight_s=3.0))
    with pytest.raises(Snooze):  # no template of that name yet
        vms.plan_member(spec, vms.MemberWorld(template=None, vm=None))


def test_removal_plan_covers_every_member_and_keeps_the_guard() -> None:
    owner = new_id("k8s")
    a = _vm(101, format_tags(_spec(owner, "cp-0").tags))
    b = _vm(102, format_tags(_spec(owner, "worker-0").tags), status="stopped")
    steps = vms.plan_removal(owner, vms.Removal(ours=[a, b]))
    assert [(s.name, s.detail["vmid"]) for s in steps] == [("stop", 101), ("destroy", 101), ("destroy", 102)]
    platform = _vm(103, f"{identity_tag(owner)};z9-role-agent")
    with pytest.raises(GuardRefusal):
        vms.plan_removal(owner, vms.Removal(ours=[a, platform]))


def test_steps_are_values_bound_to_what_runs_them() -> None:
    """A plan's steps carry the kind that runs them (no name matched in an ``if`` chain); a step
    built by its name only finds its kind in the family; an unknown one is a permanent error."""
    from z9.common.errors import PermanentError
    from z9.executor.context import Step

    owner = new_id("srv")
    world = vms.MemberWorld(template=VmRef(vmid=9000, node="pve1", name="debian-12", status="stopped",
                                           tags=frozenset(), lock=None, template=True), vm=None)
    steps = vms.plan_member(_spec(owner, "main"), world)
    assert [s.name for s in steps] == ["clone", "configure", "resize_disk", "start"]
    assert [s.kind for s in steps] == [vms.CLONE, vms.CONFIGURE, vms.RESIZE_DISK, vms.START]
    assert vms.MEMBER_STEPS.of(Step("configure")) is vms.CONFIGURE
    assert vms.REMOVAL_STEPS.of(Step("destroy", {"vmid": 1, "node": "pve1"})) is vms.DESTROY
    with pytest.raises(PermanentError, match="unknown step 'destroy'"):
        vms.MEMBER_STEPS.of(Step("destroy"), "ServerCreate")
    with pytest.raises(PermanentError):
        vms.REMOVAL_STEPS.of(vms.START.step())  # a step of another family
