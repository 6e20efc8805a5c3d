"""The ``address`` resource type: an IP from a region's pool, on one server's VM or on none;
two-phase deletion (AddressUnassign during the buffer, AddressDelete at its end; a cancellation
assigns it back to the server it was on)."""
from __future__ import annotations

from typing import Any

from z9.resources.address.model import Address
from z9.resources import Buffered, PlanOf, QuotaUnit, QuotaUsage, ResourceType, VmParts, on_final_delete, register

# the job kinds of this type (the ``kind`` column's values)
ADDRESS_CREATE = "AddressCreate"
ADDRESS_ASSIGN = "AddressAssign"
ADDRESS_UNASSIGN = "AddressUnassign"
ADDRESS_DELETE = "AddressDelete"

STATUSES = ("creating", "active", "deleting", "destroying", "deleted", "failed")


def restore(address: Address) -> tuple[str, dict[str, Any]]:
    """What a cancelled deletion gives back: the assignment the address had (the table put it
    back into ``server_id`` when the deletion was cancelled), or none."""
    if address.server_id:
        return ADDRESS_ASSIGN, {"server_id": address.server_id}
    return ADDRESS_UNASSIGN, {}


def lock_keys(address: Address) -> tuple[str, ...]:
    """The server an address job touches: the one it is on, and during a deletion the one it
    was on (the deletion's AddressUnassign takes it off that server's VM; the cancel's
    AddressAssign puts it back). Like an assign, those jobs are then ordered with the server's
    own jobs instead of running beside them."""
    keys = [address.server_id]
    if address.status in ("deleting", "destroying"):
        keys.append(address.server_before_delete)
    return tuple(k for k in keys if k)


def stale(address: Address, kind: str, args: dict[str, Any]) -> str | None:
    """An assignment job is the address's intent only while the address is still meant for
    that server (``server_id``), an unassignment or a create only while it is meant for none."""
    if kind == ADDRESS_ASSIGN:
        meant = args.get("server_id")
    elif kind in (ADDRESS_UNASSIGN, ADDRESS_CREATE):
        meant = None
    else:
        return None
    if address.server_id == meant:
        return None
    now = f"server {address.server_id}" if address.server_id else "no server"
    was = f"server {meant}" if meant else "no server"
    return (f"address {address.id} is meant for {now} since a later request; this {kind} job put it on {was}. "
            "Assign or unassign the address again instead")


async def plan_of(db: Any, address: Address) -> PlanOf:
    """A plan of an address previews the job that puts it where its row says (on its server's VM, or
    on none): its assignment, as a cancelled deletion would restore it (:func:`restore`)."""
    return PlanOf(*restore(address))


ADDRESS: ResourceType[Address] = register(ResourceType(
    name="address", prefix="adr", table="addresses", model=Address, plural="addresses",
    kinds=(ADDRESS_CREATE, ADDRESS_ASSIGN, ADDRESS_UNASSIGN, ADDRESS_DELETE),
    deletion=Buffered(first_kind=ADDRESS_UNASSIGN, final_kind=ADDRESS_DELETE),
    statuses=STATUSES, restore=restore, lock_keys=lock_keys, stale=stale, plan_of=plan_of,
    # the address's own rules and its holders' (triggers on addresses: a load balancer's or a
    # cluster's address goes with its owner)
    deletion_rules=("protected", "must_be_unassigned", "load_balancer_address", "cluster_endpoint"),
    order=20,
    # on the server's VM it is on: its tag (how its holder is found), its entry in the VM's IP filter
    # set, and the filter's switch (``ipfilter``: on once every address the VM uses is in the set)
    vm_parts=VmParts(tags=("z9-addr-",), ipset_entries=("z9 address ",), firewall_options=("ipfilter",)),
    quotas=(QuotaUnit("addresses", "addresses", example=(5, 1)),),
    quota_usage=QuotaUsage("address_quota_usage", {
        "addresses": "addresses (whoever holds them: primary ones, load balancers' VIPs and appliances', "
                     "clusters' endpoints)"}),
))


async def _server_deleted(conn: Any, server_id: str, max_attempts: int) -> list[Any]:
    """A server deleted for good (its ServerDelete's finishing transaction, after verify saw the VM
    gone — never before: a live VM keeps its addresses): its addresses are released — auto-delete
    primaries deleted with their IPs quarantined, the others unassigned. No job: nothing is on a
    VM any more."""
    from z9.resources.address import store as address_store  # the store imports the registry's store

    await address_store.addresses_release_for_server(conn, server_id)
    return []


on_final_delete("server", _server_deleted)
