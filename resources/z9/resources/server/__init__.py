"""The ``server`` resource type: one VM (member ``main``), two-phase deletion (ServerStop during
the buffer, ServerDelete at its end)."""
from __future__ import annotations

from typing import Any

from z9.resources.server.model import Server
from z9.common import store as common_store
from z9.resources import Buffered, PlanOf, QuotaUnit, QuotaUsage, ResourceType, register
from z9.resources.server import store as server_store
from z9.resources.address import ADDRESS_ASSIGN

# the job kinds of this type (the ``kind`` column's values)
SERVER_CREATE = "ServerCreate"
SERVER_START = "ServerStart"
SERVER_STOP = "ServerStop"
SERVER_DELETE = "ServerDelete"
SERVER_REBOOT = "ServerReboot"
SERVER_RESIZE = "ServerResize"

STATUSES = ("creating", "running", "stopped", "deleting", "destroying", "deleted", "failed")


def create_args(server: Server) -> dict[str, Any]:
    """The ServerCreate arguments that build ``server`` (the API's create body)."""
    return {"name": server.name, "region": server.region, "image": server.image, "cores": server.cores,
            "memory_mib": server.memory_mib, "disk_gib": server.disk_gib, "ssh_keys": list(server.ssh_keys)}


def restore(server: Server) -> tuple[str, dict[str, Any]]:
    """The job that gives a server back what it had before its deletion, from its status then:
    a server still being created is created (the ServerCreate re-runs: it converges and starts
    the VM), a running one is started, a stopped one stays stopped, a failed one gets the power
    state it had."""
    before, power_before = server.status_before_delete, server.power_before_delete
    if before == "creating":
        return SERVER_CREATE, create_args(server)
    if before == "running" or (before == "failed" and power_before == "running"):
        return SERVER_START, {}
    return SERVER_STOP, {}


def intent(server: Server, kind: str, args: dict[str, Any]) -> dict[str, Any]:
    """A re-run's args: a ServerCreate builds the server as the row says now (its name, image,
    sizes and keys: a resize of the failed server changed them), with the network of the request
    (cloud-init ``ipconfig0``/``nameserver``); a resize the sizes the row now wants."""
    if kind == SERVER_CREATE:
        return {**args, **create_args(server)}
    if kind == SERVER_RESIZE:
        return {**args, "cores": server.cores, "memory_mib": server.memory_mib, "disk_gib": server.disk_gib}
    return args


async def rerun_with(db: Any, server: Server, kind: str) -> list[str]:
    """A re-run of a failed ServerCreate re-runs its primary address's failed AddressAssign (the
    request made both: wait means ready, and the address's IP filter is that job's work)."""
    if kind != SERVER_CREATE:
        return []
    return await server_store.job_failed_primary_assign_of_server(db, server.id, ADDRESS_ASSIGN)


async def plan_of(db: Any, server: Server) -> PlanOf:
    """What a plan of the server previews: its ServerCreate as a re-run would take it (its row's
    intent, the create request's network: :func:`intent`; the VM's name the one it was made with, a
    rename being the database's alone) — it converges the VM to the server's spec (config, tags,
    disk, firewall) and starts it. A stopped server (or a failed one that was
    stopped) is meant to be stopped: that plan's ``start`` is no drift of it."""
    args = await common_store.resource_latest_job_args(db, server.id, SERVER_CREATE) or {}
    stopped = server.status == "stopped" or (server.status == "failed" and server.power_state == "stopped")
    want = intent(server, SERVER_CREATE, dict(args))
    # a rename is the database's alone (PATCH: the VM keeps the name it was made with): no drift
    want["name"] = args.get("name") or want["name"]
    return PlanOf(SERVER_CREATE, want, leave_out=("start",) if stopped else ())


SERVER: ResourceType[Server] = register(ResourceType(
    name="server", prefix="srv", table="servers", model=Server,
    kinds=(SERVER_CREATE, SERVER_START, SERVER_STOP, SERVER_DELETE, SERVER_REBOOT,
           SERVER_RESIZE),
    deletion=Buffered(first_kind=SERVER_STOP, final_kind=SERVER_DELETE),
    statuses=STATUSES, restore=restore, intent=intent, rerun_with=rerun_with,
    order=10, plan_of=plan_of,
    quotas=(QuotaUnit("servers", "servers", example=(10, 2)), QuotaUnit("cores", "cores", example=(None, 4)),
            QuotaUnit("memory_mib", "MiB of memory", example=(None, 4096))),
    quota_usage=QuotaUsage("server_quota_usage", {"servers": "servers", "cores": "servers' cores",
                                                  "memory_mib": "servers' memory (MiB)"}),
))
