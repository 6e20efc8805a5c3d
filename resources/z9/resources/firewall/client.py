"""``z9 firewalls create|list|get|update|delete|set-rules|apply|remove`` (the firewall type's client commands,
and its answer model).

A rule on the command line is ``DIRECTION:PROTOCOL:PORT:ADDRESSES[:DESCRIPTION]`` — ``in:tcp:22:0.0.0.0/0,::/0``,
``in:tcp:80-85:10.0.0.0/8``, ``in:icmp::0.0.0.0/0`` (no port for icmp/esp/gre), ``out:udp:53:0.0.0.0/0``;
an address may be a firewall's id (``fw_…``): the members of that firewall."""
from __future__ import annotations

import argparse
import re
from datetime import datetime
from typing import Any

from pydantic import Field

from z9.client.commands._kind import (
    LABEL_ARGS,
    Action,
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

STATUSES = ("creating", "active", "deleting", "destroying", "deleted", "failed")
_FW_ID = re.compile(r"^fw_[0-9a-z]{26}$")


class Firewall(_Answer):
    """A firewall (``GET /v1/firewalls/{id}``)."""

    id: str
    name: str
    region: str
    labels: dict[str, str] = Field(default_factory=dict)
    rules: list[dict[str, Any]] = Field(default_factory=list)
    applied_to: list[dict[str, Any]] = Field(default_factory=list)
    members: list[dict[str, Any]] = Field(default_factory=list)
    status: str
    status_reason: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    deleted_at: datetime | None = None


FIREWALLS: ResourceKind[Firewall] = ResourceKind("firewall", "firewalls", Firewall, buffered=False)


def rule(text: str) -> dict[str, Any]:
    """``DIRECTION:PROTOCOL:PORT:ADDRESSES[:DESCRIPTION]`` → a rule of the API (argparse type: a usage
    error names what is wrong). IPv6 addresses hold colons: the addresses are everything between the port
    and a final ``:DESCRIPTION`` that holds no ``/``, ``.`` or ``,`` … so give a description only after a
    ``#``: ``in:tcp:22:0.0.0.0/0,::/0#ssh``."""
    body, _, description = text.partition("#")
    parts = body.split(":", 3)
    if len(parts) != 4 or parts[0] not in ("in", "out"):
        raise argparse.ArgumentTypeError(f"{text!r}: not DIRECTION:PROTOCOL:PORT:ADDRESSES (e.g. in:tcp:22:0.0.0.0/0)")
    direction, protocol, port, addrs = parts
    items = [a.strip() for a in addrs.split(",") if a.strip()]
    ips = [a for a in items if not _FW_ID.match(a)]
    fws = [a for a in items if _FW_ID.match(a)]
    side = "source" if direction == "in" else "destination"
    out: dict[str, Any] = {"direction": direction, "protocol": protocol}
    if port:
        out["port"] = port
    if ips:
        out[f"{side}_ips"] = ips
    if fws:
        out[f"{side}_firewalls"] = fws
    if description:
        out["description"] = description
    return out


def _applied(a: argparse.Namespace) -> list[dict[str, Any]]:
    return ([{"server_id": s} for s in a.server or []]
            + [{"label_selector": s} for s in a.selector or []])


def create_body(a: argparse.Namespace) -> dict[str, Any]:
    return given(name=a.name, region=a.region, labels=labels_of(a), rules=a.rule or [],
                 applied_to=_applied(a) or None)


def update_body(a: argparse.Namespace) -> dict[str, Any]:
    return given(name=a.name, labels=labels_of(a))


def _rules_text(x: Firewall) -> str:
    out = []
    for r in x.rules:
        addrs = (r.get("source_ips") or []) + (r.get("source_firewalls") or []) + (r.get("destination_ips") or []) \
            + (r.get("destination_firewalls") or [])
        out.append(f"{r['direction']} {r['protocol']} {r.get('port') or '-'} {','.join(addrs)}"
                   + (f" ({r['description']})" if r.get("description") else ""))
    return "; ".join(out) or "(none: inbound closed)"


def _members_text(x: Firewall) -> str:
    return ", ".join(f"{m['server_id']} {m['status']}" + ("" if m.get("enforced") is not False else " (not enforced)")
                     for m in x.members) or "-"


def _applied_text(x: Firewall) -> str:
    return ", ".join(a.get("server_id") or f"selector {a.get('label_selector')}" for a in x.applied_to) or "-"


RESOURCE_ARGS = (Arg("--server", action="append", help="a server's id (repeatable)"),
                 Arg("--selector", action="append", help="a label selector, e.g. role=web (repeatable)"))


def _resources_check(a: argparse.Namespace) -> str | None:
    return None if (a.server or a.selector) else "give at least one --server or --selector"


KIND = KindSpec(
    kind=FIREWALLS,
    help="firewalls (rule sets on servers): create, list, get, update, delete, set-rules, apply, remove",
    statuses=STATUSES,
    id_help="the firewall's id (fw_…)",
    columns=(("ID", lambda x: x.id), ("NAME", lambda x: x.name), ("RULES", lambda x: str(len(x.rules))),
             ("APPLIED TO", _applied_text), ("STATUS", lambda x: x.status), ("REGION", lambda x: x.region)),
    fields=(("id", lambda x: x.id), ("name", lambda x: x.name), ("region", lambda x: x.region),
            ("status", status_text), ("rules", _rules_text), ("applied to", _applied_text),
            ("members", _members_text), ("labels", lambda x: labels_text(x.labels)),
            ("created", lambda x: x.created_at)),
    create_help="create a firewall (rules as DIRECTION:PROTOCOL:PORT:ADDRESSES, applied with --server/--selector)",
    create_args=(Arg("--name", required=True), Arg("--region", required=True),
                 Arg("--rule", action="append", type=rule, metavar="DIR:PROTO:PORT:ADDRS",
                     help="repeatable; e.g. in:tcp:22:0.0.0.0/0,::/0 or in:tcp:5432:fw_… (members of a firewall)"),
                 *RESOURCE_ARGS,
                 Arg("--label", action="append", type=label, metavar="KEY=VALUE", help="repeatable")),
    create_body=create_body,
    list_args=(Arg("--region", dest="region", help="only the firewalls of this region"),),
    update=Update(args=(Arg("--name", help="the new name"), *LABEL_ARGS), body=update_body,
                  help="rename a firewall or set its labels (no job)"),
    delete_help="delete a firewall (refused while it applies to anything)",
    actions=(
        Action("set-rules", "set-rules", "replace every rule (none given: remove all — inbound closed)",
               (Arg("--rule", action="append", type=rule, metavar="DIR:PROTO:PORT:ADDRS", help="repeatable"),),
               lambda a: {"rules": a.rule or []}),
        Action("apply", "apply-to-resources", "apply the firewall to servers or label selectors", RESOURCE_ARGS,
               lambda a: {"apply_to": _applied(a)}, check=_resources_check),
        Action("remove", "remove-from-resources", "take the firewall off servers or label selectors", RESOURCE_ARGS,
               lambda a: {"remove_from": _applied(a)}, check=_resources_check),
    ),
)

register = KIND.register
