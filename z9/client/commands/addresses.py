"""``z9 addresses create|list|get|update|delete|restore|assign|unassign``."""
from __future__ import annotations

import argparse
from typing import Any

from ..cli import Ctx, OK, add_action, mutation, table
from ..models import Address
from ._group import group, verb

STATUSES = ("creating", "active", "deleting", "destroying", "deleted", "failed")


def address_table(a: Address) -> Any:
    rows = [("id", a.id), ("name", a.name), ("ip", a.ip), ("kind", a.kind), ("region", a.region), ("pool", a.pool),
            ("status", a.status + (f" ({a.status_reason})" if a.status_reason else "")), ("server", a.server_id),
            ("reverse dns", a.dns_ptr), ("labels", ", ".join(f"{k}={v}" for k, v in sorted(a.labels.items())) or None),
            ("delete after", a.delete_after), ("created", a.created_at)]
    return table(("field", "value"), [r for r in rows if r[1] is not None])


def addresses_table(items: list[Address]) -> Any:
    return table(("ID", "NAME", "IP", "KIND", "STATUS", "SERVER", "REGION"),
                 [(a.id, a.name or "", a.ip, a.kind, a.status, a.server_id or "", a.region) for a in items])


def create(ctx: Ctx) -> int:
    a = ctx.args
    body = {k: v for k, v in (("region", a.region), ("name", a.name), ("family", a.family), ("pool", a.pool),
                              ("server_id", a.server)) if v is not None}
    accepted = ctx.client.create_address(body)
    return mutation(ctx, accepted, address_table, lambda: ctx.client.get_address(accepted.resource.id))


def list_(ctx: Ctx) -> int:
    a = ctx.args
    page = ctx.client.list_addresses(status=a.status, limit=a.limit, after=a.after, server_id=a.server,
                                     label_selector=a.selector)
    ctx.emit({"addresses": page.items, "next_after": page.next_after}, lambda: addresses_table(page.items))
    return OK


def get(ctx: Ctx) -> int:
    got = ctx.client.get_address(ctx.args.id)
    ctx.emit({"address": got}, lambda: address_table(got))
    return OK


def assign(ctx: Ctx) -> int:
    accepted = ctx.client.address_action(ctx.args.id, "assign", {"server_id": ctx.args.server})
    return mutation(ctx, accepted, address_table, lambda: ctx.client.get_address(ctx.args.id))


def register(sub: Any, common: argparse.ArgumentParser, waiting: argparse.ArgumentParser) -> str:
    verbs = group(sub, "addresses", "public addresses: create, list, get, delete, restore, assign, unassign")
    p = verb(verbs, "create", "allocate a floating address (assigned at once with --server)", [common, waiting])
    p.add_argument("--region", required=True)
    p.add_argument("--name")
    p.add_argument("--family", type=int, choices=(4, 6))
    p.add_argument("--pool", help="the region's pool (default: its only one, or 'public')")
    p.add_argument("--server", help="assign it to this server id")
    p.set_defaults(run=create)

    p = verb(verbs, "list", "list addresses", [common])
    p.add_argument("--status", choices=STATUSES)
    p.add_argument("--server", help="only the addresses on this server id")
    p.add_argument("-l", "--selector", metavar="SELECTOR", help="label selector (as `z9 servers list -l`)")
    p.add_argument("--limit", type=int, help="page size (1-500, default 100)")
    p.add_argument("--after", help="the next_after of the previous page")
    p.set_defaults(run=list_)

    p = verb(verbs, "get", "show an address", [common])
    p.add_argument("id")
    p.set_defaults(run=get)

    p = verb(verbs, "assign", "assign an address to a server (a floating one moves)", [common, waiting])
    p.add_argument("id")
    p.add_argument("--server", required=True, help="the server's id")
    p.set_defaults(run=assign)
    add_action(verbs, [common, waiting], "unassign", "take an address off its server",
               lambda c, i: c.address_action(i, "unassign"), address_table, lambda c, i: c.get_address(i),
               "the address's id")
    add_action(verbs, [common, waiting], "delete", "delete an address (restorable during its buffer)",
               lambda c, i: c.delete_address(i), address_table, lambda c, i: c.get_address(i), "the address's id")
    add_action(verbs, [common, waiting], "restore", "cancel an address's deletion within its buffer",
               lambda c, i: c.address_action(i, "cancel-deletion"), address_table, lambda c, i: c.get_address(i),
               "the address's id")
    return "addresses"
