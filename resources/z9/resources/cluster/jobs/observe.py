"""ClusterObserve: the periodic, observe-only look at a ``running`` or ``degraded`` Kubernetes
cluster (enqueued by the reaper when its last observation is older than
``cluster_observe_interval_s`` and no other job of it is live; one attempt; its failure never
marks the cluster failed; a DELETE supersedes it like any other job of the cluster).

observe  the cluster's members by tag and the nodes its API reports (the shared
         :func:`z9.resources.cluster.jobs.shared.observe`, inside a control plane through the agent).
plan     always empty: it changes nothing in the world (a reconcile repairs; this one reports).
verify   every desired member: its VM, power state, address and whether it is a Ready node.
record   members; ``running`` when every desired member is a Ready node, else ``degraded`` with
         the members that are not (or "no control plane's API answers") — only between those two
         statuses, never over a job's own (``updating``, ``failed``, the deletion's).
"""
from __future__ import annotations

from typing import Any

from z9.common.models import Job

from z9.executor.context import JobContext, Step
from z9.resources.cluster.jobs import shared as _cluster
from z9.resources.cluster import CLUSTER_OBSERVE

KIND = CLUSTER_OBSERVE
STATUSES = ("running", "degraded")


async def observe(ctx: JobContext) -> _cluster.World:
    world = await _cluster.observe(ctx, with_isos=False)
    if world.cluster is not None and world.cluster.status not in STATUSES:
        world.superseded = world.superseded or world.cluster.status
    return world


def plan(job: Job, world: _cluster.World) -> list[Step]:
    return []


async def apply(ctx: JobContext, world: _cluster.World, step: Step) -> None:  # pragma: no cover - no steps
    raise AssertionError("ClusterObserve plans no steps")


async def verify(ctx: JobContext) -> _cluster.Seen | None:
    world = await observe(ctx)
    if world.superseded or world.cluster is None:
        return None
    return await _cluster.seen_of(ctx, world)


async def record(conn: Any, ctx: JobContext, seen: _cluster.Seen | None) -> None:
    if seen is None or not seen.members:
        return
    await _cluster.record_members(conn, ctx, seen, from_statuses=STATUSES)


async def record_failure(conn: Any, ctx: JobContext, error: dict[str, Any]) -> None:
    return None  # observe-only: a failed look says nothing about the cluster
