"""``z9 networks create|list|get|update|delete|restore`` (the network type's client commands, and its
answer model). A server joins a network at its create (``z9 servers create --network NET[=IP]``, in
the server's client) or later through the API (``POST /v1/servers/{id}/actions/attach-to-network``)."""
from __future__ import annotations

import argparse
from datetime import datetime
from typing import Any

from pydantic import Field

from z9.client.commands._kind import (
    LABEL_ARGS,
    Arg,
    KindSpec,
    Update,
    given,
    label,
    labels_of,
    labels_text,
    status_text,
)
from z9.client.models import ResourceKind, _Answer

STATUSES = ("creating", "available", "deleting", "destroying", "deleted", "failed")


class Network(_Answer):
    """A network (``GET /v1/networks/{id}``)."""

    id: str
    name: str
    region: str
    ip_range: str
    labels: dict[str, str] = Field(default_factory=dict)
    status: str
    status_reason: str | None = None
    vnet: str | None = None
    observed: dict[str, Any] | None = None
    delete_after: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    deleted_at: datetime | None = None


NETWORKS: ResourceKind[Network] = ResourceKind("network", "networks", Network)


def create_body(a: argparse.Namespace) -> dict[str, Any]:
    return given(name=a.name, region=a.region, ip_range=a.ip_range, labels=labels_of(a))


def update_body(a: argparse.Namespace) -> dict[str, Any]:
    return given(name=a.name, labels=labels_of(a))


KIND = KindSpec(
    kind=NETWORKS,
    help="private networks: create, list, get, update, delete, restore",
    statuses=STATUSES,
    id_help="the network's id (net_…)",
    columns=(("ID", lambda x: x.id), ("NAME", lambda x: x.name), ("IP RANGE", lambda x: x.ip_range),
             ("STATUS", lambda x: x.status), ("VNET", lambda x: x.vnet or ""), ("REGION", lambda x: x.region)),
    fields=(("id", lambda x: x.id), ("name", lambda x: x.name), ("region", lambda x: x.region),
            ("ip range", lambda x: x.ip_range), ("status", status_text), ("vnet", lambda x: x.vnet),
            ("mtu", lambda x: (x.observed or {}).get("mtu")), ("labels", lambda x: labels_text(x.labels)),
            ("delete after", lambda x: x.delete_after), ("created", lambda x: x.created_at)),
    create_help="create a private network (an RFC 1918 range, /16 to /28)",
    create_args=(Arg("--name", required=True), Arg("--region", required=True),
                 Arg("--ip-range", required=True, help="e.g. 10.0.0.0/24 (another network may use the same)"),
                 Arg("--label", action="append", type=label, metavar="KEY=VALUE", help="repeatable")),
    create_body=create_body,
    list_args=(Arg("--region", dest="region", help="only the networks of this region"),),
    update=Update(args=(Arg("--name", help="the new name"), *LABEL_ARGS), body=update_body,
                  help="rename a network or set its labels (no job)"),
    delete_help="delete a network (refused while servers are on it; restorable during its buffer)",
    restore_help="cancel a network's deletion within its buffer",
    actions=(),
)

register = KIND.register
