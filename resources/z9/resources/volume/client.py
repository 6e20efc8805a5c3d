"""``z9 volumes create|list|get|update|delete|restore|attach|detach|resize`` (the volume type's client
commands, and its answer model)."""
from __future__ import annotations

import argparse
from datetime import datetime
from typing import Any

from pydantic import Field

from z9.client.models import ResourceKind, _Answer
from z9.client.commands._kind import (LABEL_ARGS, Action, Arg, KindSpec, Update, delete_option, given, label, labels_of, labels_text,
                                      status_text)

STATUSES = ("creating", "available", "attached", "deleting", "destroying", "deleted", "failed")


class Volume(_Answer):
    """A volume (``GET /v1/volumes/{id}``)."""

    id: str
    name: str
    region: str
    size_gib: int
    server_id: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    status: str
    status_reason: str | None = None
    observed: dict[str, Any] | None = None
    linux_device: str | None = None
    delete_after: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    deleted_at: datetime | None = None


VOLUMES: ResourceKind[Volume] = ResourceKind("volume", "volumes", Volume)


def create_body(a: argparse.Namespace) -> dict[str, Any]:
    return given(name=a.name, region=a.region, size_gib=a.size_gib, server_id=a.server, labels=labels_of(a))


def update_body(a: argparse.Namespace) -> dict[str, Any]:
    return given(name=a.name, labels=labels_of(a))


KIND = KindSpec(
    kind=VOLUMES,
    help="volumes (block storage): create, list, get, update, delete, restore, attach, detach, resize",
    statuses=STATUSES,
    id_help="the volume's id (vol_…)",
    columns=(("ID", lambda x: x.id), ("NAME", lambda x: x.name), ("SIZE", lambda x: f"{x.size_gib} GiB"),
             ("STATUS", lambda x: x.status), ("SERVER", lambda x: x.server_id or ""), ("REGION", lambda x: x.region)),
    fields=(("id", lambda x: x.id), ("name", lambda x: x.name), ("region", lambda x: x.region),
            ("size", lambda x: f"{x.size_gib} GiB"), ("status", status_text), ("server", lambda x: x.server_id),
            ("device", lambda x: x.linux_device), ("labels", lambda x: labels_text(x.labels)),
            ("delete after", lambda x: x.delete_after), ("created", lambda x: x.created_at)),
    create_help="create a volume (attached at once with --server)",
    create_args=(Arg("--name", required=True), Arg("--region", required=True),
                 Arg("--size-gib", type=int, required=True, help="GiB (grows later, never shrinks)"),
                 Arg("--server", help="attach it to this server id"),
                 Arg("--label", action="append", type=label, metavar="KEY=VALUE", help="repeatable")),
    create_body=create_body,
    list_args=(Arg("--server", dest="server_id", help="only the volumes attached to this server id"),
               Arg("--region", dest="region", help="only the volumes of this region")),
    update=Update(args=(Arg("--name", help="the new name"), *LABEL_ARGS), body=update_body,
                  help="rename a volume or set its labels (no job)"),
    delete_help="delete a volume (detached at once; restorable during its buffer)",
    restore_help="cancel a volume's deletion within its buffer (attached back to its server)",
    actions=(
        Action("attach", "attach", "attach a volume to a server of its region (hot-plugged)",
               (Arg("--server", required=True, help="the server's id"),), lambda a: {"server_id": a.server}),
        Action("detach", "detach", "detach a volume from its server"),
        Action("resize", "resize", "grow a volume (online)",
               (Arg("--size-gib", type=int, required=True, help="the new size, GiB"),),
               lambda a: {"size_gib": a.size_gib}),
    ),
)

register = KIND.register


# a server's DELETE takes the volume type's option (declared on that route by this slice's on_deletion)
delete_option("servers", "--delete-volumes", "delete_volumes",
              "delete the volumes attached to the server with it (each two-phase: detached now, destroyed when "
              "its own buffer ends); without it they are detached and stay, available")
