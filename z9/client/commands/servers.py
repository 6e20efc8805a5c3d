"""``z9 servers create|list|get|update|delete|restore|start|stop|poweroff|reboot|resize``.
``stop`` is the API's ``shutdown`` (ACPI, forced off after 60 s), as ``hcloud server shutdown``
and ``openstack server stop`` mean it; ``poweroff`` pulls the plug."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..cli import Ctx, OK, add_action, mutation, table
from ..models import Server, ServerCreate
from ._group import group, verb

STATUSES = ("creating", "running", "stopped", "deleting", "destroying", "deleted", "failed")


def server_table(s: Server) -> Any:
    rows = [("id", s.id), ("name", s.name), ("status", s.status + (f" ({s.status_reason})" if s.status_reason else "")),
            ("region", s.region), ("image", s.image), ("cores", s.cores), ("memory", f"{s.memory_mib} MiB"),
            ("disk", f"{s.disk_gib} GiB"), ("power", s.observed.power_state), ("node", s.observed.node),
            ("vmid", s.observed.vmid), ("labels", ", ".join(f"{k}={v}" for k, v in sorted(s.labels.items())) or None),
            ("delete after", s.delete_after), ("created", s.created_at)]
    return table(("field", "value"), [r for r in rows if r[1] is not None])


def servers_table(servers: list[Server]) -> Any:
    return table(("ID", "NAME", "STATUS", "REGION", "IMAGE", "CORES", "MEMORY", "DISK", "POWER"),
                 [(s.id, s.name, s.status, s.region, s.image, s.cores, f"{s.memory_mib} MiB", f"{s.disk_gib} GiB",
                   s.observed.power_state) for s in servers])


def _ssh_key(text: str) -> str:
    if text.startswith("@"):
        try:
            return Path(text[1:]).expanduser().read_text().strip()
        except OSError as e:
            raise argparse.ArgumentTypeError(f"cannot read {text[1:]}: {e}")
    return text


def _public_ipv4(text: str) -> str:
    if not text.startswith("adr_"):
        raise argparse.ArgumentTypeError(f"an address id (adr_…), not {text!r}")
    return text


def create(ctx: Ctx) -> int:
    a = ctx.args
    spec = ServerCreate(name=a.name, region=a.region, image=a.image, cores=a.cores, memory_mib=a.memory_mib,
                        disk_gib=a.disk_gib, ssh_keys=a.ssh_key or [], public_ipv4=a.public_ipv4)
    accepted = ctx.client.create_server(spec)
    return mutation(ctx, accepted, server_table, lambda: ctx.client.get_server(accepted.resource.id))


def list_(ctx: Ctx) -> int:
    a = ctx.args
    if a.all:
        servers = list(ctx.client.iter_servers(status=a.status, name=a.name, label_selector=a.selector))
        next_after = None
    else:
        page = ctx.client.list_servers(status=a.status, limit=a.limit, after=a.after, name=a.name,
                                       label_selector=a.selector)
        servers, next_after = page.items, page.next_after
    ctx.emit({"servers": servers, "next_after": next_after}, lambda: servers_table(servers))
    if next_after and not ctx.json:
        ctx.err.print(f"more: z9 servers list --after {next_after} (or --all)", highlight=False)
    return OK


def get(ctx: Ctx) -> int:
    s = ctx.client.get_server(ctx.args.id)
    ctx.emit({"server": s}, lambda: server_table(s))
    return OK


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"a label is KEY=VALUE, not {text!r}")
    return key, value


def update(ctx: Ctx) -> int:
    a = ctx.args
    if a.name is None and a.label is None and not a.clear_labels:
        ctx.err.print("z9 servers update: give --name, --label or --clear-labels")
        return 64
    labels = dict(a.label or []) if (a.label is not None or a.clear_labels) else None
    s = ctx.client.update_server(a.id, name=a.name, labels=labels)
    ctx.emit({"server": s}, lambda: server_table(s))
    return OK


def resize(ctx: Ctx) -> int:
    a = ctx.args
    if a.cores is None and a.memory_mib is None and a.disk_gib is None:
        ctx.err.print("z9 servers resize: give --cores, --memory-mib and/or --disk-gib")
        return 64
    accepted = ctx.client.resize_server(a.id, cores=a.cores, memory_mib=a.memory_mib, disk_gib=a.disk_gib)
    return mutation(ctx, accepted, server_table, lambda: ctx.client.get_server(a.id))


def register(sub: Any, common: argparse.ArgumentParser, waiting: argparse.ArgumentParser) -> str:
    verbs = group(sub, "servers", "servers: create, list, get, update, delete, restore, start, stop, poweroff, "
                                  "reboot, resize")

    p = verb(verbs, "create", "create a server (a ServerCreate job)", [common, waiting])
    p.add_argument("--name", required=True, help="DNS label, unique in your tenant")
    p.add_argument("--region", required=True)
    p.add_argument("--image", required=True, help="template name, e.g. debian-12")
    p.add_argument("--cores", type=int, required=True)
    p.add_argument("--memory-mib", type=int, required=True, metavar="MiB")
    p.add_argument("--disk-gib", type=int, required=True, metavar="GiB")
    p.add_argument("--ssh-key", action="append", type=_ssh_key, metavar="KEY|@FILE",
                   help="an OpenSSH public key, or @path of one (repeatable)")
    p.add_argument("--public-ipv4", nargs="?", const=True, default=False, type=_public_ipv4, metavar="ADDRESS_ID",
                   help="a primary IPv4 address: the region pool's lowest free IP, or the given unassigned "
                        "address (adr_…) of the region; without it the server uses DHCP")
    p.set_defaults(run=create)

    p = verb(verbs, "list", "list servers (deleted ones stay listed)", [common])
    p.add_argument("--status", choices=STATUSES)
    p.add_argument("--limit", type=int, help="page size (1-500, default 100)")
    p.add_argument("--after", help="the next_after of the previous page")
    p.add_argument("--all", action="store_true", help="every page")
    p.add_argument("--name", help="only the server of this name")
    p.add_argument("-l", "--selector", metavar="SELECTOR",
                   help="label selector: k=v, k!=v, k, !k, k in (a,b), comma-separated")
    p.set_defaults(run=list_)

    p = verb(verbs, "get", "show a server", [common])
    p.add_argument("id")
    p.set_defaults(run=get)

    add_action(verbs, [common, waiting], "delete",
               "delete a server: it stops and can be restored until its deletion buffer ends",
               lambda c, i: c.delete_server(i), server_table, lambda c, i: c.get_server(i), "the server's id")
    add_action(verbs, [common, waiting], "restore",
               "cancel a deletion within its buffer (the server gets its power state back)",
               lambda c, i: c.restore_server(i), server_table, lambda c, i: c.get_server(i), "the server's id")
    p = verb(verbs, "update", "rename a server or replace its labels (no job)", [common])
    p.add_argument("id")
    p.add_argument("--name", help="the new name")
    p.add_argument("--label", action="append", type=_label, metavar="KEY=VALUE",
                   help="repeatable; the given labels replace all of them")
    p.add_argument("--clear-labels", action="store_true", help="remove every label")
    p.set_defaults(run=update)
    for name, action, help_ in (
            ("start", "start", "power a server on (a ServerStart job)"),
            ("stop", "shutdown", "shut a server down: ACPI, forced off after 60 s (a ServerStop job)"),
            ("poweroff", "poweroff", "power a server off at once, as pulling the plug (a ServerStop job)"),
            ("reboot", "reboot", "reboot a server: ACPI reboot, or a start when stopped (a ServerReboot job)")):
        add_action(verbs, [common, waiting], name, help_,
                   lambda c, i, action=action: c.server_action(i, action), server_table,
                   lambda c, i: c.get_server(i), "the server's id")
    p = verb(verbs, "resize", "change cores or memory (server stopped) or grow the disk (a ServerResize job)",
             [common, waiting])
    p.add_argument("id")
    p.add_argument("--cores", type=int)
    p.add_argument("--memory-mib", type=int, metavar="MiB")
    p.add_argument("--disk-gib", type=int, metavar="GiB", help="grow only: disks never shrink")
    p.set_defaults(run=resize)
    return "servers"
