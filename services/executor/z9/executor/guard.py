"""The deletion guard (architecture §6), security-critical: z9 changes or destroys a VM only when
it carries the resource's identity tag ``z9-id-<owner>`` and ``z9-role-customer``; any platform
role (``z9-role-agent``, ``z9-role-platform``, any ``z9-role-*`` but customer) refuses
unconditionally, whatever the job says — a permanent :class:`GuardRefusal`, logged at error
level (the executor counts it: ``z9_deletion_guard_refusals_total``).

A half-made clone of ours (not tagged yet) is recognised by its description's :func:`marker`
instead, and still refused when it inherited a platform role from its template. A VM at a
(vmid, node) the database recorded but that carries no tag of ours is not ours: left alone —
refused when it is a platform VM (:func:`guard_suspect`). Right before acting, a VM is read again
and checked again (:func:`reread_guarded`); a VM whose config another task locks is waited for
(:func:`refuse_if_locked`, a snooze).

Kept apart from the VM machinery (:mod:`z9.executor.vms`), which calls it before every
destructive step, so that what decides "may z9 touch this VM" is one short module with its own
tests (tests/unit/test_deletion_guard.py). What another resource type keeps on a VM that is not the
VM's own (a volume's disk on a server) is guarded by that type, through the registry
(:func:`z9.resources.refuse_vm_destroy`, called before every destroy).
"""
from __future__ import annotations

import logging
import re
from typing import Any

from z9.common.errors import GuardRefusal, TemporaryError
from z9.common.tags import ROLE_CUSTOMER, identity_tag, platform_roles

from .context import JobContext
from .proxmox import VmLocked, VmState

log = logging.getLogger("z9.executor.vms")  # the guard's refusals log where they always did

MAIN = "main"  # the member name of a resource's only VM


def marker(owner: str, member: str = MAIN) -> str:
    """Text put in a new VM's description so an attempt can recognise its own half-made clone
    before the identity tag is set."""
    base = f"z9 resource {owner} ({identity_tag(owner)})"
    return base if member == MAIN else f"{base} member {member}"


def carries_marker(description: Any, owner: str, member: str = MAIN) -> bool:
    """Whether a VM's description holds the marker of exactly (``owner``, ``member``): the marker
    of member ``a-1`` is a prefix of member ``a-1-0``'s (and ``workers-1`` of ``workers-10``'s), so
    it must not be followed by another character of a member name. PVE recycles vmids: a clone
    request of a removed member can name a sibling's VM."""
    return re.search(re.escape(marker(owner, member)) + r"(?![a-z0-9-])", str(description or "")) is not None



def refuse_platform(owner: str, vm: VmState) -> None:
    """GuardRefusal when ``vm`` carries any platform role: z9 never changes such a VM."""
    if platform_roles(vm.tags):
        guard(owner, vm)


def guard_suspect(owner: str, vm: VmState | None) -> None:
    """Refuse (GuardRefusal) when the recorded-but-untagged VM carries a platform role: a stale
    row pointed a destructive job at a platform VM. Any other untagged VM is simply not ours."""
    if vm is not None:
        refuse_platform(owner, vm)
        log.warning("resource %s: recorded VM %s on %s does not carry %s; not ours, leaving it alone",
                    owner, vm.vmid, vm.node, identity_tag(owner))


def guard(owner: str, vm: VmState) -> None:
    """The deletion guard (architecture §6): touch ``vm`` only when it carries ``owner``'s
    identity tag and ``z9-role-customer``. Any platform role refuses unconditionally.

    Raises GuardRefusal (permanent) otherwise; logs at error level.
    """
    platform = platform_roles(vm.tags)
    if platform:
        msg = (f"deletion guard refused VM {vm.vmid} on {vm.node}: it carries platform role "
               f"{', '.join(sorted(platform))}")
    elif identity_tag(owner) not in vm.tags:
        msg = f"deletion guard refused VM {vm.vmid} on {vm.node}: it does not carry {identity_tag(owner)}"
    elif ROLE_CUSTOMER not in vm.tags:
        msg = f"deletion guard refused VM {vm.vmid} on {vm.node}: it does not carry {ROLE_CUSTOMER}"
    else:
        return
    log.error("%s (resource %s)", msg, owner)
    raise GuardRefusal(msg)


def guard_own_clone(owner: str, vm: VmState) -> None:
    """The guard for an untagged clone of ours: a marker of ``owner`` must be in its description,
    and any platform role (inherited from a template that carries one) refuses unconditionally."""
    refuse_platform(owner, vm)
    if marker(owner) not in str(vm.config.get("description", "")):
        msg = f"deletion guard refused VM {vm.vmid} on {vm.node}: it does not carry our marker"
        log.error("%s (resource %s)", msg, owner)
        raise GuardRefusal(msg)


def refuse_if_locked(vm: VmState, *, allowed: tuple[str, ...] = ()) -> None:
    """Snooze (without spending an attempt) while another task holds the VM's config lock."""
    if vm.lock and vm.lock not in allowed:
        raise VmLocked(f"VM {vm.vmid} is locked ({vm.lock}); waiting for the other task")


async def reread_guarded(ctx: JobContext, owner: str, vm: VmState) -> VmState:
    """Read ``vm`` again right before acting on it and re-apply the guard and the lock check.
    Raises TemporaryError when it is gone, GuardRefusal, or VmLocked."""
    st = await ctx.pve.vm_state(vm.node, vm.vmid)
    if st is None:
        raise TemporaryError(f"VM {vm.vmid} disappeared from {vm.node}")
    guard(owner, st)
    refuse_if_locked(st)
    return st
