"""LoadBalancerObserve: the periodic, observe-only health refresh (enqueued by the reaper for
every live load balancer whose last observation is older than ``lb_health_interval_s`` and that
has no live job; one attempt; its failure never marks the load balancer failed).

observe  the appliances and their running hashes (as the configure job would).
plan     always empty: it changes nothing in the world.
verify   HAProxy's ``show stat`` and the VIP holder, joined with z9's view of the targets; and
         drift: an appliance that is gone or not running (stopped out of band: the load
         balancer has lost its redundancy), or whose HAProxy file is not the one rendered from
         the database now (a target server's address changed, a file edited by hand), or whose
         keepalived file is not the rendered one.
record   health, per-target status and the members; never the status. Drift on an ``active``
         load balancer enqueues a LoadBalancerConfigure in the same transaction (which repairs
         it); a ``failed`` one is left for its owner (a rejected config is not retried forever).
"""
from __future__ import annotations

from typing import Any

from z9.common import store
from z9.common.models import Job
from z9.resources.load_balancer import LOAD_BALANCER

from z9.executor.context import JobContext, Step
from z9.resources.load_balancer.jobs import shared as _lb
from z9.resources.load_balancer import LOAD_BALANCER_CONFIGURE, LOAD_BALANCER_OBSERVE

KIND = LOAD_BALANCER_OBSERVE
World = _lb.World


async def observe(ctx: JobContext) -> World:
    lb, targets = await _lb.load(ctx)
    if lb.status not in ("active", "failed"):
        return World(lb=lb, superseded=lb.status)
    return World(lb=lb, targets=targets, desired_haproxy=_lb.render_haproxy(lb, targets))


def plan(job: Job, world: World) -> list[Step]:
    return []


async def apply(ctx: JobContext, world: World, step: Step) -> None:  # pragma: no cover - no steps
    raise AssertionError("LoadBalancerObserve plans no steps")


async def verify(ctx: JobContext) -> dict[str, Any] | None:
    world = await observe(ctx)
    if world.superseded:
        return None
    seen = await _lb.read_health(ctx, world)
    want = _lb.sha256(world.desired_haproxy)
    # keepalived.conf counts too: a hand edit there (pre-emption, priorities) is the Octavia failure
    # of an appliance taking the VIP back, invisible in haproxy.cfg's hash
    kept = seen.pop("keepalived_hashes", {})
    nics = seen.pop("interfaces", {})
    key = _lb.vrrp_key(ctx.settings, world.lb)
    seen["drift"] = sorted(m for m, v in seen["members"].items()
                           if not v["running"] or v["config_hash"] != want or nics.get(m) is None
                           or kept.get(m) != _lb.sha256(_lb.render_keepalived(world.lb, m, nics[m], key)))
    seen["status"] = world.lb.status if world.lb else None
    return seen


async def record(conn: Any, ctx: JobContext, seen: dict[str, Any] | None) -> None:
    await _lb.record_seen(conn, ctx, seen, status=None)
    if seen and seen.get("drift") and seen.get("status") == "active":
        lb = await LOAD_BALANCER.get(conn, ctx.job.resource_id)
        if lb is not None and lb.status == "active":
            await store.job_insert(conn, LOAD_BALANCER.new_job(
                lb, LOAD_BALANCER_CONFIGURE, args={"reason": f"drift on {', '.join(seen['drift'])}"},
                max_attempts=ctx.settings.max_attempts))


async def record_failure(conn: Any, ctx: JobContext, error: dict[str, Any]) -> None:
    return None  # observe-only: a failed refresh says nothing about the load balancer
