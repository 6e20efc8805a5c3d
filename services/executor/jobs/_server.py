"""What the server job kinds share: a server is the owner of one VM, member ``main``; the VM
machinery itself (finding VMs by tag, the guard, the clone ladder) is :mod:`z9.executor.vms`."""
from __future__ import annotations

from typing import Any

from z9.common import store
from z9.common.models import Job
from z9.common.resources.server import SERVER

from ..context import JobContext
from ..vms import MAIN, VmSpec


def spec(job: Job) -> VmSpec:
    """The server's VM, from the job's arguments (the create body)."""
    a = job.args
    return VmSpec(owner=job.resource_id, member=MAIN, name=a["name"], image=a["image"], cores=int(a["cores"]),
                  memory_mib=int(a["memory_mib"]), disk_gib=int(a["disk_gib"]),
                  ssh_keys=tuple(a.get("ssh_keys") or ()),
                  # a primary address from a pool: the API put its cloud-init keys in the args
                  config={k: str(a[k]) for k in ("ipconfig0", "nameserver") if a.get(k)})


async def recorded_vm(ctx: JobContext) -> list[tuple[int, str]]:
    """The (vmid, node) the database last recorded for the server (a suspect, never trusted)."""
    server = await store.server_get(ctx.pool, ctx.job.resource_id)
    return [(server.vmid, server.node)] if server is not None and server.vmid is not None else []


async def record_failure(conn: Any, ctx: JobContext, error: dict[str, Any]) -> None:
    """The server carries a failed job's reason (``ResourceType.mark_failed_by_job``)."""
    await SERVER.mark_failed_by_job(conn, ctx.job.resource_id, error["message"], kind=ctx.job.kind,
                                    refused=bool(error.get("refused")))
