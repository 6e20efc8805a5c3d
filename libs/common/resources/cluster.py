"""The ``cluster`` resource type (issue 11): a Kubernetes cluster — control plane and node pools
as one resource owning N VMs (members ``cp-<i>``, ``<pool>-<i>``) and one endpoint address.

Deletion is immediate (``Immediate(ClusterDelete)``): once confirmed, the cluster goes at once —
no buffer, no cancel. A live ClusterCreate/ClusterReconcile of the cluster is superseded by the
delete (the generic rule :meth:`ResourceType.superseded_by`): it stops at its next step."""
from __future__ import annotations

from .. import kinds
from ..models import Cluster
from . import Immediate, ResourceType, register

STATUSES = ("creating", "running", "degraded", "updating", "deleting", "destroying", "deleted", "failed")

CLUSTER: ResourceType[Cluster] = register(ResourceType(
    name="cluster", prefix="k8s", table="clusters", model=Cluster,
    kinds=(kinds.CLUSTER_CREATE, kinds.CLUSTER_RECONCILE, kinds.CLUSTER_DELETE),
    deletion=Immediate(final_kind=kinds.CLUSTER_DELETE), statuses=STATUSES,
))
