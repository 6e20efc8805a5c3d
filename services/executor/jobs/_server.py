"""What the server job kinds share: finding a server's VM by its identity tag, the deletion
guard, and the desired Proxmox config of a server.

Identity is the tag ``z9-id-<server id>``, never the vmid or the name (proxmox-api.md, "Where
peers broke" 3 and 4): a vmid is reused the moment a VM is destroyed, and names can be changed.
"""
from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import quote

from z9.common import store
from z9.common.errors import GuardRefusal, PermanentError, TemporaryError
from z9.common.models import Server
from z9.common.resources.server import SERVER
from z9.common.tags import (ROLE_CUSTOMER, customer_vm_tags, format_tags, identity_tag, normalize_tags,
                            platform_roles)

from ..context import JobContext, Step
from ..proxmox import VmLocked, VmState

log = logging.getLogger("z9.executor.jobs")

DISK_KEYS = tuple(f"{bus}{i}" for bus in ("scsi", "virtio", "sata", "ide") for i in range(6))
_SIZE_RE = re.compile(r"(?:^|,)size=(\d+(?:\.\d+)?)([KMGT]?)(?:,|$)")
_UNIT_GIB = {"K": 1 / (1024 * 1024), "M": 1 / 1024, "G": 1.0, "T": 1024.0, "": 1 / (1024 ** 3)}


async def find_vms(ctx: JobContext, resource_id: str) -> list[VmState]:
    """Every VM carrying ``resource_id``'s identity tag, each confirmed on its node (fresh
    config and tags). Raises TemporaryError when a tagged VM vanishes while being read."""
    tag = identity_tag(resource_id)
    out = []
    for ref in await ctx.pve.find_by_tag(tag):
        st = await ctx.pve.vm_state(ref.node, ref.vmid)
        if st is None:
            raise TemporaryError(f"VM {ref.vmid} carrying {tag} vanished from {ref.node} while observing")
        if tag not in st.tags:
            # The cluster list said tagged, the node says not (a write in between): look again.
            raise TemporaryError(f"VM {ref.vmid}: cluster list and node disagree about tag {tag}")
        out.append(st)
    return out


async def find_template(ctx: JobContext, image: str) -> VmState | None:
    """The template whose config is named ``image`` now. ``/cluster/resources`` has the template
    flag fresh but names from a stats cache that lags (proxmox-api.md): it only orders the
    candidates — the templates it lists under that name are read first — and each one's config on
    its node decides. None when no template has that name (yet)."""
    refs = sorted((v for v in await ctx.pve.list_vms() if v.template),
                  key=lambda v: (v.name != image, v.vmid))
    for ref in refs:
        st = await ctx.pve.vm_state(ref.node, ref.vmid)
        if st is not None and st.config.get("name") == image and str(st.config.get("template", "0")) == "1":
            return st
    return None


async def find_one_vm(ctx: JobContext, resource_id: str) -> VmState | None:
    """The single VM of ``resource_id`` or None. Raises PermanentError when several VMs carry
    its identity tag (a manual clone of a customer VM inherits its tags)."""
    vms = await find_vms(ctx, resource_id)
    if len(vms) > 1:
        where = ", ".join(f"{v.vmid} on {v.node}" for v in vms)
        raise PermanentError(f"{len(vms)} VMs carry {identity_tag(resource_id)} ({where}); "
                             "an operator must remove the extra ones")
    return vms[0] if vms else None


MEMBER = "main"  # a server's one VM


async def clone_memos(ctx: JobContext) -> list[store.CloneRequest]:
    """Every clone request recorded for this resource (one query)."""
    return await store.vm_clone_requests(ctx.pool, ctx.job.resource_id)


async def find_own_clones(ctx: JobContext, memos: list[store.CloneRequest], exclude: set[int]) -> list[VmState]:
    """VMs that a clone request of this resource made (vmid in ``memos``) but that are not tagged
    yet: recognised by our marker in their description — or, still under ``lock: clone`` (no
    description yet), only while *our* request may be the clone running there: its answer is not
    recorded yet (uncertain), or it was answered with a UPID whose task still runs. A locked VM
    at a vmid we asked for whose request was refused, failed or whose task has ended is someone
    else's clone; so is a VM carrying another resource's identity."""
    mine, out = identity_tag(ctx.job.resource_id), []
    for m in memos:
        if m.vmid in exclude:
            continue
        st = await ctx.pve.vm_state(m.node, m.vmid)
        if st is None or any(t.startswith("z9-id-") and t != mine for t in st.tags):
            continue
        if marker(ctx.job.resource_id) in str(st.config.get("description", "")):
            out.append(st)
        elif st.lock == "clone" and await _clone_in_flight(ctx, m):
            out.append(st)
    return out


async def _clone_in_flight(ctx: JobContext, m: store.CloneRequest) -> bool:
    """Whether our request ``m`` may be the clone running at its vmid now."""
    if m.uncertain_since is not None:
        return True  # no answer recorded: it may be ours
    if not m.upid:
        return False  # answered with an error: nothing of ours runs there
    try:
        return (await ctx.pve.task_status(m.node, m.upid)).get("status") == "running"
    except PermanentError:
        return False  # the node does not know our task (any more): not ours


def clone_uncertain_since(memos: list[store.CloneRequest]) -> float | None:
    """Epoch seconds of the latest clone request in ``memos`` without a recorded answer (it may
    still be performed), or None."""
    times = [m.uncertain_since for m in memos if m.uncertain_since is not None]
    return max(times) if times else None


def refuse_platform(resource_id: str, vm: VmState) -> None:
    """GuardRefusal when ``vm`` carries any platform role: z9 never changes such a VM."""
    if platform_roles(vm.tags):
        guard(resource_id, vm)


async def find_suspect(ctx: JobContext, server: Server | None, ours: list[VmState]) -> VmState | None:
    """The VM at the vmid/node the database last recorded for ``server``, when it is not one of
    ``ours``: a row can be stale and point at someone else's VM — or at a platform VM."""
    if server is None or server.vmid is None or any(v.vmid == server.vmid for v in ours):
        return None
    return await ctx.pve.vm_state(server.node, server.vmid)


def guard_suspect(resource_id: str, vm: VmState | None) -> None:
    """Refuse (GuardRefusal) when the recorded-but-untagged VM carries a platform role: a stale
    row pointed a destructive job at a platform VM. Any other untagged VM is simply not ours."""
    if vm is not None:
        refuse_platform(resource_id, vm)
        log.warning("resource %s: recorded VM %s on %s does not carry %s; not ours, leaving it alone",
                    resource_id, vm.vmid, vm.node, identity_tag(resource_id))


def guard(resource_id: str, vm: VmState) -> None:
    """The deletion guard (architecture §6): touch ``vm`` only when it carries this resource's
    identity tag and ``z9-role-customer``. Any platform role refuses unconditionally.

    Raises GuardRefusal (permanent) otherwise; logs at error level.
    """
    platform = platform_roles(vm.tags)
    if platform:
        msg = (f"deletion guard refused VM {vm.vmid} on {vm.node}: it carries platform role "
               f"{', '.join(sorted(platform))}")
    elif identity_tag(resource_id) not in vm.tags:
        msg = f"deletion guard refused VM {vm.vmid} on {vm.node}: it does not carry {identity_tag(resource_id)}"
    elif ROLE_CUSTOMER not in vm.tags:
        msg = f"deletion guard refused VM {vm.vmid} on {vm.node}: it does not carry {ROLE_CUSTOMER}"
    else:
        return
    log.error("%s (resource %s)", msg, resource_id)
    raise GuardRefusal(msg)


def guard_own_clone(resource_id: str, vm: VmState) -> None:
    """The guard for an untagged clone of ours: our marker must be in its description, and any
    platform role (inherited from a template that carries one) refuses unconditionally."""
    refuse_platform(resource_id, vm)
    if marker(resource_id) not in str(vm.config.get("description", "")):
        msg = f"deletion guard refused VM {vm.vmid} on {vm.node}: it does not carry our marker"
        log.error("%s (resource %s)", msg, resource_id)
        raise GuardRefusal(msg)


async def record_failure(conn: Any, ctx: JobContext, error: dict[str, Any]) -> None:
    """The server carries a failed job's reason (``ResourceType.mark_failed_by_job``)."""
    await SERVER.mark_failed_by_job(conn, ctx.job.resource_id, error["message"], kind=ctx.job.kind,
                                    refused=bool(error.get("refused")))


def refuse_if_locked(vm: VmState, *, allowed: tuple[str, ...] = ()) -> None:
    """Snooze (without spending an attempt) while another task holds the VM's config lock."""
    if vm.lock and vm.lock not in allowed:
        raise VmLocked(f"VM {vm.vmid} is locked ({vm.lock}); waiting for the other task")


async def reread_guarded(ctx: JobContext, vm: VmState) -> VmState:
    """Read ``vm`` again right before acting on it and re-apply the guard and the lock check.
    Raises TemporaryError when it is gone, GuardRefusal, or VmLocked."""
    st = await ctx.pve.vm_state(vm.node, vm.vmid)
    if st is None:
        raise TemporaryError(f"VM {vm.vmid} disappeared from {vm.node}")
    guard(ctx.job.resource_id, st)
    refuse_if_locked(st)
    return st


async def ensure_running(ctx: JobContext, step: Step, vm: VmState) -> None:
    """Start ``vm`` unless it runs, and wait for the task. A start task failing with ``VM n
    already running`` means someone else started it: done (proxmox-api.md, Endpoints)."""
    if vm.running:
        return
    await ctx.fence()
    upid = await ctx.pve.start(vm.node, vm.vmid)
    try:
        await ctx.wait_task(step, upid)
    except TemporaryError as e:
        if "already running" not in str(e):
            raise


def boot_disk(config: dict[str, Any]) -> tuple[str, float] | None:
    """``(key, size in GiB)`` of the first data disk (not a cloud-init drive or CD-ROM)."""
    for key in DISK_KEYS:
        val = config.get(key)
        if not isinstance(val, str) or "media=cdrom" in val or "cloudinit" in val:
            continue
        m = _SIZE_RE.search(val)
        if m:
            return key, float(m.group(1)) * _UNIT_GIB[m.group(2)]
    return None


def encode_ssh_keys(keys: list[str]) -> str:
    """Proxmox's ``sshkeys`` value: the keys joined by newlines, URL-encoded with every space
    and newline percent-encoded (proxmox-api.md, "Cloud-init")."""
    return quote("\n".join(keys) + "\n", safe="")


def marker(resource_id: str) -> str:
    """Text put in a new VM's description so an attempt can recognise its own half-made clone
    before the identity tag is set."""
    return f"z9 resource {resource_id} ({identity_tag(resource_id)})"


def desired_config(resource_id: str, args: dict[str, Any]) -> dict[str, Any]:
    """The config keys z9 owns on a server's VM, in Proxmox's stored form."""
    cfg: dict[str, Any] = {
        "name": args["name"],
        "cores": int(args["cores"]),
        "memory": str(int(args["memory_mib"])),
        "tags": format_tags(customer_vm_tags(resource_id)),
        # a primary address from a pool (the API put it in the args: issue 8), else DHCP
        "ipconfig0": args.get("ipconfig0") or "ip=dhcp",
        # Proxmox refuses to destroy a protected VM ("protection mode enabled"): a destroy
        # request of someone else's that lands late on a reused vmid cannot remove this VM.
        # Only ServerDelete lifts it, right before its own destroy.
        "protection": "1",
    }
    if args.get("ssh_keys"):
        cfg["sshkeys"] = encode_ssh_keys(args["ssh_keys"])
    if args.get("nameserver"):
        cfg["nameserver"] = args["nameserver"]
    return cfg


ADDRESS_TAG_PREFIX = "z9-addr-"  # an address's tag on the VM it is on: the address jobs own it


def config_diff(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """The desired keys whose current value differs (tags compared as normalised sets)."""
    out = {}
    for k, v in desired.items():
        cur = current.get(k)
        if k == "tags":
            # the address tags (z9-addr-…) are the address jobs': kept, never compared
            keep = {t for t in normalize_tags(cur) if t.startswith(ADDRESS_TAG_PREFIX)}
            if normalize_tags(cur) - keep != normalize_tags(v):
                out[k] = format_tags(normalize_tags(v) | keep)
        elif str(cur) != str(v):
            out[k] = v
    return out
