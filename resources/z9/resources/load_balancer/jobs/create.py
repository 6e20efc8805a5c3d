"""LoadBalancerCreate: make the appliances exist, configured, running and serving the rendered configuration; the load balancer becomes ``active``.

observe  the load balancer's rows, the rendered HAProxy and keepalived files, and per appliance
         (members lb-0, lb-1) its VM through the VM machinery and the hashes of the files it runs.
plan     (pure) per member the VM machinery's steps (clone onto its node → configure → resize →
         start), then push_keepalived / push_haproxy where the running hash differs.
apply    VM steps as servers'; pushes are validate-then-swap through the guest agent, each
         re-reading the running hash first (never pushed twice after a crash).
verify   observe again (nothing left), exactly one appliance holds the VIP, health read from
         HAProxy (see :mod:`z9.resources.load_balancer.jobs.shared`).
"""
from __future__ import annotations

from typing import Any

from z9.common import kinds
from z9.common.models import Job

from z9.executor.context import JobContext, Step
from z9.resources.load_balancer.jobs import shared as _lb

KIND = kinds.LOAD_BALANCER_CREATE
World = _lb.World
observe = _lb.observe
apply = _lb.apply
verify = _lb.verify
record_failure = _lb.record_failure


def plan(job: Job, world: World) -> list[Step]:
    return _lb.plan(job, world)


async def record(conn: Any, ctx: JobContext, seen: dict[str, Any] | None) -> None:
    """In the finishing transaction: what verify saw; the load balancer is ``active``."""
    await _lb.record_seen(conn, ctx, seen, status="active", from_statuses=("creating", "active", "failed"))
