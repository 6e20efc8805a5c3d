"""The ``address`` resource type: an IP from a region's pool, on one server's VM or on none;
two-phase deletion (AddressUnassign during the buffer, AddressDelete at its end; a cancellation
assigns it back to the server it was on)."""
from __future__ import annotations

from typing import Any

from .. import kinds
from ..models import Address
from . import Buffered, ResourceType, register

STATUSES = ("creating", "active", "deleting", "destroying", "deleted", "failed")


def restore(address: Address) -> tuple[str, dict[str, Any]]:
    """What a cancelled deletion gives back: the assignment the address had (the table put it
    back into ``server_id`` when the deletion was cancelled), or none."""
    if address.server_id:
        return kinds.ADDRESS_ASSIGN, {"server_id": address.server_id}
    return kinds.ADDRESS_UNASSIGN, {}


ADDRESS: ResourceType[Address] = register(ResourceType(
    name="address", prefix="adr", table="addresses", model=Address, plural="addresses",
    kinds=(kinds.ADDRESS_CREATE, kinds.ADDRESS_ASSIGN, kinds.ADDRESS_UNASSIGN, kinds.ADDRESS_DELETE),
    deletion=Buffered(first_kind=kinds.ADDRESS_UNASSIGN, final_kind=kinds.ADDRESS_DELETE),
    statuses=STATUSES, restore=restore,
))
