"""The three kinds that converge a load balancer's appliances and leave it ``active``, one
reconciler under three names (they differ in why they run, never in what they do):

- ``LoadBalancerCreate``: make the appliances exist, configured, running and serving the rendered
  configuration;
- ``LoadBalancerConfigure``: converge on the configuration rendered from the database now (after an
  action, or a target server's final delete); an appliance found stopped is started again;
- ``LoadBalancerStart``: a cancelled deletion's restore: start the appliances again and converge.

observe  the load balancer's rows, the rendered HAProxy and keepalived files, and per appliance
         (members lb-0, lb-1) its VM through the VM machinery and the hashes of the files it runs.
plan     (pure) per member the VM machinery's steps (clone onto its node → configure → resize →
         start), then push_keepalived / push_haproxy where the running hash differs.
apply    VM steps as servers'; pushes are validate-then-swap through the guest agent, each
         re-reading the running hash first (never pushed twice after a crash).
verify   observe again (nothing left), exactly one appliance holds the VIP, health read from
         HAProxy (see :mod:`z9.resources.load_balancer.jobs.shared`).
record   what verify saw; the load balancer is ``active``.
"""
from __future__ import annotations

from typing import Any

from z9.common.models import Job

from z9.executor.context import JobContext, Step
from z9.resources.load_balancer.jobs import shared as _lb
from z9.resources.load_balancer import LOAD_BALANCER_CONFIGURE, LOAD_BALANCER_CREATE, LOAD_BALANCER_START


class Converge:
    """One converging kind (:class:`z9.executor.kind.JobKind`), named ``kind``."""

    def __init__(self, kind: str) -> None:
        self.KIND = kind

    def __repr__(self) -> str:
        return f"<job kind {self.KIND} ({__name__})>"

    async def observe(self, ctx: JobContext, /) -> _lb.World:
        return await _lb.observe(ctx)

    def plan(self, job: Job, world: _lb.World, /) -> list[Step]:
        return _lb.plan(job, world)

    async def apply(self, ctx: JobContext, world: _lb.World, step: Step, /) -> None:
        await _lb.apply(ctx, world, step)

    async def verify(self, ctx: JobContext, /) -> dict[str, Any] | None:
        return await _lb.verify(ctx)

    async def record(self, conn: Any, ctx: JobContext, seen: dict[str, Any] | None, /) -> None:
        await _lb.record_seen(conn, ctx, seen, status="active", from_statuses=("creating", "active", "failed"))

    async def record_failure(self, conn: Any, ctx: JobContext, error: dict[str, Any], /) -> None:
        await _lb.record_failure(conn, ctx, error)


CREATE = Converge(LOAD_BALANCER_CREATE)
CONFIGURE = Converge(LOAD_BALANCER_CONFIGURE)
START = Converge(LOAD_BALANCER_START)
JOB_KINDS = (CREATE, CONFIGURE, START)
