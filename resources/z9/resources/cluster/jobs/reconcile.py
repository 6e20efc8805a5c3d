"""ClusterReconcile: a cluster converged to its desired shape after a node-pool change (add,
resize, remove). New members join with freshly minted tokens (a scale-up a day after the create
works); extra members — highest ordinals first — are drained, deleted from the cluster, then
their VMs removed. The shared converge is :mod:`z9.resources.cluster.jobs.shared`.

Outcome: ``running`` when every desired member is a Ready node, ``degraded`` when the API
answers but a node is not Ready; a failure (e.g. a member's cloud-init) leaves a cluster that was
whole ``degraded`` with the reason, never silently ``running``.
"""
from __future__ import annotations

from typing import Any


from z9.executor.context import JobContext
from z9.resources.cluster.jobs import shared as _cluster
from z9.resources.cluster import CLUSTER_RECONCILE

KIND = CLUSTER_RECONCILE
observe, plan, apply, verify, record_failure = (_cluster.observe, _cluster.plan, _cluster.apply, _cluster.verify,
                                                _cluster.record_failure)


async def record(conn: Any, ctx: JobContext, seen: _cluster.Seen) -> None:
    await _cluster.record_seen(conn, ctx, seen)
