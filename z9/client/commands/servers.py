"""``z9 servers create|list|get|delete|restore``. A later server action (start, stop, reboot,
resize: new job kinds) is one more :func:`z9.client.cli.add_action` line in ``register``."""
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
            ("vmid", s.observed.vmid), ("delete after", s.delete_after), ("created", s.created_at)]
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


def create(ctx: Ctx) -> int:
    a = ctx.args
    spec = ServerCreate(name=a.name, region=a.region, image=a.image, cores=a.cores, memory_mib=a.memory_mib,
                        disk_gib=a.disk_gib, ssh_keys=a.ssh_key or [])
    accepted = ctx.client.create_server(spec)
    return mutation(ctx, accepted, server_table, lambda: ctx.client.get_server(accepted.resource.id))


def list_(ctx: Ctx) -> int:
    a = ctx.args
    if a.all:
        servers = list(ctx.client.iter_servers(status=a.status))
        next_after = None
    else:
        page = ctx.client.list_servers(status=a.status, limit=a.limit, after=a.after)
        servers, next_after = page.items, page.next_after
    ctx.emit({"servers": servers, "next_after": next_after}, lambda: servers_table(servers))
    if next_after and not ctx.json:
        ctx.err.print(f"more: z9 servers list --after {next_after} (or --all)", highlight=False)
    return OK


def get(ctx: Ctx) -> int:
    s = ctx.client.get_server(ctx.args.id)
    ctx.emit({"server": s}, lambda: server_table(s))
    return OK


def register(sub: Any, common: argparse.ArgumentParser, waiting: argparse.ArgumentParser) -> str:
    verbs = group(sub, "servers", "servers: create, list, get, delete, restore")

    p = verb(verbs, "create", "create a server (a ServerCreate job)", [common, waiting])
    p.add_argument("--name", required=True, help="DNS label, unique in your tenant")
    p.add_argument("--region", required=True)
    p.add_argument("--image", required=True, help="template name, e.g. debian-12")
    p.add_argument("--cores", type=int, required=True)
    p.add_argument("--memory-mib", type=int, required=True, metavar="MiB")
    p.add_argument("--disk-gib", type=int, required=True, metavar="GiB")
    p.add_argument("--ssh-key", action="append", type=_ssh_key, metavar="KEY|@FILE",
                   help="an OpenSSH public key, or @path of one (repeatable)")
    p.set_defaults(run=create)

    p = verb(verbs, "list", "list servers (deleted ones stay listed)", [common])
    p.add_argument("--status", choices=STATUSES)
    p.add_argument("--limit", type=int, help="page size (1-500, default 100)")
    p.add_argument("--after", help="the next_after of the previous page")
    p.add_argument("--all", action="store_true", help="every page")
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
    return "servers"
