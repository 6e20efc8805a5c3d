"""LoadBalancerObserve: the periodic, observe-only health refresh (enqueued by the reaper for
every live load balancer whose last observation is older than ``lb_health_interval_s`` and that
has no live job; one attempt; its failure never marks the load balancer failed).

observe  the appliances and their running hashes (as the configure job would).
plan     always empty: it changes nothing in the world (drift is reported, not repaired: the
         running hash per member is in ``members``; a configure job repairs).
verify   HAProxy's ``show stat`` and the VIP holder, joined with z9's view of the targets.
record   health, per-target status and the members; never the status.
"""
from __future__ import annotations

from typing import Any

from z9.common import kinds
from z9.common.models import Job

from ..context import JobContext, Step
from . import _lb

KIND = kinds.LOAD_BALANCER_OBSERVE
World = _lb.World


async def observe(ctx: JobContext) -> World:
    lb, targets = await _lb.load(ctx)
    if lb.status not in ("active", "failed"):
        return World(lb=lb, superseded=lb.status)
    return World(lb=lb, targets=targets)


def plan(job: Job, world: World) -> list[Step]:
    return []


async def apply(ctx: JobContext, world: World, step: Step) -> None:  # pragma: no cover - no steps
    raise AssertionError("LoadBalancerObserve plans no steps")


async def verify(ctx: JobContext) -> dict[str, Any] | None:
    world = await observe(ctx)
    if world.superseded:
        return None
    return await _lb.read_health(ctx, world)


async def record(conn: Any, ctx: JobContext, seen: dict[str, Any] | None) -> None:
    await _lb.record_seen(conn, ctx, seen, status=None)


async def record_failure(conn: Any, ctx: JobContext, error: dict[str, Any]) -> None:
    return None  # observe-only: a failed refresh says nothing about the load balancer
