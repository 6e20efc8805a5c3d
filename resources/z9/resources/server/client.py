"""``z9 servers create|list|get|update|delete|restore|start|shutdown|poweroff|reboot|resize``.
The verbs are the API's actions: ``shutdown`` (ACPI, forced off after 60 s; ``stop`` is kept as
its alias, as ``hcloud server shutdown`` and ``openstack server stop`` mean it); ``poweroff``
pulls the plug."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from z9.client.models import SERVERS, Server, ServerCreate
from z9.client.commands._kind import (LABEL_ARGS, Action, Arg, KindSpec, Update, given, label, labels_of, labels_text, status_text)

STATUSES = ("creating", "running", "stopped", "deleting", "destroying", "deleted", "failed")


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


def _network(text: str) -> dict[str, Any]:
    """``--network NET[=IP]``: a private network to join (and the address to take there)."""
    nid, _, ip = text.partition("=")
    if not nid.startswith("net_"):
        raise argparse.ArgumentTypeError(f"a network id (net_…), optionally =IP, not {text!r}")
    return {"network_id": nid, **({"ip": ip} if ip else {})}


def create_body(a: argparse.Namespace) -> dict[str, Any]:
    # the API's own model checks the request before it is sent (a bad name: 64, no request)
    spec = ServerCreate(name=a.name, region=a.region, image=a.image, cores=a.cores, memory_mib=a.memory_mib,
                        disk_gib=a.disk_gib, ssh_keys=a.ssh_key or [], public_ipv4=a.public_ipv4,
                        networks=getattr(a, "network", None) or [], labels=labels_of(a))
    return spec.model_dump(mode="json", exclude_none=True)


def _public_ip(s: Server) -> str | None:
    pub = getattr(s, "public_ipv4", None)
    return pub.get("ip") if isinstance(pub, dict) else None


def _resize_check(a: argparse.Namespace) -> str | None:
    if a.cores is None and a.memory_mib is None and a.disk_gib is None:
        return "give --cores, --memory-mib and/or --disk-gib"
    return None


KIND = KindSpec(
    kind=SERVERS,
    help="servers: create, list, get, update, delete, restore, start, shutdown (stop), poweroff, reboot, resize",
    statuses=STATUSES,
    id_help="the server's id (srv_…)",
    columns=(("ID", lambda s: s.id), ("NAME", lambda s: s.name), ("STATUS", lambda s: s.status),
             ("REGION", lambda s: s.region), ("IMAGE", lambda s: s.image), ("CORES", lambda s: s.cores),
             ("MEMORY", lambda s: f"{s.memory_mib} MiB"), ("DISK", lambda s: f"{s.disk_gib} GiB"),
             ("IPV4", _public_ip), ("POWER", lambda s: s.observed.power_state)),
    fields=(("id", lambda s: s.id), ("name", lambda s: s.name), ("status", status_text),
            ("region", lambda s: s.region), ("image", lambda s: s.image), ("cores", lambda s: s.cores),
            ("memory", lambda s: f"{s.memory_mib} MiB"), ("disk", lambda s: f"{s.disk_gib} GiB"),
            ("public ipv4", _public_ip), ("power", lambda s: s.observed.power_state),
            ("node", lambda s: s.observed.node), ("vmid", lambda s: s.observed.vmid),
            ("labels", lambda s: labels_text(s.labels)), ("delete after", lambda s: s.delete_after),
            ("created", lambda s: s.created_at)),
    create_help="create a server (a ServerCreate job)",
    create_args=(
        Arg("--name", required=True, help="DNS label, unique in your tenant"),
        Arg("--region", required=True),
        Arg("--image", required=True, help="template name, e.g. debian-12"),
        Arg("--cores", type=int, required=True),
        Arg("--memory-mib", type=int, required=True, metavar="MiB"),
        Arg("--disk-gib", type=int, required=True, metavar="GiB"),
        Arg("--ssh-key", action="append", type=_ssh_key, metavar="KEY|@FILE",
            help="an OpenSSH public key, or @path of one (repeatable)"),
        Arg("--public-ipv4", nargs="?", const=True, default=False, type=_public_ipv4, metavar="ADDRESS_ID",
            help="a primary IPv4 address: the region pool's lowest free IP, or the given unassigned "
                 "address (adr_…) of the region; without it the server uses DHCP"),
        Arg("--network", action="append", type=_network, metavar="NET_ID[=IP]",
            help="join a private network of the region (repeatable): a NIC on it with the address given or "
                 "the lowest free one"),
        Arg("--label", action="append", type=label, metavar="KEY=VALUE",
            help="repeatable; a firewall whose label selector matches applies before the server first starts")),
    create_body=create_body,
    update=Update(args=(Arg("--name", help="the new name"), *LABEL_ARGS),
                  body=lambda a: given(name=a.name, labels=labels_of(a)),
                  help="rename a server or replace its labels (no job)"),
    delete_help="delete a server: it stops and can be restored until its deletion buffer ends",
    restore_help="cancel a deletion within its buffer (the server gets its power state back)",
    actions=(
        Action("start", "start", "power a server on (a ServerStart job)"),
        Action("shutdown", "shutdown", "shut a server down: ACPI, forced off after 60 s (a ServerStop job)",
               aliases=("stop",)),
        Action("poweroff", "poweroff", "power a server off at once, as pulling the plug (a ServerStop job)"),
        Action("reboot", "reboot", "reboot a server: ACPI reboot, or a start when stopped (a ServerReboot job)"),
        Action("resize", "resize", "change cores or memory (server stopped) or grow the disk (a ServerResize job)",
               (Arg("--cores", type=int), Arg("--memory-mib", type=int, metavar="MiB"),
                Arg("--disk-gib", type=int, metavar="GiB", help="grow only: disks never shrink")),
               lambda a: given(cores=a.cores, memory_mib=a.memory_mib, disk_gib=a.disk_gib), check=_resize_check),
        Action("attach-to-network", "attach-to-network",
               "join a private network (a NIC hot-plugged on it; a NetworkAttach job)",
               (Arg("--network", required=True, metavar="NET_ID"), Arg("--ip", help="the address to take there")),
               lambda a: given(network_id=a.network, ip=a.ip)),
        Action("detach-from-network", "detach-from-network", "leave a private network (a NetworkDetach job)",
               (Arg("--network", required=True, metavar="NET_ID"),), lambda a: {"network_id": a.network}),
    ),
)

register = KIND.register
