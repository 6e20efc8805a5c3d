"""NetworkCreate, NetworkVerify, NetworkDelete: one reconciler over the network's row. None of them
writes SDN config — the region's SDN apply job (:mod:`.apply`) does, for every pending edit at once —;
each makes sure one is queued and waits for the world:

observe  the VNet in the running SDN config (``GET /cluster/sdn/vnets?running=1``) and in the pending
         one, each node's view of z9's zone (``GET /nodes/{n}/sdn/zones``).
plan     (pure) present (create, verify): the VNet running and every node ``available``; absent
         (delete): the VNet in neither config. Otherwise one step: ``await_apply``.
apply    ``await_apply``: the region's apply job queued (ensure_apply); a node that reports the zone
         other than ``available`` while the VNet is running (its reload failed: PVE's apply task ends
         OK anyway) → TemporaryError naming it (the job retries; the apply job reloads again);
         otherwise a Snooze until the apply has run (no attempt spent).
verify   observe again; the plan must be empty.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from z9.common.errors import PermanentError, Snooze, TemporaryError
from z9.common.models import Job
from z9.executor.context import JobContext, Step
from z9.resources.network import (
    NETWORK,
    NETWORK_CREATE,
    NETWORK_DELETE,
    NETWORK_VERIFY,
    Network,
    sdn_resource,
)
from z9.resources.network import store as net_store
from z9.resources.network.pve import ProxmoxSdn

AWAIT_APPLY = "await_apply"


@dataclass
class SdnView:
    """What a network's job reads of the region's SDN."""

    running: dict[str, dict[str, Any]] = field(default_factory=dict)  # vnet -> running config
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)  # vnet -> pending config (with state)
    nodes: dict[str, str] = field(default_factory=dict)  # node -> z9's zone's status there ("" if absent)


async def read_sdn(ctx: JobContext, zone: str) -> SdnView:
    ops = ProxmoxSdn(ctx.pve)
    running = {str(v["vnet"]): v for v in await ops.vnets(running=True)}
    pending = {str(v["vnet"]): v for v in await ops.vnets(pending=True)}
    nodes = {}
    for n in await ops.nodes():
        got = {str(z.get("zone")): str(z.get("status")) for z in await ops.node_zones(n)}
        nodes[n] = got.get(zone, "")
    return SdnView(running, pending, nodes)


@dataclass
class World:
    row: Network | None
    view: SdnView | None = None
    superseded: str | None = None


def want_present(kind: str) -> bool:
    return kind != NETWORK_DELETE


def lagging(view: SdnView) -> dict[str, str]:
    """The nodes whose view of the zone is not ``available``."""
    return {n: (s or "absent") for n, s in view.nodes.items() if s != "available"}


def plan(kind: str, row: Network, view: SdnView) -> list[Step]:
    """Pure: what is missing for the network's VNet to be as its row wants."""
    if want_present(kind):
        if row.vnet in view.running and not lagging(view):
            return []
        return [Step(AWAIT_APPLY, {"vnet": row.vnet, "present": True})]
    if row.vnet in view.running or (row.vnet in view.pending and view.pending[row.vnet].get("state") != "deleted"):
        return [Step(AWAIT_APPLY, {"vnet": row.vnet, "present": False})]
    return []


def observed(ctx: JobContext, row: Network, view: SdnView) -> dict[str, Any]:
    sdn = ctx.settings.regions[row.region].sdn
    run = view.running.get(row.vnet) or {}
    return {"vnet": row.vnet if run else None, "zone": run.get("zone"), "tag": run.get("tag"),
            "mtu": sdn.guest_mtu if sdn else None, "nodes": dict(view.nodes)}


class NetworkKind:
    """One job kind of the network (the phases shared; see the module docstring)."""

    def __init__(self, kind: str):
        self.KIND = kind

    def _zone(self, ctx: JobContext) -> str:
        sdn = ctx.settings.regions[ctx.job.region].sdn
        if sdn is None:
            raise TemporaryError(f"region {ctx.job.region} has no SDN zone configured (RegionSettings.sdn)")
        return sdn.zone

    async def _row(self, ctx: JobContext) -> World | None:
        row = await net_store.get(ctx.pool, ctx.job.resource_id or "")
        if row is None or row.status == "deleted":
            return World(row, superseded="gone")
        if self.KIND == NETWORK_DELETE and row.status != "destroying":
            return World(row, superseded=row.status)
        return None

    async def observe(self, ctx: JobContext) -> World:
        done = await self._row(ctx)
        if done is not None:
            return done
        row = await net_store.get(ctx.pool, ctx.job.resource_id or "")
        assert row is not None
        return World(row, await read_sdn(ctx, self._zone(ctx)))

    def plan(self, job: Job, world: World) -> list[Step]:
        if world.superseded or world.row is None or world.view is None:
            return []
        return plan(self.KIND, world.row, world.view)

    async def apply(self, ctx: JobContext, world: World, step: Step) -> None:
        from z9.resources.network.api import ensure_apply

        assert world.row is not None and world.view is not None
        row, view = world.row, world.view
        last = await net_store.sdn_apply_last_finished(ctx.pool, sdn_resource(row.region))
        err = (last or {}).get("error") or {}
        if last and last["status"] == "failed" and err.get("class") in ("permanent", "guard") \
                and last["finished_at"] > ctx.job.created_at:  # (an older failure: a later apply may succeed)
            # no retry mends it (a privilege the token lacks): this job ends with the apply's reason
            raise PermanentError(f"the region's SDN apply (job {last['id']}) failed: {err.get('message')}")
        async with ctx.pool.acquire() as conn, conn.transaction():
            apply_job = await ensure_apply(conn, row.region, ctx.settings.max_attempts)
        await ctx.step_detail(step, apply_job=apply_job)
        if want_present(self.KIND) and row.vnet in view.running and lagging(view):
            late = ", ".join(f"{n} ({s})" for n, s in sorted(lagging(view).items()))
            raise TemporaryError(f"VNet {row.vnet} is in the running SDN config but node {late} does not report "
                                 f"zone {self._zone(ctx)} available (its network reload failed or has not run); "
                                 f"the region's SDN apply (job {apply_job}) reloads it again")
        what = "applied" if want_present(self.KIND) else "removed"
        raise Snooze(f"waiting for the region's SDN apply (job {apply_job}): VNet {row.vnet} is not {what} yet",
                     delay_s=ctx.settings.snooze_s)

    async def verify(self, ctx: JobContext) -> dict[str, Any] | None:
        done = await self._row(ctx)
        if done is not None:
            return None
        row = await net_store.get(ctx.pool, ctx.job.resource_id or "")
        assert row is not None
        view = await read_sdn(ctx, self._zone(ctx))
        left = plan(self.KIND, row, view)
        if left:
            late = lagging(view)
            raise TemporaryError(f"verify: VNet {row.vnet} is not as wanted yet"
                                 + (f" (nodes not available: {', '.join(sorted(late))})" if late else ""))
        return observed(ctx, row, view)

    async def record(self, conn: Any, ctx: JobContext, seen: dict[str, Any] | None) -> None:
        rid = ctx.job.resource_id or ""
        if seen is None:
            return
        if self.KIND == NETWORK_DELETE:
            await NETWORK.deleted(conn, rid)
            return
        await net_store.observed(conn, rid, seen, status="available", from_statuses=("creating", "available", "failed"))

    async def record_failure(self, conn: Any, ctx: JobContext, error: dict[str, Any]) -> None:
        await NETWORK.mark_failed_by_job(conn, ctx.job.resource_id or "", error["message"], kind=ctx.job.kind,
                                         refused=bool(error.get("refused")))


CREATE = NetworkKind(NETWORK_CREATE)
VERIFY = NetworkKind(NETWORK_VERIFY)
DELETE = NetworkKind(NETWORK_DELETE)
JOB_KINDS = (CREATE, VERIFY, DELETE)
