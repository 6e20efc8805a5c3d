"""The deletion guard (z9.executor.guard) on hand-built VMs: z9 touches a VM only when it carries
the resource's identity tag and ``z9-role-customer``; any platform role refuses whatever else it
carries; a half-made clone of ours is known by its marker; a VM is read and checked again right
before z9 acts on it."""
from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from z9.common.errors import GuardRefusal, Snooze, TemporaryError
from z9.common.ids import new_id
from z9.common.tags import ROLE_AGENT, ROLE_CUSTOMER, ROLE_PLATFORM, identity_tag, normalize_tags
from z9.executor import guard
from z9.executor.proxmox import VmLocked, VmState


def _vm(tags: str, *, vmid: int = 101, description: str = "", **cfg: str) -> VmState:
    config = {"name": "x", "tags": tags, "description": description, **cfg}
    return VmState(vmid=vmid, node="pve1", config=config, status="running", tags=normalize_tags(tags))


def _own(owner: str, *extra: str) -> VmState:
    return _vm(";".join([identity_tag(owner), ROLE_CUSTOMER, *extra]))


def test_a_vm_carrying_the_identity_and_the_customer_role_passes() -> None:
    owner = new_id("srv")
    guard.guard(owner, _own(owner))
    guard.guard(owner, _own(owner, "z9-member-lb-0", "some-user-tag"))


@pytest.mark.parametrize("tags, says", [
    ("", "does not carry z9-id-"),
    (ROLE_CUSTOMER, "does not carry z9-id-"),
    ("{own}", f"does not carry {ROLE_CUSTOMER}"),
    (f"z9-id-srv_{'0' * 26};{ROLE_CUSTOMER}", "does not carry z9-id-"),  # another resource's VM
])
def test_a_vm_without_the_identity_or_the_customer_role_is_refused(tags: str, says: str,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    owner = new_id("srv")
    with caplog.at_level(logging.ERROR, logger="z9.executor.vms"), pytest.raises(GuardRefusal) as ei:
        guard.guard(owner, _vm(tags.replace("{own}", identity_tag(owner))))
    assert says in str(ei.value)
    assert any(r.levelno == logging.ERROR and owner in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("role", [ROLE_AGENT, ROLE_PLATFORM, "z9-role-dns", "z9-role-anything-new"])
def test_any_platform_role_refuses_unconditionally(role: str) -> None:
    owner = new_id("srv")
    vm = _own(owner, role)  # identity and customer role too: still refused
    with pytest.raises(GuardRefusal) as ei:
        guard.guard(owner, vm)
    assert role in str(ei.value)
    with pytest.raises(GuardRefusal):
        guard.refuse_platform(owner, vm)
    with pytest.raises(GuardRefusal):
        guard.guard_suspect(owner, vm)
    with pytest.raises(GuardRefusal):
        guard.guard_own_clone(owner, _vm(role, description=guard.marker(owner)))


def test_refuse_platform_lets_any_other_vm_through() -> None:
    owner = new_id("lb")
    guard.refuse_platform(owner, _vm(""))
    guard.refuse_platform(owner, _vm("someone-else"))


def test_a_recorded_vm_not_ours_is_left_alone(caplog: pytest.LogCaptureFixture) -> None:
    owner = new_id("srv")
    guard.guard_suspect(owner, None)
    with caplog.at_level(logging.WARNING, logger="z9.executor.vms"):
        guard.guard_suspect(owner, _vm("someone-else"))
    assert any("not ours" in r.getMessage() for r in caplog.records)


def test_an_untagged_clone_is_ours_only_by_its_marker() -> None:
    owner = new_id("k8s")
    guard.guard_own_clone(owner, _vm("", description=f"made by z9: {guard.marker(owner)}"))
    with pytest.raises(GuardRefusal, match="marker"):
        guard.guard_own_clone(owner, _vm("", description=guard.marker(new_id("k8s"))))
    with pytest.raises(GuardRefusal, match="marker"):
        guard.guard_own_clone(owner, _vm(""))


def test_a_member_marker_is_not_a_prefix_match() -> None:
    owner = new_id("k8s")
    assert guard.carries_marker(guard.marker(owner, "workers-1"), owner, "workers-1")
    assert not guard.carries_marker(guard.marker(owner, "workers-10"), owner, "workers-1")
    assert not guard.carries_marker(guard.marker(owner, "a-1-0"), owner, "a-1")
    assert guard.carries_marker(guard.marker(owner), owner)
    assert not guard.carries_marker(None, owner)


def test_a_locked_vm_is_waited_for() -> None:
    owner = new_id("srv")
    with pytest.raises(Snooze) as ei:
        guard.refuse_if_locked(_vm(identity_tag(owner), lock="backup"))
    assert isinstance(ei.value, VmLocked) and "backup" in str(ei.value)
    guard.refuse_if_locked(_vm("", lock="backup"), allowed=("backup",))
    guard.refuse_if_locked(_vm(""))


class _Pve:
    def __init__(self, answer: VmState | None):
        self.answer = answer
        self.reads: list[tuple[str, int]] = []

    async def vm_state(self, node: str, vmid: int) -> VmState | None:
        self.reads.append((node, vmid))
        return self.answer


def _ctx(pve: Any) -> Any:
    return SimpleNamespace(pve=pve)


async def test_a_vm_is_read_and_checked_again_right_before_acting() -> None:
    owner = new_id("srv")
    seen = _own(owner)
    pve = _Pve(_own(owner))
    assert (await guard.reread_guarded(_ctx(pve), owner, seen)).vmid == seen.vmid
    assert pve.reads == [("pve1", 101)]
    # between observe and apply someone re-tagged it as a platform VM: refused
    with pytest.raises(GuardRefusal):
        await guard.reread_guarded(_ctx(_Pve(_own(owner, ROLE_PLATFORM))), owner, seen)
    # or took our identity off
    with pytest.raises(GuardRefusal):
        await guard.reread_guarded(_ctx(_Pve(_vm(ROLE_CUSTOMER))), owner, seen)
    # or it is gone (a temporary error: observe looks again next attempt)
    with pytest.raises(TemporaryError):
        await guard.reread_guarded(_ctx(_Pve(None)), owner, seen)
    # or another task holds its lock: waited for
    with pytest.raises(Snooze):
        await guard.reread_guarded(_ctx(_Pve(_vm(f"{identity_tag(owner)};{ROLE_CUSTOMER}", lock="migrate"))),
                                   owner, seen)
