"""The ``network`` resource type: a tenant's private network in a region — one Proxmox SDN VNet in the
SDN zone z9 keeps there (``RegionSettings.sdn``) — that servers join with a NIC of their own and an
address z9 gives them from the network's ``ip_range``. Its slice is this folder
(``resources/z9/resources/network/``): the type and its kind names here, its rows in ``model.py``, its
SQL in ``queries.sql`` and ``store.py``, its API in ``api.py``, its jobs in ``jobs/`` (the network's
own reconciler ``jobs/shared.py``, a member's ``jobs/members.py``, the region's SDN apply
``jobs/apply.py``), its Proxmox calls in ``pve.py``, its client commands in ``client.py``; its tables
are ``db/z9/db/migrations/0026_networks.sql``.

PVE's SDN edits are cluster-wide and go out only with an apply (``PUT /cluster/sdn``) that commits
*everyone's* pending edits and reloads every node; so no network job writes SDN config: each makes
sure the region's one apply job (:data:`SDN_APPLY`, resource ``sdn:<region>``) is queued and waits for
its VNet to be in the running config and every node to report the zone ``available``. The apply job
batches whatever is pending (:mod:`z9.resources.network.jobs.apply`).

A server joins at its create (``networks: [{network_id, ip?}]`` in ``POST /v1/servers``: the
:func:`server_created` hook) or later (``actions/attach-to-network``); its NIC (``net1``…) is
hot-plugged on the VNet's bridge with ``firewall=1``, its address written as cloud-init
``ipconfigN`` and configured in the running guest (by MAC, through the guest agent), and its IP
filter set ``ipfilter-netN`` holds that address only. What the network keeps on a VM it declares
(:class:`~z9.resources.VmParts`): ``netN``/``ipconfigN`` for N ≥ 1 and its filter entries.
"""
from __future__ import annotations

from typing import Any

from z9.resources import (
    Buffered,
    ResourceType,
    VmParts,
    on_create,
    on_deletion,
    on_final_delete,
    register,
)
from z9.resources.network.model import Member, Network

STATUSES = ("creating", "available", "deleting", "destroying", "deleted", "failed")

# the kind names (the jobs' ``kind`` column): the type's own, named here and nowhere else
NETWORK_CREATE = "NetworkCreate"
NETWORK_VERIFY = "NetworkVerify"  # the buffer's job and a cancelled deletion's: the VNet stays
NETWORK_DELETE = "NetworkDelete"
NETWORK_ATTACH = "NetworkAttach"
NETWORK_DETACH = "NetworkDetach"
SDN_APPLY = "SdnApply"

#: the NICs (and their cloud-init ``ipconfigN``) a network keeps on a VM: every one but net0, the
#: owner's; qemu-server allows net0…net31 ($MAX_NETS = 32)
NIC_RE = r"net([1-9]|[12][0-9]|3[01])"
IPCONFIG_RE = r"ipconfig([1-9]|[12][0-9]|3[01])"
#: the comment of a network's entry in a VM's ``ipfilter-netN`` set (``z9 network <id>``)
ENTRY_COMMENT = "z9 network "


def sdn_resource(region: str) -> str:
    """The resource id the region's SDN apply jobs share (one runs at a time, in order)."""
    return f"sdn:{region}"


def restore(n: Network) -> tuple[str, dict[str, Any]]:
    return NETWORK_VERIFY, {}


NETWORK: ResourceType[Network] = register(ResourceType(
    name="network", prefix="net", table="networks", model=Network,
    kinds=(NETWORK_CREATE, NETWORK_VERIFY, NETWORK_DELETE, NETWORK_ATTACH, NETWORK_DETACH, SDN_APPLY),
    deletion=Buffered(first_kind=NETWORK_VERIFY, final_kind=NETWORK_DELETE),
    statuses=STATUSES, restore=restore, order=45,
    vm_parts=VmParts(config=(NIC_RE, IPCONFIG_RE), ipset_entries=(ENTRY_COMMENT,)),
    pve_endpoints=("GET /cluster/sdn/zones", "POST /cluster/sdn/zones", "GET /cluster/sdn/vnets",
                   "POST /cluster/sdn/vnets", "DELETE /cluster/sdn/vnets/{vnet}", "POST /cluster/sdn/lock",
                   "DELETE /cluster/sdn/lock", "PUT /cluster/sdn", "GET /nodes/{node}/sdn/zones"),
))


# ---------------------------------------------------------------- store (store.py, queries.sql)

from z9.resources.network import store

# ---------------------------------------------------------------- other types' events

async def server_created(conn: Any, server: Any, spec: Any, settings: Any) -> list[Any]:
    """A server's create names networks (``networks: [{network_id, ip?}]``): it joins each in the same
    transaction (its address there allocated now: 409 ``ip_not_available`` / ``no_subnet_available``),
    and a NetworkAttach per network plugs its NIC once ServerCreate has made the VM (the server is its
    lock key: it runs after the create)."""
    from z9.resources.network import api

    return await api.join_at_create(conn, server, list(getattr(spec, "networks", None) or []), settings)


async def server_deleted(conn: Any, server_id: str, max_attempts: int = 10) -> list[Any]:
    """A server is deleted for good: its NICs went with its VM; its memberships (and addresses) end."""
    await store.members_of_server_delete(conn, server_id)
    return []


async def refuse_with_members(conn: Any, network: Network, options: Any, settings: Any) -> list[Any]:
    """A network's deletion starts only without members: 409 ``resource_in_use`` naming each."""
    from z9.common.errors import Conflict

    members = await store.members_of(conn, network.id)
    if members:
        names = ", ".join(f"{m.server_id} ({m.address})" for m in members)
        raise Conflict(f"network {network.id} still has members: {names}; detach them first",
                       code="resource_in_use",
                       details=[{"server_id": m.server_id, "ip": m.address, "state": m.state} for m in members])
    return []


on_create("server", server_created)
on_final_delete("server", server_deleted)
on_deletion("network", refuse_with_members)

__all__ = ["NETWORK", "Member", "Network", "sdn_resource"]
