"""``POST /v1/<plural>/{id}/actions/plan`` for every registered type: what the resource's converging
job would do now — its drift from the row's intent and the steps that would fix it, each saying
whether it interrupts the guest — answered at once, never a job.

The API reaches the region's Proxmox VE for this itself, through the executor's adapter
(:class:`z9.executor.proxmox.ProxmoxClient`, built ``read_only``: any request but a GET is refused
unsent), one client per region per API process, made on the first plan of that region. The plan is
the kind's own observe and plan (:mod:`z9.executor.preview`), each database read of it in a ``READ
ONLY`` transaction of its own on a pool connection taken for that read alone
(:class:`z9.executor.preview.ReadOnlyPool`): no write, no row lock, no lease, and no connection held
while the plan waits on Proxmox. A read token may plan (it reads).

At most ``api_max_concurrent_plans`` plans run at once in an API process, one tenant's at most half of
them (rounded up): past that a plan is answered 429 ``too_many_plans`` with ``Retry-After`` at once, so
plans waiting on a slow Proxmox never queue up behind the region's threads nor starve other requests.

``blocked_by`` lists the resource's live jobs (pending, running, retry): the plan is then of the
world as it is now, which those jobs will change first.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from pydantic import Field
from z9.common import store
from z9.common.errors import (
    ApiError,
    Conflict,
    NotFound,
    PermanentError,
    TemporaryError,
    TooManyRequests,
    deleting,
)
from z9.common.settings import Settings

from . import schemas
from .resources import POOL, SETTINGS, ApiResource, Operation, clock_of, path_id, tenant

#: region -> its read-only ProxmoxClient (made on first use; closed with the application)
PVE_CLIENTS = web.AppKey("pve_clients", dict)

GONE = ("deleting", "destroying", "deleted")
ROUTE_SUFFIX = "/actions/plan"  # a POST that only reads: tokens.py lets a read token send it


class Unavailable(ApiError):
    status, code = 503, "proxmox_unavailable"


class TooManyPlans(TooManyRequests):
    code = "too_many_plans"


class PlanSlots:
    """The plans running in this API process: at most ``limit``, one tenant's at most ``per_tenant``."""

    def __init__(self, limit: int):
        self.limit = limit
        self.per_tenant = (limit + 1) // 2
        self.running = 0
        self.of_tenant: dict[str, int] = {}

    def take(self, tenant_id: str) -> None:
        """A slot for one of ``tenant_id``'s plans, or TooManyPlans (429) at once."""
        mine = self.of_tenant.get(tenant_id, 0)
        if self.running >= self.limit or mine >= self.per_tenant:
            whose = "this API process's" if self.running >= self.limit else "this tenant's"
            raise TooManyPlans(f"too many plans at once ({whose} limit: {self.limit} per process, "
                               f"{self.per_tenant} per tenant); plan again shortly",
                               headers={"Retry-After": "1"},
                               details=[{"limit": self.limit, "per_tenant": self.per_tenant}])
        self.running += 1
        self.of_tenant[tenant_id] = mine + 1

    def give_back(self, tenant_id: str) -> None:
        self.running -= 1
        left = self.of_tenant[tenant_id] - 1
        if left:
            self.of_tenant[tenant_id] = left
        else:
            del self.of_tenant[tenant_id]


PLAN_SLOTS = web.AppKey("plan_slots", PlanSlots)


class PlanDrift(schemas.Response):
    """One difference between the resource's intent and the world."""

    path: str = Field(description="what differs: `config.cores`, `config.tags`, `firewall.options.policy_in`, "
                                  "`power.main`…")
    want: Any = Field(description="the intent (null: absent)")
    have: Any = Field(description="the world now (null: absent)")


class PlanStep(schemas.Response):
    """A step the resource's job would run."""

    name: str
    member: str | None = Field(description="the VM of a multi-VM resource it acts on (`lb-1`, `cp-0`); null: the "
                                           "resource as a whole")
    disruptive: bool = Field(description="it stops, reboots, hot-unplugs or re-addresses a guest")
    why: str


class LiveJob(schemas.Response):
    id: str
    kind: str
    status: str


class PlanAnswer(schemas.Response):
    """What the resource's converging job would do now (nothing was changed to find out)."""

    in_sync: bool = Field(description="nothing to do: the world is as the resource's intent says")
    job_kind: str | None = Field(description="the job whose observe and plan this is (null: nothing to converge)")
    drift: list[PlanDrift]
    steps: list[PlanStep]
    blocked_by: list[LiveJob] = Field(description="the resource's live jobs: the plan is of the world as it is "
                                                  "now, which they change first (empty: none)")
    waiting: str | None = Field(description="the job would first wait on the world (a VM locked by another task, "
                                            "an image not there yet): why; its steps are known once it is over")


EXAMPLE = {"in_sync": False, "job_kind": "ServerCreate",
           "drift": [{"path": "config.cores", "want": 2, "have": 4}],
           "steps": [{"name": "configure", "member": "main", "disruptive": False,
                      "why": "write cores (cores: pending until the VM's next boot, no restart here)"}],
           "blocked_by": [], "waiting": None}


def pve_client(app: web.Application, region: str) -> Any:
    """The region's read-only Proxmox client of this API process."""
    from z9.executor.proxmox import ProxmoxClient

    clients = app[PVE_CLIENTS]
    if region not in clients:
        settings: Settings = app[SETTINGS]
        if region not in settings.regions:
            raise Conflict(f"region {region!r} is not configured on this API process (Z9_REGIONS): it cannot plan",
                           code="region_unknown", details=[{"region": region}])
        try:
            clients[region] = ProxmoxClient(region, settings.regions[region], max_threads=4, read_only=True)
        except ValueError as e:  # no token secret given to this process
            raise Unavailable(f"this API process cannot plan in region {region}: {e}",
                              details=[{"region": region}]) from e
    return clients[region]


async def pve_clients_ctx(app: web.Application) -> AsyncIterator[None]:
    """The application owns its regions' clients: closed at its cleanup (and its plan slots)."""
    app[PVE_CLIENTS] = {}
    app[PLAN_SLOTS] = PlanSlots(app[SETTINGS].api_max_concurrent_plans)
    yield
    for c in app[PVE_CLIENTS].values():
        c.close()


def _handler(api: ApiResource) -> Any:
    rt = api.rtype

    async def plan(request: web.Request) -> web.Response:
        rid = path_id(request, rt.prefix, rt.name)
        slots, who = request.app[PLAN_SLOTS], tenant(request)
        slots.take(who)
        try:
            found, live = await _plan(request, rt, rid, who)
        finally:
            slots.give_back(who)
        body = {**found.as_json(), "blocked_by": [{"id": j["id"], "kind": j["kind"], "status": j["status"]}
                                                  for j in live]}
        return web.json_response(PlanAnswer.model_validate(body).model_dump(mode="json"))

    return plan


async def _plan(request: web.Request, rt: Any, rid: str, who: str) -> tuple[Any, list[Any]]:
    """The plan of ``rid``: its row and live jobs read first, then its kind's observe and plan, each
    read on a connection of its own (none held while Proxmox answers)."""
    from z9.executor import preview

    db = preview.ReadOnlyPool(request.app[POOL])
    async with db.acquire() as conn:
        row = await rt.get(conn, rid, who)
        if row is None:
            raise NotFound(f"no {rt.name} {rid!r}")
        if row.status in GONE:
            raise Conflict(f"{rt.name} {rid} is {row.status}: there is nothing to plan",
                           **deleting(rt.name, rid, row.status))
        live = await store.resource_live_jobs(conn, rid)
    pve = pve_client(request.app, row.region)
    try:
        found = await preview.plan(db, pve, request.app[SETTINGS], rt, row, clock=clock_of(request.app))
    except PermanentError as e:
        raise Conflict(f"the {rt.name}'s job could not converge it: {e}", code="plan_refused",
                       details=[{"kind": rt.name, "id": rid}]) from e
    except TemporaryError as e:
        raise Unavailable(f"region {row.region}: {e}; plan again shortly", headers={"Retry-After": "2"},
                          details=[{"region": row.region}]) from e
    return found, list(live)


def operation(api: ApiResource) -> Operation:
    """The plan route of ``api``'s type (every registered type has one)."""
    rt = api.rtype
    cap = "".join(p.capitalize() for p in rt.name.split("_"))
    return Operation("POST", f"/{rt.plural}/{{id}}{ROUTE_SUFFIX}", _handler(api), f"plan{cap}",
                     f"Plan {_an(rt.name)}: its drift and the steps its job would run (changes nothing)", rt.plural,
                     {200: PlanAnswer, 401: None, 404: None, 409: None, 429: None, 503: None},
                     path_id=f"the {rt.name}'s id ({rt.prefix}_…)", example=EXAMPLE,
                     description="Runs the observe and plan of the resource's converging job read-only: no Proxmox "
                                 "write, no job, no lease, no row lock. A token with the read scope may call it.")


def _an(noun: str) -> str:
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun.replace('_', ' ')}"


def is_plan(request: web.Request) -> bool:
    """A plan request (a POST that reads only)."""
    return request.method == "POST" and request.path.startswith("/v1/") and request.path.endswith(ROUTE_SUFFIX)

