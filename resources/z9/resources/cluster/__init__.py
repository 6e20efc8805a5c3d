"""The ``cluster`` resource type (issue 11): a Kubernetes cluster — control plane and node pools
as one resource owning N VMs (members ``cp-<i>``, ``<pool>-<i>``) and one endpoint address.

Deletion is immediate (``Immediate(ClusterDelete)``): once confirmed, the cluster goes at once —
no buffer, no cancel. A live ClusterCreate/ClusterReconcile of the cluster is superseded by the
delete (the generic rule :meth:`ResourceType.superseded_by`): it stops at its next step, or at
once when it is not running (:meth:`ResourceType.supersede_waiting`).

A ``running`` or ``degraded`` cluster is observed periodically (ClusterObserve, every
``cluster_observe_interval_s``): its members' power state and Node readiness, and the status
between ``running`` and ``degraded``."""
from __future__ import annotations

from typing import Any

from z9.common import store as common_store  # (not `store`: the slice's own store module is z9.resources.cluster.store)
from z9.resources.cluster.model import Cluster
from z9.resources import Immediate, Periodic, PlanOf, QuotaUsage, ResourceType, register
from z9.resources.cluster import store as cluster_store

# the job kinds of this type (the ``kind`` column's values)
CLUSTER_CREATE = "ClusterCreate"
CLUSTER_RECONCILE = "ClusterReconcile"
CLUSTER_DELETE = "ClusterDelete"
CLUSTER_OBSERVE = "ClusterObserve"

STATUSES = ("creating", "running", "degraded", "updating", "deleting", "destroying", "deleted", "failed")

async def _cancelled(db: Any, row: Cluster, kind: str, reason: str) -> bool:
    """A node-pool change whose ClusterReconcile was cancelled before it ran (and no other job of
    the cluster is live to move it on): the cluster is not ``updating`` any more — ``degraded``
    (its members are as they were, not the shape asked for; a resize or a re-run applies it) once
    it was whole, ``failed`` otherwise."""
    if row.status != "updating" or await common_store.resource_count_own_live_jobs(db, row.id) > 0:
        return False
    reason += "; the node pools asked for are not applied (resize again, or re-run the job)"
    if row.initialized_at is not None:
        await cluster_store.cluster_degraded(db, row.id, reason)
    else:
        await CLUSTER.mark_failed(db, row.id, reason)
    return True


async def plan_of(db: Any, cluster: Cluster) -> PlanOf:
    """A plan of a cluster previews its reconcile: every desired member a Ready node (a stopped one
    started), the extra ones drained and removed, the members' firewalls and bootstrap media as z9
    keeps them."""
    return PlanOf(CLUSTER_RECONCILE, {})


CLUSTER: ResourceType[Cluster] = register(ResourceType(
    name="cluster", prefix="k8s", table="clusters", model=Cluster,
    kinds=(CLUSTER_CREATE, CLUSTER_RECONCILE, CLUSTER_DELETE, CLUSTER_OBSERVE),
    deletion=Immediate(final_kind=CLUSTER_DELETE), statuses=STATUSES, cancelled=_cancelled, plan_of=plan_of,
    periodic=Periodic(kind=CLUSTER_OBSERVE, interval_setting="cluster_observe_interval_s",
                      statuses=("running", "degraded")),
    order=40,
    # its members are VMs of the tenant (not servers: the servers quota leaves them out); its
    # endpoint is an address (counted with the addresses)
    quota_usage=QuotaUsage("cluster_quota_usage", {
        "cores": "Kubernetes clusters' members' cores (control planes and pool members, as asked for)",
        "memory_mib": "Kubernetes clusters' members' memory (MiB)"}),
))
