"""``z9 addresses create|list|get|update|delete|restore|assign|unassign``."""
from __future__ import annotations

import argparse
from typing import Any

from z9.client.models import ADDRESSES
from z9.client.commands._kind import (LABEL_ARGS, Action, Arg, KindSpec, Update, given, labels_of, labels_text, status_text)

STATUSES = ("creating", "active", "deleting", "destroying", "deleted", "failed")


def create_body(a: argparse.Namespace) -> dict[str, Any]:
    return given(region=a.region, name=a.name, family=a.family, pool=a.pool, server_id=a.server, dns_ptr=a.dns_ptr)


def update_body(a: argparse.Namespace) -> dict[str, Any]:
    return given(name=a.name, dns_ptr=a.dns_ptr, labels=labels_of(a), auto_delete=a.auto_delete,
                 protection=None if a.protect is None else {"delete": a.protect})


def _protected(x: Any) -> str | None:
    p = getattr(x, "protection", None)
    return "delete" if isinstance(p, dict) and p.get("delete") else None


KIND = KindSpec(
    kind=ADDRESSES,
    help="public addresses: create, list, get, update, delete, restore, assign, unassign",
    statuses=STATUSES,
    id_help="the address's id (adr_…)",
    columns=(("ID", lambda x: x.id), ("NAME", lambda x: x.name or ""), ("IP", lambda x: x.ip),
             ("KIND", lambda x: x.kind), ("STATUS", lambda x: x.status), ("SERVER", lambda x: x.server_id or ""),
             ("REGION", lambda x: x.region)),
    fields=(("id", lambda x: x.id), ("name", lambda x: x.name), ("ip", lambda x: x.ip), ("kind", lambda x: x.kind),
            ("region", lambda x: x.region), ("pool", lambda x: x.pool), ("status", status_text),
            ("server", lambda x: x.server_id), ("reverse dns", lambda x: x.dns_ptr), ("protected", _protected),
            ("labels", lambda x: labels_text(x.labels)), ("delete after", lambda x: x.delete_after),
            ("created", lambda x: x.created_at)),
    create_help="allocate a floating address (assigned at once with --server)",
    create_args=(Arg("--region", required=True), Arg("--name"), Arg("--family", type=int, choices=(4, 6)),
                 Arg("--pool", help="the region's pool (default: its only one, or 'public')"),
                 Arg("--server", help="assign it to this server id"),
                 Arg("--dns-ptr", metavar="NAME", help="reverse DNS name")),
    create_body=create_body,
    list_args=(Arg("--server", dest="server_id", help="only the addresses on this server id"),),
    update=Update(args=(Arg("--name", help="the new name"), Arg("--dns-ptr", metavar="NAME", help="reverse DNS name"),
                        *LABEL_ARGS,
                        Arg("--protect", action=argparse.BooleanOptionalAction, default=None,
                            help="delete protection (a protected address refuses DELETE: 409 protected)"),
                        Arg("--auto-delete", action=argparse.BooleanOptionalAction, default=None,
                            help="a primary address: deleted with its server")),
                  body=update_body, help="change an address's name, reverse DNS, labels, protection (no job)"),
    delete_help="delete an address (restorable during its buffer)",
    restore_help="cancel an address's deletion within its buffer",
    actions=(
        Action("assign", "assign", "assign an address to a server (a floating one moves)",
               (Arg("--server", required=True, help="the server's id"),), lambda a: {"server_id": a.server}),
        Action("unassign", "unassign", "take an address off its server"),
    ),
)

register = KIND.register
