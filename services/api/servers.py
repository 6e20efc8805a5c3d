"""The ``server`` type's API registration: its create hook (server and ServerCreate job in one
statement) and image check; the five routes are the generic ones (:mod:`z9.api.resources`)."""
from __future__ import annotations

from typing import Any

from z9.common import kinds, store
from z9.common.errors import Conflict, UniqueViolation, ValidationFailed
from z9.common.models import Server
from z9.common.resources.server import SERVER
from z9.common.settings import Settings
from z9.common.store import NewJob

from . import schemas
from .resources import ApiResource, CreateContext

EXAMPLE: dict[str, Any] = {
    "id": "srv_01jd3x5v8q2m6n4p7r9s1t3w5y", "name": "web-1", "region": "dev-1", "image": "debian-12",
    "cores": 2, "memory_mib": 2048, "disk_gib": 20,
    "ssh_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDa8 alice@example"],
    "status": "creating", "status_reason": None,
    "observed": {"vmid": None, "node": None, "power_state": None, "at": None},
    "delete_after": None, "created_at": "2026-12-01T04:00:00Z", "updated_at": "2026-12-01T04:00:00Z",
    "deleted_at": None,
}


def check(settings: Settings, spec: schemas.ServerCreate) -> None:
    """422 when the image is not offered in the region."""
    region = settings.regions[spec.region]
    if region.images and spec.image not in region.images:
        raise ValidationFailed(f"image: {spec.image!r} is not offered in region {spec.region} "
                               f"(offered: {', '.join(region.images)})",
                               details=[{"field": "image", "message": "unknown image"}])


async def create(ctx: CreateContext, spec: schemas.ServerCreate) -> tuple[Server, dict[str, Any]]:
    """The server and its ServerCreate job, in one statement."""
    try:
        return await store.server_insert_with_job(
            ctx.conn, tenant_id=ctx.tenant_id, region=spec.region, name=spec.name, image=spec.image,
            cores=spec.cores, memory_mib=spec.memory_mib, disk_gib=spec.disk_gib, ssh_keys=spec.ssh_keys,
            job=NewJob(kind=kinds.SERVER_CREATE, region=spec.region, args=spec.model_dump(),
                       max_attempts=ctx.settings.max_attempts))
    except UniqueViolation as e:
        if e.constraint != "servers_tenant_name_live":
            raise
        raise Conflict(f"a server named {spec.name!r} already exists in this tenant; "
                       "choose another name or delete that server first")


API = ApiResource(rtype=SERVER, create_model=schemas.ServerCreate, public_model=schemas.Server,
                  create=create, check=check, example=EXAMPLE)
