"""The ``firewall`` resource type: a tenant's rule set (Hetzner Cloud's shape: ``direction``, ``protocol``,
``port``, ``source_ips``/``destination_ips``) applied to servers of its region, directly or by label
selector, that z9 compiles into each member server's own VM firewall (:mod:`.compile`). Its slice is
this folder (``resources/z9/resources/firewall/``): the type, its kind names, its hooks; its row model in
``model.py``, its SQL in ``queries.sql`` and its store in ``store.py``; its API in ``api.py``, its jobs in
``jobs/`` (one module per kind, one reconciler in ``jobs/shared.py``), its client commands in ``client.py``;
its tables are ``db/z9/db/migrations/0027_firewalls.sql``.

What it keeps on a server's VM (:class:`~z9.resources.VmParts`): the rules commented ``z9 firewall <id>:``
and the policies ``policy_in``/``policy_out`` DROP while a firewall applies. It says so through the VM
parts hook (:func:`vm_contribution`), so *every* job that converges a server's VM firewall — the server's
create, start, reboot, resize, and the firewall's own jobs — writes the same whole list, beside the
server kind's platform rules.
"""
from __future__ import annotations

from typing import Any

from z9.resources import (
    FirewallContribution,
    Immediate,
    ResourceType,
    VmParts,
    on_create,
    on_deletion,
    on_final_delete,
    on_relabel,
    on_restore,
    register,
)
from z9.resources.firewall.compile import RULE_PREFIX, compile_server
from z9.resources.firewall.model import Firewall

STATUSES = ("creating", "active", "deleting", "destroying", "deleted", "failed")

# the kind names (the jobs' ``kind`` column): the type's own, named here and nowhere else
FIREWALL_CREATE = "FirewallCreate"
FIREWALL_SET_RULES = "FirewallSetRules"
FIREWALL_APPLY = "FirewallApplyToResources"
FIREWALL_REMOVE = "FirewallRemoveFromResources"
FIREWALL_DELETE = "FirewallDelete"

MAIN = "main"  # a server's one VM (the VM machinery's member name)


async def vm_contribution(db: Any, owner: str, member: str) -> FirewallContribution | None:
    """What the firewalls applied to server ``owner`` write on its VM now (None: no firewall applies, or
    the VM is not a server's): their compiled rules, ``policy_in`` DROP, ``policy_out`` DROP once any of
    them has an ``out`` rule."""
    if member != MAIN:
        return None
    rows = await store.of_server(db, owner)
    compiled = compile_server([(f.id, list(f.rules)) for f in rows])
    if compiled is None:
        return None
    return FirewallContribution(rules=compiled.rules, policy_in=compiled.policy_in, policy_out=compiled.policy_out)


FIREWALL: ResourceType[Firewall] = register(ResourceType(
    name="firewall", prefix="fw", table="firewalls", model=Firewall,
    kinds=(FIREWALL_CREATE, FIREWALL_SET_RULES, FIREWALL_APPLY, FIREWALL_REMOVE, FIREWALL_DELETE),
    deletion=Immediate(final_kind=FIREWALL_DELETE), statuses=STATUSES, order=60,
    vm_parts=VmParts(firewall_rules=(RULE_PREFIX,), firewall_options=("policy_in", "policy_out"),
                     firewall=vm_contribution),
    pve_endpoints=("GET /cluster/firewall/ipset", "POST /cluster/firewall/ipset",
                   "GET /cluster/firewall/ipset/{name}", "POST /cluster/firewall/ipset/{name}",
                   "DELETE /cluster/firewall/ipset/{name}", "DELETE /cluster/firewall/ipset/{name}/{cidr}"),
))


# ---------------------------------------------------------------- store (store.py, queries.sql)

from z9.resources.firewall import store

# ---------------------------------------------------------------- servers created, servers deleted

async def server_created(conn: Any, server: Any, spec: Any, settings: Any) -> list[Any]:
    """A server is created (``POST /v1/servers``, its transaction): every firewall of its tenant and region
    whose label selector matches its labels takes it as a member (``pending``) — its ServerCreate then
    writes the firewall before the VM first starts — and a FirewallApplyToResources (the server as a lock
    key: after the create) sees it applied after pve-firewall's next cycle."""
    jobs = []
    for fw in await store.selecting(conn, server.tenant_id, server.region, dict(server.labels or {})):
        if await store.count_of_server(conn, server.id) >= 5:
            break  # the most firewalls a server takes; the others' selectors skip it (their GET shows it)
        await store.member_upsert(conn, fw.id, server.id, "label_selector")
        row = await store.bump(conn, fw.id)
        jobs.append(FIREWALL.new_job(row, FIREWALL_APPLY, args={"servers": [server.id]},
                                     max_attempts=settings.max_attempts, extra_lock_keys=(server.id,)))
    return jobs


async def server_deleted(conn: Any, server_id: str, max_attempts: int = 10) -> list[Any]:
    """A server is deleted for good (its final job's finishing transaction): it is no firewall's member any
    more — its VM, and the rules on it, are gone — and no firewall is applied to it by id any more (its
    ``{server_id}`` entry leaves ``applied_to``, so the firewall can be deleted). Each firewall it was in gets
    a FirewallRemoveFromResources in this transaction: its "members of" cluster IP set loses the server's
    address now, before another server (another tenant's) is given that address."""
    jobs = []
    for fw in await store.holding_server(conn, server_id):
        applied = [dict(a) for a in fw.applied_to if a.get("server_id") != server_id]
        if applied != [dict(a) for a in fw.applied_to]:
            await store.set_rows(conn, fw.id, applied_to=applied)
        await store.member_forget(conn, fw.id, server_id)
        row = await store.bump(conn, fw.id)
        jobs.append(FIREWALL.new_job(row, FIREWALL_REMOVE, args={"servers": []}, max_attempts=max_attempts))
    await store.member_forget_server(conn, server_id)
    return jobs


async def _sets_again(conn: Any, server_id: str, max_attempts: int) -> list[Any]:
    """A FirewallApplyToResources of every live firewall server ``server_id`` is a member of that some rule
    names ("members of"): its cluster IP set is brought up to date with the server's status."""
    jobs = []
    # (read, not locked: the membership does not change; a firewall's row lock here, after the server's,
    # could meet a set-rules holding that firewall and share-locking another it names)
    for fw in await store.of_server(conn, server_id):
        if await store.referenced_by(conn, fw.id):
            jobs.append(FIREWALL.new_job(fw, FIREWALL_APPLY, args={"servers": []}, max_attempts=max_attempts))
    return jobs


async def server_deleting(conn: Any, server: Any, options: Any, settings: Any) -> list[Any]:
    """A server's deletion starts (``DELETE /v1/servers/{id}``, its transaction): it leaves every "members
    of" cluster IP set at once (a deleting server is no member whose address a rule lets in), by a job of
    each firewall naming it; it stays a member (its VM keeps the rules) until its final delete, and a
    cancelled deletion puts its address back (:func:`server_restored`)."""
    return await _sets_again(conn, server.id, settings.max_attempts)


async def server_restored(conn: Any, server: Any, settings: Any) -> list[Any]:
    """A server's deletion is cancelled: its address is back in the "members of" sets it was in."""
    return await _sets_again(conn, server.id, settings.max_attempts)


async def server_relabelled(conn: Any, server: Any, settings: Any) -> list[Any]:
    """A server's labels changed (``PATCH /v1/servers/{id}``, its transaction): the firewalls of its tenant
    and region whose selectors match them now take it (``pending``, a FirewallApplyToResources), those whose
    selectors held it and no longer match let it go (``removing``, a FirewallRemoveFromResources). A
    server applied directly stays so (one owner per membership: a selector matching it adds no second
    path). Refused with 409 ``server_firewall_limit`` when it would be in more than 5 firewalls."""
    from z9.common.errors import Conflict

    if server.status in ("deleting", "destroying", "deleted"):
        return []
    now = {fw.id: fw for fw in await store.selecting(conn, server.tenant_id, server.region, dict(server.labels or {}))}
    jobs = []
    current = {fw.id: fw for fw in await store.of_server(conn, server.id)}
    vias = {m.firewall_id: m.via for m in await store.members(conn, list(current)) if m.server_id == server.id}
    for fid in current:
        if vias.get(fid) == "label_selector" and fid not in now:
            await store.member_removing(conn, fid, server.id)
            row = await store.bump(conn, fid)
            jobs.append(FIREWALL.new_job(row, FIREWALL_REMOVE, args={"servers": [server.id]},
                                         max_attempts=settings.max_attempts, extra_lock_keys=(server.id,)))
    added = [fid for fid in now if fid not in current]
    if added and len([f for f in current if f in now or vias.get(f) == "server"]) + len(added) > 5:
        raise Conflict(f"with these labels server {server.id} would be in more than 5 firewalls (the most a server "
                       f"takes): {', '.join(sorted(set(current) | set(added)))}", code="server_firewall_limit",
                       details={"kind": "server", "id": server.id, "limit": 5})
    for fid in added:
        await store.member_upsert(conn, fid, server.id, "label_selector")
        row = await store.bump(conn, fid)
        jobs.append(FIREWALL.new_job(row, FIREWALL_APPLY, args={"servers": [server.id]},
                                     max_attempts=settings.max_attempts, extra_lock_keys=(server.id,)))
    return jobs


on_create("server", server_created)
on_relabel("server", server_relabelled)
on_final_delete("server", server_deleted)
on_deletion("server", server_deleting)
on_restore("server", server_restored)
